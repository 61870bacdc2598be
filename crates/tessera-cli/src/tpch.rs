//! `tessera generate --tpch TABLES --scale SF --output DIR`: TPC-H tables as CSV files with a
//! header row, from the `tpchgen` crate (the same rows as the TPC's dbgen), for the tables'
//! and views' benchmarks. Each table is generated in two parts on two threads and written one
//! after the other.

use std::fmt::Display;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use tessera::TesseraError;
use tpchgen::csv::{CustomerCsv, LineItemCsv, NationCsv, OrderCsv, PartCsv, PartSuppCsv, RegionCsv, SupplierCsv};
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator, PartSuppGenerator,
    RegionGenerator, SupplierGenerator,
};

/// The TPC-H tables by name.
pub const TABLES: [&str; 8] = ["lineitem", "orders", "customer", "part", "partsupp", "supplier", "nation", "region"];

/// Writes each of `tables` at scale factor `scale` to `dir/<table>.csv`.
pub fn generate(tables: &[String], scale: f64, dir: &Path) -> Result<(), TesseraError> {
    std::fs::create_dir_all(dir).map_err(|e| TesseraError::io(format!("cannot create {}", dir.display()), e))?;
    for table in tables {
        let table = table.trim().to_ascii_lowercase();
        let path = dir.join(format!("{table}.csv"));
        let error = |e| TesseraError::io(format!("cannot write {}", path.display()), e);
        // Two parts, one a thread, each into its own buffer; the first written first.
        let parts: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (1..=2)
                .map(|part| {
                    scope.spawn({
                        let table = table.clone();
                        move || rows(&table, scale, part)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a generator thread panicked")).collect::<Result<_, _>>()
        })?;
        let mut file = std::io::BufWriter::with_capacity(8 << 20, File::create(&path).map_err(error)?);
        file.write_all(header(&table).as_bytes()).map_err(error)?;
        file.write_all(b"\n").map_err(error)?;
        for part in &parts {
            file.write_all(part).map_err(error)?;
        }
        file.flush().map_err(error)?;
        let lines = parts.iter().map(|p| p.iter().filter(|&&b| b == b'\n').count()).sum::<usize>();
        eprintln!("wrote {lines} rows of {table} (scale {scale}) to {}", path.display());
    }
    Ok(())
}

fn header(table: &str) -> &'static str {
    match table {
        "lineitem" => LineItemCsv::header(),
        "orders" => OrderCsv::header(),
        "customer" => CustomerCsv::header(),
        "part" => PartCsv::header(),
        "partsupp" => PartSuppCsv::header(),
        "supplier" => SupplierCsv::header(),
        "nation" => NationCsv::header(),
        _ => RegionCsv::header(),
    }
}

/// Part `part` of 2 of `table`'s rows, as CSV lines.
fn rows(table: &str, scale: f64, part: i32) -> Result<Vec<u8>, TesseraError> {
    let mut out = Vec::new();
    match table {
        "lineitem" => lines(&mut out, LineItemGenerator::new(scale, part, 2).iter().map(LineItemCsv::new)),
        "orders" => lines(&mut out, OrderGenerator::new(scale, part, 2).iter().map(OrderCsv::new)),
        "customer" => lines(&mut out, CustomerGenerator::new(scale, part, 2).iter().map(CustomerCsv::new)),
        "part" => lines(&mut out, PartGenerator::new(scale, part, 2).iter().map(PartCsv::new)),
        "partsupp" => lines(&mut out, PartSuppGenerator::new(scale, part, 2).iter().map(PartSuppCsv::new)),
        "supplier" => lines(&mut out, SupplierGenerator::new(scale, part, 2).iter().map(SupplierCsv::new)),
        // The two small tables are whole in the first part.
        "nation" if part == 1 => lines(&mut out, NationGenerator::default().iter().map(NationCsv::new)),
        "region" if part == 1 => lines(&mut out, RegionGenerator::default().iter().map(RegionCsv::new)),
        "nation" | "region" => {}
        other => {
            return Err(TesseraError::Option(format!(
                "TPC-H has no table `{other}`: the tables are {}",
                TABLES.join(", ")
            )))
        }
    }
    Ok(out)
}

fn lines<T: Display>(out: &mut Vec<u8>, rows: impl Iterator<Item = T>) {
    for row in rows {
        // Writing to memory cannot fail.
        let _ = writeln!(out, "{row}");
    }
}
