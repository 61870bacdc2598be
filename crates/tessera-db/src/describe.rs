//! What a session lists and describes: `SHOW TABLES` (every table, materialized view and
//! source with its kind), `DESCRIBE name` (its columns as SQL types, whether they take NULL,
//! the key), `SHOW name` and `SHOW ALL` (the settings of the registry, with what they apply to).
//! The shell's `\dt`, `\d name` and `\set` are these statements.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::tokenizer::Location;
use tessera::catalog::sql_type_name;
use tessera::error::{Result, TesseraError};
use tessera::settings::SETTINGS;

use crate::{quoted, Database, Outcome};

/// Rows of text under `columns`.
pub(crate) fn text_rows(columns: &[&str], rows: Vec<Vec<String>>) -> Result<Outcome> {
    let schema =
        Arc::new(Schema::new(columns.iter().map(|c| Field::new(*c, DataType::Utf8, false)).collect::<Vec<_>>()));
    let arrays = (0..columns.len())
        .map(|c| Arc::new(StringArray::from_iter_values(rows.iter().map(|row| row[c].as_str()))) as _)
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays)?;
    Ok(Outcome::Rows { schema, batches: vec![batch] })
}

impl Database {
    /// `SHOW TABLES`: every table, materialized view and source, by name.
    pub(crate) fn show_tables(&self) -> Result<Outcome> {
        let mut rows: Vec<Vec<String>> = Vec::new();
        for table in self.tables.values() {
            rows.push(vec![table.name.clone(), "table".into(), table.rows().to_string()]);
        }
        for (key, view) in &self.views {
            let kind = if view.sample.is_some() { "materialized view (sampled)" } else { "materialized view" };
            rows.push(vec![key.clone(), kind.into(), view.contents.rows().to_string()]);
        }
        for name in self.sources.keys() {
            rows.push(vec![name.clone(), "source".into(), String::new()]);
        }
        rows.sort();
        text_rows(&["name", "kind", "rows"], rows)
    }

    /// `DESCRIBE name`: the columns of a table, view or source.
    pub(crate) fn describe(&self, name: &ast::ObjectName) -> Result<Outcome> {
        let name = crate::object_name(name)?;
        let key = name.to_lowercase();
        let table = self.tables.get(&key);
        let (schema, key_columns) = if let Some(table) = table {
            let hidden = table.key_names().iter().any(|k| k == crate::table::ROW_ID);
            (Arc::clone(&table.schema), if hidden { Vec::new() } else { table.key_names() })
        } else if self.views.contains_key(&key) {
            (self.sql(&format!("SELECT * FROM {} LIMIT 0", quoted(&key)))?.0, Vec::new())
        } else if self.sources.contains_key(&key) {
            // The sources compiled, with nothing after them.
            let script = self.compile_stream("", Location::new(1, 1), "")?;
            let source = script.catalog.source(&key).or_else(|| script.catalog.source(&name));
            let source = source.ok_or_else(|| TesseraError::Internal(format!("source `{name}` did not compile")))?;
            (Arc::clone(&source.schema), Vec::new())
        } else {
            return Err(TesseraError::Plan(format!("no table, view or source `{name}`")));
        };
        let rows = schema
            .fields()
            .iter()
            .map(|f| {
                let in_key = key_columns.iter().any(|k| k.eq_ignore_ascii_case(f.name()));
                vec![
                    f.name().clone(),
                    table.map_or_else(|| sql_type_name(f.data_type()), |t| t.type_name(f)),
                    if f.is_nullable() { "YES" } else { "NO" }.into(),
                    if in_key { "PRI" } else { "" }.into(),
                ]
            })
            .collect();
        text_rows(&["column_name", "column_type", "null", "key"], rows)
    }

    /// `SHOW name`, or `SHOW ALL`: the settings as they are now.
    pub(crate) fn show_setting(&self, variable: &[ast::Ident]) -> Result<Outcome> {
        let name = variable.iter().map(|i| i.value.to_lowercase()).collect::<Vec<_>>().join(".");
        if name == "all" {
            let rows = SETTINGS
                .iter()
                .map(|s| {
                    let value = self.settings.get(s.name).unwrap_or_default();
                    vec![s.name.into(), value, s.values.into(), s.applies_to.into(), s.doc.into()]
                })
                .collect();
            return text_rows(&["name", "setting", "values", "applies_to", "description"], rows);
        }
        match self.settings.get(&name) {
            Some(value) => text_rows(&[name.as_str()], vec![vec![value]]),
            // The error of SET names the settings and the closest one.
            None => Err(TesseraError::Plan(self.settings.clone().set(&name, "").unwrap_err())),
        }
    }
}
