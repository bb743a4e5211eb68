//! Every syscall-level layer of the worker sandbox. This module tree is the
//! only place in cellbox where `unsafe` is allowed.
//!
//! The shape follows "build the policy, then apply it": [`SandboxPlan`] is
//! plain data the supervisor builds from a profile and sends to the worker in
//! the `setup` frame; [`enter`] applies it inside the worker, in order, and
//! returns a [`SandboxReport`] of what was actually enforced. A one-shot CLI
//! run (`cellbox exec`) skips the worker: [`oneshot::spawn`] clones the cell
//! from the still single-threaded CLI, and the cell applies the same layers
//! with the same code.
//!
//! The translation steps (plan → mount list, Landlock rules, rlimit table,
//! seccomp program) are pure functions in `linux/` and are unit-tested
//! without privileges; the `apply_*` functions next to them do the side
//! effects. Tests that change process state run in a forked child
//! (`testing::in_child`), never in the test harness itself.
//!
//! # The environment of a cell
//! [`enter`] clears the environment and sets exactly:
//! `PATH=/usr/local/bin:/usr/bin:/bin`, `HOME=<scratch>`, `LANG=C.UTF-8`,
//! `LC_ALL=C.UTF-8`, and `TMPDIR=/tmp` when the profile gives a private
//! `/tmp` (otherwise `TMPDIR=<scratch>`). Nothing else survives, including
//! whatever the supervisor passed.

/// The plan and the report are wire data (they travel in the `setup` and
/// `ready` frames): defined in [`crate::protocol`], named here for the layers.
pub use crate::protocol::sandbox::{
    Layer, LayerReport, SandboxFailure, SandboxPlan, SandboxReport, PROTOCOL_FD,
};
pub use jail::Entry;

#[cfg(target_os = "linux")]
pub mod beneath;
pub mod compat;
pub mod doctor;
pub mod forkserver;
pub mod jail;
pub mod memory;
#[cfg(target_os = "linux")]
pub mod oneshot;
pub mod packet;
pub mod process;
pub mod seatbelt;
pub mod spawn;
/// The syscall tables live with the plan's data; here for the layers.
pub use crate::plan::syscalls;
#[cfg(unix)]
pub mod tree;
#[cfg(target_os = "linux")]
pub mod zygote;

#[cfg(target_os = "linux")]
pub mod linux;

#[cfg(test)]
#[cfg(target_os = "linux")]
pub(crate) mod testing;

impl From<&LayerError> for SandboxFailure {
    fn from(e: &LayerError) -> SandboxFailure {
        SandboxFailure {
            layer: e.layer.as_str().to_owned(),
            message: e.message(),
        }
    }
}

/// Why a layer could not be applied: the leaf error (a system call's, a
/// compiler's) or a message.
pub type LayerCause = Box<dyn std::error::Error + Send + Sync>;

/// A layer that could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("failed to apply the {layer} layer: {cause}")]
pub struct LayerError {
    pub layer: Layer,
    #[source]
    pub cause: LayerCause,
}

/// The error of entering the sandbox: the layer that failed and why.
pub type SandboxError = LayerError;

impl LayerError {
    /// `layer` failed with `cause`: a leaf error, or a message (`&str`,
    /// `String`).
    pub(crate) fn new(layer: Layer, cause: impl Into<LayerCause>) -> LayerError {
        LayerError {
            layer,
            cause: cause.into(),
        }
    }

    /// What went wrong, without the layer's name.
    pub fn message(&self) -> String {
        self.cause.to_string()
    }
}

/// Apply the plan to the calling process as `entry` ([`Entry::Worker`],
/// [`Entry::Zygote`] or [`Entry::ForkServer`]), in the order of docs/architecture.md §3:
/// hygiene → namespaces → rlimits → privileges → Landlock → seccomp, each
/// layer as the table in [`jail`] says for `entry` (the fork server leaves
/// rlimits and seccomp to the cells it forks).
///
/// Call once, single-threaded, before any untrusted code runs. With a PID
/// namespace this forks: it returns only in the process that runs the cell
/// (PID 1 of the new namespace); the original process waits for it and exits
/// the same way, never returning.
#[cfg(target_os = "linux")]
pub fn enter(plan: &SandboxPlan, entry: Entry) -> Result<SandboxReport, SandboxError> {
    linux::enter(plan, entry)
}

/// Apply the plan as `entry` in a pool process the supervisor started in
/// the namespaces `names` ([`spawn::start_pool_process`]): as [`enter`],
/// without the clone. `control` is the channel to the supervisor.
#[cfg(target_os = "linux")]
pub fn enter_cloned(
    plan: &SandboxPlan,
    entry: Entry,
    names: &[String],
    control: std::os::fd::BorrowedFd<'_>,
) -> Result<SandboxReport, SandboxError> {
    linux::enter_cloned(plan, entry, names, control)
}

/// The per-cell layers in a child forked from a pool process: its rlimits, a
/// nested Landlock domain with no file or network access, seccomp.
#[cfg(target_os = "linux")]
pub fn enter_pool_child(
    plan: &SandboxPlan,
    pool: &SandboxReport,
) -> Result<SandboxReport, SandboxError> {
    linux::enter_pool_child(plan, pool)
}

/// Prepare, in a pool process, what each of its children applies (see
/// [`enter_pool_child`]).
#[cfg(target_os = "linux")]
pub fn prepare_pool_children(plan: &SandboxPlan) -> Result<(), SandboxError> {
    linux::prepare_pool_children(plan)
}

#[cfg(not(target_os = "linux"))]
pub fn prepare_pool_children(_plan: &SandboxPlan) -> Result<(), SandboxError> {
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn enter_pool_child(
    _plan: &SandboxPlan,
    _pool: &SandboxReport,
) -> Result<SandboxReport, SandboxError> {
    Err(SandboxError::new(
        Layer::Hygiene,
        "the OS sandbox is only implemented for Linux",
    ))
}

/// Without Linux there is nothing here to apply the plan with.
#[cfg(not(target_os = "linux"))]
pub fn enter(_plan: &SandboxPlan, _entry: Entry) -> Result<SandboxReport, SandboxError> {
    Err(SandboxError::new(
        Layer::Hygiene,
        "the OS sandbox is only implemented for Linux",
    ))
}

/// Replace the sandboxed worker with `argv[0]` (an absolute path), keeping
/// the environment [`enter`] set plus `extra_env`. Returns only on failure.
///
/// Use this rather than a plain `execve`: under a profile with
/// `seccomp.exec = "once"` the filter accepts only the pathname buffer this
/// function fills in.
#[cfg(target_os = "linux")]
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    linux::exec::exec(argv, extra_env)
}

/// Elsewhere the only sandboxed worker is one `sandbox-exec` started.
#[cfg(not(target_os = "linux"))]
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    seatbelt::exec(argv, extra_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_error_renders_as_before_and_keeps_its_source() {
        let e = LayerError::new(Layer::Landlock, "not supported by this kernel");
        assert_eq!(
            e.to_string(),
            "failed to apply the landlock layer: not supported by this kernel"
        );
        assert_eq!(e.message(), "not supported by this kernel");

        let leaf = std::io::Error::from_raw_os_error(libc::EPERM);
        let shown = leaf.to_string();
        let e = LayerError::new(Layer::Namespaces, leaf);
        assert_eq!(
            e.to_string(),
            format!("failed to apply the namespaces layer: {shown}")
        );
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }
}
