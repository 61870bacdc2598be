//! Values entering a table take their column's type by checked conversion: a value that does
//! not fit (out of the type's range, text that is not one of its values, an impossible date, a
//! number with a fraction for an integer column, a number for a TIMESTAMP column of a table
//! without a `time_unit`, a timestamp finer than the column holds) is refused with the value,
//! the column and the row, as PostgreSQL and DuckDB refuse it; nothing is stored as NULL or cut
//! short in its place.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::CastOptions;
use arrow::datatypes::{DataType, Float64Type};
use tessera::catalog::{sql_type_name, TimeUnit};

/// Why the value in a row does not fit its column.
pub struct Misfit {
    pub row: usize,
    pub reason: String,
}

/// `values` as `to`: every value converted, or the first that does not fit. Integers are counted
/// in `time_unit` where `to` is a TIMESTAMP.
pub fn checked_cast(given: &ArrayRef, to: &DataType, time_unit: Option<TimeUnit>) -> Result<ArrayRef, Misfit> {
    let from = given.data_type();
    if from == to {
        return Ok(ArrayRef::clone(given));
    }
    if from == &DataType::Null {
        return Ok(arrow::array::new_null_array(to, given.len()));
    }
    let first_value = || (0..given.len()).find(|&r| given.is_valid(r)).unwrap_or(0);
    let to_name = sql_type_name(to);
    // What is converted to `to`: the given values, or counts of `time_unit` as timestamps.
    let values = match (to, time_unit) {
        (DataType::Timestamp(..), Some(unit)) if from.is_integer() => {
            let counts = cast(given, &DataType::Int64)?;
            cast(&counts, &DataType::Timestamp(unit.to_arrow(), None))?
        }
        (DataType::Timestamp(..), None) if from.is_numeric() => {
            let row = first_value();
            return Err(Misfit {
                row,
                reason: format!(
                    "{} is a number, and a number is a TIMESTAMP only in a unit: declare the table's \
                     time_unit = 's', 'ms', 'us' or 'ns' in its WITH, or give a timestamp",
                    shown(given, row)
                ),
            });
        }
        _ => ArrayRef::clone(given),
    };
    if !arrow::compute::can_cast_types(values.data_type(), to) {
        let row = first_value();
        return Err(Misfit { row, reason: format!("{} is {}, not {to_name}", shown(given, row), sql_type_name(from)) });
    }
    let converted = cast(&values, to)?;
    // A value the conversion could not make is NULL where the given one was not (a conversion
    // never makes a value of a NULL, so equal counts mean none: the rows are looked at only
    // then).
    let lost = converted.null_count() != given.null_count();
    if let Some(row) = (0..given.len()).filter(|_| lost).find(|&r| given.is_valid(r) && converted.is_null(r)) {
        let reason = match from.is_numeric() && to.is_numeric() || from.is_integer() && time_unit.is_some() {
            true => format!("{} is out of the range of {to_name}", shown(given, row)),
            false => format!("{} is not a {to_name}", shown(given, row)),
        };
        return Err(Misfit { row, reason });
    }
    // A value that does not come back from its conversion lost part of itself: a fraction,
    // which integers do not hold (1.9 would be stored as 1), or a fraction of the unit of a
    // timestamp column coarser than the value's.
    let cut = match (from, to) {
        (_, to)
            if to.is_integer()
                && (from.is_floating() || matches!(from, DataType::Decimal128(..) | DataType::Decimal256(..))) =>
        {
            Some(format!("is not a whole number, and {to_name} holds whole numbers"))
        }
        (DataType::Timestamp(given_unit, _), DataType::Timestamp(unit, _)) if finer(given_unit, unit) => {
            Some(format!("is finer than the {unit:?}s {to_name} holds"))
        }
        _ => None,
    };
    if let Some(why) = cut {
        let back = cast(&converted, from)?;
        let same =
            arrow::compute::kernels::cmp::eq(given, &back).map_err(|e| Misfit { row: 0, reason: e.to_string() })?;
        if let Some(row) = (0..given.len()).find(|&r| given.is_valid(r) && !same.value(r)) {
            return Err(Misfit { row, reason: format!("{} {why}", shown(given, row)) });
        }
    }
    // Numbers too large for a float become infinite.
    if to.is_floating() && from.is_numeric() {
        let stored = cast(&converted, &DataType::Float64)?;
        let wide = cast(given, &DataType::Float64)?;
        let (stored, wide) = (stored.as_primitive::<Float64Type>(), wide.as_primitive::<Float64Type>());
        let overflow = (0..given.len())
            .find(|&r| stored.is_valid(r) && stored.value(r).is_infinite() && !wide.value(r).is_infinite());
        if let Some(row) = overflow {
            return Err(Misfit { row, reason: format!("{} is out of the range of {to_name}", shown(given, row)) });
        }
    }
    Ok(converted)
}

/// Whether time unit `a` is finer than `b`.
fn finer(a: &arrow::datatypes::TimeUnit, b: &arrow::datatypes::TimeUnit) -> bool {
    use arrow::datatypes::TimeUnit as U;
    let rank = |u: &U| match u {
        U::Second => 0,
        U::Millisecond => 1,
        U::Microsecond => 2,
        U::Nanosecond => 3,
    };
    rank(a) > rank(b)
}

/// A conversion that makes NULL of what it cannot convert (the callers check).
fn cast(values: &ArrayRef, to: &DataType) -> Result<ArrayRef, Misfit> {
    let options = CastOptions { safe: true, ..CastOptions::default() };
    arrow::compute::cast_with_options(values, to, &options).map_err(|e| Misfit { row: 0, reason: e.to_string() })
}

/// The value in `row` as SQL writes it: text quoted.
fn shown(values: &ArrayRef, row: usize) -> String {
    let text = arrow::util::display::array_value_to_string(values, row).unwrap_or_default();
    match values.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => format!("'{}'", text.replace('\'', "''")),
        _ => text,
    }
}
