//! Synopses against the reference evaluator (`temporal_reference`), which keeps the whole prefix
//! of the stream and applies the paper's Figure 1 literally at every instant; conjunctive
//! queries and counter chains against counting their tuples of events directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tessera::synopsis::conjunctive::{self, Allowed, Block, ConjunctiveQuery};
use tessera::synopsis::{
    Atom, ChainSynopsis, Count, Formula, PartitionIds, Program, SinceCount, Synopsis, TemporalQuery, Value, Var,
};
use tessera::window::generators::SplitMix;

use crate::temporal_reference::{Event, Reference};

fn pick(rng: &mut SplitMix, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Events at random instants in `[0, span)`, some instants empty, some crowded.
fn random_stream(rng: &mut SplitMix, kinds: usize, span: i64, values: u64) -> Vec<Event> {
    let mut events = Vec::new();
    for t in 0..span {
        if pick(rng, 3) == 0 {
            continue;
        }
        for _ in 0..pick(rng, 4) {
            let cols = [rng.next_u64() % values, rng.next_u64() % values, rng.next_u64() % values];
            events.push(Event { t, kind: pick(rng, kinds), cols });
        }
    }
    events
}

/// Applies `events` to a synopsis instant by instant, and after each one, and at the empty
/// instants until the next, compares its answer with `expected(t)`.
fn check_every_instant(
    program: Program,
    events: &[Event],
    until: i64,
    mut expected: impl FnMut(i64) -> Vec<(Vec<Value>, Count)>,
    what: &str,
) {
    let program = Arc::new(program);
    let mut synopsis = Synopsis::new(Arc::clone(&program));
    let mut i = 0;
    let Some(first) = events.first() else { return };
    for t in first.t..=until {
        let mut instant = Vec::new();
        while i < events.len() && events[i].t == t {
            let e = events[i];
            for (a, atom) in program.atoms.iter().enumerate() {
                if atom_matches(a, &e) {
                    instant.push((a, atom.vars.iter().map(|&v| e.cols[v]).collect(), 1));
                }
            }
            i += 1;
        }
        if !instant.is_empty() {
            synopsis.apply(t, instant).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        let got: Vec<(Vec<Value>, Count)> = synopsis
            .answer(t)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .into_iter()
            .map(|(k, c)| (k.to_vec(), c))
            .collect();
        assert_eq!(got, expected(t), "{what} at instant {t}");
    }
}

/// Atom `a` counts the events of kind `a` (for conjunctive queries every event is repeated
/// once per alias whose kind it has, as that alias's kind).
fn atom_matches(a: usize, e: &Event) -> bool {
    e.kind == a
}

fn random_formula(rng: &mut SplitMix, depth: usize, atoms: usize) -> Formula {
    if depth == 0 || pick(rng, 5) == 0 {
        return if pick(rng, 12) == 0 { Formula::True } else { Formula::Atom(pick(rng, atoms)) };
    }
    let sub = |rng: &mut SplitMix| Box::new(random_formula(rng, depth - 1, atoms));
    match pick(rng, 11) {
        0 => Formula::And(sub(rng), sub(rng)),
        1 => Formula::Or(sub(rng), sub(rng)),
        2 => Formula::AndNot(sub(rng), sub(rng)),
        3 => Formula::Not(sub(rng)),
        4 => Formula::Exists(vec![pick(rng, 2)], sub(rng)),
        5 => Formula::Distinct(sub(rng)),
        6 => Formula::Previous(sub(rng)),
        7 => Formula::Since { count: SinceCount::Duration, hold: sub(rng), from: sub(rng) },
        8 => Formula::Since { count: SinceCount::Occurrences, hold: sub(rng), from: sub(rng) },
        9 => Formula::once(SinceCount::Occurrences, random_formula(rng, depth - 1, atoms)),
        _ => Formula::once(SinceCount::Duration, random_formula(rng, depth - 1, atoms)),
    }
}

/// Atoms over variables x (0) and y (1): p(x), q(x), r(x, y), z().
fn formula_atoms() -> Vec<Atom> {
    let atom = |label: &str, vars: Vec<Var>| Atom { label: label.into(), vars };
    vec![atom("p", vec![0]), atom("q", vec![0]), atom("r", vec![0, 1]), atom("z", vec![])]
}

/// Random formulas over random streams: every formula the compiler accepts gives, at every
/// instant, the reference evaluator's answer.
#[test]
fn synopses_equal_the_reference_at_every_instant() {
    let mut rng = SplitMix::new(20261205);
    let (mut accepted, mut attempts) = (0, 0);
    let mut kinds_seen = [0usize; 2];
    while accepted < 400 {
        attempts += 1;
        let body = random_formula(&mut rng, 4, 4);
        let query = TemporalQuery {
            variables: vec!["x".into(), "y".into()],
            atoms: formula_atoms(),
            body,
            group: Vec::new(),
            distinct: pick(&mut rng, 6) == 0,
        };
        let Ok(program) = Program::compile(&query) else { continue };
        // Group by the body's free variables half the time.
        let body_vars: Vec<Var> = {
            let r = Reference::new(&query, &[], 0);
            r.free(&query.body)
        };
        let query =
            TemporalQuery { group: body_vars.into_iter().filter(|_| pick(&mut rng, 2) == 0).collect(), ..query };
        let program = Program::compile(&query).unwrap_or(program);
        accepted += 1;
        kinds_seen[usize::from(program.partition.is_empty())] += 1;
        let events = random_stream(&mut rng, 4, 24, 3);
        let what = format!("case {accepted}: {} grouped by {:?}", program.formula(), query.group);
        check_every_instant(program, &events, 30, |t| Reference::new(&query, &events, t).answer(t), &what);
    }
    assert!(attempts < 20 * accepted, "the generator makes mostly refused formulas: {attempts} for {accepted}");
    assert!(kinds_seen.iter().all(|&k| k > 20), "partitioned and global formulas both tested: {kinds_seen:?}");
}

/// Hand-written formulas the issue names, against the reference on longer streams with long
/// empty stretches (so lines between events are exercised far out).
#[test]
fn named_formulas_equal_the_reference() {
    let (p, q, r, z) = (Formula::Atom(0), Formula::Atom(1), Formula::Atom(2), Formula::Atom(3));
    let cases = [
        // More failures (p) than successes (q) so far, per x.
        Formula::and_not(
            Formula::once(SinceCount::Occurrences, p.clone()),
            Formula::once(SinceCount::Occurrences, q.clone()),
        ),
        // Alarms (p) per device since its last service (q).
        Formula::since(SinceCount::Occurrences, Formula::Not(Box::new(q.clone())), p.clone()),
        // Instants since the last service.
        Formula::since(SinceCount::Duration, Formula::Not(Box::new(q.clone())), q.clone()),
        // Instants since the first p.
        Formula::once(SinceCount::Duration, p.clone()),
        Formula::Previous(Box::new(Formula::Previous(Box::new(r.clone())))),
        Formula::and(Formula::once(SinceCount::Duration, z.clone()), Formula::once(SinceCount::Occurrences, p.clone())),
        Formula::Distinct(Box::new(Formula::since(SinceCount::Duration, Formula::Not(Box::new(p.clone())), r.clone()))),
    ];
    let mut rng = SplitMix::new(7);
    for (c, body) in cases.into_iter().enumerate() {
        let query = TemporalQuery {
            variables: vec!["x".into(), "y".into()],
            atoms: formula_atoms(),
            body,
            group: Vec::new(),
            distinct: false,
        };
        let program = Program::compile(&query).unwrap_or_else(|e| panic!("case {c}: {e}"));
        // Bursts of events with long gaps.
        let mut events = random_stream(&mut rng, 4, 12, 2);
        events.extend(random_stream(&mut rng, 4, 6, 2).into_iter().map(|e| Event { t: e.t + 90, ..e }));
        let what = format!("case {c}: {}", program.formula());
        check_every_instant(program, &events, 140, |t| Reference::new(&query, &events, t).answer(t), &what);
    }
}

/// What a conjunctive query counts at `t`, by enumerating every tuple of events.
fn count_tuples(q: &ConjunctiveQuery, alias_kinds: &[usize], events: &[Event], t: i64) -> Vec<(Vec<Value>, Count)> {
    let prefix: Vec<&Event> = events.iter().filter(|e| e.t <= t).collect();
    let mut answer: BTreeMap<Vec<Value>, Count> = BTreeMap::new();
    for block in &q.blocks {
        let k = block.aliases.len();
        let mut chosen: Vec<&Event> = Vec::with_capacity(k);
        fn extend<'e>(
            q: &ConjunctiveQuery,
            block: &Block,
            alias_kinds: &[usize],
            prefix: &[&'e Event],
            chosen: &mut Vec<&'e Event>,
            answer: &mut BTreeMap<Vec<Value>, Count>,
        ) {
            let i = chosen.len();
            if i == block.aliases.len() {
                let mut theta: HashMap<Var, Value> = HashMap::new();
                for (j, e) in chosen.iter().enumerate() {
                    for &v in &q.atoms[block.aliases[j]].vars {
                        if *theta.entry(v).or_insert(e.cols[v]) != e.cols[v] {
                            return;
                        }
                    }
                }
                for &(a, b, allowed) in &block.conditions {
                    let (ta, tb) = (chosen[a].t, chosen[b].t);
                    let ok = (ta < tb && allowed.before) || (ta == tb && allowed.same) || (ta > tb && allowed.after);
                    if !ok {
                        return;
                    }
                }
                *answer.entry(q.group.iter().map(|g| theta[g]).collect()).or_insert(0) += 1;
                return;
            }
            for e in prefix.iter().filter(|e| e.kind == alias_kinds[block.aliases[i]]) {
                chosen.push(e);
                extend(q, block, alias_kinds, prefix, chosen, answer);
                chosen.pop();
            }
        }
        extend(q, block, alias_kinds, &prefix, &mut chosen, &mut answer);
    }
    answer.into_iter().map(|(k, c)| (k, if q.distinct { c.min(1) } else { c })).collect()
}

/// A random union of conjunctive queries over variables u, v, w: each alias binds u and one
/// or two more; conditions compare random pairs of times. Returns the query and each alias's
/// event kind.
fn cq_case(rng: &mut SplitMix) -> (ConjunctiveQuery, Vec<usize>) {
    let ops = ["<", "<=", "=", ">=", ">", "<>"];
    let mut atoms = Vec::new();
    let mut kinds = Vec::new();
    let mut blocks = Vec::new();
    let shared_u = pick(rng, 3) != 0;
    for _ in 0..1 + usize::from(pick(rng, 4) == 0) {
        let k = 1 + pick(rng, 4);
        let mut aliases = Vec::new();
        for _ in 0..k {
            let mut vars = if shared_u { vec![0] } else { Vec::new() };
            for v in [1, 2] {
                if pick(rng, 3) == 0 {
                    vars.push(v);
                }
            }
            aliases.push(atoms.len());
            atoms.push(Atom { label: format!("e{}", atoms.len()), vars });
            kinds.push(pick(rng, 3));
        }
        let mut conditions = Vec::new();
        for _ in 0..pick(rng, k + 1) {
            let (a, b) = (pick(rng, k), pick(rng, k));
            if a != b {
                conditions.push((a, b, Allowed::from_sql(ops[pick(rng, ops.len())]).unwrap()));
            }
        }
        blocks.push(Block { aliases, conditions });
    }
    // Group by u when every alias binds it.
    let group = if shared_u && pick(rng, 2) == 0 { vec![0] } else { Vec::new() };
    let q = ConjunctiveQuery {
        variables: vec!["u".into(), "v".into(), "w".into()],
        atoms,
        blocks,
        group,
        distinct: pick(rng, 5) == 0,
    };
    (q, kinds)
}

/// Random conjunctive queries and unions of them (Lemmas 4.8 and 4.9): the synopsis counts, at
/// every instant, what enumerating the tuples of events counts.
#[test]
fn conjunctive_queries_equal_counting_their_tuples() {
    let mut rng = SplitMix::new(4242);
    let mut cases = 0;
    while cases < 250 {
        let (q, kinds) = cq_case(&mut rng);
        let rewritten = match conjunctive::to_temporal(&q) {
            Ok(r) => r,
            Err(e) => {
                assert!(e.to_string().contains("contradict"), "{e}");
                continue;
            }
        };
        cases += 1;
        let program = Program::compile(&rewritten.query).unwrap_or_else(|e| panic!("{q:?}: {e}"));
        // Events carry the kind of the alias's event; the synopsis's atoms are per alias.
        let events = random_stream(&mut rng, 3, 14, 2);
        let per_alias: Vec<Event> = events
            .iter()
            .flat_map(|e| {
                kinds.iter().enumerate().filter(|(_, &k)| k == e.kind).map(move |(a, _)| Event { kind: a, ..*e })
            })
            .collect();
        let what = format!("case {cases}: {q:?} as {}", program.formula());
        // Counter chains exactly when every alias binds the same variables and counts are kept.
        let same_vars = q.atoms.iter().all(|a| {
            let (mut x, mut y) = (a.vars.clone(), q.atoms[0].vars.clone());
            x.sort_unstable();
            y.sort_unstable();
            x == y
        });
        assert_eq!(program.chains.is_some(), same_vars && !q.distinct, "{what}");
        let space = program.space;
        check_every_instant(program, &per_alias, 16, |t| count_tuples(&q, &kinds, &events, t), &what);
        assert_eq!(space.name(), if q.distinct { "bounded" } else { "log-bounded" }, "{what}");
    }
}

/// Funnels (every alias binds the same variables: none, `u`, or `u` and `v` in either order):
/// their counter chains count, at every instant, what enumerating the tuples of events counts.
#[test]
fn counter_chains_equal_counting_their_tuples() {
    let ops = ["<", "<=", "=", ">=", ">", "<>"];
    let mut rng = SplitMix::new(777);
    let mut cases = 0;
    while cases < 300 {
        let shared: Vec<Var> = [vec![], vec![0], vec![0, 1]][pick(&mut rng, 3)].clone();
        let (mut atoms, mut kinds, mut blocks) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..1 + usize::from(pick(&mut rng, 4) == 0) {
            let k = 1 + pick(&mut rng, 4);
            let aliases: Vec<usize> = (atoms.len()..atoms.len() + k).collect();
            for _ in 0..k {
                let mut vars = shared.clone();
                if pick(&mut rng, 2) == 0 {
                    vars.reverse();
                }
                atoms.push(Atom { label: format!("e{}", atoms.len()), vars });
                kinds.push(pick(&mut rng, 3));
            }
            let mut conditions = Vec::new();
            for _ in 0..pick(&mut rng, k + 2) {
                let (a, b) = (pick(&mut rng, k), pick(&mut rng, k));
                if a != b {
                    conditions.push((a, b, Allowed::from_sql(ops[pick(&mut rng, ops.len())]).unwrap()));
                }
            }
            blocks.push(Block { aliases, conditions });
        }
        let group = if !shared.is_empty() && pick(&mut rng, 3) != 0 { vec![0] } else { Vec::new() };
        let q = ConjunctiveQuery {
            variables: vec!["u".into(), "v".into(), "w".into()],
            atoms,
            blocks,
            group,
            distinct: false,
        };
        let Ok(rewritten) = conjunctive::to_temporal(&q) else { continue };
        cases += 1;
        let program = Arc::new(Program::compile(&rewritten.query).unwrap());
        let what = format!("case {cases}: {q:?} as {}", program.formula());
        assert!(program.chains.is_some(), "{what}");
        let mut chains = ChainSynopsis::new(Arc::clone(&program)).unwrap();
        let mut ids = PartitionIds::new(&program);
        let events = random_stream(&mut rng, 3, 14, 2);
        let mut i = 0;
        for t in 0..16 {
            while i < events.len() && events[i].t == t {
                let e = events[i];
                let key: Vec<Value> = program.partition.iter().map(|&v| e.cols[v]).collect();
                let partition = ids.id(&key).unwrap();
                for (a, _) in kinds.iter().enumerate().filter(|(_, &k)| k == e.kind) {
                    chains.add(t, partition, a, 1).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                i += 1;
            }
            let mut answer = BTreeMap::new();
            chains.answer_into(&|p| ids.key(p), &mut answer).unwrap();
            let got: Vec<(Vec<Value>, Count)> = answer.into_iter().map(|(k, c)| (k.to_vec(), c)).collect();
            assert_eq!(got, count_tuples(&q, &kinds, &events, t), "{what} at instant {t}");
        }
    }
}
