//! Turning parser and planner failures into `SqlDiagnostic`s: line and column, the source line
//! with a caret, and for unknown names the closest valid name.

use datafusion_sql::sqlparser::parser::ParserError;
use datafusion_sql::sqlparser::tokenizer::{Span, Token};

use crate::error::{Location, SqlDiagnostic, TesseraError};

/// Builds SQL errors that point into one script.
#[derive(Debug, Clone, Copy)]
pub struct ScriptText<'a> {
    pub text: &'a str,
}

impl<'a> ScriptText<'a> {
    pub fn new(text: &'a str) -> Self {
        ScriptText { text }
    }

    /// `error` with the line of this script it points at, if it is a SQL error that points
    /// somewhere and does not show it yet.
    pub fn locate(&self, error: TesseraError) -> TesseraError {
        match error {
            TesseraError::Sql(diagnostic) if diagnostic.source_line.is_none() && diagnostic.location.is_some() => {
                let SqlDiagnostic { message, location, help, .. } = *diagnostic;
                self.error_with_help(message, location, help)
            }
            other => other,
        }
    }

    pub fn error(&self, message: impl Into<String>, location: Option<Location>) -> TesseraError {
        self.error_with_help(message, location, None)
    }

    /// Just after the script's last character that is not white space.
    fn end(&self) -> Location {
        let text = self.text.trim_end();
        let line = text.lines().count().max(1) as u64;
        let last = text.rsplit('\n').next().unwrap_or("");
        Location { line, column: last.chars().count() as u64 + 1 }
    }

    pub fn error_with_help(
        &self,
        message: impl Into<String>,
        location: Option<Location>,
        help: Option<String>,
    ) -> TesseraError {
        let source_line =
            location.and_then(|loc| self.text.lines().nth(loc.line.saturating_sub(1) as usize).map(str::to_string));
        TesseraError::Sql(Box::new(SqlDiagnostic { message: message.into(), location, source_line, help }))
    }

    pub fn at_span(&self, message: impl Into<String>, span: Span) -> TesseraError {
        self.error(message, span_location(span))
    }

    /// A statement that goes on where it should end, at `found`: a word there, or the word
    /// before it (`SELECT COUNT(*) FORM t` reads FORM as a column alias), that is a likely typo
    /// of a keyword gets a hint.
    pub fn unexpected(&self, found: &Token, span: Span) -> TesseraError {
        let location = span_location(span);
        let before = location.and_then(|at| {
            let line = self.text.lines().nth(at.line.saturating_sub(1) as usize)?;
            let head: String = line.chars().take(at.column.saturating_sub(1) as usize).collect();
            head.split_whitespace().next_back().map(str::to_string)
        });
        let word = |text: &str| misspelt_keyword(&format!("found: {text}"));
        let help = word(&found.to_string()).or_else(|| before.as_deref().and_then(word));
        self.error_with_help(
            format!("expected `;` or the end of the script, found `{found}`"),
            location,
            help.map(|keyword| format!("did you mean `{keyword}`?")),
        )
    }

    /// sqlparser reports positions inside its message ("... at Line: 3, Column: 14"); move
    /// them into the diagnostic so the caret can be drawn.
    pub fn parser_error(&self, error: ParserError) -> TesseraError {
        let message = match error {
            ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
            ParserError::RecursionLimitExceeded => "query is nested too deeply".to_string(),
        };
        let help = misspelt_keyword(&message).map(|keyword| format!("did you mean `{keyword}`?"));
        match split_position(&message) {
            Some((text, location)) => self.error_with_help(text, Some(location), help),
            // sqlparser gives no position when the statement ends too early: that is the end
            // of the text.
            None if message.ends_with("found: EOF") => {
                let end = self.end();
                self.error_with_help(message.replace("found: EOF", "found the end of the statement"), Some(end), help)
            }
            None => self.error_with_help(message, None, help),
        }
    }
}

/// The keywords a misspelt word in a statement most likely stands for.
const KEYWORDS: [&str; 36] = [
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "ORDER",
    "HAVING",
    "LIMIT",
    "CREATE",
    "TABLE",
    "SOURCE",
    "INSERT",
    "INTO",
    "VALUES",
    "UPDATE",
    "DELETE",
    "SET",
    "JOIN",
    "UNION",
    "MATERIALIZED",
    "VIEW",
    "REFRESH",
    "COPY",
    "WITH",
    "WATERMARK",
    "DROP",
    "EXPLAIN",
    "DISTINCT",
    "EMIT",
    "CHANGES",
    "PRIMARY",
    "KEY",
    "INTERVAL",
    "TUMBLE",
    "HOP",
    "SESSION",
];

/// The keyword a parser error's `found: WORD` is a likely typo of (`FORM` for FROM).
fn misspelt_keyword(message: &str) -> Option<&'static str> {
    let found = message.split("found: ").nth(1)?;
    let word: String = found.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    if word.len() < 3 || word == "EOF" || KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(&word)) {
        return None;
    }
    let closest = closest_name(&word, KEYWORDS)?;
    KEYWORDS.iter().copied().find(|k| *k == closest)
}

pub fn span_location(span: Span) -> Option<Location> {
    (span.start.line > 0).then_some(Location { line: span.start.line, column: span.start.column })
}

fn split_position(message: &str) -> Option<(String, Location)> {
    let at = message.rfind(" at Line: ")?;
    let rest = &message[at + " at Line: ".len()..];
    let (line, column) = rest.split_once(", Column: ")?;
    let line = line.trim().parse().ok()?;
    let column = column.trim().trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()?;
    Some((message[..at].to_string(), Location { line, column }))
}

/// The candidate closest to `name` by edit distance, if it is close enough to be a likely typo.
pub fn closest_name<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let lowered = name.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (edit_distance(&lowered, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(name.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_sqlparser_positions() {
        let (text, loc) = split_position("Expected: ), found: FROM at Line: 3, Column: 14").unwrap();
        assert_eq!(text, "Expected: ), found: FROM");
        assert_eq!(loc, Location { line: 3, column: 14 });
    }

    #[test]
    fn suggests_close_names_only() {
        let names = ["temperature", "device_id", "ts"];
        assert_eq!(closest_name("temprature", names).as_deref(), Some("temperature"));
        assert_eq!(closest_name("device", names).as_deref(), Some("device_id"));
        assert_eq!(closest_name("humidity", names), None);
    }

    #[test]
    fn caret_sits_under_the_column() {
        let script = ScriptText::new("SELECT a\nFROM nope");
        let err = script.error("unknown source `nope`", Some(Location { line: 2, column: 6 }));
        let shown = err.to_string();
        assert!(shown.contains(" 2 | FROM nope\n   |      ^"), "{shown}");
    }
}
