//! Continuous temporal queries under SQL duplicate semantics, answered from synopses whose
//! size grows only logarithmically with the stream (Toman, "holistic synopses";
//! ../papers/bounded-synopses-duplicate-semantics.txt).
//!
//! ```text
//!  SQL self-join ──conjunctive──▶ union of linear orders ──▶ temporal formula ─┐
//!  (Lemma 4.8, 4.9)                                                            ├─▶ formula::Program
//!  temporal formula ───────────────────────────────────────────────────────────┘   (nodes, counters,
//!                                                                                   space class)
//!  events of each instant ──▶ evaluator::Synopsis::apply (delta, Lemma 4.3) ──▶ answer at any instant
//! ```
//!
//! - [`formula`]: the formula language, its duplicate semantics, and what the compiler refuses.
//! - [`conjunctive`]: conjunctive queries with order conditions on event time, rewritten into
//!   unions of linear orders and then into formulas.
//! - [`form`]: how a count continues through instants without events (so they are skipped).
//! - [`evaluator`]: the synopsis state and its update.
//! - [`chain`]: funnels (every level binds the partition variables) as fixed counter arrays.

pub mod chain;
pub mod conjunctive;
pub mod evaluator;
pub mod form;
pub mod formula;

pub use chain::{ChainSynopsis, Chains, PartitionIds};
pub use evaluator::{Key, Synopsis, Value};
pub use form::Count;
pub use formula::{Atom, Formula, Program, SinceCount, SpaceClass, TemporalQuery, Var};
