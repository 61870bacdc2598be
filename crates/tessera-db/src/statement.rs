//! What the statements of a database script read from files: a script's outputs must not be
//! one of them.

use std::path::{Path, PathBuf};

use datafusion_sql::sqlparser::ast;
use tessera::sql::{Statement, StatementKind};

/// The files `statement` reads, each with what it is to the statement; relative paths are
/// under `base_dir`.
pub fn files_read(statement: &Statement, base_dir: &Path) -> Vec<(String, PathBuf)> {
    match &statement.kind {
        StatementKind::Copy { table, path, .. } => {
            vec![(format!("the file COPY reads into `{table}`"), base_dir.join(path))]
        }
        StatementKind::Other(other) => match other.as_ref() {
            ast::Statement::CreateTable(create) => match &create.table_options {
                ast::CreateTableOptions::With(options) => options
                    .iter()
                    .filter_map(|option| crate::key_value(option).ok())
                    .filter(|(name, _)| name == "path")
                    .map(|(_, path)| (format!("the initial contents of table `{}`", create.name), base_dir.join(path)))
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        StatementKind::CreateSource(source) => match &source.location {
            tessera::catalog::Location::File(path) => {
                vec![(format!("the file of source `{}`", source.name), path.clone())]
            }
            _ => Vec::new(),
        },
        StatementKind::Set { .. }
        | StatementKind::Query { .. }
        | StatementKind::Refresh { .. }
        | StatementKind::ExplainRefresh { .. } => Vec::new(),
    }
}
