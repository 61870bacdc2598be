//! tessera: a streaming SQL engine. Scripts declare sources and continuous queries; the engine
//! streams events through push-based operators over Arrow batches in event time.
//!
//! ```no_run
//! use tessera::{connectors::sink::MemorySink, engine::{run_script, RunOptions, Script}};
//! let script = Script::from_file("examples/iot/multi_window.sql".as_ref())?;
//! let mut sink = MemorySink::default();
//! let stats = run_script(&script, &RunOptions::default(), &mut sink)?;
//! println!("{} events, {} rows", stats.events_in, stats.rows_out);
//! # Ok::<(), tessera::TesseraError>(())
//! ```

pub mod aggregate;
pub mod catalog;
pub mod compile;
pub mod connectors;
pub mod engine;
pub mod error;
pub mod exec;
pub mod explain;
pub mod optimizer;
pub mod physical;
pub mod plan;
pub mod settings;
pub mod sql;
pub mod state;
pub mod synopsis;
pub mod window;

pub use error::{Result, TesseraError};
