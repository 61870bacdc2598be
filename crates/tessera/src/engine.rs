//! The library's entry point: compile a script (sources, settings, queries) and run it.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::catalog::{Catalog, Location, SourceDef};
use crate::connectors::sink::ResultSink;
use crate::connectors::{open_input, BatchReader, ReadOptions};
use crate::error::{Result, TesseraError};
use crate::exec::pipeline::{run_source, Parallelism, ProgressFn, SourceCheckpoints, SourceOptions, SourceRun};
use crate::optimizer::{window_groups, WindowGroup};
use crate::physical::PhysicalPlan;
use crate::plan::{BranchPlan, QueryPlan};
use crate::settings::Settings;
use crate::sql::{binder::bind_query, parse_script_here, ScriptText, Statement, StatementKind};
use crate::state::checkpoint::{fnv64, CheckpointConfig, Checkpointer};
use crate::state::store::StateStore;
use crate::window::WindowSpec;

/// A compiled script: its sources and bound queries.
#[derive(Debug, Clone)]
pub struct Script {
    pub catalog: Catalog,
    pub queries: Vec<QueryPlan>,
    pub settings: Settings,
}

impl Script {
    /// Reads and compiles a script file; paths inside it are relative to its directory.
    pub fn from_file(path: &Path) -> Result<Script> {
        Script::from_file_with(path, &[])
    }

    /// [`from_file`](Self::from_file) with `name=value` settings given outside the script: they
    /// hold from its first statement on and win over its `SET`s.
    pub fn from_file_with(path: &Path, settings: &[String]) -> Result<Script> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TesseraError::io(format!("cannot read {}", path.display()), e))?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        Script::compile_with(&text, base, settings)
    }

    /// The script's window groups, planned with its settings.
    pub fn window_groups(&self) -> Vec<WindowGroup> {
        window_groups(&self.queries, (self.settings.eta, self.settings.keys), self.settings.window_strategy)
    }

    /// The queries kept whole (index, why: no bounded synopsis answers them, or `SET
    /// temporal_strategy` asked): a run warns of them.
    pub fn kept_whole(&self) -> Vec<(usize, &str)> {
        let mut kept = Vec::new();
        for (q, query) in self.queries.iter().enumerate() {
            if let [BranchPlan::Prefix(prefix)] = &query.branches[..] {
                kept.push((q, prefix.kept_because.as_str()));
            }
        }
        kept
    }

    /// What runs: the operators of every source, as [`run_script`] instantiates them and
    /// EXPLAIN prints them.
    pub fn physical_plan(&self) -> PhysicalPlan {
        PhysicalPlan::new(&self.queries, self.window_groups())
    }

    /// Compiles a script's text; paths inside it are relative to `base_dir`. Planning runs on a
    /// thread of its own with a deep stack (see [`crate::sql::nesting`]).
    pub fn compile(text: &str, base_dir: &Path) -> Result<Script> {
        Script::compile_with(text, base_dir, &[])
    }

    /// [`compile`](Self::compile) with `name=value` settings that win over the script's `SET`s.
    pub fn compile_with(text: &str, base_dir: &Path, overrides: &[String]) -> Result<Script> {
        let overrides = overrides
            .iter()
            .map(|assignment| crate::settings::parse_assignment(assignment).map_err(TesseraError::Option))
            .collect::<Result<Vec<_>>>()?;
        let mut settings = Settings::default();
        for (name, value) in &overrides {
            settings.set(name, value).map_err(TesseraError::Option)?;
        }
        Script::compile_with_settings(text, base_dir, settings, &overrides)
    }

    /// [`compile`](Self::compile) starting from a session's `settings`; the names of
    /// `overrides` win over the script's `SET`s.
    pub fn compile_with_settings(
        text: &str,
        base_dir: &Path,
        settings: Settings,
        overrides: &[(String, String)],
    ) -> Result<Script> {
        crate::exec::on_deep_stack("tessera-plan", || {
            Script::plan_here(&parse_script_here(text, base_dir)?, settings, overrides)
        })
    }

    /// The plan of a script's parsed `statements` (of streams: sources, settings and queries),
    /// starting from a session's `settings`; the names of `overrides` win over the script's
    /// `SET`s.
    pub fn plan(statements: &[Statement], settings: Settings, overrides: &[(String, String)]) -> Result<Script> {
        crate::exec::on_deep_stack("tessera-plan", || Script::plan_here(statements, settings, overrides))
    }

    fn plan_here(statements: &[Statement], mut settings: Settings, overrides: &[(String, String)]) -> Result<Script> {
        let mut catalog = Catalog::default();
        let mut queries: Vec<QueryPlan> = Vec::new();
        for statement in statements {
            let script_text = ScriptText::new(&statement.script);
            let location = statement.location();
            match &statement.kind {
                StatementKind::CreateSource(source) => {
                    let name = source.name.clone();
                    catalog
                        .add_source(source.as_ref().clone())
                        .map_err(|_| script_text.error(format!("source `{name}` is already defined"), location))?;
                }
                StatementKind::Set { name, value } => {
                    let error = |m| script_text.error(m, location);
                    if overrides.iter().any(|(overridden, _)| overridden == name) {
                        // Checked, but the value given outside the script holds.
                        Settings::default().set(name, value).map_err(error)?;
                    } else {
                        settings.set(name, value).map_err(error)?;
                    }
                }
                StatementKind::Query { query, emit, .. } => {
                    let plan = bind_query(&catalog, &script_text, query, *emit, &settings)?;
                    // Stdin can be read once: by the queries of one source.
                    let reads_stdin =
                        |q: &QueryPlan| catalog.source(&q.source).is_some_and(|s| s.location == Location::Stdin);
                    if let Some(other) =
                        queries.iter().find(|q| q.source != plan.source && reads_stdin(q) && reads_stdin(&plan))
                    {
                        let name = |q: &QueryPlan| catalog.source(&q.source).map_or(String::new(), |s| s.name.clone());
                        return Err(script_text.error_with_help(
                            format!(
                                "sources `{}` and `{}` both read stdin, which can be read only once",
                                name(other),
                                name(&plan)
                            ),
                            location,
                            Some("give one of them a file, or query one source".into()),
                        ));
                    }
                    queries.push(plan);
                }
                StatementKind::Copy { .. }
                | StatementKind::Refresh { .. }
                | StatementKind::ExplainRefresh { .. }
                | StatementKind::Other(_) => {
                    return Err(script_text.error_with_help(
                        "a script of streams has sources, settings and queries: this statement is for tables",
                        location,
                        Some(
                            "run the script with `tessera run` or `tessera sql`, which run statements on tables".into(),
                        ),
                    ))
                }
            }
        }
        Ok(Script { catalog, queries, settings })
    }
}

/// How a run reads its input and how many workers it uses.
pub struct RunOptions<'a> {
    /// `Fixed` wins over the script's `SET parallelism`, which wins over `Auto`.
    pub parallelism: Parallelism,
    pub read: ReadOptions,
    pub progress: Option<&'a ProgressFn<'a>>,
    /// Save checkpoints, and resume from the last one found.
    pub checkpoints: Option<CheckpointConfig>,
    pub state: StateOptions,
    /// Answers the continuous queries kept whole under `SET allow_unbounded_state` (the
    /// engine has no batch joins of its own).
    pub batch_sql: Option<std::sync::Arc<dyn crate::exec::prefix::BatchSql>>,
}

impl Default for RunOptions<'_> {
    fn default() -> Self {
        RunOptions {
            parallelism: Parallelism::Auto(1),
            read: ReadOptions::default(),
            progress: None,
            checkpoints: None,
            state: StateOptions::default(),
            batch_sql: None,
        }
    }
}

/// Where window operators keep their state: in key groups of `2^group_bits` key ids, in
/// memory up to `memory_bytes` (no limit: the memory backend), the least recently used groups
/// beyond it in the state store: the durable one of the state directory when the run keeps
/// checkpoints, else a temporary one made under `spill_dir` when first needed.
#[derive(Debug, Clone, PartialEq)]
pub struct StateOptions {
    pub memory_bytes: Option<u64>,
    pub spill_dir: std::path::PathBuf,
    pub group_bits: u32,
}

impl Default for StateOptions {
    /// In memory, key groups of 65,536 ids.
    fn default() -> Self {
        StateOptions { memory_bytes: None, spill_dir: std::env::temp_dir(), group_bits: 16 }
    }
}

/// Per-query statistics of a run.
#[derive(Debug, Clone, Serialize)]
pub struct QueryStats {
    pub sql: String,
    pub plan_cost: f64,
    pub chosen_strategy: String,
    pub windows: Vec<WindowSpec>,
    pub rows_out: u64,
    pub late_events: u64,
    /// Window instances emitted (per worker holding them), and the group keys each held on
    /// average before HAVING (`None`: none emitted).
    pub windows_out: u64,
    pub keys_per_window: Option<f64>,
}

/// A window group planned for many keys (`SET keys` unset) whose windows held few: the cost
/// model told the keys the run saw chooses another plan (perhaps of the same strategy: a
/// coverage graph's tree depends on what merges weigh).
#[derive(Debug, Clone, Serialize)]
pub struct KeysHint {
    /// The group's queries, by index in the script.
    pub queries: Vec<usize>,
    /// Group keys per emitted window instance, on average, rounded.
    pub keys: f64,
    pub planned: &'static str,
    pub with_keys: &'static str,
    /// The plan that ran over the other, both costed for `keys`.
    pub modeled_ratio: f64,
}

/// The run's statistics, as written by `--stats-json`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RunStats {
    pub events_in: u64,
    pub rows_out: u64,
    pub late_events: u64,
    pub bad_rows: u64,
    pub elapsed_ms: u64,
    pub events_per_second: f64,
    pub state_bytes_peak: u64,
    /// State reads (of partial aggregates, per row updated and per partial combined to emit).
    pub store_reads: u64,
    pub store_writes: u64,
    /// The reads of `store_reads` that combine partial aggregates to emit rows.
    pub emit_reads: u64,
    /// The disk backend's traffic to its spill store.
    pub spill: crate::exec::SpillCounters,
    /// Checkpoints written (with a state directory), and the milliseconds they took.
    pub checkpoints: u64,
    pub checkpoint_ms: u64,
    /// What each checkpoint wrote.
    pub checkpoint_log: Vec<crate::state::checkpoint::CheckpointRecord>,
    /// Resuming from a checkpoint: the events it held, and the milliseconds spent restoring
    /// the state and moving the input to it.
    pub resumed_events: u64,
    pub recovery_ms: u64,
    /// Workers that computed (the most any source used).
    pub parallelism: usize,
    pub queries: Vec<QueryStats>,
    pub keys_hints: Vec<KeysHint>,
    /// The window nodes of every operator, as the operators built them from the physical plan
    /// (EXPLAIN prints the same nodes).
    #[serde(skip)]
    pub window_nodes: Vec<Vec<(WindowSpec, crate::physical::WindowInput)>>,
}

/// The strategies of the window groups `query` takes part in (one, unless its branches read
/// rows differently).
pub fn query_strategies(groups: &[WindowGroup], query: usize) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for group in groups.iter().filter(|g| g.members.iter().any(|m| m.query == query)) {
        if !names.contains(&group.plan.strategy.name()) {
            names.push(group.plan.strategy.name());
        }
    }
    names
}

/// The windows a query evaluates.
pub fn query_windows(query: &QueryPlan) -> Vec<WindowSpec> {
    query
        .branches
        .iter()
        .filter_map(|b| match b {
            BranchPlan::WindowAggregate(w) => Some(w.window),
            BranchPlan::Stateless(_) | BranchPlan::Temporal(_) | BranchPlan::Prefix(_) => None,
        })
        .collect()
}

/// Runs every query of `script`, source by source, writing results to `sink`.
pub fn run_script(script: &Script, options: &RunOptions, sink: &mut dyn ResultSink) -> Result<RunStats> {
    let mut read = options.read.clone();
    read.batch_size = script.settings.batch_size;
    read.flush_after = std::time::Duration::from_millis(script.settings.input_flush_ms);
    run_script_with_readers(script, options, sink, &mut |source| {
        let read = ReadOptions { dictionary_columns: dictionary_columns(&script.queries, source), ..read.clone() };
        open_input(source.input(), &read)
    })
}

/// The declared columns of `source` that the queries reading it use only bare, as the one
/// group key of their windows or as the argument of aggregates that read dictionaries (a
/// reader may hand these out as dictionaries: see [`ReadOptions::dictionary_columns`]).
pub fn dictionary_columns(queries: &[QueryPlan], source: &SourceDef) -> Vec<usize> {
    use datafusion_physical_expr::expressions::Column;
    use datafusion_physical_expr::utils::collect_columns;
    let (mut bare, mut other) = (Vec::new(), vec![source.event_time.index]);
    // A query kept whole hands every column to the batch engine as plain arrays.
    if queries
        .iter()
        .any(|q| q.source == source.name.to_lowercase() && matches!(q.branches[..], [BranchPlan::Prefix(_)]))
    {
        return Vec::new();
    }
    let mut read = |expr: &crate::plan::ExprRef, bare_here: bool| match expr.downcast_ref::<Column>() {
        Some(column) if bare_here => bare.push(column.index()),
        _ => other.extend(collect_columns(expr).iter().map(Column::index)),
    };
    for query in queries.iter().filter(|q| q.source == source.name.to_lowercase()) {
        for branch in &query.branches {
            match branch {
                BranchPlan::Stateless(plan) => {
                    plan.filter.iter().chain(&plan.projection).for_each(|expr| read(expr, false));
                }
                BranchPlan::Prefix(_) => {}
                BranchPlan::Temporal(plan) => {
                    for atom in plan.blocks.iter().flat_map(|b| &b.atoms) {
                        atom.filter.iter().chain(&atom.projection).for_each(|expr| read(expr, false));
                    }
                }
                BranchPlan::WindowAggregate(plan) => {
                    plan.filter.iter().for_each(|expr| read(expr, false));
                    for aggregate in &plan.aggregates {
                        let takes_dictionary = aggregate.function.reads_dictionaries(aggregate.kind);
                        for (i, arg) in aggregate.args.iter().enumerate() {
                            read(arg, i == 0 && takes_dictionary);
                        }
                    }
                    let one_key = plan.keys.len() == 1;
                    plan.keys.iter().for_each(|key| read(key, one_key));
                }
            }
        }
    }
    bare.sort_unstable();
    bare.dedup();
    bare.retain(|column| !other.contains(column));
    bare
}

/// Like [`run_script`], with the readers of the sources supplied by `open` (for example
/// batches preloaded in memory).
pub fn run_script_with_readers(
    script: &Script,
    options: &RunOptions,
    sink: &mut dyn ResultSink,
    open: &mut dyn FnMut(&SourceDef) -> Result<Box<dyn BatchReader>>,
) -> Result<RunStats> {
    let started = Instant::now();
    // An explicit worker count from the caller wins over `SET parallelism`, which wins over auto.
    let parallelism = match (options.parallelism, script.settings.parallelism) {
        (Parallelism::Fixed(n), _) | (Parallelism::Auto(_), Some(n)) => Parallelism::Fixed(n),
        (auto, None) => auto,
    };
    let plan = script.physical_plan();
    let groups = &plan.groups;
    let mut stats = RunStats {
        queries: script
            .queries
            .iter()
            .enumerate()
            .map(|(q, plan)| {
                let strategies = query_strategies(groups, q);
                QueryStats {
                    sql: plan.sql.clone(),
                    plan_cost: groups
                        .iter()
                        .filter(|g| g.members.iter().any(|m| m.query == q))
                        .map(|g| g.plan.cost())
                        .sum(),
                    chosen_strategy: if strategies.is_empty() { "stateless".to_string() } else { strategies.join("+") },
                    windows: query_windows(plan),
                    rows_out: 0,
                    late_events: 0,
                    windows_out: 0,
                    keys_per_window: None,
                }
            })
            .collect(),
        ..Default::default()
    };
    let mut checkpointer = None;
    let mut resume = None;
    if let Some(config) = &options.checkpoints {
        if let Some(query) = script.queries.iter().find(|q| {
            script.catalog.source(&q.source).is_some_and(|s| matches!(s.location, crate::catalog::Location::Stdin))
        }) {
            return Err(TesseraError::Option(format!(
                "checkpoints need file sources: `{}` reads stdin, which cannot be read again on resume",
                query.source
            )));
        }
        let fingerprint = plan_fingerprint(script, groups, options.state.group_bits);
        let (opened, found) = Checkpointer::open(config.clone(), fingerprint)?;
        checkpointer = Some(opened);
        resume = found;
    }
    let store = std::sync::Arc::new(match &checkpointer {
        Some(checkpointer) => {
            let folder = checkpointer.store_dir();
            if resume.as_ref().is_none_or(|r| r.manifest.position.is_none()) {
                // No checkpoint needs what a run stopped before its first one left there.
                remove_store(&folder)?;
            }
            StateStore::durable(&folder)?
        }
        None => StateStore::temporary(&options.state.spill_dir),
    });
    if let Some(found) = &resume {
        if !found.manifest.complete {
            sink.resume(&found.manifest.sink)?;
        }
    }
    let completed = resume.as_ref().is_some_and(|r| r.manifest.complete);
    // Each source is read once, for all the queries that read it, in the order they appear.
    let mut sources: Vec<&str> = Vec::new();
    for query in &script.queries {
        if !sources.contains(&query.source.as_str()) {
            sources.push(&query.source);
        }
    }
    for (index, name) in sources.into_iter().enumerate() {
        let source =
            script.catalog.source(name).ok_or_else(|| TesseraError::Internal(format!("source {name} vanished")))?;
        let queries: Vec<(usize, &QueryPlan)> =
            script.queries.iter().enumerate().filter(|(_, q)| q.source == name).collect();
        // Resuming past this source: its results are written already.
        if let Some(finished) = resume.as_ref().and_then(|r| r.manifest.finished.get(index)) {
            if !completed {
                for (q, plan) in &queries {
                    sink.open_query(*q, &plan.output_schema)?;
                }
            }
            add_source_run(&mut stats, &queries, finished);
            continue;
        }
        let mut reader = open(source)?;
        let operators = plan.source(name).map_or(&[][..], |s| &s.operators);
        let checkpoints = checkpointer.as_mut().map(|checkpointer| SourceCheckpoints {
            checkpointer,
            source: index,
            resume: resume.as_ref().and_then(|r| {
                r.manifest.position.clone().filter(|p| p.source == index).map(|p| (p, r.snapshot.clone()))
            }),
        });
        let source_options = SourceOptions {
            parallelism,
            progress: options.progress,
            checkpoints,
            state: &options.state,
            store: std::sync::Arc::clone(&store),
            batch_sql: options.batch_sql.as_ref(),
        };
        let run = run_source(source, reader.as_mut(), &queries, operators, sink, source_options)?;
        add_source_run(&mut stats, &queries, &run);
        if let Some(checkpointer) = checkpointer.as_mut() {
            checkpointer.source_finished(run);
        }
    }
    if completed {
        // A finished run: nothing was read and nothing is written again.
        stats.resumed_events = stats.events_in;
        stats.elapsed_ms = started.elapsed().as_millis() as u64;
        return Ok(stats);
    }
    sink.finish()?;
    if let Some(checkpointer) = checkpointer.as_mut() {
        checkpointer.complete(sink.checkpoint()?)?;
        // A complete run needs no state.
        drop(store);
        remove_store(&checkpointer.store_dir())?;
    }
    stats.keys_hints = keys_hints(script, groups, &stats.queries);
    stats.elapsed_ms = started.elapsed().as_millis() as u64;
    // This run's rate: the events a resumed checkpoint held were counted before.
    stats.events_per_second =
        (stats.events_in - stats.resumed_events) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok(stats)
}

/// Removes a durable state store's folder, if there is one.
fn remove_store(folder: &std::path::Path) -> Result<()> {
    match std::fs::remove_dir_all(folder) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(TesseraError::io(format!("cannot remove {}", folder.display()), e))
        }
        _ => Ok(()),
    }
}

/// Adds what running one source produced to the run's statistics.
fn add_source_run(stats: &mut RunStats, queries: &[(usize, &QueryPlan)], run: &SourceRun) {
    stats.events_in += run.events_in;
    stats.checkpoints += run.checkpoints;
    stats.checkpoint_ms += run.checkpoint_ms;
    stats.checkpoint_log.extend(run.checkpoint_log.iter().cloned());
    stats.resumed_events += run.resumed_events;
    stats.recovery_ms += run.recovery_ms;
    stats.parallelism = stats.parallelism.max(run.workers);
    stats.bad_rows += run.bad_rows;
    stats.state_bytes_peak = stats.state_bytes_peak.max(run.state_bytes_peak);
    stats.window_nodes.extend(run.window_nodes.iter().cloned());
    for (q, _) in queries {
        let m = &run.query_metrics[*q];
        let rows = run.query_rows[*q];
        stats.queries[*q].rows_out = rows.rows_out;
        stats.queries[*q].late_events = rows.late;
        stats.queries[*q].windows_out = m.windows_out;
        stats.queries[*q].keys_per_window = (m.windows_out > 0).then(|| m.window_keys as f64 / m.windows_out as f64);
        stats.rows_out += rows.rows_out;
        stats.late_events += rows.late;
        stats.store_reads += m.store_reads;
        stats.store_writes += m.store_writes;
        stats.emit_reads += m.emit_reads;
        stats.spill.add(&m.spill);
    }
}

/// The window groups, planned by the cost model for many keys, whose windows held so few that
/// the model told their number would choose another, cheaper plan. Nothing when the script
/// sets `keys` or forces a strategy.
fn keys_hints(script: &Script, groups: &[WindowGroup], queries: &[QueryStats]) -> Vec<KeysHint> {
    if script.settings.keys.is_some() || script.settings.window_strategy.is_some() {
        return Vec::new();
    }
    groups
        .iter()
        // A group without GROUP BY keys was planned for its one key already.
        .filter(|group| group.plan.keys.is_none())
        .filter_map(|group| {
            let mut members: Vec<usize> = group.members.iter().map(|m| m.query).collect();
            members.dedup();
            let (windows, keys) = members.iter().map(|&q| &queries[q]).fold((0, 0.0), |(windows, keys), q| {
                (windows + q.windows_out, keys + q.keys_per_window.unwrap_or(0.0) * q.windows_out as f64)
            });
            if windows == 0 {
                return None;
            }
            let keys = (keys / windows as f64).round().max(1.0);
            let keyed = group.replanned((script.settings.eta, Some(keys)));
            let planned_cost = group.plan.cost_for_keys(Some(keys));
            (!keyed.same_nodes(&group.plan) && keyed.cost() < planned_cost * (1.0 - 1e-9)).then(|| KeysHint {
                queries: members,
                keys,
                planned: group.plan.strategy.name(),
                with_keys: keyed.strategy.name(),
                modeled_ratio: planned_cost / keyed.cost(),
            })
        })
        .collect()
}

/// Identifies what a checkpoint's state means: the tessera version, the sources (and their
/// files' length and modification time: a checkpoint of other input is refused), the
/// settings, whether state is kept in key groups, the queries and the plan of every window
/// group.
fn plan_fingerprint(script: &Script, groups: &[WindowGroup], group_bits: u32) -> String {
    let mut text = format!(
        "tessera {}\n{}\nkey groups of 2^{group_bits}\n",
        env!("CARGO_PKG_VERSION"),
        script.settings.of_streams()
    );
    for query in &script.queries {
        let source = script.catalog.source(&query.source);
        text.push_str(&format!("{}\n{source:?}\n", query.sql));
        if let Some(crate::catalog::Location::File(path)) = source.map(|s| &s.location) {
            let file = std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok()));
            text.push_str(&format!("{file:?}\n"));
        }
    }
    for group in groups {
        text.push_str(&format!("{} {:?}\n", group.plan.strategy.name(), group.plan.nodes));
    }
    fnv64(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns of source `s (ts, k, j, v)` that `queries` read only bare, as keys or
    /// arguments.
    fn read_bare(queries: &str) -> Vec<usize> {
        let script = Script::compile(
            &format!(
                "CREATE SOURCE s (ts BIGINT, k BIGINT, j BIGINT, v DOUBLE, WATERMARK FOR ts AS ts)
                 WITH (connector = 'file', path = 'x.csv');
                 CREATE SOURCE o (ts BIGINT, k BIGINT, WATERMARK FOR ts AS ts) WITH (connector = 'file', path = 'o.csv');
                 {queries}"
            ),
            Path::new("."),
        )
        .expect("script");
        dictionary_columns(&script.queries, script.catalog.source("s").expect("source"))
    }

    #[test]
    fn columns_read_only_bare_as_the_one_group_key_or_arguments_may_be_dictionaries() {
        let window = |select: &str, rest: &str| {
            format!("SELECT {select} FROM TUMBLE(s, ts, INTERVAL '10' SECOND) {rest} GROUP BY window_start, window_end")
        };
        let by = |keys: &str, select: &str, filter: &str| {
            format!("SELECT {keys}, {select} FROM TUMBLE(s, ts, INTERVAL '10' SECOND) {filter} GROUP BY {keys}, window_start, window_end;")
        };
        assert_eq!(read_bare(&by("k", "MIN(v)", "")), vec![1, 3]);
        assert_eq!(read_bare(&format!("{}{}", by("k", "MIN(v)", ""), by("j", "SUM(k)", ""))), vec![1, 2, 3]);
        assert_eq!(read_bare(&format!("{};", window("MIN(v), COUNT(*)", ""))), vec![3]);
        // Read otherwise too: in WHERE, in an expression, among several keys, in a stateless
        // query, as the event time.
        assert_eq!(read_bare(&by("k", "MIN(v)", "WHERE k > 3")), vec![3]);
        assert_eq!(read_bare(&by("k", "MIN(v * 2)", "")), vec![1]);
        assert_eq!(read_bare(&by("k, j", "MIN(v)", "")), vec![3]);
        assert_eq!(read_bare(&format!("{}SELECT k, v FROM s;", by("k", "MIN(v)", ""))), Vec::<usize>::new());
        assert_eq!(read_bare(&by("k", "MAX(ts)", "")), vec![1]);
        // A sketch hashes values: its argument is read as values.
        assert_eq!(read_bare(&by("k", "APPROX_COUNT_DISTINCT(v), MIN(j)", "")), vec![1, 2]);
        // Another source's queries do not count.
        assert_eq!(read_bare(&format!("{}SELECT k FROM o WHERE k > 1;", by("k", "MIN(v)", ""))), vec![1, 3]);
    }
}
