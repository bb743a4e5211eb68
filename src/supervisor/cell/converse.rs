//! The I/O side of a cell's conversation: the frames that open it, the
//! socket, the deadline and cancellation around the sans-I/O
//! [`Conversation`].

use super::calls::handle_call;
use super::conversation::{Conversation, Outcome, Step};
use super::CellSpec;
use crate::protocol::{
    write_frame_async, Backend, FrameError, FrameReader, FromWorker, Setup, Start, ToWorker,
};
use crate::sandbox::{process, SandboxPlan};
use crate::supervisor::result::{CellResult, ErrorKind, Status};
use crate::supervisor::{Inner, Namespace};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// How long a frame's body may take to arrive once its length came.
const FRAME_BODY_WITHIN: Duration = Duration::from_secs(5);

/// Frames read ahead while a frame of ours is written or a call is
/// performed, before the worker is left to wait (its socket full).
const READ_AHEAD: usize = 8;

/// The worker's frames as they arrive, and those that arrived while this
/// side was busy: one task reads and answers, with no hop to a reader
/// task between a frame's arrival and its handling.
struct Incoming {
    frames: FrameReader<OwnedReadHalf>,
    early: VecDeque<Result<FromWorker, FrameError>>,
}

impl Incoming {
    /// The next frame: one that arrived early, else the next to come.
    async fn next(&mut self) -> Result<FromWorker, FrameError> {
        match self.early.pop_front() {
            Some(f) => f,
            None => self.frames.next().await,
        }
    }

    /// Run `work` (a frame of ours written, a call performed) while the
    /// worker's frames keep being read: a worker writing to us while we
    /// write to it would otherwise wait on us as we wait on it.
    async fn beside<T>(&mut self, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        loop {
            let reading = self.early.len() < READ_AHEAD && !self.frames.failed();
            tokio::select! {
                biased;
                out = &mut work => return out,
                f = self.frames.next(), if reading => self.early.push_back(f),
            }
        }
    }
}

/// The frames that begin a cell: `setup` (for a worker that needs its plan)
/// and `start` (none for a program, which speaks no protocol).
pub(super) fn opening(
    sup: &Inner,
    spec: &CellSpec,
    backend: Backend,
    plan: Option<SandboxPlan>,
    sourced: Vec<crate::protocol::CapabilitySpec>,
    preloaded: Option<std::sync::Weak<Namespace>>,
) -> (Option<ToWorker>, Option<ToWorker>) {
    let start = (!matches!(backend, Backend::Exec { .. })).then(|| {
        let (vars, definitions) =
            live_part(spec).unwrap_or_else(|| (spec.vars.clone(), spec.definitions.clone()));
        // Variables sent ahead are the cell's if the session has not
        // changed them since (the same namespace, not an equal one).
        let preloaded = preloaded.is_some_and(|p| super::prepared::same_namespace(&p, &vars));
        let vars = if preloaded { Arc::default() } else { vars };
        ToWorker::Start(Start {
            language: spec.language.as_str().to_owned(),
            code: spec.code.clone(),
            vars,
            definitions,
            capabilities: sup
                .registry
                .iter()
                .map(|c| c.spec())
                .chain(sourced)
                .map(|mut c| {
                    c.allowed = spec.policy.permits(&c.name);
                    c
                })
                .collect(),
            limits: spec.limits.script_limits(),
            max_frame_bytes: spec.limits.max_frame_bytes,
            python_paths: python_paths(sup, spec),
            // Its usage is read from it at `done` (see `end::at_done`).
            linger: true,
            preloaded,
        })
    });
    let setup = plan.map(|plan| ToWorker::Setup(Setup { backend, plan }));
    (setup, start)
}

/// The profile's package paths for a Python cell (none for other
/// languages, or when the profile cannot be loaded: the plan reports that).
fn python_paths(sup: &Inner, spec: &CellSpec) -> Vec<String> {
    if spec.language != crate::supervisor::Language::Python {
        return Vec::new();
    }
    sup.profile(&super::profile_name(sup, spec))
        .map(|p| p.python.path_strings())
        .unwrap_or_default()
}

/// Drive `conv` over the worker's protocol socket until the cell's end:
/// read its frames, write ours, perform its calls, and watch its exit, the
/// deadline and cancellation. The worker's sandbox report goes to `result`.
/// After a `done`, the channel's writing half is handed back open: the
/// worker lingers until it is dropped (see `end::at_done`).
pub(super) async fn converse(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    sock: std::os::unix::net::UnixStream,
    (exit_fd, meter): (&process::ExitWatch, Option<&super::cpu::CpuMeter>),
    deadline: Instant,
    mut conv: Conversation,
) -> (Outcome, Option<OwnedWriteHalf>) {
    let max_frame = spec.limits.max_frame_bytes;
    let stream = match sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(sock))
    {
        Ok(s) => s,
        Err(e) => {
            let o = Outcome::Fatal(
                ErrorKind::SpawnError,
                format!("failed to set up the protocol channel: {e}"),
            );
            return (o, None);
        }
    };
    let (rd, mut wr) = stream.into_split();
    // A started frame must finish promptly: a worker that sends a length
    // prefix and then stalls is a protocol error, not a wait until the
    // deadline.
    let mut incoming = Incoming {
        frames: FrameReader::new(rd, max_frame, Some(FRAME_BODY_WITHIN)),
        early: VecDeque::new(),
    };
    let deadline_t = tokio::time::Instant::from_std(deadline);
    let mut step = conv.begin();
    let outcome = loop {
        // Carry out the step at hand, then wait for the next input.
        match step {
            Step::Wait => {}
            Step::Finish(o) => break o,
            Step::Send(frame) => {
                let sent = incoming
                    .beside(send(&mut wr, &frame, max_frame, deadline_t))
                    .await;
                if let Err(SendError::Deadline) = sent {
                    break Outcome::Timeout;
                }
            }
            Step::Offer(frame) => {
                let sent = incoming
                    .beside(send(&mut wr, &frame, max_frame, deadline_t))
                    .await;
                if let Err(e) = sent {
                    tracing::debug!("worker went away before start: {e}");
                }
            }
            Step::Call(call) => {
                let done = incoming
                    .beside(handle_call(sup, spec, result, call, deadline))
                    .await;
                match done {
                    Ok((reply, denied)) => {
                        step = conv.answered(reply, denied);
                        continue;
                    }
                    Err(fatal) => break fatal,
                }
            }
            Step::Emit(call) => {
                let done = incoming
                    .beside(handle_call(sup, spec, result, call, deadline))
                    .await;
                if let Err(fatal) = done {
                    break fatal;
                }
            }
            Step::Log(l) => {
                let msg: String = l.message.chars().take(2000).collect();
                tracing::info!(run_id = %spec.run.run_id, level = %l.level, "worker: {msg}");
            }
        }
        let look = meter.map(|m| tokio::time::Instant::now() + m.next_look());
        step = tokio::select! {
            biased;
            msg = incoming.next(), if conv.listening() => match msg {
                Ok(frame) => conv.on(frame),
                Err(e) => conv.on_bad_frame(e),
            },
            _ = exit_fd.exited() => {
                // The worker is gone; a `done` may still be on its way.
                let mut last = Outcome::Exited;
                let mut open = conv.listening();
                while open {
                    let next = tokio::time::timeout(Duration::from_millis(200), incoming.next()).await;
                    let Ok(Ok(frame)) = next else { break };
                    if let Some(o) = conv.after_exit(frame) {
                        last = o;
                        open = false;
                    }
                }
                Step::Finish(last)
            }
            _ = cancelled(spec.cancel.as_ref()) => Step::Finish(Outcome::interrupted()),
            _ = tokio::time::sleep_until(deadline_t) => Step::Finish(Outcome::Timeout),
            _ = sleep_until_some(look) => match meter.and_then(super::cpu::CpuMeter::over) {
                Some(why) => Step::Finish(Outcome::Fatal(ErrorKind::LimitExceeded, why)),
                None => Step::Wait,
            },
        };
    };
    let writer = if matches!(outcome, Outcome::Done(_)) {
        Some(wr)
    } else {
        let _ = wr.shutdown().await;
        None
    };
    let ended = conv.end(outcome);
    if let Some(report) = ended.report {
        result.sandbox = Some(report);
    }
    if ended.policy_denied {
        result.status = Status::PolicyDenied;
    }
    (ended.outcome, writer)
}

/// Resolves at `at` (never without one).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves when `token` is cancelled (never without one).
async fn cancelled(token: Option<&tokio_util::sync::CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
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

/// For a cell on a live namespace that was there before it: the variables
/// set since the last cell and no definitions (the namespace has them);
/// `None` for any other cell, and for a new state process (which the start
/// frame seeds with the carried ones).
#[cfg(target_os = "linux")]
fn live_part(spec: &CellSpec) -> Option<(Arc<Namespace>, Vec<crate::protocol::Definition>)> {
    use std::sync::atomic::Ordering::SeqCst;
    let l = spec.live.as_ref()?;
    (l.running.load(SeqCst) && !l.fresh.load(SeqCst))
        .then(|| (Arc::new(l.pending_vars.clone()), Vec::new()))
}

#[cfg(not(target_os = "linux"))]
fn live_part(_spec: &CellSpec) -> Option<(Arc<Namespace>, Vec<crate::protocol::Definition>)> {
    None
}
