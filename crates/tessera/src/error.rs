//! The engine's one error type. Every variant is something a user can act on, except
//! `Internal`, which is a bug in tessera and says so.

use std::fmt;

/// A position in a SQL script (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: u64,
    pub column: u64,
}

/// A SQL error with the script text needed to show a caret under the spot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlDiagnostic {
    pub message: String,
    pub location: Option<Location>,
    /// The offending source line, when the location is known.
    pub source_line: Option<String>,
    /// A hint such as "did you mean `temperature`?".
    pub help: Option<String>,
}

impl fmt::Display for SqlDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some(loc) => write!(f, "{} at line {}, column {}", self.message, loc.line, loc.column)?,
            None => write!(f, "{}", self.message)?,
        }
        if let (Some(loc), Some(text)) = (self.location, &self.source_line) {
            let (shown, caret) = excerpt(text, loc.column.saturating_sub(1) as usize);
            let gutter = loc.line.to_string();
            write!(f, "\n {gutter} | {shown}\n {} | ", " ".repeat(gutter.len()))?;
            write!(f, "{}^", " ".repeat(caret))?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n help: {help}")?;
        }
        Ok(())
    }
}

/// Characters of a source line shown around the caret: a line longer than this (a generated
/// script's, a 10,000-term expression's) is cut to a window around it, marked with `...`.
const EXCERPT_CHARS: usize = 100;

/// The part of `line` to show with a caret at character `column` (0-based), and where the
/// caret falls in it.
fn excerpt(line: &str, column: usize) -> (String, usize) {
    let length = line.chars().count();
    if length <= EXCERPT_CHARS {
        return (line.to_string(), column);
    }
    let start = column.saturating_sub(EXCERPT_CHARS / 3).min(length.saturating_sub(EXCERPT_CHARS));
    let end = (start + EXCERPT_CHARS).min(length);
    let mut shown: String = line.chars().skip(start).take(end - start).collect();
    let mut caret = column - start.min(column);
    if start > 0 {
        shown.insert_str(0, "...");
        caret += 3;
    }
    if end < length {
        shown.push_str("...");
    }
    (shown, caret)
}

/// Characters of input text a message shows at most.
const SHOWN_CHARS: usize = 200;

/// Input text as a message shows it: control characters escaped (`\u{1b}`, `\u{0}`), so that
/// binary input cannot drive the terminal, and cut after [`SHOWN_CHARS`] characters.
pub fn printable(text: &str) -> String {
    let mut shown = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN_CHARS {
            shown.push_str(&format!("... ({} more characters)", text.chars().count() - i));
            break;
        }
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

#[derive(Debug, thiserror::Error)]
pub enum TesseraError {
    /// The script does not parse or names something that does not exist.
    #[error("SQL error: {0}")]
    Sql(Box<SqlDiagnostic>),
    /// The script parses but asks for something tessera cannot run.
    #[error("plan error: {0}")]
    Plan(String),
    /// A malformed input row or file (the reason, which may quote the input, shown
    /// [`printable`]).
    #[error("{file}:{line}: {}", printable(.reason))]
    Input { file: String, line: u64, reason: String },
    /// Bad command-line options or session settings.
    #[error("invalid option: {0}")]
    Option(String),
    /// Reading or writing a file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A database folder that cannot be used as asked: damaged files, or written by another
    /// process.
    #[error("database error: {0}")]
    Database(String),
    /// A checkpoint that cannot be resumed: written by another plan, or damaged.
    #[error("checkpoint error: {0}")]
    Checkpoint(String),
    /// A runtime failure while evaluating a query (for example an arithmetic overflow).
    #[error("execution error: {0}")]
    Execution(String),
    /// A bug in tessera.
    #[error("internal error (this is a bug in tessera, please report it): {0}")]
    Internal(String),
}

impl TesseraError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TesseraError::Io { context: context.into(), source }
    }

    /// The error with its message rewritten by `rewrite` (the file and line of an input error,
    /// the location of a SQL error and the cause of an I/O error kept).
    pub fn map_message(self, rewrite: impl Fn(&str) -> String) -> Self {
        match self {
            TesseraError::Sql(mut diagnostic) => {
                diagnostic.message = rewrite(&diagnostic.message);
                TesseraError::Sql(diagnostic)
            }
            TesseraError::Plan(m) => TesseraError::Plan(rewrite(&m)),
            TesseraError::Input { file, line, reason } => TesseraError::Input { file, line, reason: rewrite(&reason) },
            TesseraError::Option(m) => TesseraError::Option(rewrite(&m)),
            TesseraError::Io { context, source } => TesseraError::Io { context: rewrite(&context), source },
            TesseraError::Database(m) => TesseraError::Database(rewrite(&m)),
            TesseraError::Checkpoint(m) => TesseraError::Checkpoint(rewrite(&m)),
            TesseraError::Execution(m) => TesseraError::Execution(rewrite(&m)),
            TesseraError::Internal(m) => TesseraError::Internal(rewrite(&m)),
        }
    }

    /// Whether the error is the user's to fix (exit status 1) rather than a bug (exit status 2).
    pub fn is_user_error(&self) -> bool {
        !matches!(self, TesseraError::Internal(_))
    }
}

impl From<datafusion_common::DataFusionError> for TesseraError {
    fn from(e: datafusion_common::DataFusionError) -> Self {
        use datafusion_common::DataFusionError as E;
        // A damaged database file met while DataFusion read it: said as tessera says it.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(error) = source {
            if let Some(TesseraError::Database(message)) = error.downcast_ref::<TesseraError>() {
                return TesseraError::Database(message.clone());
            }
            source = error.source();
        }
        match e {
            // A planner error with the spot it is about: a SQL error there (its source line is
            // added by `ScriptText::locate` where the script is known).
            E::Diagnostic(diagnostic, inner) => match diagnostic.span {
                Some(span) if span.start.line > 0 => TesseraError::Sql(Box::new(SqlDiagnostic {
                    message: sql_type_names(&match diagnostic.notes.is_empty() {
                        true => diagnostic.message.clone(),
                        false => {
                            let notes: Vec<&str> = diagnostic.notes.iter().map(|note| note.message.as_str()).collect();
                            format!("{} ({})", diagnostic.message, notes.join("; "))
                        }
                    }),
                    location: Some(Location { line: span.start.line, column: span.start.column }),
                    source_line: None,
                    help: diagnostic.helps.first().map(|h| sql_type_names(&h.message)),
                })),
                _ => TesseraError::from(*inner),
            },
            E::Internal(msg) => TesseraError::Internal(msg),
            E::Context(ctx, inner) => match TesseraError::from(*inner) {
                TesseraError::Plan(m) => TesseraError::Plan(format!("{ctx}: {m}")),
                TesseraError::Execution(m) => TesseraError::Execution(format!("{ctx}: {m}")),
                other => other,
            },
            E::Plan(msg) | E::NotImplemented(msg) => TesseraError::Plan(sql_type_names(&msg)),
            e @ E::SchemaError(..) => TesseraError::Plan(sql_type_names(&e.strip_backtrace())),
            E::ArrowError(err, _) => TesseraError::Execution(sql_type_names(&err.to_string())),
            other => TesseraError::Execution(sql_type_names(&other.strip_backtrace())),
        }
    }
}

impl From<arrow::error::ArrowError> for TesseraError {
    fn from(e: arrow::error::ArrowError) -> Self {
        TesseraError::Execution(e.to_string())
    }
}

/// `message` (DataFusion's or Arrow's) with the Arrow names of column types as SQL names them
/// (`Int64` as BIGINT, `Utf8` as VARCHAR), where they stand as words of their own.
fn sql_type_names(message: &str) -> String {
    const NAMES: [(&str, &str); 16] = [
        ("Timestamp(Microsecond, None)", "TIMESTAMP"),
        ("Timestamp(µs)", "TIMESTAMP"),
        ("Timestamp(Nanosecond, None)", "TIMESTAMP(9)"),
        ("Timestamp(ns)", "TIMESTAMP(9)"),
        ("Utf8View", "VARCHAR"),
        ("LargeUtf8", "VARCHAR"),
        ("Utf8", "VARCHAR"),
        ("Int64", "BIGINT"),
        ("Int32", "INT"),
        ("Int16", "SMALLINT"),
        ("Int8", "TINYINT"),
        ("Float64", "DOUBLE"),
        ("Float32", "REAL"),
        ("Boolean", "BOOLEAN"),
        ("Date32", "DATE"),
        ("Date64", "DATE"),
    ];
    let mut text = message.to_string();
    for (arrow, sql) in NAMES {
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(arrow) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + arrow.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            out.push_str(&rest[..at]);
            out.push_str(if word(before) || word(after) { arrow } else { sql });
            rest = &rest[at + arrow.len()..];
        }
        out.push_str(rest);
        text = out;
    }
    text
}

pub type Result<T, E = TesseraError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_source_lines_are_cut_around_the_caret() {
        let line = format!("SELECT {} FROM t", (0..500).map(|i| i.to_string()).collect::<Vec<_>>().join(" + "));
        let column = line.find("250").expect("a term") + 1;
        let diagnostic = SqlDiagnostic {
            message: "bad".into(),
            location: Some(Location { line: 3, column: column as u64 }),
            source_line: Some(line),
            help: None,
        };
        let text = diagnostic.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].len() < EXCERPT_CHARS + 20 && lines[1].contains("...") && lines[1].ends_with("..."), "{text}");
        // The caret stands under the spot.
        let caret = lines[2].find('^').expect("a caret");
        assert_eq!(&lines[1][caret..caret + 3], "250", "{text}");
        // A short line is shown whole.
        let (shown, caret) = excerpt("SELECT x", 7);
        assert_eq!((shown.as_str(), caret), ("SELECT x", 7));
    }
}
