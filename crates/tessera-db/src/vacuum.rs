//! `VACUUM [FULL] [name]`: compaction on demand of a table or a materialized view (its contents
//! and its sample), or of every one. Plain `VACUUM` compacts as every statement does after its
//! edit ([`Compaction::Tiered`]); `VACUUM FULL` rewrites each into one segment without deleted
//! rows. Both forget the change sets no view still needs. One statement: its new files and the
//! manifest naming them are committed together, and the files it replaced are removed once no
//! manifest and no reader's registered state names them.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_sql::sqlparser::ast;
use tessera::error::{Result, TesseraError};

use crate::table::{Compacted, Compaction};
use crate::views::changes_needed_after;
use crate::{object_name, Database, Outcome};

impl Database {
    pub(crate) fn vacuum(&mut self, vacuum: &ast::VacuumStatement) -> Result<Outcome> {
        let ast::VacuumStatement { full, sort_only, delete_only, reindex, recluster, table_name, threshold, boost } =
            vacuum;
        if *sort_only || *delete_only || *reindex || *recluster || threshold.is_some() || *boost {
            return Err(TesseraError::Plan(format!(
                "`{vacuum}` takes options tessera does not have: VACUUM [FULL] [table or materialized view]"
            )));
        }
        let compaction = if *full { Compaction::Full } else { Compaction::Tiered };
        let (tables, views): (Vec<String>, Vec<String>) = match table_name {
            None => (self.tables.keys().cloned().collect(), self.views.keys().cloned().collect()),
            Some(name) => {
                let key = object_name(name)?.to_lowercase();
                match (self.tables.contains_key(&key), self.views.contains_key(&key)) {
                    (true, _) => (vec![key], Vec::new()),
                    (false, true) => (Vec::new(), vec![key]),
                    (false, false) => {
                        return Err(TesseraError::Plan(format!(
                            "no table or materialized view `{}` to vacuum",
                            object_name(name)?
                        )))
                    }
                }
            }
        };
        let compacted = self.compact(compaction, &tables, &views);
        if compacted.is_err() {
            // Memory back to the state the folder holds.
            let manifest = self.manifest.clone();
            self.load(manifest)?;
        }
        report(compacted?)
    }

    /// Compacts `tables` and `views` and commits them as one statement; what each part became.
    fn compact(
        &mut self,
        compaction: Compaction,
        tables: &[String],
        views: &[String],
    ) -> Result<Vec<(String, &'static str, Compacted)>> {
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        let mut done = Vec::new();
        for key in tables {
            let needed = changes_needed_after(key, self.views.values());
            let table = self.tables.get_mut(key).ok_or_else(|| TesseraError::Internal(format!("no table {key}")))?;
            table.forget_changes_through(needed);
            done.push((table.name.clone(), "table", table.compact(compaction, &mut self.storage, &mut manifest)?));
            manifest.tables.insert(key.clone(), table.entry());
        }
        for key in views {
            let needed = changes_needed_after(key, self.views.values());
            let view = self.views.get_mut(key).ok_or_else(|| TesseraError::Internal(format!("no view {key}")))?;
            view.contents.forget_changes_through(needed);
            let contents = view.contents.compact(compaction, &mut self.storage, &mut manifest)?;
            done.push((key.clone(), "materialized view", contents));
            let entry_contents = view.contents.entry();
            let sample = match &mut view.sample {
                Some(sample) => {
                    let compacted = sample.contents.compact(compaction, &mut self.storage, &mut manifest)?;
                    done.push((key.clone(), "sample of materialized view", compacted));
                    Some(sample.entry())
                }
                None => None,
            };
            let entry = manifest.views.get_mut(key).ok_or_else(|| TesseraError::Internal(format!("no view {key}")))?;
            entry.contents = entry_contents;
            entry.sample = sample;
        }
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        Ok(done)
    }
}

/// A row per part compacted: its name, kind, segments before and after, rows written and
/// deleted rows dropped.
fn report(compacted: Vec<(String, &'static str, Compacted)>) -> Result<Outcome> {
    let text = |values: Vec<&str>| Arc::new(StringArray::from(values)) as ArrayRef;
    let count = |value: fn(&Compacted) -> usize| {
        Arc::new(UInt64Array::from_iter_values(compacted.iter().map(|(_, _, c)| value(c) as u64))) as ArrayRef
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("segments_before", DataType::UInt64, false),
        Field::new("segments_after", DataType::UInt64, false),
        Field::new("rows_written", DataType::UInt64, false),
        Field::new("deleted_rows_dropped", DataType::UInt64, false),
    ]));
    let columns = vec![
        text(compacted.iter().map(|(name, _, _)| name.as_str()).collect()),
        text(compacted.iter().map(|(_, kind, _)| *kind).collect()),
        count(|c| c.segments_before),
        count(|c| c.segments_after),
        count(|c| c.rows_written),
        count(|c| c.rows_dropped),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    Ok(Outcome::Rows { schema, batches: vec![batch] })
}
