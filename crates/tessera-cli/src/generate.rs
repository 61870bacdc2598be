//! `tessera generate`: a reproducible synthetic IoT stream for examples and benchmarks.
//! Devices report once per `1/rate` seconds of event time each; events can be shuffled within
//! a bounded disorder, and a fraction can carry NULL temperatures.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use tessera::connectors::csv_writer::CsvWriter;
use tessera::TesseraError;

use crate::between;

/// The largest `--start` either side of 0.
const MAX_START: i64 = 1_000_000_000_000_000;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Output file: `.csv` or `.parquet` (with --tpch, a folder).
    #[arg(long, short)]
    output: PathBuf,
    /// Write these TPC-H tables instead (comma-separated: lineitem, orders, customer, part,
    /// partsupp, supplier, nation, region), each as `<table>.csv` with a header row.
    #[arg(long, value_delimiter = ',')]
    tpch: Vec<String>,
    /// The TPC-H scale factor (1: lineitem's 6 million rows), 0.001 to 1000.
    #[arg(long, default_value_t = 1.0, value_parser = between(0.001, 1000.0))]
    scale: f64,
    /// Number of events, at most 10^10.
    #[arg(long, default_value_t = 1_000_000, value_parser = between(0u64, 10_000_000_000))]
    events: u64,
    /// Number of devices, 1 to 10^9.
    #[arg(long, default_value_t = 1_000, value_parser = between(1u64, 1_000_000_000))]
    devices: u64,
    /// Event time of the first event, in seconds, within ±10^15 (event times then stay far
    /// inside the range tessera windows).
    #[arg(long, default_value_t = 1_700_000_000, value_parser = between(-MAX_START, MAX_START))]
    start: i64,
    /// Maximum out-of-orderness in seconds (0 = in order), at most 10^9.
    #[arg(long, default_value_t = 0, value_parser = between(0i64, 1_000_000_000))]
    disorder: i64,
    /// Fraction of events whose temperature is NULL, 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = between(0.0, 1.0))]
    null_fraction: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// SplitMix64: small, fast and reproducible across platforms.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn generate(args: &GenerateArgs) -> Result<(), TesseraError> {
    if !args.tpch.is_empty() {
        return crate::tpch::generate(&args.tpch, args.scale, &args.output);
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("device_id", DataType::Int64, false),
        Field::new("temperature", DataType::Float64, true),
        Field::new("ts", DataType::Int64, false),
    ]));
    let extension = args.output.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    let parquet = match extension.as_deref() {
        Some("parquet") => true,
        Some("csv") | None => false,
        Some(other) => {
            return Err(TesseraError::Option(format!(
                "{}: generate writes .csv or .parquet, not .{other}",
                args.output.display()
            )))
        }
    };
    let file = File::create(&args.output)
        .map_err(|e| TesseraError::io(format!("cannot create {}", args.output.display()), e))?;
    // Written in 8 MiB pieces, the file lands in the page cache in 2 MiB folios, which the
    // Parquet reader maps with huge pages (see `map_file`); 8 KiB writes leave it in small ones.
    let file = std::io::BufWriter::with_capacity(8 << 20, file);
    enum Writer {
        Csv(CsvWriter<std::io::BufWriter<File>>),
        Parquet(Box<ArrowWriter<std::io::BufWriter<File>>>),
    }
    let mut writer = if parquet {
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        Writer::Parquet(Box::new(
            ArrowWriter::try_new(file, schema.clone(), Some(props))
                .map_err(|e| TesseraError::Execution(e.to_string()))?,
        ))
    } else {
        Writer::Csv(CsvWriter::new(file, true))
    };
    let mut rng = SplitMix(args.seed);
    let devices = args.devices;
    let batch = 65_536u64;
    let mut produced = 0;
    while produced < args.events {
        let n = batch.min(args.events - produced);
        let mut ids = Vec::with_capacity(n as usize);
        let mut temps = Vec::with_capacity(n as usize);
        let mut times = Vec::with_capacity(n as usize);
        for i in produced..produced + n {
            let device = rng.next() % devices;
            let base = args.start + (i / devices) as i64;
            let jitter = if args.disorder > 0 { -((rng.next() % (args.disorder as u64 + 1)) as i64) } else { 0 };
            let phase = (base as f64 / 3600.0 + device as f64).sin();
            let temperature = ((20.0 + 8.0 * phase + 4.0 * rng.unit()) * 100.0).round() / 100.0;
            ids.push(device as i64);
            temps.push((rng.unit() >= args.null_fraction).then_some(temperature));
            times.push(base + jitter);
        }
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(Float64Array::from(temps)),
                Arc::new(Int64Array::from(times)),
            ],
        )?;
        match &mut writer {
            Writer::Csv(w) => w.write(&batch)?,
            Writer::Parquet(w) => w.write(&batch).map_err(|e| TesseraError::Execution(e.to_string()))?,
        }
        produced += n;
    }
    // Both flush the buffer and report a failed write (a dropped `BufWriter` would not).
    match writer {
        Writer::Parquet(w) => drop(w.close().map_err(|e| TesseraError::Execution(e.to_string()))?),
        Writer::Csv(w) => std::io::Write::flush(&mut w.into_inner()?)
            .map_err(|e| TesseraError::io(format!("cannot write {}", args.output.display()), e))?,
    }
    eprintln!("wrote {} events for {} devices to {}", args.events, devices, args.output.display());
    Ok(())
}
