//! ChooseWindowStrategy: how one group of windows (same source, WHERE, keys and aggregates) is
//! evaluated. Six strategies are costed in one model over one period (see
//! [`crate::window::cost`]) and the cheapest runs, unless the script forces one:
//!
//! - `baseline`: every window on its own, each instance aggregating its events from the stream;
//! - `unshared_paired`: every window on its own paired slices;
//! - `shared_paired`: one common slicing for all windows (Krishnamurthy et al.);
//! - `shared_sliding`: the same slices, but a hopping window whose instances span many of
//!   them combines them through a sliding aggregator (a running value for COUNT and SUM or
//!   AVG, see `exec::running_window`, two stacks otherwise) instead of merging all the slices
//!   of every instance;
//! - `wcg`: the window coverage graph, windows computed from the instances of a covering
//!   window (Algorithm 1);
//! - `wcg_factor`: the coverage graph with factor windows (Algorithm 2).
//!
//! The result is a list of window nodes, parents before children, each saying where its input
//! comes from; the runtime executes exactly that.

use serde::Serialize;

use super::share_windows::{min_cost_forest, min_cost_with_factor_windows, SharedPlan};
use crate::window::cost::{merge_weight, CostModel, Input};
use crate::window::slicing::Slicing;
use crate::window::{Sharing, WindowSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Baseline,
    UnsharedPaired,
    SharedPaired,
    SharedSliding,
    Wcg,
    WcgFactor,
}

impl Strategy {
    /// Every strategy, in the order `auto` prefers them when costs tie.
    pub const ALL: [Strategy; 6] = [
        Strategy::Wcg,
        Strategy::WcgFactor,
        Strategy::SharedPaired,
        Strategy::SharedSliding,
        Strategy::Baseline,
        Strategy::UnsharedPaired,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Baseline => "baseline",
            Strategy::UnsharedPaired => "unshared_paired",
            Strategy::SharedPaired => "shared_paired",
            Strategy::SharedSliding => "shared_sliding",
            Strategy::Wcg => "wcg",
            Strategy::WcgFactor => "wcg_factor",
        }
    }

    pub fn parse(name: &str) -> Option<Strategy> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether the windows are evaluated by one operator (sharing its input work) rather than
    /// one operator per window.
    pub fn is_shared(self) -> bool {
        !matches!(self, Strategy::Baseline | Strategy::UnsharedPaired)
    }

    /// Whether the plan can write `EMIT CHANGES` rows: an open instance's current value comes
    /// from the stream or the slices, not from a covering window's instances, which exist only
    /// once closed.
    pub fn emits_changes(self) -> bool {
        !matches!(self, Strategy::Wcg | Strategy::WcgFactor)
    }
}

/// The modeled cost of every strategy over the same period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StrategyCosts {
    pub baseline: f64,
    pub unshared_paired: f64,
    pub shared_paired: f64,
    pub shared_sliding: f64,
    pub wcg: f64,
    pub wcg_factor: f64,
}

impl StrategyCosts {
    pub fn get(&self, strategy: Strategy) -> f64 {
        match strategy {
            Strategy::Baseline => self.baseline,
            Strategy::UnsharedPaired => self.unshared_paired,
            Strategy::SharedPaired => self.shared_paired,
            Strategy::SharedSliding => self.shared_sliding,
            Strategy::Wcg => self.wcg,
            Strategy::WcgFactor => self.wcg_factor,
        }
    }

    /// The cheapest strategy (ties go to the earlier one in [`Strategy::ALL`]).
    pub fn cheapest(&self) -> Strategy {
        self.cheapest_where(|_| true)
    }

    /// The cheapest strategy that `allowed` accepts (there is always one: the baseline).
    pub fn cheapest_where(&self, allowed: impl Fn(Strategy) -> bool) -> Strategy {
        Strategy::ALL
            .into_iter()
            .filter(|&s| allowed(s) || s == Strategy::Baseline)
            .reduce(|best, s| if self.get(s) < self.get(best) { s } else { best })
            .expect("the baseline is always allowed")
    }
}

/// Where a window node's rows or partial aggregates come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeInput {
    /// Every instance aggregates its own events from the stream.
    Stream,
    /// Instances combine the slices of the operator's slicing: each instance merges its slices,
    /// or, `sliding`, a two-stacks aggregator pushes each slice once and pops it when the
    /// instances move past it.
    Slices { sliding: bool },
    /// Instances merge the partial aggregates of instances of the node at this index.
    Window(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct WindowNode {
    pub spec: WindowSpec,
    /// False for factor windows: computed for others, not emitted.
    pub output: bool,
    pub input: NodeInput,
    /// The node's own modeled cost per period (for sliced inputs, merging its slices; the
    /// slicing's cost of touching each event is the plan's `partial_cost`).
    pub cost: f64,
}

/// The plan of one group of windows.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowGroupPlan {
    pub sharing: Sharing,
    pub eta: f64,
    /// Distinct group keys the model assumed (`None`: many, the paper's model).
    pub keys: Option<f64>,
    pub period: i64,
    pub costs: StrategyCosts,
    pub strategy: Strategy,
    /// Parents before children.
    pub nodes: Vec<WindowNode>,
    /// Cost of slicing the stream (sliced strategies), per period.
    pub partial_cost: f64,
}

impl WindowGroupPlan {
    pub fn cost(&self) -> f64 {
        self.costs.get(self.strategy)
    }

    /// This plan, node for node, costed by the model told `keys` (another plan may be the
    /// cheapest there: a coverage graph's tree depends on what merges weigh).
    pub fn cost_for_keys(&self, keys: Option<f64>) -> f64 {
        let model = CostModel { eta: self.eta, period: self.period, merge_weight: merge_weight(keys) };
        let outputs: Vec<WindowSpec> = self.nodes.iter().map(|n| n.spec).collect();
        let shared = Slicing::shared(&outputs);
        let nodes: f64 = self
            .nodes
            .iter()
            .map(|n| match n.input {
                NodeInput::Stream => model.cost(&n.spec, Input::Stream),
                NodeInput::Window(p) => model.cost(&n.spec, Input::Window(self.nodes[p].spec)),
                NodeInput::Slices { sliding } => {
                    let paired;
                    let slicing = if self.strategy == Strategy::UnsharedPaired {
                        paired = Slicing::paired(&n.spec);
                        &paired
                    } else {
                        &shared
                    };
                    if sliding {
                        model.sliding_final(&n.spec, slicing)
                    } else {
                        model.sliced_final(&n.spec, slicing)
                    }
                }
            })
            .sum();
        // Slicing touches each event once per slicing, whatever merges weigh.
        nodes + self.partial_cost
    }

    /// Whether `other` evaluates the windows the same way (costs aside).
    pub fn same_nodes(&self, other: &WindowGroupPlan) -> bool {
        let shape = |p: &WindowGroupPlan| p.nodes.iter().map(|n| (n.spec, n.output, n.input)).collect::<Vec<_>>();
        shape(self) == shape(other)
    }
}

/// Costs every strategy for the distinct `windows` at `eta` events per time unit and key over
/// `keys` keys, and plans the forced one, or the cheapest.
pub fn plan_window_group(
    windows: &[WindowSpec],
    sharing: Sharing,
    (eta, keys): (f64, Option<f64>),
    forced: Option<Strategy>,
) -> WindowGroupPlan {
    let mut distinct: Vec<WindowSpec> = Vec::new();
    for w in windows {
        if !distinct.contains(w) {
            distinct.push(*w);
        }
    }
    let model = CostModel::new(&distinct, eta).with_keys(keys);
    let outputs: Vec<(WindowSpec, bool)> = distinct.iter().map(|w| (*w, true)).collect();
    let wcg = min_cost_forest(&outputs, sharing, &model);
    let wcg_factor = min_cost_with_factor_windows(&distinct, sharing, &model);
    let costs = StrategyCosts {
        baseline: model.baseline(&distinct),
        unshared_paired: model.unshared_paired(&distinct),
        shared_paired: model.shared_paired(&distinct),
        shared_sliding: model.shared_sliding(&distinct),
        wcg: wcg.total_cost,
        wcg_factor: wcg_factor.total_cost,
    };
    let strategy = forced.unwrap_or_else(|| costs.cheapest());
    // Every window on `slicing`, combining slices the cheaper way if `may_slide`.
    let sliced = |slicing: &dyn Fn(&WindowSpec) -> Slicing, may_slide: bool| {
        distinct
            .iter()
            .map(|w| {
                let slicing = slicing(w);
                let (cost, sliding) =
                    if may_slide { model.cheaper_final(w, &slicing) } else { (model.sliced_final(w, &slicing), false) };
                WindowNode { spec: *w, output: true, input: NodeInput::Slices { sliding }, cost }
            })
            .collect::<Vec<_>>()
    };
    let shared = || Slicing::shared(&distinct);
    let (nodes, partial_cost) = match strategy {
        Strategy::Baseline => (
            distinct
                .iter()
                .map(|w| WindowNode {
                    spec: *w,
                    output: true,
                    input: NodeInput::Stream,
                    cost: model.cost(w, Input::Stream),
                })
                .collect(),
            0.0,
        ),
        Strategy::UnsharedPaired => (sliced(&|w| Slicing::paired(w), false), model.events() * distinct.len() as f64),
        Strategy::SharedPaired => {
            let shared = shared();
            (sliced(&|_| shared.clone(), false), model.events())
        }
        Strategy::SharedSliding => {
            let shared = shared();
            (sliced(&|_| shared.clone(), true), model.events())
        }
        Strategy::Wcg => (coverage_nodes(&wcg), 0.0),
        Strategy::WcgFactor => (coverage_nodes(&wcg_factor), 0.0),
    };
    WindowGroupPlan { sharing, eta, keys, period: model.period, costs, strategy, nodes, partial_cost }
}

/// The nodes of a coverage-graph plan, parents first: a covering window is never longer than
/// the windows it covers, and never slides by more.
fn coverage_nodes(plan: &SharedPlan) -> Vec<WindowNode> {
    let mut windows = plan.windows.clone();
    windows.sort_by_key(|w| (w.spec.range, w.spec.slide));
    windows
        .iter()
        .map(|w| WindowNode {
            spec: w.spec,
            output: w.output,
            input: match w.input {
                Input::Stream => NodeInput::Stream,
                Input::Window(parent) => {
                    NodeInput::Window(windows.iter().position(|p| p.spec == parent).expect("the parent is planned"))
                }
            },
            cost: w.cost,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_7_costs_and_the_factor_window_plan() {
        let windows: Vec<WindowSpec> = [20, 30, 40].iter().map(|&r| WindowSpec::tumbling(r)).collect();
        let plan = plan_window_group(&windows, Sharing::PartitionedBy, (1.0, None), Some(Strategy::WcgFactor));
        assert_eq!(plan.period, 120);
        assert_eq!(plan.costs.baseline, 360.0);
        assert_eq!(plan.costs.wcg, 246.0);
        assert_eq!(plan.costs.wcg_factor, 150.0);
        let specs: Vec<(i64, bool, NodeInput)> = plan.nodes.iter().map(|n| (n.spec.range, n.output, n.input)).collect();
        assert_eq!(
            specs,
            vec![
                (10, false, NodeInput::Stream),
                (20, true, NodeInput::Window(0)),
                (30, true, NodeInput::Window(0)),
                (40, true, NodeInput::Window(1)),
            ]
        );
        assert_eq!(plan.nodes.iter().map(|n| n.cost).sum::<f64>(), plan.cost());
        // Shared slices cut at 0, 20, 30, 40, 60, 80, 90, 100: every event once (120) and 8
        // slices merged per window per period, 6 less than the factor window's plan.
        assert_eq!(plan.costs.shared_paired, 144.0);
        assert_eq!(plan.costs.cheapest(), Strategy::SharedPaired);
        // Example 6 (10, 20, 30, 40): the coverage graph is cheapest.
        let windows: Vec<WindowSpec> = [10, 20, 30, 40].iter().map(|&r| WindowSpec::tumbling(r)).collect();
        let plan = plan_window_group(&windows, Sharing::CoveredBy, (1.0, None), None);
        assert_eq!((plan.strategy, plan.cost(), plan.costs.shared_paired), (Strategy::Wcg, 150.0, 168.0));
    }

    #[test]
    fn sliding_windows_choose_slices() {
        // W2: HOP 1 min / 30 min: from the stream each event is in 30 instances.
        let plan = plan_window_group(&[WindowSpec::hopping(60, 1800)], Sharing::PartitionedBy, (1.0, None), None);
        // Slices of a minute, or a factor window of a minute: the same work.
        assert_eq!(plan.costs.shared_paired, plan.costs.wcg_factor);
        assert_eq!(plan.costs.baseline, 20.0 * plan.costs.shared_paired);
        // Sliding over the 30 slices of a period: each pushed and folded once, each of the 30
        // instances one merge, against 30 merges per instance.
        assert_eq!((plan.strategy, plan.cost()), (Strategy::SharedSliding, 1800.0 + 2.0 * 30.0 + 30.0));
        assert_eq!(plan.nodes[0].input, NodeInput::Slices { sliding: true });
        let forced = plan_window_group(
            &[WindowSpec::hopping(60, 1800)],
            Sharing::PartitionedBy,
            (1.0, None),
            Some(Strategy::Baseline),
        );
        assert_eq!(forced.nodes[0].input, NodeInput::Stream);
        assert_eq!(forced.cost(), plan.costs.baseline);
    }

    #[test]
    fn auto_is_never_costlier_than_any_strategy_on_generated_sets() {
        use crate::window::generators::{generate, Generator, GeneratorParams, SplitMix};
        let mut rng = SplitMix::new(3);
        for generator in Generator::ALL {
            for tumbling in [false, true] {
                let params = GeneratorParams { tumbling, ..GeneratorParams::default() };
                let sharing = if tumbling { Sharing::PartitionedBy } else { Sharing::CoveredBy };
                for size in [5, 10] {
                    for (eta, keys) in [(1.0, None), (10.0, None), (100.0, None), (1.0, Some(10.0)), (10.0, Some(1.0))]
                    {
                        let windows = generate(generator, size, &params, &mut rng);
                        let plan = plan_window_group(&windows, sharing, (eta, keys), None);
                        for strategy in Strategy::ALL {
                            assert!(
                                plan.cost() <= plan.costs.get(strategy),
                                "{windows:?} {strategy:?} {:?}",
                                plan.costs
                            );
                            if eta != 10.0 {
                                continue;
                            }
                            // A forced plan costs what the model says for it, node by node.
                            let forced = plan_window_group(&windows, sharing, (eta, keys), Some(strategy));
                            let summed = forced.partial_cost + forced.nodes.iter().map(|n| n.cost).sum::<f64>();
                            assert!((summed - forced.cost()).abs() <= 1e-6 * forced.cost(), "{strategy:?} {windows:?}");
                            // Costed again for its own keys, a plan costs what it was planned
                            // at; a plan made for many keys, costed for 10, what the same plan
                            // made for 10 costs whenever the keys leave its nodes unchanged.
                            assert!((forced.cost_for_keys(keys) - forced.cost()).abs() <= 1e-6 * forced.cost());
                            let few = plan_window_group(&windows, sharing, (eta, Some(10.0)), Some(strategy));
                            let paper = plan_window_group(&windows, sharing, (eta, None), Some(strategy));
                            if few.same_nodes(&paper) {
                                let recosted = paper.cost_for_keys(Some(10.0));
                                assert!((recosted - few.cost()).abs() <= 1e-6 * few.cost(), "{strategy:?} {windows:?}");
                            } else {
                                // Only a coverage graph's tree moves; Algorithm 1's is optimal.
                                assert!(matches!(strategy, Strategy::Wcg | Strategy::WcgFactor), "{strategy:?}");
                                if strategy == Strategy::Wcg {
                                    assert!(few.cost() <= paper.cost_for_keys(Some(10.0)) * (1.0 + 1e-9));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
