//! Ownership: client Y lists, runs in, reads, resets, closes and kills a
//! cell of client X's session.
//!
//! Control: X and Y share one token (one principal, as every client was
//! before principals existed): each step must work for Y, or the attack is
//! broken. Defence: X and Y hold their own tokens. Y must not see X's
//! session in `list_sessions`, every operation on X's id must answer
//! exactly as for an id that never existed, and X's own view afterwards
//! (its variable, its file, its running cell) must be untouched.

use super::harness::{call, exec, marker, session, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::Duration;

/// What Y got done against X's session.
struct Effects {
    listed: bool,
    read_canary: bool,
    reset_took: bool,
    close_took: bool,
    killed_cell: bool,
    /// Steps where Y's answer about X's id differed from its answer about
    /// an id that never existed.
    differs: Vec<String>,
}

impl Effects {
    fn any(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.listed {
            v.push("listed X's session");
        }
        if self.read_canary {
            v.push("read X's variable and file");
        }
        if self.reset_took {
            v.push("reset X's session");
        }
        if self.close_took {
            v.push("closed X's session");
        }
        if self.killed_cell {
            v.push("killed X's running cell");
        }
        v
    }
}

/// X plants a canary in a variable and a file of its session.
async fn plant(x: &Client, sid: &str, canary: &str) -> Result<(), String> {
    let code = format!("secret = {canary:?}\nopen('canary.txt', 'w').write(secret)\n'planted'");
    let a = exec(
        x,
        json!({"language": "python", "code": code, "session_id": sid}),
    )
    .await;
    if a.is_error {
        return Err(format!("X could not plant its canary: {}", a.all_text()));
    }
    Ok(())
}

/// Whether X still sees its canary in its variable (and its file).
async fn x_sees(x: &Client, sid: &str, canary: &str) -> (bool, bool) {
    let var = exec(
        x,
        json!({"language": "python", "code": "secret", "session_id": sid}),
    )
    .await;
    let file = exec(
        x,
        json!({"language": "python", "code": "open('canary.txt').read()", "session_id": sid}),
    )
    .await;
    (
        !var.is_error && var.all_text().contains(canary),
        !file.is_error && file.all_text().contains(canary),
    )
}

/// Y's attack on X's session `sid`, step by step; `ghost` is an id that
/// never existed, for comparison.
async fn attack(x: &Client, y: &Client, canary: &str) -> Result<Effects, String> {
    let sid = session(x).await?;
    plant(x, &sid, canary).await?;
    // Same shape as a real id: "s-" and 32 hex digits.
    let ghost = format!("s-{}{}", marker(""), &marker("")[..8]);
    let mut differs = Vec::new();
    let mut same = |step: &str, real: &super::ToolAnswer, fake: &super::ToolAnswer| {
        if real.normalized(&sid) != fake.normalized(&ghost) {
            differs.push(format!(
                "{step}: {:?} vs {:?}",
                real.normalized(&sid).all_text(),
                fake.normalized(&ghost).all_text()
            ));
        }
    };

    // List.
    let listed = call(y, "list_sessions", json!({})).await;
    let listed = listed.all_text().contains(&sid);

    // Run in it and read the variable and the file.
    let code = "print(secret, open('canary.txt').read())";
    let real = exec(
        y,
        json!({"language": "python", "code": code, "session_id": sid}),
    )
    .await;
    let fake = exec(
        y,
        json!({"language": "python", "code": code, "session_id": ghost}),
    )
    .await;
    let read_canary = real.all_text().contains(canary);
    same("execute_code", &real, &fake);

    // Reset it.
    let real = call(y, "reset_session", json!({"session_id": sid})).await;
    let fake = call(y, "reset_session", json!({"session_id": ghost})).await;
    same("reset_session", &real, &fake);
    let (var_kept, file_kept) = x_sees(x, &sid, canary).await;
    let reset_took = !var_kept;
    if !file_kept {
        return Err("X's file is gone after a reset (resets keep files)".into());
    }

    // Kill X's running cell by closing the session under it.
    let long = tokio::spawn({
        let x = x.peer().clone();
        let sid = sid.clone();
        async move {
            let params = rmcp::model::CallToolRequestParams::new("execute_code").with_arguments(
                json!({"language": "python", "session_id": sid,
                       "code": "import time\ntime.sleep(4)\n'survived'"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            );
            x.call_tool(params).await
        }
    });
    // Let X's cell start.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let real = call(y, "close_session", json!({"session_id": sid})).await;
    let fake = call(y, "close_session", json!({"session_id": ghost})).await;
    same("close_session", &real, &fake);
    let close_took = real.rpc.is_ok() && !real.is_error;
    let x_cell = long
        .await
        .map_err(|e| format!("X's long call panicked: {e}"))?;
    let killed_cell = match &x_cell {
        Ok(r) => !format!("{:?}", r.structured_content).contains("survived"),
        Err(_) => true,
    };
    // After a close by Y, X's session is gone; otherwise X can still use it.
    if !close_took {
        let after = exec(
            x,
            json!({"language": "python", "code": "secret", "session_id": sid}),
        )
        .await;
        if after.is_error && !reset_took {
            return Err(format!(
                "X lost its session though Y's close failed: {}",
                after.all_text()
            ));
        }
    }
    Ok(Effects {
        listed,
        read_canary,
        reset_took,
        close_took,
        killed_cell,
        differs,
    })
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    // Positive control: one shared principal.
    let control = {
        let serve = Serve::start(env, &["shared"], &["--language", "python,rhai"])?;
        let x = serve.client(env, "shared")?;
        let y = serve.client(env, "shared")?;
        let canary = marker("CANARY-");
        let fx = env.block_on("control", attack(&x, &y, &canary))??;
        let seen = fx.any();
        if seen.len() < 5 {
            return Err(format!(
                "the attack does not work even with one shared token (only: {seen:?}); it is broken"
            ));
        }
        format!("with one shared token Y {}", seen.join(", "))
    };

    let serve = Serve::start(env, &["x", "y"], &["--language", "python,rhai"])?;
    let x = serve.client(env, "x")?;
    let y = serve.client(env, "y")?;
    let canary = marker("CANARY-");
    let fx = env.block_on("attack", attack(&x, &y, &canary))??;
    let got = fx.any();
    let mut problems: Vec<String> = got.iter().map(|s| (*s).to_owned()).collect();
    for d in &fx.differs {
        problems.push(format!(
            "answer about X's id differs from an unknown id's: {d}"
        ));
    }
    Ok(if problems.is_empty() {
        Outcome {
            control,
            blocked: true,
            evidence: "Y did not see X's session; list/run/read/reset/close on X's id answered \
                       exactly as for an unknown id; X's variable, file and running cell were \
                       untouched"
                .into(),
        }
    } else {
        Outcome {
            control,
            blocked: false,
            evidence: format!("with separate tokens Y {}", problems.join("; ")),
        }
    })
}
