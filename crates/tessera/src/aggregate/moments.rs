//! VAR_SAMP and STDDEV_SAMP: count, mean and sum of squared deviations per slot, updated by
//! Welford's method and merged with Chan et al.'s formula (so results depend, in the last
//! bits, on the order partial states are merged in).

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Float64Type};

use super::columns::{check, each_pair, each_valid, nulls_of, primitive, same, validity, values_of};
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const VAR_SAMP: Spread = Spread { name: "var_samp", stddev: false };
pub(super) const STDDEV_SAMP: Spread = Spread { name: "stddev_samp", stddev: true };

#[derive(Debug)]
pub(super) struct Spread {
    name: &'static str,
    /// The square root of the variance.
    stddev: bool,
}

impl AggregateFunction for Spread {
    fn name(&self) -> &'static str {
        self.name
    }

    fn answers(&self, name: &str, _counts_rows: bool) -> bool {
        name == self.name() || name == if self.stddev { "stddev" } else { "var" }
    }

    fn sharing(&self) -> Sharing {
        Sharing::PartitionedBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        ValueKind::of_number(value_type, ValueKind::Float)
    }

    fn new_states(&self, _spec: &AggregateSpec) -> Box<dyn GroupStates> {
        Box::new(Moments { stddev: self.stddev, counts: Vec::new(), means: Vec::new(), m2s: Vec::new() })
    }
}

#[derive(Clone)]
struct Moments {
    stddev: bool,
    counts: Vec<i64>,
    means: Vec<f64>,
    m2s: Vec<f64>,
}

impl GroupStates for Moments {
    fn len(&self) -> usize {
        self.counts.len()
    }

    fn resize(&mut self, n: usize) {
        self.counts.resize(n, 0);
        self.means.resize(n, 0.0);
        self.m2s.resize(n, 0.0);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let (counts, means, m2s) = (self.counts.as_mut_slice(), self.means.as_mut_slice(), self.m2s.as_mut_slice());
        each_valid(values_of::<Float64Type>(&args[0]), nulls_of(&args[0]), offset, slots, |x, s| {
            counts[s] += 1;
            let delta = x - means[s];
            means[s] += delta / counts[s] as f64;
            m2s[s] += delta * (x - means[s]);
        });
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        let other = same::<Moments>(other)?;
        let (counts, means, m2s) = (self.counts.as_mut_slice(), self.means.as_mut_slice(), self.m2s.as_mut_slice());
        each_pair(src, dst, |i, d| {
            if other.counts[i] == 0 {
                return;
            }
            let (n_a, n_b) = (counts[d] as f64, other.counts[i] as f64);
            let n = n_a + n_b;
            let delta = other.means[i] - means[d];
            means[d] += delta * n_b / n;
            m2s[d] += other.m2s[i] + delta * delta * n_a * n_b / n;
            counts[d] += other.counts[i];
        });
        Ok(())
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        let other = same::<Moments>(other)?;
        self.counts.extend_from_slice(&other.counts);
        self.means.extend_from_slice(&other.means);
        self.m2s.extend_from_slice(&other.m2s);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<Moments>(other) else { return false };
        self.clone_from(other);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        let spread = self.counts.iter().zip(&self.m2s).map(|(&c, &m2)| {
            let var = (m2 / (c - 1).max(1) as f64).max(0.0);
            if self.stddev {
                var.sqrt()
            } else {
                var
            }
        });
        Ok(primitive::<Float64Type>(spread.collect(), validity(&self.counts, |c| c > 1)))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.i64s(&self.counts);
        w.f64s(&self.means);
        w.f64s(&self.m2s);
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        (self.counts, self.means, self.m2s) = (r.i64s()?, r.f64s()?, r.f64s()?);
        check(self.counts.len() == self.means.len() && self.means.len() == self.m2s.len())
    }

    fn bytes(&self) -> usize {
        self.len() * 24
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;

    use super::super::tests::{floats, spec, states_of};
    use super::*;

    #[test]
    fn merged_moments_equal_direct_moments() {
        let spec = spec("var_samp", Some(DataType::Float64), None);
        let data: Vec<Option<f64>> = (0..50).map(|i| Some((i * 37 % 11) as f64 * 1.5 - 3.0)).collect();
        let direct = states_of(&spec, &[floats(&data)], &[0; 50]).finalize().unwrap();
        let mut a = states_of(&spec, &[floats(&data[..20])], &[0; 20]);
        let b = states_of(&spec, &[floats(&data[20..])], &[0; 30]);
        a.merge(b.as_ref(), None, &[0]).unwrap();
        let merged = a.finalize().unwrap();
        let (d, m) = (direct.as_primitive::<Float64Type>().value(0), merged.as_primitive::<Float64Type>().value(0));
        assert!((d - m).abs() < 1e-9, "{d} vs {m}");
    }
}
