//! The statements of the database: SQL as sqlparser reads it, `COPY table FROM 'file'
//! [WITH (name = value, ...)]`, read here because its options (`op_column`) are tessera's, and
//! `REFRESH MATERIALIZED VIEW`, which sqlparser does not read, and `SET name = value`, read as
//! the streaming engine reads it.
//! Errors point at the line and column, with a caret under the spot.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::keywords::Keyword;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::{Location, Span, Token};
use tessera::error::Result;
use tessera::sql::nesting;
use tessera::sql::walk::NodeMut;
use tessera::sql::ScriptText;

#[derive(Debug, Clone)]
pub enum Statement {
    /// A statement sqlparser reads, with the script it came from (its spans point into it).
    Sql { statement: Box<ast::Statement>, script: Arc<str> },
    /// `COPY table FROM 'path' WITH (...)`: options by lower-case name.
    Copy { table: ast::ObjectName, path: PathBuf, options: Vec<(String, String)> },
    /// `REFRESH MATERIALIZED VIEW view [SAMPLE]`: the view, or only its sample (cleaned).
    Refresh { view: ast::ObjectName, sample: bool },
    /// `EXPLAIN REFRESH MATERIALIZED VIEW view`: how a refresh would bring it up to date.
    ExplainRefresh { view: ast::ObjectName },
    /// `CREATE SOURCE name (...) WITH (...)`: a stream, as its text, for the streaming engine
    /// to read when a query reads it, and where that text starts in `script`.
    Source { name: String, text: String, start: Location, script: Arc<str> },
    /// `SET name = value`: a setting of the session (lower-case name), with where its value is
    /// in `script`.
    Set { name: String, value: String, span: Span, script: Arc<str> },
}

impl Statement {
    /// Whether it creates, changes, refreshes or drops tables or views (a script with one is a
    /// database script, not a script of streams).
    pub fn changes_the_database(&self) -> bool {
        match self {
            Statement::Sql { statement, .. } => matches!(
                **statement,
                ast::Statement::CreateTable(_)
                    | ast::Statement::Insert(_)
                    | ast::Statement::Update(_)
                    | ast::Statement::Delete(_)
                    | ast::Statement::CreateView(_)
                    | ast::Statement::Drop { .. }
            ),
            Statement::Copy { .. } | Statement::Refresh { .. } | Statement::ExplainRefresh { .. } => true,
            Statement::Source { .. } | Statement::Set { .. } => false,
        }
    }
}

impl Statement {
    /// The files the statement reads, each with what it is to the statement; relative paths are
    /// under `base_dir`. A script's outputs must not be one of them.
    pub fn files_read(&self, base_dir: &std::path::Path) -> Vec<(String, PathBuf)> {
        match self {
            Statement::Copy { table, path, .. } => {
                vec![(format!("the file COPY reads into `{table}`"), base_dir.join(path))]
            }
            Statement::Sql { statement, .. } => match statement.as_ref() {
                ast::Statement::CreateTable(create) => match &create.table_options {
                    ast::CreateTableOptions::With(options) => options
                        .iter()
                        .filter_map(|option| crate::key_value(option).ok())
                        .filter(|(name, _)| name == "path")
                        .map(|(_, path)| {
                            (format!("the initial contents of table `{}`", create.name), base_dir.join(path))
                        })
                        .collect(),
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            },
            Statement::Source { name, text, .. } => match tessera::sql::parse_script(text, base_dir) {
                Ok(statements) => statements
                    .into_iter()
                    .filter_map(|statement| match statement {
                        tessera::sql::Statement::CreateSource(source) => match source.location {
                            tessera::catalog::Location::File(path) => {
                                Some((format!("the file of source `{name}`"), path))
                            }
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect(),
                // Its error is the statement's to report when it runs.
                Err(_) => Vec::new(),
            },
            Statement::Refresh { .. } | Statement::ExplainRefresh { .. } | Statement::Set { .. } => Vec::new(),
        }
    }
}

/// The statements of `sql`, in order. Parsing recurses once per level of nesting: it runs on
/// a thread with a deep stack.
pub fn parse(sql: &str) -> Result<Vec<Statement>> {
    tessera::exec::on_deep_stack("tessera-parse", || parse_here(sql))
}

fn parse_here(sql: &str) -> Result<Vec<Statement>> {
    let text: Arc<str> = sql.into();
    let script = ScriptText::new(sql);
    let error = |e| script.parser_error(e);
    let dialect = GenericDialect {};
    let mut parser =
        Parser::new(&dialect).with_recursion_limit(nesting::PARSER_RECURSION_LIMIT).try_with_sql(sql).map_err(error)?;
    let mut statements = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        let statement =
            if parser.parse_keywords(&[Keyword::EXPLAIN, Keyword::REFRESH, Keyword::MATERIALIZED, Keyword::VIEW]) {
                Statement::ExplainRefresh { view: parser.parse_object_name(false).map_err(error)? }
            } else if parser.parse_keywords(&[Keyword::REFRESH, Keyword::MATERIALIZED, Keyword::VIEW]) {
                let view = parser.parse_object_name(false).map_err(error)?;
                Statement::Refresh { view, sample: parser.parse_keyword(Keyword::SAMPLE) }
            } else if parser.parse_keyword(Keyword::COPY) {
                let table = parser.parse_object_name(false).map_err(error)?;
                parser.expect_keyword(Keyword::FROM).map_err(error)?;
                let path = PathBuf::from(parser.parse_literal_string().map_err(error)?);
                let mut options = Vec::new();
                if parser.parse_keyword(Keyword::WITH) {
                    parser.expect_token(&Token::LParen).map_err(error)?;
                    loop {
                        let name = parser.parse_identifier().map_err(error)?;
                        parser.expect_token(&Token::Eq).map_err(error)?;
                        let token = parser.next_token();
                        let value = match token.token {
                            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
                            Token::Number(n, _) => n,
                            Token::Word(w) => w.value,
                            other => {
                                return Err(script.at_span(
                                    format!("expected a value for {}, found `{other}`", name.value),
                                    token.span,
                                ))
                            }
                        };
                        options.push((name.value.to_lowercase(), value));
                        if !parser.consume_token(&Token::Comma) {
                            break;
                        }
                    }
                    parser.expect_token(&Token::RParen).map_err(error)?;
                }
                Statement::Copy { table, path, options }
            } else if parser.parse_keyword(Keyword::SET) {
                let start = parser.peek_token().span.start;
                let (name, value) = tessera::sql::parse_setting(&mut parser, &script)?;
                let span = Span::new(start, parser.peek_token().span.start);
                Statement::Set { name, value, span, script: Arc::clone(&text) }
            } else if starts_create_source(&parser) {
                let start_location = parser.peek_token().span.start;
                let start = offset(sql, start_location);
                parser.next_token();
                parser.next_token();
                let name = parser.parse_identifier().map_err(error)?.value;
                // To the end of the statement, over its parentheses.
                let mut depth = 0i32;
                loop {
                    let token = parser.peek_token();
                    match token.token {
                        Token::EOF => break,
                        Token::SemiColon if depth == 0 => break,
                        Token::LParen => depth += 1,
                        Token::RParen => depth -= 1,
                        _ => {}
                    }
                    parser.next_token();
                }
                let end = match parser.peek_token() {
                    token if token.token == Token::EOF => sql.len(),
                    token => offset(sql, token.span.start),
                };
                Statement::Source {
                    name,
                    text: sql[start..end].to_string(),
                    start: start_location,
                    script: Arc::clone(&text),
                }
            } else {
                let mut statement = parser.parse_statement().map_err(error)?;
                nesting::balance_and_check(NodeMut::Statement(&mut statement), &script)?;
                Statement::Sql { statement: Box::new(statement), script: Arc::clone(&text) }
            };
        statements.push(statement);
        let end = parser.peek_token();
        if end.token != Token::EOF && end.token != Token::SemiColon {
            return Err(script.unexpected(&end.token, end.span));
        }
    }
    Ok(statements)
}

/// Whether the parser is at `CREATE SOURCE`.
fn starts_create_source(parser: &Parser) -> bool {
    let word = |n: usize, expected: &str| matches!(parser.peek_nth_token(n).token, Token::Word(ref w) if w.value.eq_ignore_ascii_case(expected));
    word(0, "create") && word(1, "source")
}

/// The byte offset in `text` of a parser location (lines and columns from 1, columns in
/// characters).
pub fn offset(text: &str, location: Location) -> usize {
    let mut lines = text.split_inclusive('\n');
    let before: usize = lines.by_ref().take((location.line as usize).saturating_sub(1)).map(str::len).sum();
    let line = lines.next().unwrap_or("");
    let within: usize = line.chars().take((location.column as usize).saturating_sub(1)).map(char::len_utf8).sum();
    before + within
}
