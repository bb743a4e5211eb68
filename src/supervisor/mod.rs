//! The supervisor: sessions, policy, capabilities, and the cell runner.
//!
//! It owns everything that must survive a cell (namespace, policy, budgets,
//! events); a worker owns nothing and is killed and reaped after each cell.

pub mod agent;
mod capability;
mod cell;
pub(crate) use cell::Tail;
pub(crate) mod display;
mod events;
pub(crate) mod ledger;
mod limits;
#[cfg(target_os = "linux")]
mod live;
#[cfg(target_os = "linux")]
pub mod oneshot;
#[cfg(target_os = "linux")]
pub mod oneshot_rhai;
mod output;
mod policy;
mod pool_client;
mod pool_status;
mod python;
mod result;
mod scratch;
mod session;
pub(crate) mod spend;
mod tenancy;
pub mod tenant;
mod throwaway;
mod warm;
#[cfg(target_os = "linux")]
mod zygote;

pub use capability::{
    is_allow_name, is_capability_name, ArgsError, CallContext, CallError, Capability,
    CapabilityError, Registry, SourceError, SourceFuture, ToolSource,
};
pub use events::{EventSink, DEFAULT_EVENTS_MAX_BYTES};
pub use ledger::{Account, Caps, Chain, Ledger, Owner};
pub use limits::{LimitOverrides, Limits};
pub use policy::{
    Budget, BudgetError, Metered, ModelUsage, ModelUsageReport, Policy, MAX_EMITS_PER_CELL,
    MAX_EMITS_PER_SESSION, MAX_EMIT_BYTES_PER_CELL, MAX_EMIT_BYTES_PER_SESSION,
};
pub use pool_status::{PoolStatus, ZygoteStatus};
pub use python::{PythonError, PythonInfo};
pub use result::{
    CallRecord, CallsTruncation, CellResult, ErrorKind, ExitInfo, RunInfo, StateOutcome, Status,
    Truncated, Truncation, Usage, VarsReport, MAX_CALL_RECORDS, MAX_CALL_RECORD_BYTES,
};
pub use scratch::{ScratchQuota, DEFAULT_SESSION_SCRATCH};
pub use session::{HistoryEntry, PythonState, Session, SessionConfig, DEFAULT_MAX_CHECKPOINTS};
pub use tenant::{HeldError, Tenant, DEFAULT_MAX_HELD_BYTES, DEFAULT_MAX_HELD_BYTES_PER_TENANT};
#[cfg(target_os = "linux")]
pub use zygote::{PoolCeiling, PoolConfig};

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Languages a cell can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Language {
    Rhai,
    Python,
    /// `/bin/sh -c CODE` under the shell profile.
    Shell,
    /// `/bin/bash -c CODE` under the shell profile.
    Bash,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Rhai => "rhai",
            Language::Python => "python",
            Language::Shell => "shell",
            Language::Bash => "bash",
        }
    }

    /// The built-in sandbox profile for this language (bash runs under
    /// the shell profile).
    pub fn default_profile(self) -> &'static str {
        match self {
            Language::Bash => Language::Shell.as_str(),
            l => l.as_str(),
        }
    }

    /// A program run with the code as its `-c` argument (`/bin/sh`,
    /// `/bin/bash`), rather than a script an engine reads.
    pub fn is_shell(self) -> bool {
        matches!(self, Language::Shell | Language::Bash)
    }

    /// The interpreter of a shell language.
    pub fn shell_program(self) -> Option<&'static str> {
        match self {
            Language::Shell => Some("/bin/sh"),
            Language::Bash => Some("/bin/bash"),
            Language::Rhai | Language::Python => None,
        }
    }

    /// Why `code` can never run in this language, if it cannot: shell code
    /// is an argument of `/bin/sh`, a C string, so it holds no NUL byte.
    pub fn code_error(self, code: &str) -> Option<String> {
        match (self, code.find('\0')) {
            (Language::Shell | Language::Bash, Some(at)) => Some(format!(
                "{self} code cannot contain a NUL byte (found at byte {at}): \
                 the shell gets the script as a program argument, a C string"
            )),
            _ => None,
        }
    }

    /// Infer the language from a file name (`.rhai`, `.py`, `.sh`, `.bash`).
    pub fn from_path(path: &Path) -> Option<Language> {
        match path.extension()?.to_str()? {
            "rhai" => Some(Language::Rhai),
            "py" => Some(Language::Python),
            "sh" => Some(Language::Shell),
            "bash" => Some(Language::Bash),
            _ => None,
        }
    }
}

impl std::str::FromStr for Language {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "rhai" => Ok(Language::Rhai),
            "python" | "py" | "python3" => Ok(Language::Python),
            "shell" | "sh" => Ok(Language::Shell),
            "bash" => Ok(Language::Bash),
            other => Err(Error::UnknownLanguage(other.to_owned())),
        }
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the library surface (not of a cell: a cell always yields a
/// [`CellResult`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown language {0:?}: use rhai, python, shell or bash")]
    UnknownLanguage(String),
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error("failed to {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid variable name {0:?}: use letters, digits and '_', not starting with a digit")]
    BadVarName(String),
    #[error("{0}")]
    Config(String),
    /// A checkpoint could not be made or restored.
    #[error("{0}")]
    Checkpoint(String),
    /// The Python interpreter could not be found or prepared.
    #[error(transparent)]
    Python(#[from] PythonError),
    /// The supervisor would hold more for a session or tenant than its
    /// budget allows.
    #[error(transparent)]
    Held(#[from] HeldError),
}

/// Which output stream a live chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Whether a cell's stdout and stderr are also copied to this process's
/// own stdout and stderr as they arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Forward {
    /// Captured only.
    #[default]
    No,
    /// Every byte (`cellbox exec`: the program's own output).
    All,
    /// The bytes the result keeps at its head (the first half of
    /// `max_output_bytes`), as they come: `cellbox run` and the REPL, which
    /// print what the result adds (the omitted count, the tail) at the end.
    /// For a person: control characters are shown escaped (see
    /// [`crate::terminal`]), never passed to the terminal.
    Head,
}

/// A piece of a running cell's output, as it arrives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub text: String,
}

/// One cell to run.
#[derive(Debug, Clone)]
pub struct CellRequest {
    pub language: Language,
    pub code: String,
    /// Per-call limits; they can only tighten the session's.
    pub limits: LimitOverrides,
    /// Receive a live copy of stdout/stderr while the cell runs (best
    /// effort, at most `max_output_bytes` per stream; the result always
    /// holds the captured output).
    pub output: Option<tokio::sync::mpsc::Sender<OutputChunk>>,
    /// Copy stdout/stderr to this process's own as they arrive (see
    /// [`Forward`]; `Forward::Head` keeps to the result's cap).
    pub forward: Forward,
    /// Cancelling it kills the running cell: the result (status `killed`,
    /// error `Interrupted`) keeps what the cell printed until then, and a
    /// session's namespace is left as it was before the cell.
    pub cancel: Option<tokio_util::sync::CancellationToken>,
    /// The request it answers (see [`RunInfo::request_id`]).
    pub request_id: Option<String>,
}

impl CellRequest {
    pub fn new(language: Language, code: impl Into<String>) -> Self {
        CellRequest {
            language,
            code: code.into(),
            limits: LimitOverrides::default(),
            output: None,
            forward: Forward::No,
            cancel: None,
            request_id: None,
        }
    }

    pub fn timeout(mut self, t: std::time::Duration) -> Self {
        self.limits.timeout_ms = Some(t.as_millis() as u64);
        self
    }

    pub fn max_output_bytes(mut self, n: usize) -> Self {
        self.limits.max_output_bytes = Some(n);
        self
    }
}

/// What the scratch directories of one supervisor may hold together.
pub const DEFAULT_SCRATCH_BYTES: u64 = 1 << 30;

/// The memory all cells of a supervisor may hold together by default (see
/// [`SupervisorBuilder::cells_memory_bytes`]).
pub const DEFAULT_CELLS_MEMORY_BYTES: u64 = 4 << 30;

pub(crate) struct Inner {
    /// Cells running now (sub-cells too): a worker started ahead while
    /// none runs may warm up (see `cell::prepared`).
    pub(crate) cells_running: std::sync::atomic::AtomicUsize,
    pub(crate) registry: Registry,
    /// The configured models, when there are any.
    pub(crate) models: Option<Arc<crate::models::ModelClient>>,
    pub(crate) events: EventSink,
    pub(crate) worker_exe: PathBuf,
    /// Removes scratch trees that cells running as subordinate ids wrote
    /// (unprivileged, where the user has them).
    pub(crate) tree_remover: Option<crate::sandbox::tree::Remover>,
    /// Overrides every profile's `identity.subordinate_ids` when given.
    subordinate_ids: Option<crate::profiles::SubordinateIds>,
    /// Workers start under this `sandbox-exec` (see [`crate::macos`]).
    pub(crate) sandbox_exec: Option<PathBuf>,
    pub(crate) profiles: std::collections::BTreeMap<Language, String>,
    /// The languages cells may be written in (top-level cells, `exec` and
    /// sub-cells alike).
    pub(crate) languages: std::collections::BTreeSet<Language>,
    python_path: Option<PathBuf>,
    python: OnceLock<Result<PythonInfo, PythonError>>,
    shim: Arc<OnceLock<Option<python::HeldShim>>>,
    warm: bool,
    /// Whether [`Supervisor::run`] prepares the session of the next cell.
    prepare_runs: bool,
    forkserver: tokio::sync::Mutex<Option<Arc<warm::ForkServer>>>,
    profile_cache:
        std::sync::Mutex<std::collections::HashMap<String, Arc<crate::profiles::Profile>>>,
    /// The Python zygote pools (warm supervisors on Linux only).
    #[cfg(target_os = "linux")]
    pub(crate) pools: Option<zygote::Pools>,
    /// Where scratch directories are made; made on first use (after the
    /// pools, which live beneath it, so it is dropped after them).
    scratch_root: OnceLock<Option<scratch::ScratchRoot>>,
    scratch_bytes: u64,
    /// The bounds of each session's own scratch tmpfs.
    session_scratch: ScratchQuota,
    /// A cgroup per session and per cell beneath the cells' one (declared
    /// before it: dropped first), when this supervisor can make them.
    #[cfg(target_os = "linux")]
    pub(crate) groups: Option<Arc<crate::sandbox::linux::groups::Groups>>,
    /// The memory cgroup every worker process starts in, when this
    /// supervisor can make one.
    #[cfg(target_os = "linux")]
    pub(crate) cells_cgroup: Option<Arc<crate::sandbox::linux::cgroup::CellCgroup>>,
}

impl Inner {
    /// The profile (name or path) a cell of `language` runs under: the
    /// session's own when it names one, else the supervisor's for the
    /// language, else the built-in one. Every cell, sub-cells included,
    /// is resolved here.
    pub(crate) fn profile_name(&self, language: Language, session: Option<&str>) -> String {
        match session {
            Some(p) => p.to_owned(),
            // Bash runs under the shell language's profile unless given
            // one of its own.
            None => self
                .profiles
                .get(&language)
                .or_else(|| match language {
                    Language::Bash => self.profiles.get(&Language::Shell),
                    _ => None,
                })
                .cloned()
                .unwrap_or_else(|| language.default_profile().to_owned()),
        }
    }

    /// Why a cell of `language` may not run here, if it may not.
    pub(crate) fn language_refusal(&self, language: Language) -> Option<String> {
        if self.languages.contains(&language) {
            return None;
        }
        let mut allowed: Vec<&str> = self.languages.iter().map(|l| l.as_str()).collect();
        allowed.sort_unstable();
        Some(format!(
            "{language} cells are not allowed here (allowed: {})",
            if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            }
        ))
    }

    /// A sandbox profile by name or path, parsed once per supervisor (a
    /// profile file edited later takes effect with a new supervisor).
    pub(crate) fn profile(
        &self,
        name: &str,
    ) -> Result<Arc<crate::profiles::Profile>, crate::profiles::ProfileError> {
        let mut cache = crate::util::lock(&self.profile_cache);
        if let Some(p) = cache.get(name) {
            return Ok(p.clone());
        }
        let mut p = crate::profiles::Profile::load(name)?;
        if let Some(mode) = self.subordinate_ids {
            p.identity.subordinate_ids = mode;
        }
        let p = Arc::new(p);
        cache.insert(name.to_owned(), p.clone());
        Ok(p)
    }

    /// The running Rhai fork server, started (or restarted) on demand;
    /// `None` when warm workers are off or it cannot start.
    pub(crate) async fn fork_server(&self) -> Option<Arc<warm::ForkServer>> {
        if !self.warm || self.sandbox_exec.is_some() {
            return None;
        }
        let mut slot = self.forkserver.lock().await;
        if let Some(fs) = slot.as_ref() {
            if !fs.is_dead() {
                return Some(fs.clone());
            }
            tracing::warn!(
                target: warm::POOL_LOG,
                pid = fs.pid,
                "the Rhai fork server died or stalled; starting a new one"
            );
            let why = if fs.is_stalled() {
                crate::metrics::Restart::Stalled
            } else {
                crate::metrics::Restart::Dead
            };
            crate::metrics::get().pool_restart(crate::metrics::Pool::RhaiForkServer, why);
        }
        let profile = self.profile_name(Language::Rhai, None);
        match warm::ForkServer::start(&self.worker_exe, &profile, self) {
            Ok(fs) => {
                tracing::debug!(target: warm::POOL_LOG, pid = fs.pid, profile = %profile, "Rhai fork server started");
                let fs = Arc::new(fs);
                *slot = Some(fs.clone());
                Some(fs)
            }
            Err(e) => {
                tracing::warn!("warm workers unavailable, spawning per cell: {e}");
                None
            }
        }
    }

    /// The `cgroup.procs` a new worker process joins, if there is a cgroup.
    pub(crate) fn cgroup_fd(&self) -> Option<std::os::fd::RawFd> {
        #[cfg(target_os = "linux")]
        return self.cells_cgroup.as_ref().map(|c| c.procs_fd());
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The cgroup a worker of a profile whose cgroup layer is `mode` joins;
    /// an error when the layer is required and there is none.
    pub(crate) fn cgroup_for(
        &self,
        mode: crate::profiles::LayerMode,
    ) -> Result<Option<std::os::fd::RawFd>, CgroupRequired> {
        use crate::profiles::LayerMode;
        match (mode, self.cgroup_fd()) {
            (LayerMode::Off, _) => Ok(None),
            (LayerMode::Required, None) => Err(CgroupRequired),
            (_, fd) => Ok(fd),
        }
    }

    /// Where new scratch directories go: the supervisor's scratch root
    /// (which Python zygotes see too), else the system temp dir.
    pub(crate) fn scratch_parent(&self) -> PathBuf {
        match self.scratch_root() {
            Some(r) => r.path().to_path_buf(),
            None => std::env::temp_dir(),
        }
    }

    /// The bytes one session's scratch may hold (its own tmpfs where the
    /// supervisor can mount one, else the scratch root's).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the Linux-only warm paths
    pub(crate) fn session_scratch_bytes(&self) -> u64 {
        match self.session_scratch_quota() {
            Some(q) => q.bytes,
            None => self.scratch_bytes,
        }
    }

    /// The bounds of each session's own scratch tmpfs, when this
    /// supervisor may mount them (it could mount its scratch root).
    pub(crate) fn session_scratch_quota(&self) -> Option<ScratchQuota> {
        self.scratch_root()
            .and_then(|r| r.quota())
            .map(|_| self.session_scratch)
    }

    fn scratch_root(&self) -> Option<&scratch::ScratchRoot> {
        self.scratch_root
            .get_or_init(|| match scratch::ScratchRoot::new(self.scratch_bytes) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("failed to create the scratch root: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// The precompiled shim for the interpreter, when it could be made
    /// (otherwise cells run the shim from source).
    pub(crate) fn precompiled_shim(&self) -> Option<&PathBuf> {
        let info = self.python().ok()?;
        python::precompiled_once(&self.shim, info)
    }

    pub(crate) fn python(&self) -> Result<&PythonInfo, PythonError> {
        self.python
            .get_or_init(|| python::resolve(self.python_path.as_deref()))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// A profile requires the cgroup layer and this supervisor has none.
#[derive(Debug, thiserror::Error)]
#[error(
    "the cgroup layer is required, but this supervisor has no memory cgroup \
     (it needs root and a memory controller it can make children in)"
)]
pub(crate) struct CgroupRequired;

/// Builds a [`Supervisor`].
#[derive(Debug)]
pub struct SupervisorBuilder {
    registry: Registry,
    models: Option<Arc<crate::models::ModelClient>>,
    events: EventSink,
    worker_exe: Option<PathBuf>,
    sandbox_exec: Option<PathBuf>,
    python: Option<PathBuf>,
    profiles: std::collections::BTreeMap<Language, String>,
    languages: std::collections::BTreeSet<Language>,
    warm: bool,
    prepare_runs: bool,
    #[cfg(target_os = "linux")]
    pool: zygote::PoolConfig,
    scratch_bytes: u64,
    session_scratch: ScratchQuota,
    cells_memory_bytes: u64,
    session_cgroups: bool,
    subordinate_ids: Option<crate::profiles::SubordinateIds>,
}

impl SupervisorBuilder {
    /// Without root: whether every profile's cells run as a subordinate
    /// id of the user (see [`crate::profiles::SubordinateIds`]), whatever
    /// the profile's own `identity.subordinate_ids` says.
    pub fn subordinate_ids(mut self, mode: crate::profiles::SubordinateIds) -> Self {
        self.subordinate_ids = Some(mode);
        self
    }

    /// A cgroup for every session and every cell beneath the cells' memory
    /// cgroup (on by default; where the host allows: root, cgroup v1 with
    /// the memory, pids and cpuacct hierarchies): sessions are bounded
    /// apart in memory and processes, and a cell ends with its whole
    /// process tree. Off, sessions share the cells' cgroup (the escape
    /// suite turns it off to show what it stops).
    pub fn session_cgroups(mut self, on: bool) -> Self {
        self.session_cgroups = on;
        self
    }

    /// Bytes of memory all cells of this supervisor may hold together
    /// (default 4 GiB), on top of each process's own limit: a cell may
    /// start many processes, and each one's RLIMIT_AS alone does not bound
    /// their sum. Enforced with a memory cgroup when the supervisor may make
    /// one (root, cgroup v1 memory or a v2 cgroup able to hand `memory` to
    /// children); past it the kernel kills the largest process inside. The
    /// warm workers (fork server, zygotes) count too.
    pub fn cells_memory_bytes(mut self, bytes: u64) -> Self {
        self.cells_memory_bytes = bytes;
        self
    }

    /// Bytes the scratch directories of all cells may hold together outside
    /// the sessions' own tmpfs (see [`Self::session_scratch_bytes`]; what
    /// lands here is a session's scratch when its own tmpfs could not be
    /// mounted) (default 1 GiB). Enforced with a tmpfs when the supervisor
    /// runs as root on Linux; otherwise only each file's size is bounded
    /// (the cell's `max_file_size_bytes`: its session's, under its
    /// profile's `[limits]` ceiling). The tmpfs is memory: its
    /// pages count against the host's RAM, not against a cell's limit.
    pub fn scratch_bytes(mut self, bytes: u64) -> Self {
        self.scratch_bytes = bytes;
        self
    }

    /// Bytes one session's scratch may hold: its scratch directory and
    /// those of its sub-cells together (default 256 MiB). Enforced with a
    /// tmpfs of the session's own, mounted when a cell of it first needs a
    /// scratch directory, when the supervisor runs as root on Linux (see
    /// [`Supervisor::session_scratch_quota`]): a session that fills its
    /// scratch, or keeps full files while it idles, takes nothing from the
    /// others. These tmpfs are outside [`Self::scratch_bytes`]: together
    /// they may hold up to this much per open session.
    pub fn session_scratch_bytes(mut self, bytes: u64) -> Self {
        self.session_scratch.bytes = bytes;
        self
    }

    /// Files, directories and links one session's scratch may hold
    /// together (default 16384; see [`Self::session_scratch_bytes`]).
    pub fn session_scratch_inodes(mut self, inodes: u64) -> Self {
        self.session_scratch.inodes = inodes;
        self
    }

    /// Sizes and lifetimes of the Python zygote pools (used when warm).
    #[cfg(target_os = "linux")]
    pub fn python_pool(mut self, config: PoolConfig) -> Self {
        self.pool = config;
        self
    }

    /// Keep warm workers (a Rhai fork server, Python zygotes) instead of spawning a fresh
    /// process per cell. On by default; a one-shot caller that runs a single
    /// cell is faster with it off.
    pub fn warm(mut self, on: bool) -> Self {
        self.warm = on;
        self
    }

    /// Prepare the session of the next [`Supervisor::run`] ahead: once a
    /// cell run without a session of its own is over, a new session is
    /// made with that cell's configuration, its scratch and cgroups made
    /// and a worker started in the languages of the latest such cells,
    /// waiting for the next cell's code; the used one is torn down off the
    /// cell's path. The next cell with the same configuration only sends
    /// its code; one with another configuration makes its session on the
    /// spot and the prepared one is let go. A prepared session has run
    /// nothing, so no cell sees another's files, processes or groups.
    ///
    /// On by default. It holds one idle session (two for a while after
    /// cells ran at once) with its waiting workers until the supervisor is
    /// dropped or [`Supervisor::release_prepared`] is called; a caller that
    /// runs one cell and exits is better off without it.
    pub fn prepare_runs(mut self, on: bool) -> Self {
        self.prepare_runs = on;
        self
    }

    /// Register a host capability (it is still denied until a session's
    /// policy allows it by name).
    pub fn capability(mut self, cap: Capability) -> Result<Self, Error> {
        self.registry.register(cap)?;
        Ok(self)
    }

    /// Offer `model_query` and `model_query_batched` to cells, served by
    /// `client` (still denied until a session's policy allows them). A
    /// client with no models registers nothing.
    pub fn models(mut self, client: crate::models::ModelClient) -> Result<Self, Error> {
        if client.is_empty() {
            return Ok(self);
        }
        self.registry.register_models()?;
        self.models = Some(Arc::new(client));
        Ok(self)
    }

    /// Write run events as JSON lines to this sink.
    pub fn events(mut self, sink: EventSink) -> Self {
        self.events = sink;
        self
    }

    /// The cellbox binary to re-exec as the worker. Defaults to
    /// `$CELLBOX_WORKER_EXE`, else the current executable (which must then
    /// call [`crate::worker::dispatch`] first thing in `main`).
    pub fn worker_exe(mut self, path: impl Into<PathBuf>) -> Self {
        self.worker_exe = Some(path.into());
        self
    }

    /// Start every worker as `<path> -p <policy> <engine> ...`, under the
    /// SBPL policy compiled from its profile (see [`crate::macos`]): the
    /// macOS backend. On macOS it is on by default with
    /// `/usr/bin/sandbox-exec`; elsewhere it is off, and a program given here
    /// must apply the policy itself (tests point it at a stand-in that runs
    /// the worker without one). Warm workers are not used on this path.
    pub fn sandbox_exec(mut self, path: impl Into<PathBuf>) -> Self {
        self.sandbox_exec = Some(path.into());
        self
    }

    /// The Python interpreter to use instead of the one found on PATH.
    pub fn python(mut self, path: impl Into<PathBuf>) -> Self {
        self.python = Some(path.into());
        self
    }

    /// The only languages cells may be written in (default: all). It holds
    /// for every cell of every session, sub-cells started with `run_cell`
    /// included: a refused sub-cell is an error the calling script can
    /// catch, a refused top-level cell ends `policy_denied`.
    pub fn languages(mut self, languages: impl IntoIterator<Item = Language>) -> Self {
        self.languages = languages.into_iter().collect();
        self
    }

    /// Use sandbox profile `name_or_path` for cells of `language` (its
    /// `[limits]` are a ceiling that session and call limits narrow).
    pub fn profile(mut self, language: Language, name_or_path: impl Into<String>) -> Self {
        self.profiles.insert(language, name_or_path.into());
        self
    }

    pub fn build(self) -> Result<Supervisor, Error> {
        // A program started as one of our workers that did not branch off in
        // `dispatch()` would start a supervisor of its own, whose workers do
        // the same: refuse, loudly, instead of multiplying.
        if let Some(mode) = crate::worker::hidden_mode() {
            return Err(Error::Config(format!(
                "this process was started as a cellbox {mode} but main() did not call \
                 cellbox::worker::dispatch() before anything else"
            )));
        }
        let worker_exe = match self.worker_exe {
            Some(p) => p,
            None => match std::env::var_os("CELLBOX_WORKER_EXE") {
                Some(p) => PathBuf::from(p),
                None => std::env::current_exe().map_err(|source| Error::Io {
                    what: "find the current executable".into(),
                    source,
                })?,
            },
        };
        if !worker_exe.is_file() {
            return Err(Error::Config(format!(
                "worker executable {} does not exist",
                worker_exe.display()
            )));
        }
        if self.scratch_bytes == 0 {
            return Err(Error::Config(
                "scratch_bytes must be above 0: cells need a scratch directory".into(),
            ));
        }
        if let Some(problem) = self.session_scratch.problem() {
            return Err(Error::Config(problem));
        }
        if self.cells_memory_bytes < 16 << 20 {
            return Err(Error::Config(format!(
                "cells_memory_bytes {} is too small: give at least 16 MiB",
                self.cells_memory_bytes
            )));
        }
        // What killed supervisors left (mounts, directories, cgroups) goes
        // before this one makes its own.
        scratch::sweep_gone_supervisors();
        #[cfg(target_os = "linux")]
        let cells_cgroup = {
            // As root anywhere; without root in a cgroup v2 subtree
            // delegated to this user (it is tried: the kernel says).
            let root = nix::unistd::geteuid().is_root();
            match crate::sandbox::linux::cgroup::CellCgroup::create(self.cells_memory_bytes) {
                Ok(c) => Some(Arc::new(c)),
                Err(e) if root => {
                    tracing::warn!("the memory of all cells together is not bounded: {e}");
                    None
                }
                // Said at `serve`'s start and by `doctor`, with what would
                // give it (see `Supervisor::missing_separation`).
                Err(e) => {
                    tracing::info!("no cgroup for the cells without root here: {e}");
                    None
                }
            }
        };
        #[cfg(target_os = "linux")]
        let groups = cells_cgroup
            .as_ref()
            .filter(|_| self.session_cgroups)
            .and_then(|c| {
                match crate::sandbox::linux::groups::Groups::new(c.path(), &worker_exe) {
                    Ok(g) => Some(Arc::new(g)),
                    Err(e) => {
                        tracing::warn!("sessions share the cells' cgroup: {e}");
                        None
                    }
                }
            });
        // Warm workers see the scratch root from their start: make it now.
        let scratch_root = OnceLock::new();
        if self.warm {
            let root =
                scratch::ScratchRoot::new(self.scratch_bytes).map_err(|source| Error::Io {
                    what: "create the scratch root".into(),
                    source,
                })?;
            let _ = scratch_root.set(Some(root));
        }
        #[cfg(target_os = "linux")]
        let pools = match scratch_root.get() {
            Some(Some(root)) => Some(
                zygote::Pools::new(self.pool, root.path().to_path_buf()).map_err(|source| {
                    Error::Io {
                        what: "start the zygote launcher".into(),
                        source,
                    }
                })?,
            ),
            _ => None,
        };
        Ok(Supervisor {
            runs: Arc::default(),
            inner: Arc::new(Inner {
                cells_running: Default::default(),
                #[cfg(target_os = "linux")]
                pools,
                registry: self.registry,
                models: self.models,
                events: self.events,
                tree_remover: tree_remover(&worker_exe),
                worker_exe,
                sandbox_exec: self.sandbox_exec,
                profiles: self.profiles,
                languages: self.languages,
                python_path: self.python,
                python: OnceLock::new(),
                shim: Arc::default(),
                warm: self.warm,
                prepare_runs: self.prepare_runs,
                forkserver: tokio::sync::Mutex::new(None),
                profile_cache: Default::default(),
                subordinate_ids: self.subordinate_ids,
                scratch_root,
                scratch_bytes: self.scratch_bytes,
                session_scratch: self.session_scratch,
                #[cfg(target_os = "linux")]
                cells_cgroup,
                #[cfg(target_os = "linux")]
                groups,
            }),
        })
    }
}

/// Without root, where the user has subordinate ids: how to remove a
/// scratch tree that cells running as them wrote (the worker binary in a
/// user namespace mapping them, see [`crate::sandbox::linux::subids`]).
fn tree_remover(worker_exe: &std::path::Path) -> Option<crate::sandbox::tree::Remover> {
    #[cfg(target_os = "linux")]
    if !nix::unistd::geteuid().is_root() {
        use crate::sandbox::linux::subids;
        let map = subids::lookup().ok()?;
        let exe = worker_exe.to_path_buf();
        return Some(std::sync::Arc::new(move |path: &std::path::Path| {
            subids::remove_tree_mapped(&exe, path, map)
        }));
    }
    let _ = worker_exe;
    None
}

/// The entry point of the library: owns the capability registry and spawns
/// sessions.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
    /// The sessions prepared for [`Supervisor::run`]. Held by the handles,
    /// not by `inner`, which each of those sessions holds: they go when
    /// the last handle does.
    runs: Arc<throwaway::Throwaway>,
}

/// A handle on a [`Supervisor`] that does not keep it alive: for
/// capabilities that run cells of their own (a declared command tool), which
/// the supervisor's own registry holds.
#[derive(Clone, Default)]
pub struct WeakSupervisor {
    inner: std::sync::Weak<Inner>,
    runs: std::sync::Weak<throwaway::Throwaway>,
}

impl WeakSupervisor {
    /// The supervisor, while it exists.
    pub fn upgrade(&self) -> Option<Supervisor> {
        let inner = self.inner.upgrade()?;
        // Once every handle is gone (a session still holds the supervisor),
        // none is prepared for its next `run`: this handle starts afresh.
        let runs = self.runs.upgrade().unwrap_or_default();
        Some(Supervisor { inner, runs })
    }
}

impl Supervisor {
    /// A handle that does not keep this supervisor alive.
    pub fn downgrade(&self) -> WeakSupervisor {
        WeakSupervisor {
            inner: Arc::downgrade(&self.inner),
            runs: Arc::downgrade(&self.runs),
        }
    }
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("worker_exe", &self.inner.worker_exe)
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    pub fn builder() -> SupervisorBuilder {
        SupervisorBuilder {
            registry: Registry::with_builtins(),
            models: None,
            events: EventSink::default(),
            worker_exe: None,
            sandbox_exec: cfg!(target_os = "macos")
                .then(|| PathBuf::from(crate::macos::launch::SANDBOX_EXEC)),
            python: None,
            profiles: Default::default(),
            languages: [
                Language::Rhai,
                Language::Python,
                Language::Shell,
                Language::Bash,
            ]
            .into_iter()
            .collect(),
            warm: true,
            prepare_runs: true,
            #[cfg(target_os = "linux")]
            pool: zygote::PoolConfig::default(),
            scratch_bytes: DEFAULT_SCRATCH_BYTES,
            session_cgroups: true,
            subordinate_ids: None,
            session_scratch: DEFAULT_SESSION_SCRATCH,
            cells_memory_bytes: DEFAULT_CELLS_MEMORY_BYTES,
        }
    }

    /// A new session with its own namespace and scratch directory.
    pub fn session(&self, config: SessionConfig) -> Result<Session, Error> {
        Session::new(self.inner.clone(), config)
    }

    /// Run one cell in a fresh throwaway session, made ahead unless
    /// [`SupervisorBuilder::prepare_runs`] is off. Returned once the cell
    /// is wholly over (its worker and every process it left are gone).
    pub async fn run(&self, request: CellRequest, config: SessionConfig) -> CellResult {
        if self.inner.prepare_runs {
            let (result, tail) = self.runs.run(&self.inner, request, config, false).await;
            if let Some(t) = tail {
                t.wait().await;
            }
            return result;
        }
        self.run_unprepared(request, config).await
    }

    /// [`Supervisor::run`] in a session made for the cell and torn down
    /// after it, leaving nothing prepared (for a cell that is no sign of
    /// more to come, such as a server's probe of its sandbox).
    pub(crate) async fn run_unprepared(
        &self,
        request: CellRequest,
        config: SessionConfig,
    ) -> CellResult {
        match self.session(throwaway::for_one_cell(config)) {
            // Returned once the cell is wholly over: nothing else holds it.
            Ok(s) => {
                let result = s.run(request).await;
                s.settled().await;
                result
            }
            Err(e) => CellResult::refused_with(
                request.language.as_str(),
                RunInfo::root(),
                ErrorKind::SandboxError,
                e.to_string(),
            ),
        }
    }

    /// [`Supervisor::run`] in a session prepared ahead, returned when the
    /// cell is answered, for a caller that has yet to hand the result on;
    /// the end of the cell when its worker was not gone yet (see
    /// [`Session::settled`]).
    pub(crate) async fn run_answered(
        &self,
        request: CellRequest,
        config: SessionConfig,
    ) -> (CellResult, Option<Tail>) {
        self.runs.run(&self.inner, request, config, true).await
    }

    /// Prepare a session for the first [`Supervisor::run`] with `config`
    /// now, rather than after it: the session is made, and a worker is
    /// started in it for each of Rhai and Python the supervisor runs, so
    /// that the first such cell only sends its code (the cells after it
    /// are prepared for anyway). Returns once it is ready. Nothing is done
    /// when [`SupervisorBuilder::prepare_runs`] is off, when one is ready
    /// or being made already, or when cells with another configuration
    /// ran first.
    pub async fn prepare_for_runs(&self, config: SessionConfig) {
        if self.inner.prepare_runs {
            self.runs.expect(self.inner.clone(), config).await;
        }
    }

    /// Give back the sessions prepared for the next [`Supervisor::run`]
    /// (see [`SupervisorBuilder::prepare_runs`]), and any being prepared
    /// once it is made; none is prepared again before the next such cell.
    /// Returns once those prepared are torn down, and so are the sessions
    /// of the `run` cells already answered (each goes once its worker and
    /// what it left running are gone): nothing of those cells is left.
    pub async fn release_prepared(&self) {
        self.runs.release().await;
    }

    /// Give back the sessions prepared for the next [`Supervisor::run`]
    /// beyond those still wanted, while no such cell runs.
    pub(crate) fn trim_prepared(&self) {
        self.runs.trim();
    }

    /// Run a program under the shell profile's sandbox (`cellbox exec`).
    pub async fn exec(
        &self,
        argv: Vec<String>,
        config: SessionConfig,
        forward_output: bool,
    ) -> CellResult {
        self.exec_with_env(argv, Vec::new(), config, forward_output)
            .await
    }

    /// [`Supervisor::exec`] with `env` besides the sandbox's fixed
    /// environment (a command tool's `env` and `pass_env`; names the
    /// sandbox sets are the tool's declaration's to refuse).
    pub async fn exec_with_env(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        config: SessionConfig,
        forward_output: bool,
    ) -> CellResult {
        match self.session(config) {
            Ok(s) => {
                let forward = if forward_output {
                    Forward::All
                } else {
                    Forward::No
                };
                s.exec(argv, crate::protocol::ExecEnv(env), forward).await
            }
            Err(e) => CellResult::refused_with(
                "shell",
                RunInfo::root(),
                ErrorKind::SandboxError,
                e.to_string(),
            ),
        }
    }

    /// The languages cells may be written in.
    pub fn languages(&self) -> impl Iterator<Item = Language> + '_ {
        self.inner.languages.iter().copied()
    }

    /// Where the supervisor records its events.
    pub fn event_sink(&self) -> &EventSink {
        &self.inner.events
    }

    /// The capabilities this supervisor knows.
    pub fn capabilities(&self) -> impl Iterator<Item = &Capability> {
        self.inner.registry.iter()
    }

    /// The tool sources (upstream servers) this supervisor knows; their
    /// tools are `SERVER.TOOL`, found when first called.
    pub fn tool_sources(&self) -> impl Iterator<Item = &Capability> {
        self.inner.registry.sources()
    }

    /// True when a policy may name `name`: a capability, or `SERVER.TOOL`
    /// or `SERVER.*` of a tool source (which is not started to check).
    pub fn knows(&self, name: &str) -> bool {
        self.inner.registry.may_name(name)
    }

    /// Start the warm workers now (the Rhai fork server and every zygote of
    /// the Python pool for the supervisor's Python profile) instead of on
    /// the first cell; returns once they take cells (a zygote once its
    /// profile's preload modules are imported). A no-op when warm workers
    /// are off.
    pub async fn start_pools(&self) -> Result<(), Error> {
        if !self.inner.warm {
            return Ok(());
        }
        // Both at once, the zygotes first: a zygote takes the longest to
        // be ready (its interpreter starts), and is launched on a thread of
        // its own while the fork server starts here.
        // Only the pools of the languages this supervisor runs: a server
        // of Rhai alone starts no Python zygote.
        let python = async {
            #[cfg(target_os = "linux")]
            if let (Some(p), true) = (
                &self.inner.pools,
                self.inner.languages.contains(&Language::Python),
            ) {
                let profile = self.inner.profile_name(Language::Python, None);
                return p
                    .fill(&self.inner, &profile)
                    .await
                    .map_err(|e| Error::Config(e.to_string()));
            }
            Ok::<(), Error>(())
        };
        let rhai = async {
            if self.inner.languages.contains(&Language::Rhai) {
                let _ = self.inner.fork_server().await;
            }
        };
        let (python, ()) = tokio::join!(python, rhai);
        python
    }

    /// Bytes of memory all cells may hold together, when this supervisor
    /// can enforce it (see [`SupervisorBuilder::cells_memory_bytes`]).
    /// What this supervisor does not keep apart between sessions on this
    /// host, and the one setting that would (`None`: sessions have a
    /// cgroup each).
    pub fn missing_separation(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        {
            if self.inner.groups.is_some() {
                return None;
            }
            let what = if self.inner.cells_cgroup.is_none() {
                "the memory of all cells together is NOT bounded and sessions are NOT kept \
                 apart (no cgroup per session or per cell: one session can take every \
                 process and all the memory cells get)"
            } else {
                "sessions are NOT kept apart (they share the cells' cgroup: one session can \
                 take every process and all the memory cells get)"
            };
            Some(format!(
                "{what}; what would keep them apart: {}",
                crate::sandbox::doctor::cgroup_setting(
                    nix::unistd::geteuid().is_root(),
                    crate::sandbox::doctor::detect_container().as_deref(),
                )
            ))
        }
        #[cfg(not(target_os = "linux"))]
        Some("sessions are NOT kept apart: cgroups are Linux only".into())
    }

    /// Cells running now, sub-cells included.
    pub fn cells_running(&self) -> usize {
        self.inner
            .cells_running
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of memory the cells' memory cgroup holds now (every session's
    /// and cell's, the warm workers'), when there is one.
    pub fn cells_memory_in_use(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        return self.inner.cells_cgroup.as_ref().and_then(|c| c.in_use());
        #[cfg(not(target_os = "linux"))]
        None
    }

    pub fn cells_memory(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        return self.inner.cells_cgroup.as_ref().map(|c| c.limit());
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Whether the scratch root exists and takes a new file (a readiness
    /// check: a full or read-only temp dir fails every cell).
    pub fn scratch_writable(&self) -> bool {
        self.inner
            .scratch_root()
            .is_some_and(|r| tempfile::tempfile_in(r.path()).is_ok())
    }

    /// The bytes the scratch directories of all cells may hold together, if
    /// this supervisor can enforce it (see [`SupervisorBuilder::scratch_bytes`]).
    pub fn scratch_quota(&self) -> Option<u64> {
        self.inner.scratch_root().and_then(|r| r.quota())
    }

    /// The bounds of each session's own scratch, if this supervisor can
    /// enforce them (see [`SupervisorBuilder::session_scratch_bytes`]).
    pub fn session_scratch_quota(&self) -> Option<ScratchQuota> {
        self.inner.session_scratch_quota()
    }

    /// The state of the warm workers.
    #[cfg(target_os = "linux")]
    pub async fn pool_status(&self) -> PoolStatus {
        let fs = self.inner.forkserver.lock().await;
        let live = fs.as_ref().filter(|f| !f.is_dead());
        let rhai = live.is_some();
        let rhai_pid = live.and_then(|f| u32::try_from(f.pid).ok());
        let rhai_spares = live.map_or(0, |f| f.spares());
        drop(fs);
        let pools = self.inner.pools.as_ref();
        let config = pools.map(|p| p.config.clone()).unwrap_or_default();
        let python = match pools {
            Some(p) => p.status().await,
            None => Vec::new(),
        };
        PoolStatus {
            prepared_runs: self.runs.prepared(),
            warm: self.inner.warm,
            rhai_fork_server: rhai,
            rhai_fork_server_pid: rhai_pid,
            rhai_spares,
            scratch_root: pools.map(|p| p.root().to_path_buf()),
            scratch_quota_bytes: self
                .inner
                .scratch_root
                .get()
                .and_then(|r| r.as_ref())
                .and_then(|r| r.quota()),
            session_scratch_quota: self
                .inner
                .scratch_root
                .get()
                .and_then(|r| r.as_ref())
                .and_then(|r| r.quota())
                .map(|_| self.inner.session_scratch),
            cells_memory_bytes: self.cells_memory(),
            cells_memory_cgroup: self
                .inner
                .cells_cgroup
                .as_ref()
                .map(|c| format!("{} {}", c.kind(), c.path().display())),
            #[cfg(target_os = "linux")]
            session_cgroups: self.inner.groups.is_some(),
            #[cfg(not(target_os = "linux"))]
            session_cgroups: false,
            pool_size: config.size,
            max_cells: config.max_cells,
            max_age_ms: config.max_age.as_millis() as u64,
            python,
        }
    }

    /// The state of the warm workers: none outside Linux.
    #[cfg(not(target_os = "linux"))]
    pub async fn pool_status(&self) -> PoolStatus {
        PoolStatus {
            prepared_runs: self.runs.prepared(),
            warm: false,
            rhai_fork_server: false,
            rhai_fork_server_pid: None,
            rhai_spares: 0,
            scratch_root: None,
            scratch_quota_bytes: None,
            session_scratch_quota: None,
            cells_memory_bytes: None,
            cells_memory_cgroup: None,
            session_cgroups: false,
            pool_size: 0,
            max_cells: 0,
            max_age_ms: 0,
            python: Vec::new(),
        }
    }

    /// The configured models, if any.
    pub fn models(&self) -> Option<&crate::models::ModelClient> {
        self.inner.models.as_deref()
    }

    /// The Python interpreter cells would use.
    pub fn python(&self) -> Result<PythonInfo, PythonError> {
        self.inner.python().cloned()
    }
}

impl RunInfo {
    pub(crate) fn root() -> RunInfo {
        let id = cell::new_run_id();
        RunInfo {
            run_id: id.clone(),
            parent_run_id: None,
            root_run_id: id,
            depth: 0,
            request_id: None,
        }
    }
}

/// Resolve a program name to an absolute path (PATH lookup for bare names).
pub(crate) fn resolve_program(prog: &str) -> Result<PathBuf, ProgramError> {
    let p = Path::new(prog);
    if p.is_absolute() {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(ProgramError::Missing(prog.to_owned()))
        };
    }
    if prog.contains('/') {
        return std::fs::canonicalize(p).map_err(|source| ProgramError::Resolve {
            prog: prog.to_owned(),
            source,
        });
    }
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let c = Path::new(dir).join(prog);
        if c.is_file() {
            return Ok(c);
        }
    }
    Err(ProgramError::NotFound(prog.to_owned()))
}

/// Why the program of an `exec` cell was not found.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProgramError {
    #[error("exec needs a program to run")]
    Empty,
    #[error("program {0} does not exist")]
    Missing(String),
    #[error("program {prog}: {source}")]
    Resolve {
        prog: String,
        #[source]
        source: std::io::Error,
    },
    #[error("program {0:?} was not found in /usr/local/bin, /usr/bin or /bin")]
    NotFound(String),
}

/// For the callers that still speak in strings.
impl From<ProgramError> for String {
    fn from(e: ProgramError) -> String {
        e.to_string()
    }
}

pub(crate) use crate::util::valid_var_name;

pub(crate) type Namespace = Map<String, Value>;
