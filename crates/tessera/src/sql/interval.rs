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
    // The amount and the seconds per unit it is written in, as a fraction `num / den`.
    let (amount_text, num, den): (String, i64, i64) = match expr {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => (n.clone(), 1, unit.per_second()),
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
            let (num, den) = unit_seconds(&unit_text).ok_or_else(|| invalid("unknown unit"))?;
            (amount_text, num, den)
        }
        _ => return Err(invalid("expected an INTERVAL or a number of time units")),
    };
    let (mantissa, exponent) = parse_decimal(&amount_text).ok_or_else(|| invalid("amount is not a number"))?;
    if mantissa < 0 || (mantissa == 0 && !allow_zero) {
        return Err(invalid("durations must be positive"));
    }
    // units = mantissa * 10^exponent * (num / den) * per_second, computed exactly.
    let too_long = || {
        invalid(&format!(
            "longer than the longest duration tessera windows, {} {} (2^60 units)",
            crate::window::MAX_DURATION,
            unit.suffix()
        ))
    };
    let scale = 10i128.checked_pow(exponent.unsigned_abs()).ok_or_else(too_long)?;
    let (numerator, denominator) = if exponent >= 0 { (scale, 1) } else { (1, scale) };
    let numerator = [mantissa, i128::from(num), i128::from(unit.per_second())]
        .into_iter()
        .try_fold(numerator, i128::checked_mul)
        .ok_or_else(too_long)?;
    let denominator = denominator * i128::from(den);
    if numerator % denominator != 0 {
        return Err(invalid(&format!("not a whole number of {} units", unit.suffix())));
    }
    let units = numerator / denominator;
    if units > i128::from(crate::window::MAX_DURATION) {
        return Err(too_long());
    }
    Ok(units as i64)
}

/// A decimal number `[+-]digits[.digits][e[+-]digits]` as `mantissa * 10^exponent`, exactly;
/// `None` when it is not one, has more than 30 digits or an exponent beyond ±29.
fn parse_decimal(text: &str) -> Option<(i128, i32)> {
    let (number, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mantissa: i128 = digits.parse().ok()?;
    let exponent = exponent.checked_sub(i32::try_from(fraction.len()).ok()?)?;
    if !(-29..=29).contains(&exponent) {
        return if mantissa == 0 { Some((0, 0)) } else { None };
    }
    Some((if negative { -mantissa } else { mantissa }, exponent))
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
        // Decimal fractions that no float holds exactly.
        assert_eq!(units("INTERVAL '0.7' SECOND", TimeUnit::Millisecond).unwrap(), 700);
        assert_eq!(units("INTERVAL '1.1' MINUTE", TimeUnit::Second).unwrap(), 66);
        assert_eq!(units("INTERVAL '2.5e3' MILLISECOND", TimeUnit::Millisecond).unwrap(), 2_500);
        assert!(units("INTERVAL '2.5e3' MILLISECOND", TimeUnit::Second).is_err());
        assert_eq!(units("INTERVAL '0.000001' SECOND", TimeUnit::Microsecond).unwrap(), 1);
    }

    #[test]
    fn refuses_fractions_and_nonsense() {
        assert!(units("INTERVAL '500' MILLISECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '0' SECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '3 fortnights'", TimeUnit::Second).is_err());
        assert!(units("'x'", TimeUnit::Second).is_err());
        let err = units("INTERVAL '9223372036854775' SECOND", TimeUnit::Millisecond).unwrap_err().to_string();
        assert!(err.contains("longer than the longest duration tessera windows, 1152921504606846976 ms"), "{err}");
        assert_eq!(units("1152921504606846976", TimeUnit::Nanosecond).unwrap(), crate::window::MAX_DURATION);
        // Exact arithmetic: one unit more than the limit is refused, however close in a float.
        assert!(units("1152921504606846977", TimeUnit::Nanosecond).is_err());
        assert!(units("INTERVAL '1152921504606846977' SECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '1e400' SECOND", TimeUnit::Second).is_err());
        assert!(units("INTERVAL '0.0000000001' SECOND", TimeUnit::Nanosecond).is_err());
    }
}
