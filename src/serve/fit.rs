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
//!
//! The whole result is held to [`MAX_RESULT_BYTES`] as it goes on the wire:
//! every content block (the rendering and the display items), the
//! structured data (with its display descriptors, dropped-display reasons,
//! call records, variable lists and notes) and the flags, counted as
//! serialized JSON. Display items fill at most [`DISPLAY_BUDGET`] of it (at
//! most 64 of them); what is
//! left over goes to `structuredContent`, which past its cuttable parts
//! loses the tails of its longest lists (the result's `notes` say how many
//! entries went) and then the middles of its longest strings. A host tool's
//! result is held to the same maximum.

use crate::protocol::{DisplayDropped, DisplayItem};
use crate::{CellResult, Status, Truncation};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};

/// Largest whole `tools/call` result, in bytes of JSON: what the server
/// writes is this plus the JSON-RPC envelope (`{"jsonrpc":"2.0","id":..,
/// "result":..}`) and, over HTTP, the event's framing, all well within the
/// 1 MiB (1,048,576 bytes) the strictest official client reads.
pub const MAX_RESULT_BYTES: usize = 960 * 1024;
/// Of it, bytes of JSON the display items' content blocks may take.
pub const DISPLAY_BUDGET: usize = 384 * 1024;
/// Largest `structuredContent`, in bytes of JSON.
pub const STRUCTURED_BUDGET: usize = 512 * 1024;
/// What a result's envelope (`isError`, the `content` and
/// `structuredContent` keys, separators) takes at most besides its parts.
const ENVELOPE_BYTES: usize = 256;
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

/// The lists of a structured result whose tails may go, by JSON pointer.
const LISTS: [&str; 6] = [
    "/calls",
    "/vars/changed",
    "/vars/deleted",
    "/vars/dropped",
    "/display_dropped",
    "/notes",
];

/// Rounds of cutting lists and strings before giving up on a result.
const MAX_ROUNDS: usize = 200;

/// Hold a structured result to `budget`: its cuttable parts first
/// ([`shrink`]), then the tails of its longest lists, then the middles of
/// its longest strings wherever they are. `false` when even that was not
/// enough (the caller then sends a stand-in).
fn shrink_all(v: &mut Value, budget: usize) -> bool {
    shrink(v, budget);
    if json_len(v) <= budget {
        return true;
    }
    // Room for the notes that say what went, added once the cutting is
    // done (so that cutting the notes never takes them).
    let budget = budget.saturating_sub(NOTES_ROOM);
    let mut cut: Vec<(&str, usize, usize)> = Vec::new();
    let mut rounds = 0;
    let fitted = loop {
        let size = json_len(v);
        if size <= budget {
            break true;
        }
        rounds += 1;
        if rounds > MAX_ROUNDS {
            break false;
        }
        if let Some((ptr, len, keep)) = cut_longest_list(v, size - budget) {
            match cut.iter_mut().find(|(p, _, _)| *p == ptr) {
                Some(c) => c.2 = keep,
                None => cut.push((ptr, len, keep)),
            }
            continue;
        }
        if !cut_longest_string(v, size - budget) {
            break false;
        }
    };
    for (ptr, len, keep) in cut {
        if ptr == "/calls" {
            // Calls made, kept or not: the count the result had.
            let total = v
                .pointer("/truncated/calls/total")
                .and_then(Value::as_u64)
                .unwrap_or(len as u64);
            if let Some(t) = v.get_mut("truncated").and_then(Value::as_object_mut) {
                t.insert("calls".into(), json!({"total": total, "kept": keep}));
            }
            continue;
        }
        let note = format!(
            "{} of {len} entries of {} were left out to fit the result's maximum of \
             {MAX_RESULT_BYTES} bytes",
            len - keep,
            ptr.trim_start_matches('/').replace('/', ".")
        );
        match v.get_mut("notes") {
            Some(Value::Array(notes)) => notes.push(Value::String(note)),
            _ => {
                if let Some(m) = v.as_object_mut() {
                    m.insert("notes".into(), json!([note]));
                }
            }
        }
    }
    fitted
}

/// Bytes kept for the notes [`shrink_all`] adds (one per list it cut).
const NOTES_ROOM: usize = LISTS.len() * 160;

/// Bytes `v` takes as JSON.
fn json_len_of<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// Cut the tail of the list of [`LISTS`] that takes the most bytes, by
/// enough entries to shed `over` bytes (all of it when that is not
/// enough): which list, its length and what was kept of it. `None` when no
/// list has anything left to cut.
fn cut_longest_list(v: &mut Value, over: usize) -> Option<(&'static str, usize, usize)> {
    let (ptr, len) = LISTS
        .iter()
        .filter_map(|p| {
            let a = v.pointer(p)?.as_array()?;
            (!a.is_empty()).then(|| (*p, a.len(), json_len_of(a)))
        })
        // The notes keep their first entry.
        .filter(|(p, len, _)| *p != "/notes" || *len > 1)
        .max_by_key(|(_, _, bytes)| *bytes)
        .map(|(p, len, _)| (p, len))?;
    let Value::Array(a) = v.pointer_mut(ptr)? else {
        return None;
    };
    // From the end, entries until `over` bytes went.
    let floor = usize::from(ptr == "/notes");
    let mut keep = len;
    let mut shed = 0;
    while keep > floor && shed < over + 64 {
        keep -= 1;
        shed += json_len_of(&a[keep]) + 1;
    }
    a.truncate(keep);
    Some((ptr, len, keep))
}

/// Cut the middle of the longest string in `v` (values, not keys) by at
/// least `over` bytes, or to half its length. `false` when no string is
/// longer than the least kept.
fn cut_longest_string(v: &mut Value, over: usize) -> bool {
    fn longest<'a>(v: &'a mut Value, best: &mut Option<&'a mut String>) {
        match v {
            Value::String(s) if best.as_ref().is_none_or(|b| s.len() > b.len()) => {
                *best = Some(s);
            }
            Value::Array(a) => a.iter_mut().for_each(|x| longest(x, best)),
            Value::Object(m) => m.values_mut().for_each(|x| longest(x, best)),
            _ => {}
        }
    }
    let mut best = None;
    longest(v, &mut best);
    let Some(s) = best.filter(|s| s.len() > 2 * MIN_STRING) else {
        return false;
    };
    // Escapes may make a string's JSON six times its text: cut at least
    // half of it each round, so the rounds end.
    let keep = s
        .len()
        .saturating_sub(over)
        .min(s.len() / 2)
        .max(MIN_STRING);
    if let Some((cut, _)) = recut(s, None, keep) {
        *s = cut;
    }
    true
}

/// A string anywhere is never cut below this many bytes.
const MIN_STRING: usize = 64;

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

/// The result of a cell as an MCP tool result's two parts (display items
/// left aside: see [`tool_result`]).
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

/// A display item as a content block: an image, or text.
fn display_block(item: &DisplayItem) -> ContentBlock {
    if item.mime.starts_with("image/") {
        ContentBlock::image(item.data.clone(), item.mime.clone())
    } else {
        ContentBlock::text(item.data.clone())
    }
}

/// Bytes `block` takes as JSON, and a comma.
fn block_len(block: &ContentBlock) -> usize {
    serde_json::to_vec(block).map_or(usize::MAX, |b| b.len() + 1)
}

/// The MCP result of a cell, all of it within [`MAX_RESULT_BYTES`] as
/// serialized: the readable rendering first, then the display items that
/// fit [`DISPLAY_BUDGET`] as content blocks (the others listed in
/// `display_dropped`), and `structuredContent` with what is left. isError
/// is true for every status but ok.
pub fn tool_result(mut r: CellResult, verbose: bool) -> Result<CallToolResult, serde_json::Error> {
    let display = std::mem::take(&mut r.display);
    let failed = r.status != Status::Ok;
    let (status, count, language) = (r.status, r.execution_count, r.language.clone());
    let (usage, exit) = (r.usage.clone(), r.exit);
    if !verbose {
        r.sandbox = None;
    }
    let text = ContentBlock::text(content_text(r.clone()));
    let mut used = block_len(&text);
    let mut blocks = vec![text];
    let mut described = Vec::new();
    let mut display_used = 0;
    for item in display {
        use crate::supervisor::display::MAX_DISPLAY_ITEMS;
        if described.len() >= MAX_DISPLAY_ITEMS {
            push_dropped(
                &mut r.display_dropped,
                DisplayDropped {
                    mime: item.mime.chars().take(100).collect(),
                    bytes: item.data.len() as u64,
                    reason: format!(
                        "past the first {MAX_DISPLAY_ITEMS} items (at most {MAX_DISPLAY_ITEMS} \
                         per cell)"
                    ),
                },
            );
            continue;
        }
        let block = display_block(&item);
        let len = block_len(&block);
        if display_used + len > DISPLAY_BUDGET {
            push_dropped(
                &mut r.display_dropped,
                DisplayDropped {
                    mime: item.mime.chars().take(100).collect(),
                    bytes: item.data.len() as u64,
                    reason: format!(
                        "over the {DISPLAY_BUDGET} bytes a result's display items may take as \
                         sent"
                    ),
                },
            );
            continue;
        }
        display_used += len;
        described.push(json!({
            "mime": item.mime,
            "bytes": item.data.len(),
            "content_index": blocks.len(),
        }));
        blocks.push(block);
    }
    used += display_used;
    let mut structured = serde_json::to_value(&r)?;
    if let Some(m) = structured.as_object_mut() {
        if !verbose {
            m.remove("run");
            m.remove("sandbox");
        }
        m.remove("display");
    }
    let budget = STRUCTURED_BUDGET.min(MAX_RESULT_BYTES.saturating_sub(used + ENVELOPE_BYTES));
    // The display descriptors are small and bounded (a few dozen bytes
    // each, at most MAX_DISPLAY_ITEMS): they stay whole.
    let described = Value::Array(described);
    let room = budget.saturating_sub(json_len(&described) + 16);
    let fitted = shrink_all(&mut structured, room);
    if !fitted {
        structured = stand_in(status, count, &language, usage, exit)?;
    }
    if let (Some(m), Some(a)) = (structured.as_object_mut(), described.as_array()) {
        if !a.is_empty() {
            m.insert("display".into(), described);
        }
    }
    let mut tool = CallToolResult::structured(structured);
    tool.content = blocks;
    tool.is_error = Some(failed || !fitted);
    Ok(tool)
}

/// Add `d` to a result's `display_dropped`, within its bound (the last
/// entry then counts what is not listed).
fn push_dropped(list: &mut Vec<DisplayDropped>, d: DisplayDropped) {
    use crate::supervisor::display::MAX_DISPLAY_DROPPED;
    if list.len() < MAX_DISPLAY_DROPPED {
        list.push(d);
        return;
    }
    let more = |n: u64| {
        format!("{n} more items were left out and are not listed (at most {MAX_DISPLAY_DROPPED} listed)")
    };
    match list.last_mut() {
        Some(last) if last.mime == "*" => {
            let n = last
                .reason
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            last.reason = more(n + 1);
        }
        _ => list.push(DisplayDropped {
            mime: "*".into(),
            bytes: 0,
            reason: more(1),
        }),
    }
}

/// What is sent when a result cannot be held to the maximum even with its
/// parts cut (it never happens with the supervisor's own bounds; a stand-in
/// keeps the client whole if it ever does).
fn stand_in(
    status: Status,
    count: u64,
    language: &str,
    usage: crate::supervisor::Usage,
    exit: crate::supervisor::ExitInfo,
) -> Result<Value, serde_json::Error> {
    let mut r = CellResult::new(language, crate::RunInfo::root());
    r.status = status;
    r.execution_count = count;
    r.usage = usage;
    r.exit = exit;
    r.notes.push(format!(
        "the cell's result could not be held to the {MAX_RESULT_BYTES} bytes a result may take, \
         even cut: only its status is sent"
    ));
    let mut v = serde_json::to_value(&r)?;
    if let Some(m) = v.as_object_mut() {
        m.remove("run");
        m.remove("sandbox");
    }
    Ok(v)
}

/// A host tool's result (a JSON value), within [`MAX_RESULT_BYTES`]: the
/// value as `structuredContent` (an object; anything else under `value`)
/// with its longest lists and strings cut to fit, and its text cut to
/// [`CONTENT_BUDGET`].
pub fn value_result(v: Value, is_error: bool) -> CallToolResult {
    let mut v = if v.is_object() {
        v
    } else {
        json!({ "value": v })
    };
    let mut cut = false;
    for _ in 0..MAX_ROUNDS {
        let size = json_bound(&v);
        if size <= STRUCTURED_BUDGET || json_len(&v) <= STRUCTURED_BUDGET {
            break;
        }
        cut = true;
        if !cut_largest_array(&mut v) && !cut_longest_string(&mut v, size - STRUCTURED_BUDGET) {
            v = json!({"error": "the result could not be held to the maximum a result may take"});
            break;
        }
    }
    if cut {
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "cut_to_fit".into(),
                json!(format!(
                    "parts of this result were left out to fit the {MAX_RESULT_BYTES} bytes a \
                     result may take"
                )),
            );
        }
    }
    let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
    if let Some((c, _)) = recut(&text, None, CONTENT_BUDGET) {
        text = c;
    }
    let mut r = CallToolResult::structured(v);
    r.content = vec![ContentBlock::text(text)];
    r.is_error = Some(is_error);
    r
}

/// Any tool's MCP result held to [`MAX_RESULT_BYTES`] as sent (the tools
/// whose answers grow with what a tenant made: `list_sessions`,
/// `list_files`, ...): one past it is made again from its
/// `structuredContent` by [`value_result`] (its largest lists and longest
/// strings cut, and `cut_to_fit` says so), or, without one, from its text
/// cut to [`CONTENT_BUDGET`].
pub fn held_to_max(r: CallToolResult) -> CallToolResult {
    if json_len_of(&r) <= MAX_RESULT_BYTES {
        return r;
    }
    let is_error = r.is_error.unwrap_or(false);
    if let Some(v) = r.structured_content {
        return value_result(v, is_error);
    }
    let text: Vec<&str> = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    let text = text.join("\n");
    let text = recut(&text, None, CONTENT_BUDGET).map_or(text, |(t, _)| t);
    let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
    out.is_error = Some(is_error);
    out
}

/// Halve the array anywhere in `v` that takes the most bytes (of those
/// with more than one entry). `false` when there is none.
fn cut_largest_array(v: &mut Value) -> bool {
    fn largest<'a>(v: &'a mut Value, best: &mut Option<(usize, &'a mut Vec<Value>)>) {
        match v {
            Value::Array(a) => {
                let size = json_bound(&Value::Null) + a.iter().map(json_bound).sum::<usize>();
                if a.len() > 1 && best.as_ref().is_none_or(|(b, _)| size > *b) {
                    // Nothing inside it is larger than it.
                    *best = Some((size, a));
                } else {
                    a.iter_mut().for_each(|x| largest(x, best));
                }
            }
            Value::Object(m) => m.values_mut().for_each(|x| largest(x, best)),
            _ => {}
        }
    }
    let mut best = None;
    largest(v, &mut best);
    match best {
        Some((_, a)) => {
            let keep = a.len() / 2;
            a.truncate(keep);
            true
        }
        None => false,
    }
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

    fn item(mime: &str, data: &str) -> DisplayItem {
        DisplayItem {
            mime: mime.into(),
            data: data.into(),
        }
    }

    /// Bytes the whole result takes on the wire, in the JSON-RPC envelope
    /// a server writes it in.
    fn wire_len(tool: &CallToolResult) -> usize {
        let envelope = json!({"jsonrpc": "2.0", "id": 1, "result": tool});
        serde_json::to_vec(&envelope).unwrap().len()
    }

    fn validate(structured: &Value) {
        for schema in [schema::cell_result(), schema::cell_result_compact()] {
            let validator = jsonschema::validator_for(&Value::Object(schema)).unwrap();
            let errs: Vec<String> = validator
                .iter_errors(structured)
                .map(|e| e.to_string())
                .collect();
            assert!(errs.is_empty(), "{errs:?}");
        }
    }

    use super::super::schema;

    #[test]
    fn images_become_image_content_named_by_index() {
        let mut r = result("hi\n");
        r.display = vec![item("image/png", "iVBORw=="), item("text/html", "<b>x</b>")];
        let tool = tool_result(r, false).unwrap();
        assert_eq!(tool.content.len(), 3);
        let v = serde_json::to_value(&tool.content).unwrap();
        assert_eq!(v[0]["text"], "hi\n");
        assert_eq!(v[1]["type"], "image");
        assert_eq!(v[1]["data"], "iVBORw==");
        assert_eq!(v[1]["mimeType"], "image/png");
        assert_eq!(v[2]["text"], "<b>x</b>");
        let s = tool.structured_content.unwrap();
        assert_eq!(
            s["display"],
            json!([
                {"mime": "image/png", "bytes": 8, "content_index": 1},
                {"mime": "text/html", "bytes": 8, "content_index": 2}
            ])
        );
        validate(&s);
    }

    /// The largest result a cell can make the supervisor hand over: every
    /// part at or past what the supervisor's own bounds let through (its
    /// display checks and call-record caps), and parts whose JSON is six
    /// times their text. The whole of it, as written on the wire, fits.
    #[test]
    fn the_largest_result_fits_on_the_wire() {
        use crate::protocol::ScriptError;
        use crate::supervisor::display::{MAX_DISPLAY_DROPPED, MAX_DISPLAY_ITEMS};
        use crate::supervisor::{CallRecord, MAX_CALL_RECORDS};
        let ctl = "\u{1}";
        let mut r = result(&ctl.repeat(1 << 20));
        r.stderr = ctl.repeat(1 << 20);
        r.status = Status::Error;
        r.value = json!(vec![ctl.repeat(100); 20_000]);
        r.value_repr = Some(ctl.repeat(1 << 20));
        r.final_answer = Some(json!({"a": ctl.repeat(1 << 20)}));
        r.error = Some(ScriptError {
            kind: ctl.repeat(100_000),
            message: ctl.repeat(1 << 20),
            traceback: Some(ctl.repeat(1 << 20)),
            line: Some(1),
            column: None,
        });
        // HTML display items of control bytes: six bytes each as JSON.
        // A few small images, then HTML items of control bytes (six bytes
        // each as JSON).
        r.display = vec![item("image/png", "iVBORw=="); 3];
        r.display.extend(vec![
            item("text/html", &ctl.repeat(256 * 1024));
            MAX_DISPLAY_ITEMS
        ]);
        r.display_dropped = vec![
            DisplayDropped {
                mime: ctl.repeat(100),
                bytes: 1,
                reason: ctl.repeat(300),
            };
            MAX_DISPLAY_DROPPED + 1
        ];
        r.vars.changed = (0..30_000).map(|i| format!("{ctl}{i}")).collect();
        r.vars.deleted = r.vars.changed.clone();
        r.vars.dropped = (0..30_000)
            .map(|i| crate::protocol::DroppedVar {
                name: format!("v{i}"),
                type_name: ctl.repeat(10),
                reason: ctl.repeat(100),
            })
            .collect();
        r.calls = (0..MAX_CALL_RECORDS)
            .map(|i| CallRecord {
                cap: format!("cap{i}"),
                outcome: "failed".into(),
                message: Some(ctl.repeat(250)),
                run_id: "r".repeat(32),
                depth: 0,
                ms: 1,
                detail: Some(json!({"model": ctl.repeat(200)})),
            })
            .collect();
        r.notes = vec![ctl.repeat(1000); 1000];
        for verbose in [false, true] {
            let tool = tool_result(r.clone(), verbose).unwrap();
            let wire = wire_len(&tool);
            assert!(wire <= MAX_RESULT_BYTES + 64, "{wire} bytes on the wire");
            let s = tool.structured_content.as_ref().unwrap();
            validate(s);
            assert_eq!(s["status"], "error");
            // Display blocks within their share, the rest listed.
            let shown = tool.content.len() - 1;
            assert!((3..MAX_DISPLAY_ITEMS).contains(&shown), "{shown}");
            assert_eq!(s["display"].as_array().map_or(0, Vec::len), shown);
            let dropped = s["display_dropped"].as_array().unwrap();
            assert!(
                dropped.len() <= MAX_DISPLAY_DROPPED + 1,
                "{}",
                dropped.len()
            );
            // What went is said.
            let notes = s["notes"].as_array().unwrap();
            assert!(
                notes.iter().any(|n| n.as_str().unwrap().contains("vars.")),
                "{:?}",
                &notes[notes.len().saturating_sub(3)..]
            );
        }
    }

    /// 200,001 empty display items (no bytes, so only the count holds
    /// them): the supervisor keeps MAX_DISPLAY_ITEMS; even were they all
    /// handed over, the result fits.
    #[test]
    fn many_empty_display_items_fit() {
        let mut r = result("");
        r.display = vec![item("text/markdown", ""); 200_001];
        let tool = tool_result(r, false).unwrap();
        assert!(wire_len(&tool) <= MAX_RESULT_BYTES + 64);
        validate(tool.structured_content.as_ref().unwrap());
    }

    /// A session tool's answer past the maximum (a listing of many long
    /// names, in its text and its structured content) is made again
    /// within it, saying so; a text-only one is cut; small ones are as
    /// they were.
    #[test]
    fn any_tool_result_is_held_to_the_maximum() {
        let entries: Vec<Value> = (0..5000)
            .map(|i| json!({"name": format!("{i:0>250}"), "type": "file", "size": 0}))
            .collect();
        let text = entries
            .iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join("\n");
        let mut big = CallToolResult::structured(json!({"path": ".", "entries": entries}));
        big.content = vec![ContentBlock::text(text.clone())];
        big.is_error = Some(false);
        assert!(wire_len(&big) > MAX_RESULT_BYTES);
        let held = held_to_max(big);
        assert!(
            wire_len(&held) <= MAX_RESULT_BYTES + 64,
            "{}",
            wire_len(&held)
        );
        let s = held.structured_content.unwrap();
        assert!(s["cut_to_fit"].is_string(), "{s}");
        assert_eq!(s["path"], ".");
        assert!(!s["entries"].as_array().unwrap().is_empty());
        assert_eq!(held.is_error, Some(false));

        let mut bare = CallToolResult::success(vec![ContentBlock::text("\u{1}".repeat(2 << 20))]);
        bare.is_error = Some(true);
        let held = held_to_max(bare);
        assert!(
            wire_len(&held) <= MAX_RESULT_BYTES + 64,
            "{}",
            wire_len(&held)
        );
        assert_eq!(held.is_error, Some(true));

        let small = value_result(json!({"a": 1}), false);
        assert_eq!(held_to_max(small.clone()), small);
    }

    #[test]
    fn host_tool_results_fit() {
        let big = json!({
            "path": "a",
            "content": "\u{1}".repeat(2 << 20),
            "matches": (0..100_000).map(|i| json!({"path": "p".repeat(100), "line": i})).collect::<Vec<_>>(),
        });
        let tool = value_result(big, false);
        assert!(
            wire_len(&tool) <= MAX_RESULT_BYTES + 64,
            "{}",
            wire_len(&tool)
        );
        let s = tool.structured_content.unwrap();
        assert!(s["cut_to_fit"].is_string());
        assert_eq!(s["path"], "a");
        let small = value_result(json!([1, 2]), false);
        assert_eq!(small.structured_content.unwrap(), json!({"value": [1, 2]}));
    }
}
