//! Emitters that compile a script's optimized plan to the SQL of a distributed engine, for
//! users who outgrow one machine.

pub mod flink;
