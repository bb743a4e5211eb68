//! What reaches a client besides its result: the live output and progress
//! a client asks for, while another tenant's cells run at the same time
//! on the same server, and the events a cell emits.
//!
//! Attack: principals X and Y each run two cells at once, asking for
//! progress (so the server streams their output as log notifications);
//! each cell writes its principal's canary a few characters at a time,
//! and X's cells also write and `emit` a secret they were handed (the
//! model key) whole, in base64 and in pieces.
//!
//! Control: each principal's own canary reached it whole through the
//! notifications (the stream carries text end to end), and X's result
//! shows the key redacted (the redaction is on).
//! Defence: no notification to Y holds anything of X's canary or X's key
//! and none to X anything of Y's; X's own notifications, the events file
//! and the log hold no run of the key (see `harness::leaks`).

use super::harness::{marker, AgentServe, Notes, RecordingClient};
use super::{Env, Outcome};
use rmcp::model::{CallToolRequestParams, ClientRequest, Request, ServerResult};
use rmcp::service::PeerRequestOptions;
use serde_json::json;
use std::time::{Duration, Instant};

/// A cell writing `canary` in pieces, and `extra` Python after.
fn cell(canary: &str, extra: &str) -> String {
    let pieces: Vec<String> = canary
        .as_bytes()
        .chunks(5)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!(
        "import sys, time\nfor p in {pieces:?}:\n    sys.stdout.write(p); sys.stdout.flush(); \
         time.sleep(0.1)\nsys.stdout.write('\\n'); sys.stdout.flush()\n{extra}\n'done'"
    )
}

/// Run `code` asking for progress; the result's text.
async fn with_progress(client: &RecordingClient, code: String) -> Result<String, String> {
    let args = json!({"language": "python", "code": code, "timeout_seconds": 60});
    let params = CallToolRequestParams::new("execute_code")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .map_err(|e| format!("send: {e}"))?;
    match handle.await_response().await {
        Ok(ServerResult::CallToolResult(r)) => Ok(format!(
            "{} {}",
            r.structured_content.unwrap_or_default(),
            r.content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<String>()
        )),
        Ok(other) => Err(format!("unexpected response {other:?}")),
        Err(e) => Err(format!("the cell: {e}")),
    }
}

fn notes_text(notes: &Notes) -> String {
    notes
        .lock()
        .map(|l| {
            l.iter()
                .map(|n| n["text"].as_str().unwrap_or_default().to_owned())
                .collect::<String>()
        })
        .unwrap_or_default()
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let key = format!("sk-{}{}", marker(""), marker(""));
    let (cx, cy) = (marker("XCANARY"), marker("YCANARY"));
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let (tx, ty) = (marker("tok-x-"), marker("tok-y-"));
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("x {tx}\ny {ty}\n")).map_err(|e| e.to_string())?;
    let config = format!(
        "[server]\nlanguages = [\"python\"]\nprogress_interval_ms = 100\n[http]\ntoken_file = {:?}\n\
         [models.m]\nendpoint = \"http://127.0.0.1:9/v1\"\nmodel = \"x\"\n\
         api_key_env = \"CB_MODEL_KEY\"\n[policy]\nallow = [\"emit\"]\n",
        tokens.display().to_string()
    );
    let serve = AgentServe::start(env, &config, &[("CB_MODEL_KEY", &key)])?;
    let (x, x_notes) = serve.recording_client_as(env, &tx)?;
    let (y, y_notes) = serve.recording_client_as(env, &ty)?;
    let x_extra = format!(
        "import base64\nk = {key:?}\nprint(k)\nprint(base64.b64encode(k.encode()).decode())\n\
         for i in range(0, len(k), 4):\n    sys.stdout.write(k[i:i+4]); sys.stdout.flush(); \
         time.sleep(0.05)\nprint()\nemit({{'k': k, 'b': base64.b64encode(k.encode()).decode()}})"
    );
    let (x_cell, y_cell) = (cell(&cx, &x_extra), cell(&cy, ""));
    let results = env.block_on("cells", async {
        tokio::join!(
            with_progress(&x, x_cell.clone()),
            with_progress(&y, y_cell.clone()),
            with_progress(&x, x_cell.clone()),
            with_progress(&y, y_cell.clone()),
        )
    })?;
    let (rx1, ry1, rx2, ry2) = results;
    let (rx1, _ry1, _rx2, _ry2) = (rx1?, ry1?, rx2?, ry2?);
    // Notifications may trail the responses by a moment.
    let t0 = Instant::now();
    while (!notes_text(&x_notes).contains(&cx) || !notes_text(&y_notes).contains(&cy))
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (to_x, to_y) = (notes_text(&x_notes), notes_text(&y_notes));
    let emitted = serve
        .events()
        .lines()
        .any(|l| l.contains("\"emit\"") && l.contains("[REDACTED"));
    if !to_x.contains(&cx) || !to_y.contains(&cy) || !rx1.contains("[REDACTED") || !emitted {
        return Err(format!(
            "the canaries did not reach their own principals through the notifications, or \
             the key was not redacted in X's result or its emitted event (emitted: {emitted}): \
             X got {to_x:?}, Y got {to_y:?}, X's result {rx1}"
        ));
    }
    let mut problems = Vec::new();
    // Any 8 characters of the other's canary's random part is a crossing.
    let crossed = |text: &str, canary: &str| {
        canary.as_bytes()[7..]
            .windows(8)
            .any(|w| text.contains(String::from_utf8_lossy(w).as_ref()))
    };
    if crossed(&to_y, &cx) {
        problems.push("Y's notifications hold X's canary".to_owned());
    }
    if crossed(&to_x, &cy) {
        problems.push("X's notifications hold Y's canary".to_owned());
    }
    if super::harness::record_leak(&to_y, std::slice::from_ref(&key)).is_some() {
        problems.push("Y's notifications hold X's key".to_owned());
    }
    problems.extend(serve.leaks(&to_x, std::slice::from_ref(&key)));
    Ok(Outcome {
        control: "each principal's canary reached it through its own live-output \
                  notifications, and X's result and its emitted event show the key redacted"
            .into(),
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            "two principals' concurrent cells with progress: neither's notifications held \
             the other's canary or key; X's own notifications, the events file (X's emit) and \
             the log held no run of the key"
                .into()
        } else {
            problems.join("; ")
        },
    })
}
