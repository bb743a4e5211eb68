//! A secret written in pieces on a cell's live output. A client that asks
//! for progress gets a cell's stdout as it is written, one notification
//! per piece the supervisor read; a redaction of each piece on its own
//! never sees a secret the cell writes a few characters at a time (with a
//! pause between, so that each is read alone), as it is, in base64 and
//! percent-encoded. The cell holds the model key (this test hands it in
//! the code: it stands for any way a cell may come to hold a secret).
//!
//! Control: a marker written the same way, in the same pieces, reached the
//! client split over several notifications and whole when they are put
//! together (the path splits text and carries it end to end); the cell's
//! result, which holds its stdout whole, shows the key redacted (the
//! redaction is on).
//! Defence: the notifications, put together, hold no run of the key (in
//! those forms) that `harness::tenant_leak` counts as a leak; the events
//! file and the log no run of 8 bytes.

use super::harness::{marker, AgentServe, Notes};
use super::{Env, Outcome};
use base64::Engine as _;
use rmcp::model::{CallToolRequestParams, ClientRequest, Request, ServerResult};
use rmcp::service::PeerRequestOptions;
use serde_json::json;
use std::time::{Duration, Instant};

/// Characters of each piece: fewer than any run the redaction answers to.
const PIECE: usize = 6;

fn pieces(s: &str) -> Vec<String> {
    s.as_bytes()
        .chunks(PIECE)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

/// The live stdout the client was sent, as the notifications came.
fn stdout_notes(notes: &Notes) -> Vec<String> {
    notes
        .lock()
        .map(|l| {
            l.iter()
                .filter(|n| n["stream"] == "stdout")
                .filter_map(|n| n["text"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let key = format!("sk-{}{}", marker(""), marker(""));
    let mark = marker("MARK-");
    let b64 = base64::engine::general_purpose::STANDARD.encode(key.as_bytes());
    let pct: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let config = r#"
[server]
languages = ["python"]
[models.m]
endpoint = "http://127.0.0.1:9/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
"#;
    let serve = AgentServe::start(env, config, &[("CB_MODEL_KEY", &key)])?;
    let (client, notes) = serve.recording_client(env)?;
    let texts = [mark.clone(), key.clone(), b64.clone(), pct.clone()];
    let lists: Vec<Vec<String>> = texts.iter().map(|t| pieces(t)).collect();
    let code = format!(
        "import sys, time\n\
         for text in {lists}:\n    \
             for p in text:\n        \
                 sys.stdout.write(p); sys.stdout.flush(); time.sleep(0.05)\n    \
             sys.stdout.write('\\n'); sys.stdout.flush()\n\
         'done'",
        lists = serde_json::to_string(&lists).map_err(|e| e.to_string())?
    );
    let args = json!({"language": "python", "code": code, "timeout_seconds": 60});
    let params = CallToolRequestParams::new("execute_code")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let result = env.block_on("cell", async {
        let handle = client
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(|e| format!("send: {e}"))?;
        handle
            .await_response()
            .await
            .map_err(|e| format!("the cell: {e}"))
    })??;
    let ServerResult::CallToolResult(r) = result else {
        return Err(format!("unexpected response {result:?}"));
    };
    let structured = r.structured_content.unwrap_or_default();
    let stdout = structured["stdout"].as_str().unwrap_or_default().to_owned();
    // Notifications may trail the response by a moment.
    let t0 = Instant::now();
    let mut seen = stdout_notes(&notes);
    while seen.concat().matches('\n').count() < texts.len() && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
        seen = stdout_notes(&notes);
    }
    let live = seen.concat();
    // The control.
    // Notifications that carried a part of the marker.
    let split = live.find(&mark).map_or(0, |at| {
        let mut start = 0;
        let mut n = 0;
        for piece in &seen {
            let end = start + piece.len();
            if start < at + mark.len() && at < end {
                n += 1;
            }
            start = end;
        }
        n
    });
    let redacted = stdout.contains("[REDACTED:CB_MODEL_KEY]") && !stdout.contains(&key);
    if split < 2 || !live.contains(&mark) || !redacted {
        return Err(format!(
            "the control failed: the marker came in {split} notifications (2 or more \
             expected), whole: {}; the result's stdout holds the key redacted: {redacted} \
             ({stdout:?}); live output: {seen:?}",
            live.contains(&mark)
        ));
    }
    let found = serve.leaks(&live, std::slice::from_ref(&key));
    Ok(Outcome {
        control: format!(
            "the marker, written {PIECE} characters at a time, reached the client in {split} \
             notifications and whole put together; the result's stdout held the key redacted"
        ),
        blocked: found.is_empty(),
        evidence: if found.is_empty() {
            format!(
                "the live output, put together ({} notifications), holds the key and its \
                 encodings redacted",
                seen.len()
            )
        } else {
            found.join("; ")
        },
    })
}
