//! `aggregate_context` as a CPU bomb: a tenant calls it straight over MCP
//! (it needs no cell) with the most awkward inputs it may pass, to make the
//! supervisor burn CPU ranking and counting them outside every cell's
//! limits.
//!
//! Shapes, each at the input bounds (`MAX_RESULTS` results,
//! `MAX_INPUT_BYTES` of text): `pieces`, 20,000 distinct small results
//! and a query of many terms (the cost that grew with pieces × text);
//! `line`, one text with nowhere the tokenizer's count may be cut (digits
//! and spaces) and a budget it does not fit, so that it is shortened;
//! `cut`, the same text with a budget of half its tokens (the longest
//! prefix that fits is searched for over all of it);
//! `ranges`, 20,000 overlapping line ranges of one file, merged. Then each
//! shape past its bound (one result, or 1 MiB of text, too many); then the
//! costliest call given up by its client after a second
//! (`notifications/cancelled`).
//!
//! Evidence (the host's view): the CPU time of the server process
//! (`/proc/PID/stat`) each call costs, and how long it held the caller.
//! Defence: each shape's cost is near-linear in its input (the whole shape
//! at most 8 times the cost of a quarter of it: linear is 4, pieces × text
//! 16); an input past the bounds is refused, naming the limit, at a small
//! part of the cost of one at the bound; a call given up stops (the server
//! burns less CPU in the seconds after the cancel than the call needs).
//! Controls: a quarter of each shape is seen costing CPU (the measure sees
//! the work); the input at the bound costs what the input past it would
//! cost at least, were it read (so a missing bound shows); the cancelled
//! call, left to run, is seen costing more than the cancelled one did.

use super::harness::AgentServe;
use super::{Env, Outcome};
use crate::tenancy::harness::{call, Client};
use rmcp::model::{CallToolRequestParams, ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The bounds of one call (`cellbox::context`).
const MAX_RESULTS: usize = cellbox::context::MAX_RESULTS;
const MAX_INPUT_BYTES: usize = cellbox::context::MAX_INPUT_BYTES;

/// CPU time of process `pid` so far (user and system).
fn cpu(pid: i32) -> Result<Duration, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("failed to read /proc/{pid}/stat: {e}"))?;
    // The fields after the command name (which may hold spaces).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("unreadable /proc/PID/stat")?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 (12 and 13 after the name).
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // In USER_HZ ticks, 100 a second on Linux.
    Ok(Duration::from_millis(ticks * 10))
}

/// The arguments of a shape at `scale` (1.0: at its bound; above: past
/// it).
fn shape(name: &str, scale: f64) -> Value {
    let n = (MAX_RESULTS as f64 * scale) as usize;
    match name {
        "pieces" => {
            // ~190 bytes each, all distinct: 20,000 of them are 3.8 MiB.
            let results: Vec<Value> = (0..n)
                .map(|i| {
                    json!(format!(
                        "piece {i} talks of alpha{} beta{} gamma{} and {}",
                        i % 97,
                        i % 89,
                        i % 83,
                        "lorem ipsum dolor sit amet ".repeat(5)
                    ))
                })
                .collect();
            let query: Vec<String> = (0..500).map(|i| format!("alpha{i} beta{i}")).collect();
            json!({"results": results, "query": query.join(" "), "budget_tokens": 2000})
        }
        "line" | "cut" => {
            // Digits and spaces only: no place where counting may be cut.
            let bytes = ((MAX_INPUT_BYTES - 4096) as f64 * scale) as usize;
            let text = "7 ".repeat(bytes / 2);
            // "cut": a budget of about half its tokens, so that the
            // longest prefix that fits is searched for over all of it.
            let budget = if name == "cut" {
                (bytes / 4).max(1)
            } else {
                1000
            };
            json!({"results": [text], "query": "seven", "budget_tokens": budget})
        }
        "ranges" => {
            // Windows of 40 lines, each starting 7 lines after the last.
            let lines: Vec<String> = (0..40).map(|k| format!("line {k} of the file")).collect();
            let content = lines.join("\n") + "\n";
            let results: Vec<Value> = (0..n)
                .map(|i| json!({"path": "src/big.rs", "start_line": 1 + 7 * i, "content": content}))
                .collect();
            json!({"results": results, "query": "line file", "budget_tokens": 5000})
        }
        _ => json!({}),
    }
}

/// One call of `aggregate_context` with `args`: the server's CPU time it
/// cost, how long it took, and what it answered.
fn measure(
    env: &Env,
    serve: &AgentServe,
    client: &Client,
    args: Value,
) -> Result<(Duration, Duration, String), String> {
    let before = cpu(serve.pid())?;
    let t0 = Instant::now();
    let answer = env
        .rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(180),
                call(client, "aggregate_context", args),
            )
            .await
        })
        .map_err(|_| "aggregate_context did not answer within 180 s".to_owned())?;
    let took = t0.elapsed();
    let spent = cpu(serve.pid())?.saturating_sub(before);
    let said = if answer.is_error {
        answer.all_text()
    } else {
        match answer.structured {
            Some(v) => format!("ok: {} tokens", v["tokens"]),
            None => answer.all_text(),
        }
    };
    Ok((spent, took, said))
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    // Messages big enough for inputs past the bounds.
    let config = "[server]\nlanguages = [\"python\"]\n[limits]\nmax_script_bytes = 4194304\n";
    let serve = AgentServe::start(env, config, &[])?;
    let client = serve.client(env)?;
    // Warm: the tokenizer's tables loaded.
    measure(
        env,
        &serve,
        &client,
        json!({"results": ["a b c"], "query": "a", "budget_tokens": 10}),
    )?;

    let mut evidence = Vec::new();
    let mut controls = Vec::new();
    let mut blocked = true;
    let mut costliest = (Duration::ZERO, "");
    let mut seen_work = false;
    for name in ["pieces", "line", "cut", "ranges"] {
        let (quarter, _, q_said) = measure(env, &serve, &client, shape(name, 0.25))?;
        let (whole, took, w_said) = measure(env, &serve, &client, shape(name, 1.0))?;
        // Out of time (an unoptimized build): the deadline is what holds.
        let deadline = w_said.contains("the most one call may run");
        if !w_said.starts_with("ok") && !deadline {
            return Err(format!(
                "{name}: the whole answered {w_said} (a quarter: {q_said}): the attack is broken"
            ));
        }
        seen_work |= quarter >= Duration::from_millis(100);
        // Near-linear; a call of a second or less is cheap whatever its
        // ratio (the clock ticks every 10 ms).
        let ratio = whole.as_secs_f64() / quarter.as_secs_f64().max(0.01);
        let linear = if deadline {
            whole.as_secs_f64() <= cellbox::context::MAX_SECONDS as f64 * 1.25 + 2.0
        } else {
            ratio <= 8.0 || whole <= Duration::from_secs(1)
        };
        // Past the bound: refused before the work.
        let past = if name == "line" || name == "cut" {
            1.0 + 1.2 / 16.0
        } else {
            1.0001
        };
        let (refused, _, r_said) = measure(env, &serve, &client, shape(name, past))?;
        let named = r_said.contains("over the limit") || r_said.contains("the limit of one call");
        // Reading and counting the input is part of a refusal too (for the
        // cheap shapes most of the whole's cost): half of it, plus noise.
        let cheap = refused.as_secs_f64() <= whole.as_secs_f64() / 2.0 + 0.2;
        blocked &= linear && named && cheap;
        controls.push(format!(
            "{name}: a quarter cost {} CPU-s, the whole at the bound {} CPU-s",
            secs(quarter),
            secs(whole)
        ));
        evidence.push(format!(
            "{name}: the whole cost {ratio:.1}x a quarter ({} CPU-s, {} s held); past the \
             bound {} CPU-s, answered {:?}",
            secs(whole),
            secs(took),
            secs(refused),
            r_said.chars().take(120).collect::<String>()
        ));
        if whole > costliest.0 {
            costliest = (whole, name);
        }
    }

    if !seen_work {
        return Err(format!(
            "no quarter of a shape cost 0.1 CPU-s: the measure cannot judge ({})",
            controls.join("; ")
        ));
    }

    // The costliest call, given up by its client after a second.
    let (full_cost, name) = costliest;
    let before = cpu(serve.pid())?;
    let args = shape(name, 1.0);
    let after_cancel = env.rt.block_on(async {
        let params = CallToolRequestParams::new("aggregate_context")
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        let handle = client
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(|e| format!("send: {e}"))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        handle
            .cancel(Some("given up".into()))
            .await
            .map_err(|e| format!("cancel: {e}"))?;
        // A moment for the stop to be seen (it looks at every piece and
        // every 64 KiB), then the CPU burnt in the next two seconds.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let at = cpu(serve.pid())?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok::<_, String>(cpu(serve.pid())?.saturating_sub(at))
    })?;
    let cancelled_cost = cpu(serve.pid())?.saturating_sub(before);
    if full_cost < Duration::from_secs(2) {
        evidence.push(format!(
            "(the costliest call, {name}, takes only {} CPU-s: cancellation not judged)",
            secs(full_cost)
        ));
    } else {
        let stopped = after_cancel < Duration::from_millis(600) && cancelled_cost < full_cost;
        blocked &= stopped;
        controls.push(format!("{name} left to run cost {} CPU-s", secs(full_cost)));
        evidence.push(format!(
            "{name} given up after 1 s: {} CPU-s in all, {} CPU-s burnt 0.5-2.5 s after the cancel",
            secs(cancelled_cost),
            secs(after_cancel)
        ));
    }
    // The server still answers.
    let (_, _, said) = measure(
        env,
        &serve,
        &client,
        json!({"results": ["x y"], "query": "x", "budget_tokens": 10}),
    )?;
    if !said.starts_with("ok") {
        return Err(format!("the server no longer aggregates: {said}"));
    }
    Ok(Outcome {
        control: controls.join("; "),
        blocked,
        evidence: evidence.join("; "),
    })
}
