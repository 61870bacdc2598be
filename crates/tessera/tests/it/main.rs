//! tessera's integration tests: one binary, one module per area.

mod errors;
mod harness;
mod properties;
mod reference;
mod slt;
