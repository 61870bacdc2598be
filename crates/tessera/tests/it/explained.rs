//! What EXPLAIN prints is what runs: for every strategy, the window nodes of EXPLAIN's JSON
//! (window, input, parent window, sliding aggregator) equal, node for node, those the operators
//! built from the same physical plan report while the script runs.

use serde_json::Value;
use tessera::engine::Script;
use tessera::optimizer::window_strategy::Strategy;
use tessera::physical::WindowInput;
use tessera::window::WindowSpec;

use super::harness::run_batches;
use super::properties::{batches, event_strategy};

/// A node as both sides describe it: range, slide, input kind, parent window, aggregator.
type Described = (i64, i64, String, Option<(i64, i64)>, Option<String>);

fn explained(script: &Script) -> Vec<Described> {
    let json = tessera::explain::explain_json(script);
    let windows = json["queries"][0]["windows"].as_array().cloned().unwrap_or_default();
    let spec_of = |name: &str| {
        windows.iter().find(|w| w["name"] == name).map(|w| (w["range"].as_i64().unwrap(), w["slide"].as_i64().unwrap()))
    };
    let mut nodes: Vec<Described> = windows
        .iter()
        .map(|w| {
            let input = w["input"].as_str().unwrap_or_default();
            let (kind, parent) = match input {
                "stream" | "slices" => (input.to_string(), None),
                parent => ("window".to_string(), spec_of(parent)),
            };
            let kind = if w["sliding"] == Value::Bool(true) { "sliding".to_string() } else { kind };
            let aggregator = w["sliding_aggregator"].as_str().map(str::to_string);
            (w["range"].as_i64().unwrap(), w["slide"].as_i64().unwrap(), kind, parent, aggregator)
        })
        .collect();
    nodes.sort();
    nodes
}

fn running(operators: &[Vec<(WindowSpec, WindowInput)>]) -> Vec<Described> {
    let mut nodes: Vec<Described> = operators
        .iter()
        .flat_map(|nodes| {
            nodes.iter().map(|(spec, input)| {
                let (kind, parent, aggregator) = match input {
                    WindowInput::Stream => ("stream", None, None),
                    WindowInput::Slices => ("slices", None, None),
                    WindowInput::Sliding(a) => ("sliding", None, Some(a.name().to_string())),
                    WindowInput::Window(p) => ("window", Some((nodes[*p].0.range, nodes[*p].0.slide)), None),
                };
                (spec.range, spec.slide, kind.to_string(), parent, aggregator)
            })
        })
        .collect();
    nodes.sort();
    nodes
}

#[test]
fn explain_prints_the_nodes_the_operators_run_under_every_strategy() {
    use proptest::strategy::{Strategy as _, ValueTree};
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let events = event_strategy().new_tree(&mut runner).unwrap().current();
    let source =
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
           WITH (path = 'unused.csv', time_unit = 's');\n";
    let query = |aggregates: &str, window: &str| {
        format!(
            "SELECT k, window_start, window_end, {aggregates} FROM {window} GROUP BY k, window_start, window_end;\n"
        )
    };
    let scripts = [
        // Nested tumbling windows (a coverage graph), a factor window candidate, MIN.
        [
            "TUMBLE(s, ts, INTERVAL '10' SECOND)",
            "TUMBLE(s, ts, INTERVAL '20' SECOND)",
            "TUMBLE(s, ts, INTERVAL '30' SECOND)",
        ]
        .map(|w| query("MIN(v)", w))
        .concat(),
        // Sliding windows: a running value for SUM and COUNT, two stacks for MAX.
        [
            "HOP(s, ts, INTERVAL '2' SECOND, INTERVAL '40' SECOND)",
            "HOP(s, ts, INTERVAL '4' SECOND, INTERVAL '40' SECOND)",
        ]
        .map(|w| query("SUM(v), COUNT(*)", w))
        .concat(),
        ["HOP(s, ts, INTERVAL '2' SECOND, INTERVAL '40' SECOND)", "TUMBLE(s, ts, INTERVAL '8' SECOND)"]
            .map(|w| query("MAX(v), FIRST_VALUE(v)", w))
            .concat(),
    ];
    for body in scripts {
        let text = format!("{source}{body}");
        for strategy in Strategy::ALL.map(Some).into_iter().chain([None]) {
            let mut script = Script::compile(&text, std::path::Path::new(".")).unwrap();
            script.settings.window_strategy = strategy;
            let outcome = run_batches(&text, batches(&events, 7), 1, strategy).expect("run");
            let (explained, running) = (explained(&script), running(&outcome.stats.window_nodes));
            assert!(!running.is_empty(), "{strategy:?}");
            assert_eq!(explained, running, "{strategy:?}\n{body}");
        }
    }
}
