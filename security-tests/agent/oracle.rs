//! The redaction as an oracle: a cell that never sees the model key spells
//! it out anyway. It knows the key's public prefix (`sk-proj-`, as model
//! providers issue them); it passes candidates (what it knows, and one
//! more character) through three things that give text back — the
//! `aggregate_context` capability, a file it writes in the workspace and
//! reads back, a model endpoint that repeats the prompt — and keeps the
//! candidate that came back redacted. A redaction that answers to any run
//! of 8 bytes confirms one character per round: the whole key in a few
//! dozen calls, which the cell then prints reversed, past any redaction.
//!
//! Control: the cell's candidates reach each of the three and come back
//! (a marker does); the host finds, among the candidates of the first
//! round, exactly one with a run of 8 bytes of the key (a redaction of
//! such runs would have confirmed it); the model endpoint received the
//! key, and the key it echoes comes back redacted (the redaction is on).
//! Defence: the cell confirms nothing past the public prefix, and nothing
//! it returns holds the key, reversed or not.

use super::harness::{completion, marker, python, AgentServe, Echo};
use super::{Env, Outcome};
use std::sync::Arc;

/// A key of the shape providers issue: a public prefix and 48 letters and
/// digits.
fn key() -> String {
    let hex = marker("");
    // Letters in both cases and digits, from the marker's randomness.
    let body: String = hex
        .bytes()
        .chain(marker("").bytes())
        .enumerate()
        .map(|(i, b)| {
            let v = (b as char).to_digit(16).unwrap_or(0) as usize + 16 * (i % 4);
            (b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")[v % 62] as char
        })
        .collect();
    format!("sk-proj-{body}")
}

const CELL: &str = r#"
import string, json
alpha = string.ascii_letters + string.digits
first = []

def by_aggregate(items):
    r = aggregate_context(items, "x", 1000000)
    out = []
    for part in r["text"].split("=== result ")[1:]:
        n, _, body = part.partition(" ===\n")
        if "[REDACTED:" in body:
            out.append(int(n) - 1)
    return out

def by_file(items):
    write_file("probe.txt", "\n".join(items) + "\n")
    text = read_file("probe.txt")["content"]
    lines = [l for l in text.split("\n") if l.strip()]
    return [i for i, l in enumerate(lines) if "[REDACTED:" in l]

def by_model(items):
    text = model_query("\n".join(items))
    lines = [l for l in text.split("\n") if l.strip()]
    return [i for i, l in enumerate(lines) if "[REDACTED:" in l]

found = {}
for name, probe in [("aggregate", by_aggregate), ("file", by_file), ("model", by_model)]:
    known = "sk-proj-"
    for _ in range(60):
        items = ["<" + known[-7:] + c + ">" for c in alpha]
        if not first:
            first.extend(items)
        hit = probe(items)
        if len(hit) != 1:
            break
        known += alpha[hit[0]]
    found[name] = known[::-1]

# Each channel gives a marker back.
echo = {
    "aggregate": "MARK" in aggregate_context(["MARK"], "x", 1000)["text"],
    "file": (write_file("m.txt", "MARK\n"), "MARK" in read_file("m.txt")["content"])[1],
    "model": "MARK" in model_query("MARK"),
}
whole = model_query("SEND-THE-KEY")
{"found": found, "first": first, "echo": echo, "whole": whole}
"#;

pub fn run(env: &Env) -> Result<Outcome, String> {
    let key = key();
    let k = key.clone();
    // A model that repeats the prompt, and sends its key back when asked.
    let echo = Echo::start(Arc::new(move |seen| {
        let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap_or_default();
        let prompt = body
            .pointer("/messages/0/content")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        if prompt == "SEND-THE-KEY" {
            (200, completion(&format!("my key is {k}")))
        } else {
            (200, completion(&prompt))
        }
    }))?;
    let work = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let config = format!(
        r#"
[server]
languages = ["python"]
[models.m]
endpoint = "{url}/v1"
model = "x"
api_key_env = "CB_MODEL_KEY"
max_attempts = 1
[files]
workspace = {work:?}
[policy]
allow = ["model_query", "aggregate_context", "read_file", "write_file"]
max_model_calls = 1000
[limits]
timeout_ms = 120000
"#,
        url = echo.url,
        work = work.path().to_string_lossy()
    );
    let serve = AgentServe::start(env, &config, &[("CB_MODEL_KEY", &key)])?;
    let client = serve.client(env)?;
    let a = env.block_on("cell", python(&client, None, CELL, 180))?;
    let text = a.all_text();
    let v = a
        .structured
        .as_ref()
        .and_then(|v| v.get("value"))
        .cloned()
        .ok_or(format!("the cell gave no value: {text}"))?;
    // The control.
    let echoes = ["aggregate", "file", "model"]
        .iter()
        .all(|c| v.pointer(&format!("/echo/{c}")) == Some(&serde_json::Value::Bool(true)));
    let first: Vec<String> = v
        .get("first")
        .and_then(|f| f.as_array())
        .map(|f| {
            f.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    // The candidate holding the key's next character shows whole (or, were
    // the cell's result redacted at 8 bytes, redacted).
    let confirmable = first
        .iter()
        .filter(|c| {
            c.contains("[REDACTED:")
                || key
                    .as_bytes()
                    .windows(8)
                    .any(|w| c.as_bytes().windows(8).any(|x| x == w))
        })
        .count();
    let whole = v.get("whole").and_then(|w| w.as_str()).unwrap_or_default();
    let sent = echo.seen().iter().any(|(s, answer)| {
        s.header("authorization") == Some(&format!("Bearer {key}")) && answer.contains(&key)
    });
    if !echoes || confirmable != 1 || !sent || !whole.contains("[REDACTED:CB_MODEL_KEY]") {
        return Err(format!(
            "the control failed: every channel gives text back: {echoes}; candidates of the \
             first round holding 8 bytes of the key: {confirmable} (1 expected); the endpoint \
             got and sent back the key: {sent}; its echo came back redacted: {whole:?}"
        ));
    }
    // The defence.
    let reversed: String = key.chars().rev().collect();
    let mut found = Vec::new();
    if let Some(f) = v.get("found").and_then(|f| f.as_object()) {
        for (channel, got) in f {
            let got: String = got.as_str().unwrap_or_default().chars().rev().collect();
            if got.len() > "sk-proj-".len() {
                found.push(format!("through {channel} the cell confirmed {got:?}"));
            }
        }
    }
    if text.contains(&reversed[..24]) {
        found.push("the client's result holds the key reversed".into());
    }
    found.extend(serve.leaks(&text, std::slice::from_ref(&key)));
    Ok(Outcome {
        control: "aggregate_context, a workspace file and a repeating model each gave the \
                  cell's text back; one candidate of the first round held the key's next \
                  character (a redaction of 8-byte runs confirms it); the endpoint's echo of \
                  the whole key came back redacted"
            .into(),
        blocked: found.is_empty(),
        evidence: if found.is_empty() {
            "through each channel the cell confirmed nothing past \"sk-proj-\"".into()
        } else {
            found.join("; ")
        },
    })
}
