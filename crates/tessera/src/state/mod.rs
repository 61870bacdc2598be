//! The runtime's durable state: the binary encoding of operator state ([`codec`]), the LSM
//! store that holds the operators' state tables beyond memory and at checkpoints ([`store`]),
//! and checkpoints ([`checkpoint`]): consistent cuts of every operator's progress, the source
//! position, the watermark and the output position, written atomically to a state directory
//! so a run resumes where the last checkpoint left it, with exactly-once file output; and how
//! much memory state takes ([`memory`]).

pub mod checkpoint;
pub mod codec;
pub mod memory;
pub mod store;
