//! The runtime's durable state: the binary encoding of operator state ([`codec`]) and
//! checkpoints ([`checkpoint`]): consistent snapshots of every operator, the source position,
//! the watermark and the output position, written atomically to a state directory so a run
//! resumes where the last checkpoint left it, with exactly-once file output.

pub mod checkpoint;
pub mod codec;
pub mod store;
