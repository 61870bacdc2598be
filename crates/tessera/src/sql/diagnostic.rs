//! Turning parser and planner failures into `SqlDiagnostic`s: line and column, the source line
//! with a caret, and for unknown names the closest valid name.

use datafusion_sql::sqlparser::parser::ParserError;
use datafusion_sql::sqlparser::tokenizer::Span;

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

    pub fn error(&self, message: impl Into<String>, location: Option<Location>) -> TesseraError {
        self.error_with_help(message, location, None)
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

    /// sqlparser reports positions inside its message ("... at Line: 3, Column: 14"); move
    /// them into the diagnostic so the caret can be drawn.
    pub fn parser_error(&self, error: ParserError) -> TesseraError {
        let message = match error {
            ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
            ParserError::RecursionLimitExceeded => "query is nested too deeply".to_string(),
        };
        match split_position(&message) {
            Some((text, location)) => self.error(text, Some(location)),
            None => self.error(message, None),
        }
    }
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
