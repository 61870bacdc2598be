//! Window algebra: a window `W<range, slide>` has the intervals `[m*slide, m*slide + range)`
//! for every integer `m`. Windows are evaluated on slices of length `gcd(range, slide)`, so every
//! event updates exactly one slice and each window is the union of consecutive slices.
//!
//! Between windows (Wu et al., "Cost-based query rewriting techniques for optimizing aggregates
//! over correlated windows"): `W1` is *covered by* `W2` when every interval of `W1` is the union
//! of consecutive intervals of `W2` (Theorem 1), *partitioned by* `W2` when those intervals are
//! also disjoint (Theorem 4); the *covering multiplier* counts them (Theorem 3). The cost model
//! built on these lives in [`cost`].

pub mod cost;
pub mod generators;
pub mod slicing;

use serde::Serialize;

/// The largest magnitude of an event time, in the source's units: 2^62 (in nanoseconds, the
/// years 1824 to 2116; in microseconds, ±146,000 years). An event outside it is a bad row.
/// With window lengths and watermark delays at most [`MAX_DURATION`], every window start and
/// end, slice boundary and watermark computed from such times stays below 2^63.
pub const MAX_EVENT_TIME: i64 = 1 << 62;

/// The longest window range, slide or watermark delay, in the source's units: 2^60 (36 years
/// in nanoseconds).
pub const MAX_DURATION: i64 = 1 << 60;

/// The most windows of one HOP an event may fall into (`size / slide`): every one of them is
/// written out for each key, so beyond this one event would produce more rows than any run
/// could write.
pub const MAX_WINDOWS_PER_EVENT: i64 = 1 << 20;

/// Whether `time` lies within the event times windows can hold ([`MAX_EVENT_TIME`]).
#[inline]
pub fn is_windowable(time: i64) -> bool {
    (-MAX_EVENT_TIME..=MAX_EVENT_TIME).contains(&time)
}

/// Which relation lets one window be computed from another's partial aggregates: MIN and MAX
/// may combine overlapping parts, SUM, COUNT, AVG and the moments need disjoint parts, holistic
/// aggregates cannot be combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    CoveredBy,
    PartitionedBy,
    None,
}

impl Sharing {
    /// The sharing both `self` and `other` allow: the more restrictive of the two.
    pub fn strictest(self, other: Sharing) -> Sharing {
        match (self, other) {
            (Sharing::None, _) | (_, Sharing::None) => Sharing::None,
            (Sharing::PartitionedBy, _) | (_, Sharing::PartitionedBy) => Sharing::PartitionedBy,
            _ => Sharing::CoveredBy,
        }
    }
}

/// A tumbling (`range == slide`) or hopping window, in event-time units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct WindowSpec {
    pub range: i64,
    pub slide: i64,
}

impl WindowSpec {
    pub fn tumbling(size: i64) -> Self {
        WindowSpec { range: size, slide: size }
    }

    pub fn hopping(slide: i64, range: i64) -> Self {
        WindowSpec { range, slide }
    }

    pub fn is_tumbling(&self) -> bool {
        self.range == self.slide
    }

    /// The slice length: the largest length that divides every window boundary.
    pub fn slice_len(&self) -> i64 {
        gcd(self.range, self.slide)
    }

    /// Start of window `m`.
    pub fn start(&self, m: i64) -> i64 {
        m.saturating_mul(self.slide)
    }

    /// End (exclusive) of window `m`.
    pub fn end(&self, m: i64) -> i64 {
        self.start(m).saturating_add(self.range)
    }

    /// The first window whose end is after `t`: the first window that contains `t` or starts
    /// after it.
    pub fn first_window_ending_after(&self, t: i64) -> i64 {
        floor_div(t.saturating_sub(self.range), self.slide) + 1
    }

    /// The last window that starts at or before `t`.
    pub fn last_window_starting_at_or_before(&self, t: i64) -> i64 {
        floor_div(t, self.slide)
    }

    /// Theorem 1: every interval of `self` is the union of consecutive intervals of `other`
    /// starting at its start and ending at its end.
    pub fn is_covered_by(&self, other: &WindowSpec) -> bool {
        self.range >= other.range && self.slide % other.slide == 0 && (self.range - other.range) % other.slide == 0
    }

    /// Theorem 4: covered by `other`, with disjoint covering intervals (`other` tumbling).
    pub fn is_partitioned_by(&self, other: &WindowSpec) -> bool {
        other.is_tumbling() && self.slide % other.slide == 0 && self.range % other.slide == 0
    }

    /// Whether `self` can be computed from `other`'s partial aggregates under `sharing`.
    pub fn can_be_computed_from(&self, other: &WindowSpec, sharing: Sharing) -> bool {
        match sharing {
            Sharing::CoveredBy => self.is_covered_by(other),
            Sharing::PartitionedBy => self.is_partitioned_by(other),
            Sharing::None => false,
        }
    }

    /// Theorem 3: how many intervals of `other` make up one interval of `self` (which must be
    /// covered by `other`).
    pub fn covering_multiplier(&self, other: &WindowSpec) -> i64 {
        1 + (self.range - other.range) / other.slide
    }

    /// The windows containing time `t`, as an inclusive range of indices.
    pub fn windows_containing(&self, t: i64) -> (i64, i64) {
        (self.first_window_ending_after(t), self.last_window_starting_at_or_before(t))
    }
}

pub fn gcd(mut a: i64, mut b: i64) -> i64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

/// Division rounding towards negative infinity, so times before the epoch fall into the right
/// window.
#[inline]
pub fn floor_div(a: i64, b: i64) -> i64 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Least common multiple (saturating).
pub fn lcm(a: i64, b: i64) -> i64 {
    if a == 0 || b == 0 {
        return 0;
    }
    (a / gcd(a, b)).saturating_mul(b).abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_containing_matches_the_definition() {
        for (range, slide) in [(10, 10), (30, 10), (25, 10), (7, 3), (1, 1)] {
            let w = WindowSpec { range, slide };
            for t in -50..50 {
                let (lo, hi) = w.windows_containing(t);
                for m in -30..30 {
                    let contains = w.start(m) <= t && t < w.end(m);
                    assert_eq!(contains, (lo..=hi).contains(&m), "W<{range},{slide}> t={t} m={m}");
                }
            }
        }
    }

    /// Coverage by its definition: every interval of `a` (within a few periods) is exactly the
    /// union of the consecutive intervals of `b` that start at its start and end at its end.
    fn covered_by_definition(a: &WindowSpec, b: &WindowSpec) -> bool {
        (0..6).all(|m| {
            let (start, end) = (a.start(m), a.end(m));
            let Some(first) = (-20..200).find(|&j| b.start(j) == start) else { return false };
            let mut reach = b.end(first);
            let mut j = first;
            while reach < end {
                j += 1;
                if b.start(j) > reach {
                    return false;
                }
                reach = reach.max(b.end(j));
            }
            reach == end
        })
    }

    #[test]
    fn coverage_theorems_match_the_definition() {
        let spans: Vec<WindowSpec> =
            (1..=6).flat_map(|s| (s..=12).map(move |r| WindowSpec { range: r, slide: s })).collect();
        for a in &spans {
            for b in &spans {
                assert_eq!(a.is_covered_by(b), covered_by_definition(a, b), "{a:?} <= {b:?}");
                if a.is_covered_by(b) {
                    // The multiplier counts the covering intervals.
                    let count = (0..100).filter(|&j| b.start(j) >= a.start(1) && b.end(j) <= a.end(1)).count() as i64;
                    assert_eq!(a.covering_multiplier(b), count, "{a:?} by {b:?}");
                }
                let disjoint = a.is_covered_by(b) && b.is_tumbling();
                assert_eq!(a.is_partitioned_by(b), disjoint, "{a:?} partitioned by {b:?}");
            }
        }
    }

    #[test]
    fn coverage_is_a_partial_order() {
        let spans: Vec<WindowSpec> =
            (1..=5).flat_map(|s| (s..=10).map(move |r| WindowSpec { range: r, slide: s })).collect();
        for a in &spans {
            assert!(a.is_covered_by(a));
            for b in &spans {
                if a.is_covered_by(b) && b.is_covered_by(a) {
                    assert_eq!(a, b);
                }
                for c in &spans {
                    if a.is_covered_by(b) && b.is_covered_by(c) {
                        assert!(a.is_covered_by(c), "{a:?} {b:?} {c:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn slices_divide_every_boundary() {
        let w = WindowSpec::hopping(60, 1800);
        assert_eq!(w.slice_len(), 60);
        let w = WindowSpec::hopping(4, 10);
        assert_eq!(w.slice_len(), 2);
        assert_eq!(floor_div(-1, 10), -1);
        assert_eq!(floor_div(-10, 10), -1);
        assert_eq!(floor_div(9, 10), 0);
    }
}
