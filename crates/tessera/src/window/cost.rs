//! The multi-window cost model: the work of computing a set of windows over one period with
//! `eta` events per time unit and group key (the paper's stream has one group; with keys, an
//! instance's merges happen once per key it holds, so the rate that weighs events against
//! merges is each key's, and a grouped query's cost is this one's times its keys). The period is `lcm(S, R)`, `S` the lcm of the slides and `R` of
//! the ranges, so the coverage-graph plans (counted per `R` in the paper) and the slicing plans
//! (per `S`, Table 1) are compared over the same stretch of time.
//!
//! Window `W<r, s>` recurs `n = P/s` times per period `P`. Computed from the raw
//! stream, one instance touches `eta * r` events; computed from a covering window `W'`, it
//! merges `M(W, W')` of its partial aggregates (the covering multiplier). A sliced plan touches
//! every event once per slicing (`T = eta * P`) and merges, for each window instance, the slices
//! it spans, or, through a sliding aggregator (two stacks), each slice twice (pushed, then folded
//! into the suffixes when the stacks flip) and each instance once (the two stacks' tops), which is
//! flat in `r/s` where merging every spanned slice is linear. A running value (COUNT, SUM, AVG)
//! merges each slice twice too (added, then subtracted) and no instance; the model counts the
//! dearer two stacks for both.
//!
//! Beyond the paper: a merge combines one instance's partial aggregate of a key into another's,
//! and the runtime pays, per instance merged, a cost that does not depend on the keys it holds
//! (finding the instance, walking its table, closing it). Per key that is small when instances
//! hold many keys and dominant when they hold few, so with the number of keys known
//! (`SET keys = N`) a merge weighs `1 + MERGE_OVERHEAD / max(N, 10)` events instead of one. That is the
//! paper's model at the rate `eta / weight`, scaled by the weight, so every algorithm (and its
//! fast paths) applies unchanged to the stream weight [`CostModel::stream_weight`].

use super::slicing::Slicing;
use super::{lcm, WindowSpec};

/// Where a window's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Stream,
    Window(WindowSpec),
}

/// What merging one instance into another costs beyond its keys' merges, in events: fitted to
/// the runtime's times over 42 generated window sets at 10, 100 and 1,000 keys (docs/benchmark-log,
/// 2026-12-01 (late evening)), where a merge measured 4.7, 1.9 and 1.4 times an event.
pub const MERGE_OVERHEAD: f64 = 40.0;

/// Below this many keys per instance a merge weighs no more than at it: what an instance costs
/// whatever its input (its table, its closing, its rows out) is then most of its work, and
/// charged to merges alone (41 events at one key) it made the model read windows from the
/// stream where merging ran faster (docs/benchmark-log, 2026-12-01 (late night)).
pub const FEWEST_KEYS_WEIGHED: f64 = 10.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub eta: f64,
    /// `R`: the least common multiple of the ranges of the query's windows.
    pub period: i64,
    /// Events one merge of a key's partial aggregates weighs: 1 in the paper's model.
    pub merge_weight: f64,
}

impl CostModel {
    /// The model for a set of (output) windows.
    pub fn new(windows: &[WindowSpec], eta: f64) -> Self {
        CostModel { eta, period: windows.iter().fold(1, |acc, w| lcm(lcm(acc, w.range), w.slide)), merge_weight: 1.0 }
    }

    /// The model for windows holding `keys` distinct group keys (`None`: many, the paper's).
    pub fn with_keys(self, keys: Option<f64>) -> Self {
        CostModel { merge_weight: merge_weight(keys), ..self }
    }

    /// What an instance read from the stream weighs against one merge, per unit of range: the
    /// rate the paper's formulas take.
    pub fn stream_weight(&self) -> f64 {
        self.eta / self.merge_weight
    }

    /// `n`: instances of `w` per period, `P / s`. The paper's `1 + (P/r - 1) * r/s` counts the
    /// instances lying inside one period; it is the same for tumbling windows, but a stream
    /// runs many periods and a hopping window starts `P / s` instances in each (Table 1 counts
    /// the same way), so that is what a period costs.
    pub fn recurrences(&self, w: &WindowSpec) -> f64 {
        self.period as f64 / w.slide as f64
    }

    /// The work of one instance of `w` from `input`.
    pub fn instance_cost(&self, w: &WindowSpec, input: Input) -> f64 {
        match input {
            Input::Stream => self.eta * w.range as f64,
            Input::Window(parent) => self.merge_weight * w.covering_multiplier(&parent) as f64,
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

    /// Events per period: `T`.
    pub fn events(&self) -> f64 {
        self.eta * self.period as f64
    }

    /// The final aggregation of `w` on `slicing`: the slices its instances span, per period
    /// (Table 1's final-aggregate column, counted exactly: the slicing repeats every lcm of
    /// slides, so one repetition is enumerated and scaled).
    pub fn sliced_final(&self, w: &WindowSpec, slicing: &Slicing) -> f64 {
        let repeat = lcm(slicing.period(), w.slide);
        let spanned: i64 = (0..repeat / w.slide).map(|m| slicing.slices_in(w, m)).sum();
        self.merge_weight * spanned as f64 * self.period as f64 / repeat as f64
    }

    /// The final aggregation of `w` on `slicing` through a sliding aggregator: every slice of a
    /// period pushed and folded once (2 merges), every instance combining the two stacks' tops
    /// (1 merge).
    pub fn sliding_final(&self, w: &WindowSpec, slicing: &Slicing) -> f64 {
        let slices = slicing.slices_per_period() as f64 * self.period as f64 / slicing.period() as f64;
        self.merge_weight * (2.0 * slices + self.recurrences(w))
    }

    /// The cheaper final aggregation of `w` on `slicing`, and whether it slides.
    pub fn cheaper_final(&self, w: &WindowSpec, slicing: &Slicing) -> (f64, bool) {
        let (merged, sliding) = (self.sliced_final(w, slicing), self.sliding_final(w, slicing));
        if sliding < merged {
            (sliding, true)
        } else {
            (merged, false)
        }
    }

    /// Shared slices, each window combining them the cheaper way: merging the slices of each
    /// instance or sliding over them.
    pub fn shared_sliding(&self, windows: &[WindowSpec]) -> f64 {
        let slicing = Slicing::shared(windows);
        self.events() + windows.iter().map(|w| self.cheaper_final(w, &slicing).0).sum::<f64>()
    }

    /// Unshared paired windows: every window slices the stream itself (`n * T`) and merges
    /// its own paired slices.
    pub fn unshared_paired(&self, windows: &[WindowSpec]) -> f64 {
        windows.iter().map(|w| self.events() + self.sliced_final(w, &Slicing::paired(w))).sum()
    }

    /// Shared paired windows: one common slicing (`T`) whose slices every window merges.
    pub fn shared_paired(&self, windows: &[WindowSpec]) -> f64 {
        let slicing = Slicing::shared(windows);
        self.events() + windows.iter().map(|w| self.sliced_final(w, &slicing)).sum::<f64>()
    }
}

/// Events one merge weighs with `keys` distinct group keys per instance (`None`: many).
pub fn merge_weight(keys: Option<f64>) -> f64 {
    keys.map_or(1.0, |k| 1.0 + MERGE_OVERHEAD / k.max(FEWEST_KEYS_WEIGHED))
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
    fn slicing_costs_of_tumbling_windows() {
        // W1: tumbling 10, 20, 30, 40 minutes in seconds; shared slices of 600 s.
        let windows = tumbling(&[600, 1200, 1800, 2400]);
        let model = CostModel::new(&windows, 1.0);
        assert_eq!(model.period, 7200);
        assert_eq!(model.baseline(&windows), 28800.0);
        assert_eq!(model.shared_paired(&windows), 7200.0 + 12.0 + 6.0 * 2.0 + 4.0 * 3.0 + 3.0 * 4.0);
        // Unshared, each window is its own slice: the baseline's partial work plus one merge
        // per instance (the paper: UP is no better than BL on tumbling windows).
        assert_eq!(model.unshared_paired(&windows), 4.0 * 7200.0 + 12.0 + 6.0 + 4.0 + 3.0);
    }

    #[test]
    fn table_1_costs_of_hopping_windows() {
        // W<10, 3> and W<6, 4>: S = 12, R = 30, period lcm(S, R) = 60, eta 2: T = 120.
        let (a, b) = (WindowSpec::hopping(3, 10), WindowSpec::hopping(4, 6));
        let model = CostModel::new(&[a, b], 2.0);
        assert_eq!(model.period, 60);
        // Paired: W<10,3> spans 2*3+1 = 7 slices, W<6,4> (slices 2 and 2) spans 3; 20 and 15
        // instances per period.
        assert_eq!(model.unshared_paired(&[a, b]), 2.0 * 120.0 + 20.0 * 7.0 + 15.0 * 3.0);
        // Shared: edges over 12 are {0,1,2,3,4,6,7,8,9,10} (starts and ends mod 12), E = 10.
        // Per 12, W<10,3>'s instances span 9, 8, 9, 8 slices (Table 1's E * r/s says 33.3) and
        // W<6,4>'s 5, 5, 5 (E * r/s = 15); times 5 per period.
        let shared = Slicing::shared(&[a, b]);
        assert_eq!(shared.slices_per_period(), 10);
        assert_eq!(model.shared_paired(&[a, b]), 120.0 + 5.0 * 34.0 + 5.0 * 15.0);
    }

    #[test]
    fn sliding_over_slices_is_flat_in_range_over_slide() {
        let model_of = |w: &WindowSpec| CostModel::new(std::slice::from_ref(w), 1.0);
        for ratio in [1, 2, 3, 4, 30, 1000] {
            let w = WindowSpec::hopping(60, 60 * ratio);
            let model = model_of(&w);
            let slicing = Slicing::shared(&[w]);
            let instances = model.recurrences(&w);
            // Merging: every instance merges `ratio` slices; sliding: 3 merges per instance.
            assert_eq!(model.sliced_final(&w, &slicing), instances * ratio as f64);
            assert_eq!(model.sliding_final(&w, &slicing), instances * 3.0);
            assert_eq!(model.cheaper_final(&w, &slicing).1, ratio > 3, "ratio {ratio}");
        }
        // A tumbling window is one slice per instance: never worth sliding.
        let w = WindowSpec::tumbling(600);
        assert!(!model_of(&w).cheaper_final(&w, &Slicing::shared(&[w])).1);
        // Shared sliding is never dearer than shared paired.
        let (a, b) = (WindowSpec::hopping(3, 10), WindowSpec::hopping(4, 6));
        let model = CostModel::new(&[a, b], 2.0);
        assert!(model.shared_sliding(&[a, b]) <= model.shared_paired(&[a, b]));
    }

    #[test]
    fn known_keys_weigh_merges_as_the_paper_model_at_a_lower_rate() {
        let (a, b) = (WindowSpec::hopping(3, 10), WindowSpec::hopping(4, 6));
        let paper = CostModel::new(&[a, b], 2.0);
        assert_eq!(paper.with_keys(None), paper);
        let few = paper.with_keys(Some(10.0));
        assert_eq!(few.merge_weight, 5.0);
        assert_eq!(few.stream_weight(), 0.4);
        // Events cost what they did; every merge five times as much: the paper's cost at
        // eta / 5, times 5.
        let slower = CostModel { eta: 0.4, ..paper };
        assert_eq!(few.baseline(&[a, b]), paper.baseline(&[a, b]));
        for cost in [CostModel::unshared_paired, CostModel::shared_paired, CostModel::shared_sliding] {
            assert!((cost(&few, &[a, b]) - 5.0 * cost(&slower, &[a, b])).abs() < 1e-9);
        }
        let (t10, t20) = (WindowSpec::tumbling(10), WindowSpec::tumbling(20));
        let model = CostModel::new(&[t10, t20], 1.0).with_keys(Some(10.0));
        assert_eq!(model.cost(&t20, Input::Window(t10)), 5.0 * 2.0);
        assert_eq!(model.cost(&t20, Input::Stream), 20.0);
        // Fewer than ten keys weigh a merge as ten do: 5 events.
        assert_eq!(merge_weight(Some(1.0)), 5.0);
        assert_eq!(merge_weight(Some(3.0)), merge_weight(Some(FEWEST_KEYS_WEIGHED)));
        assert_eq!(merge_weight(Some(20.0)), 3.0);
    }

    #[test]
    fn hopping_windows_recur_by_slide() {
        let w = WindowSpec::hopping(2, 10);
        let model = CostModel::new(&[w], 1.0);
        assert_eq!(model.period, 10);
        assert_eq!(model.recurrences(&w), 5.0);
        let model = CostModel { eta: 3.0, period: 30, merge_weight: 1.0 };
        assert_eq!(model.recurrences(&w), 15.0);
        assert_eq!(model.cost(&w, Input::Stream), 450.0);
    }
}
