//! `cellbox agent`: the CodeAct / recursive-language-model loop. The
//! model writes code blocks; each runs as a cell in one session (the
//! context lives there as the variable `context`, not in the prompt); a
//! compact result goes back as the next user message; the run stops at
//! `answer(...)` or at a budget (steps, tokens, consecutive errors, wall
//! time), each with its own event and exit code.

use crate::cli::usage;
use crate::exit::Exit;
use crate::models::{ModelClient, Query};
use crate::supervisor::RunInfo;
use crate::{CellRequest, CellResult, EventSink, Language, SessionConfig, Status, Supervisor};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Characters of a cell's stdout (and of its stderr) fed back to the model:
/// head and tail, with the count left out between them.
const FEEDBACK_CHARS: usize = 4000;

/// `cellbox agent [options] TASK`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The config file with the `[models.NAME]` tables, policy and limits.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// The model (a `[models.NAME]`); default: the default model.
    #[arg(long)]
    pub model: Option<String>,
    /// Language the model writes cells in: python or rhai.
    #[arg(long = "lang", default_value = "python")]
    pub lang: String,
    /// A file (or - for stdin) loaded into the variable `context` (several:
    /// a list of strings).
    #[arg(long = "context", value_name = "FILE")]
    pub context: Vec<String>,
    /// Model turns before the run stops unanswered.
    #[arg(long = "max-steps", default_value_t = 20)]
    pub max_steps: u32,
    /// Tokens (the loop's and the cells' model queries together).
    #[arg(long = "max-total-tokens", value_name = "N")]
    pub max_total_tokens: Option<u64>,
    /// Consecutive failing turns before the run stops.
    #[arg(long = "max-errors", default_value_t = 3)]
    pub max_errors: u32,
    /// Wall-clock limit of the whole run in seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print the whole trajectory as JSON instead of the answer.
    #[arg(long)]
    pub json: bool,
    /// Append the run's events (JSON lines) to this file.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Write the chat messages (JSON) to this file.
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<PathBuf>,
    /// Allow one more capability to the cells (repeatable).
    #[arg(long = "allow", value_name = "CAP")]
    pub allow: Vec<String>,
    /// Python interpreter for python cells.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// What the model is asked to do.
    pub task: String,
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Stop {
    Answered,
    BudgetExhausted { budget: String, detail: String },
    ModelError { message: String },
}

#[derive(Debug, Serialize)]
struct Turn {
    step: u32,
    reply: String,
    usage: crate::models::TokenUsage,
    cells: Vec<CellResult>,
}

#[derive(Debug, Serialize)]
struct Trajectory {
    task: String,
    model: String,
    stop: Stop,
    answer: Option<Value>,
    turns: Vec<Turn>,
    input_tokens: u64,
    output_tokens: u64,
    cost: f64,
    run: RunInfo,
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
         - answer(value): give the final answer and end the task.{queries}\n\
         Other capabilities allowed: {others}.\n\n\
         You have at most {steps} replies. Print what you need to see; call answer(...) as \
         soon as you know the answer.",
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

fn read_context(files: &[String]) -> Result<Value, String> {
    let mut parts = Vec::new();
    for f in files {
        let mut text = String::new();
        if f == "-" {
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("--context -: {e}"))?;
        } else {
            text = std::fs::read_to_string(f).map_err(|e| format!("--context {f}: {e}"))?;
        }
        parts.push(Value::String(text));
    }
    Ok(match parts.len() {
        0 => Value::Null,
        1 => parts.remove(0),
        _ => Value::Array(parts),
    })
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
    pub max_tokens: u64,
    pub deadline: Option<Instant>,
    pub progress: bool,
}

/// How a run of the loop went.
pub(crate) struct LoopOutcome {
    pub stop: Stop,
    pub answer: Option<Value>,
    turns: Vec<Turn>,
    pub messages: Vec<Value>,
    /// Tokens of the loop's own model queries (the session counts them
    /// with its cells').
    pub input: u64,
    pub output: u64,
}

/// Run the loop in `session` (boxed: a sub-agent runs it from a cell of
/// another run of it).
pub(crate) fn run_loop<'a>(
    session: &'a crate::Session,
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
        let stop = loop {
            // The session counts the loop's own queries (charged below)
            // with its cells'.
            let used = session.model_usage();
            let tokens = used.total_tokens();
            if step >= cfg.max_steps {
                break exhausted("max_steps", format!("{step} steps of {}", cfg.max_steps));
            }
            if tokens >= cfg.max_tokens {
                break exhausted(
                    "max_total_tokens",
                    format!("{tokens} tokens used of {}", cfg.max_tokens),
                );
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
            let q = Query {
                model: Some(cfg.model.clone()),
                messages: messages.clone(),
                max_tokens: Some(u32::try_from(cfg.max_tokens - tokens).unwrap_or(u32::MAX)),
                temperature: None,
            };
            let reply = match tokio::time::timeout(remaining, client.query(&q)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    break Stop::ModelError {
                        message: e.to_string(),
                    }
                }
                Err(_) => {
                    break exhausted("timeout", format!("{:?} of wall time", started.elapsed()))
                }
            };
            input += reply.usage.input_tokens;
            output += reply.usage.output_tokens;
            session.charge_model_use(
                1,
                reply.usage.input_tokens,
                reply.usage.output_tokens,
                reply.cost.unwrap_or(0.0),
            );
            events.record(
                "model_call",
                run,
                json!({"step": step, "model": reply.model, "usage": reply.usage,
                       "cost": reply.cost, "latency_ms": reply.ms}),
            );
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

/// Run `cellbox agent`.
pub async fn cli_main(args: AgentArgs) -> ExitCode {
    match run(args).await {
        Ok(code) => code,
        Err(e) => usage(e),
    }
}

async fn run(args: AgentArgs) -> Result<ExitCode, String> {
    let file = crate::serve::ServeConfig::load(&args.config).map_err(|e| e.to_string())?;
    crate::models::config::validate(&file.models)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    if file.models.is_empty() {
        return Err(format!(
            "{}: cellbox agent needs a model: add a [models.NAME] table",
            args.config.display()
        ));
    }
    let client = ModelClient::new(&file.models).map_err(|e| e.to_string())?;
    let (model, _) = client
        .config(args.model.as_deref())
        .map_err(|e| e.to_string())?;
    let model = model.to_owned();
    let lang: Language = args.lang.parse().map_err(|e: crate::Error| e.to_string())?;
    if lang == Language::Shell {
        return Err("--lang: give python or rhai".into());
    }
    let context = read_context(&args.context)?;
    let mut policy = file.policy.clone();
    for cap in ["answer", "model_query", "model_query_batched"] {
        policy.allow.insert(cap.to_owned());
    }
    for a in &args.allow {
        policy.allow.extend(
            a.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
    }
    if let Some(n) = args.max_total_tokens {
        policy.max_total_tokens = policy.max_total_tokens.min(n);
    }
    let max_tokens = policy.max_total_tokens;
    let events = match &args.events {
        Some(p) => EventSink::to_file(p)
            .map_err(|e| format!("failed to open the events file {}: {e}", p.display()))?,
        None => EventSink::default(),
    };
    let mut b = Supervisor::builder()
        .events(events.clone())
        .models(client.clone())
        .map_err(|e| e.to_string())?;
    if let Some(p) = args.python.as_ref().or(file.server.python.as_ref()) {
        b = b.python(p);
    }
    let sup = b.build().map_err(|e| e.to_string())?;
    let known: Vec<String> = sup.capabilities().map(|c| c.name().to_owned()).collect();
    let caps: Vec<String> = policy
        .allow
        .iter()
        .filter(|c| known.contains(c))
        .cloned()
        .collect();
    let session = sup
        .session(SessionConfig {
            policy,
            limits: file.limits.clone(),
            profile: None,
        })
        .map_err(|e| e.to_string())?;
    if !context.is_null() {
        session
            .set_var("context", context.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    let run = RunInfo::root();
    let deadline = args
        .timeout
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    let cfg = LoopConfig {
        task: args.task.clone(),
        model: model.clone(),
        lang,
        context,
        max_steps: args.max_steps,
        max_errors: args.max_errors,
        max_tokens,
        deadline,
        progress: std::io::stderr().is_terminal() && !args.json,
    };
    let LoopOutcome {
        stop,
        answer,
        turns,
        messages,
        input,
        output,
        ..
    } = run_loop(&session, &client, &events, &run, &caps, cfg).await;
    if let Some(p) = &args.transcript {
        let text = serde_json::to_string_pretty(&messages).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("--transcript {}: {e}", p.display()))?;
    }
    let code = match &stop {
        Stop::Answered => Exit::Ok,
        Stop::BudgetExhausted { .. } => Exit::Limit,
        Stop::ModelError { .. } => Exit::Failed,
    };
    // The session's cost counts the loop's own queries and its cells'.
    let total_cost = session.model_usage().cost;
    if args.json {
        let t = Trajectory {
            task: args.task,
            model,
            stop,
            answer,
            turns,
            input_tokens: input,
            output_tokens: output,
            cost: total_cost,
            run,
        };
        let s = serde_json::to_string(&t).map_err(|e| e.to_string())?;
        println!("{s}");
    } else {
        match (&answer, &stop) {
            (Some(Value::String(s)), _) => println!("{s}"),
            (Some(v), _) => println!("{v}"),
            (None, Stop::BudgetExhausted { budget, detail }) => {
                eprintln!("cellbox agent: stopped unanswered: budget {budget} exhausted ({detail})")
            }
            (None, Stop::ModelError { message }) => eprintln!("cellbox agent: {message}"),
            (None, Stop::Answered) => {}
        }
        let _ = std::io::stdout().flush();
    }
    Ok(ExitCode::from(code.code()))
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
