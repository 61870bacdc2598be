//! How a query reads a table: the table's data files through DataFusion's Parquet scan (only
//! the columns the query uses; row groups and pages pruned by their statistics against its
//! filters; a limit), the rows statements deleted skipped by a row selection (a deletion
//! vector), every byte checked ([`crate::datafile::CheckedFiles`]); rows held in memory (an
//! in-memory database, files of format 2, rows a statement of this process wrote) through a
//! memory scan beside it.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::{Statistics, ToDFSchema};
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
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use crate::datafile::CheckedFiles;

/// A data file of a table as a scan reads it.
#[derive(Debug, Clone)]
pub struct ScannedFile {
    pub name: String,
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
    /// The columns queries see: the declared ones.
    pub schema: SchemaRef,
    /// The columns of the files: the declared ones, then any hidden row id.
    pub stored: SchemaRef,
    /// The folder of the data files.
    pub data: Option<PathBuf>,
    pub files: Vec<ScannedFile>,
    /// Live rows held in memory, with the declared columns.
    pub held: Vec<RecordBatch>,
}

#[async_trait::async_trait]
impl TableProvider for TableScan {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        let projection: Vec<usize> = match projection {
            Some(columns) => columns.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let mut parts: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if let (Some(data), false) = (&self.data, self.files.is_empty()) {
            let mut source = ParquetSource::new(TableSchema::from(Arc::clone(&self.stored)))
                .with_table_parquet_options(state.table_options().parquet.clone())
                .with_parquet_file_reader_factory(Arc::new(CheckedFiles { data: data.clone() }))
                .with_enable_page_index(true);
            if let Some(filter) = conjunction(filters.to_vec()) {
                let schema = Arc::clone(&self.schema).to_dfschema()?;
                source = source.with_predicate(state.create_physical_expr(filter, &schema)?);
            }
            let files: Vec<PartitionedFile> = self
                .files
                .iter()
                .map(|file| {
                    let size = std::fs::metadata(data.join(&file.name)).map_or(0, |m| m.len());
                    let scanned = PartitionedFile::new(file.name.clone(), size);
                    match file.selection() {
                        Some(selection) => scanned.with_extension(ParquetRowSelection::new(selection)),
                        None => scanned,
                    }
                })
                .collect();
            let rows = self.files.iter().map(ScannedFile::live).sum();
            let statistics = Statistics::new_unknown(&self.stored).with_num_rows(Precision::Exact(rows));
            let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
                .with_file_groups(spread(files, state.config().target_partitions()))
                .with_projection_indices(Some(projection.clone()))?
                .with_statistics(statistics)
                .with_limit(limit)
                .build();
            parts.push(DataSourceExec::from_data_source(config));
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
            parts.push(MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&self.schema), Some(projection))?);
        }
        Ok(match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => UnionExec::try_new(parts)?,
        })
    }
}

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
