//! Output envelope: a cell makes its result huge by count rather than by
//! bytes: it writes its own `done` frame (a hostile worker may say
//! anything) with 200,001 display items of no data (so no byte cap holds
//! them) and 2,000 long reasons for items it says it dropped.
//!
//! Defence: the whole result as sent — content blocks, structured content,
//! display descriptors, dropped reasons — stays within the documented
//! maximum (960 KiB of JSON, well under the 1 MiB event the Python SDK 2.x
//! reads), with at most 64 display items and 33 dropped entries.
//!
//! Control: there is no switch that lets the items through; the control is
//! the attack's own cell, which reports the frame it sent (200,001 items,
//! far over the maximum once each is a content block).

use super::harness::{Env, Serve};
use super::Outcome;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

const FLOOD: &str = r#"import json, os, struct, sys
items = [{"mime": "text/markdown", "data": ""}] * 200001
dropped = [{"mime": "text/html", "bytes": 1, "reason": "r" * 300}] * 2000
frame = json.dumps({"t": "done", "status": "ok", "value": "flooded", "display": items,
                    "display_dropped": dropped}, separators=(",", ":")).encode()
print("FRAME", len(items), len(dropped), len(frame), flush=True)
data = struct.pack(">I", len(frame)) + frame
while data:
    data = data[os.write(3, data):]
os._exit(0)
"#;

/// The documented maximum of a whole result, in bytes of JSON.
const MAX_RESULT_BYTES: usize = 960 * 1024;

pub fn run(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(env, &["x"], &["--language", "python"])?;
    let x = serve.client(env, "x")?;
    let r = env
        .block_on("flood", async {
            let args = json!({"language": "python", "code": FLOOD, "timeout_seconds": 60});
            let params = CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().cloned().unwrap_or_default());
            x.call_tool(params).await
        })?
        .map_err(|e| format!("the call failed: {e}"))?;
    // The result as the server wrote it (serialized the same way).
    let wire = serde_json::to_vec(&r).map_err(|e| format!("{e}"))?.len();
    let s = r.structured_content.clone().unwrap_or_default();
    let stdout = s["stdout"].as_str().unwrap_or_default().to_owned();
    if !stdout.contains("FRAME 200001 2000") {
        return Err(format!(
            "the flood did not run as meant: {}",
            serde_json::to_string(&s)
                .unwrap_or_default()
                .chars()
                .take(2000)
                .collect::<String>()
        ));
    }
    let control = format!("the cell's own report: it sent {}", stdout.trim());
    let blocks = r.content.len();
    let dropped = s["display_dropped"].as_array().map_or(0, Vec::len);
    let blocked = wire <= MAX_RESULT_BYTES
        && blocks <= 65
        && dropped <= 33
        && s["status"] == "ok"
        && s["value"] == "flooded";
    Ok(Outcome {
        control,
        blocked,
        evidence: format!(
            "the result took {wire} bytes of JSON, {blocks} content blocks, {dropped} dropped \
             entries (status {})",
            s["status"]
        ),
    })
}
