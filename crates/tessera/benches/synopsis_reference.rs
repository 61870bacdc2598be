//! The 2-step funnel, (login, purchase) pairs per user, over streams of growing length held in
//! memory: the reference evaluator of the tests (every event kept, Figure 1 applied literally),
//! the general synopsis evaluator and the funnel's counter chains, on the same events, with
//! their answers compared. Compute only (no file, no SQL); the reference runs "as far as it
//! goes": a size is tried only while 100 times the previous one's time (it is at least
//! quadratic) fits in `--budget` seconds.
//!
//! ```text
//! cargo bench -p tessera --bench synopsis_reference -- [--users 1000] [--max-events 10000000] [--budget 20]
//! ```

#[path = "../tests/it/temporal_reference.rs"]
mod temporal_reference;

use std::sync::Arc;
use std::time::Instant;

use tessera::synopsis::conjunctive::{self, Allowed, Block, ConjunctiveQuery};
use tessera::synopsis::{Atom, ChainSynopsis, Count, Key, PartitionIds, Program, Synopsis, Value};
use tessera::window::generators::SplitMix;

use temporal_reference::{Event, Reference};

/// Events with kinds login (2 in 10), purchase (1 in 10) and others, of `users` users, 5
/// instants apart (as the file benchmark's milliseconds).
fn stream(events: usize, users: u64) -> Vec<Event> {
    let mut rng = SplitMix::new(17);
    (0..events)
        .map(|i| {
            let kind = match rng.next_u64() % 10 {
                0 | 1 => 0,
                2 => 1,
                _ => 2,
            };
            Event { t: 5 * i as i64, kind, cols: [rng.next_u64() % users, 0, 0] }
        })
        .collect()
}

fn funnel() -> ConjunctiveQuery {
    let alias = |label: &str| Atom { label: label.into(), vars: vec![0] };
    ConjunctiveQuery {
        variables: vec!["user_id".into(), "unused1".into(), "unused2".into()],
        atoms: vec![alias("a"), alias("b")],
        blocks: vec![Block { aliases: vec![0, 1], conditions: vec![(0, 1, Allowed::from_sql("<").unwrap())] }],
        group: vec![0],
        distinct: false,
    }
}

type Answer = Vec<(Vec<Value>, Count)>;

fn listed(answer: Vec<(Key, Count)>) -> Answer {
    answer.into_iter().map(|(k, c)| (k.to_vec(), c)).collect()
}

/// The general evaluator, instant by instant.
fn general(program: &Arc<Program>, events: &[Event]) -> (Answer, usize) {
    let mut synopsis = Synopsis::new(Arc::clone(program));
    let mut i = 0;
    while i < events.len() {
        let t = events[i].t;
        let mut instant = Vec::new();
        while i < events.len() && events[i].t == t {
            let e = events[i];
            if e.kind < 2 {
                instant.push((e.kind, Key::from([e.cols[0]]), 1));
            }
            i += 1;
        }
        synopsis.apply(t, instant).expect("apply");
    }
    let last = events.last().map_or(0, |e| e.t);
    (listed(synopsis.answer(last).expect("answer")), synopsis.state_bytes())
}

/// The counter chains, event by event.
fn chains(program: &Arc<Program>, events: &[Event]) -> (Answer, usize) {
    let mut chains = ChainSynopsis::new(Arc::clone(program)).expect("chains");
    let mut ids = PartitionIds::new(program);
    for e in events.iter().filter(|e| e.kind < 2) {
        let partition = ids.id(&[e.cols[0]]).expect("partition");
        chains.add(e.t, partition, e.kind, 1).expect("add");
    }
    let mut answer = std::collections::BTreeMap::new();
    chains.answer_into(&|p| ids.key(p), &mut answer).expect("answer");
    (listed(answer.into_iter().collect()), chains.state_bytes())
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (users, max_events, budget) =
        (arg("--users", 1000.0) as u64, arg("--max-events", 1e7) as usize, arg("--budget", 20.0));
    let query = funnel();
    let rewritten = conjunctive::to_temporal(&query).expect("funnel");
    let program = Arc::new(Program::compile(&rewritten.query).expect("program"));
    println!("# the 2-step funnel over {users} users, compute only; state: bytes held at the end");
    println!("events, reference s, reference state, general s, general state, chains s, chains state, chains events/s");
    let mut reference_goes = true;
    let mut n = 10;
    while n <= max_events {
        let events = stream(n, users);
        let ((general_answer, general_state), general_s) = timed(|| general(&program, &events));
        let ((chain_answer, chain_state), chain_s) = timed(|| chains(&program, &events));
        assert_eq!(chain_answer, general_answer, "{n} events: the chains and the general evaluator differ");
        let reference = if reference_goes {
            // Atom `i` of the funnel is alias `i`: logins are kind 0, purchases kind 1.
            let last = events.last().map_or(0, |e| e.t);
            let (answer, seconds) = timed(|| Reference::new(&rewritten.query, &events, last).answer(last));
            assert_eq!(answer, general_answer, "{n} events: the reference and the synopsis differ");
            // It reads every instant before each instant it answers, for every valuation: at
            // least quadratic in the stream's length, so the next size is tried only while
            // 100 times this one fits the budget.
            reference_goes = seconds * 100.0 < budget;
            // What it keeps: every event (instant, kind, three values).
            format!("{seconds:.3}, {}", n * std::mem::size_of::<Event>())
        } else {
            "n/a, n/a".to_string()
        };
        println!(
            "{n}, {reference}, {general_s:.3}, {general_state}, {chain_s:.4}, {chain_state}, {:.0}",
            n as f64 / chain_s
        );
        n *= 10;
    }
}
