//! `CREATE SOURCE name (columns..., WATERMARK FOR col AS col - INTERVAL ...) WITH (options)`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit as ArrowTimeUnit};
use datafusion_sql::sqlparser::ast::{self, BinaryOperator, Expr, Spanned};
use datafusion_sql::sqlparser::keywords::Keyword;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::Token;

use super::diagnostic::closest_name;
use super::{delay_in_units, ScriptText};
use crate::catalog::{EventTime, Format, Location, SourceDef, TimeUnit};
use crate::error::Result;

/// Parses the rest of a `CREATE SOURCE` statement (the two keywords are consumed).
pub fn parse_create_source(parser: &mut Parser, script: &ScriptText, base_dir: &Path) -> Result<SourceDef> {
    let perr = |e| script.parser_error(e);
    let name = parser.parse_identifier().map_err(perr)?;
    parser.expect_token(&Token::LParen).map_err(perr)?;
    let mut fields: Vec<Field> = Vec::new();
    let mut watermark: Option<(ast::Ident, Expr)> = None;
    loop {
        if super::is_word(&parser.peek_token().token, "WATERMARK") {
            parser.next_token();
            let for_token = parser.peek_token();
            if !parser.parse_keyword(Keyword::FOR) {
                return Err(script.at_span("expected FOR after WATERMARK", for_token.span));
            }
            let column = parser.parse_identifier().map_err(perr)?;
            parser.expect_keyword(Keyword::AS).map_err(perr)?;
            let expr = parser.parse_expr().map_err(perr)?;
            if watermark.is_some() {
                return Err(script.at_span("a source has at most one WATERMARK", column.span));
            }
            watermark = Some((column, expr));
        } else {
            let column = parser.parse_identifier().map_err(perr)?;
            let type_token = parser.peek_token();
            let sql_type = parser.parse_data_type().map_err(perr)?;
            let data_type = arrow_type(&sql_type)
                .ok_or_else(|| script.at_span(format!("unsupported column type {sql_type}"), type_token.span))?;
            let nullable = !parser.parse_keywords(&[Keyword::NOT, Keyword::NULL]);
            if fields.iter().any(|f| f.name().eq_ignore_ascii_case(&column.value)) {
                return Err(script.at_span(format!("column `{}` is declared twice", column.value), column.span));
            }
            fields.push(Field::new(column.value.clone(), data_type, nullable));
        }
        if parser.consume_token(&Token::RParen) {
            break;
        }
        parser.expect_token(&Token::Comma).map_err(perr)?;
    }
    let with_token = parser.peek_token();
    if !parser.parse_keyword(Keyword::WITH) {
        return Err(script.at_span(
            "expected WITH (connector = 'file', path = '...', format = '...') after the column list",
            with_token.span,
        ));
    }
    let options = parse_options(parser, script)?;
    let option_span = |key: &str| options.get(key).map(|(_, span)| *span).unwrap_or(name.span);
    let option = |key: &str| options.get(key).map(|(v, _)| v.as_str());

    let connector = option("connector").unwrap_or("file");
    let location = match connector.to_ascii_lowercase().as_str() {
        "file" => match option("path") {
            Some("-") | Some("/dev/stdin") => Location::Stdin,
            Some(path) => Location::File(base_dir.join(path)),
            None => return Err(script.at_span("a file source needs a `path` option", name.span)),
        },
        "stdin" => Location::Stdin,
        other => {
            return Err(script.at_span(
                format!("unknown connector '{other}' (supported: 'file', 'stdin')"),
                option_span("connector"),
            ))
        }
    };
    let format = match option("format") {
        Some(text) => Format::parse(text).ok_or_else(|| {
            script.at_span(
                format!("unknown format '{text}' (supported: 'csv', 'jsonl', 'parquet')"),
                option_span("format"),
            )
        })?,
        None => match &location {
            Location::File(path) => {
                path.extension().and_then(|e| e.to_str()).and_then(Format::parse).ok_or_else(|| {
                    script.at_span(
                        "cannot tell the format from the path: add format = 'csv' | 'jsonl' | 'parquet'",
                        name.span,
                    )
                })?
            }
            Location::Stdin => Format::Csv,
        },
    };

    let (time_column, watermark_expr) =
        match &watermark {
            Some((column, expr)) => (column.clone(), Some(expr)),
            None => {
                let candidates: Vec<&Field> = fields.iter().filter(|f| is_time_type(f.data_type())).collect();
                match option("event_time") {
                    Some(col) => (ast::Ident::new(col), None),
                    None if candidates.len() == 1 && matches!(candidates[0].data_type(), DataType::Timestamp(..)) => {
                        (ast::Ident::new(candidates[0].name()), None)
                    }
                    None => return Err(script.at_span(
                        "a source needs an event-time column: add `WATERMARK FOR <column> AS <column> - INTERVAL ...` \
                         (or `WATERMARK FOR <column> AS <column>` for in-order events)",
                        name.span,
                    )),
                }
            }
        };
    let index = fields.iter().position(|f| f.name().eq_ignore_ascii_case(&time_column.value)).ok_or_else(|| {
        script.error_with_help(
            format!("unknown column `{}` in WATERMARK", time_column.value),
            super::diagnostic::span_location(time_column.span),
            closest_name(&time_column.value, fields.iter().map(|f| f.name().as_str()))
                .map(|c| format!("did you mean `{c}`?")),
        )
    })?;
    // `time_unit` counts the event-time column's numbers, and is the unit of TIMESTAMP columns
    // (numbers written in them are counted in it; without it they are refused, see RowShape).
    let time_unit = match option("time_unit") {
        None => None,
        Some(text) => Some(TimeUnit::parse(text).ok_or_else(|| {
            script.at_span(
                format!("unknown time_unit '{text}' (supported: 's', 'ms', 'us', 'ns')"),
                option_span("time_unit"),
            )
        })?),
    };
    if let Some(unit) = time_unit {
        for field in &mut fields {
            if let DataType::Timestamp(_, zone) = field.data_type() {
                *field = field.clone().with_data_type(DataType::Timestamp(unit.to_arrow(), zone.clone()));
            }
        }
    }
    let data_type = fields[index].data_type().clone();
    let unit = match &data_type {
        DataType::Timestamp(unit, _) => TimeUnit::from_arrow(*unit),
        t if t.is_integer() => time_unit.unwrap_or(TimeUnit::Millisecond),
        t => {
            return Err(script.at_span(
                format!("event-time column `{}` must be BIGINT or TIMESTAMP, not {t}", fields[index].name()),
                time_column.span,
            ))
        }
    };
    let watermark_delay = match watermark_expr {
        None => 0,
        Some(Expr::Identifier(id)) if id.value.eq_ignore_ascii_case(&time_column.value) => 0,
        Some(Expr::BinaryOp { left, op: BinaryOperator::Minus, right }) if matches!(left.as_ref(), Expr::Identifier(id) if id.value.eq_ignore_ascii_case(&time_column.value)) => {
            delay_in_units(right, unit, script)?
        }
        Some(other) => {
            return Err(script.at_span(
                format!("WATERMARK must be `{0}` or `{0} - INTERVAL '...' UNIT`", time_column.value),
                other.span(),
            ))
        }
    };
    for key in options.keys() {
        if !["connector", "path", "format", "time_unit", "event_time", "delimiter", "header"].contains(&key.as_str()) {
            return Err(script.at_span(format!("unknown source option `{key}`"), option_span(key)));
        }
    }
    let fields: Vec<Field> =
        fields.into_iter().enumerate().map(|(i, f)| if i == index { f.with_nullable(false) } else { f }).collect();
    Ok(SourceDef {
        name: name.value,
        schema: Arc::new(Schema::new(fields)),
        event_time: EventTime { column: time_column.value, index, data_type, unit, watermark_delay },
        location,
        format,
        options: options.into_iter().map(|(k, (v, _))| (k, v)).collect(),
    })
}

type Options = BTreeMap<String, (String, datafusion_sql::sqlparser::tokenizer::Span)>;

/// `( key = 'value' [, ...] )`; values may be strings, numbers or bare words.
fn parse_options(parser: &mut Parser, script: &ScriptText) -> Result<Options> {
    let perr = |e| script.parser_error(e);
    parser.expect_token(&Token::LParen).map_err(perr)?;
    let mut options = Options::new();
    loop {
        let key = parser.parse_identifier().map_err(perr)?;
        parser.expect_token(&Token::Eq).map_err(perr)?;
        let token = parser.next_token();
        let value = match &token.token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) | Token::Number(s, _) => s.clone(),
            Token::Word(w) => w.value.clone(),
            other => {
                return Err(script.at_span(format!("expected a value for `{}`, found `{other}`", key.value), token.span))
            }
        };
        let lowered = key.value.to_ascii_lowercase();
        if options.insert(lowered, (value, key.span)).is_some() {
            return Err(script.at_span(format!("option `{}` is given twice", key.value), key.span));
        }
        if parser.consume_token(&Token::RParen) {
            return Ok(options);
        }
        parser.expect_token(&Token::Comma).map_err(perr)?;
    }
}

fn is_time_type(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(..)) || t.is_integer()
}

/// The Arrow type of a column declared in SQL.
pub fn arrow_type(sql: &ast::DataType) -> Option<DataType> {
    use ast::DataType as S;
    Some(match sql {
        S::TinyInt(_) => DataType::Int8,
        S::SmallInt(_) | S::Int2(_) => DataType::Int16,
        S::Int(_) | S::Integer(_) | S::Int4(_) => DataType::Int32,
        S::BigInt(_) | S::Int8(_) | S::Int64 => DataType::Int64,
        S::Real | S::Float4 | S::Float32 => DataType::Float32,
        S::Double(_) | S::DoublePrecision | S::Float8 | S::Float64 | S::Float(_) => DataType::Float64,
        S::Boolean | S::Bool => DataType::Boolean,
        S::Varchar(_)
        | S::Text
        | S::String(_)
        | S::Char(_)
        | S::CharVarying(_)
        | S::CharacterVarying(_)
        | S::Character(_) => DataType::Utf8,
        S::Date => DataType::Date32,
        S::Timestamp(_, ast::TimezoneInfo::None | ast::TimezoneInfo::WithoutTimeZone) => {
            DataType::Timestamp(ArrowTimeUnit::Microsecond, None)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use crate::sql::{parse_script, StatementKind};
    use std::path::Path;

    fn source(sql: &str) -> crate::Result<crate::catalog::SourceDef> {
        match parse_script(sql, Path::new("/data"))?.remove(0).kind {
            StatementKind::CreateSource(s) => Ok(*s),
            other => panic!("not a source: {other:?}"),
        }
    }

    #[test]
    fn parses_a_full_source() {
        let s = source(
            "CREATE SOURCE readings (device_id BIGINT, temperature DOUBLE, ts BIGINT,
               WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
             WITH (connector = 'file', path = 'r.csv', format = 'csv', time_unit = 's')",
        )
        .unwrap();
        assert_eq!(s.name, "readings");
        assert_eq!(s.schema.fields().len(), 3);
        assert_eq!(s.event_time.index, 2);
        assert_eq!(s.event_time.watermark_delay, 5);
        assert_eq!(s.location, crate::catalog::Location::File("/data/r.csv".into()));
    }

    #[test]
    fn explains_mistakes() {
        let err = source("CREATE SOURCE r (a BIGINT, WATERMARK FOR tss AS tss) WITH (path = 'x.csv')")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown column `tss`"), "{err}");
        let err = source("CREATE SOURCE r (ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'x.csv', colour = 'red')")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown source option `colour`"), "{err}");
        let err = source("CREATE SOURCE r (ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'x.txt')")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot tell the format"), "{err}");
    }
}
