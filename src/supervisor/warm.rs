//! The supervisor's side of the Rhai fork server (see
//! `crate::sandbox::forkserver`): start it once, ask it for one child per
//! cell, learn how each child ended.

use super::pool_client::PoolClient;
use crate::plan::Rlimits;
use crate::sandbox::forkserver::{self, Control};
use crate::sandbox::process::Reaped;
use crate::util::lock;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// The `tracing` target of pool events (zygotes and the fork server
/// started, retired, found dead, stalled and replaced; cells moved), which
/// `serve` logs by default.
pub(crate) const POOL_LOG: &str = "cellbox::pool";

/// Why a pool parent (the Rhai fork server, a Python zygote) did not start
/// or did not fork a cell.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // some variants: the zygotes' (Linux)
pub(crate) enum PoolError {
    /// A system call on the way failed (`what` says which, as "failed to
    /// ..." reads it).
    #[error("failed to {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A cell's scratch dir could not be given to the sandbox user.
    #[error("failed to {what} scratch dir {}: {source}", dir.display())]
    Scratch {
        what: &'static str,
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Profile(#[from] crate::profiles::ProfileError),
    #[error(transparent)]
    Cgroup(#[from] super::CgroupRequired),
    #[error(transparent)]
    Python(#[from] super::python::PythonError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    View(#[from] crate::sandbox::linux::view::ViewError),
    #[cfg(target_os = "linux")]
    #[error("failed to {what}: {source}")]
    Landlock {
        what: &'static str,
        #[source]
        source: crate::sandbox::linux::landlock::LandlockError,
    },
    /// The fork server's spawn reply did not carry a child's four fds.
    #[error("the fork server sent {0} fds, not 4")]
    FdCount(usize),
    #[error("the fork server thread went away")]
    ThreadGone,
    #[error("the zygote launcher thread is gone")]
    LauncherGone,
    /// The parent could not apply one of its pool-wide layers.
    #[error("the fork server could not apply the {layer} layer: {message}")]
    ServerLayer { layer: String, message: String },
    #[error("the {layer} layer could not be applied to the Python zygote: {message}")]
    ZygoteLayer { layer: String, message: String },
    #[error("the fork server did not start")]
    ServerNotStarted,
    #[error("the fork server did not start: {0}")]
    ServerNoAnswer(#[source] std::io::Error),
    #[error("the Python zygote did not get ready in time")]
    ZygoteNotReady,
    #[error("the Python zygote exited during setup")]
    ZygoteExited,
    #[error(
        "the Python zygote did not finish starting its interpreter and importing its preload modules within {0} s"
    )]
    ZygoteNotServing(u64),
    #[error(
        "the Python zygote (pid {pid}) exited before it served: it died starting its interpreter or importing its preload modules"
    )]
    ZygoteDiedStarting { pid: i32 },
    /// The zygote's reply was not one the protocol allows here.
    #[error("the Python zygote sent {0}")]
    ZygoteSent(&'static str),
    #[error("the Python zygote offered an unknown path {0}")]
    UnknownAnchor(String),
    #[error("no Python zygote")]
    NoZygote,
    #[error("the fork server is not running")]
    ServerNotRunning,
    #[error("the Python zygote is not running")]
    ZygoteNotRunning,
    #[error("the fork server went away")]
    ServerGone,
    #[error("the Python zygote went away")]
    ZygoteGone,
    #[error("the fork server (pid {pid}) did not answer a spawn within {waited_ms} ms")]
    ServerStalled { pid: i32, waited_ms: u128 },
    #[error("the Python zygote (pid {0}) is stalled")]
    ZygoteStalled(i32),
    #[error("the Python zygote (pid {pid}) did not answer a spawn within {waited_ms} ms")]
    ZygoteNoAnswer { pid: i32, waited_ms: u128 },
    #[error(
        "it waited {waited_ms} ms for the Python zygote (pid {pid}) to fork it and got no answer"
    )]
    ZygoteDeadline { pid: i32, waited_ms: u128 },
    /// The parent answered a spawn with an error of its own.
    #[error("the fork server could not fork: {0}")]
    ServerFork(String),
    #[error("the Python zygote could not fork the cell: {0}")]
    ZygoteFork(String),
}

impl PoolError {
    /// A `map_err` for a failed system call: "failed to {what}: {e}".
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> PoolError {
        move |source| PoolError::Io { what, source }
    }
}

/// A process that forks cell workers and reports how they ended (the Rhai
/// fork server, a Python zygote).
pub(crate) trait ForkingParent: Send + Sync {
    /// How errors name it.
    fn name(&self) -> &'static str;
    /// Forget a child whose end will not be asked for any more.
    fn forget(&self, pid: i32);
    /// How long it may take to report a child's end once the child is gone
    /// (a healthy parent reaps it at once).
    fn report_within(&self) -> Duration;
    /// It did not answer `what` within `waited`: it takes no more cells and
    /// is replaced.
    fn stalled(&self, what: &str, waited: Duration);
}

impl ForkingParent for ForkServer {
    fn name(&self) -> &'static str {
        "the fork server"
    }

    fn forget(&self, pid: i32) {
        self.client.forget(pid);
    }

    fn report_within(&self) -> Duration {
        STALL_WITHIN
    }

    fn stalled(&self, what: &str, waited: Duration) {
        self.mark_stalled(what, waited);
    }
}

/// A healthy fork server answers a spawn, and reports a child's end once
/// the child is gone, in a few ms; one that takes longer than this is
/// stalled and replaced (the cell that waited runs in a fresh worker).
const STALL_WITHIN: Duration = Duration::from_secs(1);

/// Children the fork server keeps sandboxed and waiting, so a cell with the
/// default limits only has to take one. Three: at two cells at a time, the
/// one made after a cell has the next cell's time to get ready.
const SPARES: usize = 3;

/// When the cell a child is forked for runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForkFor {
    /// Now: the cell is waiting for it.
    Now,
    /// Later: its code is not known yet (see `cell::prepared`); until it
    /// has it, it waits under the spares' name.
    Ahead,
    /// Later, as `Ahead`, and no cell runs now: a Python cell's process
    /// may warm up while it waits (see the shim's `_warm_up`). Under load
    /// that would only take CPU time from the cells running.
    AheadIdle,
}

/// A sandboxed child of the fork server, waiting for its `start` frame, and
/// the supervisor's ends of its channels.
pub(crate) struct Forked {
    pub(crate) pid: i32,
    pub(crate) pidfd: OwnedFd,
    /// The protocol socket (its `ready` may already be waiting in it).
    pub(crate) sock: OwnedFd,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
}

impl Forked {
    fn from_fds(pid: i32, fds: Vec<OwnedFd>) -> Result<Forked, PoolError> {
        let [pidfd, sock, stdout, stderr]: [OwnedFd; 4] = fds
            .try_into()
            .map_err(|v: Vec<OwnedFd>| PoolError::FdCount(v.len()))?;
        Ok(Forked {
            pid,
            pidfd,
            sock,
            stdout,
            stderr,
        })
    }
}

enum ExitSlot {
    Waiting(oneshot::Sender<Reaped>),
    Arrived(Reaped),
}

/// How forked children ended, as their parent (the fork server or a Python
/// zygote) reports it, matched with whoever asks: a report may arrive
/// before or after the question.
#[derive(Default)]
pub(crate) struct ExitTable(HashMap<i32, ExitSlot>);

impl ExitTable {
    /// Ask for `pid`'s end; `lost` answers at once when no report is here
    /// and none can come any more.
    pub(crate) fn ask(&mut self, pid: i32, lost: Option<Reaped>) -> oneshot::Receiver<Reaped> {
        let (tx, rx) = oneshot::channel();
        match (self.0.remove(&pid), lost) {
            (Some(ExitSlot::Arrived(r)), _) => {
                let _ = tx.send(r);
            }
            (_, Some(r)) => {
                let _ = tx.send(r);
            }
            (_, None) => {
                self.0.insert(pid, ExitSlot::Waiting(tx));
            }
        }
        rx
    }

    /// Whether `pid`'s end was reported and not yet asked for.
    pub(crate) fn arrived(&self, pid: i32) -> bool {
        matches!(self.0.get(&pid), Some(ExitSlot::Arrived(_)))
    }

    /// A report arrived.
    pub(crate) fn record(&mut self, pid: i32, r: Reaped) {
        match self.0.remove(&pid) {
            Some(ExitSlot::Waiting(tx)) => {
                let _ = tx.send(r);
            }
            _ => {
                // Bound the map: reports nobody claims are dropped.
                if self.0.len() > 4096 {
                    self.0.clear();
                }
                self.0.insert(pid, ExitSlot::Arrived(r));
            }
        }
    }

    /// A new child is `pid` (its parent says so before it can report its
    /// end): a report that came for that pid before is an earlier child's,
    /// one nobody claimed, and must not be taken for the new one's.
    pub(crate) fn born(&mut self, pid: i32) {
        if matches!(self.0.get(&pid), Some(ExitSlot::Arrived(_))) {
            self.0.remove(&pid);
        }
    }

    /// Forget a child whose cell was abandoned.
    pub(crate) fn forget(&mut self, pid: i32) {
        self.0.remove(&pid);
    }

    /// The reporter is gone: answer every waiter with `lost` (or drop them).
    pub(crate) fn close(&mut self, lost: Option<Reaped>) {
        for (_, slot) in self.0.drain() {
            if let (ExitSlot::Waiting(tx), Some(r)) = (slot, lost) {
                let _ = tx.send(r);
            }
        }
    }
}

/// Spares handed over by the server, oldest first.
#[derive(Default)]
struct Spares(VecDeque<(Rlimits, Forked)>);

impl Spares {
    /// A live spare with exactly these limits, and how many dead ones were
    /// dropped on the way (each needs a replacement).
    fn take(&mut self, limits: &Rlimits, client: &PoolClient) -> (Option<Forked>, usize) {
        let mut dropped = 0;
        while let Some(i) = self.0.iter().position(|(l, _)| l == limits) {
            let Some((_, f)) = self.0.remove(i) else {
                break;
            };
            if client.exit_arrived(f.pid) || exited(&f.pidfd) {
                // It died waiting (killed from outside, or its layers failed
                // and it said so on a socket nobody read): not a cell.
                client.forget(f.pid);
                dropped += 1;
                continue;
            }
            return (Some(f), dropped);
        }
        (None, dropped)
    }
}

pub(crate) struct ForkServer {
    /// The sandbox profile its pool layers come from.
    pub(crate) profile: String,
    /// Its working directory.
    _dir: tempfile::TempDir,
    /// Keeps the thread that forked the server alive (see `start`).
    _keep_parent: std::sync::mpsc::Sender<()>,
    client: Arc<PoolClient>,
    spares: Arc<Mutex<Spares>>,
    /// A send failed: the server is gone.
    dead: AtomicBool,
    /// It stopped answering in time: it is replaced, and killed once
    /// nothing of it is in use.
    stalled: AtomicBool,
    /// The server's process id, as the host sees it (PID 1 of its
    /// namespaces when the supervisor started it in them).
    pub(crate) pid: i32,
}

impl ForkServer {
    /// Start `worker_exe __forkserver` with the control channel on fd 3 and
    /// have it apply the pool-wide layers of `profile`.
    pub(crate) fn start(
        worker_exe: &Path,
        profile: &str,
        sup: &super::Inner,
    ) -> Result<ForkServer, PoolError> {
        let loaded = crate::profiles::Profile::load(profile)?;
        let cgroup = sup.cgroup_for(loaded.layers.cgroup)?;
        // With session cgroups every cell is forked for it and joins its
        // groups itself (see `spawn`): spares would only wait.
        #[cfg(target_os = "linux")]
        let spares = if sup.groups.is_some() { 0 } else { SPARES };
        #[cfg(not(target_os = "linux"))]
        let spares = SPARES;
        let dir = tempfile::Builder::new()
            .prefix(&format!(
                "{}{}-",
                super::scratch::FORKSERVER_PREFIX,
                std::process::id()
            ))
            .tempdir()
            .map_err(PoolError::io("create the fork server's directory"))?;
        let plan = crate::sandbox::SandboxPlan::new(
            &loaded,
            dir.path().to_path_buf(),
            // The spares' limits: a cell of default limits under this
            // profile's ceiling (the server itself sets none of its own).
            super::Limits::default()
                .under_profile(&loaded.limits)
                .rlimits,
        );
        let (ours, theirs) = forkserver::seqpacket_pair()
            .map_err(PoolError::io("create the fork server channel"))?;
        // Fork from a thread that lives as long as this handle: the server's
        // parent-death signal fires when the *thread* that forked it ends,
        // and the caller's thread (a runtime worker) may not outlive us.
        let (keep_tx, keep_rx) = std::sync::mpsc::channel::<()>();
        let (res_tx, res_rx) = std::sync::mpsc::channel();
        let (exe, start_plan) = (worker_exe.to_path_buf(), plan.clone());
        std::thread::Builder::new()
            .name("cellbox-forkserver-parent".into())
            .spawn(move || {
                let r = crate::sandbox::spawn::start_pool_process(
                    &exe,
                    crate::worker::FORKSERVER_ARG,
                    &theirs,
                    cgroup.into_iter().collect(),
                    &start_plan,
                );
                drop(theirs);
                let ok = r.is_ok();
                let _ = res_tx.send(r);
                if ok {
                    // Blocks until the ForkServer is dropped.
                    let _ = keep_rx.recv();
                }
            })
            .map_err(PoolError::io("start the fork server thread"))?;
        let started = res_rx
            .recv()
            .map_err(|_| PoolError::ThreadGone)?
            .map_err(PoolError::io("start the fork server"))?;
        let server_pid = started.pid;
        // Until the server is handed to its `ServerEnd`, any failure ends it.
        let guard = KillAndReap(server_pid);
        // Pool-wide layers first; a server that cannot apply them is not used.
        let report = forkserver::send(
            ours.as_fd(),
            &Control::Init {
                plan: Box::new(plan),
                spares,
                cloned: started.cloned,
            },
            &[],
        )
        .and_then(|()| {
            // A server that stalls in its setup must not hold the cells
            // waiting for it (and the supervisor's lock on it) for ever.
            if readable_within(&ours, READY_WITHIN) {
                forkserver::recv(ours.as_fd())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer to its setup within {READY_WITHIN:?}"),
                ))
            }
        });
        match report {
            Ok(Some((Control::Ready { .. }, _))) => {}
            Ok(Some((Control::Failed { layer, message }, _))) => {
                return Err(PoolError::ServerLayer { layer, message })
            }
            Ok(_) => return Err(PoolError::ServerNotStarted),
            Err(e) => return Err(PoolError::ServerNoAnswer(e)),
        }
        let client = Arc::new(PoolClient::new(ours, None));
        let reader_fd = client
            .reader_fd()
            .map_err(PoolError::io("share the fork server channel"))?;
        let reader = crate::sandbox::process::watch_readable(reader_fd)
            .map_err(PoolError::io("watch the fork server channel"))?;
        let spares = Arc::new(Mutex::new(Spares::default()));
        std::mem::forget(guard);
        let ender = ServerEnd {
            client: client.clone(),
            spares: spares.clone(),
            server_pid,
        };
        // Replies are read on the runtime: a report wakes the cell waiting
        // for it directly, with no thread in between.
        tokio::spawn(read_loop(reader, ender));
        Ok(ForkServer {
            profile: profile.to_owned(),
            _dir: dir,
            _keep_parent: keep_tx,
            client,
            spares,
            dead: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            pid: server_pid,
        })
    }

    /// How many spares are waiting here.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the Linux-only warm paths
    pub(crate) fn spares(&self) -> usize {
        lock(&self.spares).0.len()
    }

    /// Dead or stalled: the next cell starts a new one.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
            || self.client.is_closed()
            || self.stalled.load(Ordering::SeqCst)
    }

    /// It stopped answering in time (it counts as dead too).
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// It did not answer `what` in time (see [`STALL_WITHIN`]).
    fn mark_stalled(&self, what: &str, waited: Duration) {
        if self.stalled.swap(true, Ordering::SeqCst)
            || self.dead.load(Ordering::SeqCst)
            || self.client.is_closed()
        {
            return;
        }
        tracing::warn!(
            target: POOL_LOG,
            profile = %self.profile,
            pid = self.pid,
            waited_ms = waited.as_millis() as u64,
            "Rhai fork server stalled: it did not answer {what} in time; it is replaced"
        );
    }

    /// A sandboxed child with these limits, waiting for `start`: a spare if
    /// one fits, else one forked now. The second value, when present, asks
    /// for the spare's replacement when dropped: while another spare is
    /// waiting the replacement is made after the cell, so its fork and
    /// sandboxing do not compete with the cell for the CPUs. The wait for
    /// a fork ends at [`STALL_WITHIN`] (the server is then stalled and
    /// replaced) or at the cell's `deadline`, whichever comes first.
    /// A child for a cell with `limits`: a spare when one fits and the
    /// child joins no cgroup, else forked now, joining the cgroups whose
    /// `tasks` files are `join` before it runs anything (a spare would
    /// have to be moved by its pid, which waits for the kernel's global
    /// lock: an RCU grace period when it was idle, far longer than a fork).
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        limits: &Rlimits,
        join: &[BorrowedFd<'_>],
        deadline: tokio::time::Instant,
        now: ForkFor,
    ) -> Result<(Forked, Option<Refill>), PoolError> {
        if self.is_dead() {
            return Err(PoolError::ServerNotRunning);
        }
        if !join.is_empty() {
            return self.spawn_now(limits, join, deadline, now).await;
        }
        let (spare, dropped, left) = {
            let mut s = lock(&self.spares);
            let (spare, dropped) = s.take(limits, &self.client);
            (spare, dropped, s.0.len())
        };
        for _ in 0..dropped {
            // A lost refill only costs a later cell its head start.
            let _ = self.control(&Control::Refill);
        }
        if let Some(f) = spare {
            if left == 0 {
                let _ = self.control(&Control::Refill);
                return Ok((f, None));
            }
            return Ok((f, Some(Refill(self.clone()))));
        }
        self.spawn_now(limits, &[], deadline, now).await
    }

    /// Ask the server for a child now (see [`Self::spawn`]).
    async fn spawn_now(
        self: &Arc<Self>,
        limits: &Rlimits,
        join: &[BorrowedFd<'_>],
        deadline: tokio::time::Instant,
        now: ForkFor,
    ) -> Result<(Forked, Option<Refill>), PoolError> {
        let asked = std::time::Instant::now();
        let limits = *limits;
        let ahead = now != ForkFor::Now;
        let (id, rx) = self
            .client
            .request(|id| Control::Spawn { id, limits, ahead }, join)
            .map_err(|e| {
                self.dead.store(true, Ordering::SeqCst);
                PoolError::io("reach the fork server")(e)
            })?;
        let stall_at = tokio::time::Instant::from_std(asked) + STALL_WITHIN;
        match tokio::time::timeout_at(stall_at.min(deadline), rx).await {
            Ok(Ok(Ok(s))) => Forked::from_fds(s.pid, s.fds).map(|f| (f, None)),
            Ok(Ok(Err(refused))) => Err(PoolError::ServerFork(refused.0)),
            Ok(Err(_)) => Err(PoolError::ServerGone),
            Err(_) => {
                self.client.give_up(id, None);
                let waited = asked.elapsed();
                if stall_at <= deadline {
                    self.mark_stalled("a spawn", waited);
                }
                Err(PoolError::ServerStalled {
                    pid: self.pid,
                    waited_ms: waited.as_millis(),
                })
            }
        }
    }

    /// Send one control message; a failed send means the server is gone.
    fn control(&self, msg: &Control) -> std::io::Result<()> {
        let r = self.client.send(msg, &[]);
        if r.is_err() {
            self.dead.store(true, Ordering::SeqCst);
        }
        r
    }

    /// How child `pid` ended (resolves once the server reaped it).
    pub(crate) fn exit_of(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        self.client.exit_of(pid)
    }
}

/// How long the fork server may take to apply its layers and say `ready`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Whether `fd` turns readable within `timeout`.
pub(crate) fn readable_within(fd: &OwnedFd, timeout: Duration) -> bool {
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    loop {
        let mut fds = [nix::poll::PollFd::new(
            fd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(n) => return n > 0,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Whether the process behind `pidfd` has exited (a pidfd turns readable).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Asks the fork server for a new spare when dropped.
pub(crate) struct Refill(Arc<ForkServer>);

impl Drop for Refill {
    fn drop(&mut self) {
        if !self.0.is_dead() {
            let _ = self.0.control(&Control::Refill);
        }
    }
}

/// Cleans up after the fork server once its channel is closed, or when the
/// reading task is dropped with its runtime: nothing waits any more, the
/// server is killed and reaped.
struct ServerEnd {
    client: Arc<PoolClient>,
    spares: Arc<Mutex<Spares>>,
    server_pid: i32,
}

impl Drop for ServerEnd {
    fn drop(&mut self) {
        self.client.close();
        lock(&self.spares).0.clear();
        // SIGKILL, so the wait is short.
        let _ = crate::sandbox::process::kill_pid(self.server_pid);
        let _ = crate::sandbox::process::reap(self.server_pid);
    }
}

async fn read_loop(fd: tokio::io::unix::AsyncFd<OwnedFd>, end: ServerEnd) {
    end.client
        .read::<Control>(&fd, forkserver::MAX_CONTROL_BYTES, |msg, fds| {
            if let Control::Spare { pid, limits } = msg {
                if let Ok(f) = Forked::from_fds(pid, fds) {
                    lock(&end.spares).0.push_back((limits, f));
                }
            }
            // Other messages are not the server's to send now: ignored.
            true
        })
        .await;
    // The server is gone or talks nonsense: `end` cleans up (on a blocking
    // thread: reaping waits).
    let _ = tokio::task::spawn_blocking(move || drop(end)).await;
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        // Shut the socket down (not just our fd: the reader thread holds a
        // second one), so the server sees EOF, kills its cells and exits, and
        // the reader thread ends and reaps it.
        let was_open = self.client.shutdown();
        // A stalled server may never read that EOF: kill it (its cells are
        // over: each held this handle).
        if self.stalled.load(Ordering::SeqCst) && was_open {
            let _ = crate::sandbox::process::kill_pid(self.pid);
        }
    }
}

/// A pool process (a fork server, a zygote) not yet handed to what ends
/// it: killed and reaped when dropped, so a start that fails half-way
/// leaves no process and no zombie (`std::mem::forget` it once handed
/// over).
pub(super) struct KillAndReap(pub(super) i32);

impl Drop for KillAndReap {
    fn drop(&mut self) {
        let _ = crate::sandbox::process::kill_pid(self.0);
        let _ = crate::sandbox::process::reap(self.0);
    }
}
