//! Plan rewrites chosen by cost. Each rule is one file; the cost model they share is
//! [`crate::window::cost`]. [`window_groups`] is the entry point the runtime, EXPLAIN and the
//! statistics all use, so what is explained is what runs.

pub mod share_windows;
pub mod window_strategy;

use std::sync::Arc;

use crate::aggregate::common_sharing;
use crate::plan::{BranchPlan, EmitMode, QueryPlan, WindowAggregatePlan};
use window_strategy::{plan_window_group, Strategy, WindowGroupPlan};

/// A window branch of a query in a group.
#[derive(Debug, Clone)]
pub struct GroupMember {
    /// Index of the query in the script.
    pub query: usize,
    pub plan: Arc<WindowAggregatePlan>,
    /// The node of the group's plan that computes this branch's window.
    pub node: usize,
}

/// Window branches, from any queries of a script, that read one source the same way (same
/// WHERE, keys and aggregates) and are therefore planned and evaluated together.
#[derive(Debug, Clone)]
pub struct WindowGroup {
    pub source: String,
    pub members: Vec<GroupMember>,
    pub plan: WindowGroupPlan,
}

/// Groups the window branches of `queries` and plans each group (`forced` strategy, or the
/// cheapest for `eta` events per time unit and key over `keys` keys, as
/// [`plan_window_group`] takes them; one key where the windows have no GROUP BY keys).
pub fn window_groups(queries: &[QueryPlan], rates: (f64, Option<f64>), forced: Option<Strategy>) -> Vec<WindowGroup> {
    // (source, input signature, members as (query, plan))
    type Members = Vec<(usize, Arc<WindowAggregatePlan>)>;
    let mut grouped: Vec<(String, String, Members)> = Vec::new();
    for (query, plan) in queries.iter().enumerate() {
        for branch in &plan.branches {
            if let BranchPlan::WindowAggregate(w) = branch {
                let signature = w.input_signature();
                match grouped.iter_mut().find(|(source, s, _)| *source == plan.source && *s == signature) {
                    Some((_, _, members)) => members.push((query, Arc::clone(w))),
                    None => grouped.push((plan.source.clone(), signature, vec![(query, Arc::clone(w))])),
                }
            }
        }
    }
    grouped
        .into_iter()
        .map(|(source, _, members)| {
            let windows: Vec<_> = members.iter().map(|(_, p)| p.window).collect();
            let plan = plan_group(&windows, &members[0].1, rates, forced);
            let members = members
                .into_iter()
                .map(|(query, p)| {
                    let node = plan
                        .nodes
                        .iter()
                        .position(|n| n.output && n.spec == p.window)
                        .expect("every output window has a node");
                    GroupMember { query, plan: p, node }
                })
                .collect();
            WindowGroup { source, members, plan }
        })
        .collect()
}

impl WindowGroup {
    /// The cheapest plan of the group, as [`window_groups`] plans it, at other `rates`.
    pub fn replanned(&self, rates: (f64, Option<f64>)) -> WindowGroupPlan {
        let windows: Vec<_> = self.members.iter().map(|m| m.plan.window).collect();
        plan_group(&windows, &self.members[0].plan, rates, None)
    }
}

/// Plans `windows`, read the way `first` (any member) reads rows.
fn plan_group(
    windows: &[crate::window::WindowSpec],
    first: &WindowAggregatePlan,
    rates: (f64, Option<f64>),
    forced: Option<Strategy>,
) -> WindowGroupPlan {
    let sharing = common_sharing(first.aggregates.iter().map(|a| a.function));
    // Without GROUP BY keys every instance holds one group: the model is told so.
    let rates = match rates {
        (eta, None) if first.keys.is_empty() => (eta, Some(1.0)),
        rates => rates,
    };
    // EMIT CHANGES needs every open window's value: the cheapest plan that has it, even over a
    // forced coverage-graph strategy.
    let changes = first.emit == EmitMode::Changes;
    let forced = match forced {
        Some(strategy) if !changes || strategy.emits_changes() => Some(strategy),
        _ if changes => {
            Some(plan_window_group(windows, sharing, rates, None).costs.cheapest_where(Strategy::emits_changes))
        }
        _ => None,
    };
    plan_window_group(windows, sharing, rates, forced)
}
