//! Window algebra: a window `W<range, slide>` has the intervals `[m*slide, m*slide + range)`
//! for every integer `m`. Windows are evaluated on slices of length `gcd(range, slide)`, so every
//! event updates exactly one slice and each window is the union of consecutive slices.

use serde::Serialize;

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

/// Least common multiple (saturating).
pub fn lcm(a: i64, b: i64) -> i64 {
    if a == 0 || b == 0 {
        return 0;
    }
    (a / gcd(a, b)).saturating_mul(b).abs()
}

/// The cost model of the multi-window paper for computing every window from the raw stream:
/// over the period `R = lcm(ranges)`, window `i` recurs `n_i = 1 + (R/r_i - 1) * r_i/s_i` times
/// and each instance touches `eta * r_i` events.
pub fn baseline_cost(windows: &[WindowSpec], eta: f64) -> f64 {
    let period = windows.iter().fold(1, |acc, w| lcm(acc, w.range));
    windows
        .iter()
        .map(|w| {
            let multiplicity = (period / w.range) as f64;
            let recurrences = 1.0 + (multiplicity - 1.0) * w.range as f64 / w.slide as f64;
            recurrences * eta * w.range as f64
        })
        .sum()
}

#[cfg(test)]
mod cost_tests {
    use super::*;

    #[test]
    fn baseline_matches_example_6() {
        let windows: Vec<WindowSpec> = [10, 20, 30, 40].map(WindowSpec::tumbling).to_vec();
        assert_eq!(baseline_cost(&windows, 1.0), 480.0);
        let windows: Vec<WindowSpec> = [20, 30, 40].map(WindowSpec::tumbling).to_vec();
        assert_eq!(baseline_cost(&windows, 1.0), 360.0);
    }
}
