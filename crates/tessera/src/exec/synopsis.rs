//! `SynopsisExec`: a continuous temporal query as an operator. Each batch's rows are matched
//! against every atom (its alias's conditions) and the values of the atom's variables interned;
//! events wait, counted per instant, atom and valuation, until the watermark passes their
//! instant, and are then applied to the [`Synopsis`] instant by instant in time order. Rows
//! older than the watermark they meet are late: counted and set aside, as for windows.
//!
//! Without an EMIT clause the answer as of the last event's instant is written at the end of
//! the input; with `EMIT CHANGES`, after every batch, the rows of the answer (as of the last
//! complete instant) that changed since the last ones written: `+I` for a new group, `+U` for a
//! new count, `-D` for a group whose count fell to 0.
//!
//! Checkpoints are incremental: each writes to the state store the partitions applied since
//! the previous one (a new version per partition, keyed by the checkpoint's epoch; the version
//! it replaces is deleted once the checkpoint has committed) and the values interned since;
//! the snapshot holds only the epoch, each block's last instant and the events still waiting
//! for the watermark. All partitions stay in memory while the query runs.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Int64Type};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;

use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, TemporalBlock, TemporalColumn, TemporalPlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::store::StateStore;
use crate::synopsis::evaluator::{decode_count, decode_key, encode_count, encode_key};
use crate::synopsis::{ChainSynopsis, Count, Key, Program, Synopsis, Value};

/// The values of one variable, each given an id in the order first seen (the id is what the
/// synopsis keys its counts by).
struct ValueInterner {
    /// The ids of the 64-bit integers seen, so a column of them is interned without encoding.
    int_ids: HashMap<i64, Value>,
    converter: RowConverter,
    ids: HashMap<Box<[u8]>, Value>,
    values: Vec<Box<[u8]>>,
}

impl ValueInterner {
    fn new(data_type: &DataType) -> Result<Self> {
        Ok(ValueInterner {
            int_ids: HashMap::new(),
            converter: RowConverter::new(vec![SortField::new(data_type.clone())])?,
            ids: HashMap::new(),
            values: Vec::new(),
        })
    }

    /// The id of every value of `column`.
    fn intern(&mut self, column: &ArrayRef) -> Result<Vec<Value>> {
        let Some(ints) = column.as_primitive_opt::<Int64Type>().filter(|a| a.null_count() == 0) else {
            return self.intern_rows(column);
        };
        let known: Option<Vec<Value>> = ints.values().iter().map(|v| self.int_ids.get(v).copied()).collect();
        if let Some(ids) = known {
            return Ok(ids);
        }
        let ids = self.intern_rows(column)?;
        for (&v, &id) in ints.values().iter().zip(&ids) {
            self.int_ids.insert(v, id);
        }
        Ok(ids)
    }

    /// [`intern`](Self::intern) through Arrow's row format (any type, NULL a value of its own).
    fn intern_rows(&mut self, column: &ArrayRef) -> Result<Vec<Value>> {
        let rows = self.converter.convert_columns(std::slice::from_ref(column))?;
        Ok(rows
            .iter()
            .map(|row| {
                let bytes = row.as_ref();
                match self.ids.get(bytes) {
                    Some(&id) => id,
                    None => {
                        let id = self.values.len() as Value;
                        self.values.push(bytes.into());
                        self.ids.insert(bytes.into(), id);
                        id
                    }
                }
            })
            .collect())
    }

    /// The values of `ids`, as a column.
    fn column(&self, ids: impl Iterator<Item = Value>) -> Result<ArrayRef> {
        let parser = self.converter.parser();
        let rows: Vec<_> = ids.map(|id| parser.parse(&self.values[id as usize])).collect();
        let mut columns = self.converter.convert_rows(rows)?;
        Ok(columns.remove(0))
    }

    fn bytes(&self) -> usize {
        self.values.iter().map(|v| 2 * v.len() + 2 * std::mem::size_of::<Box<[u8]>>() + 8).sum()
    }

    /// The values from id `from` on, encoded.
    fn chunk(&self, from: usize) -> Vec<u8> {
        let mut w = StateWriter::default();
        w.u8(CHUNK_FORMAT);
        w.len(self.values.len() - from);
        self.values[from..].iter().for_each(|v| w.bytes(v));
        w.into_bytes()
    }

    /// Takes back the values of a [`chunk`](Self::chunk), which must start at the next id.
    fn restore_chunk(&mut self, bytes: &[u8]) -> Result<()> {
        let mut r = StateReader::new(bytes);
        r.format("interned values", CHUNK_FORMAT)?;
        for _ in 0..r.len(8)? {
            let value: Box<[u8]> = r.bytes()?.into();
            self.ids.insert(value.clone(), self.values.len() as Value);
            self.values.push(value);
        }
        r.finish()
    }
}

/// The encoding of a chunk of interned values.
const CHUNK_FORMAT: u8 = 1;

/// What the store holds of a synopsis operator, after its 8-byte id: a partition's version
/// (`PARTITION`, block, partition key, epoch; empty: deleted in that epoch), or a chunk of a
/// variable's values (`VALUES`, block, variable, first id).
const PARTITION: u8 = 0;
const VALUES: u8 = 1;

fn partition_key(operator: u64, block: usize, key: &[Value], epoch: u64) -> Vec<u8> {
    let mut k = operator.to_be_bytes().to_vec();
    k.push(PARTITION);
    k.extend_from_slice(&(block as u16).to_be_bytes());
    for v in key {
        k.extend_from_slice(&v.to_be_bytes());
    }
    k.extend_from_slice(&epoch.to_be_bytes());
    k
}

fn values_key(operator: u64, block: usize, var: usize, first: u64) -> Vec<u8> {
    let mut k = operator.to_be_bytes().to_vec();
    k.push(VALUES);
    k.extend_from_slice(&(block as u16).to_be_bytes());
    k.extend_from_slice(&(var as u16).to_be_bytes());
    k.extend_from_slice(&first.to_be_bytes());
    k
}

/// Where a synopsis operator's state lives beyond a checkpoint, and what it saved there.
struct Saved {
    store: Arc<StateStore>,
    operator: u64,
    /// Partitions saved now get this version; the next checkpoint commits it.
    epoch: u64,
    /// Keys no checkpoint after the epoch (second) needs: deleted once a later one starts.
    retired: Vec<(Vec<u8>, u64)>,
    /// Per block, each saved partition's version and bytes, and per variable the values saved.
    partitions: Vec<HashMap<Key, (u64, u64)>>,
    values: Vec<Vec<usize>>,
}

/// Events waiting for the watermark: per instant, the count per atom and valuation.
type Pending = BTreeMap<i64, HashMap<(usize, Key), Count>>;

/// An event a counter chain waits to apply: its instant, partition and atom.
type ChainEvent = (i64, u32, u32);

/// How a block's events wait for the watermark and reach its synopsis.
enum Engine {
    /// Any program: events wait counted per instant, atom and valuation, and are applied
    /// instant by instant (every on-time instant, with events of an atom or not: the answer is
    /// read at the stream's current instant).
    Formula { synopsis: Synopsis, pending: Pending },
    /// A funnel's counter chains: events wait in arrival order (`sorted` while they came in time
    /// order) and are applied sorted by instant.
    Chain { synopsis: ChainSynopsis, pending: VecDeque<ChainEvent>, sorted: bool },
}

impl Engine {
    fn program(&self) -> &Program {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.program(),
            Engine::Chain { synopsis, .. } => synopsis.program(),
        }
    }

    fn last_instant(&self) -> Option<i64> {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.last_instant(),
            Engine::Chain { synopsis, .. } => synopsis.last_instant(),
        }
    }

    fn set_last_instant(&mut self, last: Option<i64>) {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.set_last_instant(last),
            Engine::Chain { synopsis, .. } => synopsis.set_last_instant(last),
        }
    }

    /// The answer at `instant`, not before the last instant applied.
    fn answer(&self, instant: i64) -> Result<Vec<(Key, Count)>> {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.answer(instant),
            Engine::Chain { synopsis, .. } => synopsis.answer(),
        }
    }

    fn take_changed(&mut self) -> Vec<(Key, Option<Vec<u8>>)> {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.take_changed(),
            Engine::Chain { synopsis, .. } => synopsis.take_changed(),
        }
    }

    fn insert_partition(&mut self, key: Key, bytes: &[u8]) -> Result<()> {
        match self {
            Engine::Formula { synopsis, .. } => synopsis.insert_partition(key, bytes),
            Engine::Chain { synopsis, .. } => synopsis.insert_partition(key, bytes),
        }
    }

    /// Takes the events of `atom` at `rows` (`ids`: per variable of the atom, every row's value
    /// id; `watermarks`: the one each row met), marking late ones.
    fn take_atom(
        &mut self,
        atom: usize,
        rows: &[usize],
        ids: &[Arc<Vec<Value>>],
        (input, watermarks): (&EventBatch, &[i64]),
        late: &mut [bool],
    ) -> Result<()> {
        match self {
            Engine::Formula { pending, .. } => {
                for &row in rows {
                    let (instant, watermark) = (input.event_times[row], watermarks[row]);
                    if instant < watermark {
                        late[row] = true;
                        continue;
                    }
                    let key: Key = ids.iter().map(|column| column[row]).collect();
                    *pending.entry(instant).or_default().entry((atom, key)).or_insert(0) += 1;
                }
            }
            Engine::Chain { synopsis, pending, sorted, .. } => {
                // Where each partition variable is among the atom's variables.
                let program = synopsis.program();
                let vars = &program.atoms[atom].vars;
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
                    for (k, &i) in key.iter_mut().zip(&positions) {
                        *k = ids[i][row];
                    }
                    let partition = synopsis.partition(&key)?;
                    if pending.back().is_some_and(|&(last, _, _)| instant < last) {
                        *sorted = false;
                    }
                    pending.push_back((instant, partition, atom as u32));
                }
            }
        }
        Ok(())
    }

    /// Notes the instants of the on-time rows of `input`: each is one of the stream's, and the
    /// answer is read at the latest applied. A program of one partition is evaluated at every
    /// one (a `NOT` holds at instants without events); any other only needs the latest, in
    /// `on_time`.
    fn take_instants(&mut self, (input, watermarks): (&EventBatch, &[i64]), on_time: &mut Option<i64>) {
        let instants = input
            .event_times
            .iter()
            .zip(watermarks)
            .filter(|(instant, watermark)| instant >= watermark)
            .map(|(&instant, _)| instant);
        match self {
            Engine::Formula { synopsis, pending } if synopsis.program().partition.is_empty() => {
                instants.for_each(|instant| {
                    pending.entry(instant).or_default();
                })
            }
            _ => *on_time = instants.chain(*on_time).max(),
        }
    }

    /// Applies the events before `watermark`, in time order; returns how many entries it
    /// applied.
    fn apply_before(&mut self, watermark: i64, on_time: Option<i64>) -> Result<u64> {
        let mut applied = 0;
        match self {
            Engine::Formula { synopsis, pending } => {
                while let Some(entry) = pending.first_entry() {
                    if *entry.key() >= watermark {
                        break;
                    }
                    let (instant, events) = entry.remove_entry();
                    applied += events.len() as u64;
                    synopsis.apply(instant, events.into_iter().map(|((atom, key), count)| (atom, key, count)))?;
                }
            }
            Engine::Chain { synopsis, pending, sorted } => {
                if !*sorted {
                    pending.make_contiguous().sort_by_key(|&(instant, _, _)| instant);
                    *sorted = true;
                }
                let ready = pending.partition_point(|&(instant, _, _)| instant < watermark);
                let mut last = synopsis.last_instant();
                for (instant, partition, atom) in pending.drain(..ready) {
                    synopsis.add(instant, partition, atom as usize, 1)?;
                    last = last.max(Some(instant));
                }
                synopsis.set_last_instant(last);
                applied = ready as u64;
            }
        }
        if let Some(instant) = on_time.filter(|&t| t < watermark) {
            self.set_last_instant(self.last_instant().max(Some(instant)));
        }
        Ok(applied)
    }

    /// The events still waiting, for a checkpoint.
    fn encode_pending(&self, w: &mut StateWriter) {
        match self {
            Engine::Formula { pending, .. } => {
                w.len(pending.len());
                for (instant, events) in pending {
                    w.i64(*instant);
                    w.len(events.len());
                    for ((atom, key), count) in events {
                        w.u32(*atom as u32);
                        encode_key(w, key);
                        encode_count(w, *count);
                    }
                }
            }
            Engine::Chain { synopsis, pending, .. } => {
                w.len(pending.len());
                for &(instant, partition, atom) in pending {
                    w.i64(instant);
                    w.u32(atom);
                    encode_key(w, &synopsis.key(partition));
                }
            }
        }
    }

    /// Takes back what [`encode_pending`](Self::encode_pending) wrote.
    fn decode_pending(&mut self, r: &mut StateReader) -> Result<()> {
        match self {
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
            Engine::Chain { synopsis, pending, sorted } => {
                pending.clear();
                for _ in 0..r.len(20)? {
                    let instant = r.i64()?;
                    let atom = r.u32()?;
                    let partition = synopsis.partition(&decode_key(r)?)?;
                    pending.push_back((instant, partition, atom));
                }
                *sorted = pending.iter().zip(pending.iter().skip(1)).all(|(a, b)| a.0 <= b.0);
            }
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        match self {
            Engine::Formula { synopsis, pending } => {
                synopsis.state_bytes() + pending.values().map(|m| m.len() * 48 + 64).sum::<usize>()
            }
            Engine::Chain { synopsis, pending, .. } => {
                synopsis.state_bytes() + pending.len() * std::mem::size_of::<ChainEvent>()
            }
        }
    }
}

/// The state of one block of the query's UNION ALL.
struct BlockState {
    engine: Engine,
    /// One per variable of the block's program.
    interners: Vec<ValueInterner>,
    /// The latest on-time instant taken, for engines that do not wait on every instant.
    on_time: Option<i64>,
    /// The answer `EMIT CHANGES` last wrote.
    answer: BTreeMap<Key, Count>,
}

impl BlockState {
    fn new(block: &TemporalBlock) -> Result<Self> {
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
        let engine = match program.chains {
            Some(_) => Engine::Chain { synopsis: ChainSynopsis::new(program)?, pending: VecDeque::new(), sorted: true },
            None => Engine::Formula { synopsis: Synopsis::new(program), pending: BTreeMap::new() },
        };
        Ok(BlockState { engine, interners, on_time: None, answer: BTreeMap::new() })
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
        for (atom, atom_plan) in block.atoms.iter().enumerate() {
            if !self.engine.program().reads_atom[atom] {
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
            let vars = self.engine.program().atoms[atom].vars.clone();
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
            metrics.store_reads += selected.len() as u64;
            self.engine.take_atom(atom, &selected, &ids, (input, watermarks), late)?;
        }
        self.engine.take_instants((input, watermarks), &mut self.on_time);
        Ok(())
    }

    fn bytes(&self) -> usize {
        let interned: usize = self.interners.iter().map(ValueInterner::bytes).sum();
        self.engine.bytes() + interned
    }
}
pub struct SynopsisExec {
    plan: Arc<TemporalPlan>,
    blocks: Vec<BlockState>,
    /// The last instant whose answer `EMIT CHANGES` wrote.
    written: Option<i64>,
    metrics: OperatorMetrics,
    saved: Saved,
}

impl SynopsisExec {
    /// The operator of `plan`, saving its state at checkpoints to `store` under `operator`.
    pub fn new(plan: Arc<TemporalPlan>, (store, operator): (Arc<StateStore>, u64)) -> Result<Self> {
        let blocks = plan.blocks.iter().map(BlockState::new).collect::<Result<Vec<_>>>()?;
        let saved = Saved {
            store,
            operator,
            epoch: 0,
            retired: Vec::new(),
            partitions: vec![HashMap::new(); blocks.len()],
            values: blocks.iter().map(|b| vec![0; b.interners.len()]).collect(),
        };
        Ok(SynopsisExec { plan, blocks, written: None, metrics: OperatorMetrics::default(), saved })
    }

    fn apply_before(&mut self, watermark: i64) -> Result<()> {
        for block in &mut self.blocks {
            self.metrics.store_writes += block.engine.apply_before(watermark, block.on_time)?;
        }
        Ok(())
    }

    /// The last instant any block applied.
    fn last_instant(&self) -> Option<i64> {
        self.blocks.iter().filter_map(|b| b.engine.last_instant()).max()
    }

    /// Rows of block `b`'s answer, in the query's columns (with `ops`, a changelog).
    fn rows(&self, b: usize, answer: &[(Key, Count)], ops: Option<Vec<&str>>) -> Result<RecordBatch> {
        let block = &self.blocks[b];
        let mut columns: Vec<ArrayRef> = Vec::new();
        if let Some(ops) = ops {
            columns.push(Arc::new(StringArray::from(ops)));
        }
        let program = block.engine.program();
        for column in &self.plan.columns {
            columns.push(match column {
                TemporalColumn::Group(position) => {
                    let var = program.group[*position];
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
            let block = &self.blocks[b];
            if block.engine.last_instant().is_none() {
                continue;
            }
            let now: BTreeMap<Key, Count> = block.engine.answer(instant)?.into_iter().collect();
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
        }
        if late.iter().any(|&l| l) {
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
            if self.blocks[b].engine.last_instant().is_none() {
                continue;
            }
            let answer = self.blocks[b].engine.answer(last)?;
            self.metrics.emit_reads += answer.len() as u64;
            if !answer.is_empty() {
                let rows = self.rows(b, &answer, None)?;
                emit(Output { rows: vec![(0, rows)], late: Vec::new() })?;
            }
        }
        Ok(())
    }

    /// Saves what changed since the last checkpoint: the partitions applied since (a new
    /// version each, the old one deleted once this checkpoint has committed) and the values
    /// interned since; writes the epoch, each block's last instant and its events still waiting.
    fn checkpoint(&mut self, w: &mut StateWriter) -> Result<CheckpointBytes> {
        let saved = &mut self.saved;
        let epoch = saved.epoch;
        for (key, _) in saved.retired.extract_if(.., |(_, after)| *after < epoch) {
            saved.store.remove(&key)?;
        }
        let mut written = 0u64;
        w.u64(epoch);
        w.bool(self.written.is_some());
        w.i64(self.written.unwrap_or(0));
        w.len(self.blocks.len());
        for (b, block) in self.blocks.iter_mut().enumerate() {
            for (key, bytes) in block.engine.take_changed() {
                let previous = saved.partitions[b].remove(&key);
                if let Some((version, _)) = previous {
                    saved.retired.push((partition_key(saved.operator, b, &key, version), epoch));
                }
                match bytes {
                    Some(bytes) => {
                        saved.store.put(&partition_key(saved.operator, b, &key, epoch), &bytes)?;
                        written += bytes.len() as u64;
                        saved.partitions[b].insert(key, (epoch, bytes.len() as u64));
                    }
                    None if previous.is_some() => {
                        // A deletion, kept until the older version it hides is gone.
                        let tombstone = partition_key(saved.operator, b, &key, epoch);
                        saved.store.put(&tombstone, &[])?;
                        saved.retired.push((tombstone, epoch + 1));
                    }
                    None => {}
                }
            }
            for (var, interner) in block.interners.iter().enumerate() {
                let from = saved.values[b][var];
                if interner.values.len() > from {
                    let chunk = interner.chunk(from);
                    saved.store.put(&values_key(saved.operator, b, var, from as u64), &chunk)?;
                    written += chunk.len() as u64;
                    saved.values[b][var] = interner.values.len();
                }
                w.u64(saved.values[b][var] as u64);
            }
            w.bool(block.engine.last_instant().is_some());
            w.i64(block.engine.last_instant().unwrap_or(0));
            w.bool(block.on_time.is_some());
            w.i64(block.on_time.unwrap_or(0));
            block.engine.encode_pending(w);
        }
        saved.epoch += 1;
        let stored = saved.partitions.iter().flat_map(|p| p.values()).map(|&(_, bytes)| bytes).sum();
        Ok(CheckpointBytes { tables_written: written, tables_changed: written, tables_stored: stored })
    }

    /// Takes back a checkpoint: the values and partitions it names from the store (deleting
    /// every version written after it or no longer needed), and its progress.
    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        let epoch = r.u64()?;
        let written = r.bool()?;
        let written_at = r.i64()?;
        self.written = written.then_some(written_at);
        if r.len(8)? != self.blocks.len() {
            return Err(TesseraError::Checkpoint("the snapshot's UNION ALL blocks do not match the query's".into()));
        }
        let saved = &mut self.saved;
        saved.epoch = epoch + 1;
        for (b, block) in self.blocks.iter_mut().enumerate() {
            for var in 0..block.interners.len() {
                saved.values[b][var] = r.u64()? as usize;
            }
            let last = r.bool()?;
            let last_at = r.i64()?;
            block.engine.set_last_instant(last.then_some(last_at));
            let on_time = r.bool()?;
            let on_time_at = r.i64()?;
            block.on_time = on_time.then_some(on_time_at);
            block.engine.decode_pending(r)?;
        }
        // Every key of the operator: values chunks in id order, partition versions by key.
        let prefix = saved.operator.to_be_bytes();
        let mut chunks: Vec<(usize, usize, u64, Vec<u8>)> = Vec::new();
        let mut versions: HashMap<(usize, Key), Vec<u64>> = HashMap::new();
        let corrupt = || TesseraError::Checkpoint("the state store holds a key tessera did not write".into());
        for key in saved.store.keys(&prefix)? {
            let rest = &key[8..];
            let block = u16::from_be_bytes(rest.get(1..3).ok_or_else(corrupt)?.try_into().expect("2 bytes")) as usize;
            match rest[0] {
                VALUES if rest.len() == 13 => {
                    let var = u16::from_be_bytes(rest[3..5].try_into().expect("2 bytes")) as usize;
                    let first = u64::from_be_bytes(rest[5..13].try_into().expect("8 bytes"));
                    if saved.values.get(block).and_then(|v| v.get(var)).is_some_and(|&n| (first as usize) < n) {
                        let bytes = saved.store.get(&key)?.ok_or_else(corrupt)?;
                        chunks.push((block, var, first, bytes));
                    } else {
                        saved.store.remove(&key)?;
                    }
                }
                PARTITION if rest.len() >= 11 && (rest.len() - 11) % 8 == 0 => {
                    let values: Key = rest[3..rest.len() - 8]
                        .chunks(8)
                        .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
                        .collect();
                    let version = u64::from_be_bytes(rest[rest.len() - 8..].try_into().expect("8 bytes"));
                    if version > epoch || block >= self.blocks.len() {
                        saved.store.remove(&key)?;
                    } else {
                        versions.entry((block, values)).or_default().push(version);
                    }
                }
                _ => return Err(corrupt()),
            }
        }
        chunks.sort_by_key(|&(b, v, first, _)| (b, v, first));
        for (b, var, _, bytes) in chunks {
            self.blocks[b].interners[var].restore_chunk(&bytes)?;
        }
        for (b, block) in self.blocks.iter().enumerate() {
            for (var, interner) in block.interners.iter().enumerate() {
                if interner.values.len() != saved.values[b][var] {
                    return Err(TesseraError::Checkpoint("the state store lacks values the checkpoint names".into()));
                }
            }
        }
        for ((b, key), mut found) in versions {
            found.sort_unstable();
            let latest = found.pop().expect("a version");
            for older in found {
                saved.store.remove(&partition_key(saved.operator, b, &key, older))?;
            }
            let store_key = partition_key(saved.operator, b, &key, latest);
            let bytes = saved.store.get(&store_key)?.ok_or_else(corrupt)?;
            if bytes.is_empty() {
                saved.store.remove(&store_key)?;
                continue;
            }
            self.blocks[b].engine.insert_partition(key.clone(), &bytes)?;
            saved.partitions[b].insert(key, (latest, bytes.len() as u64));
        }
        if let Some(at) = self.written {
            for block in &mut self.blocks {
                if block.engine.last_instant().is_some() {
                    block.answer = block.engine.answer(at)?.into_iter().collect();
                }
            }
        }
        Ok(())
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        vec![OperatorMetrics {
            state_bytes: self.blocks.iter().map(BlockState::bytes).sum::<usize>() as u64,
            ..self.metrics
        }]
    }
}
