//! `SynopsisExec`: a continuous temporal query as an operator. Each batch's rows are matched
//! against every atom (its alias's conditions) and the values of the atom's variables interned;
//! events wait, counted per instant, atom and valuation, until the watermark passes their
//! instant, and are then applied in time order to the synopsis of their partition's group
//! ([`super::synopsis_groups`]: groups of partitions, evicted to the state store beyond the
//! operator's memory). Rows older than the watermark they meet are late: counted and set
//! aside, as for windows.
//!
//! Without an EMIT clause the answer as of the last event's instant is written at the end of
//! the input; with `EMIT CHANGES`, after every batch, the rows of the answer (as of the last
//! complete instant) that changed since the last ones written: `+I` for a new group, `+U` for a
//! new count, `-D` for a group whose count fell to 0. An answer reads every group of
//! partitions in turn (loading evicted ones).
//!
//! Checkpoints are incremental: each writes to the state store the groups changed since they
//! were last written, and the values interned since the previous checkpoint; the snapshot
//! holds each block's last instant, its events still waiting for the watermark, and each
//! group's version and waiting events. The interned values stay in memory (as window keys do).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use hashbrown::HashMap;

use super::synopsis_groups::{GroupTable, PartitionGroups, GROUP_TABLE};
use super::synopsis_values::ValueInterner;
use super::versions::Versions;
use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, TemporalBlock, TemporalColumn, TemporalPlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::store::StateStore;
use crate::synopsis::evaluator::{decode_count, decode_key, encode_count, encode_key, project};
use crate::synopsis::{ChainSynopsis, Count, Key, PartitionIds, Program, Synopsis, Value};

/// Partitions are evicted in groups of at most 1,024 (a window key group may hold 65,536
/// keys): a partition of a formula takes hundreds of bytes, so a group stays well within any
/// useful memory budget, and a group of counter chains (about 72 KB) is still worth a write.
const PARTITION_GROUP_BITS: u32 = 10;

/// The encoding of a chunk of interned values or partition keys.
const CHUNK_FORMAT: u8 = 1;

/// The tags of the other tables of a synopsis operator (besides its groups,
/// [`GROUP_TABLE`]): a chunk of a variable's values (then the block, the variable and the
/// chunk's first id), a chunk of partition keys (then the block and the first id).
const VALUES_TABLE: u8 = 1;
const KEYS_TABLE: u8 = 2;

fn chunk_name(tag: u8, block: usize, var: usize, first: usize) -> Vec<u8> {
    let mut name = vec![tag];
    name.extend_from_slice(&(block as u16).to_be_bytes());
    name.extend_from_slice(&(var as u16).to_be_bytes());
    name.extend_from_slice(&(first as u64).to_be_bytes());
    name
}

/// The worker (of `workers`) that owns the group whose values have the ids `ids`: every worker
/// interns the same rows in the same order, so the ids, and the owner, agree on all of them.
fn owner(ids: impl Iterator<Item = Value>, workers: usize) -> usize {
    let mixed = ids.fold(0u64, |h, id| h.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(id));
    (mixed % workers as u64) as usize
}

/// Events waiting for the watermark: per instant, the count per atom and valuation.
type Pending = BTreeMap<i64, HashMap<(usize, Key), Count>>;

/// An event a counter chain waits to apply: its instant, partition and atom.
type ChainEvent = (i64, u32, u32);

/// How a block's events wait for the watermark and reach its groups of partitions.
enum Engine {
    /// Any program: events wait counted per instant, atom and valuation, and are applied
    /// instant by instant (a program of one partition at every on-time instant, with events of
    /// an atom or not: its `NOT`s hold at instants without events).
    Formula { groups: PartitionGroups<Synopsis>, pending: Pending },
    /// A funnel's counter chains: events wait in arrival order (`sorted` while they came in time
    /// order) and are applied sorted by instant.
    Chain { groups: PartitionGroups<ChainSynopsis>, pending: VecDeque<ChainEvent>, sorted: bool },
}

impl Engine {
    fn pending_bytes(&self) -> usize {
        match self {
            Engine::Formula { pending, .. } => pending.values().map(|m| m.len() * 48 + 64).sum::<usize>(),
            Engine::Chain { pending, .. } => pending.len() * std::mem::size_of::<ChainEvent>(),
        }
    }

    fn groups(&self) -> &dyn GroupTable {
        match self {
            Engine::Formula { groups, .. } => groups,
            Engine::Chain { groups, .. } => groups,
        }
    }

    fn groups_mut(&mut self) -> &mut dyn GroupTable {
        match self {
            Engine::Formula { groups, .. } => groups,
            Engine::Chain { groups, .. } => groups,
        }
    }
}

/// The state of one block of the query's UNION ALL.
struct BlockState {
    program: Arc<Program>,
    engine: Engine,
    /// One per variable of the block's program.
    interners: Vec<ValueInterner>,
    /// The partitions' ids; partition `id` is in group `id >> group_bits`.
    ids: PartitionIds,
    group_bits: u32,
    /// This worker's number and the workers sharing the query: it takes the events of the
    /// groups whose values' ids [`owner`] gives it.
    share: (usize, usize),
    /// The latest instant applied (the answer is read there).
    last: Option<i64>,
    /// The latest on-time instant taken, for engines that do not wait on every instant.
    on_time: Option<i64>,
    /// The answer `EMIT CHANGES` last wrote.
    answer: BTreeMap<Key, Count>,
    /// Per variable the values, and the partition keys, saved to the store.
    saved_values: Vec<usize>,
    saved_keys: usize,
}

impl BlockState {
    fn new(b: usize, block: &TemporalBlock, (group_bits, share): (u32, (usize, usize)), budget: u64) -> Result<Self> {
        let program = Arc::clone(&block.program);
        let mut types: Vec<Option<DataType>> = vec![None; program.variables.len()];
        for (atom, atom_plan) in program.atoms.iter().zip(&block.atoms) {
            let schema = &atom_plan.output_schema;
            for (i, &v) in atom.vars.iter().enumerate() {
                types[v] = Some(schema.field(i + 1).data_type().clone());
            }
        }
        let interners = types
            .iter()
            .map(|t| ValueInterner::new(t.as_ref().unwrap_or(&DataType::Null)))
            .collect::<Result<Vec<_>>>()?;
        let groups = Arc::clone(&program);
        let engine = match program.chains {
            Some(_) => Engine::Chain {
                groups: PartitionGroups::new(groups, b, budget),
                pending: VecDeque::new(),
                sorted: true,
            },
            None => Engine::Formula { groups: PartitionGroups::new(groups, b, budget), pending: BTreeMap::new() },
        };
        Ok(BlockState {
            ids: PartitionIds::new(&program),
            saved_values: vec![0; interners.len()],
            saved_keys: 0,
            program,
            engine,
            interners,
            group_bits,
            share,
            last: None,
            on_time: None,
            answer: BTreeMap::new(),
        })
    }

    /// Matches `input`'s rows against every atom of `block` (`watermarks`: the one each row
    /// met); marks late rows in `late`.
    fn take(
        &mut self,
        block: &TemporalBlock,
        (input, watermarks): (&EventBatch, &[i64]),
        late: &mut [bool],
        metrics: &mut OperatorMetrics,
    ) -> Result<()> {
        let (rows, n) = (&input.rows, input.len());
        // Aliases binding a variable from the same column intern it once per batch.
        let mut interned: HashMap<(usize, String), Arc<Vec<Value>>> = HashMap::new();
        let program = Arc::clone(&self.program);
        for (atom, atom_plan) in block.atoms.iter().enumerate() {
            if !program.reads_atom[atom] {
                continue;
            }
            let selected: Vec<usize> = match &atom_plan.filter {
                Some(filter) => {
                    let mask = filter.evaluate(rows)?.into_array(n)?;
                    let mask = mask.as_boolean();
                    let holds = match mask.nulls() {
                        Some(nulls) => mask.values() & nulls.inner(),
                        None => mask.values().clone(),
                    };
                    holds.set_indices().collect()
                }
                None => (0..n).collect(),
            };
            if selected.is_empty() {
                continue;
            }
            let vars = &program.atoms[atom].vars;
            let mut ids: Vec<Arc<Vec<Value>>> = Vec::with_capacity(vars.len());
            for (i, &var) in vars.iter().enumerate() {
                let expr = &atom_plan.projection[i + 1];
                let column_ids = match interned.get(&(var, expr.to_string())) {
                    Some(known) => Arc::clone(known),
                    None => {
                        let column = expr.evaluate(rows)?.into_array(n)?;
                        let fresh = Arc::new(self.interners[var].intern(&column)?);
                        interned.insert((var, expr.to_string()), Arc::clone(&fresh));
                        fresh
                    }
                };
                ids.push(column_ids);
            }
            metrics.store_reads += self.take_atom(atom, &selected, &ids, (input, watermarks), late)?;
        }
        self.take_instants((input, watermarks));
        Ok(())
    }

    /// Takes the events of `atom` at `rows` (`ids`: per variable of the atom, every row's value
    /// id; `watermarks`: the one each row met) that belong to this worker's groups, marking late
    /// ones (all of them); returns how many it took.
    fn take_atom(
        &mut self,
        atom: usize,
        rows: &[usize],
        ids: &[Arc<Vec<Value>>],
        (input, watermarks): (&EventBatch, &[i64]),
        late: &mut [bool],
    ) -> Result<u64> {
        let program = &self.program;
        let vars = &program.atoms[atom].vars;
        // Where each group variable is among the atom's (every atom binds the partition's).
        let group: Vec<usize> = program.group.iter().filter_map(|g| vars.iter().position(|v| v == g)).collect();
        let (worker, workers) = self.share;
        let owned = |row: usize| workers == 1 || owner(group.iter().map(|&i| ids[i][row]), workers) == worker;
        let mut taken = 0;
        match &mut self.engine {
            Engine::Formula { pending, .. } => {
                for &row in rows {
                    let (instant, watermark) = (input.event_times[row], watermarks[row]);
                    if instant < watermark {
                        late[row] = true;
                        continue;
                    }
                    if !owned(row) {
                        continue;
                    }
                    taken += 1;
                    let key: Key = ids.iter().map(|column| column[row]).collect();
                    *pending.entry(instant).or_default().entry((atom, key)).or_insert(0) += 1;
                }
            }
            Engine::Chain { pending, sorted, .. } => {
                // Where each partition variable is among the atom's variables.
                let positions: Vec<usize> = program
                    .partition
                    .iter()
                    .map(|p| vars.iter().position(|v| v == p).expect("a chain's atoms bind the partition"))
                    .collect();
                let mut key: Vec<Value> = vec![0; positions.len()];
                for &row in rows {
                    let (instant, watermark) = (input.event_times[row], watermarks[row]);
                    if instant < watermark {
                        late[row] = true;
                        continue;
                    }
                    if !owned(row) {
                        continue;
                    }
                    taken += 1;
                    for (k, &i) in key.iter_mut().zip(&positions) {
                        *k = ids[i][row];
                    }
                    let partition = self.ids.id(&key)?;
                    if pending.back().is_some_and(|&(last, _, _)| instant < last) {
                        *sorted = false;
                    }
                    pending.push_back((instant, partition, atom as u32));
                }
            }
        }
        Ok(taken)
    }

    /// Notes the instants of the on-time rows of `input`: each is one of the stream's, and the
    /// answer is read at the latest applied. A program of one partition is evaluated at every
    /// one (a `NOT` holds at instants without events); any other only needs the latest, in
    /// `on_time`.
    fn take_instants(&mut self, (input, watermarks): (&EventBatch, &[i64])) {
        let instants = input
            .event_times
            .iter()
            .zip(watermarks)
            .filter(|(instant, watermark)| instant >= watermark)
            .map(|(&instant, _)| instant);
        match &mut self.engine {
            Engine::Formula { pending, .. } if self.program.partition.is_empty() => instants.for_each(|instant| {
                pending.entry(instant).or_default();
            }),
            _ => self.on_time = instants.chain(self.on_time).max(),
        }
    }

    /// Applies the events before `watermark`, in time order, each to its partition's group;
    /// returns how many entries it applied.
    fn apply_before(&mut self, watermark: i64, versions: &mut Versions) -> Result<u64> {
        let mut applied = 0;
        let bits = self.group_bits;
        match &mut self.engine {
            Engine::Formula { groups, pending } => {
                let program = &self.program;
                while let Some(entry) = pending.first_entry() {
                    if *entry.key() >= watermark {
                        break;
                    }
                    let (instant, events) = entry.remove_entry();
                    applied += events.len() as u64;
                    self.last = self.last.max(Some(instant));
                    if program.partition.is_empty() {
                        let events = events.into_iter().map(|((atom, key), count)| (atom, key, count)).collect();
                        groups.deliver(0, (instant, events), versions)?;
                        continue;
                    }
                    let mut by_group: BTreeMap<usize, Vec<(usize, Key, Count)>> = BTreeMap::new();
                    for ((atom, key), count) in events {
                        let partition = project(&key, &program.atoms[atom].vars, &program.partition);
                        let g = (self.ids.id(&partition)? >> bits) as usize;
                        by_group.entry(g).or_default().push((atom, key, count));
                    }
                    for (g, events) in by_group {
                        groups.deliver(g, (instant, events), versions)?;
                    }
                }
            }
            Engine::Chain { groups, pending, sorted } => {
                if !*sorted {
                    pending.make_contiguous().sort_by_key(|&(instant, _, _)| instant);
                    *sorted = true;
                }
                let ready = pending.partition_point(|&(instant, _, _)| instant < watermark);
                let mask = (1u32 << bits).wrapping_sub(1);
                for (instant, partition, atom) in pending.drain(..ready) {
                    groups.deliver((partition >> bits) as usize, (instant, partition & mask, atom), versions)?;
                    self.last = self.last.max(Some(instant));
                }
                applied = ready as u64;
            }
        }
        if let Some(instant) = self.on_time.filter(|&t| t < watermark) {
            self.last = self.last.max(Some(instant));
        }
        self.fit(versions)?;
        Ok(applied)
    }

    /// Keeps the block's groups within its memory with what it holds besides.
    fn fit(&mut self, versions: &mut Versions) -> Result<()> {
        if !self.engine.groups().bounded() {
            return Ok(());
        }
        let other = self.other_bytes() as u64;
        self.engine.groups_mut().fit(other, versions)
    }

    /// The answer at `instant` (not before the last instant applied), per valuation of the
    /// group variables, ascending, without zeros: every group's, summed.
    fn answer(&mut self, instant: i64, versions: &mut Versions) -> Result<Vec<(Key, Count)>> {
        let mut answer = BTreeMap::new();
        let bits = self.group_bits;
        match &mut self.engine {
            Engine::Formula { groups, .. } => {
                groups.for_each(versions, &mut |_, synopsis| synopsis.answer_into(instant, &mut answer))?
            }
            Engine::Chain { groups, .. } => {
                let ids = &self.ids;
                groups.for_each(versions, &mut |g, chains| {
                    let base = (g as u32) << bits;
                    chains.answer_into(&|p| ids.key(base | p), &mut answer)
                })?
            }
        }
        let distinct = self.program.distinct;
        Ok(answer.into_iter().filter(|&(_, c)| c > 0).map(|(k, c)| (k, if distinct { c.min(1) } else { c })).collect())
    }

    /// What the block holds in memory besides its groups: interned values and partition keys,
    /// events before the watermark, the answer `EMIT CHANGES` last wrote.
    fn other_bytes(&self) -> usize {
        let interned: usize = self.interners.iter().map(ValueInterner::bytes).sum();
        let answer = self.answer.keys().map(|k| 48 + 8 * k.len()).sum::<usize>();
        interned + self.ids.bytes() + self.engine.pending_bytes() + answer
    }

    fn bytes(&self) -> u64 {
        self.other_bytes() as u64 + self.engine.groups().bytes()
    }

    /// Saves what changed to the store (groups, values and partition keys interned since the
    /// last checkpoint) and writes the block's progress; returns the bytes written.
    fn checkpoint(&mut self, b: usize, w: &mut StateWriter, versions: &mut Versions) -> Result<u64> {
        let mut written = 0;
        for (var, interner) in self.interners.iter().enumerate() {
            let from = self.saved_values[var];
            if interner.len() > from {
                let mut chunk = StateWriter::default();
                chunk.u8(CHUNK_FORMAT);
                chunk.len(interner.len() - from);
                (from..interner.len()).for_each(|id| chunk.bytes(interner.value(id)));
                let chunk = chunk.into_bytes();
                versions.put(&chunk_name(VALUES_TABLE, b, var, from), &chunk, None)?;
                written += chunk.len() as u64;
                self.saved_values[var] = interner.len();
            }
            w.u64(self.saved_values[var] as u64);
        }
        let keys = self.ids.interned();
        if keys.len() > self.saved_keys {
            let mut chunk = StateWriter::default();
            chunk.u8(CHUNK_FORMAT);
            chunk.len(keys.len() - self.saved_keys);
            keys[self.saved_keys..].iter().for_each(|k| encode_key(&mut chunk, k));
            let chunk = chunk.into_bytes();
            versions.put(&chunk_name(KEYS_TABLE, b, 0, self.saved_keys), &chunk, None)?;
            written += chunk.len() as u64;
            self.saved_keys = keys.len();
        }
        w.u64(self.saved_keys as u64);
        for instant in [self.last, self.on_time] {
            w.bool(instant.is_some());
            w.i64(instant.unwrap_or(0));
        }
        match &mut self.engine {
            Engine::Formula { pending, .. } => {
                w.len(pending.len());
                for (instant, events) in pending.iter() {
                    w.i64(*instant);
                    w.len(events.len());
                    for ((atom, key), count) in events {
                        w.u32(*atom as u32);
                        encode_key(w, key);
                        encode_count(w, *count);
                    }
                }
            }
            Engine::Chain { pending, .. } => {
                w.len(pending.len());
                for &(instant, partition, atom) in pending.iter() {
                    w.i64(instant);
                    w.u32(partition);
                    w.u32(atom);
                }
            }
        }
        Ok(written + self.engine.groups_mut().checkpoint(w, versions)?)
    }

    /// Takes back what [`checkpoint`](Self::checkpoint) wrote (the values and keys are read
    /// from the store afterwards).
    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        for var in 0..self.interners.len() {
            self.saved_values[var] = r.u64()? as usize;
        }
        self.saved_keys = r.u64()? as usize;
        let mut instant = || -> Result<Option<i64>> {
            let (some, at) = (r.bool()?, r.i64()?);
            Ok(some.then_some(at))
        };
        (self.last, self.on_time) = (instant()?, instant()?);
        match &mut self.engine {
            Engine::Formula { pending, .. } => {
                pending.clear();
                for _ in 0..r.len(16)? {
                    let instant = r.i64()?;
                    let mut events = HashMap::new();
                    for _ in 0..r.len(28)? {
                        let atom = r.u32()? as usize;
                        let key = decode_key(r)?;
                        events.insert((atom, key), decode_count(r)?);
                    }
                    pending.insert(instant, events);
                }
            }
            Engine::Chain { pending, sorted, .. } => {
                pending.clear();
                for _ in 0..r.len(16)? {
                    pending.push_back((r.i64()?, r.u32()?, r.u32()?));
                }
                *sorted = pending.iter().zip(pending.iter().skip(1)).all(|(a, b)| a.0 <= b.0);
            }
        }
        self.engine.groups_mut().restore(r)
    }

    /// Takes back a chunk of values or keys a checkpoint saved (chunks come in id order).
    fn restore_chunk(&mut self, tag: u8, var: usize, first: usize, bytes: &[u8]) -> Result<()> {
        let mut r = StateReader::new(bytes);
        r.format("interned values", CHUNK_FORMAT)?;
        let misplaced = || TesseraError::Checkpoint("the state store's interned values are out of order".into());
        if tag == VALUES_TABLE {
            let interner = self.interners.get_mut(var).ok_or_else(misplaced)?;
            if interner.len() != first {
                return Err(misplaced());
            }
            for _ in 0..r.len(8)? {
                interner.id(r.bytes()?);
            }
        } else {
            if self.ids.interned().len() != first {
                return Err(misplaced());
            }
            for _ in 0..r.len(8)? {
                self.ids.restore(decode_key(&mut r)?)?;
            }
        }
        r.finish()
    }
}

pub struct SynopsisExec {
    plan: Arc<TemporalPlan>,
    blocks: Vec<BlockState>,
    /// The last instant whose answer `EMIT CHANGES` wrote.
    written: Option<i64>,
    metrics: OperatorMetrics,
    versions: Versions,
}

impl SynopsisExec {
    /// The operator of `plan` on worker `share.0` of `share.1` (which takes the events of the
    /// answer's groups whose values' ids it owns, when the plan lets workers share it), its
    /// partitions in groups of `2^group_bits` ids (at most `2^PARTITION_GROUP_BITS`), in memory up
    /// to `memory_bytes` (`u64::MAX`: no limit; each block of a UNION ALL gets an equal share)
    /// and in `store` under `operator` beyond it and at checkpoints.
    pub fn new(
        plan: Arc<TemporalPlan>,
        (store, operator): (Arc<StateStore>, u64),
        (memory_bytes, group_bits, share): (u64, u32, (usize, usize)),
    ) -> Result<Self> {
        // Workers share the partitions only where each group's are on one worker.
        let share = if plan.shardable() { share } else { (0, 1) };
        let budget = if memory_bytes == u64::MAX { u64::MAX } else { memory_bytes / plan.blocks.len().max(1) as u64 };
        let group_bits = group_bits.min(PARTITION_GROUP_BITS);
        let blocks = plan
            .blocks
            .iter()
            .enumerate()
            .map(|(b, block)| BlockState::new(b, block, (group_bits, share), budget))
            .collect::<Result<Vec<_>>>()?;
        let versions = Versions::new(store, operator);
        Ok(SynopsisExec { plan, blocks, written: None, metrics: OperatorMetrics::default(), versions })
    }

    fn apply_before(&mut self, watermark: i64) -> Result<()> {
        for block in &mut self.blocks {
            self.metrics.store_writes += block.apply_before(watermark, &mut self.versions)?;
        }
        Ok(())
    }

    /// The last instant any block applied.
    fn last_instant(&self) -> Option<i64> {
        self.blocks.iter().filter_map(|b| b.last).max()
    }

    /// Rows of block `b`'s answer, in the query's columns (with `ops`, a changelog).
    fn rows(&self, b: usize, answer: &[(Key, Count)], ops: Option<Vec<&str>>) -> Result<RecordBatch> {
        let block = &self.blocks[b];
        let mut columns: Vec<ArrayRef> = Vec::new();
        if let Some(ops) = ops {
            columns.push(Arc::new(StringArray::from(ops)));
        }
        for column in &self.plan.columns {
            columns.push(match column {
                TemporalColumn::Group(position) => {
                    let var = block.program.group[*position];
                    block.interners[var].column(answer.iter().map(|(key, _)| key[*position]))?
                }
                TemporalColumn::Count => {
                    let counts = answer
                        .iter()
                        .map(|(_, c)| {
                            i64::try_from(*c).map_err(|_| {
                                TesseraError::Execution(format!("a count of {c} does not fit a BIGINT column"))
                            })
                        })
                        .collect::<Result<Vec<i64>>>()?;
                    Arc::new(Int64Array::from(counts))
                }
            });
        }
        let schema = match self.plan.emit {
            EmitMode::Changes => crate::plan::changelog_schema(&self.plan.columns_schema),
            EmitMode::OnWindowClose => Arc::clone(&self.plan.columns_schema),
        };
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(answer.len()));
        Ok(RecordBatch::try_new_with_options(schema, columns, &options)?)
    }

    /// Writes the rows of every block's answer at `instant` that differ from the last ones
    /// written.
    fn write_changes(&mut self, instant: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        self.written = Some(instant);
        for b in 0..self.blocks.len() {
            if self.blocks[b].last.is_none() {
                continue;
            }
            let now: BTreeMap<Key, Count> = self.blocks[b].answer(instant, &mut self.versions)?.into_iter().collect();
            let block = &self.blocks[b];
            let mut changed: Vec<(Key, Count)> = Vec::new();
            let mut ops = Vec::new();
            for (key, &count) in &now {
                match block.answer.get(key) {
                    Some(&before) if before == count => {}
                    before => {
                        changed.push((key.clone(), count));
                        ops.push(if before.is_some() { "+U" } else { "+I" });
                    }
                }
            }
            for (key, &count) in &block.answer {
                if !now.contains_key(key) {
                    changed.push((key.clone(), count));
                    ops.push("-D");
                }
            }
            if !changed.is_empty() {
                self.metrics.emit_reads += changed.len() as u64;
                let rows = self.rows(b, &changed, Some(ops))?;
                emit(Output { rows: vec![(0, rows)], late: Vec::new() })?;
            }
            self.blocks[b].answer = now;
        }
        Ok(())
    }
}

impl StreamOperator for SynopsisExec {
    fn name(&self) -> &'static str {
        "SynopsisExec"
    }

    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()> {
        let mut late = vec![false; input.len()];
        let watermarks = input.watermarks.per_row(input.len());
        for (state, block) in self.blocks.iter_mut().zip(&self.plan.blocks) {
            state.take(block, (input, &watermarks), &mut late, &mut self.metrics)?;
            state.fit(&mut self.versions)?;
        }
        // Workers sharing the query all see a late row; the first reports it.
        if self.blocks.first().is_none_or(|b| b.share.0 == 0) && late.iter().any(|&l| l) {
            let indices: Vec<u32> = (0..input.len() as u32).filter(|&i| late[i as usize]).collect();
            out.late.push((0, input.take(&indices)?.rows));
        }
        Ok(())
    }

    fn advance_watermark(&mut self, watermark: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        self.apply_before(watermark)?;
        if self.plan.emit == EmitMode::Changes {
            if let Some(last) = self.last_instant() {
                let complete = last.max(watermark.saturating_sub(1));
                if self.written != Some(complete) {
                    self.write_changes(complete, emit)?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        self.apply_before(i64::MAX)?;
        let Some(last) = self.last_instant() else { return Ok(()) };
        if self.plan.emit == EmitMode::Changes {
            return self.write_changes(last, emit);
        }
        for b in 0..self.blocks.len() {
            if self.blocks[b].last.is_none() {
                continue;
            }
            let answer = self.blocks[b].answer(last, &mut self.versions)?;
            self.metrics.emit_reads += answer.len() as u64;
            if !answer.is_empty() {
                let rows = self.rows(b, &answer, None)?;
                emit(Output { rows: vec![(0, rows)], late: Vec::new() })?;
            }
        }
        Ok(())
    }

    /// Saves what changed since the last checkpoint: the groups of partitions changed since
    /// they were last written (a new version each, the one it replaces deleted once this
    /// checkpoint has committed) and the values and keys interned since; writes each block's
    /// progress, its events still waiting for the watermark and its groups' versions.
    fn checkpoint(&mut self, w: &mut StateWriter) -> Result<CheckpointBytes> {
        self.versions.begin_checkpoint()?;
        w.u64(self.versions.epoch());
        w.bool(self.written.is_some());
        w.i64(self.written.unwrap_or(0));
        w.len(self.blocks.len());
        let mut written = 0;
        for (b, block) in self.blocks.iter_mut().enumerate() {
            written += block.checkpoint(b, w, &mut self.versions)?;
        }
        let changed = self.versions.end_checkpoint();
        let stored = self.blocks.iter().map(|b| b.engine.groups().stored_bytes()).sum();
        Ok(CheckpointBytes { tables_written: written, tables_changed: changed, tables_stored: stored })
    }

    /// Takes back a checkpoint: its progress, the values and keys it names from the store
    /// (deleting every version written after it or no longer needed); groups of partitions
    /// are read when their events arrive.
    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        let epoch = r.u64()?;
        let written = r.bool()?;
        let written_at = r.i64()?;
        self.written = written.then_some(written_at);
        if r.len(8)? != self.blocks.len() {
            return Err(TesseraError::Checkpoint("the snapshot's UNION ALL blocks do not match the query's".into()));
        }
        for block in &mut self.blocks {
            block.restore(r)?;
        }
        let mut chunks: Vec<(usize, u8, usize, usize, Vec<u8>, u64)> = Vec::new();
        let blocks = &self.blocks;
        let corrupt = || TesseraError::Checkpoint("the state store holds a key tessera did not write".into());
        self.versions.restore(epoch, &mut |name, version| {
            let block = u16::from_be_bytes(name.get(1..3).ok_or_else(corrupt)?.try_into().expect("2 bytes")) as usize;
            let Some(state) = blocks.get(block) else { return Ok(false) };
            match (name[0], name.len()) {
                (GROUP_TABLE, 7) => {
                    let g = u32::from_be_bytes(name[3..7].try_into().expect("4 bytes")) as usize;
                    Ok(state.engine.groups().names(g, version))
                }
                (tag @ (VALUES_TABLE | KEYS_TABLE), 13) => {
                    let var = u16::from_be_bytes(name[3..5].try_into().expect("2 bytes")) as usize;
                    let first = u64::from_be_bytes(name[5..13].try_into().expect("8 bytes")) as usize;
                    let saved =
                        if tag == VALUES_TABLE { state.saved_values.get(var).copied() } else { Some(state.saved_keys) };
                    let named = version <= epoch && saved.is_some_and(|n| first < n);
                    if named {
                        chunks.push((block, tag, var, first, name.to_vec(), version));
                    }
                    Ok(named)
                }
                _ => Err(corrupt()),
            }
        })?;
        chunks.sort_by_key(|&(b, tag, var, first, _, _)| (b, tag, var, first));
        for (b, tag, var, first, name, version) in chunks {
            let bytes = self.versions.get(&name, version, &|| format!("interned values of block {b}"))?;
            self.blocks[b].restore_chunk(tag, var, first, &bytes)?;
        }
        for block in &self.blocks {
            let complete = block.interners.iter().zip(&block.saved_values).all(|(i, &n)| i.len() == n)
                && block.ids.interned().len() == block.saved_keys;
            if !complete {
                return Err(TesseraError::Checkpoint("the state store lacks values the checkpoint names".into()));
            }
        }
        if let Some(at) = self.written {
            for b in 0..self.blocks.len() {
                if self.blocks[b].last.is_some() {
                    self.blocks[b].answer = self.blocks[b].answer(at, &mut self.versions)?.into_iter().collect();
                }
            }
        }
        Ok(())
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        let mut spill = super::SpillCounters::default();
        self.blocks.iter().for_each(|b| spill.add(&b.engine.groups().spill()));
        vec![OperatorMetrics { state_bytes: self.blocks.iter().map(BlockState::bytes).sum(), spill, ..self.metrics }]
    }
}
