//! The Spark target's queries over sampled views: at `stale` and `exact` freshness the query
//! over the view's versions, otherwise the estimate as Spark SQL: the two samples (cached),
//! the stale answer, and the formulas of [`crate::estimator`] for COUNT, SUM, AVG, MIN, MAX,
//! MEDIAN and PERCENTILE_CONT written as aggregates over them, the quantiles' bootstrap drawn
//! by [`crate::spark_hash::drawn`].

use std::collections::HashMap;
use std::fmt::Write;

use datafusion_sql::sqlparser::ast;
use tessera::error::Result;
use tessera::sql::walk;

use super::{hash_sql, over_versions, unsupported, SparkSample, SparkView};
use crate::estimate::{Freshness, Settings};
use crate::estimator::{normal_quantile, PAIRS_STREAM, REPLICATES, VALUES_STREAM};

/// An aggregate of an estimated query: its kind (`count`, `sum`, `avg`, `min`, `max`,
/// `quantile`), its argument's SQL (`None` for `COUNT(*)`), the quantile's fraction, and its
/// column's name.
struct SparkAggregate {
    kind: String,
    argument: Option<String>,
    fraction: Option<f64>,
    alias: String,
    /// As written, lower case: how HAVING names it.
    text: String,
}

/// A SELECT over one sampled view, read for the Spark target.
struct SparkQuery<'a> {
    view: &'a SparkView,
    sample: &'a SparkSample,
    view_name: String,
    groups: Vec<String>,
    /// The columns of the answer in order: a group (its index) or an aggregate (its index).
    outputs: Vec<Result<usize, usize>>,
    aggregates: Vec<SparkAggregate>,
    condition: Option<String>,
    /// HAVING over the answer's columns (each aggregate by its name).
    having: Option<String>,
}

/// The Spark SQL of `query` at `settings`' freshness: over the stale view, the fresh view, or
/// an estimate from the samples.
pub(super) fn compile_query(
    query: &ast::Query,
    views: &HashMap<String, SparkView>,
    versions: &HashMap<String, usize>,
    settings: &Settings,
) -> Result<String> {
    let mut read = Vec::new();
    let _ = walk::relations(query, |name: &ast::ObjectName| {
        read.push(name.to_string().to_lowercase());
        std::ops::ControlFlow::<()>::Continue(())
    });
    let rename = |to: &dyn Fn(&SparkView) -> String| {
        let mut renamed = query.clone();
        let _ = walk::relations_mut(&mut renamed, |name: &mut ast::ObjectName| {
            if let Some(view) = views.get(&name.to_string().to_lowercase()) {
                *name = ast::ObjectName::from(vec![ast::Ident::new(to(view))]);
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        over_versions(&renamed, versions).to_string()
    };
    // As tessera answers: estimates are of queries over views; one over tables alone is exact.
    let freshness = match read.iter().any(|name| views.contains_key(name)) {
        true => settings.freshness,
        false => Freshness::Stale,
    };
    match freshness {
        Freshness::Stale => return Ok(rename(&|v| v.stale.clone())),
        Freshness::Exact => {
            // The views read, over the tables' last versions, then the query over those.
            let mut fresh = String::new();
            for (name, view) in views.iter().filter(|(name, _)| read.contains(name)) {
                let query = over_versions(&view.query, versions);
                writeln!(fresh, "CREATE OR REPLACE TEMPORARY VIEW {name}__fresh AS {query};").expect("a string");
            }
            let names: HashMap<&str, &str> = views.iter().map(|(n, v)| (v.stale.as_str(), n.as_str())).collect();
            return Ok(format!("{fresh}{}", rename(&|v| format!("{}__fresh", names[v.stale.as_str()]))));
        }
        Freshness::SvcAqp | Freshness::SvcCorr | Freshness::Auto => {}
    }
    let shape = read_estimated(query, views)?;
    let (samples, mut sql) = estimate_sql(&shape, versions, settings)?;
    if shape.having.is_some() || query.order_by.is_some() || query.limit_clause.is_some() {
        let having = shape.having.as_ref().map(|h| format!(" WHERE {h}")).unwrap_or_default();
        let order = query.order_by.as_ref().map(|o| format!(" {o}")).unwrap_or_default();
        let limit = query.limit_clause.as_ref().map(|l| format!("{l}")).unwrap_or_default();
        sql = format!("SELECT * FROM ({sql}) AS __estimate{having}{order}{limit}");
    }
    Ok(format!("{samples}{sql}"))
}

/// The parts of an estimated query: SELECT group columns and COUNT, SUM, AVG of one sampled
/// view, with WHERE and GROUP BY.
fn read_estimated<'a>(query: &ast::Query, views: &'a HashMap<String, SparkView>) -> Result<SparkQuery<'a>> {
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return Err(unsupported("an estimate of anything but one SELECT"));
    };
    let view_name = match select.from.as_slice() {
        [ast::TableWithJoins { relation: ast::TableFactor::Table { name, .. }, joins }] if joins.is_empty() => {
            name.to_string().to_lowercase()
        }
        _ => return Err(unsupported("an estimate over more than one sampled view")),
    };
    let not_sampled = || unsupported(format!("an estimate over `{view_name}`, which is not a sampled view"));
    let view = views.get(&view_name).ok_or_else(not_sampled)?;
    let sample = view.sample.as_ref().ok_or_else(not_sampled)?;
    let groups: Vec<String> = match &select.group_by {
        ast::GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => {
            exprs.iter().map(|e| e.to_string().to_lowercase()).collect()
        }
        _ => return Err(unsupported("GROUP BY ALL or grouping sets")),
    };
    let mut outputs = Vec::new();
    let mut aggregates = Vec::new();
    for item in &select.projection {
        let (expr, alias) = match item {
            ast::SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.to_lowercase())),
            ast::SelectItem::UnnamedExpr(expr) => (expr, None),
            other => return Err(unsupported(format!("`{other}` in an estimate"))),
        };
        if let Some(g) = groups.iter().position(|g| *g == expr.to_string().to_lowercase()) {
            outputs.push(Ok(g));
            continue;
        }
        let ast::Expr::Function(function) = expr else {
            return Err(unsupported(format!("`{expr}`: an estimate's columns are group columns and aggregates")));
        };
        let name = function.name.to_string().to_lowercase();
        let ast::FunctionArguments::List(list) = &function.args else {
            return Err(unsupported(format!("`{expr}`")));
        };
        let argument = |e: &ast::FunctionArg| match e {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e.to_string()),
            _ => None,
        };
        let fraction = |e: &ast::FunctionArg| argument(e).and_then(|p| p.parse::<f64>().ok());
        let within: Vec<String> =
            function.within_group.iter().filter(|o| o.options.asc != Some(false)).map(|o| o.expr.to_string()).collect();
        let (kind, argument, fraction) = match (name.as_str(), list.args.as_slice(), within.as_slice()) {
            ("count", [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)], []) => (name, None, None),
            ("count" | "sum" | "avg" | "min" | "max", [a], []) => (name, argument(a), None),
            ("median" | "approx_median", [a], []) => ("quantile".into(), argument(a), Some(0.5)),
            ("percentile_cont" | "approx_percentile_cont", [a, p], []) => ("quantile".into(), argument(a), fraction(p)),
            ("percentile_cont" | "approx_percentile_cont", [p], [a]) => {
                ("quantile".into(), Some(a.clone()), fraction(p))
            }
            _ => (name, None, None),
        };
        let known = matches!(kind.as_str(), "count" | "sum" | "avg" | "min" | "max")
            || kind == "quantile" && fraction.is_some_and(|f| (0.0..=1.0).contains(&f));
        if !known
            || argument.is_none() && kind != "count"
            || list.duplicate_treatment.is_some()
            || function.within_group.len() != within.len()
            || function.filter.is_some()
            || function.over.is_some()
        {
            return Err(unsupported(format!(
                "`{expr}`: the Spark target estimates COUNT, SUM, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT \
                 (or APPROX_) of one column"
            )));
        }
        let alias = alias.ok_or_else(|| unsupported(format!("`{expr}` without AS name")))?;
        outputs.push(Err(aggregates.len()));
        aggregates.push(SparkAggregate { kind, argument, fraction, alias, text: expr.to_string().to_lowercase() });
    }
    let condition = select.selection.as_ref().map(|c| c.to_string());
    let having = select.having.as_ref().map(|h| over_estimates(h, &aggregates)).transpose()?;
    Ok(SparkQuery { view, sample, view_name, groups, outputs, aggregates, condition, having })
}

/// HAVING `condition` over an estimate's answer: each aggregate it names by the name the query
/// selects it as (the estimate, as tessera filters on); one the query does not select is
/// refused.
fn over_estimates(condition: &ast::Expr, aggregates: &[SparkAggregate]) -> Result<String> {
    let mut condition = condition.clone();
    let _ = walk::expressions_mut(walk::NodeMut::Expr(&mut condition), |e: &mut ast::Expr| {
        if let ast::Expr::Function(_) = e {
            let text = e.to_string().to_lowercase();
            if let Some(a) = aggregates.iter().find(|a| a.text == text) {
                *e = ast::Expr::Identifier(ast::Ident::new(a.alias.clone()));
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    let mut unselected = None;
    let _ = walk::expressions(walk::Node::Expr(&condition), |e: &ast::Expr| {
        if let ast::Expr::Function(_) = e {
            unselected = Some(e.to_string());
            return std::ops::ControlFlow::Break(());
        }
        std::ops::ControlFlow::Continue(())
    });
    match unselected {
        Some(f) => Err(unsupported(format!("HAVING on `{f}`, which the query does not select: select it AS a name"))),
        None => Ok(condition.to_string()),
    }
}

/// An estimate's SQL for each group of `__est`: its value and variance (`NULL` where it has
/// none) and its interval.
struct EstimateSql {
    value: String,
    variance: String,
    low: String,
    high: String,
}

impl EstimateSql {
    /// `value` with the normal interval of `variance` at `z` standard errors.
    fn normal(value: String, variance: String, z: f64) -> Self {
        let low = format!("({value}) - {z:?} * SQRT({variance})");
        let high = format!("({value}) + {z:?} * SQRT({variance})");
        EstimateSql { value, variance, low, high }
    }
}

/// The estimate's SQL: the formulas of [`crate::estimate`] over the clean sample (the fresh
/// view's rows whose key hashes into the sample, and those of the outlier index's keys), the
/// stale sample and the stale answer; both estimators' per group (`__est`), and the one the
/// freshness asks for, or under `auto` the one with the smaller summed relative variance over
/// the groups and aggregates. Each row has a weight `__w` and a variance factor `__v`: 1/m and
/// (1-m)/m^2 for a sampled row, 1 and 0 for an outlier's (Section 6.3). Returned as the
/// statements that cache the samples, and the query.
fn estimate_sql(q: &SparkQuery, versions: &HashMap<String, usize>, settings: &Settings) -> Result<(String, String)> {
    let (view, sample) = (q.view, q.sample);
    let m = sample.ratio;
    let threshold = (m * 4_294_967_296.0).floor() as i64;
    let z = normal_quantile(0.5 + settings.confidence / 2.0);
    let (weight, variance) = (1.0 / m, (1.0 - m) / (m * m));
    // The sample's hash over the view's columns, as tessera computes it.
    let hash = hash_sql(sample.seed, &sample.key);
    let sampled = format!("({hash} & 4294967295) < {threshold}");
    let fresh = format!("({}) AS {}", over_versions(&view.query, versions), q.view_name);
    let stale = format!("{} AS {}", view.stale, q.view_name);
    let condition = q.condition.clone().unwrap_or_else(|| "TRUE".into());
    // Group columns `__g0` .. (a constant without GROUP BY) and key columns `__k0` ...
    let group_exprs: Vec<String> = if q.groups.is_empty() { vec!["1".into()] } else { q.groups.clone() };
    let g: Vec<String> = (0..group_exprs.len()).map(|i| format!("__g{i}")).collect();
    let k: Vec<String> = (0..sample.key.len()).map(|i| format!("__k{i}")).collect();
    let list =
        |prefix: &str, names: &[String]| names.iter().map(|n| format!("{prefix}{n}")).collect::<Vec<_>>().join(", ");
    let aliased = |exprs: &[String], names: &[String]| {
        exprs.iter().zip(names).map(|(e, n)| format!("{e} AS {n}")).collect::<Vec<_>>()
    };
    let matching =
        |a: &str, b: &str, names: &[String]| names.iter().map(|c| format!("{a}.{c} <=> {b}.{c}")).collect::<Vec<_>>();
    let on = |a: &str, b: &str| matching(a, b, &g).join(" AND ");
    let extreme = |a: &SparkAggregate| matches!(a.kind.as_str(), "min" | "max");
    // Each row's value `y` where it counts and whether it counts `c`; for MIN and MAX its value
    // where it counts, `x`, else NULL.
    let mut values = aliased(&group_exprs, &g);
    values.extend(aliased(&sample.key, &k));
    for (j, a) in q.aggregates.iter().enumerate() {
        let counts = match &a.argument {
            Some(arg) => format!("({condition}) AND ({arg}) IS NOT NULL"),
            None => format!("({condition})"),
        };
        let y = match (&a.argument, a.kind.as_str()) {
            (Some(arg), "sum" | "avg" | "quantile") => format!("CAST({arg} AS DOUBLE)"),
            _ => "CAST(1 AS DOUBLE)".into(),
        };
        values.push(format!("CASE WHEN {counts} THEN {y} ELSE CAST(0 AS DOUBLE) END AS __y{j}"));
        values.push(format!("CASE WHEN {counts} THEN CAST(1 AS DOUBLE) ELSE CAST(0 AS DOUBLE) END AS __c{j}"));
        if let (Some(arg), true) = (&a.argument, extreme(a)) {
            values.push(format!("CASE WHEN {counts} THEN CAST({arg} AS DOUBLE) END AS __x{j}"));
        }
    }
    let rows = |from: &str| match &sample.index {
        None => format!(
            "SELECT {}, {weight:?} AS __w, {variance:?} AS __v, false AS __whole FROM {from} WHERE {sampled}",
            values.join(", ")
        ),
        Some(_) => format!(
            "SELECT {}, CASE WHEN __o.__hash IS NULL THEN {weight:?} ELSE 1.0D END AS __w, \
             CASE WHEN __o.__hash IS NULL THEN {variance:?} ELSE 0.0D END AS __v, __o.__hash IS NOT NULL AS __whole \
             FROM {from} LEFT JOIN __outliers __o ON {hash} = __o.__hash WHERE {sampled} OR __o.__hash IS NOT NULL",
            values.join(", ")
        ),
    };
    let mut sums = vec![g.join(", "), "COUNT(*) AS __n".into()];
    for (j, a) in q.aggregates.iter().enumerate() {
        sums.push(format!(
            "SUM(__w * __y{j}) AS __y{j}, SUM(__w * __c{j}) AS __c{j}, SUM(__v * __y{j} * __y{j}) AS __q{j}, \
             SUM(__v * __y{j}) AS __vy{j}, SUM(__v * __c{j}) AS __vc{j}"
        ));
        if extreme(a) {
            sums.push(format!("{0}(__x{j}) AS __e{j}", a.kind));
        }
    }
    let sums = |from: &str| format!("SELECT {} FROM {from} GROUP BY {}", sums.join(", "), g.join(", "));
    // The stale answer.
    let mut answer = aliased(&group_exprs, &g);
    for (j, a) in q.aggregates.iter().enumerate() {
        let argument = a.argument.as_deref().unwrap_or("*");
        answer.push(match a.fraction {
            Some(f) => format!("CAST(percentile({argument}, {f:?}) AS DOUBLE) AS __b{j}"),
            None => format!("CAST({}({argument}) AS DOUBLE) AS __b{j}", a.kind),
        });
    }
    let group_by = if q.groups.is_empty() { String::new() } else { format!(" GROUP BY {}", q.groups.join(", ")) };
    let answer = format!("SELECT {} FROM {stale} WHERE {condition}{group_by}", answer.join(", "));
    // Each row's term of the correction (a stale row's negated), summed per key and group; a
    // key's weight is the same in both samples.
    let term = |j: usize, a: &SparkAggregate| {
        match a.kind.as_str() {
        "avg" => format!(
            "CASE WHEN s.__c{j} > 0 THEN (r.__y{j} - (s.__y{j} / s.__c{j}) * r.__c{j}) / s.__c{j} ELSE CAST(0 AS DOUBLE) END"
        ),
        _ => format!("r.__y{j}"),
    }
    };
    let terms = |rows: &str, sums: &str, sign: &str| {
        let mut t = vec![list("r.", &g), list("r.", &k), "r.__w, r.__v".into()];
        t.extend(q.aggregates.iter().enumerate().map(|(j, a)| format!("{sign}({}) AS __t{j}", term(j, a))));
        format!("SELECT {} FROM {rows} r LEFT JOIN {sums} s ON {}", t.join(", "), on("r", "s"))
    };
    let mut diffs = vec![g.join(", "), k.join(", "), "MAX(__w) AS __w, MAX(__v) AS __v".into()];
    diffs.extend((0..q.aggregates.len()).map(|j| format!("SUM(__t{j}) AS __d{j}")));
    let mut corr = vec![g.join(", ")];
    corr.extend(
        (0..q.aggregates.len()).map(|j| format!("SUM(__w * __d{j}) AS __s{j}, SUM(__v * __d{j} * __d{j}) AS __sq{j}")),
    );
    // The index and both samples, cached before the query: its plan reads them many times,
    // and Spark would evaluate the views over the tables' versions at each (dropping a cached
    // view uncaches it).
    let mut cached: Vec<(String, String)> =
        sample.index.as_ref().map(|index| ("__outliers".into(), index.hashes(versions))).into_iter().collect();
    cached.extend([("__clean".into(), rows(&fresh)), ("__dirty".into(), rows(&stale))]);
    let mut ctes = vec![
        format!("__cs AS ({})", sums("__clean")),
        format!("__ds AS ({})", sums("__dirty")),
        format!("__answer AS ({answer})"),
        format!("__groups AS (SELECT {0} FROM __answer UNION SELECT {0} FROM __cs)", g.join(", ")),
        format!("__terms AS ({} UNION ALL {})", terms("__clean", "__cs", ""), terms("__dirty", "__ds", "-")),
        format!("__diffs AS (SELECT {} FROM __terms GROUP BY {}, {})", diffs.join(", "), g.join(", "), k.join(", ")),
        format!("__corr AS (SELECT {} FROM __diffs GROUP BY {})", corr.join(", "), g.join(", ")),
    ];
    let mut joined = vec![("B", "__answer"), ("C", "__cs"), ("D", "__ds"), ("X", "__corr")];
    if q.aggregates.iter().any(extreme) {
        // MIN and MAX under SVC+CORR: the largest (smallest) change of a key counted in the
        // same group in both samples.
        let mut changes = vec![list("c.", &g)];
        changes.extend(
            q.aggregates
                .iter()
                .enumerate()
                .filter(|(_, a)| extreme(a))
                .map(|(j, a)| format!("{}(c.__x{j} - d.__x{j}) AS __ch{j}", a.kind)),
        );
        let mut keyed = matching("c", "d", &k);
        keyed.extend(matching("c", "d", &g));
        ctes.push(format!(
            "__changes AS (SELECT {} FROM __clean c JOIN __dirty d ON {} GROUP BY {})",
            changes.join(", "),
            keyed.join(" AND "),
            list("c.", &g)
        ));
        joined.push(("H", "__changes"));
    }
    if q.aggregates.iter().any(|a| a.fraction.is_some()) {
        cached.push(("__reps".into(), format!("SELECT explode(sequence(0, {})) AS __b", REPLICATES - 1)));
    }
    let tail = (1.0 - settings.confidence) / 2.0;
    for (j, a) in q.aggregates.iter().enumerate() {
        if let Some(fraction) = a.fraction {
            let (replicates, quantiles) = quantile_sql(j, fraction, tail, &g, &k);
            cached.extend(replicates);
            ctes.extend(quantiles);
        }
    }
    let samples: String = cached
        .iter()
        .map(|(name, query)| format!("DROP VIEW IF EXISTS {name};\nCACHE TABLE {name} AS {query};\n"))
        .collect();
    let quantile_tables: Vec<(String, String)> = q
        .aggregates
        .iter()
        .enumerate()
        .filter(|(_, a)| a.fraction.is_some())
        .flat_map(|(j, _)| [(format!("QA{j}"), format!("__qa{j}")), (format!("QC{j}"), format!("__qc{j}"))])
        .collect();
    joined.extend(quantile_tables.iter().map(|(a, t)| (a.as_str(), t.as_str())));
    // Per aggregate: both estimators' estimates.
    let evidence = "COALESCE(C.__n, 0) + COALESCE(D.__n, 0) = 0";
    let mut columns: Vec<String> = (0..g.len()).map(|i| format!("G.__g{i}")).collect();
    for (j, a) in q.aggregates.iter().enumerate() {
        let aqp_variance = format!("C.__q{j}");
        let aqp = match a.kind.as_str() {
            "count" => EstimateSql::normal(format!("C.__y{j}"), aqp_variance, z),
            "sum" => EstimateSql::normal(format!("CASE WHEN C.__c{j} > 0 THEN C.__y{j} END"), aqp_variance, z),
            "avg" => {
                let r = format!("(C.__y{j} / C.__c{j})");
                EstimateSql::normal(
                    format!("CASE WHEN C.__c{j} > 0 THEN {r} END"),
                    format!(
                        "CASE WHEN C.__c{j} > 0 THEN GREATEST(C.__q{j} - 2 * {r} * C.__vy{j} + {r} * {r} * C.__vc{j}, 0) / (C.__c{j} * C.__c{j}) END"
                    ),
                    z,
                )
            }
            "quantile" => EstimateSql {
                value: format!("QA{j}.__value"),
                variance: format!("QA{j}.__var"),
                low: format!("QA{j}.__low"),
                high: format!("QA{j}.__high"),
            },
            _ => {
                // The clean sample's extreme: a bound on one side; nothing bounds the other
                // unless the sample is the whole view.
                let seen = format!("C.__e{j}");
                let far = if m >= 1.0 { seen.clone() } else { "CAST(NULL AS DOUBLE)".to_string() };
                let (low, high) = if a.kind == "max" { (seen.clone(), far) } else { (far, seen.clone()) };
                EstimateSql { value: seen, variance: "CAST(NULL AS DOUBLE)".into(), low, high }
            }
        };
        let corr_variance = format!("COALESCE(X.__sq{j}, 0)");
        let corrected = match a.kind.as_str() {
            "count" | "sum" => {
                EstimateSql::normal(format!("COALESCE(B.__b{j}, 0) + COALESCE(X.__s{j}, 0)"), corr_variance, z)
            }
            "avg" => {
                let ok = format!("B.__b{j} IS NOT NULL AND C.__c{j} > 0 AND D.__c{j} > 0");
                let value = format!("B.__b{j} + C.__y{j} / C.__c{j} - D.__y{j} / D.__c{j}");
                let normal = EstimateSql::normal(value, corr_variance, z);
                let pick =
                    |corrected: &str, otherwise: &str| format!("CASE WHEN {ok} THEN {corrected} ELSE {otherwise} END");
                EstimateSql {
                    value: pick(&normal.value, &aqp.value),
                    variance: pick(&normal.variance, &aqp.variance),
                    low: pick(&normal.low, &aqp.low),
                    high: pick(&normal.high, &aqp.high),
                }
            }
            "quantile" => {
                // The stale quantile moved by the change of the samples' quantiles, the
                // bootstrap's interval shifted by the stale quantile.
                let ok = format!("B.__b{j} IS NOT NULL AND QC{j}.__value IS NOT NULL");
                let pick = |corrected: String, otherwise: &str| {
                    format!("CASE WHEN {ok} THEN {corrected} ELSE {otherwise} END")
                };
                EstimateSql {
                    value: pick(format!("B.__b{j} + QC{j}.__value"), &aqp.value),
                    variance: pick(format!("QC{j}.__var"), &aqp.variance),
                    low: pick(format!("B.__b{j} + QC{j}.__low"), &aqp.low),
                    high: pick(format!("B.__b{j} + QC{j}.__high"), &aqp.high),
                }
            }
            _ => {
                // The stale extreme moved by the largest change, never short of the clean
                // sample's extreme, within its bounds.
                let ok = format!("B.__b{j} IS NOT NULL AND H.__ch{j} IS NOT NULL AND C.__e{j} IS NOT NULL");
                let (outward, inward) = if a.kind == "max" { ("GREATEST", "LEAST") } else { ("LEAST", "GREATEST") };
                let moved = format!("{outward}(B.__b{j} + H.__ch{j}, C.__e{j})");
                let limit = if a.kind == "max" { &aqp.high } else { &aqp.low };
                let value = format!("CASE WHEN ({limit}) IS NULL THEN {moved} ELSE {inward}({moved}, {limit}) END");
                EstimateSql {
                    value: format!("CASE WHEN {ok} THEN {value} ELSE {} END", aqp.value),
                    variance: aqp.variance.clone(),
                    low: aqp.low.clone(),
                    high: aqp.high.clone(),
                }
            }
        };
        // With no row of the group in either sample: the stale answer, without an interval.
        let unless_absent = |e: &str| format!("CASE WHEN {evidence} THEN NULL ELSE {e} END");
        let corr = EstimateSql {
            value: format!("CASE WHEN {evidence} THEN B.__b{j} ELSE {} END", corrected.value),
            variance: unless_absent(&corrected.variance),
            low: unless_absent(&corrected.low),
            high: unless_absent(&corrected.high),
        };
        for (prefix, e) in [("a", &aqp), ("c", &corr)] {
            columns.push(format!(
                "{} AS __{prefix}v{j}, {} AS __{prefix}w{j}, {} AS __{prefix}l{j}, {} AS __{prefix}h{j}",
                e.value, e.variance, e.low, e.high
            ));
        }
    }
    let joins: Vec<String> = joined.iter().map(|(a, t)| format!(" LEFT JOIN {t} {a} ON {}", on("G", a))).collect();
    ctes.push(format!("__est AS (SELECT {} FROM __groups G{})", columns.join(", "), joins.concat()));
    // `auto`: each estimator's variances relative to the clean sample's estimates, summed.
    let relative = |prefix: &str| {
        let terms: Vec<String> = (0..q.aggregates.len())
            .map(|j| {
                format!(
                    "COALESCE(__{prefix}w{j}, 0) / POWER(CASE WHEN __av{j} IS NULL THEN 1.0 ELSE GREATEST(ABS(__av{j}), 1e-12) END, 2)"
                )
            })
            .collect();
        format!("COALESCE(SUM({}), 0)", terms.join(" + "))
    };
    ctes.push(format!("__score AS (SELECT {} AS __corr, {} AS __aqp FROM __est)", relative("c"), relative("a")));
    let chosen = |part: &str, j: usize| match settings.freshness {
        Freshness::SvcAqp => format!("E.__a{part}{j}"),
        Freshness::SvcCorr => format!("E.__c{part}{j}"),
        // Ties (no variance tells them apart) go to the clean sample's values.
        _ => format!("CASE WHEN S.__corr < S.__aqp THEN E.__c{part}{j} ELSE E.__a{part}{j} END"),
    };
    let mut selected = Vec::new();
    for output in &q.outputs {
        match *output {
            Ok(i) => selected.push(format!("E.__g{i} AS {}", q.groups[i])),
            Err(j) => {
                let name = &q.aggregates[j].alias;
                selected.push(format!("{} AS {name}", chosen("v", j)));
                selected.push(format!("{} AS {name}_ci_low", chosen("l", j)));
                selected.push(format!("{} AS {name}_ci_high", chosen("h", j)));
            }
        }
    }
    let query = format!("WITH {} SELECT {} FROM __est E CROSS JOIN __score S", ctes.join(", "), selected.join(", "));
    Ok((samples, query))
}

/// Quantile `j` (the fraction `fraction`) of an estimate, as [`crate::estimate`] computes it
/// by the bootstrap: the replicates to cache (`__qvr{j}`, the clean sample's values, and
/// `__qpr{j}`, the key-matched clean and stale values), and the CTEs over them: `__qa{j}`
/// (SVC+AQP: the clean sample's weighted quantile) and `__qc{j}` (SVC+CORR: the change of the
/// quantiles of the key-matched values), each per group `g` with its `__value`, the variance
/// `__var` of its replicates and their percentile interval `__low`, `__high` at tails `tail`.
/// In replicate `__b` the `k`-th sampled item (in value order) is replaced by the one at
/// `pmod(xxhash64(stream, __b, k), n)`, as [`crate::spark_hash::drawn`] draws; outliers are
/// kept; `__b = -1` is the sample itself.
fn quantile_sql(
    j: usize,
    fraction: f64,
    tail: f64,
    g: &[String],
    k: &[String],
) -> (Vec<(String, String)>, Vec<String>) {
    let list = |prefix: &str, names: &[String]| names.iter().map(|n| format!("{prefix}{n}")).collect::<Vec<_>>();
    let same = |a: &str, b: &str, names: &[String]| {
        names.iter().map(|c| format!("{a}.{c} <=> {b}.{c}")).collect::<Vec<_>>().join(" AND ")
    };
    let groups = g.join(", ");
    // Replicates of `items` (columns `columns`, `__w`, `__whole`), ordered by `order`: the
    // sampled items numbered `__i` of `__n` per group, each drawn item joined by its number.
    let replicated = |items: &str, columns: &str, order: &str, stream: i32| {
        let d_columns = columns.split(", ").map(|c| format!("d.{c}")).collect::<Vec<_>>().join(", ");
        let numbered = format!(
            "(SELECT *, ROW_NUMBER() OVER (PARTITION BY {groups} ORDER BY {order}) - 1 AS __i, \
             COUNT(*) OVER (PARTITION BY {groups}) AS __n FROM {items} WHERE NOT __whole)"
        );
        format!(
            "SELECT {groups}, -1 AS __b, {columns}, __w FROM {items} \
             UNION ALL SELECT {}, r.__b, {columns}, __w FROM {items} o CROSS JOIN __reps r WHERE o.__whole \
             UNION ALL SELECT {}, r.__b, {d_columns}, d.__w FROM {numbered} s CROSS JOIN __reps r JOIN {numbered} d \
             ON {} AND d.__i = pmod(xxhash64(CAST({stream} AS INT), CAST(r.__b AS INT), CAST(s.__i AS INT)), s.__n)",
            list("o.", g).join(", "),
            list("s.", g).join(", "),
            same("s", "d", g),
        )
    };
    // The values of `side` that count, with `columns`.
    let values = |side: &str, columns: &[String]| {
        format!("SELECT {}, __y{j} AS __x, __w, __whole FROM {side} WHERE __c{j} > 0", columns.join(", "))
    };
    let mut matched = k.to_vec();
    matched.extend(g.iter().cloned());
    let coalesced: Vec<String> = g.iter().map(|c| format!("COALESCE(c.{c}, d.{c}) AS {c}")).collect();
    let pairs = format!(
        "SELECT {}, c.__x AS __a, d.__x AS __s, COALESCE(c.__w, d.__w) AS __w, \
         COALESCE(c.__whole, d.__whole) AS __whole \
         FROM ({}) c FULL OUTER JOIN ({}) d ON {}",
        coalesced.join(", "),
        values("__clean", &matched),
        values("__dirty", &matched),
        same("c", "d", &matched),
    );
    let replicates = vec![
        (
            format!("__qvr{j}"),
            format!(
                "WITH __qv{j} AS ({}) {}",
                values("__clean", g),
                replicated(&format!("__qv{j}"), "__x", "__x", VALUES_STREAM)
            ),
        ),
        (
            format!("__qpr{j}"),
            format!(
                "WITH __qp{j} AS ({pairs}) {}",
                replicated(&format!("__qp{j}"), "__a, __s", "__a ASC NULLS LAST, __s ASC NULLS LAST", PAIRS_STREAM)
            ),
        ),
    ];
    let quantiles = vec![
        format!("__qa{j} AS ({})", bootstrap_sql(&weighted_quantile(&format!("__qvr{j}"), g, fraction), g, tail)),
        format!(
            "__qpa{j} AS ({})",
            weighted_quantile(&format!("(SELECT {groups}, __b, __a AS __x, __w FROM __qpr{j} WHERE __a IS NOT NULL)"), g, fraction)
        ),
        format!(
            "__qps{j} AS ({})",
            weighted_quantile(&format!("(SELECT {groups}, __b, __s AS __x, __w FROM __qpr{j} WHERE __s IS NOT NULL)"), g, fraction)
        ),
        format!(
            "__qc{j} AS ({})",
            bootstrap_sql(
                &format!(
                    "SELECT {}, a.__b, a.__value - s.__value AS __value FROM __qpa{j} a JOIN __qps{j} s ON {} AND a.__b = s.__b",
                    list("a.", g).join(", "),
                    same("a", "s", g)
                ),
                g,
                tail
            )
        ),
    ];
    (replicates, quantiles)
}

/// Per group `g` and replicate `__b` of `input` (values `__x` with weights `__w`), the
/// quantile `fraction` as [`crate::estimate`]'s `quantile`: of equal weights the interpolated
/// one of PERCENTILE_CONT, otherwise the smallest value whose cumulative weight (in value
/// order) reaches `fraction` of the total.
fn weighted_quantile(input: &str, g: &[String], fraction: f64) -> String {
    let by = format!("{}, __b", g.join(", "));
    format!(
        "SELECT {by}, CASE WHEN __wmin = __wmax THEN __lox + (__h - __lo) * (__hix - __lox) \
         ELSE COALESCE(__reach, __last) END AS __value FROM (\
         SELECT {by}, MIN(__w) AS __wmin, MAX(__w) AS __wmax, MAX(__h) AS __h, MAX(__lo) AS __lo, \
         MAX(CASE WHEN __r = __lo THEN __x END) AS __lox, MAX(CASE WHEN __r = __hi THEN __x END) AS __hix, \
         MIN(CASE WHEN __cum >= {fraction:?} * __total THEN __x END) AS __reach, MAX(__x) AS __last FROM (\
         SELECT *, LEAST(__lo + 1, __n - 1) AS __hi, MAX(__cum) OVER (PARTITION BY {by}) AS __total FROM (\
         SELECT *, CAST(__n - 1 AS DOUBLE) * {fraction:?} AS __h, FLOOR(CAST(__n - 1 AS DOUBLE) * {fraction:?}) AS __lo \
         FROM (SELECT __x, __w, {by}, ROW_NUMBER() OVER (PARTITION BY {by} ORDER BY __x) - 1 AS __r, \
         COUNT(*) OVER (PARTITION BY {by}) AS __n, SUM(__w) OVER (PARTITION BY {by} ORDER BY __x \
         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS __cum FROM {input}))) GROUP BY {by})"
    )
}

/// Per group `g` of `input` (`__value` per replicate `__b`, the sample's at `__b = -1`): the
/// sample's value, and with two replicates or more their variance and percentile interval at
/// tails `tail`, as [`crate::estimate`]'s `bootstrapped`.
fn bootstrap_sql(input: &str, g: &[String], tail: f64) -> String {
    let groups = g.join(", ");
    let at = |q: f64| {
        format!(
            "CASE WHEN __n >= 2 THEN MAX(CASE WHEN __r = LEAST(ROUND(CAST(__n - 1 AS DOUBLE) * {q:?}), __n - 1) \
             THEN __value END) END"
        )
    };
    format!(
        "SELECT {groups}, MAX(CASE WHEN __b = -1 THEN __value END) AS __value, \
         CASE WHEN MAX(__n) >= 2 THEN VAR_SAMP(CASE WHEN __b >= 0 THEN __value END) END AS __var, \
         {} AS __low, {} AS __high FROM (SELECT *, \
         CASE WHEN __b >= 0 AND __value IS NOT NULL THEN ROW_NUMBER() OVER (PARTITION BY {groups}, \
         __b >= 0 AND __value IS NOT NULL ORDER BY __value) - 1 END AS __r, \
         COUNT(CASE WHEN __b >= 0 THEN __value END) OVER (PARTITION BY {groups}) AS __n FROM ({input})) \
         GROUP BY {groups}, __n",
        at(tail),
        at(1.0 - tail)
    )
}
