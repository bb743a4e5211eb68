//! `model_query` and `model_query_batched`: charged against the budgets of
//! the run tree and the session, sent by the supervisor's model client (the
//! key never reaches the cell), recorded with their usage.

use super::CellSpec;
use crate::models::client::Query;
use crate::models::{ModelClient, ModelReply};
use crate::supervisor::capability::ModelOp;
use crate::supervisor::policy::{Meter, Metered};
use crate::supervisor::Inner;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// How a model call did not give a value.
pub(super) enum ModelFailure {
    /// A catchable error: (reply kind, message).
    Call(String, String),
    /// A budget ran out: the cell ends `limit_exceeded`.
    Fatal(String),
}

/// What a model call gave: the value for the script and the record's detail.
pub(super) type ModelDone = (Value, Value);

pub(super) fn meter(spec: &CellSpec) -> Meter<'_> {
    Meter {
        tree: &spec.budget.models,
        session: &spec.share.models,
        policy: &spec.policy,
    }
}

fn messages(prompt: &Value) -> Vec<Value> {
    match prompt {
        Value::String(s) => vec![json!({"role": "user", "content": s})],
        Value::Array(a) => a.clone(),
        other => vec![json!({"role": "user", "content": other.to_string()})],
    }
}

fn reply_value(r: &ModelReply) -> Value {
    json!({"text": r.text, "model": r.model, "usage": r.usage, "cost": r.cost})
}

fn detail(r: &ModelReply) -> Value {
    json!({"model": r.model, "usage": r.usage, "cost": r.cost,
           "attempts": r.attempts, "latency_ms": r.ms})
}

/// Perform one model capability call.
pub(super) async fn perform(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    op: ModelOp,
    args: &Map<String, Value>,
    remaining: Duration,
) -> Result<ModelDone, ModelFailure> {
    let Some(client) = sup.models.clone() else {
        return Err(ModelFailure::Call(
            "failed".into(),
            "no model is configured".into(),
        ));
    };
    let m = meter(spec);
    if op == ModelOp::Agent {
        return sub_agent(sup, spec, &client, args, remaining).await;
    }
    let model = args.get("model").and_then(Value::as_str).map(str::to_owned);
    // An unknown model is the script's error, and costs no budget.
    if let Err(e) = client.config(model.as_deref()) {
        return Err(ModelFailure::Call("invalid_args".into(), e.to_string()));
    }
    let asked = args
        .get("max_tokens")
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let temperature = args.get("temperature").and_then(Value::as_f64);
    let prompts: Vec<Value> = match op {
        ModelOp::Query | ModelOp::Agent => {
            vec![args.get("prompt").cloned().unwrap_or(Value::Null)]
        }
        ModelOp::Batch => args
            .get("prompts")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    let n = u32::try_from(prompts.len()).unwrap_or(u32::MAX);
    m.charge(Metered::Model, n)
        .map_err(|e| ModelFailure::Fatal(e.to_string()))?;
    // A query may not ask for more tokens than the budget has left.
    let left = u32::try_from(m.tokens_left()).unwrap_or(u32::MAX).max(1);
    let max_tokens = Some(asked.map_or(left, |a| a.min(left)));
    let query = |prompt: &Value| Query {
        model: model.clone(),
        messages: messages(prompt),
        max_tokens,
        temperature,
    };
    let results: Vec<Result<ModelReply, AskError>> = match op {
        ModelOp::Query | ModelOp::Agent => {
            let q = query(&prompts[0]);
            vec![ask(&client, q, remaining).await]
        }
        ModelOp::Batch => {
            let permits = Arc::new(tokio::sync::Semaphore::new(
                spec.policy.max_concurrency.max(1) as usize,
            ));
            let mut tasks = Vec::with_capacity(prompts.len());
            for p in &prompts {
                let (client, q, permits) = (client.clone(), query(p), permits.clone());
                tasks.push(tokio::spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    ask(&client, q, remaining).await
                }));
            }
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await.unwrap_or_else(|e| Err(AskError::Task(e))));
            }
            out
        }
    };
    for r in results.iter().flatten() {
        sup.events.record("model_call", &spec.run, detail(r));
    }
    let spent = results.iter().flatten().fold((0, 0, 0.0), |acc, r| {
        (
            acc.0 + r.usage.input_tokens,
            acc.1 + r.usage.output_tokens,
            acc.2 + r.cost.unwrap_or(0.0),
        )
    });
    m.spend(spent.0, spent.1, spent.2)
        .map_err(|e| ModelFailure::Fatal(e.to_string()))?;
    match op {
        ModelOp::Query | ModelOp::Agent => match results.into_iter().next() {
            Some(Ok(r)) => Ok((reply_value(&r), detail(&r))),
            Some(Err(e)) => Err(ModelFailure::Call("failed".into(), e.to_string())),
            None => Err(ModelFailure::Call("failed".into(), "no reply".into())),
        },
        ModelOp::Batch => {
            let total = results.len();
            let mut values = Vec::with_capacity(total);
            let mut details = Vec::with_capacity(total);
            for (i, r) in results.into_iter().enumerate() {
                match r {
                    Ok(r) => {
                        values.push(reply_value(&r));
                        details.push(detail(&r));
                    }
                    Err(e) => {
                        return Err(ModelFailure::Call(
                            "failed".into(),
                            format!("model_query_batched: prompt {} of {total}: {e}", i + 1),
                        ))
                    }
                }
            }
            Ok((Value::Array(values), Value::Array(details)))
        }
    }
}

/// Why one model query of a cell got no reply.
#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error(transparent)]
    Model(#[from] crate::models::client::ModelError),
    #[error("model {0:?} did not answer before the cell's deadline")]
    Deadline(String),
    #[error("the query failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

async fn ask(client: &ModelClient, q: Query, within: Duration) -> Result<ModelReply, AskError> {
    match tokio::time::timeout(within, client.query(&q)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(AskError::Deadline(
            q.model.as_deref().unwrap_or("default").to_owned(),
        )),
    }
}

/// Most model turns a sub-agent takes.
const SUB_AGENT_STEPS: u32 = 10;

/// `agent_query(task, context)`: the loop of `cellbox agent` in a fresh
/// session beneath this cell, at depth + 1, with what is left of the
/// budgets; everything it used is then charged here.
async fn sub_agent(
    sup: &Arc<Inner>,
    spec: &CellSpec,
    client: &Arc<ModelClient>,
    args: &Map<String, Value>,
    remaining: Duration,
) -> Result<ModelDone, ModelFailure> {
    let depth = spec.run.depth + 1;
    if depth > spec.policy.max_depth {
        return Err(ModelFailure::Call(
            "denied".into(),
            format!(
                "agent_query refused: depth {depth} exceeds max_depth {}",
                spec.policy.max_depth
            ),
        ));
    }
    let m = meter(spec);
    m.charge(Metered::Agent, 1)
        .map_err(|e| ModelFailure::Fatal(e.to_string()))?;
    let mut child = m.remaining();
    if child.max_model_calls == 0 {
        return Err(ModelFailure::Fatal(format!(
            "budget max_model_calls exhausted: {} used of {}",
            spec.policy.max_model_calls, spec.policy.max_model_calls
        )));
    }
    // The loop's own turns come out of the calls left; its cells get the rest.
    let steps = child.max_model_calls.min(SUB_AGENT_STEPS);
    child.max_model_calls -= steps;
    child.allow.insert("answer".into());
    let max_tokens = child.max_total_tokens;
    let run = crate::supervisor::RunInfo {
        run_id: super::new_run_id(),
        parent_run_id: Some(spec.run.run_id.clone()),
        root_run_id: spec.run.root_run_id.clone(),
        depth,
    };
    let config = crate::SessionConfig {
        policy: child.clone(),
        limits: spec.session().limits.clone(),
        profile: spec.profile.clone(),
        ..Default::default()
    };
    let session =
        crate::supervisor::session::Session::beneath(sup.clone(), config, Some(run.clone()))
            .map_err(|e| ModelFailure::Call("failed".into(), e.to_string()))?;
    let context = args.get("context").cloned().unwrap_or(Value::Null);
    if !context.is_null() {
        session
            .set_var("context", context.clone())
            .await
            .map_err(|e| ModelFailure::Call("failed".into(), e.to_string()))?;
    }
    let caps: Vec<String> = child
        .allow
        .iter()
        .filter(|c| sup.registry.get(c).is_some())
        .cloned()
        .collect();
    let lang = match spec.language {
        crate::Language::Rhai => crate::Language::Rhai,
        _ => crate::Language::Python,
    };
    let model = client.default_model().unwrap_or_default().to_owned();
    let task = args
        .get("task")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let cfg = crate::supervisor::agent::LoopConfig {
        task,
        model,
        lang,
        context,
        max_steps: steps,
        max_errors: 3,
        max_tokens,
        deadline: Some(std::time::Instant::now() + remaining),
        progress: false,
    };
    let out =
        crate::supervisor::agent::run_loop(&session, client, &sup.events, &run, &caps, cfg).await;
    // The child session counted the loop's own queries with its cells'.
    let used = session.model_usage();
    m.absorb(used)
        .map_err(|e| ModelFailure::Fatal(e.to_string()))?;
    let detail = json!({"run_id": run.run_id, "depth": depth, "usage": used});
    match out.stop {
        crate::supervisor::agent::Stop::Answered => Ok((out.answer.unwrap_or(Value::Null), detail)),
        crate::supervisor::agent::Stop::BudgetExhausted { budget, detail } => Err(ModelFailure::Call(
            "failed".into(),
            format!("agent_query: the sub-agent stopped unanswered: budget {budget} exhausted ({detail})"),
        )),
        crate::supervisor::agent::Stop::ModelError { message } => Err(ModelFailure::Call(
            "failed".into(),
            format!("agent_query: the sub-agent stopped: {message}"),
        )),
    }
}
