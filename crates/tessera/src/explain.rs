//! EXPLAIN: the plan the optimizer chose for every query, why (the modeled cost of every
//! strategy), as JSON (the stable interface in ARCHITECTURE.md), text or Graphviz.
//!
//! A query's entry describes the window groups it takes part in (usually one): every window
//! node of the chosen plan (factor windows included), the edges that feed each node (from the
//! `stream`, from the shared `slices`, or from a covering window, with the multiplier), and
//! the costs. It prints the script's [`PhysicalPlan`], the value [`crate::engine::run_script`]
//! instantiates: the windows and their inputs are those of the operators that run.

use serde_json::{json, Value};

use crate::engine::Script;
use crate::optimizer::share_windows::exact_min_cost;
use crate::optimizer::window_strategy::Strategy;
use crate::optimizer::WindowGroup;
use crate::physical::{OperatorKind, PhysicalPlan, WindowInput, WindowNodePlan, WindowsPlan};
use crate::plan::{EmitMode, TemporalPlan};
use crate::window::cost::{merge_weight, CostModel};

/// The EXPLAIN JSON object of `script`: `{ "queries": [...] }`.
pub fn explain_json(script: &Script) -> Value {
    let physical = script.physical_plan();
    let groups = &physical.groups;
    let queries: Vec<Value> = script
        .queries
        .iter()
        .enumerate()
        .map(|(q, plan)| {
            let unit = script.catalog.source(&plan.source).map(|s| s.event_time.unit.suffix()).unwrap_or("");
            let mine: Vec<&WindowGroup> = groups.iter().filter(|g| g.members.iter().any(|m| m.query == q)).collect();
            let mut windows = Vec::new();
            let mut edges = Vec::new();
            let mut aggregates: Vec<&str> = Vec::new();
            let mut costs = json!({});
            let mut chosen_strategy: Vec<&str> = Vec::new();
            let mut exact = json!({ "cost": 0.0, "complete": true, "candidates": 0 });
            let names = node_names(q, &mine);
            for (g, (index, group)) in physical.query_groups(q).enumerate() {
                let name = |n: usize| names[g][n].clone();
                let plan = &group.plan;
                let running = running_nodes(&physical, index);
                for &(operator, node) in &running {
                    let n = node.group_node;
                    let aggregator = match node.input {
                        WindowInput::Sliding(aggregator) => Some(aggregator.name()),
                        _ => None,
                    };
                    windows.push(json!({
                        "name": name(n), "range": node.spec.range, "slide": node.spec.slide, "unit": unit,
                        "output": plan.nodes[n].output, "factor": !plan.nodes[n].output,
                        "input": input_name(operator, node, &name),
                        "sliding": aggregator.is_some(),
                        "sliding_aggregator": aggregator,
                        "cost": plan.nodes[n].cost,
                        "queries": group.members.iter().filter(|m| m.node == n).map(|m| m.query + 1).collect::<Vec<_>>(),
                    }));
                }
                edges.extend(group_edges(&running, &name));
                for member in &group.members {
                    for a in &member.plan.aggregates {
                        if !aggregates.contains(&a.function.name()) {
                            aggregates.push(a.function.name());
                        }
                    }
                }
                for strategy in Strategy::ALL {
                    add_cost(&mut costs, strategy.name(), plan.costs.get(strategy));
                }
                add_cost(&mut costs, "chosen", plan.cost());
                let windows: Vec<_> = plan.nodes.iter().filter(|n| n.output).map(|n| n.spec).collect();
                let model = CostModel::new(&windows, plan.eta).with_keys(plan.keys);
                let search = exact_min_cost(&windows, plan.sharing, &model, 20, 100_000);
                add_cost(&mut exact, "cost", search.plan.total_cost);
                exact["complete"] = json!(exact["complete"].as_bool() == Some(true) && search.complete);
                exact["candidates"] = json!(exact["candidates"].as_u64().unwrap_or(0) + search.candidates as u64);
                if !chosen_strategy.contains(&plan.strategy.name()) {
                    chosen_strategy.push(plan.strategy.name());
                }
            }
            let synopsis = physical.sources.iter().flat_map(|s| &s.operators).find_map(|o| match &o.kind {
                OperatorKind::Synopsis(t) if o.queries.contains(&q) => Some(synopsis_json(t)),
                _ => None,
            });
            if synopsis.is_some() {
                chosen_strategy.push("synopsis");
            }
            // A query no bounded synopsis answers, kept whole under allow_unbounded_state.
            let kept_whole = physical.sources.iter().flat_map(|s| &s.operators).find_map(|o| match &o.kind {
                OperatorKind::Prefix(p) if o.queries.contains(&q) => Some(json!({
                    "space_class": "unbounded",
                    "because": p.kept_because,
                    "kept": "every on-time event of the source",
                    "answered_by": "a batch query over the events kept",
                })),
                _ => None,
            });
            if kept_whole.is_some() {
                chosen_strategy.push("kept_whole");
            }
            let first = mine.first().map(|g| &g.plan);
            // The keys per instance the model was told: by `SET keys`, or one where the windows
            // have no GROUP BY keys.
            let keys = first.and_then(|p| p.keys);
            json!({
                "sql": plan.sql,
                "source": plan.source,
                "windows": windows,
                "aggregates": aggregates,
                "semantics": first.map(|p| json!(p.sharing)).unwrap_or(json!("none")),
                "edges": edges,
                "costs": costs,
                // Beyond the paper: the best coverage graph over every subset of the candidate
                // factor windows, to show how far Algorithm 2 (`wcg_factor`) is from it.
                "exact_wcg_factor": exact,
                "partial_cost": mine.iter().map(|g| g.plan.partial_cost).sum::<f64>(),
                "emit": if plan.emit == EmitMode::Changes { "changes" } else { "on_window_close" },
                "chosen_strategy": if chosen_strategy.is_empty() { "stateless".to_string() } else { chosen_strategy.join("+") },
                "forced": script.settings.window_strategy.is_some(),
                "eta": script.settings.eta,
                "keys": keys,
                "keys_from": keys.map(|_| if script.settings.keys.is_some() { "SET keys" } else { "no GROUP BY keys" }),
                "merge_weight": merge_weight(keys),
                "period": first.map(|p| p.period).unwrap_or(0),
                "synopsis": synopsis,
                "kept_whole": kept_whole,
            })
        })
        .collect();
    json!({ "queries": queries })
}

/// What a continuous temporal query's synopsis is: its temporal formula, the linear orders its
/// blocks were split into, the counters it keeps and its space class.
fn synopsis_json(plan: &TemporalPlan) -> Value {
    let blocks: Vec<Value> = plan
        .blocks
        .iter()
        .map(|block| {
            let program = &block.program;
            let names = |vars: &[usize]| vars.iter().map(|&v| program.variables[v].clone()).collect::<Vec<_>>();
            json!({
                "formula": program.formula(),
                "orders": block.orders,
                "atoms": program.atoms.iter().map(|a| json!({ "label": a.label, "variables": names(&a.vars) })).collect::<Vec<_>>(),
                "counters": program.counters(),
                "counter_chains": program.chains.as_ref().map(|c| c.describe(&program.atoms)),
                "partitioned_by": names(&program.partition),
                "grouped_by": names(&program.group),
                "space_class": program.space.name(),
            })
        })
        .collect();
    let log = plan.blocks.iter().any(|b| b.program.space == crate::synopsis::SpaceClass::LogBounded);
    json!({
        "space_class": if log { "log-bounded" } else { "bounded" },
        "counter_bits": 128,
        "blocks": blocks,
    })
}

/// The names of the nodes of query `q`'s groups: the `WINDOWS(...)` name of the query's branch
/// a node computes, else `w1`, `w2`, ... (`g1w1`, ... with several groups). If that would name
/// two nodes alike, every node gets its numbered name.
fn node_names(q: usize, groups: &[&WindowGroup]) -> Vec<Vec<String>> {
    let numbered = |g: usize, n: usize| {
        if groups.len() == 1 {
            format!("w{}", n + 1)
        } else {
            format!("g{}w{}", g + 1, n + 1)
        }
    };
    let named: Vec<Vec<String>> = groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            (0..group.plan.nodes.len())
                .map(|n| {
                    let mut labels = group
                        .members
                        .iter()
                        .filter(|m| m.query == q && m.node == n)
                        .filter_map(|m| m.plan.window_name.clone());
                    match (labels.next(), labels.next()) {
                        (Some(label), None) => label,
                        _ => numbered(g, n),
                    }
                })
                .collect()
        })
        .collect();
    let mut all: Vec<&String> = named.iter().flatten().collect();
    all.sort();
    all.dedup();
    if all.len() == named.iter().map(Vec::len).sum::<usize>() && !all.iter().any(|n| *n == "stream" || *n == "slices") {
        return named;
    }
    groups.iter().enumerate().map(|(g, group)| (0..group.plan.nodes.len()).map(|n| numbered(g, n)).collect()).collect()
}

fn add_cost(costs: &mut Value, key: &str, value: f64) {
    let total = costs.get(key).and_then(Value::as_f64).unwrap_or(0.0) + value;
    costs[key] = json!(total);
}

/// The window nodes of group `g` as they run, in the group's order, each with its operator.
fn running_nodes(physical: &PhysicalPlan, g: usize) -> Vec<(&WindowsPlan, &WindowNodePlan)> {
    let mut nodes: Vec<_> =
        physical.group_operators(g).flat_map(|operator| operator.nodes.iter().map(move |n| (operator, n))).collect();
    nodes.sort_by_key(|(_, n)| n.group_node);
    nodes
}

fn input_name(operator: &WindowsPlan, node: &WindowNodePlan, name: &dyn Fn(usize) -> String) -> String {
    match node.input {
        WindowInput::Stream => "stream".into(),
        WindowInput::Slices | WindowInput::Sliding(_) => "slices".into(),
        WindowInput::Window(p) => name(operator.nodes[p].group_node),
    }
}

/// Edges into every node of `running` ([`running_nodes`]): from a covering window (its
/// covering multiplier), from the stream (the virtual root `W<1,1>` covers a window `r` times)
/// or from the slices of its operator (the most slices an instance merges).
fn group_edges(running: &[(&WindowsPlan, &WindowNodePlan)], name: &dyn Fn(usize) -> String) -> Vec<Value> {
    let mut edges = Vec::new();
    if running.iter().any(|(_, n)| n.input.reads_slices()) {
        edges.push(json!({ "from": "stream", "to": "slices", "multiplier": 1 }));
    }
    for (operator, node) in running {
        let (from, multiplier) = match node.input {
            WindowInput::Stream => ("stream".to_string(), node.spec.range),
            WindowInput::Slices | WindowInput::Sliding(_) => {
                ("slices".to_string(), operator.slicing().most_slices_in(&node.spec))
            }
            WindowInput::Window(p) => {
                let parent = &operator.nodes[p];
                (name(parent.group_node), node.spec.covering_multiplier(&parent.spec))
            }
        };
        edges.push(json!({ "from": from, "to": name(node.group_node), "multiplier": multiplier }));
    }
    edges
}

/// The plan as text: per query the chosen strategy and its cost against every other, then the
/// windows as a tree from the stream. Queries evaluated by one shared plan (the JSON repeats it
/// for each, as every query's object stands alone) show it once, under the first of them.
pub fn explain_text(explained: &Value) -> String {
    let mut text = String::new();
    let mut shown: Vec<(Value, usize)> = Vec::new();
    for (i, q) in explained["queries"].as_array().into_iter().flatten().enumerate() {
        text.push_str(&format!("query {}: {}\n", i + 1, q["sql"].as_str().unwrap_or("")));
        text.push_str(&format!("  source: {}\n", q["source"].as_str().unwrap_or("")));
        if q["emit"] == "changes" {
            text.push_str("  emit: changes (after every input batch, the changed rows of open windows)\n");
        }
        if let Some(synopsis) = q["synopsis"].as_object() {
            synopsis_text(&mut text, synopsis);
            continue;
        }
        if let Some(kept) = q["kept_whole"].as_object() {
            text.push_str(&format!(
                "  kept whole: every on-time event of the source is kept, and a batch query over them answers; the \
                 state grows with the stream\n  because {}\n",
                kept["because"].as_str().unwrap_or("")
            ));
            continue;
        }
        let windows = q["windows"].as_array().cloned().unwrap_or_default();
        if windows.is_empty() {
            text.push_str("  stateless: filter and project each row\n");
            continue;
        }
        let plan = shared_plan(q);
        if let Some((_, first)) = shown.iter().find(|(p, _)| *p == plan) {
            text.push_str(&format!("  evaluated by the plan shown for query {first}\n"));
            continue;
        }
        shown.push((plan, i + 1));
        text.push_str(&format!(
            "  aggregates: {} (windows combine when {})\n",
            q["aggregates"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
            q["semantics"].as_str().unwrap_or("none").replace('_', " ")
        ));
        let how = if q["forced"].as_bool() == Some(true) { "forced by SET window_strategy" } else { "the cheapest" };
        text.push_str(&format!(
            "  strategy: {} ({how}), modeled cost {} per key and {} time units at eta {} (events per time unit and key)\n",
            q["chosen_strategy"].as_str().unwrap_or(""),
            number(&q["costs"]["chosen"]),
            q["period"],
            q["eta"]
        ));
        if let Some(keys) = q["keys"].as_f64() {
            text.push_str(&format!(
                "  group keys: {keys} ({}), so merging an instance's partial aggregates weighs {} events\n",
                q["keys_from"].as_str().unwrap_or(""),
                number(&q["merge_weight"])
            ));
        }
        let mut costs: Vec<(String, f64)> = Strategy::ALL
            .iter()
            .map(|s| (s.name().to_string(), q["costs"][s.name()].as_f64().unwrap_or(f64::NAN)))
            .collect();
        costs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let chosen = q["costs"]["chosen"].as_f64().unwrap_or(f64::NAN);
        text.push_str("  costs of every strategy:\n");
        for (name, cost) in costs {
            let ratio = if chosen > 0.0 { format!("  ({:.2}x the chosen plan)", cost / chosen) } else { String::new() };
            text.push_str(&format!("    {name:<16} {:>14}{ratio}\n", number(&serde_json::json!(cost))));
        }
        let exact = &q["exact_wcg_factor"];
        text.push_str(&format!(
            "    exact search     {:>14}  (best coverage graph over {} candidate factor windows{})\n",
            number(&exact["cost"]),
            exact["candidates"],
            if exact["complete"].as_bool() == Some(true) { ", proven" } else { ", search budget reached" }
        ));
        text.push_str("  plan:\n");
        let unit = windows.first().and_then(|w| w["unit"].as_str()).unwrap_or("").to_string();
        let edges = q["edges"].as_array().cloned().unwrap_or_default();
        tree(&mut text, "stream", &windows, &edges, &unit, 2);
        if q["partial_cost"].as_f64().unwrap_or(0.0) > 0.0 {
            text.push_str(&format!("  slicing the stream costs {}\n", number(&q["partial_cost"])));
        }
    }
    text
}

fn synopsis_text(text: &mut String, synopsis: &serde_json::Map<String, Value>) {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
    };
    let class = synopsis["space_class"].as_str().unwrap_or("");
    let why = match class {
        "bounded" => "set semantics throughout: flags per value, whatever the stream's length",
        _ => "counters per value, whose bits grow with the logarithm of the stream's length",
    };
    text.push_str(&format!("  synopsis: space class {class} ({why}); counters of 128 bits, an overflow is an error\n"));
    let blocks = synopsis["blocks"].as_array().cloned().unwrap_or_default();
    for (b, block) in blocks.iter().enumerate() {
        let indent = if blocks.len() > 1 {
            text.push_str(&format!(
                "  block {} of the UNION ALL ({}):\n",
                b + 1,
                block["space_class"].as_str().unwrap_or("")
            ));
            "    "
        } else {
            "  "
        };
        text.push_str(&format!("{indent}temporal formula: {}\n", block["formula"].as_str().unwrap_or("")));
        let orders = strings(&block["orders"]);
        if !orders.is_empty() {
            text.push_str(&format!(
                "{indent}{} linear order{} of event times (latest first): {}\n",
                orders.len(),
                if orders.len() == 1 { "" } else { "s" },
                orders.join(" | ")
            ));
        }
        for atom in block["atoms"].as_array().into_iter().flatten() {
            let vars = strings(&atom["variables"]);
            text.push_str(&format!("{indent}atom {}({})\n", atom["label"].as_str().unwrap_or(""), vars.join(", ")));
        }
        let partition = strings(&block["partitioned_by"]);
        text.push_str(&format!(
            "{indent}state partitioned by: {}\n",
            if partition.is_empty() { "nothing (one partition)".to_string() } else { partition.join(", ") }
        ));
        match block["counter_chains"].as_str() {
            Some(chains) => text.push_str(&format!(
                "{indent}counters: a chain per partition, one count per step completed so far ({chains}), \
                 each event one increment\n"
            )),
            None => {
                text.push_str(&format!("{indent}counters:\n"));
                for counter in strings(&block["counters"]) {
                    text.push_str(&format!("{indent}  {counter}\n"));
                }
            }
        }
    }
}

/// What a query's plan is made of apart from the query itself: equal for the queries one
/// window group evaluates together.
fn shared_plan(q: &Value) -> Value {
    const FIELDS: [&str; 13] = [
        "source",
        "aggregates",
        "semantics",
        "chosen_strategy",
        "forced",
        "costs",
        "period",
        "eta",
        "keys",
        "windows",
        "edges",
        "exact_wcg_factor",
        "partial_cost",
    ];
    Value::Object(FIELDS.iter().map(|f| (f.to_string(), q[*f].clone())).collect())
}

fn tree(text: &mut String, from: &str, windows: &[Value], edges: &[Value], unit: &str, depth: usize) {
    for edge in edges.iter().filter(|e| e["from"] == from) {
        let to = edge["to"].as_str().unwrap_or("");
        let indent = "  ".repeat(depth);
        match windows.iter().find(|w| w["name"] == to) {
            Some(w) => {
                let role = if w["factor"].as_bool() == Some(true) {
                    "factor window, not output".to_string()
                } else {
                    let queries: Vec<String> =
                        w["queries"].as_array().into_iter().flatten().map(|q| format!("query {q}")).collect();
                    format!("output of {}", queries.join(", "))
                };
                let feed = match from {
                    "stream" => "from every event".to_string(),
                    "slices" if w["sliding"].as_bool() == Some(true) => {
                        let aggregator = w["sliding_aggregator"].as_str().unwrap_or("two stacks");
                        format!("slides over up to {} slices ({aggregator})", edge["multiplier"])
                    }
                    "slices" => format!("merges up to {} slices", edge["multiplier"]),
                    parent => format!("merges {} instances of {parent}", edge["multiplier"]),
                };
                text.push_str(&format!(
                    "  {indent}{to}: range {}{unit}, slide {}{unit}; {feed}; cost {} ({role})\n",
                    w["range"],
                    w["slide"],
                    number(&w["cost"])
                ));
            }
            None => text.push_str(&format!("  {indent}{to}: one slice update per event\n")),
        }
        tree(text, to, windows, edges, unit, depth + 1);
    }
}

/// A cost for people: integers without a fraction, others to two decimals.
fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{}", v as i64),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

/// The EXPLAIN JSON of every query as one Graphviz digraph.
pub fn explain_dot(explained: &Value) -> String {
    let mut dot = String::from("digraph tessera {\n  rankdir=LR;\n  node [shape=box];\n");
    for (i, q) in explained["queries"].as_array().into_iter().flatten().enumerate() {
        let label = format!(
            "query {}: {} (cost {})",
            i + 1,
            q["chosen_strategy"].as_str().unwrap_or(""),
            number(&q["costs"]["chosen"])
        );
        dot.push_str(&format!("  subgraph cluster_q{i} {{\n    label={label:?};\n"));
        dot.push_str(&format!("    q{i}_stream [label=\"stream\", shape=ellipse];\n"));
        for (b, block) in q["synopsis"]["blocks"].as_array().into_iter().flatten().enumerate() {
            let label = format!(
                "synopsis ({}): {}",
                block["space_class"].as_str().unwrap_or(""),
                block["formula"].as_str().unwrap_or("")
            );
            dot.push_str(&format!("    q{i}_synopsis{b} [label={label:?}];\n    q{i}_stream -> q{i}_synopsis{b};\n"));
        }
        if let Some(kept) = q["kept_whole"].as_object() {
            let label = format!("kept whole ({}): every event", kept["space_class"].as_str().unwrap_or(""));
            dot.push_str(&format!("    q{i}_kept [label={label:?}];\n    q{i}_stream -> q{i}_kept;\n"));
        }
        for w in q["windows"].as_array().into_iter().flatten() {
            let name = w["name"].as_str().unwrap_or("");
            let unit = w["unit"].as_str().unwrap_or("");
            let factor = if w["factor"].as_bool() == Some(true) { ", style=dashed" } else { "" };
            let text = format!("{name}: range {}{unit}, slide {}{unit}", w["range"], w["slide"]);
            dot.push_str(&format!("    q{i}_{name} [label={text:?}{factor}];\n"));
        }
        for e in q["edges"].as_array().into_iter().flatten() {
            let (from, to) = (e["from"].as_str().unwrap_or(""), e["to"].as_str().unwrap_or(""));
            dot.push_str(&format!("    q{i}_{from} -> q{i}_{to} [label=\"x{}\"];\n", e["multiplier"]));
        }
        dot.push_str("  }\n");
    }
    dot.push_str("}\n");
    dot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_of_one_window_group_show_its_plan_once() {
        let window = |minutes: i64| {
            format!(
                "SELECT d, window_start, window_end, MIN(t) AS lo FROM TUMBLE(r, ts, INTERVAL '{minutes}' MINUTE)
                 GROUP BY d, window_start, window_end;"
            )
        };
        let text = format!(
            "CREATE SOURCE r (d BIGINT, t DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'r.jsonl', time_unit = 's');
             {}{}
             SELECT d, window_start, window_end, SUM(t) AS total FROM TUMBLE(r, ts, INTERVAL '10' MINUTE)
             GROUP BY d, window_start, window_end;",
            window(10),
            window(20)
        );
        let script = Script::compile(&text, std::path::Path::new("/data")).expect("script");
        let shown = explain_text(&explain_json(&script));
        assert_eq!(shown.matches("costs of every strategy").count(), 2, "{shown}");
        assert!(shown.contains("query 2: SELECT"), "{shown}");
        assert!(shown.contains("  evaluated by the plan shown for query 1\n"), "{shown}");
        // The SUM query reads the same source but combines differently: a plan of its own.
        let third = &shown[shown.find("query 3:").expect("query 3")..];
        assert!(third.contains("costs of every strategy") && third.contains("plan:"), "{shown}");
    }

    #[test]
    fn few_keys_make_merges_dearer_than_reading_the_stream() {
        let text = "CREATE SOURCE s (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 's.csv', time_unit = 's');
             SELECT k, window_start, window_end, MIN(v) AS m FROM HOP(s, ts, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
             GROUP BY k, window_start, window_end
             UNION ALL
             SELECT k, window_start, window_end, MIN(v) AS m FROM HOP(s, ts, INTERVAL '4' SECOND, INTERVAL '20' SECOND)
             GROUP BY k, window_start, window_end;";
        let explained = |settings: &str| {
            let script = Script::compile(&format!("{text}{settings}"), std::path::Path::new("/data")).expect("script");
            explain_json(&script)["queries"][0].clone()
        };
        // The paper's model: sliding over shared slices, 75 against the baseline's 200.
        let many = explained("");
        assert_eq!(many["chosen_strategy"], "shared_sliding");
        assert_eq!((many["keys"].clone(), many["merge_weight"].clone()), (Value::Null, json!(1.0)));
        assert_eq!(many["costs"]["baseline"], json!(200.0));
        // One key: each merge weighs 5 events and every window reads the stream (sliding
        // over the slices: 20 events and 55 merges, 295).
        let one = explained("SET keys = 1;");
        assert_eq!((one["keys"].clone(), one["merge_weight"].clone()), (json!(1.0), json!(5.0)));
        assert_eq!(one["keys_from"], "SET keys");
        assert_eq!(one["costs"]["chosen"], one["costs"]["baseline"]);
        assert_eq!(one["costs"]["shared_sliding"], json!(295.0));
        let edges = one["edges"].as_array().expect("edges");
        assert!(edges.iter().all(|e| e["from"] == "stream"), "{one}");
        // Many keys: the paper's plan again.
        assert_eq!(explained("SET keys = 100000;")["chosen_strategy"], "shared_sliding");
        // Without GROUP BY keys, one key per instance, unless SET keys says otherwise.
        let keyless = text.replace("SELECT k, ", "SELECT ").replace("GROUP BY k, ", "GROUP BY ");
        let script = Script::compile(&keyless, std::path::Path::new("/data")).expect("script");
        let shown = explain_json(&script)["queries"][0].clone();
        assert_eq!((shown["keys"].clone(), shown["keys_from"].clone()), (json!(1.0), json!("no GROUP BY keys")));
        assert_eq!(shown["costs"]["chosen"], shown["costs"]["baseline"]);
        assert!(explain_text(&explain_json(&script)).contains("group keys: 1 (no GROUP BY keys), so merging"));
        let script = Script::compile(&format!("{keyless}SET keys = 100000;"), std::path::Path::new("/data")).unwrap();
        assert_eq!(explain_json(&script)["queries"][0]["chosen_strategy"], "shared_sliding");
    }
}
