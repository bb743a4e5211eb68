//! The CodeAct / recursive-language-model loop, run in a session: the
//! model writes code blocks; each runs as a cell (the context lives in the
//! session as the variable `context`, not in the prompt); a compact result
//! goes back as the next user message; the run stops at `answer(...)` or at
//! a budget (steps, tokens, consecutive errors, wall time). `cellbox agent`
//! runs it from the command line; `agent_query` runs it for a sub-agent.

use crate::models::ModelClient;
use crate::supervisor::policy::{BudgetError, Metered};
use crate::supervisor::spend;
use crate::supervisor::{CellRequest, CellResult, EventSink, Language, RunInfo, Session, Status};
use serde::Serialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Characters of a cell's stdout (and of its stderr) fed back to the model:
/// head and tail, with the count left out between them.
const FEEDBACK_CHARS: usize = 4000;

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Stop {
    Answered,
    BudgetExhausted { budget: String, detail: String },
    ModelError { message: String },
}

#[derive(Debug, Serialize)]
pub(crate) struct Turn {
    pub step: u32,
    pub reply: String,
    pub usage: crate::models::TokenUsage,
    pub cells: Vec<CellResult>,
    /// The code of each cell run (in `cells`' order).
    #[serde(skip)]
    pub code: Vec<String>,
    /// The messages sent with this turn's query: the first `prompt_len`.
    #[serde(skip)]
    pub prompt_len: usize,
    /// Wall time of the turn (its query and its cells).
    #[serde(skip)]
    pub ms: u64,
    /// The best-effort question asked at a budget's end (no code ran).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub best_effort: bool,
}

/// The fenced code blocks of a reply that the session runs: ```python,
/// ```rhai and ```repl (the session's language), in order.
pub fn code_blocks(reply: &str, default: Language) -> Vec<(Language, String)> {
    let mut out = Vec::new();
    let mut lines = reply.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let lang = match tag.trim().to_ascii_lowercase().as_str() {
            "python" | "py" => Some(Language::Python),
            "rhai" => Some(Language::Rhai),
            "repl" => Some(default),
            _ => None,
        };
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push(l);
        }
        if let Some(lang) = lang {
            out.push((lang, body.join("\n")));
        }
    }
    out
}

fn head_tail(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_owned();
    }
    let head: String = s.chars().take(max / 2).collect();
    let tail: String = s.chars().skip(n - max / 2).collect();
    format!(
        "{head}\n... [{} characters left out] ...\n{tail}",
        n - 2 * (max / 2)
    )
}

/// What the model reads of a cell's run.
fn feedback(i: usize, r: &CellResult) -> String {
    let mut out = format!("[cell {} {}: {}]\n", i + 1, r.language, r.status);
    if !r.stdout.is_empty() {
        out += &format!("stdout:\n{}\n", head_tail(&r.stdout, FEEDBACK_CHARS));
    }
    if !r.stderr.is_empty() {
        out += &format!("stderr:\n{}\n", head_tail(&r.stderr, FEEDBACK_CHARS));
    }
    if let Some(e) = &r.error {
        out += &format!("error: {}: {}\n", e.kind, e.message);
        if let Some(tb) = &e.traceback {
            out += &format!("traceback:\n{}\n", head_tail(tb, FEEDBACK_CHARS));
        }
    } else if !r.value.is_null() {
        out += &format!(
            "value: {}\n",
            head_tail(&r.value.to_string(), FEEDBACK_CHARS)
        );
    }
    if !r.vars.changed.is_empty() {
        out += &format!("variables changed: {}\n", r.vars.changed.join(", "));
    }
    out
}

/// The system prompt: what this session may actually call.
fn system_prompt(lang: Language, context: &Value, caps: &[String], steps: u32) -> String {
    let ctx = match context {
        Value::Null => "There is no `context` variable.".to_owned(),
        Value::String(s) => format!(
            "The variable `context` holds a str of {} characters. It is not in this prompt: \
             read it with code.",
            s.chars().count()
        ),
        Value::Array(a) => format!(
            "The variable `context` holds a list of {} strs (one per file). It is not in this \
             prompt: read it with code.",
            a.len()
        ),
        other => format!("The variable `context` holds a {}.", other),
    };
    let queries = if caps.iter().any(|c| c == "model_query") {
        match lang {
            Language::Python => {
                "\n- llm_query(prompt, model=None, max_tokens=None, temperature=None) -> str \
                 (alias model_query): ask a language model; use it on pieces of the context.\n\
                 - llm_query_batched(prompts) -> list of str (alias model_query_batched): \
                 several at once, replies in order."
            }
            _ => {
                "\n- model_query(prompt) -> string: ask a language model.\n\
                 - model_query_batched(prompts) -> array of strings."
            }
        }
    } else {
        ""
    };
    format!(
        "You solve a task by writing {lang} code that cellbox runs in a sandboxed session \
         (no network; variables persist between cells). Reply with one or more fenced code \
         blocks (```{lang}); each runs as a cell, and you then see its output, value and any \
         error. {ctx}\n\nFunctions you may call:\n\
         - answer(value): give the final answer and end the task.{answer_dict}{queries}\n\
         Other capabilities allowed: {others}.\n\n\
         You have at most {steps} replies. Print what you need to see; call answer(...) as \
         soon as you know the answer.",
        answer_dict = if lang == Language::Python {
            " Or set answer[\"content\"] = ... and answer[\"ready\"] = True, or call \
             FINAL_VAR(\"variable_name\")."
        } else {
            ""
        },
        others = {
            let o: Vec<&str> = caps
                .iter()
                .map(String::as_str)
                .filter(|c| !["answer", "model_query", "model_query_batched"].contains(c))
                .collect();
            if o.is_empty() {
                "none".to_owned()
            } else {
                o.join(", ")
            }
        }
    )
}

/// The budget a refusal names, and what it says of it.
fn budget_parts(e: &BudgetError) -> (String, String) {
    match e {
        BudgetError::Exhausted { budget, detail } => ((*budget).to_owned(), detail.clone()),
        BudgetError::Total { .. } => ("max_calls".to_owned(), e.to_string()),
        BudgetError::PerCapability { .. } => ("max_calls_per_capability".to_owned(), e.to_string()),
    }
}

/// Characters of one prompt or reply text kept in a record (a run event, a
/// model call's record in a cell's result, a trajectory): head and tail,
/// with the count left out between them.
pub const RECORD_TEXT_CHARS: usize = 8192;

/// A prompt or reply text as records keep it (capped at
/// [`RECORD_TEXT_CHARS`]).
pub(crate) fn record_text(s: &str) -> String {
    head_tail(s, RECORD_TEXT_CHARS)
}

/// Chat messages as records keep them: a lone user message as its text,
/// else the messages with each content capped.
pub(crate) fn record_prompt(messages: &[Value]) -> Value {
    if let [only] = messages {
        if only["role"] == "user" {
            if let Some(text) = only["content"].as_str() {
                return Value::String(record_text(text));
            }
        }
    }
    capped_messages(messages)
}

/// Chat messages with each content capped at [`RECORD_TEXT_CHARS`].
pub(crate) fn capped_messages(messages: &[Value]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if let Some(text) = m["content"].as_str() {
                    m["content"] = Value::String(record_text(text));
                }
                m
            })
            .collect(),
    )
}

/// What the model is told when a budget ends the run: it answers once more,
/// without code, with its best answer.
fn best_effort_prompt(budget: &str, detail: &str) -> String {
    format!(
        "The run's budget {budget} is spent ({detail}). No more code will run. Reply now \
         with your best final answer to the task, as plain text, from what you have found."
    )
}

/// How long the best-effort question may take when the run's own deadline
/// has passed (it is asked after a `--timeout` too).
const BEST_EFFORT_GRACE: Duration = Duration::from_secs(30);

/// One run of the loop.
pub(crate) struct LoopConfig {
    pub task: String,
    pub model: String,
    pub lang: Language,
    /// Already in the session as `context` (for the prompt's description).
    pub context: Value,
    pub max_steps: u32,
    pub max_errors: u32,
    pub deadline: Option<Instant>,
    pub progress: bool,
    /// At a budget's end, ask the model once for its best answer (within
    /// the same budgets: a spent token or cost budget may refuse it).
    pub best_effort: bool,
}

/// How a run of the loop went.
pub(crate) struct LoopOutcome {
    pub stop: Stop,
    /// The answer: given with `answer(...)` (final), or, after a budget
    /// ended the run, the model's best-effort reply (not final).
    pub answer: Option<Value>,
    pub turns: Vec<Turn>,
    pub messages: Vec<Value>,
    /// Tokens and cost of the loop's own model queries (the session counts
    /// them with its cells' and its sub-agents').
    pub input: u64,
    pub output: u64,
    pub cost: f64,
    /// When the run started.
    pub started: std::time::SystemTime,
}

/// One model query of the loop, charged to `chain` and bounded by
/// `within`.
async fn ask(
    chain: &crate::supervisor::ledger::Chain,
    client: &ModelClient,
    model: &str,
    messages: &[Value],
    within: Duration,
) -> Result<(crate::models::ModelReply, spend::Settled), Stop> {
    let planned = spend::plan(
        chain,
        client,
        Some(model),
        vec![messages.to_vec()],
        None,
        None,
        Metered::Model,
        true,
    )
    .await;
    let (query, hold, estimate) = match planned.map(|mut v| v.pop()) {
        Ok(Some(p)) => (p.query, p.hold, p.estimate),
        Ok(None) => {
            return Err(Stop::ModelError {
                message: "no query was planned".into(),
            })
        }
        Err(spend::PlanError::Budget(e)) => {
            let (budget, detail) = budget_parts(&e);
            return Err(Stop::BudgetExhausted { budget, detail });
        }
        Err(spend::PlanError::Model(e)) => {
            return Err(Stop::ModelError {
                message: e.to_string(),
            })
        }
    };
    let config = match client.config(Some(model)) {
        Ok((_, c)) => c.clone(),
        Err(e) => {
            return Err(Stop::ModelError {
                message: e.to_string(),
            })
        }
    };
    let asked = tokio::time::timeout(within, client.query(&query))
        .await
        .map_err(|_| None)
        .and_then(|r| r.map_err(Some));
    let settled = spend::settle(hold, estimate, &config, &asked, |e| match e {
        Some(e) => spend::maybe_billed(e),
        None => Some("no answer came before the run's deadline".into()),
    });
    match asked {
        Ok(r) => Ok((r, settled)),
        Err(Some(e)) => Err(Stop::ModelError {
            message: e.to_string(),
        }),
        Err(None) => Err(Stop::BudgetExhausted {
            budget: "timeout".into(),
            detail: format!("no reply within {within:?}"),
        }),
    }
}

/// A loop query's event: its usage and charge, the messages sent since the
/// previous query and the reply (texts capped at [`RECORD_TEXT_CHARS`]).
fn call_record(
    step: u32,
    reply: &crate::models::ModelReply,
    settled: &spend::Settled,
    prompt: &[Value],
) -> Value {
    let mut record = json!({"step": step, "model": reply.model, "usage": reply.usage,
                            "cost": settled.charged.cost, "latency_ms": reply.ms,
                            "prompt": record_prompt(prompt), "reply": record_text(&reply.text)});
    if let (Some(o), Value::Object(more)) = (record.as_object_mut(), settled.detail()) {
        o.extend(more);
    }
    record
}

/// Run the loop in `session` (boxed: a sub-agent runs it from a cell of
/// another run of it).
pub(crate) fn run_loop<'a>(
    session: &'a Session,
    client: &'a ModelClient,
    events: &'a EventSink,
    run: &'a RunInfo,
    caps: &'a [String],
    cfg: LoopConfig,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = LoopOutcome> + Send + 'a>> {
    Box::pin(async move {
        let lang = cfg.lang;
        let system = system_prompt(lang, &cfg.context, caps, cfg.max_steps);
        events.record(
            "agent_start",
            run,
            json!({"task": record_text(&cfg.task), "model": cfg.model,
                   "language": lang.as_str(), "system": record_text(&system)}),
        );
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": cfg.task}),
        ];
        let started_at = std::time::SystemTime::now();
        let started = Instant::now();
        let (mut input, mut output, mut cost) = (0u64, 0u64, 0f64);
        let mut turns: Vec<Turn> = Vec::new();
        let mut errors = 0u32;
        let mut answer = None;
        let exhausted = |budget: &str, detail: String| Stop::BudgetExhausted {
            budget: budget.to_owned(),
            detail,
        };
        let mut step = 0;
        // Messages up to this index were sent with an earlier query.
        let mut sent = 0;
        // The loop's own turns are charged to the session (and its
        // account) like its cells' queries, held before each is sent.
        let chain = session.chain();
        let stop = loop {
            let used = session.model_usage();
            let tokens = used.total_tokens();
            if step >= cfg.max_steps {
                break exhausted("max_steps", format!("{step} steps of {}", cfg.max_steps));
            }
            if errors >= cfg.max_errors {
                break exhausted(
                    "max_errors",
                    format!("{errors} failing turns in a row of {}", cfg.max_errors),
                );
            }
            let remaining = match cfg.deadline {
                Some(d) if Instant::now() >= d => {
                    break exhausted("timeout", format!("{:?} of wall time", started.elapsed()))
                }
                Some(d) => d - Instant::now(),
                None => Duration::from_secs(86_400),
            };
            step += 1;
            if cfg.progress {
                eprint!(
                    "\rcellbox agent: step {step}/{}, {tokens} tokens, cost {:.4}   ",
                    cfg.max_steps, used.cost
                );
            }
            let turn_started = Instant::now();
            let prompt_len = messages.len();
            let (reply, settled) = match ask(&chain, client, &cfg.model, &messages, remaining).await
            {
                Ok(done) => done,
                Err(Stop::BudgetExhausted { budget, .. }) if budget == "timeout" => {
                    break exhausted("timeout", format!("{:?} of wall time", started.elapsed()))
                }
                Err(stop) => break stop,
            };
            input += settled.charged.input_tokens;
            output += settled.charged.output_tokens;
            cost += settled.charged.cost;
            events.record(
                "model_call",
                run,
                call_record(step, &reply, &settled, &messages[sent..]),
            );
            sent = messages.len() + 1;
            messages.push(json!({"role": "assistant", "content": reply.text}));
            let blocks = code_blocks(&reply.text, lang);
            let mut cells = Vec::new();
            let mut code = Vec::new();
            let mut fed = Vec::new();
            if blocks.is_empty() {
                errors += 1;
                fed.push(format!(
                    "Your reply had no ```{lang} code block. Write code, and call answer(...) \
                     with the final answer."
                ));
            }
            let mut failed = false;
            for (i, (l, block)) in blocks.into_iter().enumerate() {
                code.push(block.clone());
                let r = session.run(CellRequest::new(l, block)).await;
                events.record(
                    "agent_cell",
                    run,
                    json!({"step": step, "cell_run_id": r.run.run_id, "status": r.status}),
                );
                fed.push(feedback(i, &r));
                failed |= r.status != Status::Ok;
                let done = r.final_answer.clone();
                cells.push(r);
                if done.is_some() {
                    answer = done;
                    break;
                }
            }
            if !cells.is_empty() {
                errors = if failed { errors + 1 } else { 0 };
            }
            turns.push(Turn {
                step,
                reply: reply.text,
                usage: reply.usage,
                cells,
                code,
                prompt_len,
                ms: turn_started.elapsed().as_millis() as u64,
                best_effort: false,
            });
            if answer.is_some() {
                break Stop::Answered;
            }
            messages.push(json!({"role": "user", "content": fed.join("\n")}));
        };
        if cfg.progress {
            crate::report!();
        }
        // At a budget's end, one more question: the model's best answer
        // from what it has seen, marked not final.
        if let (Stop::BudgetExhausted { budget, detail }, true) = (&stop, cfg.best_effort) {
            // After the last turn's feedback (a user message) it joins
            // that message: roles keep alternating.
            let ask_for = best_effort_prompt(budget, detail);
            match messages.last_mut() {
                Some(m) if m["role"] == "user" && m["content"].is_string() => {
                    let fed = m["content"].as_str().unwrap_or_default();
                    m["content"] = Value::String(format!("{fed}\n{ask_for}"));
                }
                _ => messages.push(json!({"role": "user", "content": ask_for})),
            }
            let within = match cfg.deadline {
                Some(d) if d > Instant::now() => d - Instant::now(),
                Some(_) => BEST_EFFORT_GRACE,
                None => Duration::from_secs(86_400),
            };
            let turn_started = Instant::now();
            let prompt_len = messages.len();
            match ask(&chain, client, &cfg.model, &messages, within).await {
                Ok((reply, settled)) => {
                    input += settled.charged.input_tokens;
                    output += settled.charged.output_tokens;
                    cost += settled.charged.cost;
                    let mut record = call_record(step + 1, &reply, &settled, &messages[sent..]);
                    record["best_effort"] = json!(true);
                    events.record("model_call", run, record);
                    messages.push(json!({"role": "assistant", "content": reply.text}));
                    answer = Some(Value::String(reply.text.clone()));
                    turns.push(Turn {
                        step: step + 1,
                        reply: reply.text,
                        usage: reply.usage,
                        cells: Vec::new(),
                        code: Vec::new(),
                        prompt_len,
                        ms: turn_started.elapsed().as_millis() as u64,
                        best_effort: true,
                    });
                }
                Err(why) => events.record(
                    "best_effort_failed",
                    run,
                    json!({"why": serde_json::to_value(&why).unwrap_or(Value::Null)}),
                ),
            }
        }
        match &stop {
            Stop::Answered => events.record("agent_answer", run, json!({"answer": answer})),
            Stop::BudgetExhausted { budget, detail } => events.record(
                "budget_exhausted",
                run,
                json!({"budget": budget, "detail": detail,
                "best_effort_answer": answer.as_ref().map(|a| match a {
                    Value::String(s) => record_text(s),
                    other => record_text(&other.to_string()),
                })}),
            ),
            Stop::ModelError { message } => {
                events.record("model_error", run, json!({"message": message}))
            }
        }
        LoopOutcome {
            stop,
            answer,
            turns,
            messages,
            input,
            output,
            cost,
            started: started_at,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_the_blocks_the_session_runs() {
        let reply =
            "Let me look.\n```python\nprint(1)\n```\ntext\n```bash\nls\n```\n```repl\nx\n```";
        let b = code_blocks(reply, Language::Rhai);
        assert_eq!(
            b,
            vec![
                (Language::Python, "print(1)".to_owned()),
                (Language::Rhai, "x".to_owned())
            ]
        );
        assert!(code_blocks("no code", Language::Python).is_empty());
        assert_eq!(
            head_tail("abcdef", 4),
            "ab\n... [2 characters left out] ...\nef"
        );
    }
}
