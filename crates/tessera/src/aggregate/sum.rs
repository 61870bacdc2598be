//! SUM and AVG: exact 128-bit sums of integers, and exact sums of doubles rounded once when
//! read (the same bits whatever the order rows and partial states came in), with a count of
//! values per slot. Both are taken away again exactly when a hopping window slides.

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use super::columns::{check, each_pair, each_valid, nulls_of, primitive, same, validity, values_of};
use super::exact_sum::ExactSums;
use super::{AggregateFunction, AggregateSpec, GroupStates, InvertibleStates, ValueKind};
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

pub(super) const SUM: Sum = Sum { name: "sum", avg: false };
pub(super) const AVG: Sum = Sum { name: "avg", avg: true };

#[derive(Debug)]
pub(super) struct Sum {
    name: &'static str,
    /// AVG: the sum divided by the count.
    avg: bool,
}

impl AggregateFunction for Sum {
    fn name(&self) -> &'static str {
        self.name
    }

    fn answers(&self, name: &str, _counts_rows: bool) -> bool {
        name == self.name() || (self.avg && name == "mean")
    }

    fn sharing(&self) -> Sharing {
        Sharing::PartitionedBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        match value_type {
            Some(t) if t.is_integer() || t.is_null() => Ok(ValueKind::Int),
            Some(t) if t.is_numeric() => Ok(ValueKind::Float),
            _ => Err("a numeric argument".into()),
        }
    }

    fn has_exact_inverse(&self) -> bool {
        true
    }

    fn new_states(&self, spec: &AggregateSpec) -> Box<dyn GroupStates> {
        match spec.kind {
            ValueKind::Int => Box::new(IntSums { avg: self.avg, sums: Vec::new(), counts: Vec::new() }),
            _ => Box::new(FloatSums { avg: self.avg, sums: ExactSums::default(), counts: Vec::new() }),
        }
    }
}

/// SUM or AVG of integers: exact 128-bit sums.
#[derive(Clone)]
struct IntSums {
    avg: bool,
    sums: Vec<i128>,
    counts: Vec<i64>,
}

impl GroupStates for IntSums {
    fn len(&self) -> usize {
        self.counts.len()
    }

    fn resize(&mut self, n: usize) {
        self.sums.resize(n, 0);
        self.counts.resize(n, 0);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let (sums, counts) = (self.sums.as_mut_slice(), self.counts.as_mut_slice());
        each_valid(values_of::<Int64Type>(&args[0]), nulls_of(&args[0]), offset, slots, |v, s| {
            sums[s] += v as i128;
            counts[s] += 1;
        });
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        self.add_exactly(other, src, dst, false)
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        let other = same::<IntSums>(other)?;
        self.sums.extend_from_slice(&other.sums);
        self.counts.extend_from_slice(&other.counts);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<IntSums>(other) else { return false };
        self.avg = other.avg;
        self.sums.clone_from(&other.sums);
        self.counts.clone_from(&other.counts);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        let nulls = validity(&self.counts, |c| c > 0);
        if self.avg {
            let averages = self.sums.iter().zip(&self.counts).map(|(&s, &c)| s as f64 / c.max(1) as f64);
            return Ok(primitive::<Float64Type>(averages.collect(), nulls));
        }
        let sums = self
            .sums
            .iter()
            .map(|&s| i64::try_from(s).map_err(|_| TesseraError::Execution(format!("sum {s} overflows BIGINT"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(primitive::<Int64Type>(sums, nulls))
    }

    fn encode(&self, w: &mut StateWriter) {
        w.i128s(&self.sums);
        w.i64s(&self.counts);
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        (self.sums, self.counts) = (r.i128s()?, r.i64s()?);
        check(self.sums.len() == self.counts.len())
    }

    fn bytes(&self) -> usize {
        self.len() * 24
    }

    fn invertible(&mut self) -> Option<&mut dyn InvertibleStates> {
        Some(self)
    }
}

impl InvertibleStates for IntSums {
    fn add_exactly(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32], subtract: bool) -> Result<()> {
        let other = same::<IntSums>(other)?;
        let sign = if subtract { -1 } else { 1 };
        let (sums, counts) = (self.sums.as_mut_slice(), self.counts.as_mut_slice());
        each_pair(src, dst, |i, d| {
            sums[d] += i128::from(sign) * other.sums[i];
            counts[d] += sign * other.counts[i];
        });
        Ok(())
    }
}

/// SUM or AVG of doubles: exact sums, rounded once when read.
#[derive(Clone)]
struct FloatSums {
    avg: bool,
    sums: ExactSums,
    counts: Vec<i64>,
}

impl GroupStates for FloatSums {
    fn len(&self) -> usize {
        self.counts.len()
    }

    fn resize(&mut self, n: usize) {
        self.sums.resize(n);
        self.counts.resize(n, 0);
    }

    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]) {
        let (sums, counts) = (&mut self.sums, self.counts.as_mut_slice());
        each_valid(values_of::<Float64Type>(&args[0]), nulls_of(&args[0]), offset, slots, |v, s| {
            sums.add(s, v);
            counts[s] += 1;
        });
    }

    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()> {
        self.add_exactly(other, src, dst, false)
    }

    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()> {
        let other = same::<FloatSums>(other)?;
        self.sums.extend_from(&other.sums);
        self.counts.extend_from_slice(&other.counts);
        Ok(())
    }

    fn copy_from(&mut self, other: &dyn GroupStates) -> bool {
        let Ok(other) = same::<FloatSums>(other) else { return false };
        self.avg = other.avg;
        self.sums.clone_from(&other.sums);
        self.counts.clone_from(&other.counts);
        true
    }

    fn finalize(&self) -> Result<ArrayRef> {
        let divisor = |c: i64| if self.avg { c.max(1) as f64 } else { 1.0 };
        let values = self.counts.iter().enumerate().map(|(slot, &c)| self.sums.value(slot) / divisor(c)).collect();
        Ok(primitive::<Float64Type>(values, validity(&self.counts, |c| c > 0)))
    }

    fn encode(&self, w: &mut StateWriter) {
        self.sums.encode(w);
        w.i64s(&self.counts);
    }

    fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        (self.sums, self.counts) = (ExactSums::decode(r)?, r.i64s()?);
        check(self.sums.len() == self.counts.len())
    }

    fn bytes(&self) -> usize {
        self.sums.bytes() + self.len() * 8
    }

    fn invertible(&mut self) -> Option<&mut dyn InvertibleStates> {
        Some(self)
    }
}

impl InvertibleStates for FloatSums {
    fn add_exactly(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32], subtract: bool) -> Result<()> {
        let other = same::<FloatSums>(other)?;
        let sign = if subtract { -1 } else { 1 };
        let (sums, counts) = (&mut self.sums, self.counts.as_mut_slice());
        each_pair(src, dst, |i, d| {
            sums.add_slot(d, &other.sums, i, subtract);
            counts[d] += sign * other.counts[i];
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};

    use super::super::tests::{floats, ints, spec, states_of};
    use super::*;

    #[test]
    fn sum_overflow_is_an_error_not_a_wrap() {
        let spec = spec("sum", Some(DataType::Int64), None);
        let states = states_of(&spec, &[ints(&[Some(i64::MAX), Some(1)])], &[0, 0]);
        assert!(states.finalize().is_err());
    }

    #[test]
    fn sums_added_and_taken_away_exactly_equal_the_remaining_slices_summed_exactly() {
        let sum = spec("sum", Some(DataType::Float64), None);
        // Slices of one group with sums far apart in magnitude: a float running sum would lose
        // the small ones to the large one and keep the error after it leaves.
        let slice = |v: f64| states_of(&sum, &[floats(&[Some(v)])], &[0]);
        let values = [1e16, 0.3, 0.3, 2.0f64.powi(-60), -5.5];
        let mut window = sum.new_states();
        window.resize(1);
        let apply = |window: &mut Box<dyn GroupStates>, v: f64, subtract: bool| {
            window.invertible().expect("sums invert").add_exactly(slice(v).as_ref(), None, &[0], subtract).unwrap();
        };
        for &v in &values {
            apply(&mut window, v, false);
        }
        apply(&mut window, values[0], true);
        // What is left, summed in one state and rounded once: the same bits.
        let rest: Vec<Option<f64>> = values[1..].iter().map(|&v| Some(v)).collect();
        let direct = states_of(&sum, &[floats(&rest)], &[0; 4]);
        let value = |s: &dyn GroupStates| s.finalize().unwrap().as_primitive::<Float64Type>().value(0);
        assert_eq!(value(window.as_ref()).to_bits(), value(direct.as_ref()).to_bits());
        assert_eq!(value(window.as_ref()), -4.9);
        let float_running = values.iter().sum::<f64>() - values[0];
        assert_eq!(float_running, -6.0, "a float running sum lost 0.6 to the large slice");
        // Empty again: no values, a NULL sum.
        for &v in &values[1..] {
            apply(&mut window, v, true);
        }
        assert!(window.finalize().unwrap().is_null(0));
        // Values of any magnitude, and not finite, are taken away again exactly too.
        for v in [1e-30, 1e300, f64::NAN, f64::INFINITY] {
            apply(&mut window, v, false);
            apply(&mut window, 0.25, false);
            apply(&mut window, v, true);
            assert_eq!(value(window.as_ref()), 0.25, "{v}");
            apply(&mut window, 0.25, true);
        }
        // Counts, and states with no inverse.
        let rows = spec("count", None, None);
        let count = |n: usize| states_of(&rows, &[], &vec![0; n.max(1)]);
        let mut counted = rows.new_states();
        counted.resize(1);
        counted.invertible().unwrap().add_exactly(count(5).as_ref(), None, &[0], false).unwrap();
        counted.invertible().unwrap().add_exactly(count(3).as_ref(), None, &[0], true).unwrap();
        assert_eq!(counted.finalize().unwrap().as_primitive::<Int64Type>().value(0), 2);
        let mut min = spec("min", Some(DataType::Float64), None).new_states();
        assert!(min.invertible().is_none() && !super::super::min_max::MIN.has_exact_inverse());
        assert!(SUM.has_exact_inverse() && super::super::count::COUNT_ROWS.has_exact_inverse());
    }
}
