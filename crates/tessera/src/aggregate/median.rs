//! MEDIAN: exact, so each slot keeps every value (a holistic aggregate: windows do not share
//! it). APPROX_MEDIAN is the bounded alternative.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array};
use arrow::datatypes::{DataType, Float64Type};

use super::columns::{each_pair, each_valid, nulls_of, same, values_of};
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const MEDIAN: Median = Median;

#[derive(Debug)]
pub(super) struct Median;

impl AggregateFunction for Median {
    fn name(&self) -> &'static str {
        "median"
    }

    fn answers(&self, name: &str, _counts_rows: bool) -> bool {
        name == "median"
    }

    fn sharing(&self) -> Sharing {
        Sharing::None
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_number(value_type, ValueKind::Float)
    }

    fn new_states(&self, _spec: &AggregateSpec) -> Box<dyn GroupStates> {
        Box::new(AllValues::default())
    }
}

#[derive(Clone, Default)]
struct AllValues {
    values: Vec<Vec<f64>>,
}

impl GroupStates for AllValues {
    fn len(&self) -> usize {
        self.values.len()
    }

    fn resize(&mut self, n: usize) {
        self.values.resize_with(n, Vec::new);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let state = &mut self.values;
        each_valid(values_of::<Float64Type>(&args[0]), nulls_of(&args[0]), offset, slots, |v, s| state[s].push(v));
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<AllValues>(other)?;
        each_pair(src, dst, |i, d| self.values[d].extend_from_slice(&other.values[i]));
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        self.values.extend_from_slice(&same::<AllValues>(other)?.values);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<AllValues>(other) else { return false };
        self.values.clone_from(&other.values);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        Ok(Arc::new(Float64Array::from_iter(self.values.iter().map(|v| median(v)))))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.len(self.values.len());
        self.values.iter().for_each(|v| w.f64s(v));
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        let n = r.len(8)?;
        self.values = (0..n).map(|_| r.f64s()).collect::<Result<_>>()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.values.iter().map(|v| 24 + v.capacity() * 8).sum()
    }
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    let mid = sorted.len() / 2;
    let (_, upper, _) = sorted.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *upper;
    if values.len() % 2 == 1 {
        return Some(upper);
    }
    let lower = sorted[..mid].iter().copied().max_by(f64::total_cmp).unwrap_or(upper);
    Some(lower + (upper - lower) / 2.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_interpolates_even_counts() {
        assert_eq!(super::median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(super::median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(super::median(&[]), None);
    }
}
