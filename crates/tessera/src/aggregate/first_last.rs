//! FIRST_VALUE and LAST_VALUE by event time: per slot, the value of the row with the smallest
//! (largest) event time, NULL or not (SQL's RESPECT NULLS). Among rows of one event time the
//! first (last) to arrive wins; such rows always fall into one slice, so any two partial
//! states holding a time hold the same row for it, and windows share these states through
//! overlapping parts as they share MIN and MAX.
//!
//! The binder hands each row's event time as a second argument.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringArray};
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use super::columns::{each_pair, primitive, same, validity};
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const FIRST_VALUE: FirstLast = FirstLast { name: "first_value", last: false };
pub(super) const LAST_VALUE: FirstLast = FirstLast { name: "last_value", last: true };

#[derive(Debug)]
pub(super) struct FirstLast {
    name: &'static str,
    last: bool,
}

impl AggregateFunction for FirstLast {
    fn name(&self) -> &'static str {
        self.name
    }

    fn sharing(&self) -> Sharing {
        Sharing::CoveredBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_argument(value_type)
    }

    fn orders_by_event_time(&self) -> bool {
        true
    }

    fn reads_dictionaries(&self, _kind: ValueKind) -> bool {
        false
    }

    fn new_states(&self, spec: &AggregateSpec) -> Box<dyn GroupStates> {
        let values = match spec.kind {
            ValueKind::Utf8 => Chosen::Strings(Vec::new()),
            kind => Chosen::Numbers { float: kind == ValueKind::Float, bits: Vec::new(), valid: Vec::new() },
        };
        Box::new(Earliest { last: self.last, times: Vec::new(), seen: Vec::new(), values })
    }
}

/// The values chosen, one per slot: numbers as 64 bits (a float's bits) with their validity,
/// or strings.
#[derive(Clone)]
enum Chosen {
    Numbers { float: bool, bits: Vec<i64>, valid: Vec<bool> },
    Strings(Vec<Option<Box<str>>>),
}

impl Chosen {
    fn resize(&mut self, n: usize) {
        match self {
            Chosen::Numbers { bits, valid, .. } => {
                bits.resize(n, 0);
                valid.resize(n, false);
            }
            Chosen::Strings(values) => values.resize(n, None),
        }
    }

    /// Slot `d` takes slot `i` of `other`.
    fn take(&mut self, d: usize, other: &Chosen, i: usize) {
        match (self, other) {
            (Chosen::Numbers { bits, valid, .. }, Chosen::Numbers { bits: b, valid: v, .. }) => {
                (bits[d], valid[d]) = (b[i], v[i]);
            }
            (Chosen::Strings(values), Chosen::Strings(v)) => values[d].clone_from(&v[i]),
            _ => {}
        }
    }

    /// Slot `slot` takes row `row` of `input`.
    fn take_row(&mut self, slot: usize, input: &ArrayRef, row: usize) {
        let present = input.is_valid(row);
        match self {
            Chosen::Numbers { float: true, bits, valid } => {
                (bits[slot], valid[slot]) = (input.as_primitive::<Float64Type>().value(row).to_bits() as i64, present);
            }
            Chosen::Numbers { float: false, bits, valid } => {
                (bits[slot], valid[slot]) = (input.as_primitive::<Int64Type>().value(row), present);
            }
            Chosen::Strings(values) => {
                values[slot] = present.then(|| input.as_string::<i32>().value(row).into());
            }
        }
    }
}

#[derive(Clone)]
struct Earliest {
    /// LAST_VALUE: the latest row wins.
    last: bool,
    /// The event time of each slot's row.
    times: Vec<i64>,
    /// Whether a slot has a row.
    seen: Vec<bool>,
    values: Chosen,
}

impl Earliest {
    /// Whether a row at `time`, arriving after the slot's, replaces it.
    fn arriving_wins(&self, slot: usize, time: i64) -> bool {
        !self.seen[slot] || if self.last { time >= self.times[slot] } else { time < self.times[slot] }
    }

    /// Whether a partial state's row at `time` replaces the slot's (a tie holds the same row).
    fn merged_wins(&self, slot: usize, time: i64) -> bool {
        !self.seen[slot] || if self.last { time > self.times[slot] } else { time < self.times[slot] }
    }
}

impl GroupStates for Earliest {
    fn len(&self) -> usize {
        self.times.len()
    }

    fn resize(&mut self, n: usize) {
        self.times.resize(n, 0);
        self.seen.resize(n, false);
        self.values.resize(n);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let times = args[1].as_primitive::<Int64Type>();
        for (row, &slot) in (offset..).zip(slots) {
            let (slot, time) = (slot as usize, times.value(row));
            if times.is_valid(row) && self.arriving_wins(slot, time) {
                (self.times[slot], self.seen[slot]) = (time, true);
                self.values.take_row(slot, &args[0], row);
            }
        }
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<Earliest>(other)?;
        each_pair(src, dst, |i, d| {
            if other.seen[i] && self.merged_wins(d, other.times[i]) {
                (self.times[d], self.seen[d]) = (other.times[i], true);
                self.values.take(d, &other.values, i);
            }
        });
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        let other = same::<Earliest>(other)?;
        let n = self.len();
        self.resize(n + other.len());
        for i in 0..other.len() {
            (self.times[n + i], self.seen[n + i]) = (other.times[i], other.seen[i]);
            self.values.take(n + i, &other.values, i);
        }
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<Earliest>(other) else { return false };
        self.clone_from(other);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        Ok(match &self.values {
            Chosen::Numbers { float, bits, valid } => {
                let present: Vec<bool> = self.seen.iter().zip(valid).map(|(&seen, &valid)| seen && valid).collect();
                let nulls = validity(&present, |p| p);
                if *float {
                    primitive::<Float64Type>(bits.iter().map(|&b| f64::from_bits(b as u64)).collect(), nulls)
                } else {
                    primitive::<Int64Type>(bits.clone(), nulls)
                }
            }
            Chosen::Strings(values) => Arc::new(StringArray::from_iter(values.iter().map(|v| v.as_deref()))),
        })
    }

    fn encode(&self, w: &mut StateWriter) {
        w.i64s(&self.times);
        w.bools(&self.seen);
        match &self.values {
            Chosen::Numbers { bits, valid, .. } => {
                w.i64s(bits);
                w.bools(valid);
            }
            Chosen::Strings(values) => {
                for value in values {
                    w.bool(value.is_some());
                    if let Some(value) = value {
                        w.str(value);
                    }
                }
            }
        }
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        (self.times, self.seen) = (r.i64s()?, r.bools()?);
        let n = self.times.len();
        match &mut self.values {
            Chosen::Numbers { bits, valid, .. } => (*bits, *valid) = (r.i64s()?, r.bools()?),
            Chosen::Strings(values) => {
                *values = (0..n)
                    .map(|_| Ok(if r.bool()? { Some(Box::from(r.str()?)) } else { None }))
                    .collect::<Result<_>>()?;
            }
        }
        let lengths = match &self.values {
            Chosen::Numbers { bits, valid, .. } => bits.len() == n && valid.len() == n,
            Chosen::Strings(values) => values.len() == n,
        };
        super::columns::check(self.seen.len() == n && lengths)
    }

    fn bytes(&self) -> usize {
        let values = match &self.values {
            Chosen::Numbers { .. } => self.len() * 9,
            Chosen::Strings(values) => values.iter().map(|v| 16 + v.as_ref().map_or(0, |s| s.len())).sum(),
        };
        self.len() * 9 + values
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{floats, floats_of, ints, spec};
    use super::*;

    /// Against a reference: the value of the row with the smallest (largest) time, the first
    /// (last) to arrive among ties, NULL values kept; whatever runs the rows are cut into and
    /// however the partial states are merged (including a part merged twice, as overlapping
    /// windows do).
    #[test]
    fn the_earliest_and_latest_rows_win_ties_by_arrival_through_any_merges() {
        let mut rng = crate::window::generators::SplitMix::new(5);
        for case in 0..300 {
            let n = (rng.next_u64() % 30) as usize;
            let times: Vec<i64> = (0..n).map(|_| (rng.next_u64() % 6) as i64).collect();
            let values: Vec<Option<f64>> =
                (0..n).map(|i| (!rng.next_u64().is_multiple_of(4)).then_some(i as f64)).collect();
            let slots: Vec<u32> = (0..n).map(|_| (rng.next_u64() % 3) as u32).collect();
            let args = [floats(&values), ints(&times.iter().map(|&t| Some(t)).collect::<Vec<_>>())];
            for last in [false, true] {
                let spec = spec(if last { "last_value" } else { "first_value" }, Some(DataType::Float64), None);
                let expected: Vec<Option<f64>> = (0..3u32)
                    .map(|g| {
                        let rows = (0..n).filter(|&r| slots[r] == g);
                        let best = if last {
                            rows.max_by_key(|&r| (times[r], r))
                        } else {
                            rows.min_by_key(|&r| (times[r], r))
                        };
                        best.and_then(|r| values[r])
                    })
                    .collect();
                // Rows in slices by time (ties in one slice), each slice in arrival order.
                let mut window = spec.new_states();
                window.resize(3);
                for bound in [(0, 2), (2, 4), (4, 6)] {
                    let mut slice = spec.new_states();
                    slice.resize(3);
                    for r in (0..n).filter(|&r| (bound.0..bound.1).contains(&times[r])) {
                        slice.update(&args, r, &slots[r..r + 1]);
                    }
                    window.merge(slice.as_ref(), None, &[0, 1, 2]).unwrap();
                    window.merge(slice.as_ref(), Some(&[2, 0]), &[2, 0]).unwrap();
                }
                assert_eq!(floats_of(&window.finalize().unwrap()), expected, "case {case}, last {last}");
                let mut direct = spec.new_states();
                direct.resize(3);
                direct.update(&args, 0, &slots);
                assert_eq!(floats_of(&direct.finalize().unwrap()), expected, "case {case}, last {last}");
            }
        }
    }
}
