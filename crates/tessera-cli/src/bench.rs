//! `tessera bench`: compute-only timing of a script. Sources are decoded into memory first
//! (that time is reported apart), then the queries run several times over the in-memory
//! batches; the median run is reported.

use std::path::PathBuf;
use std::time::Instant;

use tessera::connectors::memory::{read_all, MemoryReader};
use tessera::connectors::sink::MemorySink;
use tessera::connectors::{open_input, BatchReader, ReadOptions};
use tessera::engine::{run_script_with_readers, RunOptions};
use tessera::TesseraError;

use crate::between;

/// The most timed runs of a benchmark (`--repeat`).
pub const MAX_REPEAT: usize = 1000;
/// The most events a benchmark generates in memory (`--events`): 20M take about 500 MB.
pub const MAX_EVENTS: usize = 20_000_000;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    suite: Option<Suite>,
    /// The script to time.
    #[arg(required = true)]
    script: Option<PathBuf>,
    /// Timed runs (the median is reported), 1 to 1000.
    #[arg(long, default_value_t = 5, value_parser = between(1, MAX_REPEAT))]
    repeat: usize,
    /// Worker threads, 1 to 256 (default: the number of cores).
    #[arg(long, value_parser = between(1, tessera::settings::MAX_PARALLELISM))]
    parallelism: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// A setting as with SET in the script (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    settings: Vec<String>,
}

#[derive(clap::Subcommand)]
enum Suite {
    /// The multi-window evaluation: generated window sets, every strategy modeled and run.
    Wcg(crate::bench_wcg::WcgArgs),
    /// One hopping window, range/slide from 1 to 1,000: the naive plan, slices merged at
    /// emission and slices on a sliding aggregator (two stacks or a running value).
    Slide(crate::bench_slide::SlideArgs),
}

pub fn bench(args: &BenchArgs) -> Result<(), TesseraError> {
    let path = match (&args.suite, &args.script) {
        (Some(Suite::Wcg(wcg)), _) => return crate::bench_wcg::bench_wcg(wcg),
        (Some(Suite::Slide(slide)), _) => return crate::bench_slide::bench_slide(slide),
        (None, Some(path)) => path,
        (None, None) => return Err(TesseraError::Option("bench needs a script, `wcg` or `slide`".into())),
    };
    let (session, text) = crate::open_session(path, None, &args.settings, args.parallelism, None)?;
    let tessera_db::Prepared::Streams(script) = session.prepare(&text)? else {
        return Err(TesseraError::Option(
            "this is a database script: tessera bench times the queries of a script of streams on input held in \
             memory; time a database script's statements with tessera sql --timer"
                .into(),
        ));
    };
    let parallelism = crate::parallelism(args.parallelism);
    let read = ReadOptions { batch_size: script.settings.batch_size, ..ReadOptions::default() };
    let load_started = Instant::now();
    let mut loaded = Vec::new();
    for source in script.queries.iter().map(|q| q.source.clone()) {
        if loaded.iter().any(|(name, _)| *name == source) {
            continue;
        }
        let def = script.catalog.source(&source).expect("bound source");
        // Read as a run reads them (key columns perhaps as dictionaries).
        let read = ReadOptions {
            dictionary_columns: tessera::engine::dictionary_columns(&script.queries, def),
            ..read.clone()
        };
        let mut reader = open_input(def.input(), &read)?;
        loaded.push((source, read_all(reader.as_mut())?));
    }
    let load_seconds = load_started.elapsed().as_secs_f64();
    let events: usize = loaded.iter().flat_map(|(_, batches)| batches.iter().map(|b| b.num_rows())).sum();
    let options = RunOptions { parallelism, ..RunOptions::default() };
    let mut times = Vec::new();
    let (mut rows_out, mut workers) = (0, 0);
    for _ in 0..args.repeat {
        let mut sink = MemorySink::default();
        let started = Instant::now();
        let stats = run_script_with_readers(&script, &options, &mut sink, &mut |def| {
            let (_, batches) = loaded.iter().find(|(name, _)| name.eq_ignore_ascii_case(&def.name)).expect("loaded");
            Ok(Box::new(MemoryReader::new(batches.clone())) as Box<dyn BatchReader>)
        })?;
        times.push(started.elapsed().as_secs_f64());
        (rows_out, workers) = (stats.rows_out, stats.parallelism);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    if args.json {
        let report = serde_json::json!({
            "script": path.display().to_string(),
            "events": events,
            "rows_out": rows_out,
            "workers": workers,
            "decode_seconds": load_seconds,
            "compute_seconds_median": median,
            "compute_seconds": times,
            "events_per_second": events as f64 / median,
        });
        println!("{report}");
    } else {
        println!(
            "{}: {events} events, decode {load_seconds:.3} s; compute median {median:.3} s over {} runs = {:.2}M events/s (workers: {workers}, {rows_out} rows out)",
            path.display(),
            times.len(),
            events as f64 / median / 1e6,
        );
    }
    Ok(())
}
