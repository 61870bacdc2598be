//! COUNT(x) (rows where x has a value) and COUNT(*) (rows): a count per slot, taken away again
//! exactly when a hopping window slides.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array};
use arrow::datatypes::DataType;

use super::columns::{each_pair, same};
use super::{AggregateFunction, AggregateSpec, GroupStates, InvertibleStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const COUNT: Count = Count { rows: false };
pub(super) const COUNT_ROWS: Count = Count { rows: true };

#[derive(Debug)]
pub(super) struct Count {
    /// `COUNT(*)`: every row counts.
    rows: bool,
}

impl AggregateFunction for Count {
    fn name(&self) -> &'static str {
        "count"
    }

    fn answers(&self, name: &str, counts_rows: bool) -> bool {
        name == "count" && counts_rows == self.rows
    }

    fn sharing(&self) -> Sharing {
        Sharing::PartitionedBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        match (self.rows, value_type) {
            (true, _) => Ok(ValueKind::Int),
            (false, Some(_)) => ValueKind::of_argument(value_type),
            (false, None) => Err("an argument, or *".into()),
        }
    }

    fn has_exact_inverse(&self) -> bool {
        true
    }

    fn new_states(&self, _spec: &AggregateSpec) -> Box<dyn GroupStates> {
        Box::new(Counts::default())
    }
}

#[derive(Clone, Default)]
pub(super) struct Counts {
    counts: Vec<i64>,
}

impl GroupStates for Counts {
    fn len(&self) -> usize {
        self.counts.len()
    }

    fn resize(&mut self, n: usize) {
        self.counts.resize(n, 0);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let counts = self.counts.as_mut_slice();
        match args.first().filter(|values| values.null_count() > 0) {
            None => slots.iter().for_each(|&s| counts[s as usize] += 1),
            Some(values) => {
                for (row, &s) in (offset..).zip(slots) {
                    counts[s as usize] += i64::from(values.is_valid(row));
                }
            }
        }
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<Counts>(other)?;
        each_pair(src, dst, |i, d| self.counts[d] += other.counts[i]);
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        self.counts.extend_from_slice(&same::<Counts>(other)?.counts);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<Counts>(other) else { return false };
        self.counts.clone_from(&other.counts);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        Ok(Arc::new(Int64Array::from(self.counts.clone())))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.i64s(&self.counts);
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        self.counts = r.i64s()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.len() * 16
    }

    fn invertible(&mut self) -> Option<&mut dyn InvertibleStates> {
        Some(self)
    }
}

impl InvertibleStates for Counts {
    fn add_exactly(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32], subtract: bool) -> Result<()> {
        let other = same::<Counts>(other)?;
        let sign = if subtract { -1 } else { 1 };
        each_pair(src, dst, |i, d| self.counts[d] += sign * other.counts[i]);
        Ok(())
    }
}
