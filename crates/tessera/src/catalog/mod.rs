//! Sources declared by `CREATE SOURCE`: their schema, event-time column, watermark and
//! connector options. Later: tables, views and sinks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow::datatypes::{DataType, SchemaRef, TimeUnit as ArrowTimeUnit};

use crate::error::{Result, TesseraError};

/// The SQL name of a column type, as a script declares it.
pub fn sql_type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::UInt8 => "TINYINT UNSIGNED".into(),
        DataType::UInt16 => "SMALLINT UNSIGNED".into(),
        DataType::UInt32 => "INT UNSIGNED".into(),
        DataType::UInt64 => "BIGINT UNSIGNED".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Date32 | DataType::Date64 => "DATE".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Null => "NULL".into(),
        other => other.to_string(),
    }
}

/// The unit in which event time is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum TimeUnit {
    Second,
    Millisecond,
    Microsecond,
    Nanosecond,
}

impl TimeUnit {
    pub fn parse(text: &str) -> Option<TimeUnit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "s" | "sec" | "second" | "seconds" => TimeUnit::Second,
            "ms" | "millisecond" | "milliseconds" => TimeUnit::Millisecond,
            "us" | "microsecond" | "microseconds" => TimeUnit::Microsecond,
            "ns" | "nanosecond" | "nanoseconds" => TimeUnit::Nanosecond,
            _ => return None,
        })
    }

    pub fn to_arrow(self) -> ArrowTimeUnit {
        match self {
            TimeUnit::Second => ArrowTimeUnit::Second,
            TimeUnit::Millisecond => ArrowTimeUnit::Millisecond,
            TimeUnit::Microsecond => ArrowTimeUnit::Microsecond,
            TimeUnit::Nanosecond => ArrowTimeUnit::Nanosecond,
        }
    }

    pub fn from_arrow(unit: ArrowTimeUnit) -> TimeUnit {
        match unit {
            ArrowTimeUnit::Second => TimeUnit::Second,
            ArrowTimeUnit::Millisecond => TimeUnit::Millisecond,
            ArrowTimeUnit::Microsecond => TimeUnit::Microsecond,
            ArrowTimeUnit::Nanosecond => TimeUnit::Nanosecond,
        }
    }

    /// Units of this kind in one second.
    pub fn per_second(self) -> i64 {
        match self {
            TimeUnit::Second => 1,
            TimeUnit::Millisecond => 1_000,
            TimeUnit::Microsecond => 1_000_000,
            TimeUnit::Nanosecond => 1_000_000_000,
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            TimeUnit::Second => "s",
            TimeUnit::Millisecond => "ms",
            TimeUnit::Microsecond => "us",
            TimeUnit::Nanosecond => "ns",
        }
    }
}

/// File formats a file source can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    JsonLines,
    Parquet,
}

impl Format {
    pub fn parse(text: &str) -> Option<Format> {
        Some(match text.to_ascii_lowercase().as_str() {
            "csv" => Format::Csv,
            "json" | "jsonl" | "ndjson" | "json_lines" => Format::JsonLines,
            "parquet" => Format::Parquet,
            _ => return None,
        })
    }
}

/// Where a source's events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    File(PathBuf),
    Stdin,
}

/// The event-time column of a source and how to read it.
#[derive(Debug, Clone)]
pub struct EventTime {
    pub column: String,
    pub index: usize,
    pub data_type: DataType,
    pub unit: TimeUnit,
    /// Bounded out-of-orderness: the watermark trails the largest event time seen by this
    /// many units. Zero without a WATERMARK clause (events must arrive in order).
    pub watermark_delay: i64,
}

/// A source declared by `CREATE SOURCE`.
#[derive(Debug, Clone)]
pub struct SourceDef {
    pub name: String,
    pub schema: SchemaRef,
    pub event_time: EventTime,
    pub location: Location,
    pub format: Format,
    /// Every option of the WITH clause, lower-cased keys, for connectors to read.
    pub options: BTreeMap<String, String>,
}

impl SourceDef {
    /// What a reader reads of this source.
    pub fn input(&self) -> InputDef<'_> {
        InputDef {
            schema: &self.schema,
            location: &self.location,
            format: self.format,
            options: &self.options,
            event_time: Some(&self.event_time),
        }
    }
}

/// What a reader reads: the declared columns (a file's columns are matched to them by name),
/// where and in which format, the WITH options readers take (`delimiter`, `header`,
/// `time_unit`), and the event-time column, whose values must be windowable (a stream's; the
/// rows of a table have none).
#[derive(Debug, Clone, Copy)]
pub struct InputDef<'a> {
    pub schema: &'a SchemaRef,
    pub location: &'a Location,
    pub format: Format,
    pub options: &'a BTreeMap<String, String>,
    pub event_time: Option<&'a EventTime>,
}

/// The sources of one script, by lower-cased name.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    sources: BTreeMap<String, SourceDef>,
}

impl Catalog {
    pub fn add_source(&mut self, source: SourceDef) -> Result<()> {
        let key = source.name.to_ascii_lowercase();
        if self.sources.contains_key(&key) {
            return Err(TesseraError::Plan(format!("source `{}` is already defined", source.name)));
        }
        self.sources.insert(key, source);
        Ok(())
    }

    pub fn source(&self, name: &str) -> Option<&SourceDef> {
        self.sources.get(&name.to_ascii_lowercase())
    }

    pub fn source_names(&self) -> impl Iterator<Item = &str> {
        self.sources.values().map(|s| s.name.as_str())
    }
}
