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
    step: u32,
    reply: String,
    usage: crate::models::TokenUsage,
    cells: Vec<CellResult>,
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
}

/// How a run of the loop went.
pub(crate) struct LoopOutcome {
    pub stop: Stop,
    pub answer: Option<Value>,
    pub turns: Vec<Turn>,
    pub messages: Vec<Value>,
    /// Tokens of the loop's own model queries (the session counts them
    /// with its cells').
    pub input: u64,
    pub output: u64,
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
        events.record(
            "agent_start",
            run,
            json!({"task": cfg.task, "model": cfg.model, "language": lang.as_str()}),
        );
        let mut messages = vec![
            json!({"role": "system",
                   "content": system_prompt(lang, &cfg.context, caps, cfg.max_steps)}),
            json!({"role": "user", "content": cfg.task}),
        ];
        let started = Instant::now();
        let (mut input, mut output) = (0u64, 0u64);
        let mut turns: Vec<Turn> = Vec::new();
        let mut errors = 0u32;
        let mut answer = None;
        let exhausted = |budget: &str, detail: String| Stop::BudgetExhausted {
            budget: budget.to_owned(),
            detail,
        };
        let mut step = 0;
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
            let planned = spend::plan(
                &chain,
                client,
                Some(&cfg.model),
                vec![messages.clone()],
                None,
                None,
                Metered::Model,
                true,
            )
            .await;
            let (query, hold, estimate) = match planned.map(|mut v| v.pop()) {
                Ok(Some(p)) => (p.query, p.hold, p.estimate),
                Ok(None) => {
                    break Stop::ModelError {
                        message: "no query was planned".into(),
                    }
                }
                Err(spend::PlanError::Budget(e)) => {
                    let (budget, detail) = budget_parts(&e);
                    break exhausted(&budget, detail);
                }
                Err(spend::PlanError::Model(e)) => {
                    break Stop::ModelError {
                        message: e.to_string(),
                    }
                }
            };
            let config = match client.config(Some(&cfg.model)) {
                Ok((_, c)) => c.clone(),
                Err(e) => {
                    break Stop::ModelError {
                        message: e.to_string(),
                    }
                }
            };
            let asked = tokio::time::timeout(remaining, client.query(&query))
                .await
                .map_err(|_| None)
                .and_then(|r| r.map_err(Some));
            let settled = spend::settle(hold, estimate, &config, &asked, |e| match e {
                Some(e) => spend::maybe_billed(e),
                None => Some("no answer came before the run's deadline".into()),
            });
            let reply = match asked {
                Ok(r) => r,
                Err(Some(e)) => {
                    break Stop::ModelError {
                        message: e.to_string(),
                    }
                }
                Err(None) => {
                    break exhausted("timeout", format!("{:?} of wall time", started.elapsed()))
                }
            };
            input += settled.charged.input_tokens;
            output += settled.charged.output_tokens;
            let mut record = json!({"step": step, "model": reply.model, "usage": reply.usage,
                                    "cost": settled.charged.cost, "latency_ms": reply.ms});
            if let (Some(o), Value::Object(more)) = (record.as_object_mut(), settled.detail()) {
                o.extend(more);
            }
            events.record("model_call", run, record);
            messages.push(json!({"role": "assistant", "content": reply.text}));
            let blocks = code_blocks(&reply.text, lang);
            let mut cells = Vec::new();
            let mut fed = Vec::new();
            if blocks.is_empty() {
                errors += 1;
                fed.push(format!(
                    "Your reply had no ```{lang} code block. Write code, and call answer(...) \
                     with the final answer."
                ));
            }
            let mut failed = false;
            for (i, (l, code)) in blocks.into_iter().enumerate() {
                let r = session.run(CellRequest::new(l, code)).await;
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
            });
            if answer.is_some() {
                break Stop::Answered;
            }
            messages.push(json!({"role": "user", "content": fed.join("\n")}));
        };
        if cfg.progress {
            eprintln!();
        }
        match &stop {
            Stop::Answered => events.record("agent_answer", run, json!({"answer": answer})),
            Stop::BudgetExhausted { budget, detail } => events.record(
                "budget_exhausted",
                run,
                json!({"budget": budget, "detail": detail}),
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
