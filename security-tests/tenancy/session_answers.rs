//! Session tool answers a tenant makes huge: X's live session binds 40,000
//! variables with 61-character names, writes a 512 KiB file of control
//! characters (six bytes each as JSON text) and 3,000 files each named by
//! 240 control characters; X then asks `list_sessions`, `download_file`
//! and `list_files`, whose answers grow with what its cells made.
//!
//! Defence: every answer as sent stays within the documented maximum (960
//! KiB of JSON, under the 1 MiB event the Python SDK 2.x reads): the
//! listings are cut to fit and say so (`cut_to_fit`), the file comes back
//! whole, as base64.
//!
//! Control: there is no switch that lets an answer grow; the control is
//! what the attack's cells made, measured as the answers would carry it
//! whole (names in the text and the structured content, the file as JSON
//! text): each is past the maximum.

use super::harness::{python, session, Env, Serve};
use super::Outcome;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::json;

/// The documented maximum of a whole result, in bytes of JSON.
const MAX_RESULT_BYTES: usize = 960 * 1024;

const VARS: usize = 40_000;
const FILES: usize = 3_000;
/// Entries `list_files` lists at most.
const LISTED: usize = 1_000;
const FILE_BYTES: usize = 512 << 10;

const CELL: &str = "import os\n\
open('ctl.txt', 'w').write('\\x01' * (512 << 10))\n\
os.mkdir('many')\n\
for i in range(3000):\n    open('many/' + '\\x01' * 240 + '%05d' % i, 'w').close()\n\
globals().update({'v%060d' % i: 0 for i in range(40000)})\n\
len(os.listdir('many'))\n";

fn wire(r: &CallToolResult) -> usize {
    serde_json::to_vec(r).map_or(usize::MAX, |b| b.len())
}

fn decode_b64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    // Control: the answers' data, taken whole.
    let names = VARS * (61 + 3) * 2;
    let file_text = serde_json::to_vec(&"\u{1}".repeat(FILE_BYTES))
        .map_err(|e| format!("{e}"))?
        .len();
    let listing = LISTED * (240 * 6 + 5 + 40) * 2;
    if names.min(file_text).min(listing) <= MAX_RESULT_BYTES {
        return Err(format!(
            "the attack is too small: {names}, {file_text}, {listing} bytes"
        ));
    }
    let control = format!(
        "taken whole, the session's variable names would take {names} bytes, the file as JSON \
         text {file_text}, the listing of {LISTED} of its files {listing} (the maximum: \
         {MAX_RESULT_BYTES})"
    );

    let serve = Serve::start(env, &["x"], &["--language", "python"])?;
    let x = serve.client(env, "x")?;
    let answers = env.block_on("attack", async {
        let sid = session(&x).await?;
        let a = python(&x, Some(&sid), CELL, 120).await;
        if a.structured.as_ref().map(|s| s["value"].clone()) != Some(json!(FILES)) {
            return Err(format!(
                "the cell did not run as meant: {}",
                a.all_text().chars().take(2000).collect::<String>()
            ));
        }
        let mut out = Vec::new();
        for (tool, args) in [
            ("list_sessions", json!({})),
            (
                "download_file",
                json!({"session_id": sid, "path": "ctl.txt"}),
            ),
            ("list_files", json!({"session_id": sid, "path": "many"})),
        ] {
            let params = CallToolRequestParams::new(tool)
                .with_arguments(args.as_object().cloned().unwrap_or_default());
            let r = x
                .call_tool(params)
                .await
                .map_err(|e| format!("{tool} failed: {e}"))?;
            out.push((tool, r));
        }
        Ok(out)
    })??;

    let mut blocked = true;
    let mut seen = Vec::new();
    for (tool, r) in &answers {
        let size = wire(r);
        let s = r.structured_content.clone().unwrap_or_default();
        let whole = match *tool {
            "list_sessions" => {
                let listed = s["sessions"][0]["variables"].as_array().map_or(0, Vec::len);
                seen.push(format!("list_sessions named {listed} variables"));
                s["cut_to_fit"].is_string() && listed > 0
            }
            "download_file" => {
                let bytes = s["content"].as_str().and_then(decode_b64);
                let whole = s["encoding"] == "base64"
                    && bytes.is_some_and(|b| b.len() == FILE_BYTES && b.iter().all(|c| *c == 1));
                seen.push(format!(
                    "download_file sent it as {} (whole: {whole})",
                    s["encoding"]
                ));
                whole
            }
            _ => {
                let listed = s["entries"].as_array().map_or(0, Vec::len);
                seen.push(format!("list_files listed {listed} entries"));
                s["cut_to_fit"].is_string() && listed > 0
            }
        };
        seen.push(format!("{tool}: {size} bytes"));
        blocked &= size <= MAX_RESULT_BYTES + 64 && r.is_error == Some(false) && whole;
    }
    Ok(Outcome {
        control,
        blocked,
        evidence: seen.join("; "),
    })
}
