//! The I/O side of a cell's conversation: the frames that open it, the
//! socket, the deadline and cancellation around the sans-I/O
//! [`Conversation`].

use super::calls::handle_call;
use super::conversation::{Conversation, Outcome, Step};
use super::CellSpec;
use crate::protocol::{
    read_frame_async_within, write_frame_async, Backend, FrameError, FromWorker, Setup, Start,
    ToWorker,
};
use crate::sandbox::{process, SandboxPlan};
use crate::supervisor::result::{CellResult, ErrorKind, Status};
use crate::supervisor::Inner;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

/// How long a frame's body may take to arrive once its length came.
const FRAME_BODY_WITHIN: Duration = Duration::from_secs(5);

/// The frames that begin a cell: `setup` (for a worker that needs its plan)
/// and `start` (none for a program, which speaks no protocol).
pub(super) fn opening(
    sup: &Inner,
    spec: &CellSpec,
    backend: Backend,
    plan: Option<SandboxPlan>,
    sourced: Vec<crate::protocol::CapabilitySpec>,
) -> (Option<ToWorker>, Option<ToWorker>) {
    let start = (!matches!(backend, Backend::Exec { .. })).then(|| {
        let (vars, definitions) =
            live_part(spec).unwrap_or_else(|| (Map::clone(&spec.vars), spec.definitions.clone()));
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
                .collect(),
            limits: spec.limits.script_limits(),
            max_frame_bytes: spec.limits.max_frame_bytes,
            python_paths: python_paths(sup, spec),
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
pub(super) async fn converse(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    sock: std::os::unix::net::UnixStream,
    exit_fd: &process::ExitWatch,
    deadline: Instant,
    mut conv: Conversation,
) -> Outcome {
    let max_frame = spec.limits.max_frame_bytes;
    let stream = match sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(sock))
    {
        Ok(s) => s,
        Err(e) => {
            return Outcome::Fatal(
                ErrorKind::SpawnError,
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
    let deadline_t = tokio::time::Instant::from_std(deadline);
    let mut step = conv.begin();
    let outcome = loop {
        // Carry out the step at hand, then wait for the next input.
        match step {
            Step::Wait => {}
            Step::Finish(o) => break o,
            Step::Send(frame) => {
                if let Err(SendError::Deadline) = send(&mut wr, &frame, max_frame, deadline_t).await
                {
                    break Outcome::Timeout;
                }
            }
            Step::Offer(frame) => {
                if let Err(e) = send(&mut wr, &frame, max_frame, deadline_t).await {
                    tracing::debug!("worker went away before start: {e}");
                }
            }
            Step::Call(call) => match handle_call(sup, spec, result, call, deadline).await {
                Ok((reply, denied)) => {
                    step = conv.answered(reply, denied);
                    continue;
                }
                Err(fatal) => break fatal,
            },
            Step::Emit(call) => {
                if let Err(fatal) = handle_call(sup, spec, result, call, deadline).await {
                    break fatal;
                }
            }
            Step::Log(l) => {
                let msg: String = l.message.chars().take(2000).collect();
                tracing::info!(run_id = %spec.run.run_id, level = %l.level, "worker: {msg}");
            }
        }
        step = tokio::select! {
            biased;
            msg = rx.recv(), if conv.listening() => match msg {
                Some(Ok(frame)) => conv.on(frame),
                Some(Err(e)) => conv.on_bad_frame(e),
                None => conv.on_bad_frame(FrameError::Closed),
            },
            _ = exit_fd.exited() => {
                // The worker is gone; a `done` may still be queued.
                let mut last = Outcome::Exited;
                let mut open = conv.listening();
                while open {
                    let next = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
                    let Ok(Some(Ok(frame))) = next else { break };
                    if let Some(o) = conv.after_exit(frame) {
                        last = o;
                        open = false;
                    }
                }
                Step::Finish(last)
            }
            _ = cancelled(spec.cancel.as_ref()) => Step::Finish(Outcome::interrupted()),
            _ = tokio::time::sleep_until(deadline_t) => Step::Finish(Outcome::Timeout),
        };
    };
    reader.abort();
    let _ = wr.shutdown().await;
    let ended = conv.end(outcome);
    if let Some(report) = ended.report {
        result.sandbox = Some(report);
    }
    if ended.policy_denied {
        result.status = Status::PolicyDenied;
    }
    ended.outcome
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
fn live_part(spec: &CellSpec) -> Option<(Map<String, Value>, Vec<crate::protocol::Definition>)> {
    use std::sync::atomic::Ordering::SeqCst;
    let l = spec.live.as_ref()?;
    (l.running.load(SeqCst) && !l.fresh.load(SeqCst)).then(|| (l.pending_vars.clone(), Vec::new()))
}

#[cfg(not(target_os = "linux"))]
fn live_part(_spec: &CellSpec) -> Option<(Map<String, Value>, Vec<crate::protocol::Definition>)> {
    None
}
