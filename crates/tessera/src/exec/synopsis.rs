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

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;

use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, TemporalBlock, TemporalColumn, TemporalPlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::synopsis::{Count, Key, Synopsis, Value};

/// The values of one variable, each given an id in the order first seen (the id is what the
/// synopsis keys its counts by).
struct ValueInterner {
    converter: RowConverter,
    ids: HashMap<Box<[u8]>, Value>,
    values: Vec<Box<[u8]>>,
}

impl ValueInterner {
    fn new(data_type: &DataType) -> Result<Self> {
        Ok(ValueInterner {
            converter: RowConverter::new(vec![SortField::new(data_type.clone())])?,
            ids: HashMap::new(),
            values: Vec::new(),
        })
    }

    /// The id of every value of `column`.
    fn intern(&mut self, column: &ArrayRef) -> Result<Vec<Value>> {
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
}

/// Events waiting for the watermark: per instant, the count per atom and valuation.
type Pending = BTreeMap<i64, HashMap<(usize, Key), Count>>;

/// The state of one block of the query's UNION ALL.
struct BlockState {
    synopsis: Synopsis,
    /// One per variable of the block's program.
    interners: Vec<ValueInterner>,
    pending: Pending,
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
        Ok(BlockState {
            synopsis: Synopsis::new(program),
            interners,
            pending: BTreeMap::new(),
            answer: BTreeMap::new(),
        })
    }

    /// Matches `input`'s rows against every atom of `block`; marks late rows in `late`.
    fn take(
        &mut self,
        block: &TemporalBlock,
        input: &EventBatch,
        late: &mut [bool],
        metrics: &mut OperatorMetrics,
    ) -> Result<()> {
        let (rows, n) = (&input.rows, input.len());
        for (atom, atom_plan) in block.atoms.iter().enumerate() {
            let selected: Vec<usize> = match &atom_plan.filter {
                Some(filter) => {
                    let mask = filter.evaluate(rows)?.into_array(n)?;
                    let mask = mask.as_boolean();
                    (0..n).filter(|&i| mask.is_valid(i) && mask.value(i)).collect()
                }
                None => (0..n).collect(),
            };
            if selected.is_empty() {
                continue;
            }
            let vars = &self.synopsis.program().atoms[atom].vars;
            let mut ids: Vec<Vec<Value>> = Vec::with_capacity(vars.len());
            for (i, &var) in vars.iter().enumerate() {
                let column = atom_plan.projection[i + 1].evaluate(rows)?.into_array(n)?;
                ids.push(self.interners[var].intern(&column)?);
            }
            for row in selected {
                let (instant, watermark) = (input.event_times[row], input.watermarks.at(row));
                if instant < watermark {
                    late[row] = true;
                    continue;
                }
                let key: Key = ids.iter().map(|column| column[row]).collect();
                *self.pending.entry(instant).or_default().entry((atom, key)).or_insert(0) += 1;
                metrics.store_reads += 1;
            }
        }
        if self.synopsis.program().partition.is_empty() {
            // The instants of every row start the one partition's stream (see `Synopsis::apply`).
            for row in 0..n {
                let (instant, watermark) = (input.event_times[row], input.watermarks.at(row));
                if instant >= watermark && !self.pending.contains_key(&instant) {
                    self.pending.insert(instant, HashMap::new());
                }
            }
        }
        Ok(())
    }

    /// Applies the instants before `watermark`, in time order.
    fn apply_before(&mut self, watermark: i64, metrics: &mut OperatorMetrics) -> Result<()> {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() >= watermark {
                break;
            }
            let (instant, events) = entry.remove_entry();
            metrics.store_writes += events.len() as u64;
            self.synopsis.apply(instant, events.into_iter().map(|((atom, key), count)| (atom, key, count)))?;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        let pending: usize = self.pending.values().map(|m| m.len() * 48 + 64).sum();
        let interned: usize = self.interners.iter().map(ValueInterner::bytes).sum();
        self.synopsis.state_bytes() + pending + interned
    }
}

pub struct SynopsisExec {
    plan: Arc<TemporalPlan>,
    blocks: Vec<BlockState>,
    /// The last instant whose answer `EMIT CHANGES` wrote.
    written: Option<i64>,
    metrics: OperatorMetrics,
}

impl SynopsisExec {
    pub fn new(plan: Arc<TemporalPlan>) -> Result<Self> {
        let blocks = plan.blocks.iter().map(BlockState::new).collect::<Result<Vec<_>>>()?;
        Ok(SynopsisExec { plan, blocks, written: None, metrics: OperatorMetrics::default() })
    }

    fn apply_before(&mut self, watermark: i64) -> Result<()> {
        for block in &mut self.blocks {
            block.apply_before(watermark, &mut self.metrics)?;
        }
        Ok(())
    }

    /// The last instant any block applied.
    fn last_instant(&self) -> Option<i64> {
        self.blocks.iter().filter_map(|b| b.synopsis.last_instant()).max()
    }

    /// Rows of block `b`'s answer, in the query's columns (with `ops`, a changelog).
    fn rows(&self, b: usize, answer: &[(Key, Count)], ops: Option<Vec<&str>>) -> Result<RecordBatch> {
        let block = &self.blocks[b];
        let mut columns: Vec<ArrayRef> = Vec::new();
        if let Some(ops) = ops {
            columns.push(Arc::new(StringArray::from(ops)));
        }
        let program = block.synopsis.program();
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
            if block.synopsis.last_instant().is_none() {
                continue;
            }
            let now: BTreeMap<Key, Count> = block.synopsis.answer(instant)?.into_iter().collect();
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
        for (state, block) in self.blocks.iter_mut().zip(&self.plan.blocks) {
            state.take(block, input, &mut late, &mut self.metrics)?;
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
            if self.blocks[b].synopsis.last_instant().is_none() {
                continue;
            }
            let answer = self.blocks[b].synopsis.answer(last)?;
            self.metrics.emit_reads += answer.len() as u64;
            if !answer.is_empty() {
                let rows = self.rows(b, &answer, None)?;
                emit(Output { rows: vec![(0, rows)], late: Vec::new() })?;
            }
        }
        Ok(())
    }

    fn checkpoint(&mut self, _w: &mut StateWriter) -> Result<CheckpointBytes> {
        Err(TesseraError::Plan("checkpoints of continuous temporal queries are not supported yet".into()))
    }

    fn restore(&mut self, _r: &mut StateReader) -> Result<()> {
        Err(TesseraError::Plan("checkpoints of continuous temporal queries are not supported yet".into()))
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        vec![OperatorMetrics {
            state_bytes: self.blocks.iter().map(BlockState::bytes).sum::<usize>() as u64,
            ..self.metrics
        }]
    }
}
