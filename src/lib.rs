//! cellbox: run untrusted code in a sandboxed worker process, one cell at a
//! time, reaching the outside only through capabilities the supervisor checks.
//!

pub mod bench;
pub mod cli;
pub mod exit;
/// Fuzz-target bodies (`fuzz/`, `tests/suite/fuzz_corpus.rs`).
#[doc(hidden)]
pub mod fuzzing;
pub mod profiles;
pub mod protocol;
#[allow(unsafe_code)]
pub mod sandbox;
pub mod security;
pub mod serve;
pub mod soak;
pub mod supervisor;
pub mod worker;

pub use supervisor::*;

// The README's Rust example is a whole program: compiled and run with the
// doc-tests (`cargo test --release`), so it stays true as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
