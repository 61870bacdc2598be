//! APPROX_PERCENTILE_CONT(x, p) and APPROX_MEDIAN(x) on a DDSketch per slot (the
//! `sketches-ddsketch` crate): logarithmic buckets of relative width 1% counted exactly, so
//! sketches merge by adding counts, in any order, to the same bits; windows share them
//! through slices and the coverage graph as they share SUM.
//!
//! **Error bound.** The answer interpolates, as `quantile_cont` does, between the values at
//! ranks `floor(p(n-1))` and `ceil(p(n-1))`; each of the two is estimated within 1% of its
//! exact value (values of magnitude below 1e-9 count as 0), so the answer is within 1% of the
//! larger magnitude of the two exact values. The smallest and largest values are exact. A
//! sketch keeps 2,048 buckets: values of one group spanning more than 17 orders of magnitude
//! merge their smallest buckets and lose the bound there. Infinities and NaN are counted
//! apart and ranked as SQL orders them (-inf first, NaN last).

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array};
use arrow::datatypes::{DataType, Float64Type};
use datafusion_common::ScalarValue;
use sketches_ddsketch::{Config, DDSketch};

use super::columns::{each_pair, each_valid, mismatch, nulls_of, same, values_of};
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const APPROX_PERCENTILE_CONT: ApproxPercentile =
    ApproxPercentile { name: "approx_percentile_cont", median: false };
pub(super) const APPROX_MEDIAN: ApproxPercentile = ApproxPercentile { name: "approx_median", median: true };

#[derive(Debug)]
pub(super) struct ApproxPercentile {
    name: &'static str,
    /// APPROX_MEDIAN: the 50th percentile.
    median: bool,
}

impl AggregateFunction for ApproxPercentile {
    fn name(&self) -> &'static str {
        self.name
    }

    fn sharing(&self) -> Sharing {
        Sharing::PartitionedBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_number(value_type, ValueKind::Float)
    }

    fn parameter(&self, literals: &[Option<ScalarValue>]) -> std::result::Result<Option<f64>, String> {
        let percentile = match (self.median, literals) {
            (true, []) => return Ok(Some(0.5)),
            (false, [Some(p)]) => p.clone().cast_to(&DataType::Float64).ok().and_then(|p| match p {
                ScalarValue::Float64(p) => p,
                _ => None,
            }),
            (false, [None]) => None,
            (true, _) => return Err("takes one argument".into()),
            (false, _) => return Err("takes a value and a percentile".into()),
        };
        match percentile {
            Some(p) if (0.0..=1.0).contains(&p) => Ok(Some(p)),
            _ => Err("takes a percentile that is a number from 0 to 1 written as a literal".into()),
        }
    }

    fn new_states(&self, spec: &AggregateSpec) -> Box<dyn GroupStates> {
        Box::new(Sketches { percentile: spec.parameter.unwrap_or(0.5), sketches: Vec::new() })
    }
}

/// The values of one group: a sketch of the finite ones, counts of the others.
#[derive(Clone)]
struct Sketch {
    finite: DDSketch,
    negative_infinities: u64,
    positive_infinities: u64,
    nans: u64,
}

impl Sketch {
    fn new() -> Self {
        Sketch { finite: DDSketch::new(Config::defaults()), negative_infinities: 0, positive_infinities: 0, nans: 0 }
    }

    fn add(&mut self, value: f64) {
        match value {
            v if v.is_finite() => self.finite.add(v),
            v if v.is_nan() => self.nans += 1,
            v if v < 0.0 => self.negative_infinities += 1,
            _ => self.positive_infinities += 1,
        }
    }

    fn merge(&mut self, other: &Sketch) -> Result<()> {
        self.finite.merge(&other.finite).map_err(|e| TesseraError::Internal(format!("merging sketches: {e}")))?;
        self.negative_infinities += other.negative_infinities;
        self.positive_infinities += other.positive_infinities;
        self.nans += other.nans;
        Ok(())
    }

    fn count(&self) -> u64 {
        self.finite.count() as u64 + self.negative_infinities + self.positive_infinities + self.nans
    }

    /// The estimated value at `rank` (from 0) in SQL's order.
    fn at_rank(&self, rank: u64) -> f64 {
        let finite = self.finite.count() as u64;
        let Some(rank) = rank.checked_sub(self.negative_infinities) else { return f64::NEG_INFINITY };
        if rank >= finite {
            return if rank - finite < self.positive_infinities { f64::INFINITY } else { f64::NAN };
        }
        let (min, max) = (self.finite.min().unwrap_or(0.0), self.finite.max().unwrap_or(0.0));
        if rank == 0 {
            return min;
        }
        if rank == finite - 1 {
            return max;
        }
        // The sketch's rank of `q` is `floor(q (n - 1))`: aim at the middle of the rank.
        let q = (rank as f64 + 0.5) / (finite - 1) as f64;
        self.finite.quantile(q).ok().flatten().unwrap_or(min).clamp(min, max)
    }

    /// The `percentile` interpolated between the ranks around it, as `quantile_cont` does.
    fn percentile(&self, percentile: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let position = percentile * (n - 1) as f64;
        let (below, above) = (position.floor(), position.ceil());
        let low = self.at_rank(below as u64);
        if below == above {
            return Some(low);
        }
        let high = self.at_rank(above as u64);
        Some(low + (position - below) * (high - low))
    }

    fn bytes(&self) -> usize {
        std::mem::size_of::<Sketch>() + self.finite.length() * 8
    }
}

#[derive(Clone)]
struct Sketches {
    percentile: f64,
    sketches: Vec<Option<Box<Sketch>>>,
}

impl GroupStates for Sketches {
    fn len(&self) -> usize {
        self.sketches.len()
    }

    fn resize(&mut self, n: usize) {
        self.sketches.resize(n, None);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let sketches = &mut self.sketches;
        each_valid(values_of::<Float64Type>(&args[0]), nulls_of(&args[0]), offset, slots, |v, s| {
            sketches[s].get_or_insert_with(|| Box::new(Sketch::new())).add(v)
        });
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<Sketches>(other)?;
        let mut merged = Ok(());
        each_pair(src, dst, |i, d| {
            if let Some(theirs) = &other.sketches[i] {
                match &mut self.sketches[d] {
                    Some(mine) => merged = std::mem::replace(&mut merged, Ok(())).and(mine.merge(theirs)),
                    empty => *empty = Some(theirs.clone()),
                }
            }
        });
        merged
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        self.sketches.extend_from_slice(&same::<Sketches>(other)?.sketches);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<Sketches>(other) else { return false };
        self.clone_from(other);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        let values = self.sketches.iter().map(|s| s.as_ref().and_then(|s| s.percentile(self.percentile)));
        Ok(Arc::new(Float64Array::from_iter(values)))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.len(self.sketches.len());
        for sketch in &self.sketches {
            w.bool(sketch.is_some());
            if let Some(sketch) = sketch {
                // The DDSketch binary format (as the Java and Go libraries write it).
                w.bytes(&sketch.finite.to_java_bytes());
                for count in [sketch.negative_infinities, sketch.positive_infinities, sketch.nans] {
                    w.u64(count);
                }
            }
        }
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        let n = r.len(1)?;
        self.sketches = (0..n)
            .map(|_| {
                if !r.bool()? {
                    return Ok(None);
                }
                let finite = DDSketch::from_java_bytes(r.bytes()?).map_err(|_| mismatch())?;
                let (negative_infinities, positive_infinities, nans) = (r.u64()?, r.u64()?, r.u64()?);
                Ok(Some(Box::new(Sketch { finite, negative_infinities, positive_infinities, nans })))
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.sketches.iter().map(|s| 8 + s.as_ref().map_or(0, |s| s.bytes())).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{floats, floats_of, round_trip, spec, states_of};
    use super::*;

    /// The sketches' relative accuracy (that of `Config::defaults()`, which their codec
    /// assumes).
    const RELATIVE_ERROR: f64 = 0.01;

    /// The exact `quantile_cont` of `values` (sorted as SQL sorts floats) and the bound the
    /// sketch promises around it.
    fn exact_and_bound(values: &[f64], p: f64) -> (f64, f64) {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let position = p * (sorted.len() - 1) as f64;
        let (low, high) = (sorted[position.floor() as usize], sorted[position.ceil() as usize]);
        let exact = if low == high { low } else { low + (position - position.floor()) * (high - low) };
        (exact, RELATIVE_ERROR * low.abs().max(high.abs()) + 1e-9)
    }

    /// Random values of many magnitudes and signs, in random slots, updated in runs, merged in
    /// random orders and through the codec: every group's estimate is within the documented
    /// bound of the exact percentile, and the same bits whatever the merge order.
    #[test]
    fn estimates_are_within_the_documented_bound_and_independent_of_merge_order() {
        let mut rng = crate::window::generators::SplitMix::new(17);
        for case in 0..200 {
            let n = 1 + (rng.next_u64() % 400) as usize;
            let scale = 10f64.powi((rng.next_u64() % 13) as i32 - 6);
            let values: Vec<f64> = (0..n)
                .map(|_| {
                    let magnitude = (rng.next_u64() % 1_000_000) as f64 / 1000.0 * scale;
                    if rng.next_u64().is_multiple_of(5) {
                        -magnitude
                    } else {
                        magnitude
                    }
                })
                .collect();
            let groups = 1 + (rng.next_u64() % 3) as u32;
            let slots: Vec<u32> = (0..n).map(|_| (rng.next_u64() % u64::from(groups)) as u32).collect();
            let p = [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0][case % 7];
            let spec = spec("approx_percentile_cont", Some(DataType::Float64), Some(p));
            let column = floats(&values.iter().map(|&v| Some(v)).collect::<Vec<_>>());
            // In parts of random lengths, merged forwards and (through the codec) backwards.
            let cuts: Vec<usize> = {
                let mut c: Vec<usize> = (0..3).map(|_| (rng.next_u64() % (n as u64 + 1)) as usize).collect();
                c.extend([0, n]);
                c.sort_unstable();
                c
            };
            let parts: Vec<Box<dyn GroupStates>> = cuts
                .windows(2)
                .map(|w| {
                    let mut s = spec.new_states();
                    s.resize(groups as usize);
                    s.update(std::slice::from_ref(&column), w[0], &slots[w[0]..w[1]]);
                    s
                })
                .collect();
            let all: Vec<u32> = (0..groups).collect();
            let merged = |order: &mut dyn Iterator<Item = &Box<dyn GroupStates>>| {
                let mut window = spec.new_states();
                window.resize(groups as usize);
                order.for_each(|part| window.merge(round_trip(&spec, part.as_ref()).as_ref(), None, &all).unwrap());
                floats_of(&window.finalize().unwrap())
            };
            let forwards = merged(&mut parts.iter());
            assert_eq!(forwards, merged(&mut parts.iter().rev()), "case {case}");
            let direct = floats_of(&states_of(&spec, std::slice::from_ref(&column), &slots).finalize().unwrap());
            for g in 0..groups as usize {
                let group: Vec<f64> = (0..n).filter(|&r| slots[r] as usize == g).map(|r| values[r]).collect();
                if group.is_empty() {
                    assert_eq!(forwards[g], None);
                    continue;
                }
                let (exact, bound) = exact_and_bound(&group, p);
                let estimate = forwards[g].expect("a value");
                assert_eq!(Some(estimate.to_bits()), direct[g].map(f64::to_bits), "case {case}");
                assert!((estimate - exact).abs() <= bound, "case {case}: p {p}, {estimate} vs {exact} ± {bound}");
            }
        }
    }

    #[test]
    fn extremes_are_exact_and_infinities_and_nan_rank_as_sql_orders_them() {
        let values =
            [Some(3.0), Some(f64::NAN), Some(-2.5), None, Some(f64::INFINITY), Some(f64::NEG_INFINITY), Some(7.25)];
        let at = |p: f64| {
            let spec = spec("approx_percentile_cont", Some(DataType::Float64), Some(p));
            floats_of(&states_of(&spec, &[floats(&values)], &[0; 7]).finalize().unwrap())[0].unwrap()
        };
        // Sorted: -inf, -2.5, 3, 7.25, inf, NaN.
        assert_eq!(at(0.0), f64::NEG_INFINITY);
        assert_eq!(at(0.2), -2.5);
        assert_eq!(at(0.6), 7.25);
        assert_eq!(at(0.8), f64::INFINITY);
        assert!(at(1.0).is_nan());
        let median = spec("approx_median", Some(DataType::Float64), None);
        let only = floats_of(&states_of(&median, &[floats(&[Some(-4.5), None])], &[0, 1]).finalize().unwrap());
        assert_eq!(only, [Some(-4.5), None]);
    }

    #[test]
    fn the_percentile_is_a_literal_from_0_to_1() {
        let f = APPROX_PERCENTILE_CONT;
        assert_eq!(f.parameter(&[Some(ScalarValue::Float64(Some(0.25)))]), Ok(Some(0.25)));
        assert_eq!(f.parameter(&[Some(ScalarValue::Int64(Some(1)))]), Ok(Some(1.0)));
        assert!(f.parameter(&[Some(ScalarValue::Float64(Some(1.5)))]).is_err());
        assert!(f.parameter(&[None]).is_err());
        assert!(f.parameter(&[]).is_err());
        assert_eq!(APPROX_MEDIAN.parameter(&[]), Ok(Some(0.5)));
    }
}
