//! The multi-window cost model: the work of computing a set of windows over one period
//! `R = lcm(ranges)` with `eta` events per time unit.
//!
//! Window `W<r, s>` recurs `n = 1 + (R/r - 1) * r/s` times per period. Computed from the raw
//! stream, one instance touches `eta * r` events; computed from a covering window `W'`, it
//! merges `M(W, W')` of its partial aggregates (the covering multiplier).

use super::{lcm, WindowSpec};

/// Where a window's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Stream,
    Window(WindowSpec),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub eta: f64,
    /// `R`: the least common multiple of the ranges of the query's windows.
    pub period: i64,
}

impl CostModel {
    /// The model for a set of (output) windows.
    pub fn new(windows: &[WindowSpec], eta: f64) -> Self {
        CostModel { eta, period: windows.iter().fold(1, |acc, w| lcm(acc, w.range)) }
    }

    /// `n`: instances of `w` per period.
    pub fn recurrences(&self, w: &WindowSpec) -> f64 {
        let multiplicity = self.period as f64 / w.range as f64;
        1.0 + (multiplicity - 1.0) * w.range as f64 / w.slide as f64
    }

    /// The work of one instance of `w` from `input`.
    pub fn instance_cost(&self, w: &WindowSpec, input: Input) -> f64 {
        match input {
            Input::Stream => self.eta * w.range as f64,
            Input::Window(parent) => w.covering_multiplier(&parent) as f64,
        }
    }

    /// The work of `w` over one period.
    pub fn cost(&self, w: &WindowSpec, input: Input) -> f64 {
        self.recurrences(w) * self.instance_cost(w, input)
    }

    /// Every window computed from the raw stream.
    pub fn baseline(&self, windows: &[WindowSpec]) -> f64 {
        windows.iter().map(|w| self.cost(w, Input::Stream)).sum()
    }

    /// The length of the slices the windows share: the gcd of all ranges and slides.
    pub fn slice_len(windows: &[WindowSpec]) -> i64 {
        windows.iter().fold(0, |acc, w| super::gcd(acc, w.slice_len()))
    }

    /// Shared slices (what the runtime executes today): every event updates one slice
    /// (`eta * R` per period) and each window instance merges its `r / g` slices.
    pub fn shared_slices(&self, windows: &[WindowSpec]) -> f64 {
        let g = Self::slice_len(windows).max(1) as f64;
        self.eta * self.period as f64 + windows.iter().map(|w| self.recurrences(w) * w.range as f64 / g).sum::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tumbling(ranges: &[i64]) -> Vec<WindowSpec> {
        ranges.iter().map(|&r| WindowSpec::tumbling(r)).collect()
    }

    #[test]
    fn example_6_baseline_and_shared_costs() {
        let windows = tumbling(&[10, 20, 30, 40]);
        let model = CostModel::new(&windows, 1.0);
        assert_eq!(model.period, 120);
        assert_eq!(model.baseline(&windows), 480.0);
        let [w10, w20, w30, w40] = [windows[0], windows[1], windows[2], windows[3]];
        let shared = model.cost(&w10, Input::Stream)
            + model.cost(&w20, Input::Window(w10))
            + model.cost(&w30, Input::Window(w10))
            + model.cost(&w40, Input::Window(w20));
        assert_eq!(shared, 150.0);
    }

    #[test]
    fn shared_slices_touch_each_event_once() {
        // W1: tumbling 10, 20, 30, 40 minutes in seconds; slices of 600 s.
        let windows = tumbling(&[600, 1200, 1800, 2400]);
        let model = CostModel::new(&windows, 1.0);
        assert_eq!(model.period, 7200);
        assert_eq!(model.baseline(&windows), 28800.0);
        assert_eq!(model.shared_slices(&windows), 7200.0 + 12.0 + 6.0 * 2.0 + 4.0 * 3.0 + 3.0 * 4.0);
    }

    #[test]
    fn hopping_windows_recur_by_slide() {
        let w = WindowSpec::hopping(2, 10);
        let model = CostModel::new(&[w], 1.0);
        assert_eq!(model.recurrences(&w), 1.0);
        let model = CostModel { eta: 3.0, period: 30 };
        assert_eq!(model.recurrences(&w), 11.0);
        assert_eq!(model.cost(&w, Input::Stream), 330.0);
    }
}
