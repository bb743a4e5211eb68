//! The file tools as capabilities (for cells) and as plain calls by name
//! (for `serve`'s MCP tools): one schema and one dispatcher for both.

use super::{FileError, Files};
use crate::supervisor::{Capability, CapabilityError};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Name, description and JSON schema of each file tool; the write tools only
/// when there is a workspace.
pub fn specs(files: &Files) -> Vec<(&'static str, &'static str, Value)> {
    let mut v = vec![
        (
            "read_file",
            "Read a text file under a declared root (optionally lines start_line..=end_line, 1-based). \
             Binary files are reported as such; long files are truncated at max_read_bytes.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "start_line": {"type": ["integer", "null"], "minimum": 1},
                "end_line": {"type": ["integer", "null"], "minimum": 1}},
              "required": ["path"], "additionalProperties": false}),
        ),
        (
            "list_dir",
            "List a directory under a declared root (.gitignore'd and hidden entries skipped); \
             with a glob, every entry beneath it whose relative path matches.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "default": "."},
                "glob": {"type": ["string", "null"]}},
              "additionalProperties": false}),
        ),
        (
            "search_files",
            "Search files under a declared root for a regex (ripgrep's engine; .gitignore'd, \
             hidden and binary files skipped); at most max_results matching lines.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "default": "."},
                "glob": {"type": ["string", "null"]},
                "max_results": {"type": "integer", "minimum": 1, "maximum": super::MAX_SEARCH_RESULTS}},
              "required": ["pattern"], "additionalProperties": false}),
        ),
    ];
    if files.has_workspace() {
        v.push((
            "write_file",
            "Create or replace a file in the workspace (parent directories are created).",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}},
              "required": ["path", "content"], "additionalProperties": false}),
        ));
        v.push((
            "edit_file",
            "Replace old_text, which must occur exactly once, with new_text in a workspace file.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "old_text": {"type": "string"},
                "new_text": {"type": "string"}},
              "required": ["path", "old_text", "new_text"], "additionalProperties": false}),
        ));
    }
    v
}

fn s<'a>(args: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str)
}

fn need<'a>(args: &'a Map<String, Value>, k: &str) -> Result<&'a str, FileError> {
    s(args, k).ok_or_else(|| FileError::Args(format!("{k:?} (a string) is required")))
}

/// Run the file tool `name` with `args` (already checked against its
/// schema by the caller, and checked again for the fields used here).
pub fn call(files: &Files, name: &str, args: &Map<String, Value>) -> Result<Value, FileError> {
    let u = |k: &str| args.get(k).and_then(Value::as_u64);
    match name {
        "read_file" => files.read_file(need(args, "path")?, u("start_line"), u("end_line")),
        "list_dir" => files.list_dir(s(args, "path").unwrap_or("."), s(args, "glob")),
        "search_files" => files.search_files(
            need(args, "pattern")?,
            s(args, "path").unwrap_or("."),
            s(args, "glob"),
            u("max_results").unwrap_or(100) as usize,
        ),
        "write_file" => files.write_file(need(args, "path")?, need(args, "content")?),
        "edit_file" => files.edit_file(
            need(args, "path")?,
            need(args, "old_text")?,
            need(args, "new_text")?,
        ),
        other => Err(FileError::Args(format!("unknown file tool {other:?}"))),
    }
}

/// Bytes a call of the file tool `name` may hold while it runs (its
/// buffers and its answer), charged to its tenant before it starts.
fn held_bound(files: &Files, name: &str) -> u64 {
    let cfg = &files.cfg;
    match name {
        // The bytes read, their text cut into lines, the answer.
        "read_file" => cfg.max_read_bytes.saturating_mul(3),
        "search_files" => super::walk::search_held_bytes(cfg.max_search_line_bytes),
        "list_dir" => (super::walk::MAX_LIST_BYTES as u64).saturating_mul(3),
        // The file read, edited and written back.
        "edit_file" => cfg.max_write_bytes.saturating_mul(3),
        _ => 64 << 10,
    }
}

/// The file tools as capabilities: each runs on a blocking thread, for the
/// call's tenant (its workspace; what it holds charged to it) and stops
/// early once its caller has gone (see [`CallContext::cancel`]).
///
/// [`CallContext::cancel`]: crate::supervisor::CallContext
pub fn capabilities(files: Arc<Files>) -> Result<Vec<Capability>, CapabilityError> {
    specs(&files)
        .into_iter()
        .map(|(name, desc, schema)| {
            let files = files.clone();
            Capability::new(name, desc, schema, move |ctx, args| {
                let files = files.clone();
                async move {
                    // Held until the blocking work is over, not merely
                    // until nobody waits for it.
                    let held = match &ctx.tenant {
                        Some(t) => Some(
                            crate::supervisor::tenant::Held::take(
                                t.ledger(),
                                held_bound(&files, name),
                                &format!("a {name} call"),
                            )
                            .map_err(|e| format!("limit_exceeded: {e}"))?,
                        ),
                        None => None,
                    };
                    let view = files
                        .scoped(ctx.tenant.as_ref(), Some(ctx.cancel.clone()))
                        .map_err(|e| error_text(&e))?;
                    tokio::task::spawn_blocking(move || {
                        let _held = held;
                        call(&view, name, &args)
                    })
                    .await
                    .map_err(|e| format!("{name} failed: {e}"))?
                    .map_err(|e| error_text(&e))
                }
            })
        })
        .collect()
}

/// The error with its causes, for a script or a client.
pub fn error_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
