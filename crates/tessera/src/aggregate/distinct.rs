//! APPROX_COUNT_DISTINCT: per slot, the 64-bit hashes of the distinct values while few
//! (exact), a HyperLogLog sketch beyond. Exact sets merged with overlapping parts would count
//! right, but sketches of windows do not share: a holistic aggregate here.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array};
use arrow::datatypes::DataType;
use hashbrown::HashSet;

use super::columns::{each_pair, each_valid, mismatch, same, Values};
use super::hll::HyperLogLog;
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const APPROX_COUNT_DISTINCT: ApproxCountDistinct = ApproxCountDistinct;

#[derive(Debug)]
pub(super) struct ApproxCountDistinct;

impl AggregateFunction for ApproxCountDistinct {
    fn name(&self) -> &'static str {
        "approx_count_distinct"
    }

    fn answers(&self, name: &str, _counts_rows: bool) -> bool {
        name == "approx_distinct" || name == "approx_count_distinct"
    }

    fn sharing(&self) -> Sharing {
        Sharing::None
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_argument(value_type)
    }

    /// A sketch hashes values: its argument is read as values.
    fn reads_dictionaries(&self, _kind: ValueKind) -> bool {
        false
    }

    fn new_states(&self, _spec: &AggregateSpec) -> Box<dyn GroupStates> {
        Box::new(DistinctSketches::default())
    }
}

/// Distinct-count state of one group: exact hashes while few, a HyperLogLog sketch beyond.
#[derive(Clone)]
enum DistinctSketch {
    Exact(HashSet<u64>),
    Sketch(Box<HyperLogLog>),
}

/// Groups below this many distinct values are counted exactly (by 64-bit hash).
const EXACT_DISTINCT_LIMIT: usize = 512;

impl DistinctSketch {
    fn insert(&mut self, hash: u64) {
        match self {
            DistinctSketch::Exact(set) => {
                set.insert(hash);
                if set.len() > EXACT_DISTINCT_LIMIT {
                    self.make_sketch();
                }
            }
            DistinctSketch::Sketch(hll) => hll.add(hash),
        }
    }

    fn make_sketch(&mut self) {
        if let DistinctSketch::Exact(set) = self {
            let mut hll = Box::new(HyperLogLog::new());
            set.iter().for_each(|h| hll.add(*h));
            *self = DistinctSketch::Sketch(hll);
        }
    }

    fn merge(&mut self, other: &DistinctSketch) {
        match other {
            DistinctSketch::Exact(set) => set.iter().for_each(|h| self.insert(*h)),
            DistinctSketch::Sketch(other_hll) => {
                self.make_sketch();
                if let DistinctSketch::Sketch(hll) = self {
                    hll.merge(other_hll);
                }
            }
        }
    }

    fn count(&self) -> i64 {
        match self {
            DistinctSketch::Exact(set) => set.len() as i64,
            DistinctSketch::Sketch(hll) => hll.count() as i64,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            DistinctSketch::Exact(set) => set.capacity() * 8 + 32,
            DistinctSketch::Sketch(_) => 16 * 1024 + 32,
        }
    }
}

#[derive(Clone, Default)]
struct DistinctSketches {
    sketches: Vec<DistinctSketch>,
}

impl GroupStates for DistinctSketches {
    fn len(&self) -> usize {
        self.sketches.len()
    }

    fn resize(&mut self, n: usize) {
        self.sketches.resize_with(n, || DistinctSketch::Exact(HashSet::new()));
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        // One hash per distinct SQL value (the same value always lands on the same hash), for
        // the run's rows only.
        let run = args[0].slice(offset, slots.len());
        let mut hashes = vec![0u64; slots.len()];
        let _ = datafusion_common::hash_utils::create_hashes(
            [&run],
            &datafusion_common::hash_utils::RandomState::with_seed(0x7e55e7a),
            &mut hashes,
        );
        let nulls = run.nulls().filter(|n| n.null_count() > 0);
        let sketches = &mut self.sketches;
        each_valid(Values::Column(&hashes), nulls, 0, slots, |hash, s| sketches[s].insert(hash));
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<DistinctSketches>(other)?;
        each_pair(src, dst, |i, d| self.sketches[d].merge(&other.sketches[i]));
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        self.sketches.extend_from_slice(&same::<DistinctSketches>(other)?.sketches);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<DistinctSketches>(other) else { return false };
        self.sketches.clone_from(&other.sketches);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        Ok(Arc::new(Int64Array::from_iter_values(self.sketches.iter().map(DistinctSketch::count))))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.len(self.sketches.len());
        for sketch in &self.sketches {
            match sketch {
                DistinctSketch::Exact(set) => {
                    w.u8(0);
                    w.u64s(set.iter().copied());
                }
                DistinctSketch::Sketch(hll) => {
                    w.u8(1);
                    w.bytes(hll.registers());
                }
            }
        }
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        let n = r.len(1)?;
        self.sketches = (0..n)
            .map(|_| match r.u8()? {
                0 => Ok(DistinctSketch::Exact(r.u64s()?.into_iter().collect())),
                1 => HyperLogLog::from_registers(r.bytes()?)
                    .map(|hll| DistinctSketch::Sketch(Box::new(hll)))
                    .ok_or_else(mismatch),
                _ => Err(mismatch()),
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.sketches.iter().map(DistinctSketch::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ints, ints_of, spec, states_of};
    use super::*;

    #[test]
    fn distinct_counts_are_exact_when_small_and_close_when_large() {
        let spec = spec("approx_distinct", Some(DataType::Int64), None);
        let small = ints(&(0..100).map(|i| Some(i % 37)).collect::<Vec<_>>());
        assert_eq!(ints_of(&states_of(&spec, &[small], &[0; 100]).finalize().unwrap()), [Some(37)]);
        let n = 20_000;
        let large = ints(&(0..n).map(|i| Some(i * 7)).collect::<Vec<_>>());
        let estimate = ints_of(&states_of(&spec, &[large], &vec![0; n as usize]).finalize().unwrap())[0].unwrap();
        assert!((estimate as f64 / n as f64 - 1.0).abs() < 0.05, "{estimate}");
    }
}
