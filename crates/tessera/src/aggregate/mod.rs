//! Aggregate functions and their mergeable partial states.
//!
//! Partial states are the currency between operators: a slice of a window keeps one
//! [`GroupStates`] per aggregate, updated in place by whole batches (`update`), combined with
//! other slices' states (`merge`), and turned into SQL values only at the output (`finalize`).
//!
//! ```text
//!  batch rows ──update(rows, slots)──▶ slice states ──merge(dst_slots)──▶ window states ──finalize──▶ column
//! ```
//!
//! States are columnar: one vector per field, indexed by group slot, so an update is a tight
//! loop over `(row, slot)` pairs.

mod exact_sum;
mod hll;
mod states;

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::compute::cast;
use arrow::datatypes::DataType;
use datafusion_physical_expr::PhysicalExpr;

use crate::error::{Result, TesseraError};
use crate::window::Sharing;
pub use states::GroupStates;

/// The aggregate functions tessera evaluates on streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregateFunction {
    Min,
    Max,
    Sum,
    /// `COUNT(x)`: non-NULL values.
    Count,
    /// `COUNT(*)`: rows.
    CountRows,
    Avg,
    VarSamp,
    StddevSamp,
    /// Exact median: the state keeps every value.
    Median,
    /// HyperLogLog estimate (exact while a group has few distinct values).
    ApproxCountDistinct,
}

/// How values are combined when windows share partial results (see the multi-window paper):
/// MIN and MAX may combine overlapping parts, the others need disjoint parts, and holistic
/// functions have no constant-size partial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregateClass {
    Distributive,
    Algebraic,
    Holistic,
}

impl AggregateFunction {
    /// Maps a DataFusion aggregate (by its canonical name) to a streaming one.
    pub fn from_datafusion_name(name: &str, counts_rows: bool) -> Option<Self> {
        Some(match name {
            "min" => AggregateFunction::Min,
            "max" => AggregateFunction::Max,
            "sum" => AggregateFunction::Sum,
            "count" if counts_rows => AggregateFunction::CountRows,
            "count" => AggregateFunction::Count,
            "avg" | "mean" => AggregateFunction::Avg,
            "var" | "var_samp" => AggregateFunction::VarSamp,
            "stddev" | "stddev_samp" => AggregateFunction::StddevSamp,
            "median" => AggregateFunction::Median,
            "approx_distinct" | "approx_count_distinct" => AggregateFunction::ApproxCountDistinct,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            AggregateFunction::Min => "min",
            AggregateFunction::Max => "max",
            AggregateFunction::Sum => "sum",
            AggregateFunction::Count | AggregateFunction::CountRows => "count",
            AggregateFunction::Avg => "avg",
            AggregateFunction::VarSamp => "var_samp",
            AggregateFunction::StddevSamp => "stddev_samp",
            AggregateFunction::Median => "median",
            AggregateFunction::ApproxCountDistinct => "approx_count_distinct",
        }
    }

    /// How windows may share this aggregate's partial states: MIN and MAX combine overlapping
    /// parts (covered by), the other distributive and algebraic functions need disjoint parts
    /// (partitioned by), holistic ones do not share.
    pub fn sharing(self) -> Sharing {
        match self {
            AggregateFunction::Min | AggregateFunction::Max => Sharing::CoveredBy,
            f if f.class() == AggregateClass::Holistic => Sharing::None,
            _ => Sharing::PartitionedBy,
        }
    }

    pub fn class(self) -> AggregateClass {
        match self {
            AggregateFunction::Min
            | AggregateFunction::Max
            | AggregateFunction::Sum
            | AggregateFunction::Count
            | AggregateFunction::CountRows => AggregateClass::Distributive,
            AggregateFunction::Avg | AggregateFunction::VarSamp | AggregateFunction::StddevSamp => {
                AggregateClass::Algebraic
            }
            AggregateFunction::Median | AggregateFunction::ApproxCountDistinct => AggregateClass::Holistic,
        }
    }
}

/// The sharing all of `functions` allow: the most restrictive of theirs.
pub fn common_sharing(functions: impl IntoIterator<Item = AggregateFunction>) -> Sharing {
    functions.into_iter().map(AggregateFunction::sharing).fold(Sharing::CoveredBy, Sharing::strictest)
}

/// The value domain a state works in; inputs are cast to it before updates and results are
/// cast back to the function's SQL return type at the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Int,
    Float,
    Utf8,
}

impl ValueKind {
    pub fn of(data_type: &DataType) -> Option<ValueKind> {
        use DataType::*;
        Some(match data_type {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Boolean | Date32 | Date64
            | Timestamp(..) | Time32(_) | Time64(_) | Duration(_) | Null => ValueKind::Int,
            Float16 | Float32 | Float64 | Decimal128(..) | Decimal256(..) => ValueKind::Float,
            Utf8 | LargeUtf8 | Utf8View => ValueKind::Utf8,
            _ => return None,
        })
    }

    pub fn arrow_type(self) -> DataType {
        match self {
            ValueKind::Int => DataType::Int64,
            ValueKind::Float => DataType::Float64,
            ValueKind::Utf8 => DataType::Utf8,
        }
    }
}

/// Whether a hopping window of `aggregates` slides on a running value rather than on two
/// stacks: when every state can be taken away again exactly (COUNT, SUM, AVG).
pub fn slides_on_running_value(aggregates: &[AggregateSpec]) -> bool {
    aggregates.iter().all(|a| a.new_states().has_exact_inverse())
}

/// One aggregate of a query, bound to its input expression.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    pub function: AggregateFunction,
    /// The argument, evaluated on source rows; `None` for `COUNT(*)`.
    pub arg: Option<Arc<dyn PhysicalExpr>>,
    /// The domain the argument is cast to.
    pub kind: ValueKind,
    /// The SQL return type (as DataFusion types the function).
    pub output_type: DataType,
    /// How the aggregate was written, for EXPLAIN and errors.
    pub display: String,
}

impl AggregateSpec {
    /// Evaluates and normalises the argument over a batch.
    pub fn evaluate_arg(&self, batch: &arrow::record_batch::RecordBatch) -> Result<Option<ArrayRef>> {
        let Some(arg) = &self.arg else { return Ok(None) };
        let values = arg.evaluate(batch)?.into_array(batch.num_rows())?;
        let target = self.kind.arrow_type();
        // A dictionary array (as readers hand columns out) stays one where the states look each
        // row's value up: only its entries are cast.
        let dictionary =
            arrow::array::AsArray::as_dictionary_opt::<arrow::datatypes::UInt32Type>(&values).filter(|dictionary| {
                dictionary.values().null_count() == 0 && GroupStates::read_dictionaries(self.function, self.kind)
            });
        if let Some(dictionary) = dictionary {
            let entries = dictionary.values();
            let entries = if entries.data_type() == &target { Arc::clone(entries) } else { cast(entries, &target)? };
            return Ok(Some(Arc::new(dictionary.with_values(entries))));
        }
        Ok(Some(if values.data_type() == &target { values } else { cast(&values, &target)? }))
    }

    pub fn new_states(&self) -> GroupStates {
        GroupStates::new(self.function, self.kind)
    }

    /// Final values of `states` as a column of the SQL return type.
    pub fn finalize(&self, states: &GroupStates) -> Result<ArrayRef> {
        let values = states.finalize().map_err(|e| match e {
            TesseraError::Execution(m) => TesseraError::Execution(format!("{}: {m}", self.display)),
            other => other,
        })?;
        if values.data_type() == &self.output_type {
            Ok(values)
        } else {
            Ok(cast(&values, &self.output_type)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_follows_the_most_restrictive_aggregate() {
        use AggregateFunction::*;
        assert_eq!(common_sharing([Min, Max]), Sharing::CoveredBy);
        assert_eq!(common_sharing([Min, Sum]), Sharing::PartitionedBy);
        assert_eq!(common_sharing([Avg, StddevSamp, CountRows]), Sharing::PartitionedBy);
        assert_eq!(common_sharing([Min, Median]), Sharing::None);
        assert_eq!(common_sharing([ApproxCountDistinct]), Sharing::None);
    }
}
