//! A cell's capability calls: charged, checked against the policy and the
//! registry, performed (a sub-cell runs as a cell of its own), recorded.

use super::conversation::Outcome;
use super::{new_run_id, CellSpec};
use crate::protocol::{Call, Reply};
use crate::supervisor::capability::{CallContext, Handler, SourceError};
use crate::supervisor::result::{CallRecord, CellResult, ErrorKind, RunInfo, Status};
use crate::supervisor::{Inner, Language};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest capability name a call may give (registered names are at most
/// 64 bytes); a longer one is answered `unknown` and kept shortened.
pub(crate) const MAX_CAP_NAME_BYTES: usize = 128;

/// Check and perform one capability call. `Err` ends the cell. The reply
/// is redacted (see [`crate::secrets`]) on its way to the cell.
pub(super) async fn handle_call(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    result: &mut CellResult,
    call: Call,
    deadline: Instant,
) -> Result<(Reply, bool), Outcome> {
    let (mut reply, denied) = perform_call(sup, spec, result, call, deadline).await?;
    if let Some(v) = reply.ok.as_mut() {
        crate::secrets::redact_value(v);
    }
    if let Some(e) = reply.error.as_mut() {
        e.message = crate::secrets::redact_owned(std::mem::take(&mut e.message));
    }
    Ok((reply, denied))
}

async fn perform_call(
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
    // Its label in the metrics: a name the registry knows (`SERVER.*` for
    // a tool server's), never one a cell made up.
    let label = if !name_fits {
        crate::metrics::UNKNOWN.to_owned()
    } else if sup.registry.get(&call.cap).is_some() {
        call.cap.clone()
    } else if let (Some(_), Some((server, _))) =
        (sup.registry.source_of(&call.cap), call.cap.split_once('.'))
    {
        format!("{server}.*")
    } else {
        crate::metrics::UNKNOWN.to_owned()
    };
    let record_with =
        |outcome: &str, message: Option<String>, detail: Option<Value>, result: &mut CellResult| {
            crate::metrics::get().capability_call(label.clone(), outcome);
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
                detail,
            });
        };
    let record = |outcome: &str, message: Option<String>, result: &mut CellResult| {
        record_with(outcome, message, None, result)
    };
    let err = |kind: &str, message: String| Reply::failed(id, kind, message);
    // Every call is charged first, whatever it asks for: unknown, denied
    // and malformed calls use the budget too.
    let budget_key = if name_fits { call.cap.as_str() } else { "" };
    if let Err(e) = spec.budget.charge(&spec.policy, budget_key) {
        record("budget", Some(e.to_string()), result);
        return Err(Outcome::Fatal(ErrorKind::LimitExceeded, e.to_string()));
    }
    if !name_fits {
        let msg = format!(
            "unknown capability: its name is {} bytes, over the limit of {MAX_CAP_NAME_BYTES} bytes",
            call.cap.len()
        );
        record("unknown", Some(msg.clone()), result);
        return Ok((err("unknown", msg), true));
    }
    let found;
    let cap = match sup.registry.get(&call.cap) {
        Some(cap) => cap,
        None => {
            // `SERVER.TOOL` of a tool source: the policy first, so a denied
            // call never starts the source.
            let Some((source, tool)) = sup.registry.source_of(&call.cap) else {
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
            let looked_up = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()),
                source.tool(&spec.account, tool),
            )
            .await;
            found = match looked_up {
                Ok(Ok(cap)) => cap,
                Ok(Err(SourceError::Unknown(msg))) => {
                    record("unknown", Some(msg.clone()), result);
                    return Ok((err("unknown", msg), true));
                }
                Ok(Err(SourceError::Failed(msg))) => {
                    record("failed", Some(msg.clone()), result);
                    return Ok((err("failed", msg), false));
                }
                Err(_) => {
                    let msg = format!("{}: the tool server did not start in time", call.cap);
                    record("failed", Some(msg.clone()), result);
                    return Ok((err("failed", msg), false));
                }
            };
            &found
        }
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
    let mut detail = None;
    let outcome: Result<Value, (String, String)> = match &cap.handler {
        Handler::Emit => crate::supervisor::policy::emit(
            &call.args,
            &spec.budget,
            &spec.session_emits,
            &sup.events,
            &spec.run,
        )
        .map(|()| Value::Null)
        .map_err(|m| ("limit".into(), m.to_string())),
        Handler::Answer => {
            result.final_answer = Some(call.args.get("value").cloned().unwrap_or(Value::Null));
            Ok(Value::Null)
        }
        Handler::RunCell => run_sub_cell(sup, spec, result, &call.args, remaining).await,
        Handler::Model(op) => {
            let done = super::models::perform(sup, spec, *op, &call.args, remaining).await;
            result.models = Some(super::models::meter(spec).report());
            match done {
                Ok((v, d)) => {
                    detail = Some(d);
                    Ok(v)
                }
                Err(super::models::ModelFailure::Call(kind, m)) => Err((kind, m)),
                Err(super::models::ModelFailure::Fatal(m)) => {
                    record("budget", Some(m.clone()), result);
                    return Err(Outcome::Fatal(ErrorKind::LimitExceeded, m));
                }
            }
        }
        Handler::Host(f) => {
            let meter = super::models::meter(spec);
            let charged = meter.charge(crate::supervisor::policy::Metered::Tool, 1);
            result.models = Some(meter.report());
            if let Err(e) = charged {
                record("budget", Some(e.to_string()), result);
                return Err(Outcome::Fatal(ErrorKind::LimitExceeded, e.to_string()));
            }
            let cancel = tokio_util::sync::CancellationToken::new();
            // However the call ends (answered, timed out, its cell killed
            // and this future dropped), the handler is told to stop.
            let _stop = cancel.clone().drop_guard();
            let ctx = CallContext {
                session_id: spec.session_id.clone(),
                run: spec.run.clone(),
                tenant: spec.account.tenant.clone(),
                cancel,
            };
            // The handler's future is dropped when the cell's time is up or
            // its caller cancels it, whichever comes first: a handler whose
            // work runs on (`aggregate_context` on a blocking thread) stops
            // with it.
            let cancelled = async {
                match &spec.cancel {
                    Some(t) => t.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                done = tokio::time::timeout(remaining, f(ctx, call.args.clone())) => match done {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(m)) => Err(("failed".into(), m)),
                    Err(_) => Err((
                        "failed".into(),
                        "the capability did not finish in time".into(),
                    )),
                },
                // The cell ends killed, as a cancelled cell does: no reply
                // goes back for it to raise and end on its own first.
                _ = cancelled => {
                    record(
                        "failed",
                        Some("the cell was cancelled while the capability ran".into()),
                        result,
                    );
                    return Err(Outcome::interrupted());
                }
            }
        }
        Handler::Source(_) => Err(("unknown".into(), format!("{} is a tool server", call.cap))),
    };
    match &outcome {
        Ok(_) => record_with("ok", None, detail, result),
        Err((kind, msg)) => record(kind, Some(msg.clone()), result),
    }
    Ok(Reply::of(id, outcome))
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
        .map_err(|e: crate::supervisor::Error| ("invalid_args".to_owned(), e.to_string()))?;
    // The server's language list holds for sub-cells as for any cell.
    if let Some(refusal) = sup.language_refusal(language) {
        return Err(("denied".into(), format!("run_cell refused: {refusal}")));
    }
    let code = args
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if let Some(problem) = crate::supervisor::session::code_problem(language, &code, &spec.limits) {
        return Err(("invalid_args".into(), format!("sub-cell: {problem}")));
    }
    let vars = args
        .get("vars")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // In the session's own space: its files count against its quota.
    let scratch = Arc::new(crate::supervisor::scratch::Scratch::beside(
        &spec.scratch,
        "cellbox-sub-",
    ));
    let mut limits = spec.session().limits.clone();
    limits.timeout_ms = limits.timeout_ms.min(remaining.as_millis() as u64);
    let run = RunInfo {
        run_id: new_run_id(),
        parent_run_id: Some(spec.run.run_id.clone()),
        root_run_id: spec.run.root_run_id.clone(),
        depth,
        request_id: spec.run.request_id.clone(),
    };
    // Of its parent's session: the session's profile, or the supervisor's
    // for the language (and its ceiling over the limits), exactly as for a
    // top-level cell; its processes and memory count against the
    // session's; cancelling the parent ends the cell it waits for too.
    let child = CellSpec::new(spec.session(), run, language, code)
        .vars(vars)
        .limits(limits)
        .budget(spec.budget.clone())
        .scratch(scratch.clone())
        .cancel(spec.cancel.clone());
    // Its whole process tree is gone when `cell::run` returns.
    let (sub, _) = super::run(sup.clone(), child).await;
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

/// The tools of the tool sources whose names the policy allows (each such
/// source is started to list them), as a cell's start frame names them.
/// A source that cannot be listed in time is left out: its tools are still
/// called by name, with a clear error if it cannot be reached.
pub(super) async fn source_specs(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    deadline: Instant,
) -> Vec<crate::protocol::CapabilitySpec> {
    let mut out = Vec::new();
    for source in sup.registry.sources() {
        let server = source.name();
        let named = spec
            .policy
            .allow
            .iter()
            .any(|a| a.split_once('.').is_some_and(|(s, _)| s == server));
        let Handler::Source(s) = &source.handler else {
            continue;
        };
        if !named {
            continue;
        }
        let within = deadline.saturating_duration_since(Instant::now());
        if let Ok(Ok(tools)) = tokio::time::timeout(within, s.list(&spec.account)).await {
            out.extend(
                tools
                    .iter()
                    .filter(|c| spec.policy.permits(c.name()))
                    .map(|c| c.spec()),
            );
        }
    }
    out
}
