//! Spending past a budget: a tenant's cells with a model endpoint that
//! reports nonsense usage (negative counts, which once counted as zero), a
//! batch whose every item asks for all that is left, a second session and
//! sessionless calls after the first ran dry; and `cellbox agent` with a
//! model that writes cells in a language its config switched off and never
//! answers.
//!
//! Control: with the budget (or the language) granted, the same cells and
//! the same loop are seen reaching the endpoint every time (what the echo
//! endpoint received) and the switched-off language running.
//! Defence: what the endpoint was asked for in all (each request's
//! `max_tokens`) stays within `max_total_tokens`, a refused batch sends
//! nothing, the agent's turns stay within `max_model_calls`, and a cell in
//! a language the config leaves out never runs.

use super::harness::{marker, python, AgentServe, Echo};
use super::{Env, Outcome};
use crate::tenancy::harness::session;
use serde_json::Value;
use std::sync::Arc;

/// A chat completion whose usage is negative.
fn lying_completion(text: &str) -> String {
    serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": -1000, "completion_tokens": -1000}})
    .to_string()
}

/// Each request's `max_tokens` as the endpoint received it.
fn asked(echo: &Echo) -> Vec<u64> {
    echo.seen()
        .iter()
        .filter_map(|(s, _)| serde_json::from_str::<Value>(&s.body).ok())
        .map(|b| b["max_tokens"].as_u64().unwrap_or(0))
        .collect()
}

const BATCH: &str = "model_query_batched(['b'] * 10, max_tokens=1500)";
const LOOP: &str = "for i in range(20):\n    model_query('q%d' % i, max_tokens=1500)\n";

/// Spend with `budget` tokens: a batch, a loop, then the loop again in a
/// session of its own. The endpoint's view: each request's `max_tokens`,
/// and the batch's items among them.
fn spend(env: &Env, budget: u64) -> Result<(Vec<u64>, usize), String> {
    let echo = Echo::start(Arc::new(|_| (200, lying_completion("ok"))))?;
    let config = format!(
        r#"
[server]
languages = ["python"]
[models.m]
endpoint = "{}/v1"
model = "x"
[policy]
allow = ["model_query", "model_query_batched"]
max_model_calls = 1000
max_total_tokens = {budget}
"#,
        echo.url
    );
    let serve = AgentServe::start(env, &config, &[])?;
    let client = serve.client(env)?;
    env.block_on("batch", python(&client, None, BATCH, 60))?;
    let batch_items = echo
        .seen()
        .iter()
        .filter(|(s, _)| s.body.contains("\"b\""))
        .count();
    env.block_on("loop", python(&client, None, LOOP, 60))?;
    let sid = env.block_on("session", session(&client))??;
    env.block_on("loop in a session", python(&client, Some(&sid), LOOP, 60))?;
    Ok((asked(&echo), batch_items))
}

pub fn model_tokens(env: &Env) -> Result<Outcome, String> {
    let budget = 4000;
    // Control: with the budget out of the way, every query of the attack
    // reaches the endpoint.
    let (open, open_batch) = spend(env, 100_000_000)?;
    if open.len() != 50 || open_batch != 10 {
        return Err(format!(
            "with the budget out of the way the endpoint got {} requests ({open_batch} of the \
             batch), not 50 (10): the attack is broken",
            open.len()
        ));
    }
    let control = format!(
        "with max_total_tokens = 100000000 the endpoint got all 50 requests, {} tokens asked, \
         usage reported negative",
        open.iter().sum::<u64>()
    );
    let (seen, batch) = spend(env, budget)?;
    let total: u64 = seen.iter().sum();
    Ok(Outcome {
        control,
        blocked: total <= budget && batch == 0,
        evidence: format!(
            "the endpoint got {} requests asking {total} tokens in all, of a budget of {budget} \
             ({batch} items of the refused batch)",
            seen.len()
        ),
    })
}

/// Run `cellbox agent` with the config `text` (its model: an endpoint
/// whose every reply is a Python block printing a computed marker, never
/// an answer); what the endpoint received, in order.
fn agent(env: &Env, text: &str, printed: &str) -> Result<Vec<String>, String> {
    let (head, tail) = printed.split_at(printed.len() / 2);
    let reply = format!("```python\nprint({head:?} + {tail:?})\n```");
    let echo = Echo::start(Arc::new(move |_| (200, lying_completion(&reply))))?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "{text}\n[models.m]\nendpoint = \"{}/v1\"\nmodel = \"x\"\n",
            echo.url
        ),
    )
    .map_err(|e| format!("config file: {e}"))?;
    let out = std::process::Command::new(&env.cellbox)
        .args(["agent", "--lang", "rhai", "--max-steps", "6", "--config"])
        .arg(&path)
        .arg("do the task")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("failed to run cellbox agent: {e}"))?;
    if out.status.code() != Some(4) {
        return Err(format!(
            "cellbox agent did not stop on a budget (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(echo.seen().into_iter().map(|(s, _)| s.body).collect())
}

pub fn loop_config(env: &Env) -> Result<Outcome, String> {
    let printed = marker("ran-");
    // Control: where the config allows Python and six turns, the loop asks
    // six times, then once more for its best answer at the steps' end, and
    // the block runs (its output is in the next request).
    let open = agent(
        env,
        "[server]\nlanguages = [\"python\", \"rhai\"]\n[policy]\nmax_model_calls = 100\n",
        &printed,
    )?;
    if open.len() != 7 || !open.iter().skip(1).any(|b| b.contains(&printed)) {
        return Err(format!(
            "with Python allowed the endpoint got {} requests, the block's output in none: \
             the attack is broken",
            open.len()
        ));
    }
    let control = "with Python allowed and max_model_calls = 100, six turns and the best-effort \
                   question asked the model and the Python block ran"
        .to_owned();
    let seen = agent(
        env,
        "[server]\nlanguages = [\"rhai\"]\n[policy]\nmax_model_calls = 2\n",
        &printed,
    )?;
    let ran = seen.iter().any(|b| b.contains(&printed));
    Ok(Outcome {
        control,
        blocked: seen.len() <= 2 && !ran,
        evidence: format!(
            "with languages = [\"rhai\"] and max_model_calls = 2 the loop asked the model {} \
             times; the Python block {}",
            seen.len(),
            if ran { "ran" } else { "never ran" }
        ),
    })
}
