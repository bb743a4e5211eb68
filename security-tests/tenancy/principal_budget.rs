//! Budgets per principal: a tenant that spent its session's tool-call
//! budget opens another session, then goes sessionless, then calls the
//! tool directly over MCP, to spend again.
//!
//! The server allows `aggregate_context` (a host tool: every call counts
//! as a tool call) with `max_tool_calls = 3`. X spends 3 calls in one
//! session, then tries once in a new session, once without a session and
//! once as the MCP tool `aggregate_context`.
//!
//! Control: `[principals] max_tool_calls = 1000` (a principal budget out of
//! the way): each of X's three tries gets its call. Defence: the default
//! principal budget (the policy's: what one session may spend, per
//! hour): each try is refused naming `max_tool_calls` and the
//! principal, while Y, another principal, still gets its call.

use super::harness::{call, exec, session, Client, Env, Serve};
use super::Outcome;
use serde_json::json;

const SPEND: &str = "for i in 0..3 { aggregate_context([\"a b\"], \"a\", 10); } \"spent\"";
const ONE_MORE: &str = "aggregate_context([\"a b\"], \"a\", 10); \"again\"";

/// What X's three tries and Y's one answered: (try texts, Y's text,
/// how many of X's tries got their call).
async fn attack(x: &Client, y: &Client) -> Result<(Vec<String>, String, usize), String> {
    let s1 = session(x).await?;
    let first = exec(
        x,
        json!({"language": "rhai", "code": SPEND, "session_id": s1}),
    )
    .await;
    if first.status() != "ok" {
        return Err(format!(
            "the first session could not spend its budget: {}",
            first.all_text()
        ));
    }
    let s2 = session(x).await?;
    let tries = [
        exec(
            x,
            json!({"language": "rhai", "code": ONE_MORE, "session_id": s2}),
        )
        .await,
        exec(x, json!({"language": "rhai", "code": ONE_MORE})).await,
        call(
            x,
            "aggregate_context",
            json!({"results": ["a b"], "query": "a", "budget_tokens": 10}),
        )
        .await,
    ];
    let got = tries
        .iter()
        .filter(|a| a.status() == "ok" || (!a.is_error && a.status().is_empty()))
        .count();
    let texts = tries.iter().map(|a| a.all_text()).collect();
    let ya = exec(y, json!({"language": "rhai", "code": ONE_MORE})).await;
    Ok((texts, ya.all_text(), got))
}

fn config(dir: &std::path::Path, principals: &str) -> Result<String, String> {
    let path = dir.join("budget.toml");
    std::fs::write(
        &path,
        format!("[policy]\nallow = [\"aggregate_context\"]\nmax_tool_calls = 3\n{principals}"),
    )
    .map_err(|e| format!("config: {e}"))?;
    Ok(path.display().to_string())
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let start = |principals: &str| -> Result<Serve, String> {
        let cfg = config(dir.path(), principals)?;
        Serve::start(env, &["x", "y"], &["--language", "rhai", "--config", &cfg])
    };
    let control = {
        let serve = start("[principals]\nmax_tool_calls = 1000\n")?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (texts, _, got) = env.block_on("control", attack(&x, &y))??;
        if got != 3 {
            return Err(format!(
                "with the principal budget out of the way X got {got} of 3 tries: {texts:?}; \
                 the attack is broken"
            ));
        }
        "with [principals] max_tool_calls = 1000, X spent again in a second session, \
         sessionless and through the MCP tool"
            .to_owned()
    };
    let serve = start("")?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (texts, y_text, got) = env.block_on("attack", attack(&x, &y))??;
    let named = texts
        .iter()
        .all(|t| t.contains("max_tool_calls") && t.contains("(principal "));
    let y_ok = y_text.contains("again");
    Ok(Outcome {
        control,
        blocked: got == 0 && named && y_ok,
        evidence: if got == 0 && named && y_ok {
            "each of X's tries was refused by its principal budget (max_tool_calls, principal \
             \"x\"); Y still got its call"
                .to_owned()
        } else {
            format!("X got {got} of 3 tries ({texts:?}); Y: {y_text}")
        },
    })
}
