//! `FilterProjectExec`: a stateless query (WHERE and SELECT list per row), and the
//! filter-then-project step that window aggregates apply to their results (HAVING, SELECT).

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{ExprRef, StatelessPlan};
use crate::state::codec::{StateReader, StateWriter};

/// Keeps the rows of `batch` where `filter` holds and evaluates `projection` on them.
pub fn filter_and_project(
    batch: &RecordBatch,
    filter: Option<&ExprRef>,
    projection: &[ExprRef],
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let filtered;
    let input = match filter {
        Some(predicate) => {
            let mask = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
            let mask = mask
                .as_boolean_opt()
                .ok_or_else(|| TesseraError::Plan(format!("filter `{predicate}` is not a boolean expression")))?;
            filtered = filter_record_batch(batch, mask)?;
            &filtered
        }
        None => batch,
    };
    let columns =
        projection.iter().map(|e| Ok(e.evaluate(input)?.into_array(input.num_rows())?)).collect::<Result<Vec<_>>>()?;
    let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(input.num_rows()));
    Ok(RecordBatch::try_new_with_options(schema.clone(), columns, &options)?)
}

/// Keeps no state: the runtime counts its rows.
pub struct FilterProjectExec {
    plan: StatelessPlan,
}

impl FilterProjectExec {
    pub fn new(plan: StatelessPlan) -> Self {
        FilterProjectExec { plan }
    }
}

impl StreamOperator for FilterProjectExec {
    fn name(&self) -> &'static str {
        "FilterProjectExec"
    }

    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()> {
        let plan = &self.plan;
        let batch = filter_and_project(&input.rows, plan.filter.as_ref(), &plan.projection, &plan.output_schema)?;
        if batch.num_rows() > 0 {
            out.rows.push((0, batch));
        }
        Ok(())
    }

    fn advance_watermark(&mut self, _watermark: i64, _emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, _emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        Ok(())
    }

    fn checkpoint(&mut self, _w: &mut StateWriter) -> Result<CheckpointBytes> {
        Ok(CheckpointBytes::default())
    }

    fn restore(&mut self, _r: &mut StateReader) -> Result<()> {
        Ok(())
    }

    /// Its one output slot, which keeps nothing.
    fn metrics(&self) -> Vec<OperatorMetrics> {
        vec![OperatorMetrics::default()]
    }
}
