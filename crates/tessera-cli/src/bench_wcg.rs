//! `tessera bench wcg`: the multi-window paper's evaluation, modeled and measured.
//!
//! For every generator (RandomGen, ChainGen, StarGen, RandomGraphGen), general and tumbling
//! windows, 5 and 10 windows and each event rate, it draws window sets and reports the modeled
//! cost of every strategy relative to the baseline, how often the chosen plan is the cheapest,
//! and how far Algorithm 2 is from the exact search. Beyond the paper, which only models cost,
//! it runs the engine with every strategy forced on one generated stream per set and reports
//! the measured compute times, their rank correlation (Spearman) with the modeled costs, and
//! how much slower the chosen plan ran than the fastest strategy (what choosing by the model
//! cost, measured), with the paper's model and with the model told the stream's keys
//! (`SET keys`).

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Float64Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use tessera::connectors::memory::MemoryReader;
use tessera::connectors::sink::ResultSink;
use tessera::connectors::BatchReader;
use tessera::engine::{run_script_with_readers, RunOptions, RunStats, Script, StateOptions};
use tessera::exec::pipeline::Parallelism;
use tessera::optimizer::share_windows::exact_min_cost;
use tessera::optimizer::window_strategy::{plan_window_group, Strategy};
use tessera::window::cost::CostModel;
use tessera::window::generators::{generate, Generator, GeneratorParams, SplitMix};
use tessera::window::{Sharing, WindowSpec};
use tessera::TesseraError;

use crate::bench::{MAX_EVENTS, MAX_REPEAT};
use crate::between;

/// The most window sets `--sets` draws per case.
const MAX_SETS: usize = 10_000;
/// The most distinct keys of a generated stream (`--keys`).
pub const MAX_STREAM_KEYS: u64 = 1_000_000_000;

#[derive(clap::Args, Debug)]
pub struct WcgArgs {
    /// Window sets drawn per generator, variant, size and event rate, 1 to 10000.
    #[arg(long, default_value_t = 10, value_parser = between(1, MAX_SETS))]
    pub sets: usize,
    /// Of those, how many are also run by the engine with every strategy (at most 10000).
    #[arg(long, default_value_t = 2, value_parser = between(0, MAX_SETS))]
    pub measure_sets: usize,
    /// Events of each measured stream, 1 to 20M.
    #[arg(long, default_value_t = 300_000, value_parser = between(1, MAX_EVENTS))]
    pub events: usize,
    /// Event rates, comma separated, each as `SET eta` takes: events per time unit and key (the model counts a window
    /// instance's merges once, the runtime once per key in it, so the model's rate is each
    /// key's); a measured stream has `eta * keys` events per time unit.
    #[arg(long, default_value = "1,10,100")]
    pub eta: String,
    /// Distinct group keys in each measured stream (told to the model for the "with the keys
    /// known" choice), 1 to 10^9.
    #[arg(long, default_value_t = 10, value_parser = between(1, MAX_STREAM_KEYS))]
    pub keys: u64,
    /// Timed runs per strategy, one of each strategy per round (the median is used), 1 to 1000.
    #[arg(long, default_value_t = 3, value_parser = between(1, MAX_REPEAT))]
    pub repeat: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write every set's figures as JSON lines to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Strategies in the order the report prints them.
const ORDER: [Strategy; 6] = [
    Strategy::Baseline,
    Strategy::UnsharedPaired,
    Strategy::SharedPaired,
    Strategy::SharedSliding,
    Strategy::Wcg,
    Strategy::WcgFactor,
];

#[derive(Default)]
struct Summary {
    sets: usize,
    /// Sum over sets of each strategy's cost / baseline.
    relative: [f64; 6],
    chosen_cheapest: usize,
    exact_proven: usize,
    gap_sum: f64,
    gap_max: f64,
    spearman: Vec<f64>,
    /// Per measured set, the chosen plan's time over the fastest strategy's, minus one.
    regret: Vec<f64>,
    /// The same for the plan the model chooses knowing the stream's keys.
    keyed_regret: Vec<f64>,
    /// Sum over measured sets of each strategy's time / baseline time.
    measured_relative: [f64; 6],
}

pub fn bench_wcg(args: &WcgArgs) -> Result<(), TesseraError> {
    let etas = parse_list("--eta", &args.eta, tessera::settings::ETA_RANGE)?;
    let mut json = create_report(args.json.as_deref())?;
    println!(
        "| generator | windows | kind | eta | sets | BL | UP | SP | SS | WCG | WCG-FW | chosen cheapest | WCG-FW gap to exact (mean/max) | measured sets | measured UP/SP/SS/WCG/WCG-FW vs BL | Spearman (mean) | chosen over fastest (mean/max) | with the keys known |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_spearman = Vec::new();
    let mut all_regret = Vec::new();
    let mut all_keyed_regret = Vec::new();
    let mut rng = SplitMix::new(args.seed);
    for generator in Generator::ALL {
        let sizes: &[usize] = if generator == Generator::RandomGraph { &[12] } else { &[5, 10] };
        for &size in sizes {
            for tumbling in [false, true] {
                let params = GeneratorParams { tumbling, ..GeneratorParams::default() };
                let sharing = if tumbling { Sharing::PartitionedBy } else { Sharing::CoveredBy };
                for &eta in &etas {
                    let mut summary = Summary::default();
                    for set in 0..args.sets {
                        let windows = generate(generator, size, &params, &mut rng);
                        let record = evaluate_set(&windows, sharing, eta, set < args.measure_sets, args, &mut summary)?;
                        if let Some(file) = json.as_mut() {
                            use std::io::Write;
                            let line = serde_json::json!({
                                "generator": generator.name(), "size": size, "tumbling": tumbling, "eta": eta,
                                "windows": windows.iter().map(|w| [w.range, w.slide]).collect::<Vec<_>>(),
                                "figures": record,
                            });
                            writeln!(file, "{line}")
                                .map_err(|e| TesseraError::io("cannot write the JSON report", e))?;
                        }
                    }
                    all_spearman.extend(summary.spearman.iter().copied());
                    all_regret.extend(summary.regret.iter().copied());
                    all_keyed_regret.extend(summary.keyed_regret.iter().copied());
                    print_row(generator, size, tumbling, eta, &summary);
                }
            }
        }
    }
    if !all_spearman.is_empty() {
        let mean = all_spearman.iter().sum::<f64>() / all_spearman.len() as f64;
        let at_least = all_spearman.iter().filter(|s| **s >= 0.8).count();
        println!(
            "\nSpearman between modeled cost and measured time over {} measured sets: mean {mean:.3}; >= 0.8 in {at_least} sets",
            all_spearman.len()
        );
        for (regrets, model) in [(&all_regret, "the paper's model"), (&all_keyed_regret, "the model told the keys")] {
            let mean = regrets.iter().sum::<f64>() / regrets.len() as f64;
            let within = regrets.iter().filter(|r| **r <= 0.05).count();
            let worst = regrets.iter().copied().fold(0.0, f64::max);
            println!(
                "The plan {model} chose, measured over the fastest plan: mean +{:.1}%, worst +{:.1}%; within 5% in {within} of {} sets",
                100.0 * mean,
                100.0 * worst,
                regrets.len()
            );
        }
    }
    Ok(())
}

fn evaluate_set(
    windows: &[WindowSpec],
    sharing: Sharing,
    eta: f64,
    measure: bool,
    args: &WcgArgs,
    summary: &mut Summary,
) -> Result<serde_json::Value, TesseraError> {
    let plan = plan_window_group(windows, sharing, (eta, None), None);
    let keyed = plan_window_group(windows, sharing, (eta, Some(args.keys as f64)), None);
    let costs: Vec<f64> = ORDER.iter().map(|s| plan.costs.get(*s)).collect();
    summary.sets += 1;
    for (i, cost) in costs.iter().enumerate() {
        summary.relative[i] += cost / costs[0];
    }
    if costs.iter().all(|c| plan.cost() <= c + 1e-9 * c.abs().max(1.0)) {
        summary.chosen_cheapest += 1;
    }
    let model = CostModel::new(windows, eta);
    let exact = exact_min_cost(windows, sharing, &model, 20, 100_000);
    let gap = plan.costs.wcg_factor / exact.plan.total_cost - 1.0;
    summary.exact_proven += exact.complete as usize;
    summary.gap_sum += gap;
    summary.gap_max = summary.gap_max.max(gap);
    let mut record = serde_json::json!({
        "costs": costs, "chosen": plan.strategy.name(), "chosen_with_keys": keyed.strategy.name(),
        "exact": exact.plan.total_cost,
        "exact_complete": exact.complete, "exact_candidates": exact.candidates,
    });
    if measure {
        let (mut times, mut stats) = measure_strategies(windows, sharing, eta, args)?;
        // The last run is the keyed plan's; the rest are the strategies', in ORDER.
        let keyed_time = times.pop().expect("the keyed plan");
        stats.pop();
        let rho = spearman(&costs, &times);
        summary.spearman.push(rho);
        // Both choices against the fastest plan measured.
        let fastest = times.iter().copied().fold(keyed_time, f64::min);
        let chosen = ORDER.iter().position(|s| *s == plan.strategy).expect("every strategy is in ORDER");
        let (regret, keyed_regret) = (times[chosen] / fastest - 1.0, keyed_time / fastest - 1.0);
        summary.regret.push(regret);
        summary.keyed_regret.push(keyed_regret);
        for (i, t) in times.iter().enumerate() {
            summary.measured_relative[i] += t / times[0];
        }
        record["seconds"] = serde_json::json!(times);
        record["chosen_with_keys_seconds"] = serde_json::json!(keyed_time);
        // The work each run counted: rows updating partial aggregates and partials combined.
        record["updates"] = serde_json::json!(stats.iter().map(|s| s.store_reads - s.emit_reads).collect::<Vec<_>>());
        record["merges"] = serde_json::json!(stats.iter().map(|s| s.emit_reads).collect::<Vec<_>>());
        record["spearman"] = serde_json::json!(rho);
        record["chosen_over_fastest"] = serde_json::json!(regret + 1.0);
        record["chosen_with_keys_over_fastest"] = serde_json::json!(keyed_regret + 1.0);
    }
    Ok(record)
}

fn print_row(generator: Generator, size: usize, tumbling: bool, eta: f64, s: &Summary) {
    let n = s.sets.max(1) as f64;
    let relative: Vec<String> = s.relative.iter().map(|r| format!("{:.3}", r / n)).collect();
    let measured = s.spearman.len();
    let regret = |regrets: &[f64]| {
        let worst = regrets.iter().copied().fold(0.0, f64::max);
        format!("+{:.0}% / +{:.0}%", 100.0 * regrets.iter().sum::<f64>() / regrets.len() as f64, 100.0 * worst)
    };
    let (measured_relative, rho, regret, keyed_regret) = if measured == 0 {
        ("-".to_string(), "-".to_string(), "-".to_string(), "-".to_string())
    } else {
        let m = measured as f64;
        let r: Vec<String> = s.measured_relative[1..].iter().map(|r| format!("{:.2}", r / m)).collect();
        let rho = format!("{:.2}", s.spearman.iter().sum::<f64>() / m);
        (r.join(" / "), rho, regret(&s.regret), regret(&s.keyed_regret))
    };
    println!(
        "| {} | {size} | {} | {eta} | {} | {} | {}/{} | {:.1}% / {:.1}%{} | {measured} | {measured_relative} | {rho} | {regret} | {keyed_regret} |",
        generator.name(),
        if tumbling { "tumbling" } else { "general" },
        s.sets,
        relative.join(" | "),
        s.chosen_cheapest,
        s.sets,
        100.0 * s.gap_sum / n,
        100.0 * s.gap_max,
        if s.exact_proven < s.sets { format!(" ({} of {} proven)", s.exact_proven, s.sets) } else { String::new() },
    );
}

/// The engine's compute time (median of `repeat` interleaved runs, one worker, input in memory) with
/// every strategy forced, in [`ORDER`], then of the plan the model chooses told the stream's keys
/// (`SET keys`; a strategy's plan can differ with them), and each one's statistics.
fn measure_strategies(
    windows: &[WindowSpec],
    sharing: Sharing,
    eta: f64,
    args: &WcgArgs,
) -> Result<(Vec<f64>, Vec<RunStats>), TesseraError> {
    let aggregate = if sharing == Sharing::PartitionedBy { "SUM(v)" } else { "MIN(v)" };
    let branches: Vec<String> = windows
        .iter()
        .map(|w| {
            let window = if w.is_tumbling() {
                format!("TUMBLE(s, ts, INTERVAL '{}' SECOND)", w.range)
            } else {
                format!("HOP(s, ts, INTERVAL '{}' SECOND, INTERVAL '{}' SECOND)", w.slide, w.range)
            };
            format!("SELECT k, window_start, window_end, {aggregate} AS a FROM {window} GROUP BY k, window_start, window_end")
        })
        .collect();
    let text = format!(
        "CREATE SOURCE s (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'generated.csv', time_unit = 's');\nSET eta = {eta};\n{};",
        branches.join("\nUNION ALL\n")
    );
    let batches = stream(args.events, eta * args.keys as f64, args.keys);
    let mut scripts = ORDER.iter().map(|&strategy| forced(&text, strategy)).collect::<Result<Vec<_>, _>>()?;
    let mut keyed = Script::compile(&text, std::path::Path::new("."))?;
    keyed.settings.keys = Some(args.keys as f64);
    scripts.push(keyed);
    let timed = time_scripts(&scripts, &batches, args.repeat, &StateOptions::default())?;
    let names = ORDER.iter().map(|s| s.name()).chain(["the plan chosen with SET keys"]);
    for (name, (_, stats)) in names.zip(&timed) {
        // Every plan must produce the same rows.
        if stats.rows_out != timed[0].1.rows_out {
            return Err(TesseraError::Internal(format!(
                "{name} produced {} rows, {} {}, for {windows:?}",
                stats.rows_out,
                ORDER[0].name(),
                timed[0].1.rows_out
            )));
        }
    }
    Ok(timed.into_iter().unzip())
}

/// A comma-separated option: every item parsed and `valid`, or an error naming the option.
pub fn parse_list<T>(option: &str, text: &str, (min, max): (T, T)) -> Result<Vec<T>, TesseraError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    text.split(',')
        .map(|item| tessera::settings::parse_between(item, min, max))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|message| TesseraError::Option(format!("each item of {option} {message}")))
}

/// The JSON-lines report file, if one was asked for.
pub fn create_report(path: Option<&std::path::Path>) -> Result<Option<std::fs::File>, TesseraError> {
    path.map(|path| {
        std::fs::File::create(path).map_err(|e| TesseraError::io(format!("cannot write {}", path.display()), e))
    })
    .transpose()
}

/// The script `text` with `strategy` forced.
pub fn forced(text: &str, strategy: Strategy) -> Result<Script, TesseraError> {
    let mut script = Script::compile(text, std::path::Path::new("."))?;
    script.settings.window_strategy = Some(strategy);
    Ok(script)
}

/// Runs each of `scripts` `repeat` times on `batches`, one run of each per round (load that
/// drifts during a benchmark falls on all alike), in an order shuffled every round (a rotating
/// order keeps each script behind the same one, which may leave the machine in a state of its
/// own), with one worker and the rows dropped; the median time of each, and its last run's
/// statistics.
pub fn time_scripts(
    scripts: &[Script],
    batches: &[RecordBatch],
    repeat: usize,
    state: &StateOptions,
) -> Result<Vec<(f64, RunStats)>, TesseraError> {
    let options = RunOptions { parallelism: Parallelism::Fixed(1), state: state.clone(), ..RunOptions::default() };
    let n = scripts.len();
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut last: Vec<Option<RunStats>> = vec![None; n];
    let mut rng = SplitMix::new(n as u64);
    let mut order: Vec<usize> = (0..n).collect();
    for _ in 0..repeat.max(1) {
        for i in (1..n).rev() {
            order.swap(i, rng.between(0, i as i64) as usize);
        }
        for &i in &order {
            let mut sink = DiscardSink;
            let started = Instant::now();
            let stats = run_script_with_readers(&scripts[i], &options, &mut sink, &mut |_| {
                Ok(Box::new(MemoryReader::new(batches.to_vec())) as Box<dyn BatchReader>)
            })?;
            runs[i].push(started.elapsed().as_secs_f64());
            last[i] = Some(stats);
        }
    }
    Ok(runs
        .into_iter()
        .zip(last)
        .map(|(mut times, stats)| {
            times.sort_by(f64::total_cmp);
            (times[times.len() / 2], stats.expect("at least one run"))
        })
        .collect())
}

/// Drops every row, as a benchmark's blackhole sink does: every strategy emits the same rows,
/// and keeping a whole run's output in memory would time the allocator growing it (fresh
/// pages, faulted in and zeroed) rather than the plan.
struct DiscardSink;

impl ResultSink for DiscardSink {
    fn open_query(&mut self, _: usize, _: &arrow::datatypes::SchemaRef) -> tessera::Result<()> {
        Ok(())
    }

    fn write_rows(&mut self, _: usize, _: &RecordBatch) -> tessera::Result<()> {
        Ok(())
    }

    fn write_late(&mut self, _: usize, _: &RecordBatch) -> tessera::Result<()> {
        Ok(())
    }

    fn finish(&mut self) -> tessera::Result<()> {
        Ok(())
    }

    fn checkpoint(&mut self) -> tessera::Result<Vec<u64>> {
        Ok(Vec::new())
    }

    fn resume(&mut self, _: &[u64]) -> tessera::Result<()> {
        Ok(())
    }
}

/// `events` in time order, `eta` per time unit, over `keys` keys, in batches of the size a
/// source is read in.
pub fn stream(events: usize, eta: f64, keys: u64) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, false),
        Field::new("ts", DataType::Int64, false),
    ]));
    let mut rng = SplitMix::new(events as u64);
    let all: Vec<(i64, f64, i64)> = (0..events)
        .map(|i| {
            ((rng.next_u64() % keys.max(1)) as i64, (rng.next_u64() % 10_000) as f64 / 100.0, (i as f64 / eta) as i64)
        })
        .collect();
    all.chunks(tessera::connectors::DEFAULT_BATCH_SIZE)
        .map(|chunk| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|e| e.0))),
                    Arc::new(Float64Array::from_iter_values(chunk.iter().map(|e| e.1))),
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|e| e.2))),
                ],
            )
            .expect("batch")
        })
        .collect()
}

/// Spearman's rank correlation (ties get their average rank).
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(x: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
        let mut r = vec![0.0; x.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i;
            while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
                j += 1;
            }
            for k in i..=j {
                r[order[k]] = (i + j) as f64 / 2.0 + 1.0;
            }
            i = j + 1;
        }
        r
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let mean = (n + 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let var = |r: &[f64]| r.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
    let denominator = (var(&ra) * var(&rb)).sqrt();
    if denominator == 0.0 {
        0.0
    } else {
        cov / denominator
    }
}

#[cfg(test)]
mod tests {
    use super::spearman;

    #[test]
    fn spearman_of_known_orders() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), 1.0);
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), -1.0);
        // Ties share their average rank.
        let rho = spearman(&[1.0, 1.0, 2.0, 3.0], &[1.0, 2.0, 3.0, 4.0]);
        assert!((rho - 0.9486832980505138).abs() < 1e-12, "{rho}");
    }
}
