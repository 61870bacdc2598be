//! The estimators of Stale View Cleaning (Section 5) over a view's samples: from the rows of
//! the cleaned and the stale sample that a query reads ([`SampleRows`]), the estimates of its
//! aggregates per group with their variances or intervals ([`Estimator`]), and the statistics
//! they rest on (the normal quantile, weighted quantiles, the bootstrap, the bounds of MIN and
//! MAX). What a query asks and how its answer is put together is [`crate::estimate`]'s.

use hashbrown::HashMap;

use arrow::row::OwnedRow;

use crate::spark_hash;

/// The quantile of the standard normal distribution at `p` (0 < p < 1): Wichura's algorithm
/// AS 241 (PPND16), accurate to about 1e-16.
#[allow(clippy::excessive_precision, reason = "AS 241's published coefficients")]
pub(crate) fn normal_quantile(p: f64) -> f64 {
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        let num = ((((((2509.0809287301226727 * r + 33430.575583588128105) * r + 67265.770927008700853) * r
            + 45921.953931549871457)
            * r
            + 13731.693765509461125)
            * r
            + 1971.5909503065514427)
            * r
            + 133.14166789178437745)
            * r
            + 3.387132872796366608;
        let den = ((((((5226.495278852545925 * r + 28729.085735721942674) * r + 39307.89580009271061) * r
            + 21213.794301586595867)
            * r
            + 5394.1960214247511077)
            * r
            + 687.1870074920579083)
            * r
            + 42.313330701600911252)
            * r
            + 1.0;
        return q * num / den;
    }
    let r = if q < 0.0 { p } else { 1.0 - p };
    let r = (-r.ln()).sqrt();
    let value = if r <= 5.0 {
        let r = r - 1.6;
        let num = ((((((7.7454501427834140764e-4 * r + 0.0227238449892691845833) * r + 0.24178072517745061177) * r
            + 1.27045825245236838258)
            * r
            + 3.64784832476320460504)
            * r
            + 5.7694972214606914055)
            * r
            + 4.6303378461565452959)
            * r
            + 1.42343711074968357734;
        let den = ((((((1.05075007164441684324e-9 * r + 5.475938084995344946e-4) * r + 0.0151986665636164571966)
            * r
            + 0.14810397642748007459)
            * r
            + 0.68976733498510000455)
            * r
            + 1.6763848301838038494)
            * r
            + 2.05319162663775882187)
            * r
            + 1.0;
        num / den
    } else {
        let r = r - 5.0;
        let num = ((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 0.0012426609473880784386)
            * r
            + 0.026532189526576123093)
            * r
            + 0.29656057182850489123)
            * r
            + 1.7848265399172913358)
            * r
            + 5.4637849111641143699)
            * r
            + 6.6579046435011037772;
        let den = ((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r + 1.8463183175100546818e-5)
            * r
            + 7.868691311456132591e-4)
            * r
            + 0.0148753612908506148525)
            * r
            + 0.13692988092273580531)
            * r
            + 0.59983220655588793769)
            * r
            + 1.0;
        num / den
    };
    if q < 0.0 {
        -value
    } else {
        value
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Count,
    Sum,
    Avg,
    /// MEDIAN (0.5), PERCENTILE_CONT and APPROX_PERCENTILE_CONT: the quantile in [0, 1].
    Quantile(f64),
    Min,
    Max,
}

impl Kind {
    /// Whether it is computed from the values themselves rather than sums of them.
    fn by_values(self) -> bool {
        matches!(self, Kind::Quantile(_) | Kind::Min | Kind::Max)
    }
}

/// The rows of a sample an estimate reads: per row its key, its group in the query, whether
/// it meets the query's conditions, per aggregate its value `y` (0 where it does not count)
/// and whether it counts `c` (1 or 0), and its weight: `w`, the inverse of the probability it
/// is in the sample (`1 / m`, or 1 for a row of the outlier index, which is there whole), and
/// `v`, what its value adds to the variance of a weighted sum (`(1 - m) / m^2`, or 0).
pub(crate) struct SampleRows {
    pub keys: Vec<OwnedRow>,
    pub groups: Vec<OwnedRow>,
    pub y: Vec<Vec<f64>>,
    pub c: Vec<Vec<f64>>,
    pub w: Vec<f64>,
    pub v: Vec<f64>,
    /// Whether the row is the outlier index's (there whole) rather than sampled.
    pub whole: Vec<bool>,
}

/// A value that counts for a quantile, MIN or MAX, with its row's weight, and whether it was
/// sampled (resampled by the bootstrap) rather than an outlier (kept).
#[derive(Debug, Clone, Copy)]
struct Weighted {
    value: f64,
    weight: f64,
    sampled: bool,
}

/// Weighted sums per group: `y` = sum of `w * y`, `y2` = sum of `v * y^2`, `c` = sum of
/// `w * c`, `vy` = sum of `v * y`, `vc` = sum of `v * c`.
#[derive(Default, Clone)]
struct Sums {
    /// Rows that meet the conditions.
    rows: usize,
    y: Vec<f64>,
    y2: Vec<f64>,
    c: Vec<f64>,
    vy: Vec<f64>,
    vc: Vec<f64>,
    /// The values that count, for quantiles, MIN and MAX.
    values: Vec<Vec<Weighted>>,
}

impl Sums {
    fn new(aggregates: usize) -> Self {
        let zeros = vec![0.0; aggregates];
        Sums {
            rows: 0,
            y: zeros.clone(),
            y2: zeros.clone(),
            c: zeros.clone(),
            vy: zeros.clone(),
            vc: zeros,
            values: vec![Vec::new(); aggregates],
        }
    }
}

/// An estimate, its variance, and its interval where it is not the normal one (`None`: no
/// interval can be given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Estimate {
    pub value: Option<f64>,
    pub variance: Option<f64>,
    pub interval: Option<(f64, f64)>,
}

impl Estimate {
    fn normal(value: f64, variance: f64) -> Self {
        Estimate { value: Some(value), variance: Some(variance), interval: None }
    }
}

const ABSENT: Estimate = Estimate { value: None, variance: None, interval: None };

/// A key's clean and stale value, where it has one, its weight and whether it was sampled.
#[derive(Debug, Clone, Copy)]
struct Pair {
    clean: Option<f64>,
    stale: Option<f64>,
    weight: f64,
    sampled: bool,
}

/// Bootstrap replicates of the estimates of quantiles.
pub(crate) const REPLICATES: usize = 400;

/// The `q` quantile of `values`, `None` if empty. Of equally weighted values it is the
/// interpolated one of SQL's PERCENTILE_CONT (the mean of the middle two for the median of an
/// even count); otherwise the smallest value whose cumulative weight reaches `q` of the total.
fn quantile(values: &mut [Weighted], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.value.total_cmp(&b.value));
    let n = values.len();
    if values.iter().all(|v| v.weight == values[0].weight) {
        let h = (n - 1) as f64 * q;
        let low = h.floor() as usize;
        let high = (low + 1).min(n - 1);
        return Some(values[low].value + (h - low as f64) * (values[high].value - values[low].value));
    }
    let target = q * values.iter().map(|v| v.weight).sum::<f64>();
    let mut cumulative = 0.0;
    for v in values.iter() {
        cumulative += v.weight;
        if cumulative >= target {
            return Some(v.value);
        }
    }
    values.last().map(|v| v.value)
}

/// The bootstrap's streams of draws: of a quantile's values (SVC+AQP), of the key-matched
/// pairs of its correction (SVC+CORR).
pub(crate) const VALUES_STREAM: i32 = 1;
pub(crate) const PAIRS_STREAM: i32 = 2;

/// Bootstrap resample `replicate` of `items` in their order: the `k`-th sampled item replaced
/// by the sampled item at [`spark_hash::drawn`]`(stream, replicate, k)`, the outliers' kept.
/// The draws are a hash of their coordinates, so that Spark's SQL draws the same.
fn resampled<T>(items: &[T], sampled: impl Fn(&T) -> bool, stream: i32, replicate: usize) -> Vec<&T> {
    let pool: Vec<&T> = items.iter().filter(|i| sampled(i)).collect();
    let mut k: i32 = 0;
    items
        .iter()
        .map(|item| {
            if !sampled(item) {
                return item;
            }
            k += 1;
            pool[spark_hash::drawn(stream, replicate as i32, k - 1, pool.len())]
        })
        .collect()
}

/// A bootstrap estimate: `value` with the variance of `replicates` and their percentile
/// interval at `confidence`, each shifted by `shift`.
fn bootstrapped(value: f64, mut replicates: Vec<f64>, confidence: f64, shift: f64) -> Estimate {
    if replicates.len() < 2 {
        return Estimate { value: Some(value), variance: None, interval: None };
    }
    replicates.sort_by(f64::total_cmp);
    let n = replicates.len();
    let mean = replicates.iter().sum::<f64>() / n as f64;
    let variance = replicates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let at = |q: f64| replicates[((q * (n - 1) as f64).round() as usize).min(n - 1)];
    let tail = (1.0 - confidence) / 2.0;
    Estimate {
        value: Some(value),
        variance: Some(variance),
        interval: Some((shift + at(tail), shift + at(1.0 - tail))),
    }
}

/// The bounds of MAX (`max`, or MIN when false) over the fresh rows that count, of which
/// `values` (sample and outliers) are seen: the extreme seen is a bound that always holds (it
/// is a fresh value). Where rows are not seen (a sampled row stands for more than itself),
/// nothing a sample holds bounds the other side (a value beyond every sampled one may be among
/// them), so that side is infinite, written NULL; the paper's Cantelli bound, a union bound over
/// the `u` rows not sampled, is `s * sqrt(u / (1 - confidence))` from the sample's mean:
/// hundreds of standard deviations for a view of thousands of rows, far wider than the data.
/// Where every row is seen (a `whole` sample), the extreme seen is the answer.
fn extreme_bounds(values: &[Weighted], max: bool, whole: bool) -> (f64, f64) {
    let sign = if max { 1.0 } else { -1.0 };
    let seen = sign * values.iter().map(|v| sign * v.value).fold(f64::NEG_INFINITY, f64::max);
    let far = if whole { seen } else { sign * f64::INFINITY };
    if max {
        (seen, far)
    } else {
        (far, seen)
    }
}

/// The estimators of Stale View Cleaning, Section 5, for Bernoulli sampling of ratio `m` (a
/// hash sample keeps each key independently with probability `m`), with the rows of the
/// outlier index taken whole (Section 6.3: weight 1, no variance): Horvitz-Thompson sums
/// `sum(w * y)` with variance `sum(v * y^2)`; AVG as the ratio of the sums, its variance by
/// linearization; SVC+CORR the same over the key-matched differences of the clean and the
/// stale sample (a key missing from one counts 0 there). Quantiles (MEDIAN, PERCENTILE_CONT,
/// APPROX_PERCENTILE_CONT) by the bootstrap: the clean sample's weighted quantile with the
/// percentile interval of the quantiles of resamples; under SVC+CORR the stale quantile plus
/// the change of the samples' quantiles, resampled by key so that the clean and the stale
/// value of a key stay together (Section 5.2). MIN and MAX as the Appendix (12.1) says: the
/// clean sample's extreme, or under SVC+CORR the stale extreme moved by the largest change of
/// a key, within the bounds of [`extreme_bounds`].
pub(crate) struct Estimator<'a> {
    pub kinds: &'a [Kind],
    pub confidence: f64,
    /// Whether the sample holds every row of the view (ratio 1).
    pub whole: bool,
    pub clean: &'a SampleRows,
    pub stale: &'a SampleRows,
}

impl Estimator<'_> {
    fn sums(&self, rows: &SampleRows) -> HashMap<OwnedRow, Sums> {
        let mut sums: HashMap<OwnedRow, Sums> = HashMap::new();
        for i in 0..rows.keys.len() {
            let s = sums.entry(rows.groups[i].clone()).or_insert_with(|| Sums::new(self.kinds.len()));
            let (w, v, sampled) = (rows.w[i], rows.v[i], !rows.whole[i]);
            s.rows += 1;
            for j in 0..self.kinds.len() {
                let (y, c) = (rows.y[j][i], rows.c[j][i]);
                s.y[j] += w * y;
                s.y2[j] += v * y * y;
                s.c[j] += w * c;
                s.vy[j] += v * y;
                s.vc[j] += v * c;
                if self.kinds[j].by_values() && c > 0.0 {
                    s.values[j].push(Weighted { value: y, weight: w, sampled });
                }
            }
        }
        sums
    }

    /// SVC+AQP of group `sums` (of the clean sample).
    fn aqp(&self, sums: Option<&Sums>) -> Vec<Estimate> {
        let Some(s) = sums else { return vec![ABSENT; self.kinds.len()] };
        (0..self.kinds.len())
            .map(|j| match self.kinds[j] {
                Kind::Count => Estimate::normal(s.y[j], s.y2[j]),
                Kind::Sum if s.c[j] > 0.0 => Estimate::normal(s.y[j], s.y2[j]),
                Kind::Avg if s.c[j] > 0.0 => {
                    let r = s.y[j] / s.c[j];
                    let residual = s.y2[j] - 2.0 * r * s.vy[j] + r * r * s.vc[j];
                    Estimate::normal(r, residual.max(0.0) / (s.c[j] * s.c[j]))
                }
                Kind::Quantile(q) if !s.values[j].is_empty() => {
                    // In value order, so that the resamples do not depend on the rows' order.
                    let mut values = s.values[j].clone();
                    values.sort_by(|a, b| a.value.total_cmp(&b.value));
                    let values = &values;
                    let value = quantile(&mut values.clone(), q).unwrap_or(f64::NAN);
                    let replicates = (0..REPLICATES)
                        .filter_map(|b| {
                            let drawn = resampled(values, |v| v.sampled, VALUES_STREAM, b);
                            quantile(&mut drawn.into_iter().copied().collect::<Vec<_>>(), q)
                        })
                        .collect();
                    bootstrapped(value, replicates, self.confidence, 0.0)
                }
                Kind::Min | Kind::Max if !s.values[j].is_empty() => {
                    let max = self.kinds[j] == Kind::Max;
                    let (low, high) = extreme_bounds(&s.values[j], max, self.whole);
                    Estimate { value: Some(if max { low } else { high }), variance: None, interval: Some((low, high)) }
                }
                _ => ABSENT,
            })
            .collect()
    }

    /// SVC+AQP of every group of the clean sample and of `stale` (the groups of the stale
    /// answer).
    pub(crate) fn aqp_per_group<'g>(
        &self,
        stale: impl Iterator<Item = &'g OwnedRow>,
    ) -> HashMap<OwnedRow, Vec<Estimate>> {
        let clean_sums = self.sums(self.clean);
        let mut per_group: HashMap<OwnedRow, Vec<Estimate>> =
            clean_sums.iter().map(|(g, sums)| (g.clone(), self.aqp(Some(sums)))).collect();
        for g in stale {
            if !per_group.contains_key(g) {
                per_group.insert(g.clone(), self.aqp(None));
            }
        }
        per_group
    }

    /// SVC+CORR of every group: `stale` (the stale answer per group) corrected.
    pub(crate) fn corr(&self, stale: &HashMap<OwnedRow, Vec<Option<f64>>>) -> HashMap<OwnedRow, Vec<Estimate>> {
        let n = self.kinds.len();
        let clean_sums = self.sums(self.clean);
        let stale_sums = self.sums(self.stale);
        // The key-matched rows: (clean row, stale row).
        let mut matched: HashMap<&OwnedRow, (Option<usize>, Option<usize>)> = HashMap::new();
        for (i, k) in self.clean.keys.iter().enumerate() {
            matched.entry(k).or_default().0 = Some(i);
        }
        for (i, k) in self.stale.keys.iter().enumerate() {
            matched.entry(k).or_default().1 = Some(i);
        }
        // Per group and aggregate: the weighted sum of differences and the sum of their
        // squares' variances; for AVG the differences are of the linearized ratios.
        let mut diff: HashMap<OwnedRow, (Vec<f64>, Vec<f64>)> = HashMap::new();
        // Per group and quantile, MIN or MAX: each key's clean and stale value that count
        // there.
        let mut pairs: HashMap<(OwnedRow, usize), Vec<Pair>> = HashMap::new();
        let ratio = |sums: &HashMap<OwnedRow, Sums>, g: &OwnedRow, j: usize| {
            sums.get(g).filter(|s| s.c[j] > 0.0).map(|s| (s.y[j] / s.c[j], s.c[j]))
        };
        let term = |rows: &SampleRows, sums: &HashMap<OwnedRow, Sums>, i: usize, j: usize| match self.kinds[j] {
            Kind::Avg => ratio(sums, &rows.groups[i], j).map_or(0.0, |(r, c)| (rows.y[j][i] - r * rows.c[j][i]) / c),
            _ => rows.y[j][i],
        };
        for (clean, stale_row) in matched.values() {
            // A key's weight is the same in both samples: whether it is an outlier is a
            // property of its key.
            let (w, v, sampled) = match (clean, stale_row) {
                (Some(i), _) => (self.clean.w[*i], self.clean.v[*i], !self.clean.whole[*i]),
                (None, Some(s)) => (self.stale.w[*s], self.stale.v[*s], !self.stale.whole[*s]),
                (None, None) => continue,
            };
            let mut add = |g: &OwnedRow, d: Vec<f64>| {
                if !diff.contains_key(g) {
                    diff.insert(g.clone(), (vec![0.0; n], vec![0.0; n]));
                }
                let entry = diff.get_mut(g).expect("inserted");
                for (j, d) in d.into_iter().enumerate() {
                    entry.0[j] += w * d;
                    entry.1[j] += v * d * d;
                }
            };
            for j in (0..n).filter(|&j| self.kinds[j].by_values()) {
                let value = |rows: &SampleRows, i: &Option<usize>| {
                    i.filter(|&i| rows.c[j][i] > 0.0).map(|i| (rows.groups[i].clone(), rows.y[j][i]))
                };
                let pair = |clean, stale| Pair { clean, stale, weight: w, sampled };
                match (value(self.clean, clean), value(self.stale, stale_row)) {
                    (Some((g, a)), Some((h, b))) if g == h => {
                        pairs.entry((g, j)).or_default().push(pair(Some(a), Some(b)))
                    }
                    (a, b) => {
                        if let Some((g, a)) = a {
                            pairs.entry((g, j)).or_default().push(pair(Some(a), None));
                        }
                        if let Some((h, b)) = b {
                            pairs.entry((h, j)).or_default().push(pair(None, Some(b)));
                        }
                    }
                }
            }
            let after = clean.map(|i| (0..n).map(|j| term(self.clean, &clean_sums, i, j)).collect::<Vec<_>>());
            let before = stale_row.map(|i| (0..n).map(|j| term(self.stale, &stale_sums, i, j)).collect::<Vec<_>>());
            match (clean, stale_row, after, before) {
                (Some(i), Some(s), Some(a), Some(b)) if self.clean.groups[*i] == self.stale.groups[*s] => {
                    add(&self.clean.groups[*i], a.iter().zip(&b).map(|(a, b)| a - b).collect())
                }
                (clean, stale_row, a, b) => {
                    if let (Some(i), Some(a)) = (clean, a) {
                        add(&self.clean.groups[*i], a);
                    }
                    if let (Some(s), Some(b)) = (stale_row, b) {
                        add(&self.stale.groups[*s], b.into_iter().map(|b| -b).collect());
                    }
                }
            }
        }
        let mut groups: Vec<&OwnedRow> = stale.keys().chain(clean_sums.keys()).collect();
        groups.sort();
        groups.dedup();
        groups
            .into_iter()
            .map(|g| {
                let evidence = clean_sums.get(g).map_or(0, |s| s.rows) + stale_sums.get(g).map_or(0, |s| s.rows);
                let answer = stale.get(g);
                let aqp = self.aqp(clean_sums.get(g));
                let estimates = (0..n)
                    .map(|j| {
                        let before = answer.and_then(|a| a[j]);
                        let (sum, variance) = diff.get(g).map_or((0.0, 0.0), |(s, q)| (s[j], q[j]));
                        let pairs = pairs.get(&(g.clone(), j));
                        match self.kinds[j] {
                            _ if evidence == 0 => Estimate { value: before, variance: None, interval: None },
                            Kind::Count | Kind::Sum => Estimate::normal(before.unwrap_or(0.0) + sum, variance),
                            Kind::Quantile(q) => match (before, pairs) {
                                (Some(before), Some(pairs)) => {
                                    self.quantile_correction(before, pairs, q).unwrap_or(aqp[j])
                                }
                                _ => aqp[j],
                            },
                            Kind::Min | Kind::Max => match (before, pairs) {
                                (Some(before), Some(pairs)) => extreme_correction(before, pairs, aqp[j], self.kinds[j]),
                                _ => aqp[j],
                            },
                            Kind::Avg => match (before, ratio(&clean_sums, g, j), ratio(&stale_sums, g, j)) {
                                (Some(before), Some((after, _)), Some((was, _))) => {
                                    Estimate::normal(before + after - was, variance)
                                }
                                // A group new to the sample, or gone from it: no stale ratio
                                // to correct.
                                _ => aqp[j],
                            },
                        }
                    })
                    .collect();
                (g.clone(), estimates)
            })
            .collect()
    }

    /// SVC+CORR of a quantile `q`: the stale quantile `before` plus the change of the
    /// quantiles of the keys' clean and stale values `pairs`, resampled by key; `None` if
    /// either side has none.
    fn quantile_correction(&self, before: f64, pairs: &[Pair], q: f64) -> Option<Estimate> {
        let change = |pairs: &mut dyn Iterator<Item = &Pair>| {
            let (mut after, mut was) = (Vec::new(), Vec::new());
            for p in pairs {
                let weighted = |value| Weighted { value, weight: p.weight, sampled: p.sampled };
                after.extend(p.clean.map(weighted));
                was.extend(p.stale.map(weighted));
            }
            Some(quantile(&mut after, q)? - quantile(&mut was, q)?)
        };
        let value = change(&mut pairs.iter())?;
        // In value order, so that the resamples do not depend on the rows' order.
        let mut pairs = pairs.to_vec();
        let order = |p: &Pair| (p.clean.unwrap_or(f64::NAN), p.stale.unwrap_or(f64::NAN));
        pairs.sort_by(|a, b| order(a).0.total_cmp(&order(b).0).then(order(a).1.total_cmp(&order(b).1)));
        let replicates = (0..REPLICATES)
            .filter_map(|b| change(&mut resampled(&pairs, |p| p.sampled, PAIRS_STREAM, b).into_iter()))
            .collect();
        Some(bootstrapped(before + value, replicates, self.confidence, before))
    }
}

/// SVC+CORR of MIN or MAX (`kind`): the stale extreme `before` moved by the largest change
/// (for MIN the smallest) of a key's value over the key-matched `pairs`, kept within the
/// bounds of the clean sample's `aqp` estimate: never short of the extreme the clean sample
/// holds.
fn extreme_correction(before: f64, pairs: &[Pair], aqp: Estimate, kind: Kind) -> Estimate {
    let changes = pairs.iter().filter_map(|p| Some(p.clean? - p.stale?));
    let change = if kind == Kind::Max {
        changes.fold(None, |a: Option<f64>, d| Some(a.map_or(d, |a| a.max(d))))
    } else {
        changes.fold(None, |a: Option<f64>, d| Some(a.map_or(d, |a| a.min(d))))
    };
    let (Some(change), Some(seen)) = (change, aqp.value) else { return aqp };
    let mut value = if kind == Kind::Max { (before + change).max(seen) } else { (before + change).min(seen) };
    if let Some((low, high)) = aqp.interval {
        value = value.clamp(low, high);
    }
    Estimate { value: Some(value), ..aqp }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_quantiles_match_the_tables() {
        // Values from the standard normal table (and R's qnorm).
        for (p, z) in [
            (0.975, 1.959963984540054),
            (0.995, 2.5758293035489004),
            (0.5, 0.0),
            (0.8413447460685429, 1.0),
            (0.001, -3.090232306167813),
            (1e-10, -6.361340902404056),
        ] {
            assert!((normal_quantile(p) - z).abs() < 1e-9, "p = {p}: {} against {z}", normal_quantile(p));
        }
    }
}
