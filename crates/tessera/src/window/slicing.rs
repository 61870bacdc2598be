//! Sliced windows (Krishnamurthy et al., "paired windows"): the time line is cut into
//! non-overlapping slices whose edges repeat with a period, so that every window instance is a
//! run of consecutive slices and every event falls into exactly one slice.
//!
//! A window `W<r, s>` alone is *paned* by slices of `gcd(r, s)`, or *paired* by two slices per
//! slide, `r mod s` and `s - r mod s` long. Several windows *share* one slicing whose edges are
//! the union of theirs over `lcm` of their slides. Membership in every window is constant
//! inside a slice of that union, which is what lets the runtime handle a slice's rows together.

use super::{floor_div, gcd, lcm, WindowSpec};

/// The most slices per period a slicing enumerates; beyond it the edges fall back to the
/// uniform slices of the gcd of all boundaries (still correct, just more slices).
const MAX_EDGES: i64 = 1 << 22;

/// Periodic slice edges: slice `q * edges.len() + i` covers
/// `[q * period + edges[i], q * period + edges[i + 1])` (the last one ends at the next period).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slicing {
    period: i64,
    /// Offsets in `[0, period)`, ascending, starting with 0.
    edges: Vec<i64>,
}

impl Slicing {
    /// Uniform slices of length `len`.
    pub fn uniform(len: i64) -> Self {
        Slicing { period: len.max(1), edges: vec![0] }
    }

    /// Paired slicing of `w` alone: `r mod s` then `s - r mod s` (one slice of `s` when `s`
    /// divides `r`).
    pub fn paired(w: &WindowSpec) -> Self {
        Self::shared(std::slice::from_ref(w))
    }

    /// The common slicing of `windows`: every window's starts and ends are edges, nothing else.
    pub fn shared(windows: &[WindowSpec]) -> Self {
        let unit = windows.iter().fold(0, |acc, w| gcd(acc, w.slice_len())).max(1);
        let period = windows.iter().fold(1, |acc, w| lcm(acc, w.slide)).max(1);
        let cells = period / unit;
        if cells > MAX_EDGES || period == i64::MAX {
            return Self::uniform(unit);
        }
        let mut is_edge = vec![false; cells as usize];
        for w in windows {
            for start in (0..period).step_by(w.slide as usize) {
                is_edge[(start / unit) as usize] = true;
                is_edge[((start + w.range).rem_euclid(period) / unit) as usize] = true;
            }
        }
        let edges: Vec<i64> = is_edge.iter().enumerate().filter(|(_, e)| **e).map(|(i, _)| i as i64 * unit).collect();
        if edges.len() as i64 == cells {
            return Self::uniform(unit);
        }
        Slicing { period, edges }
    }

    /// Slices per period.
    pub fn slices_per_period(&self) -> i64 {
        self.edges.len() as i64
    }

    pub fn period(&self) -> i64 {
        self.period
    }

    /// The slice containing time `t`.
    #[inline]
    pub fn slice_of(&self, t: i64) -> i64 {
        if self.edges.len() == 1 {
            return floor_div(t, self.period);
        }
        let (q, offset) = (t.div_euclid(self.period), t.rem_euclid(self.period));
        let i = self.edges.partition_point(|&e| e <= offset) - 1;
        q.saturating_mul(self.slices_per_period()).saturating_add(i as i64)
    }

    /// Start of slice `k`.
    pub fn start(&self, k: i64) -> i64 {
        let n = self.slices_per_period();
        let (q, i) = (floor_div(k, n), k.rem_euclid(n));
        q.saturating_mul(self.period).saturating_add(self.edges[i as usize])
    }

    /// End (exclusive) of slice `k`.
    pub fn end(&self, k: i64) -> i64 {
        self.start(k.saturating_add(1))
    }

    /// The slices making up `[start, end)`, which must fall on edges.
    pub fn slices_between(&self, start: i64, end: i64) -> std::ops::RangeInclusive<i64> {
        self.slice_of(start)..=self.slice_of(end - 1)
    }

    /// Slices window instance `m` of `w` spans.
    pub fn slices_in(&self, w: &WindowSpec, m: i64) -> i64 {
        let range = self.slices_between(w.start(m), w.end(m));
        range.end() - range.start() + 1
    }

    /// The most slices an instance of `w` spans (instances repeat with the slicing's period).
    pub fn most_slices_in(&self, w: &WindowSpec) -> i64 {
        (0..self.period() / w.slide.max(1) + 1).map(|m| self.slices_in(w, m)).max().unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_slices_of_one_window() {
        // W<10, 3>: edges at 0 and 1 (10 mod 3), period 3; a window spans 2 * 3 + 1 slices.
        let w = WindowSpec::hopping(3, 10);
        let s = Slicing::paired(&w);
        assert_eq!((s.period(), s.slices_per_period()), (3, 2));
        assert_eq!([s.start(0), s.end(0), s.start(1), s.end(1), s.start(2)], [0, 1, 1, 3, 3]);
        assert_eq!(s.slices_in(&w, 0), 7);
        assert_eq!(s.slices_in(&w, 5), 7);
        // Paned, the same window needs 10 slices.
        assert_eq!(Slicing::uniform(w.slice_len()).slices_in(&w, 0), 10);
        // A slide dividing the range gives one slice per slide.
        assert_eq!(Slicing::paired(&WindowSpec::hopping(5, 20)), Slicing::uniform(5));
    }

    #[test]
    fn slices_partition_time_and_respect_every_boundary() {
        let sets = [
            vec![WindowSpec::hopping(3, 10), WindowSpec::hopping(4, 6)],
            vec![WindowSpec::tumbling(6), WindowSpec::hopping(4, 9), WindowSpec::hopping(10, 25)],
            vec![WindowSpec::tumbling(600), WindowSpec::tumbling(1200)],
        ];
        for windows in sets {
            let s = Slicing::shared(&windows);
            for t in -200..200 {
                let k = s.slice_of(t);
                assert!(s.start(k) <= t && t < s.end(k), "{windows:?} t={t} k={k}");
                assert_eq!(s.slice_of(s.start(k)), k);
            }
            for w in &windows {
                for m in -20..20 {
                    // Every window instance starts and ends on an edge.
                    assert_eq!(s.start(s.slice_of(w.start(m))), w.start(m), "{w:?} {m}");
                    assert_eq!(s.start(s.slice_of(w.end(m))), w.end(m), "{w:?} {m}");
                }
            }
        }
    }
}
