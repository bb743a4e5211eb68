//! Plain data that says how a cell is confined, shared by every part that
//! reads or writes it: the profiles, the supervisor's limits, the wire
//! formats and the sandbox layers. It imports nothing from the rest of the
//! crate, so any module may use it without an arrow pointing back up.
//!
//! - [`Rlimits`]: a cell's OS resource limits, the one declaration of their
//!   names, and the one table that pairs each name with its `RLIMIT_*`.
//! - [`syscalls`]: the syscall name ↔ number tables of each architecture
//!   (what a profile's seccomp groups name).

mod rlimits;
pub mod syscalls;

pub use rlimits::{Rlimit, Rlimits};
