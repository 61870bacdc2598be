//! The physical plan: what runs, as one value. [`PhysicalPlan::new`] turns a script's bound
//! queries and the optimizer's choices (its window groups, their strategies and modeled costs)
//! into the operators of every source: each operator's output slots, its window nodes, where
//! each node's partial states come from and, for a node sliding over slices, the sliding
//! aggregator. The runtime instantiates exactly this value and EXPLAIN prints it, so nothing
//! downstream decides a second time.
//!
//! ```text
//!  queries ──▶ optimizer::window_groups ──▶ PhysicalPlan { sources: [ { operators: [...] } ], groups }
//!                                               │                          │
//!                                               ▼                          ▼
//!                                    exec (instantiates it)      explain (prints it)
//! ```

use std::sync::Arc;

use crate::aggregate::slides_on_running_value;
use crate::optimizer::window_strategy::{NodeInput, Strategy};
use crate::optimizer::WindowGroup;
use crate::plan::{BranchPlan, QueryPlan, StatelessPlan, WindowAggregatePlan};
use crate::window::slicing::Slicing;
use crate::window::WindowSpec;

/// Every source's operators, and the window groups they evaluate.
#[derive(Debug, Clone)]
pub struct PhysicalPlan {
    /// Sources in the order they are read: the order the script's queries first name them.
    pub sources: Vec<SourcePlan>,
    /// The optimizer's window groups, with their strategies and modeled costs.
    pub groups: Vec<WindowGroup>,
}

/// The operators reading one source.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    /// The source's name, lower-cased.
    pub source: String,
    /// The queries reading it (indices in the script).
    pub queries: Vec<usize>,
    pub operators: Vec<OperatorPlan>,
}

/// One operator: what it evaluates, and the query each of its output slots belongs to.
#[derive(Debug, Clone)]
pub struct OperatorPlan {
    pub queries: Vec<usize>,
    pub kind: OperatorKind,
}

#[derive(Debug, Clone)]
pub enum OperatorKind {
    /// A branch without a window: a filter and a projection, one output slot.
    Stateless(StatelessPlan),
    /// Window nodes of one group feeding output slots that share WHERE, keys and aggregates.
    Windows(WindowsPlan),
    /// A continuous temporal query's synopsis.
    Synopsis(Arc<crate::plan::TemporalPlan>),
    /// A continuous query kept whole: every event of the source, answered by a batch engine.
    Prefix(Arc<crate::plan::PrefixPlan>),
}

impl OperatorKind {
    /// The branch whose WHERE and group keys a window operator reads rows by (`None`: a
    /// stateless branch).
    pub fn window_shape(&self) -> Option<&WindowAggregatePlan> {
        match self {
            OperatorKind::Stateless(_) | OperatorKind::Synopsis(_) | OperatorKind::Prefix(_) => None,
            OperatorKind::Windows(windows) => windows.slots.first().map(|s| s.as_ref()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct WindowsPlan {
    /// The group in [`PhysicalPlan::groups`] the nodes belong to.
    pub group: usize,
    /// Parents before children.
    pub nodes: Vec<WindowNodePlan>,
    /// The branch of each output slot.
    pub slots: Vec<Arc<WindowAggregatePlan>>,
}

impl WindowsPlan {
    /// The slicing of the operator: cut at the boundaries of every node that reads the stream
    /// or the slices (a node fed by another reads that one's instances).
    pub fn slicing(&self) -> Slicing {
        let roots: Vec<WindowSpec> =
            self.nodes.iter().filter(|n| !matches!(n.input, WindowInput::Window(_))).map(|n| n.spec).collect();
        Slicing::shared(&roots)
    }
}

/// A window node as it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowNodePlan {
    pub spec: WindowSpec,
    pub input: WindowInput,
    /// The output slots it feeds (none for a factor window).
    pub slots: Vec<usize>,
    /// Its node in the group's plan (whose cost and name EXPLAIN shows).
    pub group_node: usize,
}

/// Where a window node's instances get their partial states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowInput {
    /// Every instance aggregates its own rows from the stream.
    Stream,
    /// Every instance merges the slices it spans.
    Slices,
    /// The instances slide over the slices with a sliding aggregator.
    Sliding(SlidingAggregator),
    /// Instances merge the closed instances of the operator's node at this index.
    Window(usize),
}

impl WindowInput {
    /// Whether the node reads the operator's slices.
    pub fn reads_slices(self) -> bool {
        matches!(self, WindowInput::Slices | WindowInput::Sliding(_))
    }
}

/// How a hopping window slides over its slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidingAggregator {
    /// One value per key: slices entering are added and slices leaving taken away exactly
    /// (COUNT, SUM, AVG).
    RunningValue,
    /// Two stacks of partial aggregates (any mergeable aggregate).
    TwoStacks,
}

impl SlidingAggregator {
    /// The aggregator for windows computing `aggregates`: a running value when every one of
    /// them can be taken away exactly.
    pub fn for_aggregates(aggregates: &[crate::aggregate::AggregateSpec]) -> Self {
        if slides_on_running_value(aggregates) {
            SlidingAggregator::RunningValue
        } else {
            SlidingAggregator::TwoStacks
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SlidingAggregator::RunningValue => "running value",
            SlidingAggregator::TwoStacks => "two stacks",
        }
    }
}

impl PhysicalPlan {
    /// The plan of `queries`, whose window branches the optimizer grouped and planned as
    /// `groups`: per source, one operator per stateless branch, and per window group one
    /// operator evaluating all its nodes (shared strategies) or one per node.
    pub fn new(queries: &[QueryPlan], groups: Vec<WindowGroup>) -> Self {
        let mut sources: Vec<SourcePlan> = Vec::new();
        for (q, query) in queries.iter().enumerate() {
            let source = match sources.iter_mut().find(|s| s.source == query.source) {
                Some(source) => source,
                None => {
                    sources.push(SourcePlan {
                        source: query.source.clone(),
                        queries: Vec::new(),
                        operators: Vec::new(),
                    });
                    sources.last_mut().expect("just pushed")
                }
            };
            source.queries.push(q);
            for branch in &query.branches {
                let kind = match branch {
                    BranchPlan::Stateless(stateless) => OperatorKind::Stateless(stateless.clone()),
                    BranchPlan::Temporal(temporal) => OperatorKind::Synopsis(Arc::clone(temporal)),
                    BranchPlan::Prefix(prefix) => OperatorKind::Prefix(Arc::clone(prefix)),
                    BranchPlan::WindowAggregate(_) => continue,
                };
                source.operators.push(OperatorPlan { queries: vec![q], kind });
            }
        }
        for (g, group) in groups.iter().enumerate() {
            let Some(source) = sources.iter_mut().find(|s| s.source == group.source) else { continue };
            source.operators.extend(window_operators(g, group));
        }
        PhysicalPlan { sources, groups }
    }

    /// The plan of the source named `name`.
    pub fn source(&self, name: &str) -> Option<&SourcePlan> {
        self.sources.iter().find(|s| s.source == name)
    }

    /// The window operators of group `g`, in the order they run.
    pub fn group_operators(&self, g: usize) -> impl Iterator<Item = &WindowsPlan> {
        self.sources.iter().flat_map(|s| &s.operators).filter_map(move |o| match &o.kind {
            OperatorKind::Windows(w) if w.group == g => Some(w),
            _ => None,
        })
    }

    /// The window groups query `q` takes part in, with their indices.
    pub fn query_groups(&self, q: usize) -> impl Iterator<Item = (usize, &WindowGroup)> {
        self.groups.iter().enumerate().filter(move |(_, g)| g.members.iter().any(|m| m.query == q))
    }

    /// The strategies the groups of query `q` run, without repeats, in order.
    pub fn query_strategies(&self, q: usize) -> Vec<Strategy> {
        let mut strategies = Vec::new();
        for (_, group) in self.query_groups(q) {
            if !strategies.contains(&group.plan.strategy) {
                strategies.push(group.plan.strategy);
            }
        }
        strategies
    }
}

/// The operators of window group `g`: one for all its nodes under a shared strategy, else one
/// per node.
fn window_operators(g: usize, group: &WindowGroup) -> Vec<OperatorPlan> {
    let node_sets: Vec<Vec<usize>> = if group.plan.strategy.is_shared() {
        vec![(0..group.plan.nodes.len()).collect()]
    } else {
        (0..group.plan.nodes.len()).map(|n| vec![n]).collect()
    };
    let aggregator = group.members.first().map(|m| SlidingAggregator::for_aggregates(&m.plan.aggregates));
    node_sets
        .into_iter()
        .map(|node_set| {
            let members: Vec<_> = group.members.iter().filter(|m| node_set.contains(&m.node)).collect();
            let nodes = node_set
                .iter()
                .map(|&n| {
                    let planned = &group.plan.nodes[n];
                    let input = match planned.input {
                        NodeInput::Stream => WindowInput::Stream,
                        NodeInput::Slices { sliding: false } => WindowInput::Slices,
                        NodeInput::Slices { sliding: true } => {
                            WindowInput::Sliding(aggregator.unwrap_or(SlidingAggregator::TwoStacks))
                        }
                        NodeInput::Window(p) => WindowInput::Window(
                            node_set.iter().position(|&x| x == p).expect("a shared plan holds every parent"),
                        ),
                    };
                    let slots = members.iter().enumerate().filter(|(_, m)| m.node == n).map(|(s, _)| s).collect();
                    WindowNodePlan { spec: planned.spec, input, slots, group_node: n }
                })
                .collect();
            OperatorPlan {
                queries: members.iter().map(|m| m.query).collect(),
                kind: OperatorKind::Windows(WindowsPlan {
                    group: g,
                    nodes,
                    slots: members.iter().map(|m| Arc::clone(&m.plan)).collect(),
                }),
            }
        })
        .collect()
}
