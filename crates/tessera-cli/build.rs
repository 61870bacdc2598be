//! Links `tessera` as a position-dependent executable on Linux. A position-independent one
//! has the loader patch every absolute address in its data (about 155,000 relocations, 2.6 MB
//! of pages copied on write) before `main`; a run of a small script took 11.5 ms with them and
//! 6.9 ms without (docs/benchmark-log, 2026-12-01). The cost is that the executable's own code and
//! data load at a fixed address (the heap, the stack and shared libraries are still placed at
//! random).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
