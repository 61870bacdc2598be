//! Durations written in SQL (`INTERVAL '10' MINUTE`, `INTERVAL '5 seconds'`, or a bare integer
//! in the event-time unit) converted to event-time units.

use datafusion_sql::sqlparser::ast::{DateTimeField, Expr, Spanned, UnaryOperator, Value};

use super::ScriptText;
use crate::catalog::TimeUnit;
use crate::error::Result;

/// The length of `expr` in `unit`s, which must be positive. Fractions of a unit are refused
/// rather than rounded.
pub fn duration_in_units(expr: &Expr, unit: TimeUnit, script: &ScriptText) -> Result<i64> {
    units(expr, unit, script, false)
}

/// Like [`duration_in_units`], but zero is allowed (a watermark without delay).
pub fn delay_in_units(expr: &Expr, unit: TimeUnit, script: &ScriptText) -> Result<i64> {
    units(expr, unit, script, true)
}

fn units(expr: &Expr, unit: TimeUnit, script: &ScriptText, allow_zero: bool) -> Result<i64> {
    let invalid = |why: &str| script.at_span(format!("invalid duration `{expr}`: {why}"), expr.span());
    let (amount, per_second_num, per_second_den): (f64, i64, i64) = match expr {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => (n.parse::<f64>().map_err(|_| invalid("not a number"))?, unit.per_second(), 1),
            _ => return Err(invalid("expected an INTERVAL or a number of time units")),
        },
        Expr::UnaryOp { op: UnaryOperator::Minus, .. } => return Err(invalid("durations must be positive")),
        Expr::Interval(interval) => {
            let text = match interval.value.as_ref() {
                Expr::Value(v) => match &v.value {
                    Value::SingleQuotedString(s) | Value::Number(s, _) => s.clone(),
                    _ => return Err(invalid("expected a quoted amount")),
                },
                _ => return Err(invalid("expected a quoted amount")),
            };
            let (amount_text, unit_text) = match &interval.leading_field {
                Some(field) => (text.trim().to_string(), field_name(field).to_string()),
                None => {
                    let mut parts = text.split_whitespace();
                    let amount = parts.next().unwrap_or("").to_string();
                    let unit = parts.next().ok_or_else(|| invalid("missing unit"))?.to_string();
                    if parts.next().is_some() {
                        return Err(invalid("expected `INTERVAL 'N' UNIT`"));
                    }
                    (amount, unit)
                }
            };
            let amount: f64 = amount_text.parse().map_err(|_| invalid("amount is not a number"))?;
            let (num, den) = unit_seconds(&unit_text).ok_or_else(|| invalid("unknown unit"))?;
            (amount, num, den)
        }
        _ => return Err(invalid("expected an INTERVAL or a number of time units")),
    };
    if !(amount.is_finite() && (amount > 0.0 || (allow_zero && amount == 0.0))) {
        return Err(invalid("durations must be positive"));
    }
    // units = amount * (seconds per interval unit) * (units per second)
    let exact = amount * per_second_num as f64 / per_second_den as f64;
    let units = match expr {
        Expr::Value(_) => amount,
        _ => exact * unit.per_second() as f64,
    };
    if units.fract() != 0.0 || units > i64::MAX as f64 / 4.0 {
        return Err(invalid(&format!("not a whole number of {} units", unit.suffix())));
    }
    Ok(units as i64)
}

fn field_name(field: &DateTimeField) -> &'static str {
    match field {
        DateTimeField::Week(_) | DateTimeField::Weeks => "week",
        DateTimeField::Day | DateTimeField::Days => "day",
        DateTimeField::Hour | DateTimeField::Hours => "hour",
        DateTimeField::Minute | DateTimeField::Minutes => "minute",
        DateTimeField::Second | DateTimeField::Seconds => "second",
        DateTimeField::Millisecond | DateTimeField::Milliseconds => "millisecond",
        DateTimeField::Microsecond | DateTimeField::Microseconds => "microsecond",
        DateTimeField::Nanosecond | DateTimeField::Nanoseconds => "nanosecond",
        _ => "unsupported",
    }
}

/// Seconds in one `unit`, as a fraction `num / den`.
fn unit_seconds(unit: &str) -> Option<(i64, i64)> {
    let unit = unit.to_ascii_lowercase();
    let unit = if unit.len() > 3 { unit.strip_suffix('s').unwrap_or(&unit) } else { &unit };
    Some(match unit {
        "week" | "w" => (604_800, 1),
        "day" | "d" => (86_400, 1),
        "hour" | "h" => (3_600, 1),
        "minute" | "min" | "m" => (60, 1),
        "second" | "sec" | "s" => (1, 1),
        "millisecond" | "ms" => (1, 1_000),
        "microsecond" | "us" => (1, 1_000_000),
        "nanosecond" | "ns" => (1, 1_000_000_000),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_sql::sqlparser::dialect::GenericDialect;
    use datafusion_sql::sqlparser::parser::Parser;

    fn units(sql: &str, unit: TimeUnit) -> Result<i64> {
        let expr = Parser::new(&GenericDialect {}).try_with_sql(sql).unwrap().parse_expr().unwrap();
        duration_in_units(&expr, unit, &ScriptText::new(sql))
    }

    #[test]
    fn converts_intervals() {
        assert_eq!(units("INTERVAL '10' MINUTE", TimeUnit::Second).unwrap(), 600);
        assert_eq!(units("INTERVAL '5' SECOND", TimeUnit::Millisecond).unwrap(), 5_000);
        assert_eq!(units("INTERVAL '2 hours'", TimeUnit::Second).unwrap(), 7_200);
        assert_eq!(units("INTERVAL '250' MILLISECOND", TimeUnit::Microsecond).unwrap(), 250_000);
        assert_eq!(units("30", TimeUnit::Second).unwrap(), 30);
    }

    #[test]
    fn refuses_fractions_and_nonsense() {
        assert!(units("INTERVAL '500' MILLISECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '0' SECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '3 fortnights'", TimeUnit::Second).is_err());
        assert!(units("'x'", TimeUnit::Second).is_err());
    }
}
