//! `tessera sql`: statements against a database, like `duckdb` or `sqlite3`. With `-c` it runs
//! those statements and exits (status 1 at the first that fails); otherwise it reads statements
//! ending in `;`, with line editing and history (`~/.tessera_history`) on a terminal, and prints
//! each query's rows as an aligned table with the time it took.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::time::Instant;

use tessera::TesseraError;
use tessera_db::{Database, Outcome};

#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// The database folder (created if absent); without it the database lives in memory.
    #[arg(long)]
    db: Option<PathBuf>,
    /// Run these statements and exit.
    #[arg(short = 'c', value_name = "SQL")]
    command: Option<String>,
    /// How query rows are printed: aligned tables, or CSV with a header row for tools (what
    /// other statements changed then goes to stderr).
    #[arg(long, value_enum, default_value = "table")]
    format: RowFormat,
    /// Print the time each statement took to stderr (`-c` and piped statements; the shell
    /// always shows it).
    #[arg(long)]
    timer: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    Table,
    Csv,
}

pub fn sql(args: &SqlArgs) -> Result<(), TesseraError> {
    let mut db = match &args.db {
        Some(dir) => Database::open(dir)?,
        None => Database::in_memory()?,
    };
    if let Some(command) = &args.command {
        return run_each(&mut db, command, args);
    }
    if std::io::stdin().is_terminal() {
        interactive(&mut db, args.format)
    } else {
        // Piped statements run as a script: the first failure stops it.
        let mut text = String::new();
        for line in std::io::stdin().lock().lines() {
            text.push_str(&line.map_err(|e| TesseraError::io("cannot read stdin", e))?);
            text.push('\n');
        }
        run_each(&mut db, &text, args)
    }
}

/// Runs the statements of `text` in order, the first failure stopping them.
fn run_each(db: &mut Database, text: &str, args: &SqlArgs) -> Result<(), TesseraError> {
    for statement in tessera_db::parse(text)? {
        let started = Instant::now();
        let outcome = execute(db, &statement)?;
        if args.timer {
            eprintln!("time: {:.3} s", started.elapsed().as_secs_f64());
        }
        print_outcome(&outcome, args.format)?;
    }
    Ok(())
}

fn interactive(db: &mut Database, format: RowFormat) -> Result<(), TesseraError> {
    let mut editor =
        rustyline::DefaultEditor::new().map_err(|e| TesseraError::Option(format!("no line editor: {e}")))?;
    let history = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".tessera_history"));
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    println!("tessera {}: statements end with `;`; Ctrl-D leaves.", env!("CARGO_PKG_VERSION"));
    let mut pending = String::new();
    loop {
        let prompt = if pending.is_empty() { "tessera> " } else { "   ...> " };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(rustyline::error::ReadlineError::Interrupted) => {
                pending.clear();
                continue;
            }
            Err(_) => break,
        };
        pending.push_str(&line);
        pending.push('\n');
        if !pending.trim_end().ends_with(';') {
            continue;
        }
        let text = std::mem::take(&mut pending);
        let _ = editor.add_history_entry(text.trim());
        let started = Instant::now();
        let result = tessera_db::parse(&text).and_then(|statements| {
            statements.iter().try_for_each(|statement| print_outcome(&execute(db, statement)?, format))
        });
        match result {
            Ok(()) => println!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// Runs `statement`, telling on stderr of the malformed rows it skipped and the late events its
/// window queries did not aggregate.
fn execute(db: &mut Database, statement: &tessera_db::Statement) -> Result<Outcome, TesseraError> {
    let before = db.read_totals();
    let outcome = db.execute_statement(statement)?;
    let after = db.read_totals();
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    if let (Some(file), skipped @ 1..) = (&after.dead_letter, after.skipped_rows - before.skipped_rows) {
        eprintln!("{skipped} malformed row{} skipped into {}", plural(skipped), file.display());
    }
    if let late @ 1.. = after.late_events - before.late_events {
        eprintln!("{late} late event{} not aggregated (older than the watermark when read)", plural(late));
    }
    Ok(outcome)
}

fn print_outcome(outcome: &Outcome, format: RowFormat) -> Result<(), TesseraError> {
    match (outcome, format) {
        (Outcome::Rows { schema, batches }, RowFormat::Csv) => {
            let mut out = std::io::stdout().lock();
            write_csv(&mut out, schema, batches)?;
            std::io::Write::flush(&mut out).map_err(|e| TesseraError::io("cannot write results", e))?;
        }
        (Outcome::Changed { rows }, RowFormat::Csv) => {
            eprintln!("{rows} row{} changed", if *rows == 1 { "" } else { "s" })
        }
        (Outcome::Done, RowFormat::Csv) => {}
        (Outcome::Rows { schema, batches }, RowFormat::Table) => {
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            println!("{}", arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)?);
            println!("{rows} row{}", if rows == 1 { "" } else { "s" });
        }
        (Outcome::Changed { rows }, RowFormat::Table) => {
            println!("{rows} row{} changed", if *rows == 1 { "" } else { "s" })
        }
        (Outcome::Done, RowFormat::Table) => println!("OK"),
    }
    Ok(())
}

/// `tessera run [--db DIR] FILE.sql` for a script of table statements: each statement in order,
/// paths relative to the script's folder, the rows of every query as CSV (a header row each)
/// to `output` or stdout, what other statements changed to stderr (unless `quiet`); the first
/// failure stops the script.
pub fn run_statements(
    script: &std::path::Path,
    db: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
    statements: &[tessera_db::Statement],
    read: tessera::connectors::ReadOptions,
    quiet: bool,
) -> Result<(), TesseraError> {
    let mut database = match db {
        Some(dir) => Database::open(dir)?,
        None => Database::in_memory()?,
    };
    database.set_read_options(read);
    database.set_base_dir(script.parent().unwrap_or_else(|| std::path::Path::new(".")));
    let out: Box<dyn std::io::Write> = match output {
        Some(path) => Box::new(
            std::fs::File::create(path)
                .map_err(|e| TesseraError::io(format!("cannot create {}", path.display()), e))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let started = Instant::now();
    let mut out = std::io::BufWriter::new(out);
    let mut rows_out = 0;
    for statement in statements {
        match execute(&mut database, statement)? {
            Outcome::Rows { schema, batches } => {
                rows_out += batches.iter().map(|b| b.num_rows()).sum::<usize>();
                write_csv(&mut out, &schema, &batches)?;
            }
            Outcome::Changed { rows } if !quiet => eprintln!("{rows} row{} changed", if rows == 1 { "" } else { "s" }),
            Outcome::Changed { .. } | Outcome::Done => {}
        }
    }
    std::io::Write::flush(&mut out).map_err(|e| TesseraError::io("cannot write results", e))?;
    if !quiet {
        let totals = database.read_totals();
        let mut read = String::new();
        if totals.events > 0 {
            read.push_str(&format!(", {} events read from streams, {} late", totals.events, totals.late_events));
        }
        if totals.skipped_rows > 0 {
            read.push_str(&format!(", {} malformed rows skipped", totals.skipped_rows));
        }
        eprintln!(
            "tessera: {} statements in {:.2} s, {rows_out} rows out{read}",
            statements.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// A query's rows as CSV under a header row of their own (the header even without rows).
fn write_csv(
    out: &mut dyn std::io::Write,
    schema: &arrow::datatypes::SchemaRef,
    batches: &[arrow::record_batch::RecordBatch],
) -> Result<(), TesseraError> {
    let mut writer = tessera::connectors::csv_writer::CsvWriter::new(out, true);
    writer.write(&arrow::record_batch::RecordBatch::new_empty(schema.clone()))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.into_inner()?;
    Ok(())
}
