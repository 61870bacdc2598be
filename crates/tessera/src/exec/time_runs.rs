//! Finding where runs of rows end in a batch's event times, without a comparison per row where
//! the times allow it: the window operator cuts batches into runs of one slice or instance.

/// How many of `times`, from the first, lie in `lo..hi`. Times mostly arrive in order, so runs
/// are long: whole chunks are tested without a branch per row (the compiler vectorizes them).
pub(super) fn rows_within(times: &[i64], lo: i64, hi: i64) -> usize {
    const CHUNK: usize = 16;
    let inside = |t: i64| lo <= t && t < hi;
    let mut chunks = times.chunks_exact(CHUNK);
    let mut counted = 0;
    for chunk in chunks.by_ref() {
        if !chunk.iter().fold(true, |all, &t| all & inside(t)) {
            break;
        }
        counted += CHUNK;
    }
    counted + times[counted..].iter().position(|&t| !inside(t)).unwrap_or(times.len() - counted)
}

/// How many of `times` (ascending) are below `bound`. A binary search would read a dozen rows
/// spread over the batch, each likely a cache miss; times are mostly evenly spread, so this
/// guesses the position from the first and last time and gallops from the guess, reading a
/// few rows near it.
pub(super) fn ascending_below(times: &[i64], bound: i64) -> usize {
    let (Some(&first), Some(&last)) = (times.first(), times.last()) else { return 0 };
    if first >= bound {
        return 0;
    }
    if last < bound {
        return times.len();
    }
    // first < bound <= last, so the spread is positive and the guess within the rows.
    let spread = i128::from(last) - i128::from(first);
    let guess = ((i128::from(bound) - i128::from(first)) * (times.len() as i128 - 1) / spread) as usize;
    // Bracket the answer: times[below] < bound <= times[above].
    let (mut below, mut above) = (guess, guess);
    let mut step = 1;
    if times[guess] < bound {
        loop {
            above = (below + step).min(times.len() - 1);
            if times[above] >= bound {
                break;
            }
            below = above;
            step *= 2;
        }
    } else {
        loop {
            below = above.saturating_sub(step);
            if times[below] < bound {
                break;
            }
            above = below;
            step *= 2;
        }
    }
    below + 1 + times[below + 1..above].partition_point(|&t| t < bound)
}

#[cfg(test)]
mod tests {
    use super::{ascending_below, rows_within};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ascending_below_counts_like_a_binary_search(
            mut times in proptest::collection::vec(-50i64..50, 0..200),
            spread in prop_oneof![Just(1i64), Just(1_000), Just(i64::MAX / 100)],
            bound in -60i64..60,
        ) {
            times.sort_unstable();
            // Evenly spread, clustered and extreme times, duplicates included.
            let times: Vec<i64> = times.iter().map(|t| t.saturating_mul(spread)).collect();
            for bound in [bound.saturating_mul(spread), i64::MIN, i64::MAX] {
                prop_assert_eq!(ascending_below(&times, bound), times.partition_point(|&t| t < bound));
            }
        }
    }

    #[test]
    fn rows_within_stops_at_the_first_row_outside_wherever_it_falls() {
        let inside = |n: usize| vec![5i64; n];
        // Whole chunks, a partial chunk, nothing.
        for n in [0, 1, 15, 16, 17, 32, 40] {
            assert_eq!(rows_within(&inside(n), 0, 10), n);
        }
        // The first row outside at every position around the chunk boundaries, below or above.
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 47] {
            for outside in [-1, 10] {
                let mut times = inside(n);
                times.push(outside);
                times.extend(inside(20));
                assert_eq!(rows_within(&times, 0, 10), n, "outside {outside} after {n}");
            }
        }
        // The range is half open.
        assert_eq!(rows_within(&[0, 9, 10], 0, 10), 2);
    }
}
