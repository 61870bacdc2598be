//! The `tessera` command line: run a script, explain its plan, generate example data.

/// Window operators allocate many small states (one table per window instance and slice);
/// mimalloc serves them several times faster than the system allocator. Version 2 (the
/// crate's `v2` feature): with 3, columns decoded on the reading thread and freed by a worker
/// left the reading thread on fresh pages (W1 committed 44 MiB and purged 40 of them).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod bench_slide;
mod bench_wcg;
mod generate;
mod shell;
mod tpch;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tessera::connectors::sink::{FileSink, OutputFormat};
use tessera::connectors::{OnError, ReadOptions};
use tessera::engine::{run_script, RunOptions, RunStats, Script, StateOptions};
use tessera::exec::pipeline::{Parallelism, Progress};
use tessera::settings::{parse_assignment, parse_between, MAX_PARALLELISM};
use tessera::state::checkpoint::CheckpointConfig;
use tessera::TesseraError;
use tessera_db::{CompileTarget, Prepared, Session, SessionOptions};

#[derive(Parser)]
#[command(name = "tessera", version, about = "Streaming SQL over event files: windowed aggregates in event time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Csv,
    Jsonl,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StateBackendArg {
    Memory,
    Disk,
}

/// Where window state lives (`run` and `bench slide`).
#[derive(clap::Args, Debug)]
pub struct StateArgs {
    /// Where window state lives: in memory, or in key groups the least recently used of which
    /// go to an LSM store on disk beyond --state-memory.
    #[arg(long, value_enum, default_value = "memory")]
    state_backend: StateBackendArg,
    /// Memory for window state with --state-backend disk, e.g. 256MB or 2GB, at most
    /// 1048576GB [default: 1GB].
    #[arg(long, value_parser = tessera::settings::parse_size)]
    state_memory: Option<u64>,
}

impl StateArgs {
    /// Whether either option was given.
    pub fn given(&self) -> bool {
        !matches!(self.state_backend, StateBackendArg::Memory) || self.state_memory.is_some()
    }

    /// The state options, spilling (with the disk backend) under `dir`.
    pub fn options(&self, dir: std::path::PathBuf) -> Result<StateOptions, TesseraError> {
        match (self.state_backend, self.state_memory) {
            (StateBackendArg::Memory, None) => Ok(StateOptions { spill_dir: dir, ..StateOptions::default() }),
            (StateBackendArg::Memory, Some(_)) => Err(TesseraError::Option(
                "--state-memory bounds the state of --state-backend disk; the memory backend keeps all state in memory"
                    .into(),
            )),
            (StateBackendArg::Disk, memory) => Ok(StateOptions {
                memory_bytes: Some(memory.unwrap_or(1 << 30)),
                spill_dir: dir,
                ..StateOptions::default()
            }),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ErrorPolicy {
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
    Run(RunArgs),
    /// Show the plan of every query of a script.
    Explain {
        script: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: ExplainFormat,
        /// A setting as with SET in the script (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
    },
    /// Print the script as the SQL of a distributed engine: a script of streams as Flink SQL
    /// running the same shared window plan, a database script's samples and estimates as Spark SQL.
    Compile {
        /// The engine to target.
        #[arg(long, value_enum)]
        target: Target,
        script: PathBuf,
        /// A setting as with SET in the script (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
    },
    /// Time the queries of a script on input preloaded into memory (compute only), or run the
    /// window-set benchmark (`tessera bench wcg`).
    Bench(bench::BenchArgs),
    /// Write a synthetic IoT stream (device_id, temperature, ts in seconds) as CSV or Parquet.
    Generate(generate::GenerateArgs),
    /// Run SQL against a database of tables: the statements given with -c, or a shell.
    Sql(shell::SqlArgs),
    /// Bring back a database whose newest manifest is damaged or missing: its previous manifest
    /// (the database before its last statement) becomes current when it and every file it names
    /// are intact; the damaged manifest is kept beside it.
    Recover {
        /// The database folder.
        #[arg(long)]
        db: PathBuf,
    },
}

/// The build targets x86-64-v3 (`.cargo/config.toml`): on a CPU without its instructions, say
/// so instead of dying on the first one. `None` when the CPU has them.
#[cfg(target_arch = "x86_64")]
fn missing_cpu_features() -> Option<String> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let (basic, extended) = (__cpuid(1), __cpuid_count(7, 0));
    let features = [
        ("AVX2", extended.ebx & (1 << 5) != 0),
        ("BMI2", extended.ebx & (1 << 8) != 0),
        ("FMA", basic.ecx & (1 << 12) != 0),
        ("AVX enabled by the OS (OSXSAVE)", basic.ecx & (1 << 27) != 0),
    ];
    let missing: Vec<&str> = features.iter().filter(|(_, present)| !present).map(|(name, _)| *name).collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

#[cfg(not(target_arch = "x86_64"))]
fn missing_cpu_features() -> Option<String> {
    None
}

fn main() -> ExitCode {
    if cfg!(target_feature = "avx2") {
        if let Some(missing) = missing_cpu_features() {
            eprintln!(
                "error: this build of tessera needs an x86-64-v3 CPU, and this one lacks {missing}; \
                 build it with RUSTFLAGS=\"-C target-cpu=x86-64\""
            );
            return ExitCode::from(2);
        }
    }
    // A reader that stops early (`tessera ... | head`) ends the process quietly, as it ends
    // other tools, instead of failing the next write.
    // SAFETY: setting a signal's disposition to its default, before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TESSERA_LOG"))
        .with_writer(std::io::stderr)
        .init();
    // Usage errors are the user's to fix: exit status 1, as for other options (clap's own is 2,
    // which tessera keeps for its bugs); help and version exit 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(usage) => {
            let _ = usage.print();
            return ExitCode::from(u8::from(usage.use_stderr()));
        }
    };
    // Evaluating a deeply nested expression recurses: the main thread's stack is too small.
    let result = tessera::exec::on_deep_stack("tessera-main", move || match cli.command {
        Command::Run(args) => run(args),
        Command::Explain { script, format, settings } => explain(&script, format, &settings),
        Command::Compile { target, script, settings } => compile(target, &script, &settings),
        Command::Generate(args) => generate::generate(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::Sql(args) => shell::sql(&args),
        Command::Recover { db } => tessera_db::storage::recover(&db).map(|said| println!("{said}")),
    });
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

#[derive(clap::Args)]
pub struct RunArgs {
    /// The SQL script (CREATE SOURCE, SET, SELECT ...; or CREATE TABLE, INSERT, COPY,
    /// CREATE MATERIALIZED VIEW, REFRESH, SELECT ... over tables).
    script: PathBuf,
    /// Run a script of table statements against the database in this folder (created if
    /// absent); without it such a script's database lives in memory for the run.
    #[arg(long)]
    db: Option<PathBuf>,
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
    /// Worker threads, 1 to 256; rows are split by key hash when there are fewer operators
    /// than workers (default: chosen per script, up to the number of cores).
    #[arg(long, value_parser = between(1, MAX_PARALLELISM))]
    parallelism: Option<usize>,
    /// Save checkpoints here, and resume from the last one if the directory holds one (needs
    /// --output: on resume the output files are cut back to the checkpoint).
    #[arg(long, requires = "output")]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    state: StateArgs,
    /// Seconds between checkpoints (with --state-dir), 0 to 86400.
    #[arg(long, default_value_t = 10.0, requires = "state_dir", value_parser = between(0.0, 86_400.0))]
    checkpoint_interval: f64,
    /// No progress bar and no summary.
    #[arg(long, short)]
    quiet: bool,
    /// A setting as with SET in the script, e.g. `--set window_strategy=baseline`
    /// (repeatable; wins over the script's SET).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    settings: Vec<String>,
}

impl RunArgs {
    /// What a malformed input row does.
    fn read_options(&self) -> ReadOptions {
        ReadOptions {
            on_error: match self.on_error {
                ErrorPolicy::Fail => OnError::Fail,
                ErrorPolicy::Skip => OnError::Skip,
            },
            dead_letter_path: self.dead_letter.clone(),
            ..ReadOptions::default()
        }
    }
}

/// A session for the script at `path` (relative paths in it are under its folder), on the
/// database folder `db` (or in memory), with the command line's `--set NAME=VALUE` settings and
/// `--parallelism`; and the script's text.
pub fn open_session(
    path: &std::path::Path,
    db: Option<&std::path::Path>,
    settings: &[String],
    parallelism: Option<usize>,
    read: Option<ReadOptions>,
) -> Result<(Session, String), TesseraError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| TesseraError::io(format!("cannot read {}", path.display()), e))?;
    let mut overrides = settings
        .iter()
        .map(|assignment| parse_assignment(assignment).map_err(TesseraError::Option))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(workers) = parallelism {
        overrides.push(("parallelism".into(), workers.to_string()));
    }
    let session = Session::open(SessionOptions {
        db: db.map(std::path::Path::to_path_buf),
        base_dir: path.parent().unwrap_or_else(|| std::path::Path::new(".")).to_path_buf(),
        settings: overrides,
        read,
    })?;
    Ok((session, text))
}

fn run(args: RunArgs) -> Result<(), TesseraError> {
    let (session, text) =
        open_session(&args.script, args.db.as_deref(), &args.settings, args.parallelism, Some(args.read_options()))?;
    let script = match session.prepare(&text)? {
        Prepared::Streams(script) => script,
        Prepared::Statements(statements) => return shell::run_statements(&args, session, &statements),
    };
    let parallelism = parallelism(args.parallelism);
    let format = match args.format {
        Format::Csv => OutputFormat::Csv,
        Format::Jsonl => OutputFormat::JsonLines,
    };
    if args.state_dir.is_some() {
        let dead_letter = matches!(args.on_error, ErrorPolicy::Skip).then_some(args.dead_letter.as_path());
        checkpointable_outputs(&[args.output.as_deref(), args.late_output.as_deref(), dead_letter])?;
    }
    let schemas: Vec<_> = script.queries.iter().map(|q| q.output_schema.clone()).collect();
    let mut sink = FileSink::new(format, args.output.clone(), args.late_output.clone(), &schemas)?;
    refuse_clobbering(&args, &script, &sink)?;
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
        read: args.read_options(),
        progress: Some(&progress),
        state: args.state.options(args.state_dir.clone().unwrap_or_else(std::env::temp_dir))?,
        checkpoints: match &args.state_dir {
            Some(dir) => Some(CheckpointConfig {
                dir: dir.clone(),
                interval: std::time::Duration::from_secs_f64(args.checkpoint_interval),
            }),
            None => None,
        },
        batch_sql: match script.kept_whole().is_empty() {
            true => None,
            false => Some(std::sync::Arc::new(tessera_db::DataFusionBatchSql::new()?)),
        },
    };
    for (q, because) in script.kept_whole() {
        eprintln!(
            "tessera: warning: query {} keeps every event of its source: its state grows with the stream; \
             {because}",
            q + 1
        );
    }
    let result = run_script(&script, &options, &mut sink);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let stats = result?;
    if let Some(path) = &args.stats_json {
        write_stats(path, &stats)?;
    }
    if !args.quiet {
        eprintln!("{}", summary(&stats, &args));
    }
    Ok(())
}

/// Writes a run's statistics as one JSON object (`--stats-json`).
pub fn write_stats(path: &std::path::Path, stats: &RunStats) -> Result<(), TesseraError> {
    let json = serde_json::to_string_pretty(stats).map_err(|e| TesseraError::Internal(e.to_string()))?;
    std::fs::write(path, json + "\n").map_err(|e| TesseraError::io(format!("cannot write {}", path.display()), e))
}

/// Refuses, before anything is read or written, an output file that is an input of the run
/// (the script, a source) or another output.
fn refuse_clobbering(args: &RunArgs, script: &Script, sink: &FileSink) -> Result<(), TesseraError> {
    use tessera::catalog::Location;
    use tessera::connectors::file_identity::{self, FileUse};
    let mut inputs = vec![FileUse::new("the script", &args.script)];
    for name in script.catalog.source_names() {
        if let Some(Location::File(path)) = script.catalog.source(name).map(|s| &s.location) {
            inputs.push(FileUse::new(format!("the file of source `{name}`"), path));
        }
    }
    let mut outputs = sink.files();
    if matches!(args.on_error, ErrorPolicy::Skip) {
        outputs.push(FileUse::new("--dead-letter", &args.dead_letter));
    }
    outputs.extend(args.stats_json.iter().map(|path| FileUse::new("--stats-json", path)));
    file_identity::refuse_clobbering(&inputs, &outputs)
}

/// Checkpointed output is cut back to the checkpoint on resume: it must go to regular files
/// (or paths not created yet), not to a device such as /dev/null or a pipe.
fn checkpointable_outputs(outputs: &[Option<&std::path::Path>]) -> Result<(), TesseraError> {
    for path in outputs.iter().flatten() {
        if std::fs::metadata(path).is_ok_and(|meta| !meta.is_file()) {
            return Err(TesseraError::Option(format!(
                "--state-dir needs regular output files: {} is not one, and rows written after a checkpoint are cut back on resume",
                path.display()
            )));
        }
    }
    Ok(())
}

/// `--parallelism N` fixes the number of workers (over the script's `SET parallelism`); by
/// default the engine chooses per script, up to the number of cores.
pub fn parallelism(flag: Option<usize>) -> Parallelism {
    match flag {
        Some(n) => Parallelism::Fixed(n),
        None => Parallelism::Auto(tessera::exec::cores()),
    }
}

/// A command-line value parser for a number from `min` to `max` (inclusive), whose error
/// states the range.
pub fn between<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
{
    move |text| parse_between(text, min, max)
}

fn summary(stats: &RunStats, args: &RunArgs) -> String {
    // A rate of no events (a finished checkpoint run again) says nothing.
    let rate = match stats.events_in {
        0 => String::new(),
        _ => format!(" ({:.2}M events/s)", stats.events_per_second / 1e6),
    };
    let mut text = format!(
        "tessera: {} events in {:.2} s{rate}, {} rows out, {} late, {} bad rows, workers: {}",
        stats.events_in,
        stats.elapsed_ms as f64 / 1000.0,
        stats.rows_out,
        stats.late_events,
        stats.bad_rows,
        stats.parallelism,
    );
    if let Some(dir) = &args.state_dir {
        if stats.resumed_events > 0 {
            text.push_str(&format!(
                "\n  resumed from the checkpoint in {} at {} events (restored in {:.2} s)",
                dir.display(),
                stats.resumed_events,
                stats.recovery_ms as f64 / 1000.0
            ));
        }
        text.push_str(&format!(
            "\n  {} checkpoints written to {} ({:.2} s)",
            stats.checkpoints,
            dir.display(),
            stats.checkpoint_ms as f64 / 1000.0
        ));
    }
    let spill = &stats.spill;
    if spill.group_writes > 0 {
        // Groups of window keys or of synopsis partitions.
        text.push_str(&format!(
            "\n  spilled state: {} groups written ({:.1} MB), {} read back ({:.1} MB)",
            spill.group_writes,
            spill.bytes_written as f64 / 1e6,
            spill.group_reads,
            spill.bytes_read as f64 / 1e6,
        ));
        if spill.lookups_in_memory > 0 {
            text.push_str(&format!(", {} closes answered from memory", spill.lookups_in_memory));
        }
    }
    if stats.bad_rows > 0 {
        text.push_str(&format!("\n  skipped rows are in {}", args.dead_letter.display()));
    }
    if stats.late_events > 0 && args.late_output.is_none() {
        text.push_str("\n  late events were dropped; --late-output FILE keeps them");
    }
    for hint in &stats.keys_hints {
        let queries: Vec<String> = hint.queries.iter().map(|q| (q + 1).to_string()).collect();
        let other = if hint.with_keys == hint.planned { "another " } else { "" };
        text.push_str(&format!(
            "\n  the windows of {} {} held {} group keys each on average; planned for many keys, they ran `{}`: \
             told `SET keys = {}`, the cost model chooses {other}`{}`, {:.2}x cheaper for that many keys \
             (`tessera explain --set keys={}` shows it)",
            if queries.len() == 1 { "query" } else { "queries" },
            queries.join(", "),
            hint.keys,
            hint.planned,
            hint.keys,
            hint.with_keys,
            hint.modeled_ratio,
            hint.keys
        ));
    }
    text
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Target {
    /// Flink SQL of a script of streams and window queries.
    Flink,
    /// Spark SQL of a database script: its tables, sampled views and estimates.
    Spark,
}

fn compile(target: Target, path: &std::path::Path, settings: &[String]) -> Result<(), TesseraError> {
    let (session, text) = open_session(path, None, settings, None, None)?;
    let target = match target {
        Target::Flink => CompileTarget::Flink,
        Target::Spark => CompileTarget::Spark,
    };
    print!("{}", session.compile(&text, target)?);
    Ok(())
}

fn explain(path: &std::path::Path, format: ExplainFormat, settings: &[String]) -> Result<(), TesseraError> {
    let (session, text) = open_session(path, None, settings, None, None)?;
    let explained = session.explain(&text)?;
    match format {
        ExplainFormat::Json => println!("{}", serde_json::to_string_pretty(&explained).expect("json")),
        ExplainFormat::Dot => print!("{}", tessera::explain::explain_dot(&explained)),
        ExplainFormat::Text => print!("{}", tessera::explain::explain_text(&explained)),
    }
    Ok(())
}
