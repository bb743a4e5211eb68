//! A cell's life, in one place: [`run`] checks it may run, gives it
//! its cgroup and then [`life`] reads as the cell lives: its worker is
//! launched (`launch`: forked from a warm parent or fresh), the protocol
//! conversation runs (`converse`, driving the sans-I/O `conversation`,
//! with its capability `calls`), its worker and process tree are ended and
//! reaped (`end`; for a worker that said `done`, after the answer, by the
//! cell's `Tail`), its output collected (`streams`), and how it ended is
//! classified into its result. The outer limits (wall clock, output caps,
//! frame size) are enforced here, whatever the worker does.

mod calls;
mod conversation;
mod converse;
mod cpu;
mod end;
mod launch;
mod models;
mod plan;
mod prepared;
mod streams;

pub(crate) use conversation::Conversation;
pub(crate) use conversation::Outcome;
// The one-shot Rhai path drives the same conversation and call checks.
#[cfg(target_os = "linux")]
pub(crate) use calls::MAX_CAP_NAME_BYTES;
#[cfg(target_os = "linux")]
pub(crate) use conversation::{Handshake, Step};
use converse::{converse, opening};
pub(crate) use end::Tail;
use launch::{Launch, LaunchError, Launched};
pub(crate) use prepared::{prepare, Prepared};
use streams::Streams;

use crate::protocol::{Definition, Done, DoneStatus};
use crate::supervisor::ledger::Account;
use crate::supervisor::policy::{Budget, EmitTally, Policy};
use crate::supervisor::result::{CellResult, ErrorKind, RunInfo, Status};
use crate::supervisor::scratch::Scratch;
use crate::supervisor::tenancy::{CellGroup, Share};
use crate::supervisor::{Forward, Inner, Language, Limits, OutputChunk};
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Everything needed to run one cell.
#[derive(Debug, Clone)]
pub(crate) struct CellSpec {
    pub language: Language,
    pub code: String,
    /// For `Language::Shell` via `exec`: the program and its arguments.
    pub argv: Option<Vec<String>>,
    /// For `argv`: variables besides the sandbox's (a command tool's).
    pub env: crate::protocol::ExecEnv,
    /// Shared with the session (see its `State::vars`).
    pub vars: std::sync::Arc<Map<String, Value>>,
    pub definitions: Vec<Definition>,
    pub limits: Limits,
    /// The limits the session and call asked for, before the profile's
    /// ceiling narrowed them into `limits` (set by `run`): a sub-cell
    /// starts from these and gets its own profile's ceiling, exactly as a
    /// top-level cell of its language would.
    pub asked: Option<Limits>,
    pub policy: Policy,
    pub budget: Arc<Budget>,
    /// The session's `emit` events so far (shared by all its cells).
    pub session_emits: Arc<EmitTally>,
    pub run: RunInfo,
    pub session_id: String,
    /// Made on first use: a cell from the Rhai fork server needs none.
    pub scratch: Arc<Scratch>,
    /// The session's profile (for cells of any language) when it names
    /// one; else the supervisor's for the cell's language applies (see
    /// `Inner::profile_name`). Sub-cells inherit it.
    pub profile: Option<String>,
    /// Copy the worker's stdout/stderr to ours as it arrives.
    pub forward_output: Forward,
    /// Kill the cell when cancelled (status `killed`).
    pub cancel: Option<CancellationToken>,
    /// A live copy of stdout/stderr as it arrives.
    pub output: Option<mpsc::Sender<OutputChunk>>,
    pub execution_count: u64,
    /// The session's cgroups (shared by its cells and sub-cells).
    pub share: Arc<Share>,
    /// The session's account (the ledgers its calls also draw from).
    pub account: Account,
    /// A cell of a live Python session: its state process (see
    /// `crate::supervisor::live`).
    #[cfg(target_os = "linux")]
    pub live: Option<Arc<crate::supervisor::live::LiveCell>>,
}

/// What a cell has of its session (a sub-cell of its parent's): shared by
/// all the session's cells.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionView<'a> {
    pub id: &'a str,
    /// The limits its cells start from.
    pub limits: &'a Limits,
    pub policy: &'a Policy,
    pub profile: Option<&'a str>,
    pub emits: &'a Arc<EmitTally>,
    pub scratch: &'a Arc<Scratch>,
    pub share: &'a Arc<Share>,
    pub account: &'a Account,
}

impl CellSpec {
    /// A cell of `session` running `code`: the session's limits, policy,
    /// profile, scratch directory and cgroups, a budget of its own, no
    /// variables or definitions, its output captured only.
    pub(crate) fn new(
        session: SessionView<'_>,
        run: RunInfo,
        language: Language,
        code: impl Into<String>,
    ) -> CellSpec {
        CellSpec {
            language,
            code: code.into(),
            argv: None,
            env: Default::default(),
            vars: Default::default(),
            definitions: Vec::new(),
            limits: session.limits.clone(),
            asked: None,
            policy: session.policy.clone(),
            budget: Arc::new(Budget::default()),
            session_emits: session.emits.clone(),
            run,
            session_id: session.id.to_owned(),
            scratch: session.scratch.clone(),
            profile: session.profile.map(str::to_owned),
            forward_output: Forward::No,
            cancel: None,
            output: None,
            execution_count: 0,
            share: session.share.clone(),
            account: session.account.clone(),
            #[cfg(target_os = "linux")]
            live: None,
        }
    }

    /// What this cell's sub-cells have of its session: the limits it asked
    /// for (before its profile's ceiling) and the rest of its session's.
    pub(crate) fn session(&self) -> SessionView<'_> {
        SessionView {
            id: &self.session_id,
            limits: self.asked.as_ref().unwrap_or(&self.limits),
            policy: &self.policy,
            profile: self.profile.as_deref(),
            emits: &self.session_emits,
            scratch: &self.scratch,
            share: &self.share,
            account: &self.account,
        }
    }

    /// A program to execute (`exec`) rather than `code` for the shell.
    pub(crate) fn argv(mut self, argv: Vec<String>) -> CellSpec {
        self.argv = Some(argv);
        self
    }

    /// Variables `argv` is executed with besides the sandbox's.
    pub(crate) fn env(mut self, env: crate::protocol::ExecEnv) -> CellSpec {
        self.env = env;
        self
    }

    pub(crate) fn vars(mut self, vars: impl Into<std::sync::Arc<Map<String, Value>>>) -> CellSpec {
        self.vars = vars.into();
        self
    }

    pub(crate) fn definitions(mut self, definitions: Vec<Definition>) -> CellSpec {
        self.definitions = definitions;
        self
    }

    pub(crate) fn limits(mut self, limits: Limits) -> CellSpec {
        self.limits = limits;
        self
    }

    /// Share a budget of calls (a sub-cell's is its parent's).
    pub(crate) fn budget(mut self, budget: Arc<Budget>) -> CellSpec {
        self.budget = budget;
        self
    }

    pub(crate) fn scratch(mut self, scratch: Arc<Scratch>) -> CellSpec {
        self.scratch = scratch;
        self
    }

    pub(crate) fn forward(mut self, forward: Forward) -> CellSpec {
        self.forward_output = forward;
        self
    }

    pub(crate) fn cancel(mut self, cancel: Option<CancellationToken>) -> CellSpec {
        self.cancel = cancel;
        self
    }

    pub(crate) fn output(mut self, output: Option<mpsc::Sender<OutputChunk>>) -> CellSpec {
        self.output = output;
        self
    }

    pub(crate) fn execution_count(mut self, n: u64) -> CellSpec {
        self.execution_count = n;
        self
    }

    /// Run on the session's live namespace.
    #[cfg(target_os = "linux")]
    pub(crate) fn live(mut self, live: Option<Arc<crate::supervisor::live::LiveCell>>) -> CellSpec {
        self.live = live;
        self
    }
}

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

/// Run one cell (and, through its `run_cell` calls, its sub-cells); it
/// returns once the cell's whole process tree is gone (its tail over).
pub(crate) fn run(sup: Arc<Inner>, spec: CellSpec) -> BoxFut<(CellResult, Option<Box<Done>>)> {
    Box::pin(async move {
        let (result, done, tail) = run_with(sup, spec, None).await;
        if let Some(t) = tail {
            t.wait().await;
        }
        (result, done)
    })
}

/// The limits a cell of `spec` runs under: the session's and call's, under
/// its profile's ceiling (a profile that does not load fails the cell when
/// it is planned). `spec.asked` keeps the limits before the ceiling.
fn settle_limits(sup: &Inner, spec: &mut CellSpec) {
    spec.asked = Some(spec.limits.clone());
    if let Ok(p) = sup.profile(&profile_name(sup, spec)) {
        spec.limits = spec.limits.under_profile(&p.limits);
    }
}

/// [`run`], in the worker of `prepared` when one was started ahead for
/// this cell (see [`prepare`]; its language and limits are the cell's).
/// A cell whose worker said `done` may be answered before its worker is
/// gone: then its [`Tail`] ends it, and whatever the caller lets go of
/// once the cell is over (its session's next cell, a concurrency slot)
/// waits for that tail.
pub(crate) fn run_with(
    sup: Arc<Inner>,
    mut spec: CellSpec,
    prepared: Option<Prepared>,
) -> BoxFut<(CellResult, Option<Box<Done>>, Option<Tail>)> {
    Box::pin(async move {
        // Every cell passes here, top-level, `exec` and sub-cells alike:
        // the supervisor's languages and the profile's ceiling hold for all
        // cells of code. A program the operator named (`exec`, a declared
        // command tool: an argv, no code a client wrote) runs under the
        // shell profile whatever languages the clients may write in.
        let language_refusal = match spec.argv {
            Some(_) => None,
            None => sup.language_refusal(spec.language),
        };
        if let Some(refusal) = language_refusal {
            let mut r = CellResult::refused_with(
                spec.language.as_str(),
                spec.run.clone(),
                ErrorKind::PermissionError,
                refusal,
            );
            r.execution_count = spec.execution_count;
            count(&r, "none");
            return (r, None, None);
        }
        settle_limits(&sup, &mut spec);
        if let Some(spent) = session_cpu_spent(&spec) {
            if let Some(p) = prepared {
                // Its worker is killed and its group emptied, off the
                // runtime (see `Prepared`).
                tokio::task::spawn_blocking(move || drop(p));
            }
            let mut r = CellResult::refused_with(
                spec.language.as_str(),
                spec.run.clone(),
                ErrorKind::LimitExceeded,
                spent,
            );
            r.execution_count = spec.execution_count;
            count(&r, "none");
            return (r, None, None);
        }
        let _running = Running::new(&sup.cells_running);
        let started = Instant::now();
        let mut result = CellResult::new(spec.language.as_str(), spec.run.clone());
        result.execution_count = spec.execution_count;
        sup.events.record(
            "cell_start",
            &spec.run,
            json!({"language": spec.language.as_str(), "session_id": spec.session_id}),
        );
        let mut path = "none";
        let ran = run_worker(&sup, &spec, &mut result, started, prepared, &mut path).await;
        let (done, tail) = match ran {
            Ok(ended) => ended,
            Err(e) => {
                result.fail_with(ErrorKind::SpawnError, e.to_string());
                (None, None)
            }
        };
        if let Some(report) = result.sandbox.as_mut() {
            // A worker under sandbox-exec joins no cgroup.
            if report.layer(crate::sandbox::Layer::SandboxExec).is_none() {
                report.layers.push(plan::cgroup_layer(&sup, &spec));
            }
        }
        result.usage.wall_ms = started.elapsed().as_millis() as u64;
        result.usage.calls = u32::try_from(result.calls_made()).unwrap_or(u32::MAX);
        // Every cell's result leaves through here (to a client, a parent
        // cell, the agent loop, a terminal): the one redaction first.
        let result = redacted(result);
        sup.events.record(
            "cell_end",
            &spec.run,
            json!({"status": result.status, "wall_ms": result.usage.wall_ms,
                   "error": result.error.as_ref().map(|e| &e.message)}),
        );
        count(&result, path);
        (result, done, tail)
    })
}

/// A cell's result in the process's metrics (see [`crate::metrics`]):
/// `path` is how its worker started (`fresh`, `warm`, `live`), or `none`.
fn count(result: &CellResult, path: &'static str) {
    let m = crate::metrics::get();
    m.cell(
        crate::metrics::CellLabels {
            language: result.language.clone(),
            status: result.status.as_str().to_owned(),
            path,
        },
        result.usage.wall_ms,
    );
    for (stream, text, cut) in [
        ("stdout", &result.stdout, result.truncated.stdout),
        ("stderr", &result.stderr, result.truncated.stderr),
    ] {
        match cut {
            Some(t) => m.output(stream, t.total_bytes, t.kept_head + t.kept_tail),
            None => m.output(stream, text.len() as u64, text.len() as u64),
        }
    }
    if let Some(kind) = result.error.as_ref().and_then(|e| refusal_kind(&e.kind)) {
        m.refusal(kind);
    }
}

/// The refusal a cell's error type counts as, if it is one: a limit or
/// the policy stopped it.
fn refusal_kind(kind: &str) -> Option<&'static str> {
    [
        ErrorKind::Timeout,
        ErrorKind::LimitExceeded,
        ErrorKind::PermissionError,
    ]
    .into_iter()
    .map(ErrorKind::as_str)
    .find(|k| *k == kind)
}

/// `result` with every secret the process holds redacted (see
/// [`crate::secrets`]); one whose redacted form is no longer a result (a
/// secret so short it matched a status name) is replaced by an error that
/// says so, so it is never sent as it was.
fn redacted(result: CellResult) -> CellResult {
    match crate::secrets::redact_typed(result) {
        Ok(r) => r,
        Err(r) => {
            let mut out = CellResult::new(&r.language, r.run.clone());
            out.execution_count = r.execution_count;
            out.usage = r.usage.clone();
            out.fail_with(
                ErrorKind::ProtocolError,
                "the result held a secret that could not be redacted in place; it was withheld"
                    .to_owned(),
            );
            out
        }
    }
}

/// A cell counted in [`Inner::cells_running`] while it is held.
struct Running<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Running<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Running<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Running(count)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The sandbox profile a cell runs under (name or path).
fn profile_name(sup: &Inner, spec: &CellSpec) -> String {
    sup.profile_name(spec.language, spec.profile.as_deref())
}

/// The cell's own cgroup (beneath its session's), unless its profile
/// turns the cgroup layer off; `Err`: why it could not be made.
fn cell_group(sup: &Inner, spec: &CellSpec) -> Result<Option<Arc<CellGroup>>, String> {
    let mode = sup
        .profile(&profile_name(sup, spec))
        .map_or(crate::profiles::LayerMode::BestEffort, |p| p.layers.cgroup);
    if mode == crate::profiles::LayerMode::Off {
        return Ok(None);
    }
    let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
    spec.share
        .cell(sup, &spec.limits, asked)
        .map(|g| g.map(Arc::new))
        .map_err(|e| format!("failed to make the cell's cgroup: {e}"))
}

/// The cell in its own cgroup (beneath its session's), which is emptied
/// when it ends: the group and worker of `prepared`, or made now.
async fn run_worker(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    started: Instant,
    prepared: Option<Prepared>,
    path: &mut &'static str,
) -> Result<(Option<Box<Done>>, Option<Tail>), LaunchError> {
    let (group, launched) = match prepared {
        Some(p) => {
            let (group, launched) = p.into_parts();
            (group, Some(launched))
        }
        None => match cell_group(sup, spec) {
            Ok(g) => (g, None),
            Err(message) => {
                result.fail_with(ErrorKind::SandboxError, message);
                return Ok((None, None));
            }
        },
    };
    let out = life(sup, spec, result, started, group.clone(), launched, path).await;
    end::release_group(group).await;
    out
}

/// A cell in its cgroup, from its launch to its result: start its worker
/// the way that fits (unless it was started ahead: `launched`), converse
/// with it, see it and its whole process tree gone, collect its output and
/// classify how it ended.
async fn life(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    started: Instant,
    group: Option<Arc<CellGroup>>,
    launched: Option<Launched>,
    path: &mut &'static str,
) -> Result<(Option<Box<Done>>, Option<Tail>), LaunchError> {
    let deadline = started + spec.limits.timeout();
    let launched = match launched {
        Some(l) => l,
        None => {
            let launch = Launch::pick(sup, spec).await;
            // None: the cell ended before it started (its result says how).
            let now = crate::supervisor::warm::ForkFor::Now;
            match launch.start(sup, spec, result, started, now, group).await? {
                Some(l) => l,
                None => return Ok((None, None)),
            }
        }
    };
    *path = match (&launched.handshake, spec.live.is_some()) {
        (Handshake::Setup, _) => "fresh",
        (_, true) => "live",
        (_, false) => "warm",
    };
    let Launched {
        started: worker,
        sock,
        backend,
        plan,
        handshake,
        group,
        #[cfg(target_os = "linux")]
        probe,
        preloaded,
    } = launched;
    let streams = Streams::start(spec, worker.stdout, worker.stderr);
    let exit = match worker.exit {
        Ok(f) => f,
        Err(e) => {
            drop(worker.guard);
            return Err(LaunchError::io("watch the worker process")(e));
        }
    };
    // Rhai's per-tool functions need the tools of the upstream servers
    // the policy names (listing them starts the servers).
    let sourced = if spec.language == Language::Rhai {
        calls::source_specs(sup, spec, deadline).await
    } else {
        Vec::new()
    };
    let (setup, start) = opening(sup, spec, backend, plan, sourced, preloaded);
    let conv = Conversation::new(handshake, setup, start);
    let meter = cpu_meter(sup, spec, group.as_ref());
    let (outcome, writer) = converse(
        sup,
        spec,
        result,
        sock,
        (&exit, meter.as_ref()),
        deadline,
        conv,
    )
    .await;
    // A worker that said `done` lingers until it is let go: what it used is
    // read from it first, and then the cell is answered without waiting for
    // its exit (not a live session's cell, whose process may carry on).
    #[allow(unused_mut)]
    let mut answer_now = matches!(outcome, Outcome::Done(_));
    #[cfg(target_os = "linux")]
    if spec.live.is_some() {
        answer_now = false;
    }
    #[cfg(target_os = "linux")]
    let used = answer_now
        .then(|| end::at_done(probe.as_ref(), &exit, group.as_ref()))
        .flatten();
    #[cfg(not(target_os = "linux"))]
    let used = answer_now
        .then(|| end::at_done(&exit, group.as_ref()))
        .flatten();
    if let Some(used) = used {
        let ending = end::Worker {
            pid: worker.pid,
            guard: worker.guard,
            reap: worker.reap,
            in_flight: worker.in_flight,
        };
        // Stopped with its whole tree before the answer (what it used is
        // read by now); its tail waits for them to be gone.
        #[cfg(target_os = "linux")]
        let host = probe.as_ref().map(crate::sandbox::process::Probe::pid);
        #[cfg(not(target_os = "linux"))]
        let host = None;
        end::stop_at_done(&ending, host, &exit, group.as_ref());
        // What it wrote before `done` is still in its pipes.
        let (stdout, stderr) = streams.drain().await;
        result.record_end(stdout, stderr, Some(&used));
        let tail = end::Tail::start(ending, writer, exit, group, spec.scratch.clone());
        let exec = spec.language.is_shell();
        return Ok((classify(&spec.limits, exec, result, outcome), Some(tail)));
    }
    drop(writer);
    // A live session's cell that succeeded has forked its successor: it
    // leaves the cell's group before the group is emptied.
    // Or its own process became that state process: it does not exit.
    #[allow(unused_mut)]
    let mut became = None;
    #[cfg(target_os = "linux")]
    if let (Some(live), Outcome::Done(d)) = (&spec.live, &outcome) {
        if d.status == DoneStatus::Ok && d.live.is_some() {
            let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
            let session = spec.share.session(sup, asked);
            live.take_over(session.as_ref()).await;
            became = live.became(worker.pid);
        }
    }
    let ending = end::Worker {
        pid: worker.pid,
        guard: worker.guard,
        reap: worker.reap,
        in_flight: worker.in_flight,
    };
    let done = matches!(outcome, Outcome::Done(_));
    let reaped = match became {
        Some(usage) => Ok(end::kept_as_state(ending, usage, group.as_ref()).await),
        None => end::end(ending, &exit, done, group.as_ref()).await,
    };
    #[cfg(target_os = "linux")]
    if let Some(live) = &spec.live {
        // (Also when it did not get to run there: the session's own process
        // bound is put back.)
        let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
        let killed = live.end_others(spec.share.session(sup, asked)).await;
        if killed > 0 {
            result.notes.push(format!(
                "{killed} process(es) left in the session's group when the cell ended \
                 (neither its state process nor a checkpoint) were killed"
            ));
            sup.events.record(
                "session_processes_killed",
                &spec.run,
                json!({"session_id": spec.session_id, "killed": killed, "when": "cell_end"}),
            );
        }
    }
    let (stdout, stderr) = streams.collect().await;
    result.record_end(stdout, stderr, reaped.as_ref().ok());
    #[cfg(target_os = "linux")]
    if spec.live.is_some() {
        // A live cell's CPU time is its session's while it ran.
        if let Some(ns) = meter.as_ref().and_then(cpu::CpuMeter::used_ns) {
            result.usage.cpu_ms = result.usage.cpu_ms.max(ns / 1_000_000);
        }
    }
    let exec = spec.language.is_shell();
    let done = classify(&spec.limits, exec, result, outcome);
    #[cfg(target_os = "linux")]
    {
        let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
        let (session_bytes, _) = crate::supervisor::tenancy::session_bounds(sup, asked);
        crate::supervisor::tenancy::explain_kill(group.as_ref(), session_bytes, result);
    }
    Ok((done, None))
}

/// What holds the cell to its CPU-time limit over all its processes (see
/// `cpu`): the count of its own group, or of its session's for a live
/// cell; none without a group.
#[cfg(target_os = "linux")]
fn cpu_meter(
    sup: &Inner,
    spec: &CellSpec,
    group: Option<&Arc<CellGroup>>,
) -> Option<cpu::CpuMeter> {
    let limit = spec.limits.rlimits.cpu_seconds;
    let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
    // A live cell runs in its session's group; another without a group
    // of its own (its profile turns the layer off) has none of its
    // session's either.
    let session = match (&spec.live, group) {
        (None, None) => None,
        _ => spec.share.session(sup, asked),
    };
    let cell = if spec.live.is_some() {
        session.clone().and_then(|s| {
            cpu::CpuMeter::new(
                Box::new(move || s.cpu_ns()),
                limit,
                "the session's processes (while the cell ran)",
            )
        })
    } else {
        group.cloned().and_then(|g| {
            cpu::CpuMeter::new(Box::new(move || g.cpu_ns()), limit, "the cell's processes")
        })
    };
    match session {
        Some(s) => cpu::CpuMeter::with_session(
            cell,
            Box::new(move || s.cpu_used_ns()),
            spec.limits.session_cpu_seconds,
        ),
        None => cell,
    }
}

/// Why the cell may not start: its session's CPU budget is spent (see
/// `cpu`); never before its session's first cell made the session's group.
#[cfg(target_os = "linux")]
fn session_cpu_spent(spec: &CellSpec) -> Option<String> {
    let used = spec.share.made()?.cpu_used_ns()?;
    cpu::session_spent(used, spec.limits.session_cpu_seconds)
}

#[cfg(not(target_os = "linux"))]
fn session_cpu_spent(_spec: &CellSpec) -> Option<String> {
    None
}

#[cfg(not(target_os = "linux"))]
fn cpu_meter(
    _sup: &Inner,
    _spec: &CellSpec,
    _group: Option<&Arc<CellGroup>>,
) -> Option<cpu::CpuMeter> {
    None
}

/// Turn the outcome and exit information into the result's status/error
/// (`exec`: the cell ran a program, whose exit is its whole story). The
/// one-shot supervisor classifies its cells here too.
pub(crate) fn classify(
    limits: &Limits,
    exec: bool,
    result: &mut CellResult,
    outcome: Outcome,
) -> Option<Box<Done>> {
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
            super::display::take(limits, result, &done);
            Some(done)
        }
        Outcome::Timeout => {
            result.timed_out(limits);
            None
        }
        Outcome::Fatal(kind, message) => {
            result.fail_with(kind, message);
            None
        }
        Outcome::Exited => {
            result.classify_exit(limits, exec);
            None
        }
    }
}
