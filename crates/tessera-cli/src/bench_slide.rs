//! `tessera bench slide`: one hopping window whose range grows from 1 to 1,000 slides, run
//! three ways on the same generated stream: every instance from the stream (the naive
//! per-window plan: `baseline`), sub-window slices merged when an instance is emitted (the
//! sub-window design note's plan: `shared_paired`), and slices combined by a sliding aggregator
//! (`shared_sliding`: a running value for SUM and COUNT, two stacks for MIN). It
//! reports throughput and the state reads and writes per event of each, for an invertible
//! aggregate set (SUM, COUNT) and for MIN, with the state in memory or (`--state-backend
//! disk`) spilled to disk beyond `--state-memory`, then also the
//! key groups read from and written to disk. Every plan at every ratio of one aggregate set is
//! timed in the same rounds, so both the speedup over the naive plan and the flatness across
//! ratios compare runs made under the same load.

use serde_json::json;
use tessera::optimizer::window_strategy::Strategy;
use tessera::TesseraError;

use crate::bench::{MAX_EVENTS, MAX_REPEAT};
use crate::bench_wcg::{create_report, forced, parse_list, stream, time_scripts, MAX_STREAM_KEYS};
use crate::between;
use tessera::settings::ETA_RANGE;

/// The largest range over slide: the most windows tessera puts an event in.
const MAX_RATIO: i64 = tessera::window::MAX_WINDOWS_PER_EVENT;

#[derive(clap::Args, Debug)]
pub struct SlideArgs {
    /// Range over slide, comma separated, each 1 to 2^20 (windows per event).
    #[arg(long, default_value = "1,3,10,30,100,300,1000")]
    pub ratios: String,
    /// The slide, in seconds, 1 to 10^9.
    #[arg(long, default_value_t = 10, value_parser = between(1i64, 1_000_000_000))]
    pub slide: i64,
    /// Events of the stream, 1 to 20M.
    #[arg(long, default_value_t = 2_000_000, value_parser = between(1, MAX_EVENTS))]
    pub events: usize,
    /// Events per second, as `SET eta` takes.
    #[arg(long, default_value_t = 100.0, value_parser = between(ETA_RANGE.0, ETA_RANGE.1))]
    pub eta: f64,
    /// Distinct group keys, 1 to 10^9.
    #[arg(long, default_value_t = 100, value_parser = between(1, MAX_STREAM_KEYS))]
    pub keys: u64,
    /// The naive plan updates `ratio` instances per event: run it up to this ratio (1 to 2^20).
    #[arg(long, default_value_t = 100, value_parser = between(1, MAX_RATIO))]
    pub naive_max_ratio: i64,
    /// The plans to run, comma separated (window_strategy names).
    #[arg(long, default_value = "baseline,shared_paired,shared_sliding")]
    pub plans: String,
    /// Timed runs per plan and ratio, one of each per round (the median is used), 1 to 1000.
    #[arg(long, default_value_t = 3, value_parser = between(1, MAX_REPEAT))]
    pub repeat: usize,
    /// Also write the figures as JSON lines to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub state: crate::StateArgs,
}

const PLANS: [Strategy; 3] = [Strategy::Baseline, Strategy::SharedPaired, Strategy::SharedSliding];

pub fn bench_slide(args: &SlideArgs) -> Result<(), TesseraError> {
    let ratios = parse_list("--ratios", &args.ratios, (1, MAX_RATIO))?;
    let plans =
        args.plans.split(',').map(|p| Strategy::parse(p.trim())).collect::<Option<Vec<_>>>().ok_or_else(|| {
            TesseraError::Option(format!("--plans expects window_strategy names, got '{}'", args.plans))
        })?;
    let mut json_out = create_report(args.json.as_deref())?;
    let batches = stream(args.events, args.eta, args.keys);
    let state = args.state.options(std::env::temp_dir())?;
    let disk = state.memory_bytes.is_some();
    println!(
        "{} events, {} per second, {} keys, slide {} s, state {state:?}; M events/s (state reads / writes per event{})",
        args.events,
        args.eta,
        args.keys,
        args.slide,
        if disk {
            "; key groups read / written on disk, spilled groups a closing watermark passed without reading"
        } else {
            ""
        }
    );
    for aggregates in ["SUM(v), COUNT(*)", "MIN(v)"] {
        println!("\n{aggregates}\n");
        println!("| range/slide | naive (baseline) | slices, merged at emission (shared_paired) | slices, sliding aggregator (shared_sliding) |");
        println!("|---|---|---|---|");
        let (mut cases, mut scripts) = (Vec::new(), Vec::new());
        for &ratio in &ratios {
            let range = args.slide * ratio;
            let window = if ratio == 1 {
                format!("TUMBLE(s, ts, INTERVAL '{range}' SECOND)")
            } else {
                format!("HOP(s, ts, INTERVAL '{}' SECOND, INTERVAL '{range}' SECOND)", args.slide)
            };
            let text = format!(
                "CREATE SOURCE s (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'generated.csv', time_unit = 's');\n\
                 SELECT k, window_start, window_end, {aggregates} FROM {window} GROUP BY k, window_start, window_end;"
            );
            for plan in PLANS {
                if plans.contains(&plan) && !(plan == Strategy::Baseline && ratio > args.naive_max_ratio) {
                    cases.push((ratio, plan));
                    scripts.push(forced(&text, plan)?);
                }
            }
        }
        let mut timed = cases.into_iter().zip(time_scripts(&scripts, &batches, args.repeat, &state)?).peekable();
        let mut sliding_rate = Vec::new();
        for &ratio in &ratios {
            let mut cells = Vec::new();
            let mut rows = None;
            for plan in PLANS {
                let Some((_, (seconds, stats))) = timed.next_if(|(case, _)| *case == (ratio, plan)) else {
                    cells.push("-".to_string());
                    continue;
                };
                if *rows.get_or_insert(stats.rows_out) != stats.rows_out {
                    return Err(TesseraError::Internal(format!(
                        "{} produced {} rows, another plan {rows:?}, at ratio {ratio}",
                        plan.name(),
                        stats.rows_out
                    )));
                }
                let events = stats.events_in.max(1) as f64;
                let rate = stats.events_in as f64 / seconds;
                let (reads, writes) = (stats.store_reads as f64 / events, stats.store_writes as f64 / events);
                if plan == Strategy::SharedSliding {
                    sliding_rate.push((ratio, rate));
                }
                let spill = &stats.spill;
                cells.push(if disk {
                    format!(
                        "{:.2} ({reads:.2} / {writes:.2}; disk {} / {}, {} from memory)",
                        rate / 1e6,
                        spill.group_reads,
                        spill.group_writes,
                        spill.lookups_in_memory
                    )
                } else {
                    format!("{:.2} ({reads:.2} / {writes:.2})", rate / 1e6)
                });
                if let Some(file) = json_out.as_mut() {
                    use std::io::Write;
                    let line = json!({
                        "aggregates": aggregates, "ratio": ratio, "slide": args.slide, "plan": plan.name(),
                        "events": stats.events_in, "seconds": seconds, "events_per_second": rate,
                        "reads_per_event": reads, "writes_per_event": writes, "rows_out": stats.rows_out,
                        "state_bytes_peak": stats.state_bytes_peak, "spill": stats.spill,
                    });
                    writeln!(file, "{line}").map_err(|e| TesseraError::io("cannot write the JSON report", e))?;
                }
            }
            println!("| {ratio} | {} |", cells.join(" | "));
        }
        if let (Some(first), Some(last)) = (sliding_rate.first(), sliding_rate.last()) {
            println!(
                "\nshared_sliding at range/slide {}: {:.2} of its throughput at range/slide {}",
                last.0,
                last.1 / first.1,
                first.0
            );
        }
    }
    Ok(())
}
