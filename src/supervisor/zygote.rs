//! The supervisor's side of the Python zygotes (see
//! `crate::sandbox::zygote`): a pool per Python profile, started lazily (or
//! eagerly by [`super::Supervisor::start_pools`]), each zygote replaced when
//! it dies, misbehaves (a bad message, no answer in time) or outlives its
//! lifetime (cells or age).
//!
//! Every warm cell's scratch directory lives beneath one **pool scratch
//! root** that the supervisor owns; each zygote sees that root at the same
//! path, read-write for the zygote but, through each cell's own nested
//! Landlock domain, only the cell's own directory for the cell.

use super::pool_client::PoolClient;
use super::warm::{KillAndReap, PoolError, POOL_LOG};
use super::{Inner, Language};
use crate::plan::Rlimits;
use crate::sandbox::linux::landlock::{CellRules, Grant};
use crate::sandbox::linux::view::Kind;
use crate::sandbox::process::Reaped;
use crate::sandbox::zygote::{self, ZygoteMsg};
use crate::sandbox::{Layer, SandboxPlan, SandboxReport};
use crate::util::lock;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Sizes and lifetimes of the Python zygote pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Zygotes per Python profile (cells are spread over them).
    pub size: usize,
    /// A zygote is replaced after forking this many cells.
    pub max_cells: u64,
    /// A zygote is replaced once it is this old.
    pub max_age: Duration,
    /// A zygote that does not get ready within this is treated as broken
    /// and replaced (it bounds the answer to a spawn too).
    pub answer_timeout: Duration,
    /// A healthy zygote answers a spawn, and reports a cell's end once the
    /// cell is gone, in a few ms. One that takes longer than this is
    /// **stalled**: it takes no new cells and is replaced (and killed once
    /// its running cells are over), and the cell that waited for it moves
    /// to another zygote or runs cold. Every such wait is also bounded by
    /// the cell's own deadline.
    pub stall_timeout: Duration,
    /// The pool-wide resource limits a zygote runs under: the ceiling for
    /// its cells. A cell asking for more runs cold, in its own worker.
    pub ceiling: PoolCeiling,
}

/// The rlimits a zygote runs under, which bound those of its cells (see
/// [`PoolConfig::ceiling`]). Two of them are the zygote's own rather than a
/// cell's: `cpu_seconds` is the CPU time of the zygote itself over its
/// lifetime (each cell's CPU limit counts from zero in the cell's own
/// process, and must be below it), and `max_processes` is shared, since
/// RLIMIT_NPROC is counted per user (namespace): the zygote and all its
/// cells share one count, and each cell's own limit is checked against it.
pub type PoolCeiling = Rlimits;

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 2,
            max_cells: 2000,
            max_age: Duration::from_secs(600),
            answer_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(1),
            ceiling: PoolCeiling {
                cpu_seconds: 24 * 3600,
                memory_bytes: 1 << 30,
                max_processes: 256,
                max_open_files: 256,
                max_file_size_bytes: 64 << 20,
            },
        }
    }
}

use super::pool_status::ZygoteStatus;

/// Why a cell could not be forked from a zygote.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// The zygote did not answer within its stall window: it is marked
    /// stalled (and replaced); the cell may move to another.
    #[error(transparent)]
    Stalled(PoolError),
    /// The cell's deadline came while it waited for the zygote's answer.
    #[error(transparent)]
    Deadline(PoolError),
    /// The zygote is gone or could not fork the cell.
    #[error(transparent)]
    Failed(PoolError),
}

/// A healthy zygote answers a spawn in a few ms: one that has kept a spawn
/// waiting longer is not given a cell that moved off a stalled one.
const SLOW_ANSWER: Duration = Duration::from_millis(100);

/// How long a stalled zygote's report of a cell's end is waited for.
const STALLED_REPORT_WITHIN: Duration = Duration::from_millis(50);

/// How long a zygote may take, once sandboxed, to start its interpreter,
/// import its profile's `preload` modules and say it serves: seconds for
/// large libraries read from a cold disk. A spawn asked of it meanwhile
/// waits for that (within the cell's deadline), and the window for its
/// answer (the stall window) starts only then: it measures the fork alone,
/// never the imports.
const SERVING_WITHIN: Duration = Duration::from_secs(60);

/// Why a zygote was not waited for until it serves (see `Zygote::served_by`).
enum ServedBy {
    Gone,
    /// Not within [`SERVING_WITHIN`] of its start.
    Never,
    /// Not by the cell's deadline.
    Deadline,
}

/// How a cell ended when its zygote vanished before reporting it: the
/// kernel killed every process of the zygote's PID namespace.
const LOST: Reaped = Reaped {
    code: None,
    signal: Some(libc::SIGKILL),
    cpu_ms: 0,
    max_rss_kb: 0,
};

/// One running zygote.
pub(crate) struct Zygote {
    profile: String,
    client: Arc<PoolClient>,
    /// It stopped answering in time (see [`PoolConfig::stall_timeout`]).
    stalled: AtomicBool,
    pid: i32,
    born: Instant,
    cells: AtomicU64,
    in_flight: Arc<AtomicU64>,
    rules: CellRules,
    report: SandboxReport,
    ceiling: Rlimits,
    answer_timeout: Duration,
    stall_timeout: Duration,
    /// Whether its interpreter said `serving`: its preload modules are
    /// imported and it reads spawns (see [`SERVING_WITHIN`]).
    serving: tokio::sync::watch::Receiver<bool>,
}

/// Decrements a zygote's in-flight count when a warm cell is over.
pub(crate) struct InFlight(Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How to start a zygote: the program, the interpreter it runs, how long
/// it may take to answer, and the cgroup it starts in.
struct Launch {
    worker_exe: PathBuf,
    interpreter: String,
    answer_timeout: Duration,
    stall_timeout: Duration,
    cgroup: Option<Arc<crate::sandbox::linux::cgroup::CellCgroup>>,
    /// The profile's package paths and preloaded modules.
    python: crate::profiles::PythonPackages,
    /// The interpreter, and the supervisor's precompiled shim for it (made
    /// on the launcher thread the first time: it runs the interpreter).
    info: crate::PythonInfo,
    shim: Arc<std::sync::OnceLock<Option<crate::supervisor::python::HeldShim>>>,
}

impl Zygote {
    /// Start `worker_exe __zygote`, send it `setup`, wait for `ready`.
    /// Blocking (run it off the async runtime).
    fn start(
        launch: &Launch,
        profile: &str,
        mut plan: SandboxPlan,
        ceiling: Rlimits,
        runtime: tokio::runtime::Handle,
    ) -> Result<Zygote, PoolError> {
        let Launch {
            worker_exe,
            interpreter,
            answer_timeout,
            stall_timeout,
            cgroup,
            python,
            info,
            shim,
        } = launch;
        // Read-only in the zygote's sandbox, and so in its cells' (cold
        // cells are given it too).
        let precompiled = crate::supervisor::python::precompiled_once(shim, info).map(|p| {
            plan.read_only.push(p.clone());
            p.to_string_lossy().into_owned()
        });
        let answer_timeout = *answer_timeout;
        let stall_timeout = *stall_timeout;
        let (ours, theirs) = crate::sandbox::forkserver::seqpacket_pair()
            .map_err(PoolError::io("create the zygote channel"))?;
        let started = crate::sandbox::spawn::start_pool_process(
            worker_exe,
            crate::worker::ZYGOTE_ARG,
            &theirs,
            cgroup.as_ref().map(|c| c.procs_fd()).into_iter().collect(),
            &plan,
        )
        .map_err(PoolError::io("start a Python zygote"))?;
        drop(theirs);
        let pid = started.pid;
        let guard = KillAndReap(pid);
        // Host-side rules, resolved the way the worker resolves them.
        let view = crate::sandbox::linux::view::resolve(&plan)?;
        let host_rules: Vec<_> = crate::sandbox::linux::landlock::rules(&view, false, false)
            .into_iter()
            .filter(|r| r.path != view.scratch && r.path != Path::new("/proc"))
            .collect();
        let setup = ZygoteMsg::Setup {
            interpreter: interpreter.to_owned(),
            plan: Box::new(plan),
            python: python.clone(),
            cloned: started.cloned,
            precompiled,
        };
        zygote::send(ours.as_fd(), &setup, &[])
            .map_err(PoolError::io("send the zygote its setup"))?;
        if !super::warm::readable_within(&ours, answer_timeout) {
            return Err(PoolError::ZygoteNotReady);
        }
        let (report, anchors, fds) = match zygote::recv::<ZygoteMsg>(ours.as_fd(), 1 << 16) {
            Ok(Some((ZygoteMsg::Ready { report, anchors }, fds))) => (report, anchors, fds),
            Ok(Some((ZygoteMsg::SandboxError { layer, message }, _))) => {
                return Err(PoolError::ZygoteLayer { layer, message })
            }
            Ok(Some(_)) => return Err(PoolError::ZygoteSent("an unexpected message")),
            Ok(None) => return Err(PoolError::ZygoteExited),
            Err(e) => return Err(PoolError::io("read the zygote's ready message")(e)),
        };
        if anchors.len() != fds.len() {
            return Err(PoolError::ZygoteSent("a malformed ready message"));
        }
        let mut anchor_rules = Vec::new();
        for (name, fd) in anchors.iter().zip(fds) {
            let (kind, grant) = match name.as_str() {
                "/proc" => (Kind::Dir, Grant::Read),
                "/etc/passwd" | "/etc/group" => (Kind::File, Grant::Read),
                other => return Err(PoolError::UnknownAnchor(other.to_owned())),
            };
            anchor_rules.push((fd, kind, grant));
        }
        let rules = CellRules::prepare(
            &host_rules,
            anchor_rules,
            crate::sandbox::linux::sys::landlock_abi(),
        )
        .map_err(|source| PoolError::Landlock {
            what: "prepare the cells' Landlock rules",
            source,
        })?;
        let client = Arc::new(PoolClient::new(ours, Some(LOST)));
        let reader_fd = client
            .reader_fd()
            .map_err(PoolError::io("share the zygote channel"))?;
        // Replies are read on the runtime: a report wakes the cell waiting
        // for it directly, with no thread in between.
        let reader = {
            let _in_runtime = runtime.enter();
            crate::sandbox::process::watch_readable(reader_fd)
                .map_err(PoolError::io("watch the zygote channel"))?
        };
        std::mem::forget(guard);
        let end = ZygoteEnd {
            client: client.clone(),
            pid,
        };
        // Its sandbox is on; its interpreter now starts and imports what
        // the profile preloads, and says `serving` once it takes spawns.
        let (serves, serving) = tokio::sync::watch::channel(false);
        runtime.spawn(read_loop(reader, end, serves, profile.to_owned()));
        Ok(Zygote {
            profile: profile.to_owned(),
            client,
            stalled: AtomicBool::new(false),
            pid,
            born: Instant::now(),
            cells: AtomicU64::new(0),
            in_flight: Arc::new(AtomicU64::new(0)),
            rules,
            report,
            ceiling,
            answer_timeout,
            stall_timeout,
            serving,
        })
    }

    /// The supervisor's child (see [`ZygoteStatus::pid`]).
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// How long it may take to answer a spawn or report a cell's end.
    fn stall_window(&self) -> Duration {
        self.stall_timeout.min(self.answer_timeout)
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Whether no spawn has waited for its answer longer than a healthy
    /// zygote takes ([`SLOW_ANSWER`]): a moved cell avoids one that may be
    /// stalled too.
    fn answering(&self) -> bool {
        !self.client.waiting_since(SLOW_ANSWER)
    }

    /// Whether a spawn its cell gave up on is unanswered past the window,
    /// or it has not said it serves within [`SERVING_WITHIN`].
    fn overdue(&self) -> bool {
        self.client.overdue(self.stall_window())
            || (!self.serves() && self.born.elapsed() >= SERVING_WITHIN)
    }

    /// Whether it said it serves (see [`SERVING_WITHIN`]).
    fn serves(&self) -> bool {
        *self.serving.borrow()
    }

    /// Wait until it serves (at once if it does), within [`SERVING_WITHIN`]
    /// of its start and by `deadline`. `Ok(true)`: it had to be waited for.
    async fn served_by(&self, deadline: tokio::time::Instant) -> Result<bool, ServedBy> {
        if self.serves() {
            return Ok(false);
        }
        let within = tokio::time::Instant::from_std(self.born + SERVING_WITHIN);
        let mut serving = self.serving.clone();
        let waited = tokio::time::timeout_at(within.min(deadline), async {
            serving.wait_for(|s| *s).await.map(|_| ())
        })
        .await;
        match waited {
            Ok(Ok(())) => Ok(true),
            // Its channel closed: it is gone.
            Ok(Err(_)) => Err(ServedBy::Gone),
            Err(_) if within <= deadline => Err(ServedBy::Never),
            Err(_) => Err(ServedBy::Deadline),
        }
    }

    /// It did not answer `what` in time: it takes no new cells (the pool
    /// replaces it) and is killed once nothing of it is in use (see
    /// `Drop`). Its running cells go on: their outputs and results do not
    /// pass through it.
    pub(crate) fn mark_stalled(&self, what: &str, waited: Duration) {
        if self.stalled.swap(true, Ordering::SeqCst) || self.is_dead() {
            return;
        }
        tracing::warn!(
            target: POOL_LOG,
            profile = %self.profile,
            pid = self.pid,
            waited_ms = waited.as_millis() as u64,
            in_flight = self.in_flight.load(Ordering::SeqCst),
            "Python zygote stalled: it did not answer {what} in time; it takes no more cells and is replaced"
        );
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.client.is_closed()
    }

    fn retired(&self, cfg: &PoolConfig) -> bool {
        self.is_dead()
            || self.is_stalled()
            || self.cells.load(Ordering::SeqCst) >= cfg.max_cells
            || self.born.elapsed() >= cfg.max_age
    }

    fn mark_dead(&self) {
        // The reading task sees EOF, resolves waiters and reaps.
        if self.client.shutdown() {
            let _ = crate::sandbox::process::kill_pid(self.pid);
        }
    }

    /// Whether a cell with these limits fits under the zygote's ceiling.
    pub(crate) fn fits(&self, l: &Rlimits) -> bool {
        let c = &self.ceiling;
        l.memory_bytes <= c.memory_bytes
            && l.max_open_files <= c.max_open_files
            && l.max_file_size_bytes <= c.max_file_size_bytes
            && l.max_processes <= c.max_processes
            && l.cpu_seconds < c.cpu_seconds
    }

    /// The sandbox report of a cell forked from this zygote: the zygote's
    /// layers plus what each child adds.
    pub(crate) fn cell_report(&self) -> SandboxReport {
        let mut r = self.report.clone();
        for l in &mut r.layers {
            let extra = match Layer::from_name(&l.name) {
                Some(Layer::Hygiene) => "; warm: forked from a Python zygote, own session, fds 0-3 only",
                Some(Layer::Rlimits) => "; per-cell limits set in the cell's own process",
                Some(Layer::Landlock) => "; nested per-cell domain: own scratch dir only, signals and abstract sockets scoped",
                Some(Layer::Seccomp) => "; per-cell filter stacked on the zygote's",
                _ => "",
            };
            l.detail.push_str(extra);
        }
        r
    }

    /// Fork one cell with these fds as its 3 (protocol), 1 and 2, waiting
    /// for the zygote's answer until its stall window ends or `deadline`
    /// (the cell's), whichever comes first.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        sock: OwnedFd,
        (out, err): (OwnedFd, OwnedFd),
        setup: zygote::CellSetup,
        join: &[std::os::fd::BorrowedFd<'_>],
        deadline: tokio::time::Instant,
    ) -> Result<(i32, OwnedFd, InFlight), SpawnError> {
        let scratch = Path::new(&setup.scratch);
        use SpawnError::Failed;
        if self.is_dead() {
            return Err(Failed(PoolError::ZygoteNotRunning));
        }
        // Found stalled since the cell was given it: the cell moves.
        if self.is_stalled() {
            return Err(SpawnError::Stalled(PoolError::ZygoteStalled(self.pid)));
        }
        let ruleset = self.rules.ruleset(scratch).map_err(|source| {
            Failed(PoolError::Landlock {
                what: "build the cell's Landlock ruleset",
                source,
            })
        })?;
        self.cells.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight(self.in_flight.clone());
        let state = setup.state;
        // The cell's own data goes in a pipe only the forked child reads.
        let setup = zygote::setup_pipe(&setup)
            .map_err(|e| Failed(PoolError::io("pass the cell its setup")(e)))?;
        let asked = Instant::now();
        let sent = {
            // After the cell's five, the cgroup `tasks` files the child
            // joins itself (see `join` in zygote.py): a thread moving
            // itself skips the kernel's global lock that moving another
            // process by its pid takes, whose wait is a whole RCU grace
            // period (most of a warm cell) when the lock was idle.
            let mut fds = vec![
                sock.as_fd(),
                out.as_fd(),
                err.as_fd(),
                ruleset.as_fd(),
                setup.as_fd(),
            ];
            fds.extend_from_slice(join);
            self.client
                .request(|id| ZygoteMsg::Spawn { id, state }, &fds)
        };
        drop((sock, out, err, ruleset, setup));
        let (id, rx) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                self.mark_dead();
                return Err(Failed(PoolError::io("reach the Python zygote")(e)));
            }
        };
        // One still importing its preload modules reads the spawn once it
        // serves: the window for its answer starts then, so that the
        // imports are never taken for a stall.
        let asked = match self.served_by(deadline).await {
            Ok(false) => asked,
            Ok(true) => Instant::now(),
            Err(why) => {
                // Not an unanswered spawn (see `overdue`): whether it is
                // stalled is its start's to tell.
                self.client.give_up(id, None);
                let waited = asked.elapsed();
                return Err(match why {
                    ServedBy::Gone => Failed(PoolError::ZygoteGone),
                    ServedBy::Never => {
                        self.mark_stalled("its start (it did not say it serves)", waited);
                        SpawnError::Stalled(PoolError::ZygoteNotServing(SERVING_WITHIN.as_secs()))
                    }
                    ServedBy::Deadline => SpawnError::Deadline(PoolError::ZygoteDeadline {
                        pid: self.pid,
                        waited_ms: waited.as_millis(),
                    }),
                });
            }
        };
        let window = self.stall_window();
        let stall_at = tokio::time::Instant::from_std(asked) + window;
        match tokio::time::timeout_at(stall_at.min(deadline), rx).await {
            Ok(Ok(Ok(spawned))) => {
                let mut fds = spawned.fds;
                match (fds.pop(), fds.is_empty()) {
                    (Some(pidfd), true) => Ok((spawned.pid, pidfd, in_flight)),
                    (pidfd, _) => {
                        // Not a child the cell can use: it must not run.
                        if let Some(pidfd) = &pidfd {
                            let _ = crate::sandbox::process::pidfd_kill(pidfd.as_fd());
                        }
                        Err(Failed(PoolError::ZygoteSent("a malformed spawned message")))
                    }
                }
            }
            Ok(Ok(Err(refused))) => Err(Failed(PoolError::ZygoteFork(refused.0))),
            Ok(Err(_)) => Err(Failed(PoolError::ZygoteGone)),
            Err(_) => {
                let waited = asked.elapsed();
                if stall_at <= deadline {
                    self.client.give_up(id, None);
                    self.mark_stalled("a spawn", waited);
                    Err(SpawnError::Stalled(PoolError::ZygoteNoAnswer {
                        pid: self.pid,
                        waited_ms: waited.as_millis(),
                    }))
                } else {
                    // Not a fair trial of the zygote: the next cell asking
                    // for it checks whether this answer is overdue.
                    self.client.give_up(id, Some(asked));
                    Err(SpawnError::Deadline(PoolError::ZygoteDeadline {
                        pid: self.pid,
                        waited_ms: waited.as_millis(),
                    }))
                }
            }
        }
    }

    /// How child `pid` ended (resolves once the zygote reaped it, or at
    /// once with SIGKILL if the zygote is gone).
    pub(crate) fn exit_of(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        self.client.exit_of(pid)
    }

    fn status(&self) -> ZygoteStatus {
        ZygoteStatus {
            profile: self.profile.clone(),
            pid: self.pid,
            cells: self.cells.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            age_ms: self.born.elapsed().as_millis() as u64,
            alive: !self.is_dead() && !self.is_stalled(),
            serving: self.serves(),
            stalled: self.is_stalled(),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Shut the socket down (the reading task holds a second fd), so the
        // zygote sees EOF, kills its cells and exits; the reader reaps it.
        let was_open = self.client.shutdown();
        // A stalled one may never read that EOF: its last cell is over, so
        // it is killed (its PID namespace with it); the reader then sees
        // the channel close and reaps it.
        if self.is_stalled() && was_open {
            tracing::info!(
                target: POOL_LOG,
                profile = %self.profile,
                pid = self.pid,
                "stalled Python zygote killed: none of its cells is left"
            );
            let _ = crate::sandbox::process::kill_pid(self.pid);
        }
    }
}

impl super::warm::ForkingParent for Zygote {
    fn name(&self) -> &'static str {
        "the Python zygote"
    }

    fn forget(&self, pid: i32) {
        self.client.forget(pid);
    }

    fn report_within(&self) -> Duration {
        // A stalled one is not waited for (it may still answer at once).
        if self.is_stalled() {
            return STALLED_REPORT_WITHIN.min(self.stall_window());
        }
        self.stall_window()
    }

    fn stalled(&self, what: &str, waited: Duration) {
        self.mark_stalled(what, waited);
    }
}

/// Cleans up after a zygote once its channel is closed (or talks nonsense),
/// or when the reading task is dropped with its runtime: waiters learn the
/// cell was lost, the zygote is killed and reaped.
struct ZygoteEnd {
    client: Arc<PoolClient>,
    pid: i32,
}

impl Drop for ZygoteEnd {
    fn drop(&mut self) {
        let _ = crate::sandbox::process::kill_pid(self.pid);
        self.client.close();
        let _ = crate::sandbox::process::reap(self.pid);
    }
}

async fn read_loop(
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    end: ZygoteEnd,
    serves: tokio::sync::watch::Sender<bool>,
    profile: String,
) {
    let pid = end.pid;
    // Anything but the envelope and one `serving` (with no fds) from a
    // zygote is a protocol violation: it is replaced.
    let serving = |m: ZygoteMsg, fds: Vec<OwnedFd>| {
        let first = matches!(m, ZygoteMsg::Serving) && fds.is_empty() && !serves.send_replace(true);
        if first {
            tracing::debug!(target: POOL_LOG, profile = %profile, pid, "Python zygote started");
        }
        first
    };
    end.client.read::<ZygoteMsg>(&fd, 4096, serving).await;
    // `end` cleans up (on a blocking thread: reaping waits).
    let _ = tokio::task::spawn_blocking(move || drop(end)).await;
}

type Job = Box<dyn FnOnce() + Send>;

/// The pools of one supervisor.
pub(crate) struct Pools {
    pub(crate) config: PoolConfig,
    /// Zygotes are started from this one long-lived thread: a process's
    /// parent-death signal fires when the *thread* that forked it ends, so
    /// a zygote forked from a short-lived (blocking-pool) thread would be
    /// killed when that thread retires. The thread ends with the pools, and
    /// the zygotes with it.
    launcher: Mutex<std::sync::mpsc::Sender<Job>>,
    /// The supervisor's scratch root (it outlives the pools).
    root: PathBuf,
    zygotes: tokio::sync::Mutex<BTreeMap<String, Vec<Arc<Zygote>>>>,
    next: AtomicUsize,
}

impl Pools {
    pub(crate) fn new(config: PoolConfig, root: PathBuf) -> Result<Pools, std::io::Error> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("cellbox-zygotes".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        Ok(Pools {
            config,
            launcher: Mutex::new(tx),
            root,
            zygotes: tokio::sync::Mutex::new(BTreeMap::new()),
            next: AtomicUsize::new(0),
        })
    }

    /// The pool scratch root (see the module docs).
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// A live zygote for `profile`, starting or replacing zygotes as needed.
    /// `running`: a cell moved off a stalled zygote takes one that runs
    /// already when there is one (the pool is refilled behind it, see
    /// [`Pools::fill`]), rather than wait for a new one to start.
    pub(crate) async fn get(
        &self,
        sup: &Inner,
        profile: &str,
        running: bool,
    ) -> Result<Arc<Zygote>, PoolError> {
        let mut map = self.zygotes.lock().await;
        let slot = map.entry(profile.to_owned()).or_default();
        self.prune(slot);
        let size = self.config.size.max(1);
        // A moved cell takes a running zygote that answers when there is
        // one, else a new one (the pool size allowing).
        if running {
            let answering = (0..slot.len())
                .filter(|&k| slot[k].answering() && slot[k].serves())
                .min_by_key(|&k| slot[k].in_flight.load(Ordering::SeqCst));
            if let Some(k) = answering {
                return Ok(slot[k].clone());
            }
        }
        if slot.len() < size {
            // Start one now; the rest of the pool fills on later calls.
            let z = self.start_one(sup, profile).await?;
            slot.push(Arc::new(z));
            return slot.last().cloned().ok_or(PoolError::NoZygote);
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % slot.len();
        // The least busy of those that serve and answer (one still
        // importing its preload modules keeps a spawn waiting; one keeping
        // a spawn waiting otherwise may be stalling), starting from a
        // rotating index.
        let best = (0..slot.len())
            .map(|k| (i + k) % slot.len())
            .min_by_key(|&k| {
                (
                    !slot[k].serves(),
                    !slot[k].answering(),
                    slot[k].in_flight.load(Ordering::SeqCst),
                )
            })
            .unwrap_or(i);
        Ok(slot[best].clone())
    }

    /// Start every zygote of `profile` now; returns once each serves (its
    /// preload modules imported), or within [`SERVING_WITHIN`].
    pub(crate) async fn fill(&self, sup: &Inner, profile: &str) -> Result<(), PoolError> {
        let started = {
            let mut map = self.zygotes.lock().await;
            let slot = map.entry(profile.to_owned()).or_default();
            self.prune(slot);
            while slot.len() < self.config.size.max(1) {
                let z = self.start_one(sup, profile).await?;
                slot.push(Arc::new(z));
            }
            slot.clone()
        };
        // Waited for with the pool free: a cell may meanwhile take one
        // that serves already.
        for z in started {
            let by = tokio::time::Instant::from_std(z.born + SERVING_WITHIN);
            match z.served_by(by).await {
                Ok(_) => {}
                // A zygote that is gone before it served died starting its
                // interpreter or importing its preload modules: the next
                // one would most likely too.
                Err(ServedBy::Gone) => return Err(PoolError::ZygoteDiedStarting { pid: z.pid }),
                Err(ServedBy::Never | ServedBy::Deadline) => {
                    return Err(PoolError::ZygoteNotServing(SERVING_WITHIN.as_secs()))
                }
            }
        }
        Ok(())
    }

    /// Drop the zygotes that are done for from `slot`, saying why.
    fn prune(&self, slot: &mut Vec<Arc<Zygote>>) {
        let cfg = &self.config;
        slot.retain(|z| {
            if !z.is_dead() && !z.is_stalled() && z.overdue() {
                z.mark_stalled("a spawn its cell gave up on", z.stall_window());
            }
            if !z.retired(cfg) {
                return true;
            }
            let cells = z.cells.load(Ordering::SeqCst);
            let age_ms = z.born.elapsed().as_millis() as u64;
            let in_flight = z.in_flight.load(Ordering::SeqCst);
            use crate::metrics::{Pool, Restart};
            let why = if z.is_stalled() {
                Restart::Stalled
            } else if z.is_dead() {
                Restart::Dead
            } else {
                Restart::Retired
            };
            crate::metrics::get().pool_restart(Pool::PythonZygote, why);
            if z.is_stalled() {
                tracing::warn!(
                    target: POOL_LOG,
                    profile = %z.profile,
                    pid = z.pid,
                    in_flight,
                    "stalled Python zygote removed from the pool; a new one replaces it"
                );
            } else if z.is_dead() {
                tracing::warn!(
                    target: POOL_LOG,
                    profile = %z.profile,
                    pid = z.pid,
                    cells,
                    age_ms,
                    "Python zygote found dead; a new one replaces it"
                );
            } else {
                let why = if cells >= cfg.max_cells {
                    "cell count"
                } else {
                    "age"
                };
                tracing::debug!(
                    target: POOL_LOG,
                    profile = %z.profile,
                    pid = z.pid,
                    cells,
                    age_ms,
                    "Python zygote retired (its {why}); a new one replaces it"
                );
            }
            false
        });
    }

    async fn start_one(&self, sup: &Inner, profile_name: &str) -> Result<Zygote, PoolError> {
        let py = sup.python()?.clone();
        let profile = crate::profiles::Profile::load(profile_name)?;
        let mut ceiling = self.config.ceiling;
        // With a pids cgroup per cell and per session, RLIMIT_NPROC (shared
        // by every cell of the zygote's user namespace) is lifted: one
        // session's processes must not stop another's.
        if sup.groups.is_some() {
            ceiling.max_processes = u64::MAX;
        }
        let mut plan = SandboxPlan::new(&profile, self.root().to_path_buf(), ceiling);
        plan.read_only.extend(py.read_only.iter().cloned());
        plan.read_only.extend(profile.python.paths.iter().cloned());
        plan.exec.push(py.executable.clone());
        *plan.seccomp = zygote::zygote_seccomp(&plan.seccomp);
        let launch = Launch {
            worker_exe: sup.worker_exe.clone(),
            interpreter: py.executable.to_string_lossy().into_owned(),
            answer_timeout: self.config.answer_timeout,
            stall_timeout: self.config.stall_timeout,
            cgroup: match profile.layers.cgroup {
                crate::profiles::LayerMode::Off => None,
                mode => sup.cgroup_for(mode).map(|_| sup.cells_cgroup.clone())?,
            },
            python: profile.python.clone(),
            info: py.clone(),
            shim: sup.shim.clone(),
        };
        let name = profile_name.to_owned();
        let runtime = tokio::runtime::Handle::current();
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(Zygote::start(&launch, &name, plan, ceiling, runtime));
        });
        lock(&self.launcher)
            .send(job)
            .map_err(|_| PoolError::LauncherGone)?;
        let z = rx
            .await
            .map_err(|_| PoolError::LauncherGone)?
            .inspect_err(|e| {
                tracing::warn!(target: POOL_LOG, profile = %profile_name, "a Python zygote failed to start: {e}");
            })?;
        // "started" is logged once it serves (see `read_loop`).
        tracing::debug!(target: POOL_LOG, profile = %profile_name, pid = z.pid, "Python zygote sandboxed; its interpreter starts");
        Ok(z)
    }

    pub(crate) async fn status(&self) -> Vec<ZygoteStatus> {
        let map = self.zygotes.lock().await;
        map.values().flatten().map(|z| z.status()).collect()
    }
}

/// Whether cells of `language` under this scratch dir can be forked from a
/// zygote of `pools`.
pub(crate) fn eligible(pools: &Pools, language: Language, scratch: &Path) -> bool {
    language == Language::Python && scratch.starts_with(pools.root()) && scratch != pools.root()
}

/// Give a cell's scratch dir to the sandbox uid, mode 0700 (as the worker's
/// hygiene layer does for a cold cell).
pub(crate) fn prepare_scratch(scratch: &Path, uid: u32, gid: u32) -> Result<(), PoolError> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |what| {
        move |source| PoolError::Scratch {
            what,
            dir: scratch.to_path_buf(),
            source,
        }
    };
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::lchown(scratch, Some(uid), Some(gid)).map_err(failed("chown"))?;
    }
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o700))
        .map_err(failed("chmod"))
}
