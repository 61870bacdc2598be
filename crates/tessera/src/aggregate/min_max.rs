//! MIN and MAX: of integers and floats as one integer per slot (floats by a key that orders
//! like `f64::total_cmp`), of strings as one owned string per slot.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use super::columns::{each_pair, each_valid, nulls_of, primitive, same, validity, values_of, Values};
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const MIN: MinMax = MinMax { name: "min", max: false };
pub(super) const MAX: MinMax = MinMax { name: "max", max: true };

#[derive(Debug)]
pub(super) struct MinMax {
    name: &'static str,
    max: bool,
}

impl AggregateFunction for MinMax {
    fn name(&self) -> &'static str {
        self.name
    }

    fn sharing(&self) -> Sharing {
        Sharing::CoveredBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_argument(value_type)
    }

    fn new_states(&self, spec: &AggregateSpec) -> Box<dyn GroupStates> {
        match spec.kind {
            ValueKind::Utf8 => Box::new(ExtremeStrings { max: self.max, values: Vec::new() }),
            kind => Box::new(Extremes::new(self.max, kind == ValueKind::Float)),
        }
    }
}

/// MIN or MAX of integers, or of floats as their total-order keys (`float_key`). A slot
/// without a value holds the identity (`i64::MAX` for MIN, `i64::MIN` for MAX), so taking a
/// value is one branchless min or max, in updates and merges alike.
#[derive(Clone)]
pub(super) struct Extremes {
    max: bool,
    float: bool,
    values: Vec<i64>,
    seen: Vec<bool>,
}

impl Extremes {
    pub(super) fn new(max: bool, float: bool) -> Self {
        Extremes { max, float, values: Vec::new(), seen: Vec::new() }
    }

    fn identity(&self) -> i64 {
        if self.max {
            i64::MIN
        } else {
            i64::MAX
        }
    }
}

impl GroupStates for Extremes {
    fn len(&self) -> usize {
        self.values.len()
    }

    fn resize(&mut self, n: usize) {
        let identity = self.identity();
        self.values.resize(n, identity);
        self.seen.resize(n, false);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let nulls = nulls_of(&args[0]);
        let state = (self.values.as_mut_slice(), self.seen.as_mut_slice());
        if self.float {
            keep_best(values_of::<Float64Type>(&args[0]), nulls, offset, slots, state, self.max, float_key);
        } else {
            keep_best(values_of::<Int64Type>(&args[0]), nulls, offset, slots, state, self.max, |v| v);
        }
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<Extremes>(other)?;
        let (values, seen) = (self.values.as_mut_slice(), self.seen.as_mut_slice());
        // A slot of `other` without a value holds the identity: no branch needed.
        if self.max {
            each_pair(src, dst, |i, d| {
                values[d] = values[d].max(other.values[i]);
                seen[d] |= other.seen[i];
            });
        } else {
            each_pair(src, dst, |i, d| {
                values[d] = values[d].min(other.values[i]);
                seen[d] |= other.seen[i];
            });
        }
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        let other = same::<Extremes>(other)?;
        self.values.extend_from_slice(&other.values);
        self.seen.extend_from_slice(&other.seen);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<Extremes>(other) else { return false };
        (self.max, self.float) = (other.max, other.float);
        self.values.clone_from(&other.values);
        self.seen.clone_from(&other.seen);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        let nulls = validity(&self.seen, |s| s);
        Ok(if self.float {
            primitive::<Float64Type>(self.values.iter().map(|&k| float_of_key(k)).collect(), nulls)
        } else {
            primitive::<Int64Type>(self.values.clone(), nulls)
        })
    }

    fn encode(&self, w: &mut StateWriter) {
        if self.float {
            w.f64s(&self.values.iter().map(|&k| float_of_key(k)).collect::<Vec<_>>());
        } else {
            w.i64s(&self.values);
        }
        w.bools(&self.seen);
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        self.values = if self.float { r.f64s()?.into_iter().map(float_key).collect() } else { r.i64s()? };
        self.seen = r.bools()?;
        super::columns::check(self.values.len() == self.seen.len())?;
        // Slots without a value hold the identity, whatever was written for them.
        let identity = self.identity();
        for (value, _) in self.values.iter_mut().zip(&self.seen).filter(|(_, &seen)| !seen) {
            *value = identity;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.len() * 9
    }
}

/// MIN or MAX of strings.
#[derive(Clone)]
struct ExtremeStrings {
    max: bool,
    values: Vec<Option<Box<str>>>,
}

impl ExtremeStrings {
    /// Whether `candidate` replaces the slot's value.
    fn wins(&self, candidate: &str, current: Option<&str>) -> bool {
        current.is_none_or(|current| if self.max { candidate > current } else { candidate < current })
    }
}

impl GroupStates for ExtremeStrings {
    fn len(&self) -> usize {
        self.values.len()
    }

    fn resize(&mut self, n: usize) {
        self.values.resize(n, None);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let input = args[0].as_string::<i32>();
        for (row, &slot) in (offset..).zip(slots) {
            if input.is_valid(row) {
                let value = input.value(row);
                if self.wins(value, self.values[slot as usize].as_deref()) {
                    self.values[slot as usize] = Some(value.into());
                }
            }
        }
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<ExtremeStrings>(other)?;
        each_pair(src, dst, |i, d| {
            if let Some(value) = &other.values[i] {
                if self.wins(value, self.values[d].as_deref()) {
                    self.values[d] = Some(value.clone());
                }
            }
        });
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        self.values.extend_from_slice(&same::<ExtremeStrings>(other)?.values);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<ExtremeStrings>(other) else { return false };
        self.clone_from(other);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        Ok(Arc::new(StringArray::from_iter(self.values.iter().map(|v| v.as_deref()))))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.len(self.values.len());
        for value in &self.values {
            w.bool(value.is_some());
            if let Some(value) = value {
                w.str(value);
            }
        }
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        let n = r.len(1)?;
        self.values =
            (0..n).map(|_| Ok(if r.bool()? { Some(Box::from(r.str()?)) } else { None })).collect::<Result<_>>()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.values.iter().map(|v| 16 + v.as_ref().map_or(0, |s| s.len())).sum()
    }
}

/// MIN or MAX over a run: each valid value's `key` replaces its group's when it is smaller
/// (larger for MAX). Branchless: a slot without a value holds the identity, and in a fresh
/// slice a value wins often, and unpredictably.
fn keep_best<T: Copy>(
    input: Values<'_, T>,
    nulls: Option<&NullBuffer>,
    offset: usize,
    slots: &[u32],
    (state, seen): (&mut [i64], &mut [bool]),
    max: bool,
    key: impl Fn(T) -> i64,
) {
    if max {
        each_valid(input, nulls, offset, slots, |v, s| {
            state[s] = state[s].max(key(v));
            seen[s] = true;
        });
    } else {
        each_valid(input, nulls, offset, slots, |v, s| {
            state[s] = state[s].min(key(v));
            seen[s] = true;
        });
    }
}

/// A float as an integer that orders like `f64::total_cmp` (NaN above every number, -0 below
/// +0, as in SQL engines that order floats totally); its own inverse.
pub(super) fn float_key(value: f64) -> i64 {
    let bits = value.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

pub(super) fn float_of_key(key: i64) -> f64 {
    f64::from_bits(float_key(f64::from_bits(key as u64)) as u64)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{floats, ints, round_trip, spec};
    use super::*;

    proptest::proptest! {
        /// MIN and MAX of floats order totally (NaN above every number, -0 below +0) and of
        /// integers up to the extremes, through updates, a merge and a codec round trip.
        #[test]
        fn min_max_keep_the_extreme_value_through_merges_and_the_codec(
            rows in proptest::collection::vec((0u32..3, proptest::option::weighted(0.8, 0usize..10)), 0..40),
            split in 0usize..40,
            max: bool,
        ) {
            const FLOATS: [f64; 10] =
                [f64::NAN, -f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1.5, -2.25, f64::MAX, f64::MIN_POSITIVE];
            const INTS: [i64; 10] = [i64::MIN, i64::MAX, 0, -1, 1, 7, -7, i64::MAX - 1, i64::MIN + 1, 42];
            let name = if max { "max" } else { "min" };
            let slots: Vec<u32> = rows.iter().map(|r| r.0).collect();
            let split = split.min(rows.len());
            let through_merge = |value_type: DataType, values: ArrayRef| {
                let spec = spec(name, Some(value_type), None);
                let mut a = spec.new_states();
                let mut b = spec.new_states();
                a.resize(3);
                b.resize(3);
                a.update(std::slice::from_ref(&values), 0, &slots[..split]);
                b.update(std::slice::from_ref(&values), split, &slots[split..]);
                let decoded = round_trip(&spec, b.as_ref());
                a.merge(decoded.as_ref(), None, &[0, 1, 2]).unwrap();
                a.finalize().unwrap()
            };
            let floats_out = through_merge(DataType::Float64, floats(&rows.iter().map(|r| r.1.map(|i| FLOATS[i])).collect::<Vec<_>>()));
            let ints_out = through_merge(DataType::Int64, ints(&rows.iter().map(|r| r.1.map(|i| INTS[i])).collect::<Vec<_>>()));
            for group in 0..3u32 {
                let values = || rows.iter().filter(move |r| r.0 == group).filter_map(|r| r.1);
                let float = values().map(|i| FLOATS[i]).reduce(|a, b| match (a.total_cmp(&b).is_lt(), max) {
                    (true, true) | (false, false) => b,
                    _ => a,
                });
                let int = if max { values().map(|i| INTS[i]).max() } else { values().map(|i| INTS[i]).min() };
                let got = floats_out.as_primitive::<Float64Type>();
                let got = got.is_valid(group as usize).then(|| got.value(group as usize).to_bits());
                proptest::prop_assert_eq!(got, float.map(f64::to_bits));
                let got = ints_out.as_primitive::<Int64Type>();
                proptest::prop_assert_eq!(got.is_valid(group as usize).then(|| got.value(group as usize)), int);
            }
        }
    }
}
