//! Cancelling another tenant's call: while Y's cell runs, X sends
//! `notifications/cancelled` for every request id a client of the server
//! may have used (0 to 40, as numbers and as strings).
//!
//! Control: the same spray from a second client of Y's own principal (its
//! own MCP session) kills Y's running cell: the ids it sends are the ones
//! in flight, and a cancellation reaches across a principal's sessions.
//! Defence: sprayed by X, Y's cell runs to its end and prints its canary.

use super::{Env, Outcome};
use crate::tenancy::harness::{join, marker, spawn_exec, Client, Serve, ToolAnswer};
use rmcp::model::{CancelledNotificationParam, ClientNotification, Notification, NumberOrString};
use serde_json::json;
use std::time::Duration;

async fn spray(from: &Client) -> Result<(), String> {
    for i in 0..=40i64 {
        for id in [
            NumberOrString::Number(i),
            NumberOrString::String(i.to_string().into()),
        ] {
            from.send_notification(ClientNotification::CancelledNotification(
                Notification::new(CancelledNotificationParam::new(Some(id), None)),
            ))
            .await
            .map_err(|e| format!("send a cancellation: {e}"))?;
        }
    }
    Ok(())
}

/// Y's slow cell, sprayed by `attacker` while it runs.
fn sprayed(env: &Env, y: &Client, attacker: &Client, canary: &str) -> Result<ToolAnswer, String> {
    let code = format!("import time\ntime.sleep(4)\nprint({canary:?})");
    env.block_on("cell", async {
        let task = spawn_exec(
            y,
            json!({"language": "python", "code": code, "timeout_seconds": 30}),
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        spray(attacker).await?;
        join(task).await
    })?
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(env, &["x", "y"], &["--language", "python"])?;
    let y = serve.client(env, "y")?;
    // Control: Y's own second client.
    let y2 = serve.client(env, "y")?;
    let canary = marker("CANCELCANARY");
    let own = sprayed(env, &y, &y2, &canary)?;
    if own.all_text().contains(&canary) {
        return Err(format!(
            "a spray from Y's own second client did not cancel Y's cell: the attack is broken: {}",
            own.all_text()
        ));
    }
    let x = serve.client(env, "x")?;
    let canary = marker("CANCELCANARY");
    let theirs = sprayed(env, &y, &x, &canary)?;
    Ok(Outcome {
        control: "the same spray from a second client of Y's principal cancelled Y's running \
                  cell"
            .into(),
        blocked: theirs.stdout().contains(&canary),
        evidence: format!(
            "sprayed by X, Y's cell {}",
            if theirs.stdout().contains(&canary) {
                "ran to its end and printed its canary".to_owned()
            } else {
                format!("was stopped: {}", theirs.all_text())
            }
        ),
    })
}
