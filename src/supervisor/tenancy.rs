//! A session's share of the host: the cgroups that bound its processes and
//! memory apart from other sessions' and that hold each of its cells until
//! the cell's whole process tree is gone (see
//! `crate::sandbox::linux::groups`).
// Outside Linux there are no cgroups: most of this is unused there.
#![cfg_attr(not(target_os = "linux"), allow(dead_code, unused_imports))]

use super::Inner;
use std::sync::{Arc, OnceLock};

#[cfg(target_os = "linux")]
use crate::sandbox::linux::groups::SessionGroup;
#[cfg(target_os = "linux")]
pub(crate) use crate::sandbox::linux::groups::{CellGroup, TreeUsage};

/// Why a cgroup could not be made, joined or emptied.
#[cfg(target_os = "linux")]
pub(crate) use crate::sandbox::linux::cgroup::CgroupError as GroupError;
/// Elsewhere there are no cgroups, so no such errors.
#[cfg(not(target_os = "linux"))]
pub(crate) type GroupError = std::convert::Infallible;

/// Elsewhere there are no cell groups: a stand-in that is never made.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub(crate) enum CellGroup {}

#[cfg(not(target_os = "linux"))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TreeUsage {
    pub cpu_ms: Option<u64>,
}

#[cfg(not(target_os = "linux"))]
impl CellGroup {
    pub(crate) fn join_fds(&self) -> Vec<std::os::fd::RawFd> {
        match *self {}
    }
    pub(crate) fn join_borrowed(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        match *self {}
    }
    pub(crate) fn end(&self, _within: std::time::Duration) -> Result<(), GroupError> {
        match *self {}
    }
    pub(crate) fn is_empty(&self) -> bool {
        match *self {}
    }
    pub(crate) fn stop(&self) -> Result<usize, GroupError> {
        match *self {}
    }
    pub(crate) fn cpu_ns(&self) -> Option<u64> {
        match *self {}
    }
    pub(crate) fn usage(&self) -> TreeUsage {
        match *self {}
    }
    pub(crate) fn set_max_processes(&self, _n: u64) -> Result<(), GroupError> {
        match *self {}
    }
}

/// Made at the session's first cell, shared by its cells and sub-cells.
#[derive(Debug)]
pub(crate) struct Share {
    #[cfg(target_os = "linux")]
    group: OnceLock<Option<Arc<SessionGroup>>>,
    #[cfg(not(target_os = "linux"))]
    group: OnceLock<()>,
    /// The session's model queries, sub-agents, tool calls, tokens, cost,
    /// against its policy's budgets.
    pub(crate) models: Arc<super::ledger::Ledger>,
}

impl Share {
    /// The share of a session whose policy is `policy`.
    pub(crate) fn new(policy: &super::Policy) -> Share {
        Share {
            group: OnceLock::new(),
            models: Arc::new(super::ledger::Ledger::new(
                super::ledger::Owner::Session,
                super::ledger::Caps::of_policy(policy),
                None,
            )),
        }
    }
}

/// How much a session may hold together, from the limits it asked for
/// (before a profile's ceiling narrowed them for one cell): its cells'
/// memory limit plus the scratch its files may take (its tmpfs pages are
/// charged to the session that wrote them, idle or not), and twice a
/// cell's processes (a cell and the sub-cell it waits for).
pub(crate) fn session_bounds(sup: &Inner, asked: &super::Limits) -> (u64, u64) {
    (
        asked
            .rlimits
            .memory_bytes
            .saturating_add(sup.session_scratch_bytes()),
        cell_processes(asked).saturating_add(1).saturating_mul(2),
    )
}

/// The processes a warm cell's pids cgroup allows: its limit (threads
/// count, as for RLIMIT_NPROC). A cold worker's is bounded by RLIMIT_NPROC
/// in its own user namespace instead (see `cell::launch::start_direct`).
pub(crate) fn cell_processes(limits: &super::Limits) -> u64 {
    limits.rlimits.max_processes
}

impl Share {
    /// The session's group, made now with bounds from `asked` if this is
    /// its first cell; `None` where the supervisor has no groups.
    #[cfg(target_os = "linux")]
    pub(crate) fn session(&self, sup: &Inner, asked: &super::Limits) -> Option<Arc<SessionGroup>> {
        self.group
            .get_or_init(|| {
                let groups = sup.groups.as_ref()?;
                let (memory, processes) = session_bounds(sup, asked);
                match groups.session(memory, processes) {
                    Ok(g) => Some(Arc::new(g)),
                    Err(e) => {
                        tracing::warn!("a session runs without its own cgroup: {e}");
                        None
                    }
                }
            })
            .clone()
    }

    /// The session's group if it was made (by an earlier cell).
    #[cfg(target_os = "linux")]
    pub(crate) fn made(&self) -> Option<Arc<SessionGroup>> {
        self.group.get()?.clone()
    }

    /// Bytes of memory the session's group holds now (none before its
    /// first cell, or without groups).
    #[cfg(target_os = "linux")]
    pub(crate) fn memory_bytes(&self) -> Option<u64> {
        self.group.get()?.as_ref()?.memory_bytes()
    }

    /// A group for one cell of the session (its processes bounded by
    /// `limits`); `None` where there are no groups.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn cell(
        &self,
        _sup: &Inner,
        _limits: &super::Limits,
        _asked: &super::Limits,
    ) -> Result<Option<CellGroup>, GroupError> {
        Ok(None)
    }

    /// A group for one cell of the session (its processes bounded by
    /// `limits`); `None` where there are no groups.
    #[cfg(target_os = "linux")]
    pub(crate) fn cell(
        &self,
        sup: &Inner,
        limits: &super::Limits,
        asked: &super::Limits,
    ) -> Result<Option<CellGroup>, GroupError> {
        match self.session(sup, asked) {
            Some(s) => s.cell(cell_processes(limits)).map(Some),
            None => Ok(None),
        }
    }
}

/// A cell whose first process was killed (SIGKILL) while the OOM killer
/// was killing processes of its group went past its session's memory
/// bound (`session_bytes`): it ended `limit_exceeded`, and says so, not
/// `killed` by an unknown hand.
#[cfg(target_os = "linux")]
pub(crate) fn explain_kill(
    group: Option<&Arc<CellGroup>>,
    session_bytes: u64,
    result: &mut super::CellResult,
) {
    let Some(g) = group else { return };
    if result.status != super::Status::Killed || result.exit.signal != Some(libc::SIGKILL) {
        return;
    }
    if g.usage().oom_kills.unwrap_or(0) == 0 {
        return;
    }
    result.fail_with(
        super::ErrorKind::LimitExceeded,
        format!(
            "memory limit of the session ({} MiB, its files included) exceeded: the kernel \
             ended the cell's largest process",
            session_bytes >> 20
        ),
    );
}
