//! How a query reads a table: the table's data files through DataFusion's Parquet scan (only
//! the columns the query uses; row groups and pages pruned by their statistics against its
//! filters; a limit), the rows statements deleted skipped by a row selection (a deletion
//! vector), every byte checked ([`crate::datafile::CheckedFiles`]); rows held in memory (an
//! in-memory database, files of format 2, rows a statement of this process wrote) through a
//! memory scan beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::{ScalarValue, Statistics, ToDFSchema};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::RowNumber;

use crate::datafile::CheckedFiles;
use crate::table::POSITION;

/// A data file of a table as a scan reads it.
#[derive(Debug, Clone)]
pub struct ScannedFile {
    pub name: String,
    /// Its segment's place in the table: the high half of its rows' positions.
    pub segment: usize,
    /// Its rows, deleted ones included.
    pub rows: usize,
    /// Which of its rows were deleted (none: every row is live).
    pub deleted: Option<Vec<bool>>,
}

impl ScannedFile {
    fn live(&self) -> usize {
        self.rows - self.deleted.as_ref().map_or(0, |d| d.iter().filter(|&&d| d).count())
    }

    /// Its live rows as a row selection: runs of rows read and skipped.
    fn selection(&self) -> Option<RowSelection> {
        let deleted = self.deleted.as_ref()?;
        let mut runs: Vec<RowSelector> = Vec::new();
        let mut start = 0;
        while start < deleted.len() {
            let skip = deleted[start];
            let length = deleted[start..].iter().take_while(|&&d| d == skip).count();
            runs.push(if skip { RowSelector::skip(length) } else { RowSelector::select(length) });
            start += length;
        }
        Some(RowSelection::from(runs))
    }
}

/// A table's rows as of the statement that scans it: files on disk and rows held.
#[derive(Debug)]
pub struct TableScan {
    /// The declared columns.
    pub schema: SchemaRef,
    /// The columns of the files: the declared ones, then any hidden row id.
    pub stored: SchemaRef,
    /// Whether the scan has a last column of each row's position (segment << 32 | row), for
    /// UPDATE and DELETE to name rows by.
    pub positions: bool,
    /// The folder of the data files.
    pub data: Option<PathBuf>,
    pub files: Vec<ScannedFile>,
    /// Live rows held in memory, with the declared columns (and their positions).
    pub held: Vec<RecordBatch>,
}

#[async_trait::async_trait]
impl TableProvider for TableScan {
    fn schema(&self) -> SchemaRef {
        match self.positions {
            false => Arc::clone(&self.schema),
            true => {
                let mut fields: Vec<FieldRef> = self.schema.fields().iter().cloned().collect();
                fields.push(Arc::new(Field::new(POSITION, DataType::Int64, false)));
                Arc::new(Schema::new(fields))
            }
        }
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::common::Result<Vec<TableProviderFilterPushDown>> {
        // Filters prune row groups and pages; the rows left are filtered after the scan.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let schema = self.schema();
        let projection: Vec<usize> = match projection {
            Some(columns) => columns.clone(),
            None => (0..schema.fields().len()).collect(),
        };
        let mut parts: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if let (Some(data), false) = (&self.data, self.files.is_empty()) {
            parts.push(self.files_scan(state, data, &projection, filters, limit)?);
        }
        if !self.held.is_empty() || parts.is_empty() {
            let mut partitions = vec![Vec::new(); state.config().target_partitions().max(1)];
            let count = partitions.len();
            // In batches of the session's size, as the files are read: what a sort spills.
            let size = state.config().batch_size().max(1);
            let slices = self.held.iter().flat_map(|batch| {
                (0..batch.num_rows())
                    .step_by(size)
                    .map(move |start| batch.slice(start, size.min(batch.num_rows() - start)))
            });
            for (i, slice) in slices.enumerate() {
                partitions[i % count].push(slice);
            }
            parts.push(MemorySourceConfig::try_new_exec(&partitions, schema, Some(projection))?);
        }
        Ok(match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => UnionExec::try_new(parts)?,
        })
    }
}

impl TableScan {
    /// DataFusion's Parquet scan of the files, columns `projection` of [`TableProvider::schema`].
    /// A position is computed from the file's segment (a partition value) and the row's
    /// number in its file (a virtual column the reader fills).
    fn files_scan(
        &self,
        state: &dyn Session,
        data: &Path,
        projection: &[usize],
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let declared = self.schema.fields().len();
        let position = projection.iter().position(|&c| c == declared);
        let mut table = TableSchema::builder(Arc::clone(&self.stored));
        if position.is_some() {
            table = table
                .with_table_partition_cols(vec![Arc::new(Field::new(SEGMENT, DataType::Int64, false))])
                .with_virtual_columns(Fields::from(vec![
                    Field::new(ROW, DataType::Int64, false).with_extension_type(RowNumber)
                ]));
        }
        let mut source = ParquetSource::new(table.build())
            .with_table_parquet_options(state.table_options().parquet.clone())
            .with_parquet_file_reader_factory(Arc::new(CheckedFiles { data: data.to_path_buf() }))
            .with_enable_page_index(true);
        // Filters on the declared columns prune (a position is not in the files).
        let prune = filters.iter().filter(|f| f.column_refs().iter().all(|c| c.name != POSITION));
        if let Some(filter) = conjunction(prune.cloned()) {
            let schema = self.schema().to_dfschema()?;
            source = source.with_predicate(state.create_physical_expr(filter, &schema)?);
        }
        let files: Vec<PartitionedFile> = self
            .files
            .iter()
            .map(|file| {
                let size = std::fs::metadata(data.join(&file.name)).map_or(0, |m| m.len());
                let mut scanned = PartitionedFile::new(file.name.clone(), size);
                if position.is_some() {
                    scanned = scanned.with_partition_values(vec![ScalarValue::Int64(Some(file.segment as i64))]);
                }
                match file.selection() {
                    Some(selection) => scanned.with_extension(ParquetRowSelection::new(selection)),
                    None => scanned,
                }
            })
            .collect();
        let rows = self.files.iter().map(ScannedFile::live).sum();
        let statistics = Statistics::new_unknown(&self.stored).with_num_rows(Precision::Exact(rows));
        // The file columns asked for, then (for a position) the segment and the row number.
        let mut read: Vec<usize> = projection.iter().copied().filter(|&c| c != declared).collect();
        if position.is_some() {
            read.extend([self.stored.fields().len(), self.stored.fields().len() + 1]);
        }
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
            .with_file_groups(spread(files, state.config().target_partitions()))
            .with_projection_indices(Some(read))?
            .with_statistics(statistics)
            .with_limit(limit)
            .build();
        let scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        let Some(at) = position else { return Ok(scan) };
        // The columns in the order asked for, the position where it was asked.
        let read_schema = scan.schema();
        let column = |i: usize| -> Arc<dyn PhysicalExpr> { Arc::new(Column::new(read_schema.field(i).name(), i)) };
        let files_columns = projection.len() - 1;
        let position_expr: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(
                column(files_columns),
                Operator::Multiply,
                Arc::new(Literal::new(ScalarValue::Int64(Some(1 << 32)))),
            )),
            Operator::Plus,
            column(files_columns + 1),
        ));
        let mut exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = Vec::with_capacity(projection.len());
        let mut next = 0;
        for (i, &c) in projection.iter().enumerate() {
            if i == at {
                exprs.push((Arc::clone(&position_expr), POSITION.to_string()));
            } else {
                exprs.push((column(next), self.schema.field(c).name().clone()));
                next += 1;
            }
        }
        Ok(Arc::new(ProjectionExec::try_new(exprs, scan)?))
    }
}

/// The names of the partition column of a file's segment and of the virtual column of a row's
/// number in its file, which a position is computed from.
const SEGMENT: &str = "_tessera_segment";
const ROW: &str = "_tessera_row";

/// `files` in `groups` groups of about equal rows, each scanned by one partition.
fn spread(files: Vec<PartitionedFile>, groups: usize) -> Vec<FileGroup> {
    let mut spread: Vec<Vec<PartitionedFile>> = vec![Vec::new(); groups.clamp(1, files.len().max(1))];
    let mut sizes = vec![0u64; spread.len()];
    for file in files {
        let smallest = (0..sizes.len()).min_by_key(|&i| sizes[i]).expect("a group");
        sizes[smallest] += file.object_meta.size;
        spread[smallest].push(file);
    }
    spread.into_iter().map(FileGroup::new).collect()
}
