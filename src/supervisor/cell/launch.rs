//! How a cell's worker is started: forked from the warm Rhai fork server,
//! forked from a Python zygote, a fresh worker of its own, or a fresh
//! worker under `sandbox-exec` (macOS).

use super::conversation::Handshake;
use super::{plan, profile_name, CellSpec};
use crate::protocol::Backend;
use crate::sandbox::{process, spawn, SandboxPlan};
use crate::supervisor::result::{CellResult, ErrorKind};
use crate::supervisor::tenancy::CellGroup;
use crate::supervisor::warm::ForkFor;
use crate::supervisor::{Inner, Language};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

/// Why a cell's worker could not be started.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // some variants: Linux-only paths
pub(crate) enum LaunchError {
    /// A system call on the way failed (`what` says which, as "failed to
    /// ..." reads it).
    #[error("failed to {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to start the worker {}: {source}", exe.display())]
    Spawn {
        exe: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to start the worker with {}: {source}", launcher.display())]
    SpawnWith {
        launcher: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker's output pipes are missing")]
    MissingPipes,
    #[error(transparent)]
    Profile(#[from] crate::profiles::ProfileError),
    #[error(transparent)]
    Python(#[from] crate::supervisor::python::PythonError),
    #[error(transparent)]
    Program(#[from] crate::supervisor::ProgramError),
    #[error(transparent)]
    CgroupRequired(#[from] crate::supervisor::CgroupRequired),
    #[error(transparent)]
    Group(#[from] crate::supervisor::tenancy::GroupError),
    #[error(transparent)]
    Pool(#[from] crate::supervisor::warm::PoolError),
    #[error(transparent)]
    SandboxExec(#[from] crate::macos::launch::LaunchError),
    /// A live session's cell could not be forked from its state process.
    #[error("{0}")]
    Live(String),
    #[error("the {0} has no cgroup")]
    NoCgroup(&'static str),
    #[error("no Python zygote is available")]
    NoZygote,
    #[error("the cell's process {0} is not among the session's")]
    NotInSession(i32),
}

impl LaunchError {
    /// A `map_err` for a failed system call: "failed to {what}: {e}".
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> LaunchError {
        move |source| LaunchError::Io { what, source }
    }
}

/// The way a cell's worker starts.
pub(super) enum Launch {
    /// Forked from the warm Rhai fork server: a Rhai cell of the server's
    /// profile arrives sandboxed by the server's plan and says `ready` by
    /// itself (no plan, no scratch dir). A fresh worker if the server died.
    ForkServer(Arc<crate::supervisor::warm::ForkServer>),
    /// Forked from a zygote of its profile's Python pool when it can be
    /// warm (arrives ready), else a fresh worker.
    #[cfg(target_os = "linux")]
    Zygote,
    /// A fresh worker of its own (`setup`, then `ready`).
    Fresh,
    /// A fresh worker started by this `sandbox-exec` under the SBPL policy
    /// of its profile (see [`crate::macos`]).
    SandboxExec(std::path::PathBuf),
}

impl Launch {
    /// The way that fits `spec`.
    pub(super) async fn pick(sup: &Arc<Inner>, spec: &CellSpec) -> Launch {
        if let Some(launcher) = &sup.sandbox_exec {
            return Launch::SandboxExec(launcher.clone());
        }
        match spec.language {
            Language::Rhai => {
                let name = profile_name(sup, spec);
                match sup.fork_server().await.filter(|fs| fs.profile == name) {
                    Some(fs) => Launch::ForkServer(fs),
                    None => Launch::Fresh,
                }
            }
            #[cfg(target_os = "linux")]
            Language::Python => Launch::Zygote,
            _ => Launch::Fresh,
        }
    }

    /// Start the cell's worker in `group`. `None`: the cell ended before
    /// it started (`result` says how).
    /// `now`: whether the cell runs now or its code comes later (see
    /// `super::prepared`).
    pub(super) async fn start(
        self,
        sup: &Arc<Inner>,
        spec: &CellSpec,
        result: &mut CellResult,
        started: Instant,
        now: ForkFor,
        group: Option<Arc<CellGroup>>,
    ) -> Result<Option<Launched>, LaunchError> {
        let deadline = started + spec.limits.timeout();
        if let Launch::ForkServer(fs) = &self {
            let deadline_t = tokio::time::Instant::from_std(deadline);
            let limits = &spec.limits.rlimits;
            match start_forked(fs, limits, deadline_t, group.as_deref(), now).await {
                Ok((worker, sock)) => {
                    return Ok(Some(Launched {
                        #[cfg(target_os = "linux")]
                        probe: probe(spec, &worker),
                        started: worker,
                        sock,
                        backend: Backend::Rhai,
                        plan: None,
                        handshake: Handshake::SelfReady,
                        group,
                        preloaded: None,
                    }));
                }
                // Its deadline came while it waited: say so, with the real
                // time.
                Err(e) if Instant::now() >= deadline => {
                    stalled_timeout(result, spec, started, &e.to_string());
                    return Ok(None);
                }
                // It died or stalled under us (the next cell starts a new
                // one): this cell runs in a fresh worker instead.
                Err(e) if fs.is_dead() => {
                    tracing::warn!(
                        target: crate::supervisor::warm::POOL_LOG,
                        run_id = %spec.run.run_id,
                        "the fork server is gone ({e}); cell moved to a cold worker"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let (backend, plan) = match plan::backend_for(sup, spec) {
            Ok(b) => b,
            Err(e) => {
                result.fail_with(ErrorKind::SandboxError, e.to_string());
                return Ok(None);
            }
        };
        let g = group.as_deref();
        let launched = match self {
            #[cfg(target_os = "linux")]
            Launch::Zygote => {
                let times = (started, deadline);
                launch_python(sup, spec, &plan, result, times, g, now).await?
            }
            Launch::ForkServer(_) | Launch::Fresh => Some(start_cold(sup, spec, &plan, g)?),
            Launch::SandboxExec(launcher) => Some(start_seatbelt(sup, &plan, &launcher)?),
        };
        let Some((worker, sock, handshake)) = launched else {
            return Ok(None);
        };
        Ok(Some(Launched {
            #[cfg(target_os = "linux")]
            probe: probe(spec, &worker),
            started: worker,
            sock,
            backend,
            plan: Some(plan),
            handshake,
            group,
            preloaded: None,
        }))
    }
}

/// A worker that is started and the supervisor's end of its protocol
/// socket, and how it becomes ready.
type Start3 = (Started, std::os::unix::net::UnixStream, Handshake);

/// Start the cell in a fresh worker of its own.
fn start_cold(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    group: Option<&CellGroup>,
) -> Result<Start3, LaunchError> {
    let (sup_sock, worker_sock) = socket_pair()?;
    let s = start_direct(sup, spec, plan, worker_sock.into(), group)?;
    Ok((s, sup_sock, Handshake::Setup))
}

/// How many zygotes a Python cell tries before it runs cold: the one it
/// was given and, if that one stalled, one more.
#[cfg(target_os = "linux")]
const ZYGOTE_TRIES: usize = 2;

/// Start a Python cell: forked from a zygote of its pool when it can be
/// warm; moved to another zygote (a fresh one if need be) when one stalls;
/// else, or when no zygote answers, in a fresh worker; all within the
/// cell's deadline. `None`: the deadline came first (`result` says so).
/// `times`: when the cell started and its deadline.
#[cfg(target_os = "linux")]
async fn launch_python(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    result: &mut CellResult,
    (started, deadline): (Instant, Instant),
    group: Option<&CellGroup>,
    now: ForkFor,
) -> Result<Option<Start3>, LaunchError> {
    use crate::supervisor::warm::POOL_LOG;
    use crate::supervisor::zygote::SpawnError;
    let deadline_t = tokio::time::Instant::from_std(deadline);
    if let Some(live) = &spec.live {
        match start_live(sup, spec, plan, live, deadline_t, group).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) => live.note(format!(
                "the cell ran without the session's live namespace ({e}): only its JSON variables and definitions were replayed"
            )),
        }
    }
    // The stalled zygote the cell moved from, if it did.
    let mut moved_from: Option<i32> = None;
    for _ in 0..ZYGOTE_TRIES {
        let z = match tokio::time::timeout_at(
            deadline_t,
            warm_python(sup, spec, plan, moved_from.is_some()),
        )
        .await
        {
            Ok(Some(z)) => z,
            Ok(None) => break,
            Err(_) => {
                stalled_timeout(
                    result,
                    spec,
                    started,
                    "no Python zygote was ready for it in time",
                );
                return Ok(None);
            }
        };
        let (sup_sock, worker_sock) = socket_pair()?;
        match start_zygote(&z, worker_sock.into(), plan, deadline_t, group, now).await {
            Ok(s) => {
                if let Some(from) = moved_from {
                    tracing::info!(
                        target: POOL_LOG,
                        run_id = %spec.run.run_id,
                        from,
                        to = z.pid(),
                        "cell moved from a stalled Python zygote to another"
                    );
                }
                return Ok(Some((s, sup_sock, Handshake::PreReady(z.cell_report()))));
            }
            Err(SpawnError::Stalled(e)) => {
                tracing::warn!(
                    target: POOL_LOG,
                    run_id = %spec.run.run_id,
                    "{e}; moving the cell"
                );
                moved_from = Some(z.pid());
                refill(sup, profile_name(sup, spec));
            }
            Err(SpawnError::Deadline(e)) => {
                stalled_timeout(result, spec, started, &e.to_string());
                return Ok(None);
            }
            Err(SpawnError::Failed(e)) => {
                tracing::warn!(
                    target: POOL_LOG,
                    run_id = %spec.run.run_id,
                    "warm Python cell failed to start ({e}); running it cold"
                );
                break;
            }
        }
    }
    if let Some(from) = moved_from {
        if Instant::now() >= deadline {
            let e =
                format!("the Python zygotes it was given (the last, pid {from}) did not answer");
            stalled_timeout(result, spec, started, &e);
            return Ok(None);
        }
        tracing::warn!(
            target: POOL_LOG,
            run_id = %spec.run.run_id,
            from,
            "cell moved from a stalled Python zygote to a cold worker"
        );
    }
    start_cold(sup, spec, plan, group).map(Some)
}

/// Start the zygotes a pool lacks, in the background (a stalled one was
/// dropped from it).
#[cfg(target_os = "linux")]
fn refill(sup: &Arc<Inner>, profile: String) {
    let sup = sup.clone();
    tokio::spawn(async move {
        if let Some(pools) = sup.pools.as_ref() {
            if let Err(e) = pools.fill(&sup, &profile).await {
                tracing::warn!(
                    target: crate::supervisor::warm::POOL_LOG,
                    profile = %profile,
                    "failed to replace a stalled Python zygote: {e}"
                );
            }
        }
    });
}

/// The cell's deadline came before it started, while it waited for a warm
/// parent (`why`): a timeout that says so, with the real time it took.
fn stalled_timeout(result: &mut CellResult, spec: &CellSpec, started: Instant, why: &str) {
    result.fail_with(
        ErrorKind::Timeout,
        format!(
            "the cell reached its wall-clock limit of {} ms after {} ms, before it started: {why}",
            spec.limits.timeout_ms,
            started.elapsed().as_millis()
        ),
    );
}

/// A started worker and how to talk to it.
pub(super) struct Launched {
    pub(super) started: Started,
    pub(super) sock: std::os::unix::net::UnixStream,
    pub(super) backend: Backend,
    /// The plan for its `setup` frame (none when it needs no setup).
    pub(super) plan: Option<SandboxPlan>,
    pub(super) handshake: Handshake,
    /// The cgroup its processes are in, when there is one.
    pub(super) group: Option<Arc<CellGroup>>,
    /// What its worker uses, read when it says `done` (see `end::at_done`).
    #[cfg(target_os = "linux")]
    pub(super) probe: Option<process::Probe>,
    /// The variables sent ahead to it (a worker started ahead; see
    /// `prepared::preload`), known by identity only: weak, so that the
    /// session changing its namespace (`Session::set_var`) while this
    /// worker waits moves it rather than copying it whole; the namespace
    /// it then holds is another, and this worker's is stale.
    pub(super) preloaded: Option<std::sync::Weak<crate::supervisor::Namespace>>,
}

/// The probe of a worker whose cell may be answered at its `done`, taken
/// as it is started (for a worker started ahead, before its cell comes);
/// none for a live session's cell, which is not answered there.
#[cfg(target_os = "linux")]
fn probe(spec: &CellSpec, worker: &Started) -> Option<process::Probe> {
    if spec.live.is_some() {
        return None;
    }
    worker.exit.as_ref().ok()?.probe()
}

/// How the worker's end is learned.
pub(super) enum Reap {
    /// Our own child: wait4 it.
    Direct,
    /// A child of the fork server or a Python zygote: its parent reports it.
    Parent(
        Arc<dyn crate::supervisor::warm::ForkingParent>,
        tokio::sync::oneshot::Receiver<process::Reaped>,
    ),
}

pub(super) struct Started {
    pub(super) pid: i32,
    pub(super) exit: std::io::Result<process::ExitWatch>,
    pub(super) guard: process::KillOnDrop,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
    pub(super) reap: Reap,
    /// Held while the cell runs, dropped once it is reaped (a zygote's
    /// in-flight count; a fork-server spare's replacement).
    pub(super) in_flight: Option<Box<dyn Send>>,
}

/// The zygote to fork this Python cell from, if it can be warm: warm
/// workers on, its scratch dir beneath the pool root, its limits under the
/// pool's ceiling, and a zygote that starts.
#[cfg(target_os = "linux")]
async fn warm_python(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    running: bool,
) -> Option<Arc<crate::supervisor::zygote::Zygote>> {
    let pools = sup.pools.as_ref()?;
    if !crate::supervisor::zygote::eligible(pools, spec.language, &plan.scratch) {
        return None;
    }
    let profile = profile_name(sup, spec);
    let z = match pools.get(sup, &profile, running).await {
        Ok(z) => z,
        Err(e) => {
            tracing::warn!(
                target: crate::supervisor::warm::POOL_LOG,
                "Python zygote unavailable, running the cell cold: {e}"
            );
            return None;
        }
    };
    z.fits(&plan.limits).then_some(z)
}

/// Fork the cell from its session's state process (started now, from a
/// zygote, if the session has none).
#[cfg(target_os = "linux")]
async fn start_live(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    live: &crate::supervisor::live::LiveCell,
    deadline: tokio::time::Instant,
    group: Option<&CellGroup>,
) -> Result<Start3, LaunchError> {
    use crate::supervisor::live::{host_pid, StateProc};
    use crate::util::lock;
    use std::sync::atomic::Ordering::SeqCst;
    // The cell runs in the session's group, beside its state processes,
    // not in the cell's own (see `LiveCell::end_others`): a move by pid
    // costs the kernel's global cgroup lock.
    group.ok_or(LaunchError::NoCgroup("cell"))?;
    let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
    let session = spec
        .share
        .session(sup, asked)
        .ok_or(LaunchError::NoCgroup("session"))?;
    let mut limits = plan.limits;
    // The session's pids cgroup bounds its processes (not RLIMIT_NPROC,
    // which counts every cell's: see `start_zygote`).
    limits.max_processes = u64::MAX;
    let current = lock(&live.state).clone().filter(|s| !s.is_dead());
    let state = match current {
        Some(s) => s,
        None => {
            let z = warm_python(sup, spec, plan, false)
                .await
                .ok_or(LaunchError::NoZygote)?;
            crate::supervisor::zygote::prepare_scratch(&plan.scratch, plan.uid, plan.gid)?;
            let s = StateProc::start(z, &plan.scratch, &limits, &session, deadline)
                .await
                .map_err(LaunchError::Live)?;
            live.fresh.store(true, SeqCst);
            *lock(&live.state) = Some(s.clone());
            s
        }
    };
    let (sup_sock, worker_sock) = socket_pair()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // Its process bound, on the session's group for the cell's time (the
    // session's own bound is put back when it ends).
    let held = 1 + live.checkpoints.len() as u64;
    session.bound_live_cell(
        held,
        crate::supervisor::tenancy::cell_processes(&spec.limits),
    )?;
    let cell = state
        .run((worker_sock.into(), out_w, err_w), &limits, deadline)
        .await
        .map_err(LaunchError::Live)?;
    let ns_pid = cell.ns_pid;
    *lock(&live.next) = Some(cell.next);
    let rx = state.exit_of(ns_pid);
    let (host, pidfd) = match cell.found {
        // A spare, found among the session's processes when it was forked.
        Some(found) => found,
        None => {
            let host =
                host_pid(session.pids_path(), ns_pid).ok_or(LaunchError::NotInSession(ns_pid))?;
            // Checked to be the session's once opened: the process found
            // by pid may have ended, and its pid gone to another.
            let pidfd = crate::sandbox::linux::groups::open_member(session.pids_path(), host)
                .map_err(|_| LaunchError::NotInSession(ns_pid))?;
            (host, pidfd)
        }
    };
    // Most often the session's next state process (see `LiveCell::take_over`).
    *lock(&live.cell) = pidfd.try_clone().ok().map(|fd| (ns_pid, host, fd));
    let guard = process::KillOnDrop::pidfd(
        pidfd
            .try_clone()
            .map_err(LaunchError::io("keep the worker's pidfd"))?,
    );
    live.running.store(true, SeqCst);
    let report = state.zygote().cell_report();
    let started = Started {
        pid: ns_pid,
        exit: process::ExitWatch::from_pidfd(pidfd),
        guard,
        stdout: out_r,
        stderr: err_r,
        reap: Reap::Parent(state, rx),
        in_flight: None,
    };
    Ok((started, sup_sock, Handshake::PreReady(report)))
}

/// Fork the cell from a Python zygote (`now`: whether its code comes now
/// or later).
#[cfg(target_os = "linux")]
async fn start_zygote(
    z: &Arc<crate::supervisor::zygote::Zygote>,
    worker_fd: OwnedFd,
    plan: &SandboxPlan,
    deadline: tokio::time::Instant,
    group: Option<&CellGroup>,
    now: ForkFor,
) -> Result<Started, crate::supervisor::zygote::SpawnError> {
    use crate::supervisor::warm::PoolError;
    use crate::supervisor::zygote::SpawnError::Failed;
    crate::supervisor::zygote::prepare_scratch(&plan.scratch, plan.uid, plan.gid)
        .map_err(Failed)?;
    let pipe = || {
        crate::sandbox::compat::pipe_cloexec()
            .map_err(|e| Failed(PoolError::io("create an output pipe")(e)))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let mut limits = plan.limits;
    if group.is_some() {
        // The cell's pids cgroup bounds its processes. RLIMIT_NPROC would
        // count every cell of the zygote's user namespace together, so that
        // one session's processes could stop another's from forking.
        limits.max_processes = u64::MAX;
    }
    // The child joins its cgroup itself, before it reads its setup (so
    // before it is sent any code); one that cannot exits.
    let join: Vec<std::os::fd::BorrowedFd<'_>> =
        group.map(CellGroup::join_borrowed).unwrap_or_default();
    let (pid, pidfd, in_flight) = z
        .spawn(
            worker_fd,
            (out_w, err_w),
            crate::sandbox::zygote::CellSetup {
                scratch: plan.scratch.to_string_lossy().into_owned(),
                rlimits: limits,
                state: false,
                waits: now == ForkFor::AheadIdle,
            },
            &join,
            deadline,
        )
        .await?;
    let guard = process::KillOnDrop::pidfd(
        pidfd
            .try_clone()
            .map_err(|e| Failed(PoolError::io("keep the worker's pidfd")(e)))?,
    );
    let rx = z.exit_of(pid);
    Ok(Started {
        pid,
        exit: process::ExitWatch::from_pidfd(pidfd),
        guard,
        stdout: out_r,
        stderr: err_r,
        reap: Reap::Parent(z.clone(), rx),
        in_flight: Some(Box::new(in_flight)),
    })
}

#[cfg(target_os = "linux")]
fn pipe() -> Result<(OwnedFd, OwnedFd), LaunchError> {
    crate::sandbox::compat::pipe_cloexec().map_err(LaunchError::io("create an output pipe"))
}

/// The protocol socket: the supervisor's end and the worker's.
fn socket_pair() -> Result<
    (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ),
    LaunchError,
> {
    std::os::unix::net::UnixStream::pair()
        .map_err(LaunchError::io("create the protocol socket pair"))
}

/// Take a sandboxed worker from the warm fork server (a spare when one
/// fits). Returns it and the supervisor's end of its protocol socket.
async fn start_forked(
    fs: &Arc<crate::supervisor::warm::ForkServer>,
    limits: &crate::plan::Rlimits,
    deadline: tokio::time::Instant,
    group: Option<&CellGroup>,
    now: ForkFor,
) -> Result<(Started, std::os::unix::net::UnixStream), LaunchError> {
    // A child joins its cgroup itself before it runs anything.
    let join: Vec<std::os::fd::BorrowedFd<'_>> =
        group.map(CellGroup::join_borrowed).unwrap_or_default();
    let (f, refill) = fs.spawn(limits, &join, deadline, now).await?;
    let guard = process::KillOnDrop::pidfd(
        f.pidfd
            .try_clone()
            .map_err(LaunchError::io("keep the worker's pidfd"))?,
    );
    let rx = fs.exit_of(f.pid);
    let started = Started {
        pid: f.pid,
        exit: process::ExitWatch::from_pidfd(f.pidfd),
        guard,
        stdout: f.stdout,
        stderr: f.stderr,
        reap: Reap::Parent(fs.clone(), rx),
        in_flight: refill.map(|r| Box::new(r) as Box<dyn Send>),
    };
    Ok((started, f.sock.into()))
}

/// Spawn the worker by re-executing our binary.
pub(super) fn start_direct(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    worker_fd: OwnedFd,
    group: Option<&CellGroup>,
) -> Result<Started, LaunchError> {
    let home = spec
        .scratch
        .path()
        .map_err(LaunchError::io("create the scratch directory"))?;
    let mut cmd = std::process::Command::new(&sup.worker_exe);
    cmd.arg(crate::worker::WORKER_ARG)
        .env_clear()
        .envs(spawn::WORKER_ENV)
        .env("HOME", home)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // It joins its own cgroup (beneath its session's and the cells') or
    // else the cells' one, before it execs.
    let joins = match group {
        Some(g) => {
            // A fresh worker has a user namespace of its own, where its
            // RLIMIT_NPROC counts exactly its cell's processes (set by the
            // worker once it is sandboxed); a cgroup bound from its first
            // instruction would also count what the worker does before
            // that (the threads of a program whose `main` starts a runtime
            // before `dispatch`, which must get its error, not a hang). Its
            // session's bound holds all the same.
            g.set_max_processes(u64::MAX)?;
            g.join_fds()
        }
        None => sup.cgroup_for(plan.layers.cgroup)?.into_iter().collect(),
    };
    spawn::prepare_worker(&mut cmd, &worker_fd, joins);

    let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        exe: sup.worker_exe.clone(),
        source,
    })?;
    drop(worker_fd);
    started_child(child)
}

/// A worker just spawned by `std::process` with piped output, as a
/// [`Started`] the supervisor kills and reaps (with wait4) on every path.
fn started_child(mut child: std::process::Child) -> Result<Started, LaunchError> {
    let pid = child.id() as i32;
    // From here on the child must be killed and reaped on every path.
    let guard = process::KillOnDrop::new(pid);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(LaunchError::MissingPipes);
    };
    drop(child); // std's Child never reaps on drop; we reap with wait4.
    Ok(Started {
        pid,
        exit: process::ExitWatch::open(pid),
        guard,
        stdout: OwnedFd::from(out),
        stderr: OwnedFd::from(err),
        reap: Reap::Direct,
        in_flight: None,
    })
}

/// Start the cell in a fresh worker under `launcher` (sandbox-exec, or a
/// stand-in in tests; see [`crate::macos::launch`]). It joins no cgroup:
/// macOS has none.
fn start_seatbelt(
    sup: &Arc<Inner>,
    plan: &SandboxPlan,
    launcher: &std::path::Path,
) -> Result<Start3, LaunchError> {
    let (sup_sock, worker_sock) = socket_pair()?;
    let (mut cmd, _policy) =
        crate::macos::launch::command(launcher, &sup.worker_exe, plan, worker_sock.into())?;
    let child = cmd.spawn().map_err(|source| LaunchError::SpawnWith {
        launcher: launcher.to_path_buf(),
        source,
    })?;
    // The command holds the worker's end of the socket: close ours.
    drop(cmd);
    let started = started_child(child)?;
    Ok((started, sup_sock, Handshake::Setup))
}
