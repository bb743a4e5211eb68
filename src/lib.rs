//! cellbox: run untrusted code in a sandboxed worker process, one cell at a
//! time, reaching the outside only through capabilities the supervisor checks.
//!
//! The library's front door is the [`Supervisor`] (built with
//! [`Supervisor::builder`]): it runs a [`CellRequest`] alone or in a
//! [`Session`] that keeps a namespace between cells, under a [`Policy`] (the
//! capabilities a cell may call, see [`Capability`]) and [`Limits`], and
//! gives back a [`CellResult`] whose [`Status`] says how the cell ended.
//! [`serve`] is the MCP server, [`profiles`] the sandbox profiles, and
//! [`sandbox`] the layers a worker enters.

// The supervisor, its sessions and a cell's request.
pub use supervisor::{
    CellRequest, Error, Forward, HistoryEntry, Language, OutputChunk, OutputStream, PythonState,
    Session, SessionConfig, Supervisor, SupervisorBuilder, WeakSupervisor,
};
// Whom a session or call is for, and the bytes the supervisor holds for it.
pub use supervisor::{
    HeldError, Tenant, DEFAULT_MAX_HELD_BYTES, DEFAULT_MAX_HELD_BYTES_PER_TENANT,
};
// What a cell gives back.
pub use supervisor::{
    CallRecord, CallsTruncation, CellResult, ErrorKind, ExitInfo, RunInfo, StateOutcome, Status,
    Truncated, Truncation, Usage, VarsReport, MAX_CALL_RECORDS, MAX_CALL_RECORD_BYTES,
};
// Limits, capabilities and the policy that allows them, budgets.
pub use supervisor::{Account, Caps, Chain, Ledger, Owner};
pub use supervisor::{
    ArgsError, Budget, BudgetError, CallContext, CallError, Capability, CapabilityError,
    LimitOverrides, Limits, Metered, ModelUsage, ModelUsageReport, Policy, Registry,
    MAX_EMITS_PER_CELL, MAX_EMITS_PER_SESSION, MAX_EMIT_BYTES_PER_CELL, MAX_EMIT_BYTES_PER_SESSION,
};
// The host resources a supervisor holds: events, Python, scratch, memory,
// warm pools.
pub use supervisor::{
    EventSink, PythonError, PythonInfo, ScratchQuota, DEFAULT_CELLS_MEMORY_BYTES,
    DEFAULT_EVENTS_MAX_BYTES, DEFAULT_SCRATCH_BYTES, DEFAULT_SESSION_SCRATCH,
};
#[cfg(target_os = "linux")]
pub use supervisor::{PoolCeiling, PoolConfig};
pub use supervisor::{PoolStatus, ZygoteStatus};

pub mod context;
/// The exit codes of every cellbox process (docs/architecture.md §9).
pub mod exit;
#[cfg(target_os = "linux")]
pub mod files;
/// The macOS backend: profile → SBPL, and the sandbox-exec launcher.
pub mod macos;
pub mod metrics;
pub mod models;
pub mod plan;
pub mod profiles;
pub mod protocol;
#[allow(unsafe_code)]
pub mod sandbox;
pub mod secrets;
pub mod serve;
pub mod supervisor;
pub mod terminal;
#[cfg(target_os = "linux")]
pub mod tools;
pub(crate) mod util;
pub mod worker;

// The command line and the tools behind its commands: for the binaries,
// the tests and `fuzz/`, not part of the library's API.
#[doc(hidden)]
pub mod agent;
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod doctor;
/// Fuzz-target bodies (`fuzz/`, `tests/suite/fuzz_corpus.rs`).
#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod render;
#[doc(hidden)]
pub mod repl;
#[doc(hidden)]
pub mod run;
#[doc(hidden)]
pub mod security;
#[doc(hidden)]
pub mod soak;
#[doc(hidden)]
pub mod trajectory;

// The README's Rust example is a whole program: compiled and run with the
// doc-tests (`cargo test --profile test-release`), so it stays true as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
