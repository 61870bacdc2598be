//! The SQL front end: the one statement type and parser of every script, streams and tables
//! alike (sqlparser, extended with `CREATE SOURCE`, `SET`, `EMIT`, `COPY` and `REFRESH
//! MATERIALIZED VIEW`), and binding queries to streaming plans with DataFusion's planner.

mod aggregates;
pub mod binder;
pub mod diagnostic;
mod interval;
pub mod multi_window;
pub mod nesting;
mod source_ddl;
pub mod temporal;
mod temporal_formula;
pub mod walk;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::keywords::Keyword;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::{self, Token};

use crate::catalog::SourceDef;
use crate::error::{Location, Result};
use crate::plan::EmitMode;
pub use diagnostic::ScriptText;
pub use interval::{delay_in_units, duration_in_units};
pub use source_ddl::arrow_type;

/// One statement of a script, of any kind: streams, tables, views and settings share one
/// statement type and one parser.
#[derive(Debug, Clone)]
pub struct Statement {
    pub kind: StatementKind,
    /// The whole script it came from: spans in `kind` point into it.
    pub script: Arc<str>,
    /// The statement's text in `script` (without its `;`), and where that text starts.
    pub range: Range<usize>,
    pub start: tokenizer::Location,
}

/// What a statement is.
#[derive(Debug, Clone)]
pub enum StatementKind {
    /// `CREATE SOURCE name (...) WITH (...)`: a stream.
    CreateSource(Box<SourceDef>),
    /// `SET name = value`: a setting (lower-case name) for the statements that follow.
    Set { name: String, value: String },
    /// A query (`SELECT`, `WITH`, `VALUES`), with its `EMIT` clause (the default when absent)
    /// and whether the script wrote one.
    Query { query: Box<ast::Query>, emit: EmitMode, emit_written: bool },
    /// `COPY table FROM 'path' [WITH (name = value, ...)]`: options by lower-case name.
    Copy { table: ast::ObjectName, path: PathBuf, options: Vec<(String, String)> },
    /// `REFRESH MATERIALIZED VIEW view [SAMPLE]`: the view, or only its sample (cleaned).
    Refresh { view: ast::ObjectName, sample: bool },
    /// `EXPLAIN REFRESH MATERIALIZED VIEW view`: how a refresh would bring it up to date.
    ExplainRefresh { view: ast::ObjectName },
    /// Any other statement sqlparser reads: tables, views, `EXPLAIN`, `SHOW`, `DESCRIBE`.
    Other(Box<ast::Statement>),
}

impl Statement {
    /// The statement as written.
    pub fn text(&self) -> &str {
        &self.script[self.range.clone()]
    }

    /// Where it starts in its script.
    pub fn location(&self) -> Option<Location> {
        (self.start.line > 0).then_some(Location { line: self.start.line, column: self.start.column })
    }

    /// Whether it creates, changes, refreshes or drops tables or views, or explains a refresh
    /// (a script with one is a database script, run on tables, not a script of streams).
    pub fn works_on_tables(&self) -> bool {
        match &self.kind {
            StatementKind::Other(statement) => matches!(
                **statement,
                ast::Statement::CreateTable(_)
                    | ast::Statement::Insert(_)
                    | ast::Statement::Update(_)
                    | ast::Statement::Delete(_)
                    | ast::Statement::CreateView(_)
                    | ast::Statement::Drop { .. }
            ),
            StatementKind::Copy { .. } | StatementKind::Refresh { .. } | StatementKind::ExplainRefresh { .. } => true,
            StatementKind::CreateSource(_) | StatementKind::Set { .. } | StatementKind::Query { .. } => false,
        }
    }
}

/// Parses a whole script. Paths in `CREATE SOURCE` are resolved against `base_dir`. Runs on a
/// thread with a deep stack (see [`nesting`]).
pub fn parse_script(text: &str, base_dir: &Path) -> Result<Vec<Statement>> {
    crate::exec::on_deep_stack("tessera-parse", || parse_script_here(text, base_dir))
}

/// [`parse_script`] on the calling thread, which must have a deep stack.
pub(crate) fn parse_script_here(text: &str, base_dir: &Path) -> Result<Vec<Statement>> {
    let shared: Arc<str> = text.into();
    let script = ScriptText::new(text);
    let error = |e| script.parser_error(e);
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(nesting::PARSER_RECURSION_LIMIT)
        .try_with_sql(text)
        .map_err(error)?;
    let mut statements = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        let next = parser.peek_token();
        if next.token == Token::EOF {
            break;
        }
        let kind = parse_statement(&mut parser, &script, base_dir)?;
        let end = parser.get_current_token().span.end;
        let range = offset(text, next.span.start)..offset(text, end);
        statements.push(Statement { kind, script: Arc::clone(&shared), range, start: next.span.start });
        let end = parser.peek_token();
        if end.token != Token::EOF && end.token != Token::SemiColon {
            return Err(script.unexpected(&end.token, end.span));
        }
    }
    Ok(statements)
}

/// The statement the parser is at.
fn parse_statement(parser: &mut Parser, script: &ScriptText, base_dir: &Path) -> Result<StatementKind> {
    let error = |e| script.parser_error(e);
    let word = |parser: &Parser, n: usize, expected: &str| is_word(&parser.peek_nth_token(n).token, expected);
    if parser.parse_keywords(&[Keyword::EXPLAIN, Keyword::REFRESH, Keyword::MATERIALIZED, Keyword::VIEW]) {
        return Ok(StatementKind::ExplainRefresh { view: parser.parse_object_name(false).map_err(error)? });
    }
    if parser.parse_keywords(&[Keyword::REFRESH, Keyword::MATERIALIZED, Keyword::VIEW]) {
        let view = parser.parse_object_name(false).map_err(error)?;
        return Ok(StatementKind::Refresh { view, sample: parser.parse_keyword(Keyword::SAMPLE) });
    }
    if parser.parse_keyword(Keyword::COPY) {
        let table = parser.parse_object_name(false).map_err(error)?;
        parser.expect_keyword(Keyword::FROM).map_err(error)?;
        let path = PathBuf::from(parser.parse_literal_string().map_err(error)?);
        let mut options = Vec::new();
        if parser.parse_keyword(Keyword::WITH) {
            parser.expect_token(&Token::LParen).map_err(error)?;
            loop {
                let (name, value) = parse_option(parser, script)?;
                options.push((name, value));
                if !parser.consume_token(&Token::Comma) {
                    break;
                }
            }
            parser.expect_token(&Token::RParen).map_err(error)?;
        }
        return Ok(StatementKind::Copy { table, path, options });
    }
    if word(parser, 0, "SET") {
        parser.next_token();
        let (name, value) = parse_setting(parser, script)?;
        return Ok(StatementKind::Set { name, value });
    }
    if word(parser, 0, "CREATE") && word(parser, 1, "SOURCE") {
        parser.next_token();
        parser.next_token();
        return Ok(StatementKind::CreateSource(Box::new(source_ddl::parse_create_source(parser, script, base_dir)?)));
    }
    let starts_query =
        ["SELECT", "WITH", "VALUES"].iter().any(|w| word(parser, 0, w)) || parser.peek_token().token == Token::LParen;
    if starts_query {
        let mut query = parser.parse_query().map_err(error)?;
        nesting::balance_and_check(walk::NodeMut::Query(&mut query), script)?;
        let (emit, emit_written) = parse_emit(parser, script, &mut query)?;
        return Ok(StatementKind::Query { query, emit, emit_written });
    }
    let mut statement = parser.parse_statement().map_err(error)?;
    nesting::balance_and_check(walk::NodeMut::Statement(&mut statement), script)?;
    Ok(StatementKind::Other(Box::new(statement)))
}

/// `name = value` in a `WITH (...)` list: the lower-case name and the value, a literal or a
/// bare word.
fn parse_option(parser: &mut Parser, script: &ScriptText) -> Result<(String, String)> {
    let name = parser.parse_identifier().map_err(|e| script.parser_error(e))?;
    parser.expect_token(&Token::Eq).map_err(|e| script.parser_error(e))?;
    let token = parser.next_token();
    let value = match token.token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
        Token::Number(n, _) => n,
        Token::Word(w) => w.value,
        other => {
            return Err(script.at_span(format!("expected a value for {}, found `{other}`", name.value), token.span))
        }
    };
    Ok((name.value.to_lowercase(), value))
}

/// The byte offset in `text` of a parser location (lines and columns from 1, columns in
/// characters).
pub fn offset(text: &str, location: tokenizer::Location) -> usize {
    let mut lines = text.split_inclusive('\n');
    let before: usize = lines.by_ref().take((location.line as usize).saturating_sub(1)).map(str::len).sum();
    let line = lines.next().unwrap_or("");
    let within: usize = line.chars().take((location.column as usize).saturating_sub(1)).map(char::len_utf8).sum();
    before + within
}

/// `EMIT CHANGES` or `EMIT ON WINDOW CLOSE` after a query (the default when absent).
fn parse_emit(parser: &mut Parser, script: &ScriptText, query: &mut ast::Query) -> Result<(EmitMode, bool)> {
    let emit_follows = is_word(&parser.peek_token().token, "EMIT");
    let emit_taken = !emit_follows
        && (is_word(&parser.peek_token().token, "CHANGES") || is_word(&parser.peek_token().token, "ON"))
        && take_emit_alias(query);
    if !emit_follows && !emit_taken {
        return Ok((EmitMode::OnWindowClose, false));
    }
    if emit_follows {
        parser.next_token();
    }
    if is_word(&parser.peek_token().token, "CHANGES") {
        parser.next_token();
        return Ok((EmitMode::Changes, true));
    }
    for word in ["ON", "WINDOW", "CLOSE"] {
        let token = parser.next_token();
        if !is_word(&token.token, word) {
            return Err(script.at_span(
                format!("expected `EMIT CHANGES` or `EMIT ON WINDOW CLOSE`, found `{}`", token.token),
                token.span,
            ));
        }
    }
    Ok((EmitMode::OnWindowClose, true))
}

/// In `FROM src EMIT ...` (no WHERE, no GROUP BY) the SQL parser reads `EMIT` as the
/// table's alias; this takes it back, so the emit clause is read as one.
fn take_emit_alias(query: &mut ast::Query) -> bool {
    let ast::SetExpr::Select(select) = query.body.as_mut() else {
        return false;
    };
    let Some(from) = select.from.last_mut() else {
        return false;
    };
    let relation = match from.joins.last_mut() {
        Some(join) => &mut join.relation,
        None => &mut from.relation,
    };
    let ast::TableFactor::Table { alias, .. } = relation else {
        return false;
    };
    let is_emit = alias.as_ref().is_some_and(|a| {
        !a.explicit && a.columns.is_empty() && a.name.quote_style.is_none() && a.name.value.eq_ignore_ascii_case("EMIT")
    });
    if is_emit {
        *alias = None;
    }
    is_emit
}

fn is_word(token: &Token, word: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// The rest of `SET name = value` or `SET name TO value` after `SET`: the name in lower case
/// and the value, a literal or a bare word.
pub fn parse_setting(parser: &mut Parser, script: &ScriptText) -> Result<(String, String)> {
    let name = parser.parse_identifier().map_err(|e| script.parser_error(e))?;
    if !parser.consume_token(&Token::Eq) && !parser.parse_keyword(Keyword::TO) {
        let found = parser.peek_token();
        return Err(
            script.at_span(format!("expected `=` after SET {}, found `{}`", name.value, found.token), found.span)
        );
    }
    let token = parser.next_token();
    let value = match &token.token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
        Token::Number(n, _) => n.clone(),
        Token::Word(w) => w.value.clone(),
        other => {
            return Err(script.at_span(format!("expected a value for SET {}, found `{other}`", name.value), token.span))
        }
    };
    Ok((name.value.to_ascii_lowercase(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_statements_and_reports_positions() {
        let text = "SET parallelism = 2;\nSELECT 1;\n";
        let statements = parse_script(text, Path::new(".")).unwrap();
        assert_eq!(statements.len(), 2);
        assert!(
            matches!(&statements[0].kind, StatementKind::Set { name, value } if name == "parallelism" && value == "2")
        );
        assert_eq!(statements[1].text(), "SELECT 1");

        let err = parse_script("SELECT a\nFROM t WHERE ;", Path::new(".")).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains('^'), "{err}");
    }
}
