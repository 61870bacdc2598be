//! The `tessera` command line: run a script, explain its plan, generate example data.

mod bench;
mod generate;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tessera::aggregate::common_sharing;
use tessera::connectors::sink::{FileSink, OutputFormat};
use tessera::connectors::{OnError, ReadOptions};
use tessera::engine::{query_windows, run_script, RunOptions, RunStats, Script};
use tessera::exec::pipeline::{Parallelism, Progress};
use tessera::optimizer::share_windows::{min_cost_forest, min_cost_with_factor_windows};
use tessera::window::cost::CostModel;
use tessera::TesseraError;

#[derive(Parser)]
#[command(name = "tessera", version, about = "Streaming SQL over event files: windowed aggregates in event time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Csv,
    Jsonl,
}

#[derive(Clone, Copy, ValueEnum)]
enum ErrorPolicy {
    Fail,
    Skip,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExplainFormat {
    Text,
    Json,
    /// Graphviz: one cluster per query, the stream and its windows, edges labelled with the
    /// slices each window merges.
    Dot,
}

#[derive(Subcommand)]
enum Command {
    /// Run every statement of a script and write the query results.
    Run {
        /// The SQL script (CREATE SOURCE, SET, SELECT ...).
        script: PathBuf,
        /// Write results here instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "csv")]
        format: Format,
        /// Write run statistics as one JSON object.
        #[arg(long)]
        stats_json: Option<PathBuf>,
        /// Write events that arrived after their window closed (CSV).
        #[arg(long)]
        late_output: Option<PathBuf>,
        /// What to do with a malformed input row.
        #[arg(long, value_enum, default_value = "fail")]
        on_error: ErrorPolicy,
        /// Where `--on-error skip` puts malformed rows (JSON lines).
        #[arg(long, default_value = "tessera-dead-letter.jsonl")]
        dead_letter: PathBuf,
        /// Worker threads; rows are split by key hash when there are fewer operators than
        /// workers (default: chosen per script, up to the number of cores).
        #[arg(long)]
        parallelism: Option<usize>,
        /// No progress bar and no summary.
        #[arg(long, short)]
        quiet: bool,
        /// A setting as with SET in the script, e.g. `--set window_strategy=baseline`
        /// (repeatable; wins over the script's SET).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
    },
    /// Show the plan of every query of a script.
    Explain {
        script: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: ExplainFormat,
        /// A setting as with SET in the script (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
    },
    /// Time the queries of a script on input preloaded into memory (compute only).
    Bench(bench::BenchArgs),
    /// Write a synthetic IoT stream (device_id, temperature, ts in seconds) as CSV or Parquet.
    Generate(generate::GenerateArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TESSERA_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            script,
            output,
            format,
            stats_json,
            late_output,
            on_error,
            dead_letter,
            parallelism,
            quiet,
            settings,
        } => run(RunArgs {
            script,
            output,
            format,
            stats_json,
            late_output,
            on_error,
            dead_letter,
            parallelism,
            quiet,
            settings,
        }),
        Command::Explain { script, format, settings } => explain(&script, format, &settings),
        Command::Generate(args) => generate::generate(&args),
        Command::Bench(args) => bench::bench(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::from(if error.is_user_error() { 1 } else { 2 })
        }
    }
}

struct RunArgs {
    script: PathBuf,
    output: Option<PathBuf>,
    format: Format,
    stats_json: Option<PathBuf>,
    late_output: Option<PathBuf>,
    on_error: ErrorPolicy,
    dead_letter: PathBuf,
    parallelism: Option<usize>,
    quiet: bool,
    settings: Vec<String>,
}

/// Compiles a script and applies the settings given on the command line.
pub fn load_script(path: &std::path::Path, settings: &[String]) -> Result<Script, TesseraError> {
    let mut script = Script::from_file(path)?;
    script.apply_settings(settings)?;
    Ok(script)
}

fn run(args: RunArgs) -> Result<(), TesseraError> {
    let script = load_script(&args.script, &args.settings)?;
    let parallelism = parallelism(args.parallelism)?;
    let format = match args.format {
        Format::Csv => OutputFormat::Csv,
        Format::Jsonl => OutputFormat::JsonLines,
    };
    let mut sink = FileSink::new(format, args.output.clone(), args.late_output.clone());
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {percent:>3}% {msg}")
                .expect("valid template"),
        );
        bar
    });
    let progress = |p: Progress| {
        if let Some(bar) = &bar {
            if let Some(total) = p.total {
                bar.set_length(total);
            }
            bar.set_position(p.done);
            bar.set_message(format!("{} events", p.events));
        }
    };
    let options = RunOptions {
        parallelism,
        read: ReadOptions {
            on_error: match args.on_error {
                ErrorPolicy::Fail => OnError::Fail,
                ErrorPolicy::Skip => OnError::Skip,
            },
            dead_letter_path: args.dead_letter.clone(),
            ..ReadOptions::default()
        },
        progress: Some(&progress),
    };
    let result = run_script(&script, &options, &mut sink);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let stats = result?;
    if let Some(path) = &args.stats_json {
        let json = serde_json::to_string_pretty(&stats).map_err(|e| TesseraError::Internal(e.to_string()))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| TesseraError::io(format!("cannot write {}", path.display()), e))?;
    }
    if !args.quiet {
        eprintln!("{}", summary(&stats, &args));
    }
    Ok(())
}

/// `--parallelism N` fixes the number of workers (over the script's `SET parallelism`); by
/// default the engine chooses per script, up to the number of cores.
pub fn parallelism(flag: Option<usize>) -> Result<Parallelism, TesseraError> {
    match flag {
        Some(0) => Err(TesseraError::Option("--parallelism must be at least 1".into())),
        Some(n) => Ok(Parallelism::Fixed(n)),
        None => Ok(Parallelism::Auto(std::thread::available_parallelism().map_or(1, |n| n.get()))),
    }
}

fn summary(stats: &RunStats, args: &RunArgs) -> String {
    let mut text = format!(
        "tessera: {} events in {:.2} s ({:.2}M events/s), {} rows out, {} late, {} bad rows, workers: {}",
        stats.events_in,
        stats.elapsed_ms as f64 / 1000.0,
        stats.events_per_second / 1e6,
        stats.rows_out,
        stats.late_events,
        stats.bad_rows,
        stats.parallelism,
    );
    if stats.bad_rows > 0 {
        text.push_str(&format!("\n  skipped rows are in {}", args.dead_letter.display()));
    }
    if stats.late_events > 0 && args.late_output.is_none() {
        text.push_str("\n  late events were dropped; --late-output FILE keeps them");
    }
    text
}

fn explain(path: &std::path::Path, format: ExplainFormat, settings: &[String]) -> Result<(), TesseraError> {
    let script = load_script(path, settings)?;
    let eta = script.settings.eta;
    let queries: Vec<serde_json::Value> = script
        .queries
        .iter()
        .map(|q| {
            let windows = query_windows(q);
            let model = CostModel::new(&windows, eta);
            let (baseline, shared, period) = (model.baseline(&windows), model.shared_slices(&windows), model.period);
            let slice = CostModel::slice_len(&windows).max(1);
            let sharing = common_sharing(functions_of(q));
            let distinct: Vec<(tessera::window::WindowSpec, bool)> = windows.iter().map(|w| (*w, true)).collect();
            let wcg = min_cost_forest(&distinct, sharing, &model).total_cost;
            let wcg_factor = min_cost_with_factor_windows(&windows, sharing, &model).total_cost;
            let unit = script.catalog.source(&q.source).map(|s| s.event_time.unit.suffix()).unwrap_or("");
            serde_json::json!({
                "sql": q.sql,
                "source": q.source,
                "windows": windows.iter().enumerate().map(|(i, w)| serde_json::json!({
                    "name": format!("w{}", i + 1), "range": w.range, "slide": w.slide, "unit": unit,
                    "output": true, "factor": false,
                })).collect::<Vec<_>>(),
                "aggregates": aggregates_of(q),
                "slice": slice,
                "edges": windows.iter().enumerate().map(|(i, w)| serde_json::json!({
                    "from": "stream", "to": format!("w{}", i + 1), "multiplier": w.range / slice,
                })).collect::<Vec<_>>(),
                "semantics": sharing,
                // wcg and wcg_factor are the optimizer's modeled plans; the runtime cannot run them yet.
                "costs": { "baseline": baseline, "shared_slices": shared, "wcg": wcg, "wcg_factor": wcg_factor, "chosen": shared },
                "chosen_strategy": if windows.is_empty() { "stateless" } else { "shared_slices" },
                "eta": eta,
                "period": period,
            })
        })
        .collect();
    match format {
        ExplainFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "queries": queries })).expect("json"))
        }
        ExplainFormat::Dot => print!("{}", explain_dot(&queries)),
        ExplainFormat::Text => {
            for (i, q) in queries.iter().enumerate() {
                println!("query {}: {}", i + 1, q["sql"].as_str().unwrap_or(""));
                println!("  source: {}", q["source"].as_str().unwrap_or(""));
                for w in q["windows"].as_array().into_iter().flatten() {
                    println!(
                        "  window {}: range {}{u}, slide {}{u}, merges {} slices of {}{u}",
                        w["name"],
                        w["range"],
                        w["slide"],
                        w["range"].as_i64().unwrap_or(0) / q["slice"].as_i64().unwrap_or(1),
                        q["slice"],
                        u = w["unit"].as_str().unwrap_or("")
                    );
                }
                println!("  aggregates: {}", q["aggregates"]);
                println!(
                    "  strategy: {} (modeled cost {} per period {}, eta {}; baseline {})",
                    q["chosen_strategy"], q["costs"]["chosen"], q["period"], q["eta"], q["costs"]["baseline"]
                );
                println!(
                    "  coverage graph ({}, modeled, not runnable yet): wcg {}, wcg_factor {}",
                    q["semantics"], q["costs"]["wcg"], q["costs"]["wcg_factor"]
                );
            }
        }
    }
    Ok(())
}

/// The EXPLAIN JSON of every query as one Graphviz digraph.
fn explain_dot(queries: &[serde_json::Value]) -> String {
    let mut dot = String::from("digraph tessera {\n  rankdir=LR;\n  node [shape=box];\n");
    for (i, q) in queries.iter().enumerate() {
        let label =
            format!("query {}: {} ({})", i + 1, q["chosen_strategy"].as_str().unwrap_or(""), q["costs"]["chosen"]);
        dot.push_str(&format!("  subgraph cluster_q{i} {{\n    label={label:?};\n"));
        dot.push_str(&format!("    q{i}_stream [label=\"stream\", shape=ellipse];\n"));
        for w in q["windows"].as_array().into_iter().flatten() {
            let name = w["name"].as_str().unwrap_or("");
            let unit = w["unit"].as_str().unwrap_or("");
            let text = format!("{name}: range {}{unit}, slide {}{unit}", w["range"], w["slide"]);
            dot.push_str(&format!("    q{i}_{name} [label={text:?}];\n"));
        }
        for e in q["edges"].as_array().into_iter().flatten() {
            let (from, to) = (e["from"].as_str().unwrap_or(""), e["to"].as_str().unwrap_or(""));
            dot.push_str(&format!("    q{i}_{from} -> q{i}_{to} [label=\"x{}\"];\n", e["multiplier"]));
        }
        dot.push_str("  }\n");
    }
    dot.push_str("}\n");
    dot
}

fn functions_of(query: &tessera::plan::QueryPlan) -> Vec<tessera::aggregate::AggregateFunction> {
    let mut functions = Vec::new();
    for branch in &query.branches {
        if let tessera::plan::BranchPlan::WindowAggregate(plan) = branch {
            functions.extend(plan.aggregates.iter().map(|a| a.function));
        }
    }
    functions
}

fn aggregates_of(query: &tessera::plan::QueryPlan) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for function in functions_of(query) {
        if !names.iter().any(|n| n == function.name()) {
            names.push(function.name().to_string());
        }
    }
    names
}
