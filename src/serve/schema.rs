//! JSON schemas of the MCP tools: what each takes, and what each returns as
//! `structuredContent`. The `execute_code` output schema is the
//! [`crate::CellResult`] shape of docs/architecture.md §7 ([`cell_result`], listed with
//! `--output-schema full`; by default its compact form,
//! [`cell_result_compact`], made from it); a test serializes real results
//! and validates them against both, so they cannot drift apart silently.

use crate::{Language, Status};
use serde_json::{json, Map, Value};

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `v`, an object schema, or null: the type widened to `["object",
/// "null"]` (its other keywords apply to objects alone), which says the
/// same as `anyOf` with a null schema in two nodes fewer.
fn nullable(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.get("type") == Some(&json!("object")) => {
            m.insert("type".into(), json!(["object", "null"]));
            Value::Object(m)
        }
        v => json!({"anyOf": [v, {"type": "null"}]}),
    }
}

/// The JSON Schema dialect every output schema declares.
///
/// Some clients check every result against its tool's output schema with a
/// one-shot validator, which first checks the schema itself against its
/// dialect's metaschema: the official Python SDK 1.x calls
/// `jsonschema.validate` on each `tools/call`. A schema that names no
/// dialect is checked as 2020-12 (MCP's default), whose metaschema costs
/// about five times as much per node as draft-07's; every keyword used here
/// means the same in both. Each node costs too, so repeated parts are
/// written once (`definitions`).
pub const DIALECT: &str = "http://json-schema.org/draft-07/schema#";

/// `tool` with its output schema (if any) declaring [`DIALECT`], unless it
/// names one already.
pub fn with_dialect(mut tool: rmcp::model::Tool) -> rmcp::model::Tool {
    if let Some(schema) = tool.output_schema.as_mut() {
        if !schema.contains_key("$schema") {
            std::sync::Arc::make_mut(schema).insert("$schema".into(), json!(DIALECT));
        }
    }
    tool
}

/// `execute_code` arguments. `languages` are the ones this server accepts.
pub fn execute_code_input(
    languages: &[Language],
    max_timeout_s: f64,
    max_output: usize,
    long: bool,
) -> Map<String, Value> {
    let langs: Vec<&str> = languages.iter().map(|l| l.as_str()).collect();
    if !long {
        return object(json!({
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": langs},
                "code": {"type": "string"},
                "session_id": {"type": "string"},
                "timeout_seconds": {"type": "number", "exclusiveMinimum": 0},
                "max_output_bytes": {"type": "integer", "minimum": 1},
                "verbose": {"type": "boolean", "default": false}
            },
            "required": ["language", "code"]
        }));
    }
    object(json!({
        "type": "object",
        "properties": {
            "language": {
                "type": "string",
                "enum": langs,
                "description": "Language of `code`."
            },
            "code": {
                "type": "string",
                "description": "The source to run."
            },
            "session_id": {
                "type": "string",
                "description": "Run in this session (from create_session) so variables, \
                                definitions and files carry over; omit for a fresh throwaway session."
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": format!(
                    "Wall-clock limit for this call; at most {max_timeout_s} s (larger values are lowered to it)."
                )
            },
            "max_output_bytes": {
                "type": "integer",
                "minimum": 1,
                "description": format!(
                    "Bytes of stdout and of stderr kept; at most {max_output} (larger values are lowered to it)."
                )
            },
            "verbose": {
                "type": "boolean",
                "default": false,
                "description": "Also return the sandbox report (layers, namespaces) and the run ids."
            }
        },
        "required": ["language", "code"],
        "additionalProperties": false
    }))
}

/// Arguments of `reset_session` and `close_session`.
pub fn session_id_input(long: bool) -> Map<String, Value> {
    if !long {
        return object(json!({
            "type": "object",
            "properties": {"session_id": {"type": "string"}},
            "required": ["session_id"]
        }));
    }
    object(json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string", "description": "The session's id."}
        },
        "required": ["session_id"],
        "additionalProperties": false
    }))
}

/// Arguments of `checkpoint_session` and `restore_session`.
pub fn checkpoint_input(long: bool) -> Map<String, Value> {
    if !long {
        return object(json!({
            "type": "object",
            "properties": {
                "session_id": {"type": "string"},
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
            },
            "required": ["session_id", "name"]
        }));
    }
    object(json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string", "description": "The session's id."},
            "name": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_.-]{1,64}$",
                "description": "The checkpoint's name (1 to 64 letters, digits, '_', '-' or '.')."
            }
        },
        "required": ["session_id", "name"],
        "additionalProperties": false
    }))
}

/// Arguments of `create_session` and `list_sessions` (none).
pub fn no_input() -> Map<String, Value> {
    object(json!({"type": "object", "properties": {}, "additionalProperties": false}))
}

/// The [`crate::CellResult`] shape. `run` and `sandbox` are optional: MCP
/// results carry them only when the call asks (`verbose`).
pub fn cell_result() -> Map<String, Value> {
    let count = json!({"type": "integer", "minimum": 0});
    let truncation_def = nullable(json!({
        "type": "object",
        "properties": {
            "total_bytes": count, "kept_head": count, "kept_tail": count
        },
        "required": ["total_bytes", "kept_head", "kept_tail"],
        "additionalProperties": false
    }));
    let truncation = json!({"$ref": "#/definitions/truncation"});
    let opt_int = json!({"type": ["integer", "null"]});
    let opt_str = json!({"type": ["string", "null"]});
    let model_usage_def = json!({
        "type": "object",
        "properties": {
            "model_calls": count, "agent_calls": count, "tool_calls": count,
            "input_tokens": count, "output_tokens": count,
            "cost": {"type": "number", "minimum": 0}
        },
        "required": ["model_calls", "agent_calls", "tool_calls", "input_tokens",
                     "output_tokens", "cost"],
        "additionalProperties": false
    });
    let model_usage = json!({"$ref": "#/definitions/model_usage"});
    object(json!({
        "$schema": DIALECT,
        "title": "CellResult",
        "definitions": {"truncation": truncation_def, "model_usage": model_usage_def},
        "description": "How one cell ended: output, last value, error, namespace changes, usage.",
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": Status::ALL.map(Status::as_str)},
            "execution_count": count,
            "language": {"type": "string"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "truncated": {
                "type": "object",
                "description": "What was kept of each part cut to fit: stdout and stderr past \
                                max_output_bytes; a value or answer too large to send is \
                                replaced by its JSON text, cut.",
                "properties": {
                    "stdout": truncation, "stderr": truncation,
                    "value": truncation, "final_answer": truncation,
                    "calls": {"type": "object",
                              "properties": {"total": count, "kept": count},
                              "required": ["total", "kept"],
                              "additionalProperties": false}
                },
                "required": ["stdout", "stderr"],
                "additionalProperties": false
            },
            "value": {"description": "The last expression's value as JSON, or null."},
            "value_repr": {
                "type": "string",
                "description": "Python cells: repr() of the value (absent when there is none)."
            },
            "error": nullable(json!({
                "type": "object",
                "description": "Why the cell did not succeed, or null.",
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "traceback": opt_str,
                    "line": opt_int,
                    "column": opt_int
                },
                "required": ["type", "message"],
                "additionalProperties": false
            })),
            "final_answer": {"description": "What the script passed to answer(...), or null."},
            "display": {
                "type": "array",
                "description": "Rich values the cell showed (matplotlib figures; _repr_png_, \
                                _repr_html_, _repr_markdown_ of the last value): each is the \
                                content block content_index (an image, or text).",
                "items": {
                    "type": "object",
                    "properties": {
                        "mime": {"type": "string"},
                        "data": {"type": "string"},
                        "bytes": count,
                        "content_index": count
                    },
                    "required": ["mime"],
                    "additionalProperties": false
                }
            },
            "display_dropped": {
                "type": "array",
                "description": "Display items left out, with the reason (a size limit).",
                "items": {
                    "type": "object",
                    "properties": {
                        "mime": {"type": "string"},
                        "bytes": count,
                        "reason": {"type": "string"}
                    },
                    "required": ["mime", "bytes", "reason"],
                    "additionalProperties": false
                }
            },
            "vars": {
                "type": "object",
                "description": "The session's variables the cell set or deleted, and those it \
                                set that could not be kept (no JSON form).",
                "properties": {
                    "changed": {"type": "array", "items": {"type": "string"}},
                    "deleted": {"type": "array", "items": {"type": "string"}},
                    "dropped": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "type": {"type": "string"},
                            "reason": {"type": "string"}
                        },
                        "required": ["name", "type", "reason"],
                        "additionalProperties": false
                    }}
                },
                "required": ["changed", "deleted", "dropped"],
                "additionalProperties": false
            },
            "calls": {"type": "array",
                      "description": "The capability calls the cell made, in order.",
                      "items": {
                "type": "object",
                "properties": {
                    "cap": {"type": "string"},
                    "outcome": {"type": "string"},
                    "message": {"type": "string"},
                    "run_id": {"type": "string"},
                    "depth": count,
                    "ms": count,
                    "detail": {
                        "type": "object",
                        "description": "A model query's record: model, usage, cost, attempts."
                    }
                },
                "required": ["cap", "outcome", "run_id", "depth", "ms"],
                "additionalProperties": false
            }},
            "usage": {
                "type": "object",
                "description": "What the cell used: wall-clock and CPU time, peak memory, \
                                capability calls.",
                "properties": {
                    "wall_ms": count, "cpu_ms": count, "max_rss_kb": count, "calls": count
                },
                "required": ["wall_ms", "cpu_ms", "max_rss_kb", "calls"],
                "additionalProperties": false
            },
            "models": {
                "type": "object",
                "description": "Model queries, sub-agents, tool calls, tokens and cost of \
                                this cell's run tree (cell) and of its session so far \
                                (session); absent when the cell made none.",
                "properties": {"cell": model_usage, "session": model_usage},
                "required": ["cell", "session"],
                "additionalProperties": false
            },
            "run": {
                "type": "object",
                "description": "This run's id, its parent's (null for a run no cell \
                                started) and its root's, how deep it is, and the id of \
                                the request that ran it (as the server's logs name it).",
                "properties": {
                    "run_id": {"type": "string"},
                    "parent_run_id": opt_str,
                    "root_run_id": {"type": "string"},
                    "depth": count,
                    "request_id": {"type": "string"}
                },
                "required": ["run_id", "parent_run_id", "root_run_id", "depth"],
                "additionalProperties": false
            },
            "sandbox": nullable(json!({
                "type": "object",
                "description": "The sandbox layers the worker actually got.",
                "properties": {
                    "profile": {"type": "string"},
                    "layers": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "applied": {"type": "boolean"},
                            "mode": {"type": "string"},
                            "detail": {"type": "string"}
                        },
                        "required": ["name", "applied"]
                    }},
                    "landlock_abi": opt_int,
                    "namespaces": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["profile", "layers"]
            })),
            "exit": {
                "type": "object",
                "description": "How the worker process ended: its exit code or signal.",
                "properties": {"code": opt_int, "signal": opt_int},
                "required": ["code", "signal"],
                "additionalProperties": false
            },
            "state": {
                "type": "string",
                "enum": ["kept", "rolled_back", "restored"],
                "description": "A Python cell of a live session: kept (the namespace is the one the cell left), rolled_back (the cell did not succeed: every object is as it was before it), restored (the cell asked for restore(name))."
            },
            "notes": {"type": "array", "items": {"type": "string"}, "description": "Things worth knowing about how the cell ran (threads that did not survive it, a live namespace that could not be used)."}
        },
        "required": [
            "status", "execution_count", "language", "stdout", "stderr", "truncated",
            "value", "error", "final_answer", "vars", "calls", "usage", "exit"
        ],
        "additionalProperties": false
    }))
}

/// `execute_code`'s output schema as listed by default ([`OutputSchema`]):
/// [`cell_result`] with every field of its top level kept as it is but
/// those with parts of their own (objects, lists, objects or null), which
/// keep their plain type (none when null is allowed too) and get the
/// shape of their parts written out in their description, made from the
/// full schema itself (`Shape: {total_bytes: integer >= 0, ...} or null`).
///
/// A client that checks results against it still checks every field's
/// presence and type, the status values and that nothing else is there;
/// what it no longer checks is inside the nested parts, which a model or a
/// reader still sees described. The full schema's nodes are what a client
/// checking it with a one-shot validator pays for on every call (about
/// 100 of them; 22 here): see [`DIALECT`].
///
/// [`OutputSchema`]: crate::serve::config::OutputSchema
pub fn cell_result_compact() -> Map<String, Value> {
    compact(cell_result())
}

/// `schema` (an object schema) with each property that has parts of its
/// own outlined (see [`cell_result_compact`]), and its `definitions` gone.
fn compact(mut schema: Map<String, Value>) -> Map<String, Value> {
    let defs = match schema.shift_remove("definitions") {
        Some(Value::Object(d)) => d,
        _ => Map::new(),
    };
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        for p in props.values_mut() {
            if has_parts(p, &defs) {
                *p = outlined(p, &defs);
            }
        }
    }
    schema
}

/// `s` itself, or the definition it refers to.
fn resolved<'a>(s: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/definitions/")
            .and_then(|name| defs.get(name))
            .unwrap_or(s),
        None => s,
    }
}

/// Whether `s` describes parts of its own (or allows more than one type).
fn has_parts(s: &Value, defs: &Map<String, Value>) -> bool {
    let s = resolved(s, defs);
    ["properties", "items", "anyOf"]
        .iter()
        .any(|k| s.get(k).is_some())
        || s.get("type").is_some_and(Value::is_array)
}

/// The compact form of the property schema `s`: its type when that is one
/// type, and its description followed by its shape.
fn outlined(s: &Value, defs: &Map<String, Value>) -> Value {
    let s = resolved(s, defs);
    let mut out = Map::new();
    if let Some(t @ Value::String(_)) = s.get("type") {
        out.insert("type".into(), t.clone());
    }
    let shape = format!("Shape: {}.", outline(s, defs));
    let description = match s.get("description").and_then(Value::as_str) {
        Some(d) => format!("{d} {shape}"),
        None => shape,
    };
    out.insert("description".into(), Value::String(description));
    Value::Object(out)
}

/// The shape `s` describes, written out: `{name: string, line?: integer or
/// null}`, `[string]`, `"a" | "b"`; `?` marks a member that may be absent.
fn outline(s: &Value, defs: &Map<String, Value>) -> String {
    let s = resolved(s, defs);
    if let Some(Value::Array(values)) = s.get("enum") {
        let values: Vec<String> = values.iter().map(Value::to_string).collect();
        return values.join(" | ");
    }
    if let Some(Value::Array(any)) = s.get("anyOf") {
        let each: Vec<String> = any.iter().map(|a| outline(a, defs)).collect();
        return each.join(" or ");
    }
    match s.get("type") {
        Some(Value::String(t)) => outline_of_type(t, s, defs),
        Some(Value::Array(types)) => {
            let each: Vec<String> = types
                .iter()
                .filter_map(Value::as_str)
                .map(|t| outline_of_type(t, s, defs))
                .collect();
            each.join(" or ")
        }
        _ => "any JSON value".into(),
    }
}

/// The shape of `s` taken as of type `t`.
fn outline_of_type(t: &str, s: &Value, defs: &Map<String, Value>) -> String {
    match t {
        "object" => match s.get("properties").and_then(Value::as_object) {
            Some(props) => {
                let required: Vec<&str> = s
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let members: Vec<String> = props
                    .iter()
                    .map(|(name, p)| {
                        let mark = if required.contains(&name.as_str()) {
                            ""
                        } else {
                            "?"
                        };
                        format!("{name}{mark}: {}", outline(p, defs))
                    })
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
            None => "object".into(),
        },
        "array" => match s.get("items") {
            Some(items) => format!("[{}]", outline(items, defs)),
            None => "array".into(),
        },
        "integer" if s.get("minimum") == Some(&json!(0)) => "integer >= 0".into(),
        t => t.to_owned(),
    }
}

/// `create_session` result.
pub fn created_session() -> Map<String, Value> {
    object(json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string"},
            "idle_expiry_seconds": {"type": "integer", "minimum": 1},
            "sessions_open": {"type": "integer", "minimum": 1},
            "max_sessions": {"type": "integer", "minimum": 1}
        },
        "required": ["session_id", "idle_expiry_seconds", "sessions_open", "max_sessions"],
        "additionalProperties": false
    }))
}

/// `reset_session` / `close_session` result.
pub fn session_done() -> Map<String, Value> {
    object(json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string"},
            "done": {"type": "string", "enum": ["reset", "closed", "checkpointed", "restored"]},
            "name": {"type": "string", "description": "The checkpoint, for checkpointed and restored."}
        },
        "required": ["session_id", "done"],
        "additionalProperties": false
    }))
}

/// `list_sessions` result.
pub fn session_list() -> Map<String, Value> {
    let count = json!({"type": "integer", "minimum": 0});
    object(json!({
        "type": "object",
        "properties": {
            "sessions": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "session_id": {"type": "string"},
                    "created_unix_ms": count,
                    "idle_seconds": count,
                    "expires_in_seconds": count,
                    "busy": {"type": "boolean"},
                    "execution_count": count,
                    "variables": {"type": "array", "items": {"type": "string"}},
                    "live": {"type": "boolean",
                             "description": "its Python namespace is alive (every object kept)"},
                    "checkpoints": {"type": "array", "items": {"type": "string"}},
                    "memory_bytes": {"type": ["integer", "null"], "minimum": 0,
                                     "description": "memory it holds now (processes, live namespace, checkpoints, files)"},
                    "held_bytes": {"type": "integer", "minimum": 0,
                                   "description": "bytes the server holds for it in its own memory (namespace mirror, definitions, history, checkpoints' copies)"},
                    "max_held_bytes": {"type": "integer", "minimum": 0,
                                       "description": "the most it may hold (sessions.max_held_bytes)"}
                },
                "required": ["session_id", "created_unix_ms", "idle_seconds",
                             "expires_in_seconds", "busy", "execution_count", "variables",
                             "live", "checkpoints", "memory_bytes", "held_bytes",
                             "max_held_bytes"],
                "additionalProperties": false
            }},
            "max_sessions": {"type": "integer", "minimum": 1,
                             "description": "sessions this client may hold at once"},
            "idle_expiry_seconds": {"type": "integer", "minimum": 1}
        },
        "required": ["sessions", "max_sessions", "idle_expiry_seconds"],
        "additionalProperties": false
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DroppedVar, ScriptError};
    use crate::sandbox::SandboxReport;
    use crate::{CallRecord, CellResult, RunInfo, Truncation};

    #[test]
    fn the_status_enum_lists_every_status() {
        let schema = Value::Object(cell_result());
        let listed = &schema["properties"]["status"]["enum"];
        let want: Vec<Value> = Status::ALL
            .iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .collect();
        // The names themselves are pinned by `Status`'s own test.
        assert_eq!(listed, &Value::Array(want));
    }

    fn validate(schema: Map<String, Value>, v: &Value) -> Vec<String> {
        let schema = Value::Object(schema);
        let validator = jsonschema::validator_for(&schema).unwrap();
        validator.iter_errors(v).map(|e| e.to_string()).collect()
    }

    #[test]
    fn schemas_are_valid_json_schema() {
        for s in [
            execute_code_input(&[Language::Rhai], 30.0, 100, true),
            execute_code_input(&[Language::Rhai], 30.0, 100, false),
            session_id_input(true),
            session_id_input(false),
            checkpoint_input(true),
            checkpoint_input(false),
            no_input(),
            cell_result(),
            cell_result_compact(),
            created_session(),
            session_done(),
            session_list(),
        ] {
            jsonschema::validator_for(&Value::Object(s)).unwrap();
        }
    }

    fn cellbox_calls_truncation() -> crate::CallsTruncation {
        crate::CallsTruncation {
            total: 1500,
            kept: 1000,
        }
    }

    #[test]
    fn full_and_empty_results_validate() {
        let run = RunInfo::root();
        let empty = CellResult::new("rhai", run.clone());
        let errs = validate(cell_result(), &serde_json::to_value(&empty).unwrap());
        assert!(errs.is_empty(), "{errs:?}");

        let mut full = CellResult::new("python", run.clone());
        full.status = Status::Error;
        full.truncated.stdout = Some(Truncation {
            total_bytes: 10,
            kept_head: 2,
            kept_tail: 2,
        });
        full.truncated.calls = Some(cellbox_calls_truncation());
        full.value = json!({"a": [1, 2]});
        full.error = Some(ScriptError {
            kind: "ValueError".into(),
            message: "bad".into(),
            traceback: Some("Traceback ...".into()),
            line: Some(3),
            column: None,
        });
        full.final_answer = Some(json!(42));
        full.vars.changed = vec!["x".into()];
        full.vars.dropped = vec![DroppedVar {
            name: "f".into(),
            type_name: "file".into(),
            reason: "no JSON form".into(),
        }];
        full.calls = vec![
            CallRecord {
                cap: "emit".into(),
                outcome: "denied".into(),
                message: Some("not allowed".into()),
                run_id: run.run_id.clone(),
                depth: 0,
                ms: 1,
                detail: None,
            },
            CallRecord {
                cap: "model_query".into(),
                outcome: "ok".into(),
                message: None,
                run_id: run.run_id.clone(),
                depth: 0,
                ms: 1,
                detail: Some(json!({"model": "m", "usage": {"input_tokens": 1}})),
            },
        ];
        // Every field a result can carry is in the schema: the optional
        // ones set too (a new field of a part shows up here).
        full.models = Some(crate::ModelUsageReport::default());
        full.value_repr = Some("{'a': [1, 2]}".into());
        full.state = Some(crate::StateOutcome::Kept);
        full.notes = vec!["a note".into()];
        full.display_dropped = vec![serde_json::from_value(
            json!({"mime": "image/png", "bytes": 1, "reason": "too large"}),
        )
        .unwrap()];
        let sandbox: SandboxReport = serde_json::from_value(json!({
            "profile": "python",
            "layers": [{"name": "hygiene", "applied": true, "detail": ""}],
            "landlock_abi": 7,
            "namespaces": ["net"]
        }))
        .unwrap();
        full.sandbox = Some(sandbox);
        full.exit.signal = Some(9);
        let v = serde_json::to_value(&full).unwrap();
        let errs = validate(cell_result(), &v);
        assert!(errs.is_empty(), "{errs:?}");
        for r in [&v, &serde_json::to_value(&empty).unwrap()] {
            let errs = validate(cell_result_compact(), r);
            assert!(errs.is_empty(), "compact: {errs:?}");
        }
        // The compact schema still holds the top level to its shape.
        for (part, wrong) in [
            ("/status", json!("fine")),
            ("/surprise", json!(1)),
            ("/usage", json!("fast")),
            ("/calls", json!({})),
            ("/execution_count", json!("one")),
            ("/state", json!("lost")),
        ] {
            let mut bad = v.clone();
            set(&mut bad, part, wrong.clone());
            assert!(
                !validate(cell_result_compact(), &bad).is_empty(),
                "compact: {part} = {wrong} passed"
            );
        }
        let mut bad = v.clone();
        bad.as_object_mut().unwrap().remove("exit");
        assert!(!validate(cell_result_compact(), &bad).is_empty());

        let mut bad = v.clone();
        bad["status"] = json!("fine");
        assert!(!validate(cell_result(), &bad).is_empty());
        let mut bad = v.clone();
        bad["surprise"] = json!(1);
        assert!(!validate(cell_result(), &bad).is_empty());

        // The parts written once and referred to, and the nullable objects
        // written as a widened type, still hold each value to its shape.
        for (part, wrong) in [
            (
                "/truncated/stdout",
                json!({"total_bytes": -1, "kept_head": 0, "kept_tail": 0}),
            ),
            ("/truncated/final_answer", json!({"total_bytes": 1})),
            ("/truncated/value", json!("cut")),
            ("/error", json!({"type": "E"})),
            ("/error", json!("boom")),
            ("/sandbox", json!({"layers": []})),
        ] {
            let mut bad = v.clone();
            set(&mut bad, part, wrong.clone());
            assert!(
                !validate(cell_result(), &bad).is_empty(),
                "{part} = {wrong} passed"
            );
        }
        for part in [
            "/truncated/stdout",
            "/truncated/value",
            "/error",
            "/sandbox",
        ] {
            let mut ok = v.clone();
            set(&mut ok, part, Value::Null);
            let errs = validate(cell_result(), &ok);
            assert!(errs.is_empty(), "{part} = null: {errs:?}");
        }
    }

    /// Every object member name in `s`'s properties, at any depth.
    fn member_names(s: &Value, defs: &Map<String, Value>, out: &mut Vec<String>) {
        let s = resolved(s, defs);
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (name, p) in props {
                out.push(name.clone());
                member_names(p, defs, out);
            }
        }
        if let Some(items) = s.get("items") {
            member_names(items, defs, out);
        }
    }

    #[test]
    fn the_compact_schema_keeps_the_top_level_and_writes_out_the_parts() {
        let full = cell_result();
        let compact = cell_result_compact();
        let defs = full["definitions"].as_object().unwrap().clone();
        // The top level as it was: its keywords, every field, what is
        // required, nothing else allowed.
        for k in [
            "$schema",
            "title",
            "description",
            "type",
            "required",
            "additionalProperties",
        ] {
            assert_eq!(compact[k], full[k], "{k}");
        }
        assert!(compact.get("definitions").is_none());
        let fp = full["properties"].as_object().unwrap();
        let cp = compact["properties"].as_object().unwrap();
        assert_eq!(fp.keys().collect::<Vec<_>>(), cp.keys().collect::<Vec<_>>());
        let text = serde_json::to_string(&compact).unwrap();
        assert!(!text.contains("$ref"), "{text}");
        let mut outlined = 0;
        for (name, f) in fp {
            let c = &cp[name];
            if !has_parts(f, &defs) {
                assert_eq!(c, f, "{name} is kept as it is");
                continue;
            }
            outlined += 1;
            // A plain type is kept; an object that may be null gets none.
            assert_eq!(
                c.get("type"),
                f.get("type").filter(|t| t.is_string()),
                "{name}"
            );
            let d = c["description"].as_str().unwrap();
            if let Some(own) = f.get("description").and_then(Value::as_str) {
                assert!(d.starts_with(own), "{name}: {d}");
            }
            // Every member of its parts is named in its shape.
            let mut names = Vec::new();
            member_names(f, &defs, &mut names);
            for n in names {
                let named = d.contains(&format!("{n}: ")) || d.contains(&format!("{n}?: "));
                assert!(named, "{name}: {n} not in {d}");
            }
            assert!(c.as_object().unwrap().len() <= 2, "{name}: {c}");
        }
        assert!(outlined >= 8, "{outlined}");
        let shape = |name: &str| cp[name]["description"].as_str().unwrap().to_owned();
        assert!(
            shape("error").ends_with(
                "Shape: {type: string, message: string, traceback?: string or null, \
             line?: integer or null, column?: integer or null} or null."
            ),
            "{}",
            shape("error")
        );
        let t =
            "{total_bytes: integer >= 0, kept_head: integer >= 0, kept_tail: integer >= 0} or null";
        assert!(
            shape("truncated").contains(&format!(
                "Shape: {{stdout: {t}, stderr: {t}, value?: {t}, final_answer?: {t}, \
             calls?: {{total: integer >= 0, kept: integer >= 0}}}}."
            )),
            "{}",
            shape("truncated")
        );
        assert!(shape("vars").contains("{changed: [string], deleted: [string], dropped: [{name: string, type: string, reason: string}]}"), "{}", shape("vars"));
        // Few nodes: what a one-shot validator checks against the
        // metaschema on every call.
        fn nodes(v: &Value) -> usize {
            match v {
                Value::Object(m) => 1 + m.values().map(nodes).sum::<usize>(),
                Value::Array(a) => a.iter().map(nodes).sum(),
                _ => 0,
            }
        }
        let (c, f) = (nodes(&Value::Object(compact)), nodes(&Value::Object(full)));
        assert!(c * 3 < f, "compact {c} nodes, full {f}");
    }

    /// `v` with the member at `pointer` (its parent an object) set to `to`.
    fn set(v: &mut Value, pointer: &str, to: Value) {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        v.pointer_mut(parent).unwrap()[key] = to;
    }

    #[test]
    fn every_output_schema_names_a_dialect_and_a_named_one_is_kept() {
        let tool = |output: Map<String, Value>| {
            rmcp::model::Tool::new("t", "d", no_input())
                .with_raw_output_schema(std::sync::Arc::new(output))
        };
        for s in [created_session(), session_done(), session_list()] {
            let t = with_dialect(tool(s));
            let schema = t.output_schema.unwrap();
            assert_eq!(schema["$schema"], json!(DIALECT));
            jsonschema::validator_for(&Value::Object((*schema).clone())).unwrap();
        }
        // One that names a dialect keeps it; a tool without an output
        // schema gets none.
        let mut other = created_session();
        other.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        let kept = with_dialect(tool(other)).output_schema.unwrap();
        assert_eq!(
            kept["$schema"],
            json!("https://json-schema.org/draft/2020-12/schema")
        );
        assert_eq!(cell_result()["$schema"], json!(DIALECT));
        let bare = with_dialect(rmcp::model::Tool::new("t", "d", no_input()));
        assert!(bare.output_schema.is_none());
    }
}
