//! `cellbox agent`: the command that runs the CodeAct / RLM loop
//! ([`crate::supervisor::agent`]) from a task, context files and a config
//! file, and prints the answer, the trajectory, the events and the
//! transcript; each stop has its own exit code:
//!
//! - 0: answered (`answer(...)`, a ready `answer` dict, `FINAL_VAR`);
//! - 4: a budget ended the run (steps, errors, tokens, cost, calls, time);
//!   the model was asked once more for its best answer, printed (and in
//!   `--json`) marked not final when it gave one;
//! - 1: the model endpoint failed; 2: a usage or configuration error.
//!
//! `--trajectory FILE` writes the run in rlms' JSON-lines log format
//! (see docs/trajectories.md).

use crate::cli::usage;
use crate::exit::Exit;
use crate::supervisor::RunInfo;
use crate::{Language, SessionConfig};
use serde::Serialize;
use serde_json::Value;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub use crate::supervisor::agent::{code_blocks, Stop};
use crate::supervisor::agent::{run_loop, LoopConfig, LoopOutcome, Turn};

/// `cellbox agent [options] TASK`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The config file with the `[models.NAME]` tables, policy and limits.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// The model (a `[models.NAME]`); default: the default model.
    #[arg(long)]
    pub model: Option<String>,
    /// Language the model writes cells in: python or rhai (default: python
    /// where the config's server.languages allows it, else rhai).
    #[arg(long = "lang")]
    pub lang: Option<String>,
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
    /// Write the run in rlms' log format (JSON lines: metadata, then one
    /// line per turn) to this file, which rlms' visualizer opens.
    #[arg(long, value_name = "FILE")]
    pub trajectory: Option<PathBuf>,
    /// Allow one more capability to the cells (repeatable).
    #[arg(long = "allow", value_name = "CAP")]
    pub allow: Vec<String>,
    /// Python interpreter for python cells.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// What the model is asked to do.
    pub task: String,
}

#[derive(Debug, Serialize)]
struct Trajectory {
    task: String,
    model: String,
    stop: Stop,
    answer: Option<Value>,
    /// False when `answer` is the model's best effort at a budget's end.
    #[serde(rename = "final")]
    is_final: bool,
    turns: Vec<Turn>,
    /// The whole run tree's: the loop's turns, its cells' model queries,
    /// sub-agents and their queries, at every depth.
    input_tokens: u64,
    output_tokens: u64,
    cost: f64,
    /// The same, split: the loop's own turns (`root`) and everything its
    /// cells asked (`sub_calls`).
    usage: UsageSplit,
    run: RunInfo,
}

#[derive(Debug, Serialize)]
struct Spent {
    model_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: f64,
}

#[derive(Debug, Serialize)]
struct UsageSplit {
    root: Spent,
    sub_calls: Spent,
    sub_agents: u32,
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

/// Run `cellbox agent`.
pub async fn cli_main(args: AgentArgs) -> ExitCode {
    match run(args).await {
        Ok(code) => code,
        Err(e) => usage(e),
    }
}

/// The language the loop's cells are written in: `--lang`, else Python
/// where the config allows it, else Rhai; it must be one the config allows.
fn loop_language(asked: Option<&str>, allowed: &[Language]) -> Result<Language, String> {
    let lang = match asked {
        Some(l) => l
            .parse()
            .map_err(|e: crate::Error| format!("--lang: {e}"))?,
        None if allowed.contains(&Language::Python) || !allowed.contains(&Language::Rhai) => {
            Language::Python
        }
        None => Language::Rhai,
    };
    if lang.is_shell() {
        return Err("--lang: give python or rhai".into());
    }
    if !allowed.contains(&lang) {
        let names: Vec<&str> = allowed.iter().map(|l| l.as_str()).collect();
        return Err(format!(
            "--lang {lang}: the config's server.languages does not allow it (allowed: {})",
            names.join(", ")
        ));
    }
    Ok(lang)
}

async fn run(args: AgentArgs) -> Result<ExitCode, String> {
    // The config file means for the agent what it means for `serve`: the
    // same settings, validated the same way, build the same supervisor
    // (languages, profiles, limits, models, tools, files) and the same
    // sessions (policy, limits, the local principal's budgets).
    let mut file = crate::serve::ServeConfig::load(&args.config).map_err(|e| e.to_string())?;
    if file.models.is_empty() {
        return Err(format!(
            "{}: cellbox agent needs a model: add a [models.NAME] table",
            args.config.display()
        ));
    }
    for cap in ["answer", "model_query", "model_query_batched"] {
        file.policy.allow.insert(cap.to_owned());
    }
    for a in &args.allow {
        for name in a.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !crate::supervisor::is_allow_name(name) {
                return Err(format!("--allow {name:?}: not a capability name"));
            }
            file.policy.allow.insert(name.to_owned());
        }
    }
    if let Some(n) = args.max_total_tokens {
        file.policy.max_total_tokens = file.policy.max_total_tokens.min(n);
    }
    if let Some(p) = &args.python {
        file.server.python = Some(p.clone());
    }
    if let Some(p) = &args.events {
        file.server.events = Some(p.clone());
    }
    let settings = file
        .validate()
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let lang = loop_language(args.lang.as_deref(), &settings.languages)?;
    let context = read_context(&args.context)?;
    let sup = crate::serve::build_supervisor(&settings).map_err(|e| e.to_string())?;
    let Some(client) = sup.models().cloned() else {
        return Err("cellbox agent needs a model".into());
    };
    let (model, _) = client
        .config(args.model.as_deref())
        .map_err(|e| e.to_string())?;
    let model = model.to_owned();
    let events = sup.event_sink().clone();
    let policy = settings.session.policy.clone();
    let caps: Vec<String> = policy
        .allow
        .iter()
        .filter(|c| sup.capabilities().any(|k| k.name() == c.as_str()))
        .cloned()
        .collect();
    // The local principal, as `serve` over stdio knows it: its budgets
    // and its tenant.
    let local = crate::serve::Principal::local();
    let accounts =
        crate::serve::principal::Accounts::new(settings.principals.clone(), policy.clone());
    let account = crate::Account::principal(
        crate::Tenant::new(
            local.name(),
            settings.own_workspaces,
            settings.max_held_bytes_per_principal,
        ),
        accounts.ledger(&local),
    );
    let session = sup
        .session(SessionConfig {
            account,
            // A turn's cell waits for the model's answer before it: its
            // worker is ready by then.
            prepare_next: true,
            ..settings.session.clone()
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
        deadline,
        progress: std::io::stderr().is_terminal() && !args.json,
        best_effort: true,
    };
    let max_steps = args.max_steps;
    let LoopOutcome {
        stop,
        answer,
        turns,
        messages,
        input,
        output,
        cost: root_cost,
        started,
    } = run_loop(&session, &client, &events, &run, &caps, cfg).await;
    let is_final = stop == Stop::Answered;
    if let Some(p) = &args.trajectory {
        let info = crate::trajectory::RunMeta {
            model: &model,
            lang,
            max_depth: policy.max_depth,
            max_iterations: max_steps,
            run: &run,
            stop: &stop,
            is_final,
            started,
        };
        let text = crate::trajectory::rlm_log(&info, &turns, &messages, answer.as_ref());
        std::fs::write(p, text).map_err(|e| format!("--trajectory {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.transcript {
        let mut messages = serde_json::to_value(&messages).map_err(|e| e.to_string())?;
        crate::secrets::redact_record_value(&mut messages);
        let text = serde_json::to_string_pretty(&messages).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("--transcript {}: {e}", p.display()))?;
    }
    let code = match &stop {
        Stop::Answered => Exit::Ok,
        Stop::BudgetExhausted { .. } => Exit::Limit,
        Stop::ModelError { .. } => Exit::Failed,
    };
    // The session counts the loop's own queries with its cells' and its
    // sub-agents' (their sessions draw on its ledgers).
    let total = session.model_usage();
    let root_calls = turns.len() as u64;
    if args.json {
        let usage = UsageSplit {
            root: Spent {
                model_calls: root_calls,
                input_tokens: input,
                output_tokens: output,
                cost: root_cost,
            },
            sub_calls: Spent {
                model_calls: u64::from(total.model_calls).saturating_sub(root_calls),
                input_tokens: total.input_tokens.saturating_sub(input),
                output_tokens: total.output_tokens.saturating_sub(output),
                cost: (total.cost - root_cost).max(0.0),
            },
            sub_agents: total.agent_calls,
        };
        let t = Trajectory {
            task: args.task,
            model,
            stop,
            answer,
            is_final,
            turns,
            input_tokens: total.input_tokens,
            output_tokens: total.output_tokens,
            cost: total.cost,
            usage,
            run,
        };
        let mut t = serde_json::to_value(&t).map_err(|e| e.to_string())?;
        crate::secrets::redact_record_value(&mut t);
        println!("{}", crate::terminal::escape_json(&t.to_string()));
    } else {
        // The answer and the messages are the model's and the endpoint's
        // words: redacted, and shown to the terminal, never obeyed by it.
        use crate::terminal::for_person;
        match &answer {
            Some(Value::String(s)) => println!("{}", for_person(s)),
            Some(v) => println!("{}", for_person(&v.to_string())),
            None => {}
        }
        match (&answer, &stop) {
            (Some(_), Stop::BudgetExhausted { budget, detail }) => crate::report!(
                "cellbox agent: not final: budget {budget} exhausted ({}); the answer above is \
                 the model's best effort",
                for_person(detail)
            ),
            (None, Stop::BudgetExhausted { budget, detail }) => crate::report!(
                "cellbox agent: stopped unanswered: budget {budget} exhausted ({})",
                for_person(detail)
            ),
            (_, Stop::ModelError { message }) => {
                crate::report!("cellbox agent: {}", for_person(message))
            }
            (_, Stop::Answered) => {}
        }
        let _ = std::io::stdout().flush();
    }
    Ok(ExitCode::from(code.code()))
}
