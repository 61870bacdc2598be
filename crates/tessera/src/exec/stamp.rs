//! Stamping source rows: each row's event time as `i64` in the source's unit, and the
//! watermark it meets (the largest event time before it minus the out-of-orderness bound),
//! computed before rows are split among workers so every worker sees the source's progress.

use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::buffer::ScalarBuffer;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use arrow::record_batch::RecordBatch;

use super::{EventBatch, Watermarks};
use crate::catalog::SourceDef;
use crate::error::Result;

/// Event times of a batch as `i64` in the source's unit.
fn event_times(batch: &RecordBatch, source: &SourceDef) -> Result<ScalarBuffer<i64>> {
    let column = batch.column(source.event_time.index);
    let column =
        if column.data_type() == &DataType::Int64 { Arc::clone(column) } else { cast(column, &DataType::Int64)? };
    Ok(column.as_primitive::<Int64Type>().values().clone())
}

/// Stamps rows with event times and watermarks: the watermark a row meets is the largest
/// event time before it minus the out-of-orderness bound.
pub(super) struct Stamper {
    pub(super) max_event_time: i64,
    pub(super) delay: i64,
}

impl Stamper {
    pub(super) fn stamp(&mut self, batch: RecordBatch, source: &SourceDef) -> Result<EventBatch> {
        let times = event_times(&batch, source)?;
        let (watermarks, times_ascend) = watermarks(&times, &mut self.max_event_time, self.delay);
        Ok(EventBatch { rows: batch, event_times: times, watermarks, times_ascend, key_ids: Vec::new() })
    }

    pub(super) fn watermark(&self) -> i64 {
        watermark_after(self.max_event_time, self.delay)
    }
}

/// The watermark each event of `times` meets: the one before it, from the largest event time
/// seen before it (`max`, which the events then raise); and whether the times ascend.
fn watermarks(times: &[i64], max: &mut i64, delay: i64) -> (Watermarks, bool) {
    let mut watermarks = Watermarks::default();
    if times.is_empty() {
        return (watermarks, true);
    }
    watermarks.meet(0, watermark_after(*max, delay));
    let mut ascend = true;
    let mut previous = times[0];
    // Events mostly arrive in time order, many at the same time: a chunk is tested for order
    // without a branch per row, and in an ordered chunk each rise of the maximum is found by a
    // binary search; only a chunk out of order is walked row by row.
    for (c, chunk) in times.chunks(64).enumerate() {
        let start = c * 64;
        let ordered = previous <= chunk[0] && non_decreasing(chunk);
        previous = chunk[chunk.len() - 1];
        ascend &= ordered;
        if ordered && previous <= *max {
            continue; // no event of the chunk raises the maximum
        }
        let mut from = 0;
        while from < chunk.len() {
            let raises = if ordered {
                from + chunk[from..].partition_point(|&t| t <= *max)
            } else {
                from + chunk[from..].iter().position(|&t| t > *max).unwrap_or(chunk.len() - from)
            };
            let Some(&t) = chunk.get(raises) else { break };
            *max = t;
            // The rows after this one meet the raised watermark.
            if start + raises + 1 < times.len() {
                watermarks.meet(start + raises + 1, watermark_after(t, delay));
            }
            from = raises + 1;
        }
    }
    (watermarks, ascend)
}

/// Whether no time is smaller than the one before it. Each pair is compared by the sign of its
/// difference, corrected where the subtraction overflows: 64-bit subtractions vectorize on every
/// x86-64, where a 64-bit vector comparison needs SSE4.2 and is otherwise emulated.
fn non_decreasing(times: &[i64]) -> bool {
    let descents = times.iter().zip(times.get(1..).unwrap_or_default()).fold(0i64, |descents, (&a, &b)| {
        let difference = b.wrapping_sub(a);
        let overflowed = (b ^ a) & (b ^ difference);
        descents | (difference ^ overflowed)
    });
    descents >= 0
}

/// The watermark once events up to `max_event_time` were seen, `delay` allowed for disorder.
fn watermark_after(max_event_time: i64, delay: i64) -> i64 {
    max_event_time.saturating_sub(delay)
}

#[cfg(test)]
mod tests {
    use super::{watermark_after, watermarks};

    #[test]
    fn watermarks_are_the_delayed_maximum_before_each_event() {
        let mut rng = crate::window::generators::SplitMix::new(7);
        for case in 0..200 {
            // In order with repeats, out of order, and near the ends of the i64 range.
            let n = (rng.next_u64() % 300) as usize;
            let base = [0, i64::MIN, i64::MAX - 5000][case % 3];
            let spread = [1, 40, 1000][case / 3 % 3];
            let times: Vec<i64> = (0..n)
                .map(|i| base.saturating_add((i as i64) / spread).saturating_add((rng.next_u64() % 4) as i64 - 2))
                .collect();
            let (start, delay) = (base.saturating_sub(3), (rng.next_u64() % 20) as i64);
            let mut expected = Vec::new();
            let mut max = start;
            for &t in &times {
                expected.push(watermark_after(max, delay));
                max = max.max(t);
            }
            let mut chunked_max = start;
            let (stamped, ascend) = watermarks(&times, &mut chunked_max, delay);
            assert_eq!(stamped.per_row(times.len()), expected, "case {case}");
            assert_eq!(ascend, times.is_sorted(), "case {case}");
            assert_eq!(chunked_max, max);
        }
    }

    #[test]
    fn non_decreasing_compares_every_pair_across_the_whole_range() {
        let edges = [i64::MIN, i64::MIN + 1, -2, -1, 0, 1, 2, i64::MAX - 1, i64::MAX];
        for &a in &edges {
            for &b in &edges {
                assert_eq!(super::non_decreasing(&[a, b]), a <= b, "{a} then {b}");
            }
        }
        let mut rng = crate::window::generators::SplitMix::new(11);
        for _ in 0..2000 {
            let n = (rng.next_u64() % 70) as usize;
            let mut times: Vec<i64> = (0..n).map(|_| rng.next_u64() as i64 >> (rng.next_u64() % 64)).collect();
            if rng.next_u64().is_multiple_of(2) {
                times.sort_unstable();
            }
            assert_eq!(super::non_decreasing(&times), times.is_sorted(), "{times:?}");
        }
    }
}
