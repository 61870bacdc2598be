//! Plan rewrites chosen by cost. Each rule is one file; the cost model they share is
//! [`crate::window::cost`].

pub mod share_windows;
