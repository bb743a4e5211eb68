//! `cellbox agent --trajectory FILE`: a run written in rlms' log format, so
//! rlms' visualizer opens it. The file is JSON lines: a `metadata` line (the
//! run's model, depth and turn limits, and what cellbox adds to describe
//! the run in its `environment_kwargs`), then one `iteration` line per
//! model turn with the messages it was sent, its reply, each code block
//! with its cell's output and the model queries the cell made
//! (`rlm_calls`), and the final answer on the last. Texts are capped at
//! [`crate::supervisor::agent::RECORD_TEXT_CHARS`] each and the whole is
//! redacted as the operator's records are (docs/architecture.md §2).

use crate::supervisor::agent::{capped_messages, record_text, Stop, Turn};
use crate::supervisor::{CellResult, RunInfo};
use crate::Language;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

/// What the metadata line says of the run.
pub(crate) struct RunMeta<'a> {
    pub model: &'a str,
    pub lang: Language,
    pub max_depth: u32,
    pub max_iterations: u32,
    pub run: &'a RunInfo,
    pub stop: &'a Stop,
    /// False when the answer is the model's best effort at a budget's end.
    pub is_final: bool,
    pub started: SystemTime,
}

/// A timestamp as rlms writes one (`datetime.isoformat()`, here in UTC).
fn timestamp(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%S%.6f")
        .to_string()
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// rlms' usage summary of one call.
fn usage_summary(model: &str, calls: u64, input: u64, output: u64, cost: f64) -> Value {
    json!({
        "model_usage_summaries": {
            model: {
                "total_calls": calls,
                "total_input_tokens": input,
                "total_output_tokens": output,
                "total_cost": cost,
            }
        },
        "total_cost": cost,
    })
}

/// One model query's record (from its call record's detail) as rlms'
/// `RLMChatCompletion`.
fn completion(d: &Value) -> Value {
    let model = d["model"].as_str().unwrap_or("default");
    let u = |k: &str| d["usage"][k].as_u64().unwrap_or(0);
    let cost = d["cost"].as_f64().unwrap_or(0.0);
    json!({
        "root_model": model,
        "prompt": d["prompt"].clone(),
        "response": d["reply"].as_str().unwrap_or_default(),
        "usage_summary": usage_summary(model, 1, u("input_tokens"), u("output_tokens"), cost),
        "execution_time": d["latency_ms"].as_f64().unwrap_or(0.0) / 1000.0,
    })
}

/// A sub-agent's record as rlms' `RLMChatCompletion` (the whole sub-run's
/// usage; its own turns are in the events under its run id).
fn sub_agent(d: &Value, ms: u64) -> Value {
    let model = d["model"].as_str().unwrap_or("default");
    let u = |k: &str| d["usage"][k].as_u64().unwrap_or(0);
    let cost = d["usage"]["cost"].as_f64().unwrap_or(0.0);
    json!({
        "root_model": model,
        "prompt": d["task"].as_str().unwrap_or_default(),
        "response": d["answer"].as_str().unwrap_or_default(),
        "usage_summary": usage_summary(model, u("model_calls"), u("input_tokens"),
                                       u("output_tokens"), cost),
        "execution_time": Duration::from_millis(ms).as_secs_f64(),
    })
}

/// The model queries and sub-agents a cell made, as rlms' `rlm_calls`.
fn rlm_calls(cell: &CellResult) -> Vec<Value> {
    let mut out = Vec::new();
    for c in &cell.calls {
        let Some(d) = &c.detail else { continue };
        match c.cap.as_str() {
            "model_query" | "summarize" => out.push(completion(d)),
            "model_query_batched" => {
                out.extend(d.as_array().into_iter().flatten().map(completion));
            }
            "agent_query" => out.push(sub_agent(d, c.ms)),
            _ => {}
        }
    }
    out
}

fn code_block(code: &str, cell: &CellResult) -> Value {
    let mut stderr = cell.stderr.clone();
    if let Some(e) = &cell.error {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr += &format!("{}: {}", e.kind, e.message);
    }
    json!({
        "code": code,
        "result": {
            "stdout": record_text(&cell.stdout),
            "stderr": record_text(&stderr),
            "locals": {},
            "execution_time": Duration::from_millis(cell.usage.wall_ms).as_secs_f64(),
            "rlm_calls": rlm_calls(cell),
            "final_answer": cell.final_answer.as_ref().map(text_of),
        }
    })
}

/// The whole file: the metadata line and one line per turn, redacted.
pub(crate) fn rlm_log(
    meta: &RunMeta<'_>,
    turns: &[Turn],
    messages: &[Value],
    answer: Option<&Value>,
) -> String {
    let mut lines = Vec::with_capacity(turns.len() + 1);
    lines.push(json!({
        "type": "metadata",
        "timestamp": timestamp(meta.started),
        "root_model": meta.model,
        "max_depth": meta.max_depth,
        "max_iterations": meta.max_iterations,
        "backend": "cellbox",
        "backend_kwargs": {"model_name": meta.model},
        "environment_type": "cellbox",
        "environment_kwargs": {
            "language": meta.lang.as_str(),
            "run_id": meta.run.run_id,
            "stop": meta.stop,
            "answer_final": meta.is_final,
        },
        "other_backends": null,
    }));
    let mut at = meta.started;
    let last = turns.len().saturating_sub(1);
    for (i, t) in turns.iter().enumerate() {
        at += Duration::from_millis(t.ms);
        let blocks: Vec<Value> = t
            .code
            .iter()
            .zip(&t.cells)
            .map(|(code, cell)| code_block(code, cell))
            .collect();
        let prompt = &messages[..t.prompt_len.min(messages.len())];
        lines.push(json!({
            "type": "iteration",
            "iteration": i + 1,
            "timestamp": timestamp(at),
            "prompt": capped_messages(prompt),
            "response": record_text(&t.reply),
            "code_blocks": blocks,
            "final_answer": if i == last { answer.map(text_of) } else { None },
            "iteration_time": Duration::from_millis(t.ms).as_secs_f64(),
        }));
    }
    let mut out = String::new();
    for mut line in lines {
        crate::secrets::redact_record_value(&mut line);
        out += &line.to_string();
        out.push('\n');
    }
    out
}
