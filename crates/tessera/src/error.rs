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
            let gutter = loc.line.to_string();
            write!(f, "\n {gutter} | {text}\n {} | ", " ".repeat(gutter.len()))?;
            write!(f, "{}^", " ".repeat(loc.column.saturating_sub(1) as usize))?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n help: {help}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TesseraError {
    /// The script does not parse or names something that does not exist.
    #[error("SQL error: {0}")]
    Sql(Box<SqlDiagnostic>),
    /// The script parses but asks for something tessera cannot run.
    #[error("plan error: {0}")]
    Plan(String),
    /// A malformed input row or file.
    #[error("{file}:{line}: {reason}")]
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

    /// Whether the error is the user's to fix (exit status 1) rather than a bug (exit status 2).
    pub fn is_user_error(&self) -> bool {
        !matches!(self, TesseraError::Internal(_))
    }
}

impl From<datafusion_common::DataFusionError> for TesseraError {
    fn from(e: datafusion_common::DataFusionError) -> Self {
        use datafusion_common::DataFusionError as E;
        match e {
            E::Internal(msg) => TesseraError::Internal(msg),
            E::Context(ctx, inner) => match TesseraError::from(*inner) {
                TesseraError::Plan(m) => TesseraError::Plan(format!("{ctx}: {m}")),
                TesseraError::Execution(m) => TesseraError::Execution(format!("{ctx}: {m}")),
                other => other,
            },
            E::Plan(msg) | E::NotImplemented(msg) => TesseraError::Plan(msg),
            e @ E::SchemaError(..) => TesseraError::Plan(e.strip_backtrace()),
            E::ArrowError(err, _) => TesseraError::Execution(err.to_string()),
            other => TesseraError::Execution(other.strip_backtrace()),
        }
    }
}

impl From<arrow::error::ArrowError> for TesseraError {
    fn from(e: arrow::error::ArrowError) -> Self {
        TesseraError::Execution(e.to_string())
    }
}

pub type Result<T, E = TesseraError> = std::result::Result<T, E>;
