//! A brute-force reference evaluator for window aggregates, written from the definitions and
//! sharing no code with the engine: every event is assigned to every window that contains it
//! (`[m*slide, m*slide + range)`), unless that window closed before the event arrived (its end
//! is at or before the largest earlier event time minus the watermark delay); each group's
//! aggregates are computed from the full list of its values.

use std::collections::BTreeMap;

use super::harness::Value;

#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub key: Option<i64>,
    pub value: Option<f64>,
    pub ts: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    Min,
    Max,
    Sum,
    CountRows,
    Count,
    Avg,
    VarSamp,
    StddevSamp,
    Median,
    CountDistinct,
    /// The value of the earliest event (the first to arrive among ties), NULL or not.
    FirstValue,
    /// The value of the latest event (the last to arrive among ties).
    LastValue,
    /// `BOOL_AND(v > 0)` and `BOOL_OR(v > 0)`.
    BoolAnd,
    BoolOr,
    /// The exact `quantile_cont` at this many thousandths: what `APPROX_PERCENTILE_CONT`
    /// estimates.
    PercentileCont(u16),
}

impl Agg {
    pub const ALL: [Agg; 10] = [
        Agg::Min,
        Agg::Max,
        Agg::Sum,
        Agg::CountRows,
        Agg::Count,
        Agg::Avg,
        Agg::VarSamp,
        Agg::StddevSamp,
        Agg::Median,
        Agg::CountDistinct,
    ];

    pub fn sql(self, column: &str) -> String {
        match self {
            Agg::Min => format!("MIN({column})"),
            Agg::Max => format!("MAX({column})"),
            Agg::Sum => format!("SUM({column})"),
            Agg::CountRows => "COUNT(*)".into(),
            Agg::Count => format!("COUNT({column})"),
            Agg::Avg => format!("AVG({column})"),
            Agg::VarSamp => format!("VAR_SAMP({column})"),
            Agg::StddevSamp => format!("STDDEV_SAMP({column})"),
            Agg::Median => format!("MEDIAN({column})"),
            Agg::CountDistinct => format!("APPROX_COUNT_DISTINCT({column})"),
            Agg::FirstValue => format!("FIRST_VALUE({column})"),
            Agg::LastValue => format!("LAST_VALUE({column})"),
            Agg::BoolAnd => format!("BOOL_AND({column} > 0)"),
            Agg::BoolOr => format!("BOOL_OR({column} > 0)"),
            Agg::PercentileCont(p) => format!("APPROX_PERCENTILE_CONT({column}, {})", f64::from(p) / 1000.0),
        }
    }

    /// The aggregate of a window's events, `(event time, value)` in arrival order.
    fn compute(self, events: &[(i64, Option<f64>)]) -> Value {
        let values: Vec<Option<f64>> = events.iter().map(|e| e.1).collect();
        let present: Vec<f64> = values.iter().flatten().copied().collect();
        let n = present.len() as f64;
        let float = |v: Option<f64>| v.map_or(Value::Null, Value::Float);
        match self {
            Agg::CountRows => Value::Int(values.len() as i64),
            Agg::Count => Value::Int(present.len() as i64),
            Agg::CountDistinct => {
                let mut distinct: Vec<u64> = present.iter().map(|v| v.to_bits()).collect();
                distinct.sort_unstable();
                distinct.dedup();
                Value::Int(distinct.len() as i64)
            }
            Agg::FirstValue => {
                let first = events.iter().enumerate().min_by_key(|(i, e)| (e.0, *i));
                first.and_then(|(_, e)| e.1).map_or(Value::Null, Value::Float)
            }
            Agg::LastValue => {
                let last = events.iter().enumerate().max_by_key(|(i, e)| (e.0, *i));
                last.and_then(|(_, e)| e.1).map_or(Value::Null, Value::Float)
            }
            _ if present.is_empty() => Value::Null,
            Agg::BoolAnd => Value::Text(present.iter().all(|&v| v > 0.0).to_string()),
            Agg::BoolOr => Value::Text(present.iter().any(|&v| v > 0.0).to_string()),
            Agg::PercentileCont(p) => {
                let mut sorted = present.clone();
                sorted.sort_by(f64::total_cmp);
                let position = f64::from(p) / 1000.0 * (sorted.len() - 1) as f64;
                let (low, high) = (sorted[position.floor() as usize], sorted[position.ceil() as usize]);
                Value::Float(low + (position - position.floor()) * (high - low))
            }
            Agg::Min => float(present.iter().copied().reduce(f64::min)),
            Agg::Max => float(present.iter().copied().reduce(f64::max)),
            Agg::Sum => Value::Float(present.iter().sum()),
            Agg::Avg => Value::Float(present.iter().sum::<f64>() / n),
            Agg::VarSamp | Agg::StddevSamp => {
                if present.len() < 2 {
                    return Value::Null;
                }
                let mean = present.iter().sum::<f64>() / n;
                let var = present.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
                Value::Float(if self == Agg::VarSamp { var } else { var.sqrt() })
            }
            Agg::Median => {
                let mut sorted = present.clone();
                sorted.sort_by(f64::total_cmp);
                let mid = sorted.len() / 2;
                Value::Float(if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 })
            }
        }
    }
}

/// Result rows `(key, window_start, window_end, aggregates...)`, sorted, and the number of
/// events that missed at least one of their windows.
pub fn evaluate(events: &[Event], range: i64, slide: i64, delay: i64, aggs: &[Agg]) -> (Vec<Vec<Value>>, u64) {
    // Per (key, window start): the events' times and values, in arrival order.
    type Windows = BTreeMap<(Option<i64>, i64), Vec<(i64, Option<f64>)>>;
    let mut groups = Windows::new();
    let mut max_seen: Option<i64> = None;
    let mut late = 0;
    for event in events {
        let watermark = max_seen.map(|m| m - delay);
        let mut missed = false;
        let lowest = (event.ts - range).div_euclid(slide) - 1;
        let highest = event.ts.div_euclid(slide) + 1;
        for m in lowest..=highest {
            let (start, end) = (m * slide, m * slide + range);
            if !(start <= event.ts && event.ts < end) {
                continue;
            }
            if watermark.is_some_and(|w| end <= w) {
                missed = true;
            } else {
                groups.entry((event.key, start)).or_default().push((event.ts, event.value));
            }
        }
        late += u64::from(missed);
        max_seen = Some(max_seen.map_or(event.ts, |m| m.max(event.ts)));
    }
    let mut rows: Vec<Vec<Value>> = groups
        .into_iter()
        .map(|((key, start), values)| {
            let mut row = vec![key.map_or(Value::Null, Value::Int), Value::Int(start), Value::Int(start + range)];
            row.extend(aggs.iter().map(|a| a.compute(&values)));
            row
        })
        .collect();
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (rows, late)
}

#[test]
fn reference_follows_the_definition_on_a_hand_example() {
    // Tumbling 10, delay 2: the event at 3 arrives after 15 (watermark 13 >= end 10): late.
    let events = [
        Event { key: Some(1), value: Some(1.0), ts: 1 },
        Event { key: Some(1), value: Some(5.0), ts: 9 },
        Event { key: Some(1), value: None, ts: 15 },
        Event { key: Some(1), value: Some(7.0), ts: 3 },
    ];
    let (rows, late) = evaluate(&events, 10, 10, 2, &[Agg::Sum, Agg::CountRows]);
    assert_eq!(late, 1);
    assert_eq!(
        rows,
        vec![
            vec![Value::Int(1), Value::Int(0), Value::Int(10), Value::Float(6.0), Value::Int(2)],
            vec![Value::Int(1), Value::Int(10), Value::Int(20), Value::Null, Value::Int(1)],
        ]
    );
}
