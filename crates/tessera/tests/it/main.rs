//! tessera's integration tests: one binary, one module per area.

mod errors;
mod explained;
mod fuzz;
mod harness;
mod properties;
mod recovery;
mod reference;
mod store_costs;
mod synopsis;
mod temporal_reference;
