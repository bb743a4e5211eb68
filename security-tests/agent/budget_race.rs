//! Racing a principal's budget: one tenant opens three sessions and runs
//! five cells at once (three in the sessions, two sessionless), each
//! asking a slow model for 500 tokens at a time, a batch of three more,
//! and calling an http tool between queries, so that many reservations
//! are taken while others are still in flight.
//!
//! The endpoint bills honestly: each reply reports as used the
//! `max_tokens` it was asked for (and one prompt token), so what the
//! endpoint billed is what the tenant spent.
//!
//! `estimate_gap` (below) spends past a budget another way: with prompts
//! the estimate counts low.
//!
//! Control: with `[principals]` budgets out of the way, every one of the
//! 45 queries and 30 tool calls reaches the endpoint.
//! Defence: with `[principals] max_total_tokens = 6000` (each session's
//! own `[policy]` budget far above it), what the endpoint billed stays
//! within 6000 tokens; with `[principals] max_cost = 3` (prices of 1000
//! per million tokens) what it billed costs at most 3; with
//! `[principals] max_tool_calls = 7` it gets at most 7 tool calls, however
//! the five cells interleave (each budget in a run of its own: a refusal
//! ends a cell).

use super::harness::Echo;
use super::Env;
use crate::tenancy::harness::{join, session, spawn_exec, Serve};
use crate::tenancy::Outcome;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const CELL: &str = "\
import time
for i in range(6):
    try:
        model_query('race %d' % i, max_tokens=500)
    except Exception as e:
        print('refused:', e)
    try:
        tools.hook()
    except Exception as e:
        print('refused:', e)
try:
    model_query_batched(['race batch'] * 3, max_tokens=500)
except Exception as e:
    print('refused:', e)
'done'
";

/// What the endpoint saw: (model queries, tokens billed, tool calls).
fn race(env: &Env, principals: &str) -> Result<(usize, u64, usize, String), String> {
    let echo = Echo::start(Arc::new(|seen| {
        if seen.path.ends_with("/tool") {
            return (200, json!({"ok": true}).to_string());
        }
        // Slow, so that reservations overlap.
        std::thread::sleep(Duration::from_millis(60));
        let asked = serde_json::from_str::<Value>(&seen.body)
            .ok()
            .and_then(|b| b["max_tokens"].as_u64())
            .unwrap_or(0);
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant",
                          "content": "ok"}, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": asked}});
        (200, body.to_string())
    }))?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let conf = dir.path().join("race.toml");
    std::fs::write(
        &conf,
        format!(
            r#"
[server]
languages = ["python"]
max_concurrency = 5
[models.m]
endpoint = "{url}/v1"
model = "x"
max_attempts = 1
input_price = 1000.0
output_price = 1000.0
[tools.hook]
kind = "http"
description = "a web hook"
url = "{url}/tool"
[policy]
allow = ["model_query", "model_query_batched", "hook"]
max_model_calls = 1000
max_tool_calls = 1000
max_total_tokens = 100000000
max_cost = 1000000.0
[principals]
window_seconds = 3600
{principals}
"#,
            url = echo.url
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    let conf = conf.display().to_string();
    let serve = Serve::start(env, &["t"], &["--config", &conf])?;
    let client = serve.client(env, "t")?;
    let said = env.block_on("race", async {
        let mut sids = Vec::new();
        for _ in 0..3 {
            sids.push(session(&client).await?);
        }
        let mut tasks = Vec::new();
        for i in 0..5 {
            let mut args = json!({"language": "python", "code": CELL, "timeout_seconds": 50});
            if let Some(s) = sids.get(i) {
                args["session_id"] = json!(s);
            }
            tasks.push(spawn_exec(&client, args));
        }
        let mut said = Vec::new();
        for t in tasks {
            said.push(join(t).await?.all_text());
        }
        Ok::<_, String>(said.join("\n"))
    })??;
    let seen = echo.seen();
    let tools = seen
        .iter()
        .filter(|(s, _)| s.path.ends_with("/tool"))
        .count();
    let (mut queries, mut billed) = (0, 0);
    for (s, answer) in &seen {
        if s.path.ends_with("/tool") {
            continue;
        }
        queries += 1;
        if let Ok(v) = serde_json::from_str::<Value>(answer) {
            billed += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
                + v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
    }
    Ok((queries, billed, tools, said))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let (queries, billed, tools, said) = race(env, "")?;
    if queries != 45 || tools != 30 {
        return Err(format!(
            "with the principal's budgets out of the way the endpoint got {queries} queries and \
             {tools} tool calls, not 45 and 30: the attack is broken: {said}"
        ));
    }
    let control = format!(
        "with [principals] budgets left to the policy's (10^8 tokens, 1000 calls), five \
         concurrent cells of one principal made all 45 queries ({billed} tokens billed) and 30 \
         tool calls"
    );
    // A budget refusal ends a cell: each budget is raced on its own.
    let budget = 6000;
    let (queries, billed, _, said) = race(env, &format!("max_total_tokens = {budget}"))?;
    if !said.contains("max_total_tokens") {
        return Err(format!(
            "no cell was refused by max_total_tokens, so the race never met the budget: {said}"
        ));
    }
    // Priced at 1000 per million tokens: a query of 500 costs about 0.5.
    let max_cost = 3.0;
    let (cost_queries, cost_billed, _, said) = race(env, &format!("max_cost = {max_cost}"))?;
    if !said.contains("max_cost") {
        return Err(format!(
            "no cell was refused by max_cost, so the race never met the budget: {said}"
        ));
    }
    let cost_billed = cost_billed as f64 * 1000.0 / 1e6;
    let max_tools = 7;
    let (_, _, tools, said) = race(env, &format!("max_tool_calls = {max_tools}"))?;
    if !said.contains("max_tool_calls") {
        return Err(format!(
            "no cell was refused by max_tool_calls, so the race never met the budget: {said}"
        ));
    }
    Ok(Outcome {
        control,
        blocked: billed <= budget && tools <= max_tools && cost_billed <= max_cost,
        evidence: format!(
            "five cells in three sessions and none raced one principal's budget: with \
             max_total_tokens = {budget} the endpoint answered {queries} queries billing \
             {billed} tokens; with max_cost = {max_cost} it answered {cost_queries} queries \
             costing {cost_billed:.3}; with max_tool_calls = {max_tools} it got {tools} tool \
             calls"
        ),
    })
}

/// One run of [`estimate_gap`]: each query's (tokens billed, tokens
/// held), in order, and the cell's text.
fn gap_run(env: &Env, principals: &str, queries: u32) -> Result<(Vec<(u64, u64)>, String), String> {
    let echo = Echo::start(Arc::new(|seen| {
        let body = serde_json::from_str::<Value>(&seen.body).unwrap_or_default();
        let asked = body["max_tokens"].as_u64().unwrap_or(0);
        let bytes: usize = body["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|x| x["content"].as_str().unwrap_or_default().len())
                    .sum()
            })
            .unwrap_or(0);
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant",
                          "content": "ok"}, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": bytes, "completion_tokens": asked}});
        (200, body.to_string())
    }))?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let conf = dir.path().join("gap.toml");
    std::fs::write(
        &conf,
        format!(
            "[server]\nlanguages = [\"python\"]\n[models.m]\nendpoint = \"{}/v1\"\nmodel = \"x\"\n\
             max_attempts = 1\n[policy]\nallow = [\"model_query\"]\nmax_model_calls = 1000\n\
             max_total_tokens = 100000000\n[principals]\n{principals}\n",
            echo.url
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    let conf = conf.display().to_string();
    let serve = Serve::start(env, &["t"], &["--config", &conf])?;
    let client = serve.client(env, "t")?;
    // 3000 CJK characters: 9000 bytes, far fewer tokens in o200k_base.
    let code = format!(
        "p = '\\u4e00\\u4e8c\\u4e09' * 1000\nfor i in range({queries}):\n    \
         model_query(p, max_tokens=10)\n"
    );
    let a = env.block_on(
        "queries",
        crate::tenancy::harness::python(&client, None, &code, 120),
    )?;
    let billed: Vec<u64> = echo
        .seen()
        .iter()
        .filter_map(|(_, ans)| serde_json::from_str::<Value>(ans).ok())
        .map(|v| {
            v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
                + v["usage"]["completion_tokens"].as_u64().unwrap_or(0)
        })
        .collect();
    let held: Vec<u64> = a
        .structured
        .as_ref()
        .and_then(|v| v["calls"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["detail"]["held_tokens"].as_u64())
        .collect();
    Ok((billed.iter().copied().zip(held).collect(), a.all_text()))
}

/// A provider whose tokenizer is not the one the estimate uses bills
/// every byte of a prompt as a token (as byte-level tokenizers do with a
/// script they were not trained on); the tenant sends prompts that
/// o200k_base counts low, so each query is billed about three times what
/// was held for it.
///
/// Control: with the budget out of the way, three such queries are each
/// billed more than they held (the call records' `held_tokens` against
/// what the endpoint billed): charged only their holds, queries would go
/// on being sent until the holds alone filled the budget.
/// Defence: with `[principals] max_total_tokens = 20000`, what the
/// endpoint billed in all passes the budget by at most what one query was
/// billed past its hold (the query that found room for its hold).
pub fn estimate_gap(env: &Env) -> Result<Outcome, String> {
    let (open, said) = gap_run(env, "", 3)?;
    if open.len() != 3 || open.iter().any(|(billed, held)| billed <= held) {
        return Err(format!(
            "the queries were not billed past their holds ({open:?}): the attack is broken: {said}"
        ));
    }
    let excess = open.iter().map(|(b, h)| b - h).max().unwrap_or(0);
    let (billed, held) = open[0];
    let budget = 20000;
    let (seen, said) = gap_run(env, &format!("max_total_tokens = {budget}"), 40)?;
    if !said.contains("max_total_tokens") {
        return Err(format!("the budget never refused a query: {said}"));
    }
    let total: u64 = seen.iter().map(|(b, _)| b).sum();
    Ok(Outcome {
        control: format!(
            "each query held {held} tokens and was billed {billed}: charged only its hold, {} \
             queries would fit a budget of {budget} and bill {}",
            budget / held,
            budget / held * billed
        ),
        blocked: total <= budget + excess,
        evidence: format!(
            "with max_total_tokens = {budget} the endpoint answered {} queries billing {total} \
             tokens (at most {budget} + one query's {excess} past its hold)",
            seen.len()
        ),
    })
}
