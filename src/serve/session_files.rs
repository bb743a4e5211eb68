//! `upload_file`, `download_file` and `list_files`: files in and out of a
//! session's working (scratch) directory, where its cells run. The work is
//! done by [`crate::files::session`]; this module holds the tools' schemas,
//! arguments and results.

use crate::files::session::{Encoding, SessionDir, SessionFileError, SessionFileLimits};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The limits `serve` was configured with.
pub fn limits(settings: &super::config::Settings) -> SessionFileLimits {
    SessionFileLimits {
        max_upload_bytes: settings.max_upload_bytes,
        max_download_bytes: settings.max_download_bytes,
    }
}

/// The names of the tools.
pub const TOOLS: [&str; 3] = ["upload_file", "download_file", "list_files"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadArgs {
    pub session_id: String,
    pub path: String,
    pub content: String,
    #[serde(default = "utf8")]
    pub encoding: String,
}

fn utf8() -> String {
    "utf-8".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadArgs {
    pub session_id: String,
    pub path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    pub session_id: String,
    #[serde(default = "dot")]
    pub path: String,
}

fn dot() -> String {
    ".".into()
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

/// The three tools, described with their limits.
pub fn tools(limits: SessionFileLimits, long: bool) -> Vec<Tool> {
    let (id, path) = if long {
        (
            json!({"type": "string", "description": "The session's id (create_session)."}),
            json!({"type": "string", "description": "A path relative to the session's working directory: no '..', no absolute path, no symlink on the way."}),
        )
    } else {
        (json!({"type": "string"}), json!({"type": "string"}))
    };
    let annotations = ToolAnnotations::new().open_world(false);
    let output = schema(
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    );
    vec![
        Tool::new(
            "upload_file",
            if !long {
                format!(
                    "Write a file (a path relative to a session's working directory, content \
                     as encoding says) for its cells to read. At most {} bytes.",
                    limits.max_upload_bytes
                )
            } else {
                format!(
                "Write a file into a session's working directory, where its cells run: the next \
                 cell of the session reads it by its relative path (open(path)). Missing parent \
                 directories are made; an existing file is replaced. encoding \"utf-8\" (text, the \
                 default) or \"base64\" (binary). At most {} bytes.",
                limits.max_upload_bytes
            )
            },
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": id, "path": path,
                    "content": if long {
                        json!({"type": "string", "description": "The file's content, as encoding says."})
                    } else {
                        json!({"type": "string"})
                    },
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"}
                },
                "required": ["session_id", "path", "content"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(output.clone())
        .with_annotations(annotations.clone().read_only(false).idempotent(true)),
        Tool::new(
            "download_file",
            if !long {
                format!(
                    "Read a file (a relative path) from a session's working directory. At \
                     most {} bytes.",
                    limits.max_download_bytes
                )
            } else {
                format!(
                "Read a file from a session's working directory (one its cells wrote, for \
                 example): text as utf-8, anything else as base64. At most {} bytes.",
                limits.max_download_bytes
            )
            },
            schema(json!({
                "type": "object",
                "properties": {"session_id": id, "path": path},
                "required": ["session_id", "path"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(output.clone())
        .with_annotations(annotations.clone().read_only(true)),
        Tool::new(
            "list_files",
            if !long {
                "List a directory of a session's working directory."
            } else {
                "List a directory of a session's working directory (default \".\"): each entry's \
             name, type (file, directory, symlink, other) and size."
            },
            schema(json!({
                "type": "object",
                "properties": {"session_id": id, "path": path},
                "required": ["session_id"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(output)
        .with_annotations(annotations.read_only(true)),
    ]
}

fn error(e: SessionFileError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(e.to_string())])
}

fn ok(text: String, value: Value) -> CallToolResult {
    let mut r = CallToolResult::structured(value);
    r.content = vec![ContentBlock::text(text)];
    r.is_error = Some(false);
    r
}

/// Run one of [`TOOLS`] on the working directory `dir`.
pub fn call(
    name: &str,
    dir: &std::path::Path,
    limits: SessionFileLimits,
    args: JsonObject,
) -> Result<CallToolResult, String> {
    let parse_err = |e: serde_json::Error| format!("invalid arguments for {name}: {e}");
    let open = || SessionDir::open(dir, limits);
    Ok(match name {
        "upload_file" => {
            let a: UploadArgs = serde_json::from_value(Value::Object(args)).map_err(parse_err)?;
            match Encoding::parse(&a.encoding)
                .and_then(|enc| open()?.upload(&a.path, &a.content, enc))
            {
                Ok(v) => ok(
                    format!(
                        "Wrote {} bytes to {} in session {}.",
                        v["bytes"], v["path"], a.session_id
                    ),
                    v,
                ),
                Err(e) => error(e),
            }
        }
        "download_file" => {
            let a: DownloadArgs = serde_json::from_value(Value::Object(args)).map_err(parse_err)?;
            match open().and_then(|d| d.download(&a.path)) {
                Ok((shown, bytes)) => {
                    let size = bytes.len();
                    // Text as text unless its JSON (control characters
                    // take six bytes each) is longer than its base64: the
                    // result stays within the maximum a result may take
                    // (see `super::config::MAX_DOWNLOAD_BYTES`).
                    let b64_len = size.div_ceil(3) * 4;
                    let (encoding, content) = match String::from_utf8(bytes) {
                        Ok(text) if !text.contains('\0') && json_len(&text) <= b64_len + 2 => {
                            ("utf-8", text)
                        }
                        Ok(text) => ("base64", b64(text.as_bytes())),
                        Err(e) => ("base64", b64(e.as_bytes())),
                    };
                    // The text is shown in `content` too when both fit.
                    let shown_too = encoding == "utf-8"
                        && 2 * json_len(&content) + 4096 <= super::fit::MAX_RESULT_BYTES;
                    let text = if shown_too {
                        content.clone()
                    } else if encoding == "utf-8" {
                        format!("{shown}: {size} bytes of text (in structuredContent.content)")
                    } else {
                        format!("{shown}: {size} bytes of binary data (base64 in structuredContent.content)")
                    };
                    let v = json!({"path": shown, "bytes": size, "encoding": encoding, "content": content});
                    ok(text, v)
                }
                Err(e) => error(e),
            }
        }
        "list_files" => {
            let a: ListArgs = serde_json::from_value(Value::Object(args)).map_err(parse_err)?;
            match open().and_then(|d| d.list(&a.path)) {
                Ok(v) => {
                    let mut text = format!("{}:", v["path"].as_str().unwrap_or("."));
                    for e in v["entries"].as_array().into_iter().flatten() {
                        text.push_str(&format!(
                            "\n{} ({}{})",
                            e["name"].as_str().unwrap_or(""),
                            e["type"].as_str().unwrap_or(""),
                            e["size"]
                                .as_u64()
                                .map_or(String::new(), |s| format!(", {s} bytes"))
                        ));
                    }
                    ok(text, v)
                }
                Err(e) => error(e),
            }
        }
        other => return Err(format!("unknown tool {other:?}")),
    })
}

/// Bytes `s` takes as a JSON string.
fn json_len(s: &str) -> usize {
    serde_json::to_vec(s).map_or(usize::MAX, |b| b.len())
}

/// Bytes a call of the session file tool `name` may hold in the server
/// while it runs (its arguments, the file's bytes, its answer and that
/// answer's encodings), charged to its principal before it runs.
pub fn held_bound(name: &str, limits: SessionFileLimits) -> u64 {
    match name {
        "upload_file" => limits.max_upload_bytes.saturating_mul(3),
        "download_file" => limits.max_download_bytes.saturating_mul(6),
        _ => 4 << 20,
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
