//! `tessera sql`: statements against a database, like `duckdb` or `sqlite3`. With `-c` it runs
//! those statements and exits (status 1 at the first that fails); otherwise it reads statements
//! ending in `;`, with line editing and history (`~/.tessera_history`) on a terminal, and prints
//! each query's rows as an aligned table with the time it took.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::time::Instant;

use tessera::TesseraError;
use tessera_db::{Outcome, Session, SessionOptions};

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
    let mut db = Session::open(SessionOptions { db: args.db.clone(), ..SessionOptions::default() })?;
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
fn run_each(db: &mut Session, text: &str, args: &SqlArgs) -> Result<(), TesseraError> {
    for statement in db.parse(text)? {
        let started = Instant::now();
        let outcome = execute(db, &statement)?;
        if args.timer {
            eprintln!("time: {:.3} s", started.elapsed().as_secs_f64());
        }
        print_outcome(&outcome, args.format)?;
    }
    Ok(())
}

fn interactive(db: &mut Session, format: RowFormat) -> Result<(), TesseraError> {
    let mut editor =
        rustyline::DefaultEditor::new().map_err(|e| TesseraError::Option(format!("no line editor: {e}")))?;
    let history = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".tessera_history"));
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    println!(
        "tessera {}: statements end with `;`; `\\?` lists the commands; Ctrl-D leaves.",
        env!("CARGO_PKG_VERSION")
    );
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
        if pending.is_empty() {
            match command(line.trim()) {
                Some(Command::Leave) => break,
                Some(Command::Help) => {
                    print!("{HELP}");
                    continue;
                }
                Some(Command::Run(statement)) => {
                    let _ = editor.add_history_entry(line.trim());
                    if let Err(e) = run_text(db, &statement, format) {
                        eprintln!("error: {e}");
                    }
                    continue;
                }
                Some(Command::Unknown) => {
                    eprintln!("error: unknown command `{}`: `\\?` lists the commands", line.trim());
                    continue;
                }
                None => {}
            }
        }
        pending.push_str(&line);
        pending.push('\n');
        if !pending.trim_end().ends_with(';') {
            continue;
        }
        let text = std::mem::take(&mut pending);
        let _ = editor.add_history_entry(text.trim());
        let started = Instant::now();
        match run_text(db, &text, format) {
            Ok(()) => println!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    if !pending.trim().is_empty() {
        eprintln!("not run: the last statement has no `;` at its end:\n{}", pending.trim_end());
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// Runs the statements of `text`, printing what each gives.
fn run_text(db: &mut Session, text: &str, format: RowFormat) -> Result<(), TesseraError> {
    db.parse(text)?.iter().try_for_each(|statement| print_outcome(&execute(db, statement)?, format))
}

/// What the shell's commands do (`\?`).
const HELP: &str = "\
Statements end with `;` and may span lines; Ctrl-C drops the statement being typed.
  \\dt, \\d        list the tables, materialized views and sources (SHOW TABLES)
  \\d NAME         describe NAME's columns (DESCRIBE NAME)
  \\set            show every setting (SHOW ALL); \\set NAME VALUE sets one (SET NAME = VALUE)
  \\?, help        this help
  \\q, exit, quit  leave (or Ctrl-D)
";

/// A line of the shell that is a command of its own rather than SQL.
enum Command {
    Leave,
    Help,
    /// The statement the command stands for.
    Run(String),
    Unknown,
}

/// The command `line` is, if it is one (a backslash command, `help`, `exit` or `quit`).
fn command(line: &str) -> Option<Command> {
    let bare = line.trim_end_matches(';').trim();
    match bare.to_ascii_lowercase().as_str() {
        "exit" | "quit" | "\\q" => return Some(Command::Leave),
        "help" | "\\?" | "\\h" => return Some(Command::Help),
        _ => {}
    }
    let rest = bare.strip_prefix('\\')?;
    let (name, argument) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let argument = argument.trim();
    Some(match (name, argument) {
        ("dt" | "d" | "dv" | "dm", "") => Command::Run("SHOW TABLES".into()),
        ("d", table) => Command::Run(format!("DESCRIBE {table}")),
        ("set", "") => Command::Run("SHOW ALL".into()),
        ("set", assignment) => match assignment.split_once(char::is_whitespace) {
            Some((setting, value)) => Command::Run(format!("SET {setting} = '{}'", value.trim().replace('\'', "''"))),
            None => Command::Run(format!("SHOW {assignment}")),
        },
        _ => Command::Unknown,
    })
}

/// Runs `statement`, telling on stderr of the malformed rows it skipped and the late events its
/// window queries did not aggregate.
fn execute(db: &mut Session, statement: &tessera_db::Statement) -> Result<Outcome, TesseraError> {
    let before = db.read_totals();
    let outcome = db.execute(statement)?;
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
/// paths relative to the script's folder, the rows of every query as CSV (a header row each) or
/// JSON lines to `--output` or stdout, what other statements changed to stderr (unless
/// `--quiet`); the first failure stops the script. Every option is honoured or refused with the
/// reason, and no output may be a file the script reads or a file of the database.
pub fn run_statements(
    args: &crate::RunArgs,
    mut session: Session,
    statements: &[tessera_db::Statement],
) -> Result<(), TesseraError> {
    refuse_stream_options(args)?;
    refuse_clobbering(args, statements, session.base_dir())?;
    let out: Box<dyn std::io::Write> = match &args.output {
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
        match execute(&mut session, statement)? {
            Outcome::Rows { schema, batches } => {
                rows_out += batches.iter().map(|b| b.num_rows()).sum::<usize>();
                match args.format {
                    crate::Format::Csv => write_csv(&mut out, &schema, &batches)?,
                    crate::Format::Jsonl => write_jsonl(&mut out, &batches)?,
                }
            }
            Outcome::Changed { rows } if !args.quiet => {
                eprintln!("{rows} row{} changed", if rows == 1 { "" } else { "s" })
            }
            Outcome::Changed { .. } | Outcome::Done => {}
        }
    }
    std::io::Write::flush(&mut out).map_err(|e| TesseraError::io("cannot write results", e))?;
    let totals = session.read_totals();
    let elapsed = started.elapsed();
    if let Some(path) = &args.stats_json {
        let stats = tessera::engine::RunStats {
            events_in: totals.events,
            rows_out: rows_out as u64,
            late_events: totals.late_events,
            bad_rows: totals.skipped_rows,
            elapsed_ms: elapsed.as_millis() as u64,
            events_per_second: totals.events as f64 / elapsed.as_secs_f64().max(1e-9),
            ..Default::default()
        };
        crate::write_stats(path, &stats)?;
    }
    if !args.quiet {
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
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// The options of `run` that only a script of streams takes, refused for a database script
/// with the reason.
fn refuse_stream_options(args: &crate::RunArgs) -> Result<(), TesseraError> {
    let refused = if args.late_output.is_some() {
        Some(
            "--late-output writes the late events of a script of streams; a database script counts its late events \
             (in its summary and --stats-json) but does not keep them",
        )
    } else if args.state_dir.is_some() {
        Some(
            "--state-dir checkpoints a script of streams so that a killed run resumes; each statement of a database \
             script is durable on its own in --db DIR",
        )
    } else if args.state.given() {
        Some("--state-backend and --state-memory place the window state of a script of streams")
    } else {
        None
    };
    match refused {
        Some(reason) => Err(TesseraError::Option(format!("{reason}: {} is a database script", args.script.display()))),
        None => Ok(()),
    }
}

/// Refuses, before anything is read or written, an output that is a file the script reads
/// (the script, a table's initial contents, a COPY file, a source's file), another output, or
/// inside the database folder.
fn refuse_clobbering(
    args: &crate::RunArgs,
    statements: &[tessera_db::Statement],
    base_dir: &std::path::Path,
) -> Result<(), TesseraError> {
    use tessera::connectors::file_identity::{self, FileUse};
    let mut inputs = vec![FileUse::new("the script", &args.script)];
    for statement in statements {
        inputs.extend(
            tessera_db::files_read(statement, base_dir).into_iter().map(|(role, path)| FileUse::new(role, path)),
        );
    }
    let mut outputs: Vec<FileUse> = args.output.iter().map(|path| FileUse::new("--output", path)).collect();
    outputs.extend(args.stats_json.iter().map(|path| FileUse::new("--stats-json", path)));
    if matches!(args.on_error, crate::ErrorPolicy::Skip) {
        outputs.push(FileUse::new("--dead-letter", &args.dead_letter));
    }
    if let Some(db) = args.db.as_ref().and_then(|db| db.canonicalize().ok()) {
        for output in &outputs {
            let folder =
                output.path.parent().map(|p| if p.as_os_str().is_empty() { std::path::Path::new(".") } else { p });
            if folder.and_then(|f| f.canonicalize().ok()).is_some_and(|f| f.starts_with(&db)) {
                return Err(TesseraError::Option(format!(
                    "{} {} is inside the database folder {}: writing there could destroy the database; give another path",
                    output.role,
                    output.path.display(),
                    db.display()
                )));
            }
        }
    }
    file_identity::refuse_clobbering(&inputs, &outputs)
}

/// Rows as JSON lines, an object a row.
fn write_jsonl(out: &mut dyn std::io::Write, batches: &[arrow::record_batch::RecordBatch]) -> Result<(), TesseraError> {
    let mut writer = arrow::json::LineDelimitedWriter::new(out);
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backslash_commands_stand_for_statements() {
        let run = |line: &str| match command(line) {
            Some(Command::Run(statement)) => statement,
            _ => panic!("{line} is no statement"),
        };
        assert_eq!(run("\\dt"), "SHOW TABLES");
        assert_eq!(run("\\d \"My T\""), "DESCRIBE \"My T\"");
        assert_eq!(run("\\set"), "SHOW ALL");
        assert_eq!(run("\\set freshness exact"), "SET freshness = 'exact'");
        assert!(matches!(command("exit"), Some(Command::Leave)));
        assert!(matches!(command("\\q"), Some(Command::Leave)));
        assert!(matches!(command("help;"), Some(Command::Help)));
        assert!(matches!(command("\\x"), Some(Command::Unknown)));
        assert!(command("SELECT 1;").is_none());
    }
}
