//! Bound streaming query plans: what the binder produces from SQL and the runtime executes.
//! Expressions are DataFusion physical expressions, evaluated on Arrow batches.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion_physical_expr::PhysicalExpr;

use crate::aggregate::AggregateSpec;
use crate::window::WindowSpec;

pub type ExprRef = Arc<dyn PhysicalExpr>;

/// The columns of an `EMIT CHANGES` query: `op` (`+I`, `+U` or `-D`), then the SELECT list.
/// The columns a query with `emit` writes: `columns`, with the changelog's `op` first for
/// `EMIT CHANGES`.
pub fn emitted_schema(columns: &SchemaRef, emit: EmitMode) -> SchemaRef {
    match emit {
        EmitMode::Changes => changelog_schema(columns),
        EmitMode::OnWindowClose => Arc::clone(columns),
    }
}

pub fn changelog_schema(columns: &SchemaRef) -> SchemaRef {
    let mut fields = vec![Arc::new(arrow::datatypes::Field::new("op", arrow::datatypes::DataType::Utf8, false))];
    fields.extend(columns.fields().iter().cloned());
    Arc::new(arrow::datatypes::Schema::new(fields))
}

/// One continuous query of a script: one or more branches (the arms of a `UNION ALL`) whose
/// rows form one output stream.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// The query as written (normalised by the parser), for EXPLAIN and statistics.
    pub sql: String,
    /// Lower-cased name of the source every branch reads.
    pub source: String,
    pub branches: Vec<BranchPlan>,
    /// The columns the query writes (with `EMIT CHANGES`, an `op` column first).
    pub output_schema: SchemaRef,
    pub emit: EmitMode,
}

/// When a window query writes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmitMode {
    /// `EMIT ON WINDOW CLOSE` (the default): one final row per group and window, once the
    /// watermark passes the window's end.
    #[default]
    OnWindowClose,
    /// `EMIT CHANGES`: after every input batch, the current row of every group and open window
    /// the batch changed, as an upsert changelog (`op` is `+I` for a group's first row in a
    /// window, `+U` for an update of it).
    Changes,
}

/// One `SELECT` over one source.
#[derive(Debug, Clone)]
pub enum BranchPlan {
    /// Per-row filter and projection, no state.
    Stateless(StatelessPlan),
    WindowAggregate(Arc<WindowAggregatePlan>),
    /// A continuous temporal query (all the query's blocks in one synopsis).
    Temporal(Arc<TemporalPlan>),
    /// A continuous query no bounded synopsis answers, run because the script allows unbounded
    /// state: every event of the source kept, the answer a batch query over them.
    Prefix(Arc<PrefixPlan>),
}

/// How continuous temporal queries run (`SET temporal_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TemporalStrategy {
    /// From a synopsis; a query none bounds is refused (or kept whole under
    /// `allow_unbounded_state`).
    #[default]
    Synopsis,
    /// Every SQL self-join kept whole, even where a synopsis answers it: what a streaming join
    /// that keeps its inputs does, to compare with.
    KeptWhole,
}

impl TemporalStrategy {
    pub fn parse(value: &str) -> Option<TemporalStrategy> {
        match value.to_ascii_lowercase().as_str() {
            "synopsis" => Some(TemporalStrategy::Synopsis),
            "kept_whole" => Some(TemporalStrategy::KeptWhole),
            _ => None,
        }
    }
}

/// A query answered by a batch SQL engine over every on-time event of its source so far.
#[derive(Debug, Clone)]
pub struct PrefixPlan {
    /// The query as the batch engine runs it (without EMIT), reading a table named as the source.
    pub sql: String,
    /// The source, the table the query reads (lower case), and its columns.
    pub source: String,
    pub source_schema: SchemaRef,
    /// Why it is kept whole: the refusal it would otherwise get, or the setting that asked.
    pub kept_because: String,
    /// The columns of the answer (without the changelog's `op`).
    pub columns_schema: SchemaRef,
    pub emit: EmitMode,
}

/// A continuous temporal query: each block of its UNION ALL a self-join of the source
/// compiled to a synopsis, writing rows of the same columns.
#[derive(Debug, Clone)]
pub struct TemporalPlan {
    pub blocks: Vec<TemporalBlock>,
    /// The SELECT list (the same in every block).
    pub columns: Vec<TemporalColumn>,
    /// The types of the grouped variables.
    pub group_types: Vec<arrow::datatypes::DataType>,
    /// The columns of the answer (without the changelog's `op`).
    pub columns_schema: SchemaRef,
    pub emit: EmitMode,
}

impl TemporalPlan {
    /// Whether workers may share its partitions: each sees every row and takes the events of
    /// the answer's groups it owns. Every block must group by partition variables (so a
    /// group's partitions, and its answer, are on one worker) and have some: an instant of a
    /// partition's count then depends on its own events and the stream's instants alone.
    pub fn shardable(&self) -> bool {
        self.blocks.iter().all(|b| {
            let p = &b.program;
            !p.group.is_empty() && p.group.iter().all(|g| p.partition.contains(g))
        })
    }
}

/// One block of a temporal query: its synopsis's program and how each atom reads rows.
#[derive(Debug, Clone)]
pub struct TemporalBlock {
    pub program: Arc<crate::synopsis::Program>,
    /// The linear orders of the aliases' times the block was split into (latest first).
    pub orders: Vec<String>,
    /// Per atom of the program: the rows it counts (its alias's conditions), projected to the
    /// event time and then its variables' values (in the atom's variable order).
    pub atoms: Vec<StatelessPlan>,
}

/// A column of a temporal query's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemporalColumn {
    /// The value of the grouped variable at this position of the program's group.
    Group(usize),
    /// `COUNT(*)`.
    Count,
}

#[derive(Debug, Clone)]
pub struct StatelessPlan {
    pub filter: Option<ExprRef>,
    pub projection: Vec<ExprRef>,
    pub output_schema: SchemaRef,
}

/// `SELECT keys, window_start, window_end, aggregates FROM TUMBLE|HOP(...) WHERE ... GROUP BY ...
/// HAVING ...`.
#[derive(Debug, Clone)]
pub struct WindowAggregatePlan {
    pub window: WindowSpec,
    /// `WHERE`, on source rows.
    pub filter: Option<ExprRef>,
    /// Group keys other than the window columns, on source rows.
    pub keys: Vec<ExprRef>,
    pub aggregates: Vec<AggregateSpec>,
    /// The columns of the aggregate's result, in order: each is a key, a window bound or an
    /// aggregate.
    pub aggregate_columns: Vec<AggregateColumn>,
    pub aggregate_schema: SchemaRef,
    /// `HAVING`, on the aggregate's result.
    pub having: Option<ExprRef>,
    /// The SELECT list, on the aggregate's result.
    pub projection: Vec<ExprRef>,
    /// The SELECT list's columns (without the `op` column of `EMIT CHANGES`).
    pub output_schema: SchemaRef,
    pub emit: EmitMode,
    /// The window's name in a `WINDOWS(...)` form (EXPLAIN shows it).
    pub window_name: Option<String>,
}

impl WindowAggregatePlan {
    /// Identifies what the plan computes per row before windowing: WHERE, group keys and the
    /// aggregates (function, argument, domain). Plans with the same signature can share slices.
    pub fn input_signature(&self) -> String {
        let aggregates: Vec<String> = self.aggregates.iter().map(|a| a.signature()).collect();
        format!("{:?}|{:?}|{aggregates:?}|{:?}", self.filter, self.keys, self.emit)
    }

    /// The types of the group keys (other than the window), in order.
    pub fn key_types(&self) -> Vec<arrow::datatypes::DataType> {
        self.aggregate_columns
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, AggregateColumn::Key(_)))
            .map(|(i, _)| self.aggregate_schema.field(i).data_type().clone())
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateColumn {
    Key(usize),
    WindowStart,
    WindowEnd,
    Aggregate(usize),
}
