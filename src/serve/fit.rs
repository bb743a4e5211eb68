//! Results that fit a client and a model's context.
//!
//! A cell's MCP result has two parts. `structuredContent` is the data a
//! program needs: the [`CellResult`] without the sandbox report and run ids
//! (those only when the call asks with `verbose: true`). `content` is the
//! readable rendering a model is shown: stdout and stderr as excerpts (the
//! head and tail of a long stream), the value, the error; the whole kept
//! output is sent once, in `structuredContent`.
//!
//! Every response must also stay within what the official SDKs accept. The
//! tightest default among them is the Python SDK 2.x's limit of 1 MiB
//! (1,048,576 bytes) for one server-sent event over streamable HTTP; a
//! response over it fails the call there. So `structuredContent` is held to
//! [`STRUCTURED_BUDGET`] bytes as serialized (JSON escapes count: a control
//! byte becomes six) and `content` to about [`CONTENT_BUDGET`]: past them
//! the largest parts (stdout, stderr, a traceback, an error message, the
//! value and its repr, the answer) are cut in the middle, and `truncated` says what was
//! kept. The output caps (`max_output_bytes`, 32 KiB per stream by default
//! for `serve`) normally keep a result far below these budgets; they hold
//! whatever the caps and the cell do.

use crate::{CellResult, Truncation};
use serde_json::{json, Value};

/// Largest `structuredContent`, in bytes of JSON.
pub const STRUCTURED_BUDGET: usize = 512 * 1024;
/// Largest `content` text, in bytes (its JSON may be larger by escapes:
/// at most six times, still well within the limit above).
pub const CONTENT_BUDGET: usize = 24 * 1024;
/// `content` shows a stream whole up to twice this, else its first and
/// last this many bytes.
pub const EXCERPT_BYTES: usize = 4 * 1024;
/// A part is never cut below this many bytes.
const MIN_KEEP: usize = 1024;

/// A cell's result as sent: the readable text and the structured data.
#[derive(Debug)]
pub struct Fitted {
    pub text: String,
    pub structured: Value,
}

/// The largest index `<= i` on a char boundary of `s`.
fn floor_char(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest index `>= i` on a char boundary of `s`.
fn ceil_char(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

fn omitted_marker(bytes: u64) -> String {
    format!("\n[... {bytes} bytes omitted ...]\n")
}

/// `text` cut to about `keep` bytes: its head and tail around a marker.
/// `trunc` says what `text` already is (a capture's head, marker and tail
/// of a longer stream); the result's truncation counts against the
/// original total. `None` when `text` is no longer than `keep`.
fn recut(text: &str, trunc: Option<Truncation>, keep: usize) -> Option<(String, Truncation)> {
    if text.len() <= keep {
        return None;
    }
    let (head, tail, total) = match trunc {
        Some(t) => {
            let omitted = t
                .total_bytes
                .saturating_sub(t.kept_head)
                .saturating_sub(t.kept_tail);
            let marker = omitted_marker(omitted);
            match text.find(&marker) {
                Some(p) => (&text[..p], &text[p + marker.len()..], t.total_bytes),
                None => (text, "", t.total_bytes),
            }
        }
        None => (text, "", text.len() as u64),
    };
    let h = floor_char(head, keep / 2);
    let new_head = &head[..h];
    let rest = if tail.is_empty() { &head[h..] } else { tail };
    let want_tail = keep - h;
    let new_tail = &rest[ceil_char(rest, rest.len().saturating_sub(want_tail))..];
    let kept = (new_head.len() + new_tail.len()) as u64;
    let omitted = total.saturating_sub(kept);
    Some((
        format!("{new_head}{}{new_tail}", omitted_marker(omitted)),
        Truncation {
            total_bytes: total,
            kept_head: new_head.len() as u64,
            kept_tail: new_tail.len() as u64,
        },
    ))
}

/// A stream as `content` shows it: whole, or its head and tail.
fn excerpt(text: &str, stream: &str) -> String {
    if text.len() <= 2 * EXCERPT_BYTES {
        return text.to_owned();
    }
    let head = &text[..floor_char(text, EXCERPT_BYTES)];
    let tail = &text[ceil_char(text, text.len() - EXCERPT_BYTES)..];
    let hidden = text.len() - head.len() - tail.len();
    format!(
        "{head}\n[... {hidden} bytes not shown here; structuredContent.{stream} has all {} kept \
         bytes ...]\n{tail}",
        text.len()
    )
}

/// The parts of a structured result that may be cut, by JSON pointer.
const CUTTABLE: [&str; 7] = [
    "/stdout",
    "/stderr",
    "/error/traceback",
    "/error/message",
    "/value",
    "/value_repr",
    "/final_answer",
];

/// Bytes `v` takes as JSON.
fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// At least as many bytes as `v` takes as JSON, counted without writing
/// it: a string as if each byte took the six of an escape.
fn json_bound(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        // The longest number serde_json writes: "-1.7976931348623157e308".
        Value::Number(_) => 24,
        Value::String(s) => 2 + 6 * s.len(),
        Value::Array(a) => 2 + a.iter().map(|x| json_bound(x) + 1).sum::<usize>(),
        Value::Object(m) => {
            2 + m
                .iter()
                .map(|(k, x)| 2 + 6 * k.len() + 1 + json_bound(x) + 1)
                .sum::<usize>()
        }
    }
}

/// Cut the largest parts of `v` (a serialized [`CellResult`]) until it is at
/// most `budget` bytes of JSON or nothing is left to cut.
fn shrink(v: &mut Value, budget: usize) {
    // Most results are far within the budget: they are not written out
    // only to be measured.
    if json_bound(v) <= budget {
        return;
    }
    loop {
        let size = json_len(v);
        if size <= budget {
            return;
        }
        // The largest part (as JSON) still worth cutting.
        let Some((ptr, part_json, raw)) = CUTTABLE
            .iter()
            .filter_map(|p| {
                let part = v.pointer(p)?;
                let raw = match part {
                    Value::Null => return None,
                    Value::String(s) => s.len(),
                    other => json_len(other),
                };
                (raw > 2 * MIN_KEEP).then(|| (*p, json_len(part), raw))
            })
            .max_by_key(|(_, j, _)| *j)
        else {
            return;
        };
        // Shed the excess in raw bytes (escapes make JSON longer than the
        // text) and a little more for the marker; at least 1 KiB each
        // time, so the loop ends.
        let over_raw = ((size - budget) as u128 * raw as u128 / part_json.max(1) as u128) as usize;
        let keep = raw
            .saturating_sub(over_raw + over_raw / 16 + 1024)
            .max(MIN_KEEP);
        cut_part(v, ptr, keep);
    }
}

fn cut_part(v: &mut Value, ptr: &str, keep: usize) {
    let key = ptr.trim_start_matches('/');
    match ptr {
        "/stdout" | "/stderr" => {
            let trunc: Option<Truncation> = v
                .pointer(&format!("/truncated/{key}"))
                .and_then(|t| serde_json::from_value(t.clone()).ok());
            let text = v.get(key).and_then(Value::as_str).unwrap_or("");
            if let Some((cut, t)) = recut(text, trunc, keep) {
                v[key] = Value::String(cut);
                v["truncated"][key] = json!(t);
            }
        }
        "/error/traceback" | "/error/message" | "/value_repr" => {
            if let Some(slot) = v.pointer_mut(ptr) {
                if let Some((cut, _)) = slot.as_str().and_then(|s| recut(s, None, keep)) {
                    *slot = Value::String(cut);
                }
            }
        }
        _ => {
            // A value or answer too large to send: its JSON text, cut, in
            // place of it, and `truncated` says so.
            let text = v.get(key).map(|x| x.to_string()).unwrap_or_default();
            let trunc = v
                .pointer(&format!("/truncated/{key}"))
                .and_then(|t| serde_json::from_value(t.clone()).ok());
            if let Some((cut, t)) = recut(&text, trunc, keep) {
                v[key] = Value::String(cut);
                v["truncated"][key] = json!(t);
            }
        }
    }
}

/// The readable rendering: excerpts of the streams, the value, the error,
/// at most about [`CONTENT_BUDGET`] bytes.
fn content_text(mut r: CellResult) -> String {
    r.stdout = excerpt(&r.stdout, "stdout");
    r.stderr = excerpt(&r.stderr, "stderr");
    let mut text = r.render_text();
    if text.is_empty() {
        text = "[status: ok; no output and no value]\n".into();
    }
    if let Some((cut, _)) = recut(&text, None, CONTENT_BUDGET) {
        text = cut;
    }
    text
}

/// The result of a cell as an MCP tool result's two parts.
pub fn fit(mut r: CellResult, verbose: bool) -> Result<Fitted, serde_json::Error> {
    // The sandbox report, left out unless asked for, is not built into a
    // JSON value only to be removed from it (it was half of the work).
    if !verbose {
        r.sandbox = None;
    }
    let mut structured = serde_json::to_value(&r)?;
    if !verbose {
        if let Some(m) = structured.as_object_mut() {
            m.remove("run");
            m.remove("sandbox");
        }
    }
    shrink(&mut structured, STRUCTURED_BUDGET);
    Ok(Fitted {
        text: content_text(r),
        structured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ScriptError;
    use crate::{RunInfo, Status};

    fn result(stdout: &str) -> CellResult {
        let mut r = CellResult::new("python", RunInfo::root());
        r.stdout = stdout.to_owned();
        r
    }

    #[test]
    fn small_results_are_whole_and_plumbing_is_on_request() {
        let mut r = result("hi\n");
        r.value = json!(2.5);
        let f = fit(r.clone(), false).unwrap();
        assert_eq!(f.text, "hi\n=> 2.5\n");
        assert_eq!(f.structured["stdout"], "hi\n");
        assert_eq!(f.structured["value"], 2.5);
        assert!(f.structured.get("sandbox").is_none());
        assert!(f.structured.get("run").is_none());
        assert!(f.structured.get("exit").is_some());
        let v = fit(r.clone(), true).unwrap();
        assert!(v.structured.get("run").is_some());
        assert!(v.structured.get("sandbox").is_some());
        // A report, when there is one, only on request too.
        r.sandbox = Some(crate::sandbox::SandboxReport {
            profile: "rhai".into(),
            ..Default::default()
        });
        let f = fit(r.clone(), false).unwrap();
        assert!(f.structured.get("sandbox").is_none());
        assert_eq!(f.text, "hi\n=> 2.5\n");
        let v = fit(r, true).unwrap();
        assert_eq!(v.structured["sandbox"]["profile"], "rhai");
    }

    #[test]
    fn content_shows_excerpts_and_output_is_sent_once() {
        let out: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let f = fit(result(&out), false).unwrap();
        assert_eq!(f.structured["stdout"], out.as_str());
        assert!(f.text.starts_with("line 0\n"));
        assert!(f.text.contains("line 2999\n"));
        assert!(
            !f.text.contains("line 1500\n"),
            "the middle is not repeated"
        );
        assert!(f.text.len() < 2 * EXCERPT_BYTES + 200, "{}", f.text.len());
        assert!(f.text.contains("structuredContent.stdout has all"));
    }

    #[test]
    fn the_bound_is_never_below_the_json() {
        let mut r = result("plain \u{1}\u{1f}\"\\ é 🙂 \n\t");
        r.stderr = "\u{7f}\u{2028}".repeat(50);
        r.value = json!({
            "n": [0, -1, u64::MAX, i64::MIN, 1.5e300, -2.2250738585072014e-308, f64::MAX],
            "\u{1}key\"": [null, true, false, "", [], {}],
            "nested": {"a": [{"b": "\u{0}".repeat(10)}]}
        });
        r.value_repr = Some("x".repeat(100));
        r.status = Status::Error;
        r.error = Some(ScriptError {
            kind: "E".into(),
            message: "\u{8}".into(),
            traceback: None,
            line: Some(3),
            column: None,
        });
        let v = serde_json::to_value(&r).unwrap();
        assert!(
            json_bound(&v) >= json_len(&v),
            "{} < {}",
            json_bound(&v),
            json_len(&v)
        );
        for part in v.as_object().unwrap().values() {
            assert!(json_bound(part) >= json_len(part), "{part}");
        }
        // A number is written in at most 24 bytes only while serde_json
        // keeps numbers as machine numbers (not with `arbitrary_precision`,
        // which another crate could turn on for all).
        let long: Value = serde_json::from_str("-123456789012345678901234567890.5e-300").unwrap();
        assert!(json_len(&long) <= json_bound(&long), "{long}");
    }

    #[test]
    fn recut_keeps_the_original_total() {
        let (once, t1) = recut(&"a".repeat(100), None, 20).unwrap();
        assert_eq!(t1.total_bytes, 100);
        assert_eq!((t1.kept_head, t1.kept_tail), (10, 10));
        assert!(once.contains("[... 80 bytes omitted ...]"));
        let (twice, t2) = recut(&once, Some(t1), 8).unwrap();
        assert_eq!(t2.total_bytes, 100);
        assert_eq!((t2.kept_head, t2.kept_tail), (4, 4));
        assert_eq!(twice, format!("aaaa{}aaaa", omitted_marker(92)));
        // Multi-byte characters are never split.
        let (s, _) = recut(&"é".repeat(50), None, 11).unwrap();
        assert!(s.starts_with("éé") && s.ends_with("ééé"));
    }

    #[test]
    fn every_part_is_held_to_the_budget() {
        // Control bytes take six bytes each as JSON.
        let mut r = result(&"\u{1}".repeat(400_000));
        r.stderr = "e".repeat(300_000);
        r.value = json!(vec!["v".repeat(1000); 400]);
        r.value_repr = Some("r".repeat(300_000));
        r.final_answer = Some(json!("a".repeat(300_000)));
        r.status = Status::Error;
        r.error = Some(ScriptError {
            kind: "ValueError".into(),
            message: "m".repeat(300_000),
            traceback: Some("t".repeat(300_000)),
            line: None,
            column: None,
        });
        let f = fit(r.clone(), true).unwrap();
        let size = json_len(&f.structured);
        assert!(size <= STRUCTURED_BUDGET, "{size}");
        assert!(f.text.len() <= CONTENT_BUDGET + 100, "{}", f.text.len());
        let t = &f.structured["truncated"];
        assert_eq!(t["stdout"]["total_bytes"], 400_000);
        assert!(t["value"]["total_bytes"].as_u64().unwrap() > 400_000);
        assert!(f.structured["value"].is_string());
        // A cut result still validates against the declared schema.
        let schema = Value::Object(super::super::schema::cell_result());
        let validator = jsonschema::validator_for(&schema).unwrap();
        let errs: Vec<String> = validator
            .iter_errors(&f.structured)
            .map(|e| e.to_string())
            .collect();
        assert!(errs.is_empty(), "{errs:?}");
    }
}
