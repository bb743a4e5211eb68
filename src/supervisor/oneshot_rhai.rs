//! A Rhai cell run once from this process, without a runtime: the fast
//! path of `cellbox run x.rhai`.
//!
//! The library path starts a supervisor and an async runtime, executes a
//! worker (our binary again), sends it its plan and its `start`, and answers
//! its calls from tokio. Here the calling process, still single-threaded,
//! clones the cell into its namespaces as `cellbox exec` does
//! ([`crate::sandbox::oneshot::spawn_in_process`]), but the cell executes
//! nothing: a copy of this process, it applies the same jail sequence,
//! says `ready` and runs the Rhai engine itself, with its `start` already
//! in memory. This process supervises it with `poll(2)` (deadline, output
//! caps and forwarding, Ctrl-C, kill and reap, as for `exec`) and speaks the
//! worker protocol with it in a small blocking loop ([`Talk`]): the same
//! [`Conversation`] state machine and codec as the library path, and the
//! same checks of every capability call (budget, registry, policy,
//! arguments) with the same answers and records.
//!
//! Only capabilities that need nothing but this process are answered here:
//! `emit` and `answer`. A run whose policy allows a capability that needs
//! the supervisor (`run_cell`), or that reads a config file (models, file
//! and declared tools), is not run here: the caller takes the library path
//! ([`eligible`]).

use super::capability::{Handler, Registry};
use super::cell::{Conversation, Handshake, Outcome, Step};
use super::events::EventSink;
use super::oneshot::{supervise, Control, OneShot};
use super::policy::{Budget, EmitTally, Policy};
use super::result::{CallRecord, CellResult, ErrorKind, RunInfo, Status};
use super::session::SessionConfig;
use super::{Language, Limits};
use crate::protocol::{
    decode_body, encode_frame, Call, FrameError, FromWorker, Reply, Start, ToWorker, LEN_PREFIX,
};
use crate::sandbox::oneshot::{self, SpawnError};
use crate::sandbox::SandboxPlan;
use nix::poll::{PollFd, PollFlags};
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Whether a Rhai cell under `config` can run here: its policy allows no
/// capability that needs the supervisor. (A config file is the caller's
/// to rule out: it may register models and tools.)
pub fn eligible(config: &SessionConfig) -> bool {
    !config.policy.permits("run_cell")
}

/// Run `code` as one Rhai cell in a fresh session, as
/// [`super::Supervisor::run`] does, but from this process: it must have a
/// single thread (no runtime started yet). Call only when [`eligible`].
pub fn run(code: &str, how: OneShot, config: SessionConfig, events: &EventSink) -> CellResult {
    let session_id = super::cell::new_run_id();
    let started = Instant::now();
    let run = RunInfo::root();
    let mut result = CellResult::new("rhai", run.clone());
    result.execution_count = 1;
    events.record(
        "cell_start",
        &run,
        json!({"language": "rhai", "session_id": session_id}),
    );
    let done = run_planned(code, &how, &config, events, &run, &mut result, started);
    if let Some(done) = done.filter(|_| result.status == Status::Ok) {
        super::session::apply_first(Language::Rhai, &done, &mut result);
    }
    let calls = u32::try_from(result.calls_made()).unwrap_or(u32::MAX);
    super::oneshot::finish(&mut result, calls, started, events, &run);
    result
}

fn run_planned(
    code: &str,
    how: &OneShot,
    config: &SessionConfig,
    events: &EventSink,
    run: &RunInfo,
    result: &mut CellResult,
    started: Instant,
) -> Option<Box<crate::protocol::Done>> {
    let (plan, limits) = match plan_for(config) {
        Ok(p) => p,
        Err(e) => {
            result.fail_with(ErrorKind::SandboxError, e.to_string());
            return None;
        }
    };
    let deadline = started + limits.timeout();
    let registry = Registry::with_builtins();
    let start = Start {
        language: "rhai".into(),
        code: code.to_owned(),
        vars: Default::default(),
        definitions: Vec::new(),
        capabilities: registry.iter().map(|c| c.spec()).collect(),
        limits: limits.script_limits(),
        max_frame_bytes: limits.max_frame_bytes,
        python_paths: Vec::new(),
        // This process reaps the cell itself: nothing to read first.
        linger: false,
        preloaded: false,
    };
    // Held until the cell has ended; dropping it kills what is left.
    let cgroup = match super::oneshot::cell_cgroup(plan.layers.cgroup, limits.rlimits.memory_bytes)
    {
        Ok(c) => c,
        Err(e) => {
            result.fail_with(
                ErrorKind::SandboxError,
                format!("the cgroup layer could not be applied: {e}"),
            );
            return None;
        }
    };
    let layer = crate::sandbox::linux::cgroup::layer_report(cgroup.as_ref(), plan.layers.cgroup);
    let mut in_cell = Some(start.clone());
    let mut body = |stream: UnixStream| match in_cell.take() {
        Some(start) => crate::worker::run_rhai_in_cell(stream, start),
        None => crate::exit::Exit::Internal.raw(),
    };
    let spawned = oneshot::spawn_in_process(
        &plan,
        cgroup.as_ref().map(|c| c.procs_fd()),
        Some(crate::worker::prewarm_rhai),
        &mut body,
    );
    match spawned {
        Ok(cell) => {
            let talk = Talk::new(
                Context {
                    policy: config.policy.clone(),
                    budget: Budget::default(),
                    emits: EmitTally::default(),
                    registry,
                    events: events.clone(),
                    run: run.clone(),
                    max_frame: limits.max_frame_bytes,
                },
                start,
            );
            let done = supervise(
                cell,
                &limits,
                how,
                deadline,
                result,
                Control::Protocol(Box::new(talk)),
            );
            if let Some(report) = result.sandbox.as_mut() {
                report.layers.push(layer);
            }
            done
        }
        Err(SpawnError::Sandbox(e)) => {
            result.fail_with(
                ErrorKind::SandboxError,
                format!(
                    "the {} layer could not be applied: {}",
                    e.layer,
                    e.message()
                ),
            );
            None
        }
        Err(SpawnError::Spawn(e)) => {
            result.fail_with(ErrorKind::SpawnError, e);
            None
        }
    }
}

/// The plan and the cell's limits (the session's under the profile's
/// ceiling), as the library path builds them for a Rhai cell.
fn plan_for(
    config: &SessionConfig,
) -> Result<(SandboxPlan, Limits), crate::profiles::ProfileError> {
    let name = config.profile.as_deref().unwrap_or("rhai");
    let profile = crate::profiles::Profile::load(name)?;
    let limits = config.limits.under_profile(&profile.limits);
    // The scratch directory is made in the cell's new root and goes with it
    // (a host one for a cell without a mount namespace).
    let scratch =
        std::env::temp_dir().join(format!("cellbox-{:016x}", super::oneshot::random_u64()));
    let mut plan = SandboxPlan::new(&profile, scratch, limits.rlimits);
    plan.scratch_in_cell = true;
    Ok((plan, limits))
}

/// What the calls of one cell are checked against and charged to.
struct Context {
    policy: Policy,
    budget: Budget,
    emits: EmitTally,
    registry: Registry,
    events: EventSink,
    run: RunInfo,
    max_frame: usize,
}

/// This process's side of the protocol with a cell: bytes from its fd 3
/// cut into frames, fed to the [`Conversation`], its steps carried out
/// (calls answered, replies written before the deadline).
pub(super) struct Talk {
    conv: Conversation,
    /// Bytes read and not yet a whole frame.
    pending: Vec<u8>,
    ctx: Context,
    /// The calls made, for the result (moved into it at the end).
    calls: Vec<CallRecord>,
    /// `answer`'s value, for the result.
    final_answer: Option<Value>,
}

impl Talk {
    fn new(ctx: Context, start: Start) -> Talk {
        let mut conv = Conversation::new(Handshake::SelfReady, None, Some(ToWorker::Start(start)));
        // Its first step is to hand over `start`, which the cell, a copy of
        // this process, has in memory already.
        let _ = conv.begin();
        Talk {
            conv,
            pending: Vec::new(),
            ctx,
            calls: Vec::new(),
            final_answer: None,
        }
    }

    /// Read what fd 3 has and act on every whole frame. `Some` when the
    /// conversation is over (the cell's `done`, or a fatal error).
    pub(super) fn pump(
        &mut self,
        control: &mut Option<UnixStream>,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Option<Outcome> {
        let closed = self.read(control, buf);
        while let Some(frame) = self.next_frame() {
            let step = match frame {
                Ok(f) => self.conv.on(f),
                Err(e) => self.conv.on_bad_frame(e),
            };
            if let Some(o) = self.carry_out(step, control.as_ref(), deadline) {
                return Some(o);
            }
        }
        if closed {
            *control = None;
            let step = self.conv.on_bad_frame(FrameError::Closed);
            return self.carry_out(step, None, deadline);
        }
        None
    }

    /// The cell has exited: what it had queued may still end the
    /// conversation (a `done` sent just before its exit).
    pub(super) fn after_exit(
        &mut self,
        control: &mut Option<UnixStream>,
        buf: &mut [u8],
    ) -> Option<Outcome> {
        self.read(control, buf);
        *control = None;
        if !self.conv.listening() {
            return None;
        }
        while let Some(frame) = self.next_frame() {
            let Ok(frame) = frame else { return None };
            if let Some(o) = self.conv.after_exit(frame) {
                return Some(o);
            }
        }
        None
    }

    /// The conversation ended with `outcome`: the report, a refusal that
    /// ended it and the calls go to `result`.
    pub(super) fn end(self, outcome: Outcome, result: &mut CellResult) -> Outcome {
        for record in self.calls {
            result.push_call(record);
        }
        if self.final_answer.is_some() {
            result.final_answer = self.final_answer;
        }
        let ended = self.conv.end(outcome);
        if let Some(report) = ended.report {
            result.sandbox = Some(report);
        }
        if ended.policy_denied {
            result.status = Status::PolicyDenied;
        }
        ended.outcome
    }

    /// Read everything fd 3 has now (it is non-blocking); `true` at EOF or
    /// on an error.
    fn read(&mut self, control: &mut Option<UnixStream>, buf: &mut [u8]) -> bool {
        let Some(c) = control.as_mut() else {
            return false;
        };
        loop {
            match c.read(buf) {
                Ok(0) => return true,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// The next whole frame in `pending`, if there is one.
    fn next_frame(&mut self) -> Option<Result<FromWorker, FrameError>> {
        let prefix: [u8; LEN_PREFIX] = self.pending.get(..LEN_PREFIX)?.try_into().ok()?;
        let len = u32::from_be_bytes(prefix) as usize;
        if len > self.ctx.max_frame {
            self.pending.clear();
            return Some(Err(FrameError::Oversize {
                len,
                max: self.ctx.max_frame,
            }));
        }
        if self.pending.len() < LEN_PREFIX + len {
            return None;
        }
        let frame = decode_body(&self.pending[LEN_PREFIX..LEN_PREFIX + len]);
        self.pending.drain(..LEN_PREFIX + len);
        Some(frame)
    }

    /// Carry out `step` and the steps it leads to; `Some` when the
    /// conversation is over.
    fn carry_out(
        &mut self,
        mut step: Step,
        control: Option<&UnixStream>,
        deadline: Instant,
    ) -> Option<Outcome> {
        loop {
            match step {
                Step::Wait => return None,
                Step::Finish(o) => return Some(o),
                Step::Send(frame) => {
                    let sent = control.map_or(Ok(()), |c| {
                        send_within(c, &frame, self.ctx.max_frame, deadline)
                    });
                    return sent.err().map(|Late| Outcome::Timeout);
                }
                Step::Offer(frame) => {
                    if let Some(c) = control {
                        let _ = send_within(c, &frame, self.ctx.max_frame, deadline);
                    }
                    return None;
                }
                Step::Call(call) => match self.call(call) {
                    Ok((reply, denied)) => step = self.conv.answered(reply, denied),
                    Err(fatal) => return Some(fatal),
                },
                Step::Emit(call) => {
                    return self.call(call).err();
                }
                Step::Log(l) => {
                    let msg: String = l.message.chars().take(2000).collect();
                    tracing::info!(run_id = %self.ctx.run.run_id, level = %l.level, "worker: {msg}");
                    return None;
                }
            }
        }
    }

    /// Check and perform one capability call, exactly as the library path
    /// does (`cell::calls`) for the capabilities this process has. `Err`
    /// ends the cell.
    fn call(&mut self, call: Call) -> Result<(Reply, bool), Outcome> {
        let t0 = Instant::now();
        let id = call.id;
        let ctx = &self.ctx;
        // A cell chooses the names it calls: records and events keep at
        // most MAX_CAP_NAME_BYTES of one.
        let max_name = super::cell::MAX_CAP_NAME_BYTES;
        let name_fits = call.cap.len() <= max_name;
        let shown = if name_fits {
            call.cap.clone()
        } else {
            let mut end = 32;
            while !call.cap.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}... ({} bytes)", &call.cap[..end], call.cap.len())
        };
        let calls = &mut self.calls;
        let mut record = |outcome: &str, message: Option<String>| {
            ctx.events.record(
                "call",
                &ctx.run,
                json!({"cap": shown, "outcome": outcome, "message": message}),
            );
            calls.push(CallRecord {
                cap: shown.clone(),
                outcome: outcome.to_owned(),
                message,
                run_id: ctx.run.run_id.clone(),
                depth: ctx.run.depth,
                ms: t0.elapsed().as_millis() as u64,
                detail: None,
            });
        };
        let err = |kind: &str, message: String| Reply::failed(id, kind, message);
        // Every call is charged first, whatever it asks for.
        let budget_key = if name_fits { call.cap.as_str() } else { "" };
        if let Err(e) = ctx.budget.charge(&ctx.policy, budget_key) {
            record("budget", Some(e.to_string()));
            return Err(Outcome::Fatal(ErrorKind::LimitExceeded, e.to_string()));
        }
        if !name_fits {
            let msg = format!(
                "unknown capability: its name is {} bytes, over the limit of {max_name} bytes",
                call.cap.len()
            );
            record("unknown", Some(msg.clone()));
            return Ok((err("unknown", msg), true));
        }
        let Some(cap) = ctx.registry.get(&call.cap) else {
            // No tool sources here: a dotted name is unknown too.
            let msg = format!("unknown capability {:?}", call.cap);
            record("unknown", Some(msg.clone()));
            return Ok((err("unknown", msg), true));
        };
        if !ctx.policy.permits(&call.cap) {
            let msg = format!(
                "capability {:?} is not allowed by this session's policy",
                call.cap
            );
            record("denied", Some(msg.clone()));
            return Ok((err("denied", msg), true));
        }
        if let Some(msg) = args_problem(&cap.handler, &call.args) {
            let msg = format!("invalid arguments for {:?}: {msg}", call.cap);
            record("invalid_args", Some(msg.clone()));
            return Ok((err("invalid_args", msg), false));
        }
        let outcome: Result<Value, (String, String)> = match &cap.handler {
            Handler::Emit => {
                super::policy::emit(&call.args, &ctx.budget, &ctx.emits, &ctx.events, &ctx.run)
                    .map(|()| Value::Null)
                    .map_err(|m| ("limit".into(), m.to_string()))
            }
            Handler::Answer => {
                self.final_answer = Some(call.args.get("value").cloned().unwrap_or(Value::Null));
                Ok(Value::Null)
            }
            // Not run here ([`eligible`]): the policy refused it above.
            _ => Err((
                "failed".into(),
                format!("{} cannot be performed by a one-shot run", call.cap),
            )),
        };
        match &outcome {
            Ok(_) => record("ok", None),
            Err((kind, msg)) => record(kind, Some(msg.clone())),
        }
        Ok(Reply::of(id, outcome))
    }
}

/// What is wrong with the arguments of a call to `emit` or `answer`, in the
/// words the schema validator of the library path uses for their schemas
/// (an object with one required key and no other): checked here without
/// it, which keeps the schema compiler out of the small `cellbox` binary.
/// Any other capability is not performed here.
fn args_problem(handler: &Handler, args: &Map<String, Value>) -> Option<String> {
    let key = match handler {
        Handler::Emit => "event",
        Handler::Answer => "value",
        _ => return None,
    };
    let mut errors = Vec::new();
    let extra: Vec<String> = args
        .keys()
        .filter(|k| k.as_str() != key)
        .map(|k| format!("'{k}'"))
        .collect();
    if !extra.is_empty() {
        let verb = if extra.len() == 1 { "was" } else { "were" };
        errors.push(format!(
            "Additional properties are not allowed ({} {verb} unexpected)",
            extra.join(", ")
        ));
    }
    if !args.contains_key(key) {
        errors.push(format!("\"{key}\" is a required property"));
    }
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// The deadline came before a frame could be written.
struct Late;

/// Write one frame to the cell, waiting for room until `deadline` at the
/// latest: a cell that floods calls and never reads their replies must not
/// hold this process past its limit. Other failures are left to the cell's
/// end to explain.
fn send_within(
    control: &UnixStream,
    frame: &ToWorker,
    max: usize,
    deadline: Instant,
) -> Result<(), Late> {
    let Ok(bytes) = encode_frame(frame, max) else {
        return Ok(());
    };
    let mut rest = bytes.as_slice();
    let mut w = control;
    while !rest.is_empty() {
        match w.write(rest) {
            Ok(0) => return Ok(()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Late);
                }
                let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLOUT)];
                let _ = nix::poll::poll(&mut fds, super::oneshot::poll_timeout(deadline));
            }
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments of `emit` and `answer` are judged as the schema
    /// validator judges them, in its words.
    #[test]
    fn builtin_arguments_are_checked_as_their_schemas_check_them() {
        let registry = Registry::with_builtins();
        for (name, key) in [("emit", "event"), ("answer", "value")] {
            let cap = registry.get(name).unwrap();
            assert_eq!(
                cap.schema(),
                &json!({"type": "object", "properties": {key: {}}, "required": [key],
                        "additionalProperties": false}),
                "{name}'s schema is the shape args_problem knows"
            );
            let cases = [
                json!({}),
                json!({key: 1}),
                json!({key: null, "bad": 1}),
                json!({"bad": 1}),
                json!({"a": 1, "b": [2], "c": {}}),
                json!({key: "x", "z": 1, "a": 2}),
            ];
            for args in cases {
                let args = args.as_object().unwrap().clone();
                let ours = args_problem(&cap.handler, &args);
                let theirs = cap.validate(&args).err().map(|e| e.to_string());
                assert_eq!(ours, theirs, "{name} {args:?}");
            }
        }
    }

    #[test]
    fn only_emit_and_answer_run_here() {
        let policy = Policy::deny_all().allow("emit").allow("answer");
        let config = SessionConfig {
            policy: policy.clone(),
            ..SessionConfig::default()
        };
        assert!(eligible(&config));
        let config = SessionConfig {
            policy: policy.allow("run_cell"),
            ..SessionConfig::default()
        };
        assert!(!eligible(&config));
    }
}
