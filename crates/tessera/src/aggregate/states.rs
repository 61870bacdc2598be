//! Columnar partial states of one aggregate for many groups (slots).

use std::sync::Arc;

use super::exact_sum::ExactSums;
use super::hll::HyperLogLog;
use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, PrimitiveArray, StringArray};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::datatypes::{ArrowPrimitiveType, Float64Type, Int64Type, UInt32Type};
use hashbrown::HashSet;

use super::{AggregateFunction, ValueKind};
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};

/// Distinct-count state of one group: exact hashes while few, a HyperLogLog sketch beyond.
#[derive(Clone)]
pub enum DistinctSketch {
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
                    let mut hll = Box::new(HyperLogLog::new());
                    set.iter().for_each(|h| hll.add(*h));
                    *self = DistinctSketch::Sketch(hll);
                }
            }
            DistinctSketch::Sketch(hll) => hll.add(hash),
        }
    }

    fn merge(&mut self, other: &DistinctSketch) {
        match other {
            DistinctSketch::Exact(set) => set.iter().for_each(|h| self.insert(*h)),
            DistinctSketch::Sketch(other_hll) => {
                if let DistinctSketch::Exact(set) = self {
                    let mut hll = Box::new(HyperLogLog::new());
                    set.iter().for_each(|h| hll.add(*h));
                    *self = DistinctSketch::Sketch(hll);
                }
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

/// Partial states of one aggregate, one entry per group slot.
#[derive(Clone)]
pub enum GroupStates {
    /// MIN or MAX of integers, or of floats as their total-order keys (`float_key`). A slot
    /// without a value holds the identity (`i64::MAX` for MIN, `i64::MIN` for MAX), so taking
    /// a value is one branchless min or max, in updates and merges alike.
    MinMax {
        max: bool,
        float: bool,
        values: Vec<i64>,
        seen: Vec<bool>,
    },
    MinMaxUtf8 {
        max: bool,
        values: Vec<Option<Box<str>>>,
    },
    /// SUM or AVG of integers: exact 128-bit sums.
    SumInt {
        avg: bool,
        sums: Vec<i128>,
        counts: Vec<i64>,
    },
    /// SUM or AVG of doubles: exact sums, rounded once when read (the same bits whatever the
    /// order rows and partial states came in).
    SumFloat {
        avg: bool,
        sums: ExactSums,
        counts: Vec<i64>,
    },
    /// COUNT(x) (with values) or COUNT(*) (without).
    Count {
        counts: Vec<i64>,
    },
    /// VAR_SAMP / STDDEV_SAMP by Welford's method, merged with Chan et al.'s formula.
    Moments {
        stddev: bool,
        counts: Vec<i64>,
        means: Vec<f64>,
        m2s: Vec<f64>,
    },
    Median {
        values: Vec<Vec<f64>>,
    },
    Distinct {
        sketches: Vec<DistinctSketch>,
    },
}

impl GroupStates {
    pub fn new(function: AggregateFunction, kind: ValueKind) -> Self {
        use AggregateFunction as F;
        match (function, kind) {
            (F::Min | F::Max, ValueKind::Int | ValueKind::Float) => GroupStates::MinMax {
                max: function == F::Max,
                float: kind == ValueKind::Float,
                values: vec![],
                seen: vec![],
            },
            (F::Min | F::Max, ValueKind::Utf8) => GroupStates::MinMaxUtf8 { max: function == F::Max, values: vec![] },
            (F::Sum | F::Avg, ValueKind::Int) => {
                GroupStates::SumInt { avg: function == F::Avg, sums: vec![], counts: vec![] }
            }
            (F::Sum | F::Avg, _) => {
                GroupStates::SumFloat { avg: function == F::Avg, sums: ExactSums::default(), counts: vec![] }
            }
            (F::Count | F::CountRows, _) => GroupStates::Count { counts: vec![] },
            (F::VarSamp | F::StddevSamp, _) => {
                GroupStates::Moments { stddev: function == F::StddevSamp, counts: vec![], means: vec![], m2s: vec![] }
            }
            (F::Median, _) => GroupStates::Median { values: vec![] },
            (F::ApproxCountDistinct, _) => GroupStates::Distinct { sketches: vec![] },
        }
    }

    /// Makes these states a copy of `other`, reusing their buffers when both are of the same
    /// kind (a table taking a copy of another for every emitted instance allocates nothing).
    pub fn copy_from(&mut self, other: &GroupStates) {
        use GroupStates as S;
        match (self, other) {
            (S::MinMax { max, float, values, seen }, S::MinMax { max: m, float: f, values: v, seen: s }) => {
                (*max, *float) = (*m, *f);
                values.clone_from(v);
                seen.clone_from(s);
            }
            (S::SumFloat { avg, sums, counts }, S::SumFloat { avg: a, sums: s, counts: c }) => {
                *avg = *a;
                sums.clone_from(s);
                counts.clone_from(c);
            }
            (S::SumInt { avg, sums, counts }, S::SumInt { avg: a, sums: s, counts: c }) => {
                *avg = *a;
                sums.clone_from(s);
                counts.clone_from(c);
            }
            (S::Count { counts }, S::Count { counts: c }) => counts.clone_from(c),
            (me, other) => *me = other.clone(),
        }
    }

    /// Appends the slots of `other`, states of the same aggregate, after these.
    pub fn extend_from(&mut self, other: &GroupStates) -> Result<()> {
        use GroupStates as S;
        match (self, other) {
            (S::MinMax { values, seen, .. }, S::MinMax { values: v, seen: s, .. }) => {
                values.extend_from_slice(v);
                seen.extend_from_slice(s);
            }
            (S::MinMaxUtf8 { values, .. }, S::MinMaxUtf8 { values: v, .. }) => values.extend_from_slice(v),
            (S::SumInt { sums, counts, .. }, S::SumInt { sums: s, counts: c, .. }) => {
                sums.extend_from_slice(s);
                counts.extend_from_slice(c);
            }
            (S::SumFloat { sums, counts, .. }, S::SumFloat { sums: s, counts: c, .. }) => {
                sums.extend_from(s);
                counts.extend_from_slice(c);
            }
            (S::Count { counts }, S::Count { counts: c }) => counts.extend_from_slice(c),
            (S::Moments { counts, means, m2s, .. }, S::Moments { counts: c, means: m, m2s: m2, .. }) => {
                counts.extend_from_slice(c);
                means.extend_from_slice(m);
                m2s.extend_from_slice(m2);
            }
            (S::Median { values }, S::Median { values: v }) => values.extend_from_slice(v),
            (S::Distinct { sketches }, S::Distinct { sketches: s }) => sketches.extend_from_slice(s),
            _ => return Err(TesseraError::Internal("states of different aggregates appended".into())),
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        match self {
            GroupStates::MinMax { values, .. } => values.len(),
            GroupStates::MinMaxUtf8 { values, .. } => values.len(),
            GroupStates::SumInt { counts, .. } | GroupStates::SumFloat { counts, .. } => counts.len(),
            GroupStates::Count { counts } | GroupStates::Moments { counts, .. } => counts.len(),
            GroupStates::Median { values } => values.len(),
            GroupStates::Distinct { sketches } => sketches.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Grows the state to `n` slots, new slots empty.
    pub fn resize(&mut self, n: usize) {
        match self {
            GroupStates::MinMax { max, values, seen, .. } => {
                values.resize(n, min_max_identity(*max));
                seen.resize(n, false);
            }
            GroupStates::MinMaxUtf8 { values, .. } => values.resize(n, None),
            GroupStates::SumInt { sums, counts, .. } => {
                sums.resize(n, 0);
                counts.resize(n, 0);
            }
            GroupStates::SumFloat { sums, counts, .. } => {
                sums.resize(n);
                counts.resize(n, 0);
            }
            GroupStates::Count { counts } => counts.resize(n, 0),
            GroupStates::Moments { counts, means, m2s, .. } => {
                counts.resize(n, 0);
                means.resize(n, 0.0);
                m2s.resize(n, 0.0);
            }
            GroupStates::Median { values } => values.resize_with(n, Vec::new),
            GroupStates::Distinct { sketches } => sketches.resize_with(n, || DistinctSketch::Exact(HashSet::new())),
        }
    }

    /// Whether states of `function` over `kind` take their argument as a dictionary array,
    /// looking each row's value up (every state but those of strings and sketches, which would
    /// have every value materialized anyway).
    pub fn read_dictionaries(function: AggregateFunction, kind: ValueKind) -> bool {
        kind != ValueKind::Utf8 && function != AggregateFunction::ApproxCountDistinct
    }

    /// Adds `values[offset + i]` to slot `slots[i]` for every `i`: a run of consecutive rows.
    /// `values` is the argument cast to the state's domain (a dictionary of such values where
    /// [`read_dictionaries`](Self::read_dictionaries) says so), `None` for `COUNT(*)`. Slots
    /// must exist (see `resize`).
    pub fn update(&mut self, values: Option<&ArrayRef>, offset: usize, slots: &[u32]) {
        let rows = offset as u32..(offset + slots.len()) as u32;
        let Some(values) = values else {
            if let GroupStates::Count { counts } = self {
                let counts = counts.as_mut_slice();
                slots.iter().for_each(|&s| counts[s as usize] += 1);
            }
            return;
        };
        let valid = |r: u32| values.is_valid(r as usize);
        let has_nulls = values.null_count() > 0;
        let nulls = values.nulls().filter(|_| has_nulls);
        match self {
            GroupStates::MinMax { max, float: false, values: state, seen } => {
                keep_best(values_of::<Int64Type>(values), nulls, offset, slots, (state, seen), *max, |v| v);
            }
            GroupStates::MinMax { max, float: true, values: state, seen } => {
                keep_best(values_of::<Float64Type>(values), nulls, offset, slots, (state, seen), *max, float_key);
            }
            GroupStates::MinMaxUtf8 { max, values: state } => {
                let input = values.as_string::<i32>();
                for (r, &s) in rows.clone().zip(slots) {
                    if !input.is_valid(r as usize) {
                        continue;
                    }
                    let v = input.value(r as usize);
                    let slot = &mut state[s as usize];
                    let replace = match slot {
                        None => true,
                        Some(cur) => (*max && v > &**cur) || (!*max && v < &**cur),
                    };
                    if replace {
                        *slot = Some(v.into());
                    }
                }
            }
            GroupStates::SumInt { sums, counts, .. } => {
                let (sums, counts) = (sums.as_mut_slice(), counts.as_mut_slice());
                each_valid(values_of::<Int64Type>(values), nulls, offset, slots, |v, s| {
                    sums[s] += v as i128;
                    counts[s] += 1;
                });
            }
            GroupStates::SumFloat { sums, counts, .. } => {
                let counts = counts.as_mut_slice();
                each_valid(values_of::<Float64Type>(values), nulls, offset, slots, |v, s| {
                    sums.add(s, v);
                    counts[s] += 1;
                });
            }
            GroupStates::Count { counts } => {
                let counts = counts.as_mut_slice();
                for (r, &s) in rows.clone().zip(slots) {
                    counts[s as usize] += i64::from(!has_nulls || valid(r));
                }
            }
            GroupStates::Moments { counts, means, m2s, .. } => {
                let (counts, means, m2s) = (counts.as_mut_slice(), means.as_mut_slice(), m2s.as_mut_slice());
                each_valid(values_of::<Float64Type>(values), nulls, offset, slots, |x, s| {
                    counts[s] += 1;
                    let delta = x - means[s];
                    means[s] += delta / counts[s] as f64;
                    m2s[s] += delta * (x - means[s]);
                });
            }
            GroupStates::Median { values: state } => {
                each_valid(values_of::<Float64Type>(values), nulls, offset, slots, |v, s| state[s].push(v));
            }
            GroupStates::Distinct { sketches } => {
                // One hash per distinct SQL value (the same value always lands on the same
                // hash), for the run's rows only.
                let run = values.slice(offset, slots.len());
                let mut hashes = vec![0u64; slots.len()];
                let _ = datafusion_common::hash_utils::create_hashes(
                    [&run],
                    &datafusion_common::hash_utils::RandomState::with_seed(0x7e55e7a),
                    &mut hashes,
                );
                let nulls = run.nulls().filter(|_| has_nulls);
                each_valid(Values::Column(&hashes), nulls, 0, slots, |hash, s| sketches[s].insert(hash));
            }
        }
    }

    /// Writes the states' values (their function and domain are the plan's, not written).
    pub fn encode(&self, w: &mut StateWriter) {
        match self {
            GroupStates::MinMax { float: false, values, seen, .. } => {
                w.i64s(values);
                w.bools(seen);
            }
            GroupStates::MinMax { float: true, values, seen, .. } => {
                w.f64s(&values.iter().map(|&k| float_of_key(k)).collect::<Vec<_>>());
                w.bools(seen);
            }
            GroupStates::MinMaxUtf8 { values, .. } => {
                w.len(values.len());
                for value in values {
                    w.bool(value.is_some());
                    if let Some(value) = value {
                        w.str(value);
                    }
                }
            }
            GroupStates::SumInt { sums, counts, .. } => {
                w.i128s(sums);
                w.i64s(counts);
            }
            GroupStates::SumFloat { sums, counts, .. } => {
                sums.encode(w);
                w.i64s(counts);
            }
            GroupStates::Count { counts } => w.i64s(counts),
            GroupStates::Moments { counts, means, m2s, .. } => {
                w.i64s(counts);
                w.f64s(means);
                w.f64s(m2s);
            }
            GroupStates::Median { values } => {
                w.len(values.len());
                values.iter().for_each(|v| w.f64s(v));
            }
            GroupStates::Distinct { sketches } => {
                w.len(sketches.len());
                for sketch in sketches {
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
        }
    }

    /// Reads into these (empty) states the values [`encode`](Self::encode) wrote for states of
    /// the same function and domain.
    pub fn decode(&mut self, r: &mut StateReader) -> Result<()> {
        let mismatch = || TesseraError::Checkpoint("the state snapshot does not match the plan's aggregates".into());
        match self {
            GroupStates::MinMax { max, float, values, seen } => {
                *values = if *float { r.f64s()?.into_iter().map(float_key).collect() } else { r.i64s()? };
                *seen = r.bools()?;
                (values.len() == seen.len()).then_some(()).ok_or_else(mismatch)?;
                // Slots without a value hold the identity, whatever was written for them.
                for (value, _) in values.iter_mut().zip(seen.iter()).filter(|(_, &seen)| !seen) {
                    *value = min_max_identity(*max);
                }
            }
            GroupStates::MinMaxUtf8 { values, .. } => {
                let n = r.len(1)?;
                *values = (0..n)
                    .map(|_| Ok(if r.bool()? { Some(Box::from(r.str()?)) } else { None }))
                    .collect::<Result<_>>()?;
            }
            GroupStates::SumInt { sums, counts, .. } => {
                (*sums, *counts) = (r.i128s()?, r.i64s()?);
                (sums.len() == counts.len()).then_some(()).ok_or_else(mismatch)?;
            }
            GroupStates::SumFloat { sums, counts, .. } => {
                (*sums, *counts) = (ExactSums::decode(r)?, r.i64s()?);
                (sums.len() == counts.len()).then_some(()).ok_or_else(mismatch)?;
            }
            GroupStates::Count { counts } => *counts = r.i64s()?,
            GroupStates::Moments { counts, means, m2s, .. } => {
                (*counts, *means, *m2s) = (r.i64s()?, r.f64s()?, r.f64s()?);
                (counts.len() == means.len() && means.len() == m2s.len()).then_some(()).ok_or_else(mismatch)?;
            }
            GroupStates::Median { values } => {
                let n = r.len(8)?;
                *values = (0..n).map(|_| r.f64s()).collect::<Result<_>>()?;
            }
            GroupStates::Distinct { sketches } => {
                let n = r.len(1)?;
                *sketches = (0..n)
                    .map(|_| match r.u8()? {
                        0 => Ok(DistinctSketch::Exact(r.u64s()?.into_iter().collect())),
                        1 => HyperLogLog::from_registers(r.bytes()?)
                            .map(|hll| DistinctSketch::Sketch(Box::new(hll)))
                            .ok_or_else(mismatch),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<_>>()?;
            }
        }
        Ok(())
    }

    /// Merges slot `i` of `other` into slot `dst[i]` of `self` for every slot of `other`.
    /// Both states must be of the same function and domain.
    pub fn merge(&mut self, other: &GroupStates, dst: &[u32]) -> Result<()> {
        self.merge_slots(other, dst.iter().copied().enumerate())
    }

    /// Merges slot `src[j]` of `other` into slot `dst[j]` of `self`, for every `j`.
    pub fn merge_selected(&mut self, other: &GroupStates, src: &[u32], dst: &[u32]) -> Result<()> {
        self.merge_slots(other, src.iter().map(|&s| s as usize).zip(dst.iter().copied()))
    }

    /// Merges slot `i` of `other` into slot `d` of `self` for every pair `(i, d)`.
    fn merge_slots(&mut self, other: &GroupStates, pairs: impl Iterator<Item = (usize, u32)>) -> Result<()> {
        match (self, other) {
            (GroupStates::MinMax { max, values, seen, .. }, GroupStates::MinMax { values: ov, seen: os, .. }) => {
                // A slot of `other` without a value holds the identity: no branch needed.
                if *max {
                    for (i, d) in pairs {
                        let d = d as usize;
                        values[d] = values[d].max(ov[i]);
                        seen[d] |= os[i];
                    }
                } else {
                    for (i, d) in pairs {
                        let d = d as usize;
                        values[d] = values[d].min(ov[i]);
                        seen[d] |= os[i];
                    }
                }
            }
            (GroupStates::MinMaxUtf8 { max, values }, GroupStates::MinMaxUtf8 { values: ov, .. }) => {
                for (i, d) in pairs {
                    if let Some(v) = &ov[i] {
                        let replace = match &values[d as usize] {
                            None => true,
                            Some(cur) => (*max && v > cur) || (!*max && v < cur),
                        };
                        if replace {
                            values[d as usize] = Some(v.clone());
                        }
                    }
                }
            }
            (GroupStates::SumInt { sums, counts, .. }, GroupStates::SumInt { sums: os, counts: oc, .. }) => {
                for (i, d) in pairs {
                    sums[d as usize] += os[i];
                    counts[d as usize] += oc[i];
                }
            }
            (GroupStates::SumFloat { sums, counts, .. }, GroupStates::SumFloat { sums: os, counts: oc, .. }) => {
                for (i, d) in pairs {
                    sums.add_slot(d as usize, os, i, false);
                    counts[d as usize] += oc[i];
                }
            }
            (GroupStates::Count { counts }, GroupStates::Count { counts: oc }) => {
                for (i, d) in pairs {
                    counts[d as usize] += oc[i];
                }
            }
            (
                GroupStates::Moments { counts, means, m2s, .. },
                GroupStates::Moments { counts: oc, means: om, m2s: o2, .. },
            ) => {
                for (i, d) in pairs {
                    let d = d as usize;
                    if oc[i] == 0 {
                        continue;
                    }
                    let (n_a, n_b) = (counts[d] as f64, oc[i] as f64);
                    let n = n_a + n_b;
                    let delta = om[i] - means[d];
                    means[d] += delta * n_b / n;
                    m2s[d] += o2[i] + delta * delta * n_a * n_b / n;
                    counts[d] += oc[i];
                }
            }
            (GroupStates::Median { values }, GroupStates::Median { values: ov }) => {
                for (i, d) in pairs {
                    values[d as usize].extend_from_slice(&ov[i]);
                }
            }
            (GroupStates::Distinct { sketches }, GroupStates::Distinct { sketches: os }) => {
                for (i, d) in pairs {
                    sketches[d as usize].merge(&os[i]);
                }
            }
            _ => return Err(TesseraError::Internal("merging partial states of different aggregates".into())),
        }
        Ok(())
    }

    /// Whether slots of these states can be taken away again exactly (see
    /// [`add_exactly`](Self::add_exactly)): COUNT, SUM and AVG.
    pub fn has_exact_inverse(&self) -> bool {
        matches!(self, GroupStates::Count { .. } | GroupStates::SumInt { .. } | GroupStates::SumFloat { .. })
    }

    /// Adds slot `i` of `other` to slot `dst[i]` of `self` for every slot of `other`, or, with
    /// `subtract`, takes it away, exactly: states that slices entered and left equal those
    /// merged from the remaining slices afresh, however many came and went (counts and sums
    /// are exact; see [`ExactSums`]). Returns false, the states then being unusable, when
    /// these states have no exact inverse.
    pub fn add_exactly(&mut self, other: &GroupStates, dst: &[u32], subtract: bool) -> bool {
        self.add_exactly_slots(other, dst.iter().copied().enumerate(), subtract)
    }

    /// Like [`add_exactly`](Self::add_exactly) for slot `src[j]` of `other` and slot `dst[j]`
    /// of `self`, for every `j`.
    pub fn add_exactly_selected(&mut self, other: &GroupStates, src: &[u32], dst: &[u32], subtract: bool) -> bool {
        self.add_exactly_slots(other, src.iter().map(|&s| s as usize).zip(dst.iter().copied()), subtract)
    }

    /// Adds (or takes away) slot `i` of `other` to slot `d` of `self` for every pair `(i, d)`.
    fn add_exactly_slots(
        &mut self,
        other: &GroupStates,
        pairs: impl Iterator<Item = (usize, u32)>,
        subtract: bool,
    ) -> bool {
        let sign = if subtract { -1 } else { 1 };
        match (self, other) {
            (GroupStates::Count { counts }, GroupStates::Count { counts: oc }) => {
                for (i, d) in pairs {
                    counts[d as usize] += sign * oc[i];
                }
            }
            (GroupStates::SumInt { sums, counts, .. }, GroupStates::SumInt { sums: os, counts: oc, .. }) => {
                for (i, d) in pairs {
                    sums[d as usize] += i128::from(sign) * os[i];
                    counts[d as usize] += sign * oc[i];
                }
            }
            (GroupStates::SumFloat { sums, counts, .. }, GroupStates::SumFloat { sums: os, counts: oc, .. }) => {
                for (i, d) in pairs {
                    sums.add_slot(d as usize, os, i, subtract);
                    counts[d as usize] += sign * oc[i];
                }
            }
            _ => return false,
        }
        true
    }

    /// SQL values of every slot, in the state's domain (the caller casts to the return type).
    pub fn finalize(&self) -> Result<ArrayRef> {
        Ok(match self {
            GroupStates::MinMax { float: false, values, seen, .. } => {
                primitive::<Int64Type>(values.clone(), validity(seen, |s| s))
            }
            GroupStates::MinMax { float: true, values, seen, .. } => {
                primitive::<Float64Type>(values.iter().map(|&k| float_of_key(k)).collect(), validity(seen, |s| s))
            }
            GroupStates::MinMaxUtf8 { values, .. } => {
                Arc::new(StringArray::from_iter(values.iter().map(|v| v.as_deref())))
            }
            GroupStates::SumInt { avg: false, sums, counts } => {
                let sums = sums
                    .iter()
                    .map(|&s| {
                        i64::try_from(s).map_err(|_| TesseraError::Execution(format!("sum {s} overflows BIGINT")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                primitive::<Int64Type>(sums, validity(counts, |c| c > 0))
            }
            GroupStates::SumInt { avg: true, sums, counts } => primitive::<Float64Type>(
                sums.iter().zip(counts).map(|(&s, &c)| s as f64 / c.max(1) as f64).collect(),
                validity(counts, |c| c > 0),
            ),
            GroupStates::SumFloat { avg, sums, counts } => {
                let divisor = |c: i64| if *avg { c.max(1) as f64 } else { 1.0 };
                let values = counts.iter().enumerate().map(|(slot, &c)| sums.value(slot) / divisor(c)).collect();
                primitive::<Float64Type>(values, validity(counts, |c| c > 0))
            }
            GroupStates::Count { counts } => Arc::new(Int64Array::from(counts.clone())),
            GroupStates::Moments { stddev, counts, m2s, .. } => {
                let spread = counts.iter().zip(m2s).map(|(&c, &m2)| {
                    let var = (m2 / (c - 1).max(1) as f64).max(0.0);
                    if *stddev {
                        var.sqrt()
                    } else {
                        var
                    }
                });
                primitive::<Float64Type>(spread.collect(), validity(counts, |c| c > 1))
            }
            GroupStates::Median { values } => Arc::new(Float64Array::from_iter(values.iter().map(|v| median(v)))),
            GroupStates::Distinct { sketches } => {
                Arc::new(Int64Array::from_iter_values(sketches.iter().map(DistinctSketch::count)))
            }
        })
    }

    /// Approximate heap bytes held, for the state-size figures.
    pub fn bytes(&self) -> usize {
        let n = self.len();
        match self {
            GroupStates::MinMax { .. } => n * 9,
            GroupStates::MinMaxUtf8 { values, .. } => {
                values.iter().map(|v| 16 + v.as_ref().map_or(0, |s| s.len())).sum()
            }
            GroupStates::SumInt { .. } => n * 24,
            GroupStates::SumFloat { sums, .. } => sums.bytes() + n * 8,
            GroupStates::Count { .. } => n * 16,
            GroupStates::Moments { .. } => n * 24,
            GroupStates::Median { values } => values.iter().map(|v| 24 + v.capacity() * 8).sum(),
            GroupStates::Distinct { sketches } => sketches.iter().map(DistinctSketch::bytes).sum(),
        }
    }
}

/// An argument's values: a column of them, or (a dictionary array) each row's index into them.
#[derive(Clone, Copy)]
enum Values<'a, T> {
    Column(&'a [T]),
    Dictionary { indices: &'a [u32], values: &'a [T] },
}

/// The values of an argument of type `T`, a column of them or a dictionary array (with `UInt32`
/// keys, as readers hand them out; see [`GroupStates::read_dictionaries`]).
fn values_of<T: ArrowPrimitiveType>(array: &ArrayRef) -> Values<'_, T::Native> {
    match array.as_dictionary_opt::<UInt32Type>() {
        Some(dictionary) => Values::Dictionary {
            indices: dictionary.keys().values(),
            values: dictionary.values().as_primitive::<T>().values(),
        },
        None => Values::Column(array.as_primitive::<T>().values()),
    }
}

/// Calls `f(value, slot)` for each row `offset + i` of `input` that has a value (`nulls` marks
/// those that do not), `slot` being `slots[i]`.
#[inline]
fn each_valid<T: Copy>(
    input: Values<'_, T>,
    nulls: Option<&NullBuffer>,
    offset: usize,
    slots: &[u32],
    mut f: impl FnMut(T, usize),
) {
    match input {
        Values::Column(column) => each_valid_row(column, nulls, offset, slots, f),
        // An index of a row without a value may be any number: only the others are looked up.
        Values::Dictionary { indices, values } => {
            each_valid_row(indices, nulls, offset, slots, |index, slot| f(values[index as usize], slot))
        }
    }
}

/// [`each_valid`] over a column of `input`.
#[inline]
fn each_valid_row<T: Copy>(
    input: &[T],
    nulls: Option<&NullBuffer>,
    offset: usize,
    slots: &[u32],
    mut f: impl FnMut(T, usize),
) {
    let input = &input[offset..offset + slots.len()];
    // Values straight from memory arrive faster asked for a few chunks ahead than one cache
    // line at a time when the loop reaches them.
    const CHUNK: usize = 64;
    const AHEAD: usize = 8 * CHUNK;
    let line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    for (c, (values, slots)) in input.chunks(CHUNK).zip(slots.chunks(CHUNK)).enumerate() {
        let next = c * CHUNK + AHEAD;
        (next..next + CHUNK).step_by(line).for_each(|at| prefetch(input, at));
        match nulls {
            None => values.iter().zip(slots).for_each(|(&v, &s)| f(v, s as usize)),
            Some(nulls) => {
                let first = offset + c * CHUNK;
                for (i, (&v, &s)) in values.iter().zip(slots).enumerate() {
                    if nulls.is_valid(first + i) {
                        f(v, s as usize);
                    }
                }
            }
        }
    }
}

/// Asks the processor to bring `input[at]` into its cache, if there is such a row (a no-op on
/// processors without the hint).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn prefetch<T>(input: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(value) = input.get(at) {
        // SAFETY: SSE is part of x86-64, and a prefetch only warms the cache; the address is
        // that of a live value besides.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast()) };
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

/// The validity of values whose `flags` say whether each has a value: none when all have.
fn validity<F: Copy>(flags: &[F], valid: impl Fn(F) -> bool) -> Option<NullBuffer> {
    if flags.iter().all(|&f| valid(f)) {
        return None;
    }
    Some(NullBuffer::new(BooleanBuffer::collect_bool(flags.len(), |i| valid(flags[i]))))
}

/// A column of `values` with `nulls`.
fn primitive<T: ArrowPrimitiveType>(values: Vec<T::Native>, nulls: Option<NullBuffer>) -> ArrayRef {
    Arc::new(PrimitiveArray::<T>::new(values.into(), nulls))
}

/// What a MIN or MAX slot without a value holds: every value wins over it.
fn min_max_identity(max: bool) -> i64 {
    if max {
        i64::MIN
    } else {
        i64::MAX
    }
}

/// A float as an integer that orders like `f64::total_cmp` (NaN above every number, -0 below
/// +0, as in SQL engines that order floats totally); its own inverse.
fn float_key(value: f64) -> i64 {
    let bits = value.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

fn float_of_key(key: i64) -> f64 {
    f64::from_bits(float_key(f64::from_bits(key as u64)) as u64)
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
    use super::*;

    fn ints(v: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }
    fn floats(v: &[Option<f64>]) -> ArrayRef {
        Arc::new(Float64Array::from(v.to_vec()))
    }

    fn run(function: AggregateFunction, kind: ValueKind, values: Option<ArrayRef>, slots: &[u32]) -> ArrayRef {
        let mut s = GroupStates::new(function, kind);
        s.resize(slots.iter().max().map_or(0, |m| *m as usize + 1));
        s.update(values.as_ref(), 0, slots);
        s.finalize().unwrap()
    }

    #[test]
    fn nulls_are_ignored_and_empty_groups_are_null() {
        let v = ints(&[Some(3), None, Some(1), None]);
        let out = run(AggregateFunction::Min, ValueKind::Int, Some(v.clone()), &[0, 0, 0, 1]);
        assert_eq!(out.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(), vec![Some(1), None]);
        let out = run(AggregateFunction::Sum, ValueKind::Int, Some(v.clone()), &[0, 0, 0, 1]);
        assert_eq!(out.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(), vec![Some(4), None]);
        let out = run(AggregateFunction::Count, ValueKind::Int, Some(v), &[0, 0, 0, 1]);
        assert_eq!(out.as_primitive::<Int64Type>().values().to_vec(), vec![2, 0]);
        let out = run(AggregateFunction::CountRows, ValueKind::Int, None, &[0, 0, 0, 1]);
        assert_eq!(out.as_primitive::<Int64Type>().values().to_vec(), vec![3, 1]);
    }

    #[test]
    fn appended_states_finalize_as_the_concatenated_values() {
        use AggregateFunction as F;
        let values = floats(&[Some(2.5), None, Some(-1.0), Some(4.0), Some(4.0)]);
        for function in [F::Min, F::Max, F::Sum, F::Count, F::CountRows, F::Avg, F::VarSamp, F::Median] {
            let states = |slots: &[u32]| {
                let mut s = GroupStates::new(function, ValueKind::Float);
                s.resize(3);
                s.update(Some(&values), 0, slots);
                s
            };
            let (first, second) = (states(&[0, 1, 0, 2, 2]), states(&[2, 2, 1, 1, 0]));
            let mut appended = first.clone();
            appended.extend_from(&second).unwrap();
            assert_eq!(appended.len(), 6);
            let parts = [first.finalize().unwrap(), second.finalize().unwrap()];
            let expected = arrow::compute::concat(&[parts[0].as_ref(), parts[1].as_ref()]).unwrap();
            assert_eq!(appended.finalize().unwrap().as_ref(), expected.as_ref(), "{function:?}");
        }
        let mut count = GroupStates::new(F::Count, ValueKind::Int);
        assert!(count.extend_from(&GroupStates::new(F::Sum, ValueKind::Int)).is_err());
    }

    #[test]
    fn dictionary_arguments_aggregate_as_their_values() {
        use arrow::array::DictionaryArray;
        use AggregateFunction as F;
        // Rows as dictionary entries (NULL: a NULL row; entry 3 is never used), in runs that
        // start past the first row.
        let entries: Vec<Option<u32>> = (0..40).map(|i| (i % 7 != 2).then_some(i * 5 % 3)).collect();
        let slots: Vec<u32> = (0..40).map(|i| i * 3 % 4).collect();
        for (kind, dictionary) in [
            (ValueKind::Float, floats(&[Some(2.5), Some(-1.0), Some(-0.0), Some(9.0)])),
            (ValueKind::Int, ints(&[Some(7), Some(-1 << 40), Some(-3), Some(1)])),
        ] {
            let keys = arrow::array::UInt32Array::from(entries.clone());
            let plain = arrow::compute::take(&dictionary, &keys, None).unwrap();
            let looked_up: ArrayRef = Arc::new(DictionaryArray::try_new(keys, dictionary).unwrap());
            // (Variances and medians take their argument as floats.)
            let float_only = |function| matches!(function, F::VarSamp | F::Median) && kind == ValueKind::Int;
            for function in [F::Min, F::Max, F::Sum, F::Count, F::Avg, F::VarSamp, F::Median] {
                if float_only(function) {
                    continue;
                }
                assert!(GroupStates::read_dictionaries(function, kind));
                let states = |values: &ArrayRef| {
                    let mut s = GroupStates::new(function, kind);
                    s.resize(4);
                    s.update(Some(values), 3, &slots[3..25]);
                    s.update(Some(values), 25, &slots[25..]);
                    s.finalize().unwrap()
                };
                assert_eq!(states(&looked_up).as_ref(), states(&plain).as_ref(), "{function:?} over {kind:?}");
            }
        }
        assert!(!GroupStates::read_dictionaries(F::ApproxCountDistinct, ValueKind::Int));
        assert!(!GroupStates::read_dictionaries(F::Min, ValueKind::Utf8));
    }

    #[test]
    fn merged_moments_equal_direct_moments() {
        let data: Vec<Option<f64>> = (0..50).map(|i| Some((i * 37 % 11) as f64 * 1.5 - 3.0)).collect();
        let direct = run(AggregateFunction::VarSamp, ValueKind::Float, Some(floats(&data)), &[0; 50]);
        let mut a = GroupStates::new(AggregateFunction::VarSamp, ValueKind::Float);
        let mut b = a.clone();
        a.resize(1);
        b.resize(1);
        a.update(Some(&floats(&data[..20])), 0, &[0; 20]);
        b.update(Some(&floats(&data[20..])), 0, &[0; 30]);
        a.merge(&b, &[0]).unwrap();
        let merged = a.finalize().unwrap();
        let (d, m) = (direct.as_primitive::<Float64Type>().value(0), merged.as_primitive::<Float64Type>().value(0));
        assert!((d - m).abs() < 1e-9, "{d} vs {m}");
    }

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
            let function = if max { AggregateFunction::Max } else { AggregateFunction::Min };
            let slots: Vec<u32> = rows.iter().map(|r| r.0).collect();
            let split = split.min(rows.len());
            let through_merge = |kind: ValueKind, values: ArrayRef| {
                let mut a = GroupStates::new(function, kind);
                let mut b = a.clone();
                a.resize(3);
                b.resize(3);
                a.update(Some(&values), 0, &slots[..split]);
                b.update(Some(&values), split, &slots[split..]);
                let mut w = StateWriter::default();
                b.encode(&mut w);
                let bytes = w.into_bytes();
                let mut decoded = GroupStates::new(function, kind);
                decoded.decode(&mut StateReader::new(&bytes)).unwrap();
                a.merge(&decoded, &[0, 1, 2]).unwrap();
                a.finalize().unwrap()
            };
            let floats_out = through_merge(ValueKind::Float, floats(&rows.iter().map(|r| r.1.map(|i| FLOATS[i])).collect::<Vec<_>>()));
            let ints_out = through_merge(ValueKind::Int, ints(&rows.iter().map(|r| r.1.map(|i| INTS[i])).collect::<Vec<_>>()));
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

    #[test]
    fn median_interpolates_even_counts() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn sum_overflow_is_an_error_not_a_wrap() {
        let v = ints(&[Some(i64::MAX), Some(1)]);
        let mut s = GroupStates::new(AggregateFunction::Sum, ValueKind::Int);
        s.resize(1);
        s.update(Some(&v), 0, &[0, 0]);
        assert!(s.finalize().is_err());
    }

    #[test]
    fn distinct_counts_are_exact_when_small_and_close_when_large() {
        let small = ints(&(0..100).map(|i| Some(i % 37)).collect::<Vec<_>>());
        let out = run(AggregateFunction::ApproxCountDistinct, ValueKind::Int, Some(small), &[0; 100]);
        assert_eq!(out.as_primitive::<Int64Type>().value(0), 37);
        let n = 20_000;
        let large = ints(&(0..n).map(|i| Some(i * 7)).collect::<Vec<_>>());
        let out = run(AggregateFunction::ApproxCountDistinct, ValueKind::Int, Some(large), &vec![0; n as usize]);
        let estimate = out.as_primitive::<Int64Type>().value(0) as f64;
        assert!((estimate / n as f64 - 1.0).abs() < 0.05, "{estimate}");
    }

    #[test]
    fn sums_added_and_taken_away_exactly_equal_the_remaining_slices_summed_exactly() {
        // Slices of one group with sums far apart in magnitude: a float running sum would lose
        // the small ones to the large one and keep the error after it leaves.
        let slice = |v: f64| {
            let mut s = GroupStates::new(AggregateFunction::Sum, ValueKind::Float);
            s.resize(1);
            s.update(Some(&floats(&[Some(v)])), 0, &[0]);
            s
        };
        let values = [1e16, 0.3, 0.3, 2.0f64.powi(-60), -5.5];
        let mut window = GroupStates::new(AggregateFunction::Sum, ValueKind::Float);
        window.resize(1);
        for &v in &values {
            assert!(window.add_exactly(&slice(v), &[0], false));
        }
        assert!(window.add_exactly(&slice(values[0]), &[0], true));
        // What is left, summed in one state and rounded once: the same bits.
        let mut direct = GroupStates::new(AggregateFunction::Sum, ValueKind::Float);
        direct.resize(1);
        direct.update(Some(&floats(&values[1..].iter().map(|&v| Some(v)).collect::<Vec<_>>())), 0, &[0; 4]);
        let sum = window.finalize().unwrap().as_primitive::<Float64Type>().value(0);
        assert_eq!(sum.to_bits(), direct.finalize().unwrap().as_primitive::<Float64Type>().value(0).to_bits());
        assert_eq!(sum, -4.9);
        let float_running = values.iter().sum::<f64>() - values[0];
        assert_eq!(float_running, -6.0, "a float running sum lost 0.6 to the large slice");
        // Empty again: no values, a NULL sum.
        for &v in &values[1..] {
            assert!(window.add_exactly(&slice(v), &[0], true));
        }
        assert!(window.finalize().unwrap().is_null(0));
        // Values of any magnitude, and not finite, are taken away again exactly too.
        for v in [1e-30, 1e300, f64::NAN, f64::INFINITY] {
            assert!(window.add_exactly(&slice(v), &[0], false), "{v}");
            assert!(window.add_exactly(&slice(0.25), &[0], false), "{v}");
            assert!(window.add_exactly(&slice(v), &[0], true), "{v}");
            assert_eq!(window.finalize().unwrap().as_primitive::<Float64Type>().value(0), 0.25, "{v}");
            assert!(window.add_exactly(&slice(0.25), &[0], true), "{v}");
        }
        // Counts and integer sums, and states with no inverse.
        let count = |n: usize| {
            let mut s = GroupStates::new(AggregateFunction::CountRows, ValueKind::Int);
            s.resize(1);
            s.update(None, 0, &vec![0; n]);
            s
        };
        let mut counted = count(0);
        assert!(counted.add_exactly(&count(5), &[0], false));
        assert!(counted.add_exactly(&count(3), &[0], true));
        assert_eq!(counted.finalize().unwrap().as_primitive::<Int64Type>().value(0), 2);
        let min = GroupStates::new(AggregateFunction::Min, ValueKind::Float);
        assert!(!min.has_exact_inverse() && count(0).has_exact_inverse());
        assert!(!min.clone().add_exactly(&min, &[], false));
    }
}
