//! The SQL front end: splitting a script into statements (sqlparser, extended with
//! `CREATE SOURCE` and `SET`), and binding queries to streaming plans with DataFusion's planner.

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

use std::path::Path;

use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::keywords::Keyword;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::Token;

use crate::catalog::SourceDef;
use crate::error::{Location, Result};
use crate::plan::EmitMode;
pub use diagnostic::ScriptText;
pub use interval::{delay_in_units, duration_in_units};
pub use source_ddl::arrow_type;

/// One statement of a script.
#[derive(Debug, Clone)]
pub enum Statement {
    CreateSource(Box<SourceDef>),
    /// `SET name = value`: a session option for the statements that follow.
    Set {
        name: String,
        value: String,
        location: Option<Location>,
    },
    /// A continuous query.
    Query {
        query: Box<ast::Query>,
        location: Option<Location>,
        emit: EmitMode,
    },
}

/// Parses a whole script. Paths in `CREATE SOURCE` are resolved against `base_dir`. Runs on a
/// thread with a deep stack (see [`nesting`]).
pub fn parse_script(text: &str, base_dir: &Path) -> Result<Vec<Statement>> {
    crate::exec::on_deep_stack("tessera-parse", || parse_script_here(text, base_dir))
}

/// [`parse_script`] on the calling thread, which must have a deep stack.
pub(crate) fn parse_script_here(text: &str, base_dir: &Path) -> Result<Vec<Statement>> {
    let script = ScriptText::new(text);
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(nesting::PARSER_RECURSION_LIMIT)
        .try_with_sql(text)
        .map_err(|e| script.parser_error(e))?;
    let mut statements = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        let next = parser.peek_token();
        if next.token == Token::EOF {
            break;
        }
        let location = diagnostic::span_location(next.span);
        let statement = if is_word(&next.token, "CREATE") && is_word(&parser.peek_nth_token(1).token, "SOURCE") {
            parser.next_token();
            parser.next_token();
            let source = source_ddl::parse_create_source(&mut parser, &script, base_dir)?;
            Statement::CreateSource(Box::new(source))
        } else if is_word(&next.token, "SET") {
            parser.next_token();
            let (name, value) = parse_setting(&mut parser, &script)?;
            Statement::Set { name, value, location }
        } else {
            let mut query = parser.parse_query().map_err(|e| script.parser_error(e))?;
            nesting::balance_and_check(walk::NodeMut::Query(&mut query), &script)?;
            let emit = parse_emit(&mut parser, &script, &mut query)?;
            Statement::Query { query, location, emit }
        };
        statements.push(statement);
        let end = parser.peek_token();
        if end.token != Token::EOF && end.token != Token::SemiColon {
            return Err(script.unexpected(&end.token, end.span));
        }
    }
    Ok(statements)
}

/// `EMIT CHANGES` or `EMIT ON WINDOW CLOSE` after a query (the default when absent).
fn parse_emit(parser: &mut Parser, script: &ScriptText, query: &mut ast::Query) -> Result<EmitMode> {
    let emit_follows = is_word(&parser.peek_token().token, "EMIT");
    let emit_taken = !emit_follows
        && (is_word(&parser.peek_token().token, "CHANGES") || is_word(&parser.peek_token().token, "ON"))
        && take_emit_alias(query);
    if !emit_follows && !emit_taken {
        return Ok(EmitMode::OnWindowClose);
    }
    if emit_follows {
        parser.next_token();
    }
    if is_word(&parser.peek_token().token, "CHANGES") {
        parser.next_token();
        return Ok(EmitMode::Changes);
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
    Ok(EmitMode::OnWindowClose)
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
        assert!(matches!(&statements[0], Statement::Set { name, value, .. } if name == "parallelism" && value == "2"));

        let err = parse_script("SELECT a\nFROM t WHERE ;", Path::new(".")).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains('^'), "{err}");
    }
}
