//! The supervisor's side of one cell's protocol conversation, as a state
//! machine without I/O: it is fed what the worker sent (and that the
//! worker exited) and answers with the next step. The driver in
//! `cell::converse` does the reading, writing, waiting and calls.
//!
//! The order it holds: a worker says `ready` (or `sandbox_error`) before
//! anything else, then calls, emits and logs, then `done`. An `exec`
//! worker runs a program, which speaks no protocol: after its `ready` any
//! frame from it is a protocol error. Whatever comes out of that order
//! ends the cell with a protocol error, except after the worker exited:
//! then only a queued `ready`, `sandbox_error` or `done` counts.

use crate::protocol::{Call, Done, FrameError, FromWorker, Log, SandboxFailure, ToWorker};
use crate::sandbox::SandboxReport;
use crate::supervisor::result::ErrorKind;
use serde_json::Map;

/// A cell's outcome before it is turned into a result.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done(Box<Done>),
    Timeout,
    Exited,
    Fatal(ErrorKind, String),
}

impl Outcome {
    /// The cell was cancelled.
    pub(crate) fn interrupted() -> Outcome {
        Outcome::Fatal(
            ErrorKind::Interrupted,
            "the cell was interrupted and killed; this result keeps what it printed until then"
                .into(),
        )
    }

    /// A mandatory layer of the sandbox could not be applied.
    pub(crate) fn sandbox_failure(f: &SandboxFailure) -> Outcome {
        Outcome::Fatal(
            ErrorKind::SandboxError,
            format!("the {} layer could not be applied: {}", f.layer, f.message),
        )
    }

    fn protocol(message: String) -> Outcome {
        Outcome::Fatal(ErrorKind::ProtocolError, message)
    }
}

/// How a worker comes to be ready for `start`.
#[derive(Debug)]
pub(crate) enum Handshake {
    /// It needs the `setup` frame and answers `ready`.
    Setup,
    /// It was sandboxed without one and sends `ready` by itself.
    SelfReady,
    /// It is ready already (the report is known).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    // used by the Linux-only warm paths
    PreReady(SandboxReport),
}

/// What the driver does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing: wait for the next input.
    Wait,
    /// Write this frame; if the cell's deadline comes first, the cell
    /// timed out (`Outcome::Timeout`). Other write errors are left to the
    /// worker's end to explain.
    Send(ToWorker),
    /// Write this frame if the worker takes it; a failure is only noted
    /// (a worker that went away says so by its exit).
    Offer(ToWorker),
    /// Perform this capability call and give its answer to
    /// [`Conversation::answered`]; a call that ends the cell ends it.
    Call(Call),
    /// Perform this `emit` (as a call without a reply); one that ends the
    /// cell ends it.
    Emit(Call),
    /// Log what the worker logged.
    Log(Log),
    /// The conversation is over.
    Finish(Outcome),
}

/// The conversation's state.
#[derive(Debug)]
pub(crate) struct Conversation {
    handshake: Option<Handshake>,
    /// The `setup` frame, for a worker that needs one.
    setup: Option<ToWorker>,
    /// The `start` frame until it is sent (none for `exec`).
    start: Option<ToWorker>,
    /// The worker said `ready` (or arrived ready).
    ready: bool,
    /// It runs a program (no protocol after `ready`).
    exec: bool,
    /// Its frames may still come (the channel has not closed).
    open: bool,
    /// A call of it was refused (denied or unknown).
    deny_seen: bool,
    /// Its sandbox report, once known.
    report: Option<SandboxReport>,
}

/// The conversation's end: its outcome, the worker's sandbox report, and
/// whether its end was a refused call (a `PermissionError` after a denial).
#[derive(Debug)]
pub(crate) struct Ended {
    pub outcome: Outcome,
    pub report: Option<SandboxReport>,
    pub policy_denied: bool,
}

impl Conversation {
    /// A conversation with a worker that becomes ready by `handshake`,
    /// is set up by `setup` (when it needs it) and runs `start` (none for
    /// a program).
    pub(crate) fn new(
        handshake: Handshake,
        setup: Option<ToWorker>,
        start: Option<ToWorker>,
    ) -> Conversation {
        Conversation {
            handshake: Some(handshake),
            setup,
            exec: start.is_none(),
            start,
            ready: false,
            open: true,
            deny_seen: false,
            report: None,
        }
    }

    /// Its first step: the first frame to send, if any.
    pub(crate) fn begin(&mut self) -> Step {
        let first = match self.handshake.take() {
            None => return Step::Wait,
            Some(Handshake::Setup) if self.setup.is_none() => {
                return Step::Finish(Outcome::Fatal(
                    ErrorKind::SpawnError,
                    "a worker that needs a setup frame was started without a plan".into(),
                ))
            }
            Some(Handshake::Setup) => self.setup.take(),
            // A forked worker sandboxes itself from the server's plan and
            // says `ready` by itself; `start` can wait in its socket
            // meanwhile (it reads nothing before its layers are on, and
            // nothing it sends counts before its `ready`).
            Some(Handshake::SelfReady) => self.start.take(),
            // A zygote's cell arrives sandboxed: it reads `start` straight
            // away.
            Some(Handshake::PreReady(report)) => {
                self.ready = true;
                self.report = Some(report);
                self.start.take()
            }
        };
        first.map_or(Step::Wait, Step::Send)
    }

    /// Whether frames from the worker may still come.
    pub(crate) fn listening(&self) -> bool {
        self.open
    }

    /// A frame from the worker while it runs.
    pub(crate) fn on(&mut self, frame: FromWorker) -> Step {
        let speaks = self.ready && !self.exec;
        match frame {
            FromWorker::Ready(r) if !self.ready => {
                self.ready = true;
                self.report = Some(r.report);
                self.start.take().map_or(Step::Wait, Step::Offer)
            }
            FromWorker::SandboxError(f) if !self.ready => {
                Step::Finish(Outcome::sandbox_failure(&f))
            }
            FromWorker::Call(call) if speaks => Step::Call(call),
            FromWorker::Emit { event } if speaks => {
                let mut args = Map::new();
                args.insert("event".into(), event);
                Step::Emit(Call {
                    id: 0,
                    cap: "emit".into(),
                    args,
                })
            }
            FromWorker::Log(l) if speaks => Step::Log(l),
            FromWorker::Done(done) if speaks => Step::Finish(Outcome::Done(done)),
            other => {
                let tag = match other {
                    FromWorker::Ready(_) => "ready",
                    FromWorker::SandboxError(_) => "sandbox_error",
                    FromWorker::Call(_) => "call",
                    FromWorker::Emit { .. } => "emit",
                    FromWorker::Log(_) => "log",
                    FromWorker::Done(_) => "done",
                };
                Step::Finish(Outcome::protocol(format!(
                    "the worker sent an unexpected {tag:?} message"
                )))
            }
        }
    }

    /// A frame that could not be read: the channel closed (the worker's
    /// exit will end the cell), or it was malformed.
    pub(crate) fn on_bad_frame(&mut self, e: FrameError) -> Step {
        match e {
            FrameError::Closed => {
                self.open = false;
                Step::Wait
            }
            e => Step::Finish(Outcome::protocol(format!(
                "the worker sent a bad frame: {e}"
            ))),
        }
    }

    /// The answer to the call of the last [`Step::Call`]; `denied` when it
    /// was refused.
    pub(crate) fn answered(&mut self, reply: crate::protocol::Reply, denied: bool) -> Step {
        self.deny_seen |= denied;
        Step::Send(ToWorker::Reply(reply))
    }

    /// A frame still queued when the worker had exited: `Some` ends the
    /// cell with it; `None` looks at the next one, if any. Once none is
    /// left the cell ended by the worker's exit ([`Outcome::Exited`]).
    pub(crate) fn after_exit(&mut self, frame: FromWorker) -> Option<Outcome> {
        match frame {
            // A fast program may exit before its `ready` was read.
            FromWorker::Ready(r) if !self.ready => {
                self.ready = true;
                self.report = Some(r.report);
                None
            }
            FromWorker::Done(d) if self.ready && !self.exec => Some(Outcome::Done(d)),
            FromWorker::SandboxError(f) if !self.ready => Some(Outcome::sandbox_failure(&f)),
            _ => None,
        }
    }

    /// The conversation ended with `outcome`.
    pub(crate) fn end(self, outcome: Outcome) -> Ended {
        let policy_denied = self.deny_seen
            && matches!(&outcome, Outcome::Done(d)
                if d.status == crate::protocol::DoneStatus::Error
                    && d.error.as_ref().map(|e| e.kind.as_str()) == Some("PermissionError"));
        Ended {
            outcome,
            report: self.report,
            policy_denied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DoneStatus, Ready, Reply, ReplyError, ScriptError, Start};
    use serde_json::json;

    fn report(tag: &str) -> SandboxReport {
        SandboxReport {
            profile: tag.into(),
            ..SandboxReport::default()
        }
    }

    fn ready(tag: &str) -> FromWorker {
        FromWorker::Ready(Ready {
            report: report(tag),
        })
    }

    fn start() -> ToWorker {
        ToWorker::Start(Start {
            language: "python".into(),
            code: "1".into(),
            vars: Default::default(),
            definitions: Vec::new(),
            capabilities: Vec::new(),
            limits: crate::supervisor::Limits::default().script_limits(),
            max_frame_bytes: 1 << 20,
            python_paths: Vec::new(),
            linger: false,
            preloaded: false,
        })
    }

    /// A stand-in for the `setup` frame (the machine only passes it on).
    fn setup() -> ToWorker {
        ToWorker::Reply(Reply {
            id: 99,
            ok: None,
            error: None,
        })
    }

    fn done(status: DoneStatus, kind: Option<&str>) -> FromWorker {
        let mut d: Done = serde_json::from_value(json!({ "status": status }))
            .unwrap_or_else(|e| panic!("a done frame: {e}"));
        d.error = kind.map(|k| ScriptError {
            kind: k.into(),
            message: "m".into(),
            ..ScriptError::default()
        });
        FromWorker::Done(Box::new(d))
    }

    fn call(id: u64) -> FromWorker {
        FromWorker::Call(Call {
            id,
            cap: "answer".into(),
            args: Map::new(),
        })
    }

    fn is_start(s: &Step) -> bool {
        matches!(
            s,
            Step::Send(ToWorker::Start(_)) | Step::Offer(ToWorker::Start(_))
        )
    }

    fn protocol_error(s: Step, tag: &str) {
        match s {
            Step::Finish(Outcome::Fatal(ErrorKind::ProtocolError, m)) => {
                assert_eq!(m, format!("the worker sent an unexpected {tag:?} message"))
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    fn finished_done(s: Step) -> Box<Done> {
        match s {
            Step::Finish(Outcome::Done(d)) => d,
            other => panic!("expected done, got {other:?}"),
        }
    }

    #[test]
    fn setup_then_ready_then_start_then_done() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        assert!(matches!(c.begin(), Step::Send(ToWorker::Reply(r)) if r.id == 99));
        let s = c.on(ready("cold"));
        assert!(matches!(s, Step::Offer(ToWorker::Start(_))));
        assert!(matches!(c.on(call(1)), Step::Call(c) if c.id == 1));
        let s = c.answered(
            Reply {
                id: 1,
                ok: Some(json!(1)),
                error: None,
            },
            false,
        );
        assert!(matches!(s, Step::Send(ToWorker::Reply(r)) if r.id == 1));
        let log = FromWorker::Log(Log {
            level: "info".into(),
            message: "hi".into(),
        });
        assert!(matches!(c.on(log), Step::Log(l) if l.message == "hi"));
        let emit = FromWorker::Emit { event: json!(7) };
        match c.on(emit) {
            Step::Emit(call) => {
                assert_eq!((call.id, call.cap.as_str()), (0, "emit"));
                assert_eq!(call.args.get("event"), Some(&json!(7)));
            }
            other => panic!("expected an emit, got {other:?}"),
        }
        let d = finished_done(c.on(done(DoneStatus::Ok, None)));
        let end = c.end(Outcome::Done(d));
        assert_eq!(end.report.map(|r| r.profile), Some("cold".into()));
        assert!(!end.policy_denied);
    }

    #[test]
    fn setup_without_a_plan_fails_to_spawn() {
        let mut c = Conversation::new(Handshake::Setup, None, Some(start()));
        match c.begin() {
            Step::Finish(Outcome::Fatal(ErrorKind::SpawnError, _)) => {}
            other => panic!("expected a spawn error, got {other:?}"),
        }
    }

    #[test]
    fn self_ready_gets_start_first_and_nothing_after_ready() {
        let mut c = Conversation::new(Handshake::SelfReady, None, Some(start()));
        assert!(is_start(&c.begin()));
        assert!(matches!(c.on(ready("forked")), Step::Wait));
        finished_done(c.on(done(DoneStatus::Ok, None)));
    }

    #[test]
    fn pre_ready_gets_start_and_may_call_at_once() {
        let mut c = Conversation::new(Handshake::PreReady(report("warm")), None, Some(start()));
        assert!(is_start(&c.begin()));
        assert!(matches!(c.on(call(3)), Step::Call(_)));
        // It is ready already: a `ready` of its own is out of order.
        protocol_error(c.on(ready("again")), "ready");
        let end = c.end(Outcome::Timeout);
        assert_eq!(end.report.map(|r| r.profile), Some("warm".into()));
    }

    #[test]
    fn frames_before_ready_are_protocol_errors() {
        for (frame, tag) in [
            (call(1), "call"),
            (FromWorker::Emit { event: json!(1) }, "emit"),
            (
                FromWorker::Log(Log {
                    level: "info".into(),
                    message: "x".into(),
                }),
                "log",
            ),
            // A `done` forged before `ready` ends nothing well.
            (done(DoneStatus::Ok, None), "done"),
        ] {
            let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
            c.begin();
            protocol_error(c.on(frame), tag);
        }
    }

    #[test]
    fn a_second_ready_or_a_late_sandbox_error_is_a_protocol_error() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        c.on(ready("a"));
        protocol_error(c.on(ready("b")), "ready");
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        c.on(ready("a"));
        let f = FromWorker::SandboxError(SandboxFailure {
            layer: "seccomp".into(),
            message: "m".into(),
        });
        protocol_error(c.on(f), "sandbox_error");
    }

    #[test]
    fn an_exec_worker_speaks_no_protocol_after_ready() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), None);
        assert!(matches!(c.begin(), Step::Send(_)));
        assert!(matches!(c.on(ready("exec")), Step::Wait));
        protocol_error(c.on(call(1)), "call");
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), None);
        c.begin();
        c.on(ready("exec"));
        protocol_error(c.on(done(DoneStatus::Ok, None)), "done");
    }

    #[test]
    fn sandbox_error_before_ready_fails_the_cell() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        let f = FromWorker::SandboxError(SandboxFailure {
            layer: "landlock".into(),
            message: "no".into(),
        });
        match c.on(f) {
            Step::Finish(Outcome::Fatal(ErrorKind::SandboxError, m)) => {
                assert_eq!(m, "the landlock layer could not be applied: no")
            }
            other => panic!("expected a sandbox error, got {other:?}"),
        }
    }

    #[test]
    fn a_closed_channel_waits_for_the_exit_and_a_bad_frame_ends_it() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        assert!(c.listening());
        assert!(matches!(c.on_bad_frame(FrameError::Closed), Step::Wait));
        assert!(!c.listening());
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        let e = FrameError::Oversize { len: 9, max: 1 };
        match c.on_bad_frame(e) {
            Step::Finish(Outcome::Fatal(ErrorKind::ProtocolError, m)) => {
                assert!(m.starts_with("the worker sent a bad frame: "), "{m}")
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn after_exit_queued_ready_and_done_still_count() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        assert!(c.after_exit(ready("late")).is_none());
        // Out of order after the exit: skipped, not a protocol error.
        assert!(c.after_exit(ready("again")).is_none());
        assert!(c.after_exit(call(1)).is_none());
        match c.after_exit(done(DoneStatus::Ok, None)) {
            Some(Outcome::Done(_)) => {}
            other => panic!("expected done, got {other:?}"),
        }
        let end = c.end(Outcome::Exited);
        assert_eq!(end.report.map(|r| r.profile), Some("late".into()));
    }

    #[test]
    fn after_exit_a_done_before_ready_or_of_exec_is_skipped() {
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), Some(start()));
        c.begin();
        assert!(c.after_exit(done(DoneStatus::Ok, None)).is_none());
        let mut c = Conversation::new(Handshake::Setup, Some(setup()), None);
        c.begin();
        assert!(c.after_exit(ready("exec")).is_none());
        assert!(c.after_exit(done(DoneStatus::Ok, None)).is_none());
        let f = FromWorker::SandboxError(SandboxFailure {
            layer: "mounts".into(),
            message: "m".into(),
        });
        let mut c = Conversation::new(Handshake::SelfReady, None, Some(start()));
        c.begin();
        assert!(matches!(
            c.after_exit(f),
            Some(Outcome::Fatal(ErrorKind::SandboxError, _))
        ));
    }

    #[test]
    fn a_permission_error_after_a_denial_is_policy_denied() {
        let mut c = Conversation::new(Handshake::PreReady(report("w")), None, Some(start()));
        c.begin();
        c.on(call(1));
        let refused = Reply {
            id: 1,
            ok: None,
            error: Some(ReplyError {
                kind: crate::protocol::ReplyErrorKind::Denied,
                message: "no".into(),
            }),
        };
        c.answered(refused, true);
        let d = finished_done(c.on(done(DoneStatus::Error, Some("PermissionError"))));
        assert!(c.end(Outcome::Done(d)).policy_denied);
        // The same end without a denial is the script's own error.
        let mut c = Conversation::new(Handshake::PreReady(report("w")), None, Some(start()));
        c.begin();
        let d = finished_done(c.on(done(DoneStatus::Error, Some("PermissionError"))));
        assert!(!c.end(Outcome::Done(d)).policy_denied);
        // A denial followed by another error is that error.
        let mut c = Conversation::new(Handshake::PreReady(report("w")), None, Some(start()));
        c.begin();
        c.answered(
            Reply {
                id: 1,
                ok: None,
                error: None,
            },
            true,
        );
        let d = finished_done(c.on(done(DoneStatus::Error, Some("ValueError"))));
        assert!(!c.end(Outcome::Done(d)).policy_denied);
    }
}
