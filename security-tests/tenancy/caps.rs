//! Per-principal caps: client X takes every session it can, and fills the
//! queue, so that client Y gets nothing.
//!
//! Control: each per-principal cap raised to the server's whole cap (the
//! defence off): X takes all `max_sessions` and Y's `create_session` is
//! refused; X fills the queue and Y's call is refused as `ServerBusy`.
//! Defence: the default share (half of each cap with two principals): X is
//! refused past its share, and Y creates a session and gets its call run.

use super::harness::{call, exec, Env, Serve};
use super::Outcome;
use serde_json::json;

/// (sessions X got, whether Y got one, whether Y's call was refused busy,
/// Y's call answer text).
async fn attack(
    x: &super::harness::Client,
    y: &super::harness::Client,
) -> Result<(usize, bool, bool, String), String> {
    let mut x_sessions = 0;
    for _ in 0..8 {
        let a = call(x, "create_session", json!({})).await;
        if a.is_error {
            break;
        }
        x_sessions += 1;
    }
    let y_got_session = !call(y, "create_session", json!({})).await.is_error;

    // X: one cell runs (max_concurrency 1), then as many calls as it can
    // queue; each lasts 2 s at most.
    let mut pending = Vec::new();
    for _ in 0..6 {
        let peer = x.peer().clone();
        pending.push(tokio::spawn(async move {
            let args = json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 2});
            let params = rmcp::model::CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().cloned().unwrap_or_default());
            peer.call_tool(params).await
        }));
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    let ya = exec(y, json!({"language": "rhai", "code": "6 * 7"})).await;
    let busy = ya.all_text().contains("ServerBusy");
    for p in pending {
        let _ = p.await;
    }
    Ok((x_sessions, y_got_session, busy, ya.all_text()))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let common = [
        "--language",
        "rhai",
        "--max-sessions",
        "4",
        "--max-concurrency",
        "1",
        "--max-queue",
        "4",
        "--max-operations",
        "0",
    ];
    let control = {
        let mut args = common.to_vec();
        args.extend([
            "--max-sessions-per-principal",
            "4",
            "--max-queue-per-principal",
            "4",
        ]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (n, y_session, y_busy, text) = env.block_on("control", attack(&x, &y))??;
        if n != 4 || y_session || !y_busy {
            return Err(format!(
                "with the caps raised X got {n} of 4 sessions, Y got one: {y_session}, Y's call \
                 refused busy: {y_busy} ({text}); the attack is broken"
            ));
        }
        "with per-principal caps equal to the server's, X took all 4 sessions and the whole \
         queue; Y was refused both"
            .to_owned()
    };
    let serve = Serve::start(env, &["x", "y"], &common)?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (n, y_session, y_busy, text) = env.block_on("attack", attack(&x, &y))??;
    let blocked = n == 2 && y_session && !y_busy && text.contains("42");
    Ok(Outcome {
        control,
        blocked,
        evidence: format!(
            "X got {n} of 4 sessions (its share: 2); Y got a session: {y_session}; Y's call \
             refused busy: {y_busy}{}",
            if blocked {
                "; Y's call ran (42)".to_owned()
            } else {
                format!(": {text}")
            }
        ),
    })
}
