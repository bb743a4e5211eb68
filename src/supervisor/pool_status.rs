//! What [`super::Supervisor::pool_status`] reports: plain data, on every
//! platform (outside Linux there are no warm workers, and it says so).

use std::path::PathBuf;

/// One zygote's state, for [`PoolStatus`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ZygoteStatus {
    pub profile: String,
    /// The supervisor's child, as the host sees it (PID 1 of the zygote's
    /// namespaces).
    pub pid: i32,
    pub cells: u64,
    pub in_flight: u64,
    pub age_ms: u64,
    /// Running and taking cells (not dead, not stalled).
    pub alive: bool,
    /// Its interpreter has started and imported the profile's `preload`
    /// modules, so a cell is forked at once. While it is still importing
    /// it is `alive` but not `serving`, and a cell sent to it waits.
    pub serving: bool,
    /// It stopped answering in time: it takes no cells and is replaced.
    pub stalled: bool,
}

/// What [`super::Supervisor::pool_status`] reports.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PoolStatus {
    pub warm: bool,
    pub rhai_fork_server: bool,
    /// The fork server's process id, when it runs.
    pub rhai_fork_server_pid: Option<u32>,
    /// Sandboxed Rhai workers waiting for a cell.
    pub rhai_spares: usize,
    pub scratch_root: Option<PathBuf>,
    /// Bytes all scratch directories may hold together (a tmpfs), when the
    /// supervisor could bound them (it must be root to mount one).
    pub scratch_quota_bytes: Option<u64>,
    /// The bounds of each session's own scratch (a tmpfs each), when the
    /// supervisor can mount them.
    pub session_scratch_quota: Option<super::ScratchQuota>,
    /// Bytes of memory all cells may hold together (a memory cgroup), when
    /// the supervisor could make one, and which kind.
    pub cells_memory_bytes: Option<u64>,
    pub cells_memory_cgroup: Option<String>,
    /// Whether each session and each cell has a cgroup of its own beneath
    /// the cells' one (memory and processes per session; a cell's whole
    /// process tree ended with it).
    pub session_cgroups: bool,
    pub pool_size: usize,
    pub max_cells: u64,
    pub max_age_ms: u64,
    pub python: Vec<ZygoteStatus>,
    /// Sessions prepared for the next [`super::Supervisor::run`], each
    /// with its waiting workers (see
    /// [`super::SupervisorBuilder::prepare_runs`]).
    pub prepared_runs: usize,
}
