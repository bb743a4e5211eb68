//! The cell runner: spawn one worker, pump the protocol, enforce the outer
//! limits (wall clock, output caps, frame size), kill and reap.

use super::capability::{CallContext, Handler};
use super::output::Capture;
use super::policy::{Budget, Policy};
use super::result::{CallRecord, CellResult, RunInfo, Status};
use super::tenancy::{groups_pid, CellGroup, TreeUsage};
use super::{Inner, Language, Limits};
use crate::protocol::{
    read_frame_async_within, write_frame_async, Backend, Call, Definition, Done, DoneStatus,
    FrameError, FromWorker, Reply, ReplyError, ScriptError, Setup, Start, ToWorker,
};
use crate::sandbox::{process, spawn, SandboxPlan};
use serde_json::{json, Map, Value};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Everything needed to run one cell.
#[derive(Debug, Clone)]
pub(crate) struct CellSpec {
    pub language: Language,
    pub code: String,
    /// For `Language::Shell` via `exec`: the program and its arguments.
    pub argv: Option<Vec<String>>,
    pub vars: Map<String, Value>,
    pub definitions: Vec<Definition>,
    pub limits: Limits,
    /// The limits the session and call asked for, before the profile's
    /// ceiling narrowed them into `limits` (set by `run_cell`): a sub-cell
    /// starts from these and gets its own profile's ceiling, exactly as a
    /// top-level cell of its language would.
    pub asked: Option<Limits>,
    pub policy: Policy,
    pub budget: Arc<Budget>,
    /// The session's `emit` events so far (shared by all its cells).
    pub session_emits: Arc<super::policy::EmitTally>,
    pub run: RunInfo,
    pub session_id: String,
    /// Made on first use: a cell from the Rhai fork server needs none.
    pub scratch: Arc<super::scratch::Scratch>,
    /// The session's profile (for cells of any language) when it names
    /// one; else the supervisor's for the cell's language applies (see
    /// `Inner::profile_name`). Sub-cells inherit it.
    pub profile: Option<String>,
    /// Copy the worker's stdout/stderr to ours as it arrives.
    pub forward_output: super::Forward,
    /// Kill the cell when cancelled (status `killed`).
    pub cancel: Option<tokio_util::sync::CancellationToken>,
    /// A live copy of stdout/stderr as it arrives.
    pub output: Option<tokio::sync::mpsc::Sender<super::OutputChunk>>,
    pub execution_count: u64,
    /// The session's cgroups (shared by its cells and sub-cells).
    pub share: Arc<super::tenancy::Share>,
}

/// A cell's outcome before it is turned into a result.
enum Outcome {
    Done(Box<Done>),
    Timeout,
    Exited,
    Fatal(Status, &'static str, String),
}

/// Longest capability name a call may give (registered names are at most
/// 64 bytes); a longer one is answered `unknown` and kept shortened.
pub(crate) const MAX_CAP_NAME_BYTES: usize = 128;

/// How long a worker that reported `done` may take to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// How long a frame's body may take to arrive once its length came.
const FRAME_BODY_WITHIN: Duration = Duration::from_secs(5);

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

static RUN_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A new run id, unique within this host for practical purposes.
pub(crate) fn new_run_id() -> String {
    let n = RUN_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!("{:x}-{:x}-{n}", t, std::process::id())
}

/// Run one cell (and, through `run_cell` calls, its sub-cells).
pub(crate) fn run_cell(
    sup: Arc<Inner>,
    mut spec: CellSpec,
) -> BoxFut<(CellResult, Option<Box<Done>>)> {
    Box::pin(async move {
        // Every cell passes here, top-level, `exec` and sub-cells alike:
        // the supervisor's languages and the profile's ceiling hold for all.
        if let Some(refusal) = sup.language_refusal(spec.language) {
            let mut r = CellResult::refused(
                spec.language.as_str(),
                spec.run.clone(),
                Status::PolicyDenied,
                "PermissionError",
                refusal,
            );
            r.execution_count = spec.execution_count;
            return (r, None);
        }
        // A profile that does not load fails the cell when it is planned.
        spec.asked = Some(spec.limits.clone());
        if let Ok(p) = sup.profile(&profile_name(&sup, &spec)) {
            spec.limits = spec.limits.under_profile(&p.limits);
        }
        let started = Instant::now();
        let mut result = CellResult::new(spec.language.as_str(), spec.run.clone());
        result.execution_count = spec.execution_count;
        sup.events.record(
            "cell_start",
            &spec.run,
            json!({"language": spec.language.as_str(), "session_id": spec.session_id}),
        );
        let done = match run_worker(&sup, &spec, &mut result, started).await {
            Ok(done) => done,
            Err(e) => {
                result.status = Status::SandboxError;
                result.error = Some(ScriptError {
                    kind: "SpawnError".into(),
                    message: e,
                    ..ScriptError::default()
                });
                None
            }
        };
        if let Some(report) = result.sandbox.as_mut() {
            report.layers.push(cgroup_layer(&sup, &spec));
        }
        result.usage.wall_ms = started.elapsed().as_millis() as u64;
        result.usage.calls = u32::try_from(result.calls_made()).unwrap_or(u32::MAX);
        sup.events.record(
            "cell_end",
            &spec.run,
            json!({"status": result.status, "wall_ms": result.usage.wall_ms,
                   "error": result.error.as_ref().map(|e| &e.message)}),
        );
        (result, done)
    })
}

/// The report of the cells' memory cgroup for a cell of `spec` (the worker
/// does not apply it: it starts in it).
fn cgroup_layer(sup: &Inner, spec: &CellSpec) -> crate::sandbox::LayerReport {
    use crate::profiles::LayerMode;
    let mode = sup
        .profile(&profile_name(sup, spec))
        .map_or(LayerMode::BestEffort, |p| p.layers.cgroup);
    #[cfg(target_os = "linux")]
    {
        let mut report = crate::sandbox::linux::cgroup::layer_report(
            sup.cells_cgroup
                .as_deref()
                .filter(|_| mode != LayerMode::Off),
            mode,
        );
        if report.applied && sup.groups.is_some() {
            let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
            let (memory, processes) = super::tenancy::session_bounds(sup, asked);
            report.detail.push_str(&format!(
                "; its session: {} MiB (its files too), {processes} processes; \
                 the cell: {} processes, its whole process tree ended with it",
                memory >> 20,
                super::tenancy::cell_processes(&spec.limits)
            ));
        } else if report.applied {
            report.detail.push_str(
                "; sessions share it (per-session cgroups need cgroup v1 with the memory, \
                 pids and cpuacct hierarchies)",
            );
        }
        report
    }
    #[cfg(not(target_os = "linux"))]
    crate::sandbox::LayerReport {
        name: "cgroup".into(),
        applied: false,
        mode,
        detail: "none: memory cgroups are Linux only".into(),
    }
}

/// The sandbox profile a cell runs under (name or path).
fn profile_name(sup: &Inner, spec: &CellSpec) -> String {
    sup.profile_name(spec.language, spec.profile.as_deref())
}

fn backend_for(sup: &Inner, spec: &CellSpec) -> Result<(Backend, SandboxPlan), String> {
    let limits = spec.limits.os_limits();
    let profile = sup.profile(&profile_name(sup, spec))?;
    let scratch = spec
        .scratch
        .path()
        .map_err(|e| format!("failed to create the scratch directory: {e}"))?;
    let mut plan = SandboxPlan::new(&profile, scratch.to_path_buf(), limits);
    sup.cgroup_for(plan.layers.cgroup)?;
    let backend = match spec.language {
        Language::Rhai => Backend::Rhai,
        Language::Python => {
            let py = sup.python()?;
            plan.read_only.extend(py.read_only.iter().cloned());
            plan.exec.push(py.executable.clone());
            let precompiled = sup.precompiled_shim().map(|p| {
                plan.read_only.push(p.clone());
                p.to_string_lossy().into_owned()
            });
            Backend::Python {
                interpreter: py.executable.to_string_lossy().into_owned(),
                precompiled,
            }
        }
        Language::Shell => {
            let argv = match &spec.argv {
                Some(a) => a.clone(),
                None => vec!["/bin/sh".into(), "-c".into(), spec.code.clone()],
            };
            let prog = argv.first().ok_or("exec needs a program to run")?;
            let resolved = super::resolve_program(prog)?;
            plan.exec.push(resolved.clone());
            let mut argv = argv;
            argv[0] = resolved.to_string_lossy().into_owned();
            Backend::Exec { argv }
        }
    };
    Ok((backend, plan))
}

/// Resolves when `token` is cancelled (never without one).
async fn cancelled(token: Option<&tokio_util::sync::CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Where a live copy of a stream's output goes (at most `budget` bytes).
struct Tap {
    tx: tokio::sync::mpsc::Sender<super::OutputChunk>,
    stream: super::OutputStream,
    budget: usize,
}

async fn pump<R: AsyncRead + Unpin>(
    mut r: R,
    cap: Arc<Mutex<Capture>>,
    forward: (super::Forward, bool),
    mut tap: Option<Tap>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if let Some(t) = tap.as_mut() {
            // Live output is best effort (the result always has it): never
            // wait for a slow consumer, never pass more than the cap.
            let take = chunk.len().min(t.budget);
            if take > 0 {
                let c = super::OutputChunk {
                    stream: t.stream,
                    text: String::from_utf8_lossy(&chunk[..take]).into_owned(),
                };
                if t.tx.try_send(c).is_ok() {
                    t.budget -= take;
                }
            }
        }
        let to_head = match cap.lock() {
            Ok(mut c) => c.push(chunk),
            Err(p) => p.into_inner().push(chunk),
        };
        let shown = match forward.0 {
            super::Forward::No => &chunk[..0],
            super::Forward::All => chunk,
            super::Forward::Head => &chunk[..to_head],
        };
        // Flushed before the next read, so that it is out before the result
        // the caller prints after it.
        if !shown.is_empty() {
            if forward.1 {
                let mut out = tokio::io::stdout();
                let _ = out.write_all(shown).await;
                let _ = out.flush().await;
            } else {
                let mut err = tokio::io::stderr();
                let _ = err.write_all(shown).await;
                let _ = err.flush().await;
            }
        }
    }
}

fn take_capture(cap: &Arc<Mutex<Capture>>) -> Capture {
    let mut guard = match cap.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    std::mem::replace(&mut *guard, Capture::new(0))
}

/// Write one frame, giving up at the cell's deadline: a worker that stops
/// reading (e.g. floods calls and never reads the replies) must not hold the
/// supervisor past its limit.
async fn send(
    wr: &mut OwnedWriteHalf,
    msg: &ToWorker,
    max: usize,
    deadline: tokio::time::Instant,
) -> Result<(), SendError> {
    match tokio::time::timeout_at(deadline, write_frame_async(wr, msg, max)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SendError::Frame(e)),
        Err(_) => Err(SendError::Deadline),
    }
}

#[derive(Debug)]
enum SendError {
    Frame(FrameError),
    Deadline,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Frame(e) => e.fmt(f),
            SendError::Deadline => f.write_str("the worker stopped reading before the deadline"),
        }
    }
}

async fn run_worker(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    started: Instant,
) -> Result<Option<Box<Done>>, String> {
    // The cell's own cgroup (beneath its session's), unless its profile
    // turns the cgroup layer off.
    let mode = sup
        .profile(&profile_name(sup, spec))
        .map_or(crate::profiles::LayerMode::BestEffort, |p| p.layers.cgroup);
    let group = if mode == crate::profiles::LayerMode::Off {
        None
    } else {
        let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
        match spec.share.cell(sup, &spec.limits, asked) {
            Ok(g) => g.map(Arc::new),
            Err(e) => {
                result.status = Status::SandboxError;
                result.error = Some(ScriptError {
                    kind: "SandboxError".into(),
                    message: format!("failed to make the cell's cgroup: {e}"),
                    ..ScriptError::default()
                });
                return Ok(None);
            }
        }
    };
    let out = launch(sup, spec, result, started, group.clone()).await;
    // Emptying a cgroup may wait for its last processes: off the runtime
    // (an empty one, the usual case, is kept for the session's next cell).
    if let Some(g) = group {
        if g.is_empty() {
            drop(g);
        } else {
            let _ = tokio::task::spawn_blocking(move || drop(g)).await;
        }
    }
    out
}

/// Start the cell's worker (forked when a warm parent fits, else fresh) in
/// `group`, and see it through.
async fn launch(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    started: Instant,
    group: Option<Arc<CellGroup>>,
) -> Result<Option<Box<Done>>, String> {
    let deadline = started + spec.limits.timeout();
    let max_frame = spec.limits.max_frame_bytes;
    let refuse = |result: &mut CellResult, message: String| {
        result.status = Status::SandboxError;
        result.error = Some(ScriptError {
            kind: "SandboxError".into(),
            message,
            ..ScriptError::default()
        });
    };
    // A Rhai cell of the fork server's profile arrives sandboxed by the
    // server's plan and says `ready` by itself: no plan, no scratch dir.
    let fork_server = if spec.language == Language::Rhai {
        let name = profile_name(sup, spec);
        sup.fork_server().await.filter(|fs| fs.profile == name)
    } else {
        None
    };
    if let Some(fs) = fork_server {
        let deadline_t = tokio::time::Instant::from_std(deadline);
        match start_forked(&fs, &spec.limits.os_limits(), deadline_t, group.as_deref()).await {
            Ok((started, sock)) => {
                let launched = Launched {
                    started,
                    sock,
                    backend: Backend::Rhai,
                    plan: None,
                    handshake: Handshake::SelfReady,
                    group,
                };
                return finish_worker(sup, spec, result, launched, deadline, max_frame).await;
            }
            // Its deadline came while it waited: say so, with the real time.
            Err(e) if Instant::now() >= deadline => {
                stalled_timeout(result, spec, started, &e);
                return Ok(None);
            }
            // It died or stalled under us (the next cell starts a new
            // one): this cell runs in a fresh worker instead.
            Err(e) if fs.is_dead() => {
                tracing::warn!(
                    target: super::warm::POOL_LOG,
                    run_id = %spec.run.run_id,
                    "the fork server is gone ({e}); cell moved to a cold worker"
                );
            }
            Err(e) => return Err(e),
        }
    }
    let (backend, plan) = match backend_for(sup, spec) {
        Ok(b) => b,
        Err(e) => {
            refuse(result, e);
            return Ok(None);
        }
    };
    let g = group.as_deref();
    #[cfg(target_os = "linux")]
    let launched = if spec.language == Language::Python {
        launch_python(sup, spec, &plan, result, started, deadline, g).await?
    } else {
        Some(start_cold(sup, spec, &plan, g)?)
    };
    #[cfg(not(target_os = "linux"))]
    let launched = Some(start_cold(sup, spec, &plan, g)?);
    // None: the cell ended before it started (its result says how).
    let Some((started_worker, sup_sock, handshake)) = launched else {
        return Ok(None);
    };
    let launched = Launched {
        started: started_worker,
        sock: sup_sock,
        backend,
        plan: Some(plan),
        handshake,
        group,
    };
    finish_worker(sup, spec, result, launched, deadline, max_frame).await
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
) -> Result<Start3, String> {
    let (sup_sock, worker_sock) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("failed to create the protocol socket pair: {e}"))?;
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
#[cfg(target_os = "linux")]
async fn launch_python(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    result: &mut CellResult,
    started: Instant,
    deadline: Instant,
    group: Option<&CellGroup>,
) -> Result<Option<Start3>, String> {
    use super::warm::POOL_LOG;
    use super::zygote::SpawnError;
    let deadline_t = tokio::time::Instant::from_std(deadline);
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
        let (sup_sock, worker_sock) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("failed to create the protocol socket pair: {e}"))?;
        match start_zygote(&z, worker_sock.into(), plan, deadline_t, group).await {
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
                stalled_timeout(result, spec, started, &e);
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
                    target: super::warm::POOL_LOG,
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
    result.fail(
        Status::Timeout,
        "Timeout",
        format!(
            "the cell reached its wall-clock limit of {} ms after {} ms, before it started: {why}",
            spec.limits.timeout_ms,
            started.elapsed().as_millis()
        ),
    );
}

/// A started worker and how to talk to it.
struct Launched {
    started: Started,
    sock: std::os::unix::net::UnixStream,
    backend: Backend,
    /// The plan for its `setup` frame (none when it needs no setup).
    plan: Option<SandboxPlan>,
    handshake: Handshake,
    /// The cgroup its processes are in, when there is one.
    group: Option<Arc<CellGroup>>,
}

/// Converse with a started worker until it is done, then collect its end,
/// its output and its result.
async fn finish_worker(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    launched: Launched,
    deadline: Instant,
    max_frame: usize,
) -> Result<Option<Box<Done>>, String> {
    let Launched {
        started: started_worker,
        sock: sup_sock,
        backend,
        plan,
        handshake,
        group,
    } = launched;
    let Started {
        pid,
        exit: exit_fd,
        mut guard,
        stdout: out_fd,
        stderr: err_fd,
        reap: reap_src,
        in_flight,
    } = started_worker;
    let out_cap = Arc::new(Mutex::new(Capture::new(spec.limits.max_output_bytes)));
    let err_cap = Arc::new(Mutex::new(Capture::new(spec.limits.max_output_bytes)));
    let mut pumps = Vec::new();
    if let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(out_fd) {
        let fwd = (spec.forward_output, true);
        let tap = spec.output.clone().map(|tx| Tap {
            tx,
            stream: super::OutputStream::Stdout,
            budget: spec.limits.max_output_bytes,
        });
        pumps.push(tokio::spawn(pump(rx, out_cap.clone(), fwd, tap)));
    }
    if let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(err_fd) {
        let fwd = (spec.forward_output, false);
        let tap = spec.output.clone().map(|tx| Tap {
            tx,
            stream: super::OutputStream::Stderr,
            budget: spec.limits.max_output_bytes,
        });
        pumps.push(tokio::spawn(pump(rx, err_cap.clone(), fwd, tap)));
    }

    let exit_fd = match exit_fd {
        Ok(f) => f,
        Err(e) => {
            drop(guard);
            return Err(format!("failed to watch the worker process: {e}"));
        }
    };
    let o = converse(
        sup, spec, result, sup_sock, &exit_fd, deadline, backend, plan, max_frame, handshake,
    )
    .await;
    let mut reap_src = reap_src;
    let mut early = None;
    // A forked worker that reported exits by itself, and its parent's
    // report of that exit means it is gone: no need to watch it too.
    let mut graced = false;
    if let Outcome::Done(_) = &o {
        if let Reap::Parent(parent, rx) = &mut reap_src {
            graced = true;
            // Once it has answered (a report, or its reporter gone or
            // stalled) it must not be awaited again.
            match await_report(parent.as_ref(), &exit_fd, rx, EXIT_GRACE).await {
                Report::Reported(r) => early = Some(Some(r)),
                Report::Gone => early = Some(None),
                Report::NotExited => {}
            }
        }
    }
    if !matches!(early, Some(Some(_))) {
        let forked = !matches!(reap_src, Reap::Direct);
        // Its grace after `done` is used up: kill it now.
        let grace = matches!(o, Outcome::Done(_)) && !graced;
        finish_process(pid, &exit_fd, grace, forked).await;
    }
    let reaped = match (early, reap_src) {
        (Some(Some(r)), _) => Ok(r),
        (_, Reap::Direct) => tokio::task::spawn_blocking(move || process::reap(pid))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string())),
        (Some(None), Reap::Parent(parent, _)) => {
            parent.forget(pid);
            Err(format!(
                "{} went away before it reported how the cell ended",
                parent.name()
            ))
        }
        (None, Reap::Parent(parent, mut rx)) => {
            // It is gone (or beyond our reach): its parent reports that at
            // once, unless it is stalled.
            match await_report(parent.as_ref(), &exit_fd, &mut rx, Duration::ZERO).await {
                Report::Reported(r) => Ok(r),
                Report::Gone | Report::NotExited => {
                    parent.forget(pid);
                    Err(format!(
                        "{} did not report how the cell ended",
                        parent.name()
                    ))
                }
            }
        }
    };
    drop(in_flight);
    if reaped.is_ok() {
        guard.disarm();
    }
    // The cell is over when its whole process tree is: whatever it started
    // (in its own session, double-forked) is killed and waited for here,
    // before its output is collected and before its slot, its scratch
    // directory or its session's next cell are released.
    let tree = end_tree(group.as_ref()).await;
    let mut reaped = reaped;
    if let (Ok(r), Some(cpu_ms)) = (reaped.as_mut(), tree.cpu_ms) {
        // The group counts every process the cell had; the report only
        // the first and the children it waited for.
        r.cpu_ms = r.cpu_ms.max(cpu_ms);
    }
    collect_output(pumps).await;

    result.record_end(
        take_capture(&out_cap),
        take_capture(&err_cap),
        reaped.as_ref().ok(),
    );
    Ok(classify(spec, result, o, deadline))
}

/// What a forked worker's parent said of its end.
enum Report {
    Reported(process::Reaped),
    /// No report will come: the parent is gone, or stalled (and replaced).
    Gone,
    /// The worker had not exited within its grace.
    NotExited,
}

/// Wait for a forked worker's end as its parent reports it: the worker may
/// take `grace` to exit; once it has, its parent must report that within
/// its stall window, or the parent is stalled (and replaced), so a stopped
/// parent costs a cell at most that window, not a fixed wait.
async fn await_report(
    parent: &dyn super::warm::ForkingParent,
    exit: &process::ExitWatch,
    rx: &mut tokio::sync::oneshot::Receiver<process::Reaped>,
    grace: Duration,
) -> Report {
    let answer = |a: Result<process::Reaped, _>| match a {
        Ok(r) => Report::Reported(r),
        Err(_) => Report::Gone,
    };
    tokio::select! {
        biased;
        a = &mut *rx => return answer(a),
        _ = exit.exited() => {}
        _ = tokio::time::sleep(grace) => return Report::NotExited,
    }
    let within = parent.report_within();
    let gone_at = Instant::now();
    match tokio::time::timeout(within, &mut *rx).await {
        Ok(a) => answer(a),
        Err(_) => {
            parent.stalled("a cell's end", gone_at.elapsed());
            Report::Gone
        }
    }
}

/// How long the rest of a cell's process tree may take to die once killed.
const TREE_END_WITHIN: Duration = Duration::from_secs(10);

/// Kill what is left of a cell's tree and wait until nothing is; what its
/// group measured of it.
async fn end_tree(group: Option<&Arc<CellGroup>>) -> TreeUsage {
    let Some(g) = group else {
        return TreeUsage::default();
    };
    if !g.is_empty() {
        let g2 = g.clone();
        match tokio::task::spawn_blocking(move || g2.end(TREE_END_WITHIN)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("a cell's processes outlived it: {e}"),
            Err(e) => tracing::warn!("failed to end a cell's processes: {e}"),
        }
    }
    g.usage()
}

/// Output pipes close once every process holding them is gone (or has
/// closed them); give stragglers a moment, then stop reading.
async fn collect_output(pumps: Vec<tokio::task::JoinHandle<()>>) {
    for p in pumps {
        let abort = p.abort_handle();
        if tokio::time::timeout(Duration::from_millis(500), p)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// Wait for the worker to be gone, killing it (and its whole process group)
/// as needed. Returns once the leader has exited (it stays a zombie until
/// reaped, so its pid and pgid cannot be reused while we kill the group).
/// With `grace` (a worker that reported `done` exits by itself) it first
/// gets [`EXIT_GRACE`] to do so.
async fn finish_process(pid: i32, exit: &process::ExitWatch, grace: bool, forked: bool) {
    if grace {
        let _ = tokio::time::timeout(EXIT_GRACE, exit.exited()).await;
    }
    if forked {
        // The fork server kills the child's group before reaping it.
        let _ = exit.kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), exit.exited()).await;
        return;
    }
    let _ = process::kill_group(pid);
    let _ = process::kill_pid(pid);
    let _ = tokio::time::timeout(Duration::from_secs(10), exit.exited()).await;
    // Anything it left in its group dies too.
    let _ = process::kill_group(pid);
}

/// How the worker's end is learned.
enum Reap {
    /// Our own child: wait4 it.
    Direct,
    /// A child of the fork server or a Python zygote: its parent reports it.
    Parent(
        Arc<dyn super::warm::ForkingParent>,
        tokio::sync::oneshot::Receiver<process::Reaped>,
    ),
}

struct Started {
    pid: i32,
    exit: std::io::Result<process::ExitWatch>,
    guard: process::KillOnDrop,
    stdout: OwnedFd,
    stderr: OwnedFd,
    reap: Reap,
    /// Held while the cell runs, dropped once it is reaped (a zygote's
    /// in-flight count; a fork-server spare's replacement).
    in_flight: Option<Box<dyn Send>>,
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
) -> Option<Arc<super::zygote::Zygote>> {
    let pools = sup.pools.as_ref()?;
    if !super::zygote::eligible(pools, spec.language, &plan.scratch) {
        return None;
    }
    let profile = profile_name(sup, spec);
    let z = match pools.get(sup, &profile, running).await {
        Ok(z) => z,
        Err(e) => {
            tracing::warn!(
                target: super::warm::POOL_LOG,
                "Python zygote unavailable, running the cell cold: {e}"
            );
            return None;
        }
    };
    z.fits(&plan.limits).then_some(z)
}

/// Fork the cell from a Python zygote.
#[cfg(target_os = "linux")]
async fn start_zygote(
    z: &Arc<super::zygote::Zygote>,
    worker_fd: OwnedFd,
    plan: &SandboxPlan,
    deadline: tokio::time::Instant,
    group: Option<&CellGroup>,
) -> Result<Started, super::zygote::SpawnError> {
    use super::zygote::SpawnError::Failed;
    super::zygote::prepare_scratch(&plan.scratch, plan.uid, plan.gid).map_err(Failed)?;
    let (out_r, out_w) = pipe().map_err(Failed)?;
    let (err_r, err_w) = pipe().map_err(Failed)?;
    let mut limits = plan.limits.clone();
    if group.is_some() {
        // The cell's pids cgroup bounds its processes. RLIMIT_NPROC would
        // count every cell of the zygote's user namespace together, so that
        // one session's processes could stop another's from forking.
        limits.max_processes = u64::MAX;
    }
    let (pid, pidfd, in_flight) = z
        .spawn(worker_fd, out_w, err_w, &plan.scratch, &limits, deadline)
        .await?;
    let guard = process::KillOnDrop::pidfd(
        pidfd
            .try_clone()
            .map_err(|e| Failed(format!("failed to keep the worker's pidfd: {e}")))?,
    );
    // Into its cgroup before it is sent any code.
    if let Some(g) = group {
        groups_pid(&pidfd)
            .and_then(|p| g.adopt(p))
            .map_err(Failed)?;
    }
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

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("failed to create an output pipe: {e}"))
}

/// Take a sandboxed worker from the warm fork server (a spare when one
/// fits). Returns it and the supervisor's end of its protocol socket.
async fn start_forked(
    fs: &Arc<super::warm::ForkServer>,
    limits: &crate::sandbox::OsLimits,
    deadline: tokio::time::Instant,
    group: Option<&CellGroup>,
) -> Result<(Started, std::os::unix::net::UnixStream), String> {
    let (f, refill) = fs.spawn(limits, deadline).await?;
    let guard = process::KillOnDrop::pidfd(
        f.pidfd
            .try_clone()
            .map_err(|e| format!("failed to keep the worker's pidfd: {e}"))?,
    );
    // Into its cgroup before it is sent any code.
    if let Some(g) = group {
        g.adopt(groups_pid(&f.pidfd)?)?;
    }
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
fn start_direct(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    plan: &SandboxPlan,
    worker_fd: OwnedFd,
    group: Option<&CellGroup>,
) -> Result<Started, String> {
    let home = spec
        .scratch
        .path()
        .map_err(|e| format!("failed to create the scratch directory: {e}"))?;
    let mut cmd = std::process::Command::new(&sup.worker_exe);
    cmd.arg(crate::worker::WORKER_ARG)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
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

    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "failed to start the worker {}: {e}",
            sup.worker_exe.display()
        )
    })?;
    drop(worker_fd);
    let pid = child.id() as i32;
    // From here on the child must be killed and reaped on every path.
    let guard = process::KillOnDrop::new(pid);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("the worker's output pipes are missing".into());
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

/// How a worker comes to be ready for `start`.
enum Handshake {
    /// It needs the `setup` frame and answers `ready`.
    Setup,
    /// It was sandboxed without one and sends `ready` by itself.
    SelfReady,
    /// It is ready already (the report is known).
    PreReady(crate::sandbox::SandboxReport),
}

#[allow(clippy::too_many_arguments)]
async fn converse(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    sock: std::os::unix::net::UnixStream,
    exit_fd: &process::ExitWatch,
    deadline: Instant,
    backend: Backend,
    plan: Option<SandboxPlan>,
    max_frame: usize,
    handshake: Handshake,
) -> Outcome {
    let stream = match sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(sock))
    {
        Ok(s) => s,
        Err(e) => {
            return Outcome::Fatal(
                Status::SandboxError,
                "SpawnError",
                format!("failed to set up the protocol channel: {e}"),
            )
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Result<FromWorker, FrameError>>(8);
    let reader = tokio::spawn(async move {
        loop {
            // A started frame must finish promptly: a worker that sends a
            // length prefix and then stalls is a protocol error, not a wait
            // until the deadline.
            let msg = read_frame_async_within::<FromWorker, _>(
                &mut rd,
                max_frame,
                Some(FRAME_BODY_WITHIN),
            )
            .await;
            let stop = msg.is_err();
            if tx.send(msg).await.is_err() || stop {
                return;
            }
        }
    });
    let is_exec = matches!(backend, Backend::Exec { .. });
    let setup = plan.map(|plan| ToWorker::Setup(Setup { backend, plan }));
    let mut start = if is_exec {
        None
    } else {
        Some(ToWorker::Start(Start {
            language: spec.language.as_str().to_owned(),
            code: spec.code.clone(),
            vars: spec.vars.clone(),
            definitions: spec.definitions.clone(),
            capabilities: sup.registry.iter().map(|c| c.spec()).collect(),
            limits: spec.limits.script_limits(),
            max_frame_bytes: max_frame,
        }))
    };
    let mut ready = false;
    let mut rx_open = true;
    let mut deny_seen = false;
    let deadline_t = tokio::time::Instant::from_std(deadline);
    let first = match handshake {
        Handshake::Setup if setup.is_none() => {
            return Outcome::Fatal(
                Status::SandboxError,
                "SpawnError",
                "a worker that needs a setup frame was started without a plan".into(),
            )
        }
        Handshake::Setup => setup,
        // A forked worker sandboxes itself from the server's plan and says
        // `ready` by itself; `start` can wait in its socket meanwhile (it
        // reads nothing before its layers are on, and nothing it sends
        // counts before its `ready`).
        Handshake::SelfReady => start.take(),
        // A zygote's cell arrives sandboxed: it reads `start` straight away.
        Handshake::PreReady(report) => {
            ready = true;
            result.sandbox = Some(report);
            start.take()
        }
    };
    if let Some(first) = first {
        if let Err(SendError::Deadline) = send(&mut wr, &first, max_frame, deadline_t).await {
            return Outcome::Timeout;
        }
    }
    let outcome = loop {
        tokio::select! {
            biased;
            msg = rx.recv(), if rx_open => match msg {
                Some(Ok(FromWorker::Ready(r))) if !ready => {
                    ready = true;
                    result.sandbox = Some(r.report);
                    if let Some(s) = start.take() {
                        if let Err(e) = send(&mut wr, &s, max_frame, deadline_t).await {
                            tracing::debug!("worker went away before start: {e}");
                        }
                    }
                }
                Some(Ok(FromWorker::SandboxError(f))) if !ready => {
                    break Outcome::Fatal(
                        Status::SandboxError,
                        "SandboxError",
                        format!("the {} layer could not be applied: {}", f.layer, f.message),
                    );
                }
                Some(Ok(FromWorker::Call(call))) if ready && !is_exec => {
                    match handle_call(sup, spec, result, call, deadline).await {
                        Ok((reply, denied)) => {
                            deny_seen |= denied;
                            if let Err(SendError::Deadline) =
                                send(&mut wr, &ToWorker::Reply(reply), max_frame, deadline_t).await
                            {
                                break Outcome::Timeout;
                            }
                        }
                        Err(fatal) => break fatal,
                    }
                }
                Some(Ok(FromWorker::Emit { event })) if ready && !is_exec => {
                    let call = Call { id: 0, cap: "emit".into(), args: {
                        let mut m = Map::new();
                        m.insert("event".into(), event);
                        m
                    }};
                    if let Err(fatal) = handle_call(sup, spec, result, call, deadline).await {
                        break fatal;
                    }
                }
                Some(Ok(FromWorker::Log(l))) if ready && !is_exec => {
                    let msg: String = l.message.chars().take(2000).collect();
                    tracing::info!(run_id = %spec.run.run_id, level = %l.level, "worker: {msg}");
                }
                Some(Ok(FromWorker::Done(done))) if ready && !is_exec => {
                    break Outcome::Done(done);
                }
                Some(Ok(other)) => {
                    let tag = match other {
                        FromWorker::Ready(_) => "ready",
                        FromWorker::SandboxError(_) => "sandbox_error",
                        FromWorker::Call(_) => "call",
                        FromWorker::Emit { .. } => "emit",
                        FromWorker::Log(_) => "log",
                        FromWorker::Done(_) => "done",
                    };
                    break Outcome::Fatal(
                        Status::ProtocolError,
                        "ProtocolError",
                        format!("the worker sent an unexpected {tag:?} message"),
                    );
                }
                Some(Err(FrameError::Closed)) | None => {
                    rx_open = false;
                }
                Some(Err(e)) => {
                    break Outcome::Fatal(
                        Status::ProtocolError,
                        "ProtocolError",
                        format!("the worker sent a bad frame: {e}"),
                    );
                }
            },
            _ = exit_fd.exited() => {
                // The worker is gone; a `done` may still be queued.
                let mut last = Outcome::Exited;
                while rx_open {
                    let next = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
                    rx_open = matches!(next, Ok(Some(Ok(_))));
                    match next {
                        // A fast program may exit before its `ready` was read.
                        Ok(Some(Ok(FromWorker::Ready(r)))) if !ready => {
                            ready = true;
                            result.sandbox = Some(r.report);
                        }
                        Ok(Some(Ok(FromWorker::Done(d)))) if ready && !is_exec => {
                            last = Outcome::Done(d);
                            break;
                        }
                        Ok(Some(Ok(FromWorker::SandboxError(f)))) if !ready => {
                            last = Outcome::Fatal(
                                Status::SandboxError,
                                "SandboxError",
                                format!("the {} layer could not be applied: {}", f.layer, f.message),
                            );
                            break;
                        }
                        Ok(Some(Ok(_))) => {}
                        _ => break,
                    }
                }
                break last;
            }
            _ = cancelled(spec.cancel.as_ref()) => break Outcome::Fatal(
                Status::Killed,
                "Interrupted",
                "the cell was interrupted and killed; this result keeps what it printed until then"
                    .into(),
            ),
            _ = tokio::time::sleep_until(deadline_t) => break Outcome::Timeout,
        }
    };
    reader.abort();
    let _ = wr.shutdown().await;
    if deny_seen {
        if let Outcome::Done(d) = &outcome {
            if d.status == DoneStatus::Error
                && d.error.as_ref().map(|e| e.kind.as_str()) == Some("PermissionError")
            {
                result.status = Status::PolicyDenied;
            }
        }
    }
    outcome
}

/// Check and perform one capability call. `Err` ends the cell.
async fn handle_call(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    call: Call,
    deadline: Instant,
) -> Result<(Reply, bool), Outcome> {
    let t0 = Instant::now();
    let id = call.id;
    // A cell chooses the names it calls: records and events keep at most
    // MAX_CAP_NAME_BYTES of one.
    let name_fits = call.cap.len() <= MAX_CAP_NAME_BYTES;
    let shown = if name_fits {
        call.cap.clone()
    } else {
        let mut end = 32;
        while !call.cap.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} bytes)", &call.cap[..end], call.cap.len())
    };
    let record = |outcome: &str, message: Option<String>, result: &mut CellResult| {
        sup.events.record(
            "call",
            &spec.run,
            json!({"cap": shown, "outcome": outcome, "message": message}),
        );
        result.push_call(CallRecord {
            cap: shown.clone(),
            outcome: outcome.to_owned(),
            message,
            run_id: spec.run.run_id.clone(),
            depth: spec.run.depth,
            ms: t0.elapsed().as_millis() as u64,
        });
    };
    let err = |kind: &str, message: String| Reply {
        id,
        ok: None,
        error: Some(ReplyError {
            kind: crate::protocol::ReplyErrorKind::named(kind),
            message,
        }),
    };
    // Every call is charged first, whatever it asks for: unknown, denied
    // and malformed calls use the budget too.
    let budget_key = if name_fits { call.cap.as_str() } else { "" };
    if let Err(e) = spec.budget.charge(&spec.policy, budget_key) {
        record("budget", Some(e.to_string()), result);
        return Err(Outcome::Fatal(
            Status::LimitExceeded,
            "LimitExceeded",
            e.to_string(),
        ));
    }
    if !name_fits {
        let msg = format!(
            "unknown capability: its name is {} bytes, over the limit of {MAX_CAP_NAME_BYTES} bytes",
            call.cap.len()
        );
        record("unknown", Some(msg.clone()), result);
        return Ok((err("unknown", msg), true));
    }
    let Some(cap) = sup.registry.get(&call.cap) else {
        let msg = format!("unknown capability {:?}", call.cap);
        record("unknown", Some(msg.clone()), result);
        return Ok((err("unknown", msg), true));
    };
    if !spec.policy.permits(&call.cap) {
        let msg = format!(
            "capability {:?} is not allowed by this session's policy",
            call.cap
        );
        record("denied", Some(msg.clone()), result);
        return Ok((err("denied", msg), true));
    }
    if let Err(msg) = cap.validate(&call.args) {
        let msg = format!("invalid arguments for {:?}: {msg}", call.cap);
        record("invalid_args", Some(msg.clone()), result);
        return Ok((err("invalid_args", msg), false));
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let outcome: Result<Value, (String, String)> = match &cap.handler {
        Handler::Emit => {
            let event = call.args.get("event").cloned().unwrap_or(Value::Null);
            // Bounded per cell and per session, in count and bytes.
            let bytes = serde_json::to_vec(&event).map_or(0, |v| v.len() as u64);
            let charged = spec.budget.charge_emit(bytes).and_then(|()| {
                spec.session_emits.charge(
                    bytes,
                    super::policy::MAX_EMITS_PER_SESSION,
                    super::policy::MAX_EMIT_BYTES_PER_SESSION,
                    "session",
                )
            });
            match charged {
                Ok(()) => {
                    sup.events
                        .record("emit", &spec.run, json!({ "data": event }));
                    Ok(Value::Null)
                }
                Err(m) => Err(("limit".into(), m)),
            }
        }
        Handler::Answer => {
            result.final_answer = Some(call.args.get("value").cloned().unwrap_or(Value::Null));
            Ok(Value::Null)
        }
        Handler::RunCell => run_sub_cell(sup, spec, result, &call.args, remaining).await,
        Handler::Host(f) => {
            let ctx = CallContext {
                session_id: spec.session_id.clone(),
                run: spec.run.clone(),
            };
            match tokio::time::timeout(remaining, f(ctx, call.args.clone())).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(m)) => Err(("failed".into(), m)),
                Err(_) => Err((
                    "failed".into(),
                    "the capability did not finish in time".into(),
                )),
            }
        }
    };
    match outcome {
        Ok(v) => {
            record("ok", None, result);
            Ok((
                Reply {
                    id,
                    ok: Some(v),
                    error: None,
                },
                false,
            ))
        }
        Err((kind, msg)) => {
            let denied = kind == "denied";
            record(&kind, Some(msg.clone()), result);
            Ok((err(&kind, msg), denied))
        }
    }
}

async fn run_sub_cell(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    args: &Map<String, Value>,
    remaining: Duration,
) -> Result<Value, (String, String)> {
    let depth = spec.run.depth + 1;
    if depth > spec.policy.max_depth {
        return Err((
            "denied".into(),
            format!(
                "run_cell refused: depth {depth} exceeds max_depth {}",
                spec.policy.max_depth
            ),
        ));
    }
    let lang_s = args.get("language").and_then(Value::as_str).unwrap_or("");
    let language: Language = lang_s
        .parse()
        .map_err(|e: super::Error| ("invalid_args".to_owned(), e.to_string()))?;
    // The server's language list holds for sub-cells as for any cell.
    if let Some(refusal) = sup.language_refusal(language) {
        return Err(("denied".into(), format!("run_cell refused: {refusal}")));
    }
    let code = args
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if let Some(problem) = super::session::code_problem(language, &code, &spec.limits) {
        return Err(("invalid_args".into(), format!("sub-cell: {problem}")));
    }
    let vars = args
        .get("vars")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // In the session's own space: its files count against its quota.
    let scratch = Arc::new(super::scratch::Scratch::beside(
        &spec.scratch,
        "cellbox-sub-",
    ));
    let mut limits = spec.asked.clone().unwrap_or_else(|| spec.limits.clone());
    limits.timeout_ms = limits.timeout_ms.min(remaining.as_millis() as u64);
    let child = CellSpec {
        language,
        code,
        argv: None,
        vars,
        definitions: Vec::new(),
        limits,
        asked: None,
        policy: spec.policy.clone(),
        budget: spec.budget.clone(),
        session_emits: spec.session_emits.clone(),
        run: RunInfo {
            run_id: new_run_id(),
            parent_run_id: Some(spec.run.run_id.clone()),
            root_run_id: spec.run.root_run_id.clone(),
            depth,
        },
        session_id: spec.session_id.clone(),
        scratch: scratch.clone(),
        // The session's profile, or the supervisor's for the language (and
        // its ceiling over the limits), exactly as for a top-level cell.
        profile: spec.profile.clone(),
        forward_output: super::Forward::No,
        // Cancelling the parent ends the cell it waits for too.
        cancel: spec.cancel.clone(),
        output: None,
        execution_count: 0,
        // Its processes and memory count against the session's.
        share: spec.share.clone(),
    };
    // Its whole process tree is gone when `run_cell` returns.
    let (sub, _) = run_cell(sup.clone(), child).await;
    drop(scratch);
    result.absorb_calls(&sub);
    if sub.status == Status::Ok {
        Ok(sub.value)
    } else {
        let msg = sub
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.kind, e.message))
            .unwrap_or_default();
        Err((
            "failed".into(),
            format!("sub-cell ended with status {}: {msg}", sub.status),
        ))
    }
}

/// Turn the outcome and exit information into the result's status/error.
fn classify(
    spec: &CellSpec,
    result: &mut CellResult,
    outcome: Outcome,
    _deadline: Instant,
) -> Option<Box<Done>> {
    let set_err = |result: &mut CellResult, status: Status, kind: &str, message: String| {
        result.status = status;
        result.error = Some(ScriptError {
            kind: kind.to_owned(),
            message,
            ..ScriptError::default()
        });
    };
    match outcome {
        Outcome::Done(done) => {
            if result.status != Status::PolicyDenied {
                result.status = match done.status {
                    DoneStatus::Ok => Status::Ok,
                    DoneStatus::Error => Status::Error,
                    DoneStatus::LimitExceeded => Status::LimitExceeded,
                    DoneStatus::Timeout => Status::Timeout,
                };
            }
            result.value = done.value.clone();
            result.value_repr = done.repr.clone().filter(|_| !done.value.is_null());
            result.error = done.error.clone();
            if let (Some(limit), Some(e)) = (&done.limit, result.error.as_mut()) {
                if !e.message.contains(limit.as_str()) {
                    e.message = format!("{} (limit: {limit})", e.message);
                }
            }
            result.vars.dropped = done.dropped.clone();
            Some(done)
        }
        Outcome::Timeout => {
            result.timed_out(&spec.limits);
            None
        }
        Outcome::Fatal(status, kind, message) => {
            set_err(result, status, kind, message);
            None
        }
        Outcome::Exited => {
            result.classify_exit(&spec.limits, spec.language == Language::Shell);
            None
        }
    }
}
