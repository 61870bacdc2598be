//! `tessera compile --target spark` of a database script: its tables, sampled views and
//! estimates as Spark SQL, so that Spark computes the same samples (with its own `xxhash64`,
//! which tessera reproduces, [`crate::spark_hash`]) and the same estimates and intervals.
//!
//! Spark's tables here are files, not mutable: every version of a table is a temporary view
//! (`t__0` from the file of `CREATE TABLE ... WITH (path = ...)`, `t__1` after the first
//! `COPY`, ...), and a materialized view's stale contents are its query over the versions of
//! its last refresh. The clean sample is the fresh view's rows whose key hashes below the ratio
//! (Property 1: the rows tessera's cleaning expression computes); Spark's optimizer pushes that
//! filter toward the scans itself. The estimates are the same formulas as [`crate::estimate`]'s
//! for COUNT, SUM, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT, written as queries over the two
//! samples (cached first) and the stale view; the bootstrap of a quantile draws its replicates
//! by a counter ([`crate::spark_hash::drawn`]), so Spark draws the ones tessera does. A
//! `COPY ... WITH (op_column = ...)` file names each key once.
//!
//! An outlier index is kept as tessera keeps it: the rows its rule picks from the indexed
//! table's version at the view's refresh (`v__obaseN`), and the rows of the changes since
//! (`t__changesN`: each `COPY`'s inserted rows and the rows it deleted or replaced) that reach
//! the bar of the `k`-th picked value; the view's rows of those keys enter the estimates whole.
//! An index on the view's own column picks from the view's stale contents at its refresh.
//!
//! Here: the tables, their versions, the views and their samples; the queries and their
//! estimates are [`estimate`]'s.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;

use datafusion_sql::sqlparser::ast;
use tessera::error::{Result, TesseraError};
use tessera::sql::walk;

use crate::estimate::Settings;
use crate::sample::{Indexed, OutlierOptions};
use crate::{maintain, Database, Statement, StatementKind};

mod estimate;

use estimate::compile_query;

fn unsupported(what: impl std::fmt::Display) -> TesseraError {
    TesseraError::Plan(format!("the Spark target does not take {what}"))
}

/// A table's columns (name, Spark type) and its key's columns.
type TableColumns = (Vec<(String, String)>, Vec<String>);

/// A materialized view as the Spark script keeps it.
struct SparkView {
    query: ast::Query,
    /// The temporary view of its stale contents.
    stale: String,
    sample: Option<SparkSample>,
}

/// A view's sample as the Spark script keeps it.
struct SparkSample {
    /// The view's columns the sample's key is.
    key: Vec<String>,
    ratio: f64,
    seed: Option<i32>,
    index: Option<SparkIndex>,
}

/// A sampled view's outlier index as the Spark script keeps it.
struct SparkIndex {
    options: OutlierOptions,
    /// The sample's hash over the indexed table's columns, or the view's.
    hash: String,
    /// The temporary view of the rows the rule picked at the view's last refresh: their key's
    /// hash `__hash` and value `__value`.
    base: String,
    /// The indexed table's version at that refresh; `None` for an index on the view's own
    /// column, picked from its stale contents and not from changes.
    refreshed: Option<usize>,
}

impl SparkIndex {
    /// Writes the view of the rows the rule picks from the indexed table's current version,
    /// or from `stale` (the view's contents) for an index on the view's own column (the view
    /// `name` refreshed at statement `number`), and records the table's version.
    fn pick(&mut self, out: &mut String, name: &str, number: usize, stale: &str, versions: &HashMap<String, usize>) {
        let o = &self.options;
        let rows = match &mut self.refreshed {
            None => stale.to_string(),
            Some(refreshed) => {
                *refreshed = versions[&o.table];
                format!("{}__{refreshed}", o.table)
            }
        };
        self.base = format!("{name}__obase{number}");
        let limit = o.k.map(|k| format!(" LIMIT {k}")).unwrap_or_default();
        writeln!(
            out,
            "CREATE OR REPLACE TEMPORARY VIEW {} AS SELECT * FROM ({}) ORDER BY __value DESC, __hash ASC{limit};",
            self.base,
            self.picked(&rows, None),
        )
        .expect("a string");
    }

    /// The hash and value of the rows of `rows` (the indexed table's) above the threshold and
    /// at least `at_least` (SQL, `NULL` for none).
    fn picked(&self, rows: &str, at_least: Option<&str>) -> String {
        let o = &self.options;
        let value = format!("CAST({} AS DOUBLE)", o.column);
        let mut conditions = vec![format!("{} IS NOT NULL", o.column)];
        conditions.extend(o.threshold.map(|t| format!("{value} > {t:?}")));
        conditions.extend(at_least.map(|a| format!("({a} IS NULL OR {value} >= {a})")));
        format!("SELECT {} AS __hash, {value} AS __value FROM {rows} WHERE {}", self.hash, conditions.join(" AND "))
    }

    /// The outlier keys' hashes now: those picked at the refresh, and those of the changes
    /// since (up to the table's current version) that reach the bar.
    fn hashes(&self, versions: &HashMap<String, usize>) -> String {
        let mut parts = vec![format!("SELECT __hash FROM {}", self.base)];
        if let Some(refreshed) = self.refreshed.filter(|&r| versions[&self.options.table] > r) {
            let now = versions[&self.options.table];
            let bar = match self.options.k {
                Some(k) => format!("(SELECT CASE WHEN COUNT(*) >= {k} THEN MIN(__value) END FROM {})", self.base),
                None => "CAST(NULL AS DOUBLE)".into(),
            };
            let changes: Vec<String> =
                (refreshed + 1..=now).map(|v| format!("SELECT * FROM {}__changes{v}", self.options.table)).collect();
            let changes = format!("({})", changes.join(" UNION ALL "));
            parts.push(format!("SELECT __hash FROM ({})", self.picked(&changes, Some(&bar))));
        }
        parts.join(" UNION ")
    }
}

/// The Spark SQL of a database script's `statements` (relative file paths resolved from
/// `dir`).
pub fn compile_spark(statements: &[Statement], dir: &Path) -> Result<String> {
    // Planned over empty tables of the same columns, for the views' samples.
    let mut planner = Database::in_memory()?;
    let mut out = String::from("-- Spark SQL compiled by tessera: tables are files, each version a temporary view.\n");
    let mut versions: HashMap<String, usize> = HashMap::new();
    let mut columns: HashMap<String, TableColumns> = HashMap::new();
    let mut views: HashMap<String, SparkView> = HashMap::new();
    let mut settings = Settings::default();
    let mut statement_number = 0usize;
    for statement in statements {
        match &statement.kind {
            StatementKind::Other(sql_statement) => match sql_statement.as_ref() {
                ast::Statement::CreateTable(create) => {
                    let name = create.name.to_string().to_lowercase();
                    let mut table_columns = Vec::new();
                    for column in &create.columns {
                        table_columns.push((column.name.value.to_lowercase(), spark_type(&column.data_type)));
                    }
                    let mut bare = create.clone();
                    let options = match &create.table_options {
                        ast::CreateTableOptions::With(options) => options.clone(),
                        _ => Vec::new(),
                    };
                    bare.table_options = ast::CreateTableOptions::None;
                    planner.execute(&bare.to_string())?;
                    let key = planner.table_key(&name);
                    let path = options
                        .iter()
                        .map(crate::key_value)
                        .collect::<Result<Vec<_>>>()?
                        .into_iter()
                        .find(|(k, _)| k == "path")
                        .map(|(_, v)| v);
                    let target = format!("{name}__0");
                    match path {
                        Some(path) => write_file_view(&mut out, &target, &table_columns, &dir.join(path))?,
                        None => {
                            let empty: Vec<String> =
                                table_columns.iter().map(|(c, t)| format!("CAST(NULL AS {t}) AS {c}")).collect();
                            writeln!(
                                out,
                                "CREATE OR REPLACE TEMPORARY VIEW {target} AS SELECT {} WHERE false;",
                                empty.join(", ")
                            )
                            .expect("a string");
                        }
                    }
                    versions.insert(name.clone(), 0);
                    columns.insert(name, (table_columns, key));
                }
                ast::Statement::CreateView(create) if create.materialized => {
                    planner.execute_statement(statement)?;
                    let name = create.name.to_string().to_lowercase();
                    let view = planner.view(&name).expect("the view was created");
                    statement_number += 1;
                    let stale = format!("{name}__stale{statement_number}");
                    let query = over_versions(&create.query, &versions);
                    writeln!(out, "CREATE OR REPLACE TEMPORARY VIEW {stale} AS {query};").expect("a string");
                    let Some(sample) = &view.sample else {
                        views.insert(name, SparkView { query: *create.query.clone(), stale, sample: None });
                        continue;
                    };
                    if sample.sampling.sampled_at_root() {
                        return Err(unsupported(format!("`{name}`, whose hash stays at its root")));
                    }
                    let key = sample_key_columns(view)?;
                    let options = sample.sampling.options;
                    let index = match &sample.sampling.outliers {
                        None => None,
                        Some(index) => {
                            let (hash, refreshed) = match &index.indexed {
                                Indexed::View => (hash_sql(options.seed, &key), None),
                                Indexed::Table { .. } => {
                                    let table = &index.options.table;
                                    let schema = &planner.tables[table].schema;
                                    let columns = index.key_columns().ok_or_else(|| {
                                        unsupported(format!(
                                            "the outlier index of `{name}`, whose key is not columns of `{table}`"
                                        ))
                                    })?;
                                    (hash_sql(options.seed, &as_hashed(&columns, schema)?), Some(0))
                                }
                            };
                            let mut index =
                                SparkIndex { options: index.options.clone(), hash, base: String::new(), refreshed };
                            index.pick(&mut out, &name, statement_number, &stale, &versions);
                            Some(index)
                        }
                    };
                    let sample = SparkSample { key, ratio: options.ratio, seed: options.seed, index };
                    views.insert(name, SparkView { query: *create.query.clone(), stale, sample: Some(sample) });
                }
                ast::Statement::Insert(insert) => {
                    let ast::TableObject::TableName(table) = &insert.table else {
                        return Err(unsupported("INSERT INTO a table function"));
                    };
                    let name = table.to_string().to_lowercase();
                    let (table_columns, _) = table_of(&columns, &name)?;
                    let source = insert.source.as_ref().ok_or_else(|| unsupported("INSERT without rows"))?;
                    let given: Vec<String> = match insert.columns.is_empty() {
                        true => table_columns.iter().map(|(c, _)| c.clone()).collect(),
                        false => insert.columns.iter().map(|c| c.to_string().to_lowercase()).collect(),
                    };
                    let aliases: Vec<String> = (0..given.len()).map(|i| format!("__c{i}")).collect();
                    let values: Vec<String> = table_columns
                        .iter()
                        .map(|(c, t)| match given.iter().position(|g| g == c) {
                            Some(i) => format!("CAST(__c{i} AS {t}) AS {c}"),
                            None => format!("CAST(NULL AS {t}) AS {c}"),
                        })
                        .collect();
                    let source = over_versions(source, &versions);
                    let inserted =
                        format!("SELECT {} FROM ({source}) AS __given({})", values.join(", "), aliases.join(", "));
                    let previous = format!("{name}__{}", versions[&name]);
                    let kept = format!("SELECT * FROM {previous}");
                    let removed = format!("SELECT * FROM {previous} WHERE false");
                    write_version(&mut out, &name, &mut versions, &views, [&kept, &inserted, &removed]);
                }
                ast::Statement::Update(update) => {
                    let ast::TableFactor::Table { name: table, .. } = &update.table.relation else {
                        return Err(unsupported("UPDATE of anything but a table"));
                    };
                    let name = table.to_string().to_lowercase();
                    let (table_columns, _) = table_of(&columns, &name)?;
                    let mut values: Vec<String> = table_columns.iter().map(|(c, _)| c.clone()).collect();
                    for assignment in &update.assignments {
                        let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
                            return Err(unsupported("UPDATE of a tuple of columns"));
                        };
                        let column = column.to_string().to_lowercase();
                        let i = table_columns
                            .iter()
                            .position(|(c, _)| *c == column)
                            .ok_or_else(|| TesseraError::Plan(format!("table `{name}` has no column `{column}`")))?;
                        values[i] = format!("CAST({} AS {}) AS {column}", assignment.value, table_columns[i].1);
                    }
                    let chosen = update.selection.as_ref().map_or("true".into(), |c| format!("COALESCE({c}, false)"));
                    let kept = rows_of(&name, "*", &format!("NOT {chosen}"), &versions)?;
                    let inserted = rows_of(&name, &values.join(", "), &chosen, &versions)?;
                    let removed = rows_of(&name, "*", &chosen, &versions)?;
                    write_version(&mut out, &name, &mut versions, &views, [&kept, &inserted, &removed]);
                }
                ast::Statement::Delete(delete) => {
                    let from = match &delete.from {
                        ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from) => from,
                    };
                    let [ast::TableWithJoins { relation: ast::TableFactor::Table { name: table, .. }, .. }] =
                        from.as_slice()
                    else {
                        return Err(unsupported("DELETE from anything but one table"));
                    };
                    let name = table.to_string().to_lowercase();
                    table_of(&columns, &name)?;
                    let chosen = delete.selection.as_ref().map_or("true".into(), |c| format!("COALESCE({c}, false)"));
                    let kept = rows_of(&name, "*", &format!("NOT {chosen}"), &versions)?;
                    let inserted = format!("SELECT * FROM {name}__{} WHERE false", versions[&name]);
                    let removed = rows_of(&name, "*", &chosen, &versions)?;
                    write_version(&mut out, &name, &mut versions, &views, [&kept, &inserted, &removed]);
                }
                ast::Statement::Explain { .. } => {
                    let explained = first_words(&sql_statement.to_string());
                    writeln!(out, "-- {explained} ...: tessera's plan, not Spark's").expect("a string")
                }
                other => return Err(unsupported(format!("`{}`", first_words(&other.to_string())))),
            },
            StatementKind::Query { query, .. } => {
                let estimate = compile_query(query, &views, &versions, &settings)?;
                writeln!(out, "{estimate};").expect("a string");
            }
            StatementKind::Copy { table, path, options } => {
                let name = table.to_string().to_lowercase();
                let (table_columns, key) = table_of(&columns, &name)?;
                let version = versions[&name];
                let file = format!("{name}__file{}", version + 1);
                let op = options.iter().find(|(k, _)| k == "op_column").map(|(_, v)| v.to_lowercase());
                let mut file_columns = table_columns.clone();
                if let Some(op) = &op {
                    file_columns.push((op.clone(), "STRING".into()));
                }
                write_file_view(&mut out, &file, &file_columns, &dir.join(path))?;
                let names: Vec<&str> = table_columns.iter().map(|(c, _)| c.as_str()).collect();
                let previous = format!("{name}__{version}");
                let inserted = match &op {
                    None => format!("SELECT {} FROM {file}", names.join(", ")),
                    Some(op) => format!(
                        "SELECT {} FROM {file} WHERE upper(trim({op})) IN ('I', 'U', 'INSERT', 'UPDATE')",
                        names.join(", ")
                    ),
                };
                // The rows it replaces or deletes: those of the keys the file names.
                let on: Vec<String> = key.iter().map(|k| format!("{previous}.{k} = {file}.{k}")).collect();
                let kept = match &op {
                    None => format!("SELECT * FROM {previous}"),
                    Some(_) if key.is_empty() => {
                        return Err(unsupported(format!("op_column on `{name}`, which has no primary key")))
                    }
                    Some(_) => {
                        format!("SELECT {previous}.* FROM {previous} LEFT ANTI JOIN {file} ON {}", on.join(" AND "))
                    }
                };
                let removed = match &op {
                    None => format!("SELECT * FROM {previous} WHERE false"),
                    Some(_) => {
                        format!("SELECT {previous}.* FROM {previous} LEFT SEMI JOIN {file} ON {}", on.join(" AND "))
                    }
                };
                write_version(&mut out, &name, &mut versions, &views, [&kept, &inserted, &removed]);
            }
            StatementKind::Refresh { view, sample: false } => {
                let name = view.to_string().to_lowercase();
                let spark = views
                    .get_mut(&name)
                    .ok_or_else(|| TesseraError::Plan(format!("`{name}` is not a materialized view")))?;
                statement_number += 1;
                spark.stale = format!("{name}__stale{statement_number}");
                writeln!(
                    out,
                    "CREATE OR REPLACE TEMPORARY VIEW {} AS {};",
                    spark.stale,
                    over_versions(&spark.query, &versions)
                )
                .expect("a string");
                if let Some(index) = spark.sample.as_mut().and_then(|s| s.index.as_mut()) {
                    index.pick(&mut out, &name, statement_number, &spark.stale, &versions);
                }
            }
            // Spark's samples are always clean: nothing to do.
            StatementKind::Refresh { sample: true, .. } => {}
            StatementKind::Set { name, value } => settings.set(name, value).map_err(TesseraError::Plan)?,
            StatementKind::CreateSource(_) => {
                return Err(unsupported(
                    "streams: it compiles database scripts; a script of streams and window queries \
                     compiles with --target flink",
                ))
            }
            // How tessera would refresh: nothing for Spark, which recomputes.
            StatementKind::ExplainRefresh { view } => {
                writeln!(out, "-- EXPLAIN REFRESH MATERIALIZED VIEW {view}: Spark recomputes the view")
                    .expect("a string")
            }
        }
    }
    Ok(out)
}

/// The columns and key of table `name`.
fn table_of<'a>(columns: &'a HashMap<String, TableColumns>, name: &str) -> Result<&'a TableColumns> {
    columns.get(name).ok_or_else(|| TesseraError::Plan(format!("`{name}` is not a table")))
}

/// `SELECT select FROM` table `name`'s current version (under its own name, so that the
/// statement's expressions read it as written) `WHERE condition`, as Spark SQL.
fn rows_of(name: &str, select: &str, condition: &str, versions: &HashMap<String, usize>) -> Result<String> {
    let sql = format!("SELECT {select} FROM {name} AS {name} WHERE {condition}");
    match crate::parse_one(&sql)? {
        ast::Statement::Query(query) => Ok(over_versions(&query, versions).to_string()),
        other => Err(TesseraError::Internal(format!("{other} is no query"))),
    }
}

/// Writes table `name`'s next version: the rows `kept` of the previous one and the rows
/// `inserted`; where an outlier index reads the table, its changes too (the rows `removed`,
/// and those inserted).
fn write_version(
    out: &mut String,
    name: &str,
    versions: &mut HashMap<String, usize>,
    views: &HashMap<String, SparkView>,
    [kept, inserted, removed]: [&str; 3],
) {
    let next = versions[name] + 1;
    writeln!(out, "CREATE OR REPLACE TEMPORARY VIEW {name}__{next} AS {kept} UNION ALL {inserted};").expect("a string");
    let indexed =
        |v: &SparkView| v.sample.as_ref().and_then(|s| s.index.as_ref()).is_some_and(|i| i.options.table == name);
    if views.values().any(indexed) {
        writeln!(out, "CREATE OR REPLACE TEMPORARY VIEW {name}__changes{next} AS {removed} UNION ALL {inserted};")
            .expect("a string");
    }
    versions.insert(name.to_string(), next);
}

/// The first words of a statement, to name it in an error.
fn first_words(sql: &str) -> String {
    sql.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Spark's name of a column type.
fn spark_type(data_type: &ast::DataType) -> String {
    match data_type {
        ast::DataType::Varchar(_) | ast::DataType::Text | ast::DataType::String(_) | ast::DataType::Char(_) => {
            "STRING".into()
        }
        ast::DataType::Real | ast::DataType::Float(_) | ast::DataType::Float4 => "FLOAT".into(),
        ast::DataType::Float8 | ast::DataType::DoublePrecision => "DOUBLE".into(),
        other => other.to_string().to_uppercase(),
    }
}

/// A temporary view `name` of a CSV or Parquet file of `columns`.
fn write_file_view(out: &mut String, name: &str, columns: &[(String, String)], path: &Path) -> Result<()> {
    let path = std::path::absolute(path)
        .map_err(|e| TesseraError::Option(format!("cannot resolve `{}`: {e}", path.display())))?;
    let path = path.to_string_lossy().replace('\'', "\\'");
    let schema: Vec<String> = columns.iter().map(|(c, t)| format!("{c} {t}")).collect();
    let parquet = path.ends_with(".parquet");
    let (format, options) = if parquet { ("parquet", String::new()) } else { ("csv", ", header 'true'".to_string()) };
    writeln!(
        out,
        "CREATE OR REPLACE TEMPORARY VIEW {name} ({}) USING {format} OPTIONS (path '{path}'{options});",
        schema.join(", ")
    )
    .expect("a string");
    Ok(())
}

/// `query` reading each table's current version, and Spark's `range(a, b + 1) AS g(value)`
/// where it reads DataFusion's `generate_series(a, b)`.
fn over_versions(query: &ast::Query, versions: &HashMap<String, usize>) -> ast::Query {
    let mut query = query.clone();
    let _ = walk::walk_mut(walk::NodeMut::Query(&mut query), &mut |met| {
        match met {
            walk::MetMut::Relation(name) => {
                let key = name.to_string().to_lowercase();
                if let Some(version) = versions.get(&key) {
                    *name = ast::ObjectName::from(vec![ast::Ident::new(format!("{key}__{version}"))]);
                }
            }
            walk::MetMut::Factor(ast::TableFactor::Table { name, args: Some(args), alias, .. })
                if name.to_string().eq_ignore_ascii_case("generate_series") && args.args.len() == 2 =>
            {
                *name = ast::ObjectName::from(vec![ast::Ident::new("range")]);
                if let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(end)) = &mut args.args[1] {
                    *end = ast::Expr::Nested(Box::new(ast::Expr::BinaryOp {
                        left: Box::new(end.clone()),
                        op: ast::BinaryOperator::Plus,
                        right: Box::new(ast::Expr::value(ast::Value::Number("1".into(), false))),
                    }));
                }
                let named = alias.take().map_or_else(|| ast::Ident::new("generate_series"), |a| a.name);
                *alias = Some(ast::TableAlias {
                    explicit: true,
                    name: named,
                    columns: vec![ast::TableAliasColumnDef::from_name("value")],
                    at: None,
                });
            }
            _ => {}
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    query
}

/// The sample's hash (Spark's `xxhash64`, the seed first where there is one) of `key`.
fn hash_sql(seed: Option<i32>, key: &[String]) -> String {
    let mut hashed: Vec<String> = seed.map(|s| format!("CAST({s} AS INT)")).into_iter().collect();
    hashed.extend(key.iter().cloned());
    format!("xxhash64({})", hashed.join(", "))
}

/// `columns` of `schema` as tessera hashes them: integer columns as BIGINT.
fn as_hashed(columns: &[String], schema: &arrow::datatypes::Schema) -> Result<Vec<String>> {
    columns
        .iter()
        .map(|c| {
            let field = schema.field_with_name(c).map_err(|e| TesseraError::Internal(e.to_string()))?;
            Ok(if field.data_type().is_integer() { format!("CAST({c} AS BIGINT)") } else { c.clone() })
        })
        .collect()
}

/// The sample's key as expressions over the view's columns, as tessera hashes them (integer
/// columns as BIGINT); an error if the key is not among the view's columns.
fn sample_key_columns(view: &crate::View) -> Result<Vec<String>> {
    let sample = view.sample.as_ref().expect("a sampled view");
    let maintain::Maintenance::Incremental(incremental) = &view.maintenance else { unreachable!() };
    sample
        .sampling
        .key_columns
        .iter()
        .map(|stored| {
            let (name, data_type) = incremental.visible_key(stored).ok_or_else(|| {
                unsupported(format!("a view whose sample key {} is not among its columns", sample.sampling.key))
            })?;
            Ok(if data_type.is_integer() { format!("CAST({name} AS BIGINT)") } else { name })
        })
        .collect()
}
