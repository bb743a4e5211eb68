//! The agent-surface section of the escape suite: attacks through models,
//! declared tools, upstream MCP servers and the agent loop, as a hostile
//! tenant, a hostile model endpoint or a hostile tool would make them.
//!
//! # Adding an attack
//!
//! 1. Write `security-tests/agent/<name>.rs` with
//!    `pub fn run(env: &Env) -> Result<Outcome, String>`.
//! 2. Add `mod <name>;` below and a line `("<name>", <name>::run)` to
//!    [`ATTACKS`].
//!
//! In `run`, start a server with [`harness::AgentServe::start`] (a config
//! file, secrets in its environment, its log and events kept), stand up
//! the outside world it talks to with [`harness::Echo`] (an HTTP endpoint
//! that answers with what it was sent: a model, an http tool) or the fake
//! upstream MCP server ([`harness::fake_upstream`]), and talk to the server
//! with its MCP client. Judge from evidence the attacker does not control:
//! the client's view, the events file and the server's log
//! ([`harness::AgentServe::leaks`]), the host's `/proc`, what the echoing
//! endpoint received and sent. Every attack needs a **positive control**:
//! the attack seen working without the defence (the endpoint shown to have
//! sent the secret back, the secret shown in the supervisor's own
//! environment, a permission granted), so a broken attack cannot pass as
//! "blocked". Return `Err(..)` when the attack or its control could not be
//! run or judged.
//!
//! `cargo test --profile test-release --test security -- agent_` runs only
//! this section.

pub mod harness;

mod budget_race;
mod budgets;
mod cancel;
mod context_cpu;
mod crossing;
mod environment;
mod event_stream;
mod leaks;
mod live_output;
mod oracle;
mod principal_names;
mod reply_headers;
mod terminal;
mod upstream_flood;
mod wire;

pub use crate::tenancy::{Env, Outcome};

use std::time::Instant;

type AttackFn = fn(&Env) -> Result<Outcome, String>;

/// Every attack of this section: name (prefixed `agent_` in reports and
/// filters) and function.
pub const ATTACKS: &[(&str, AttackFn)] = &[
    ("cell_environment", environment::cell),
    ("command_tool_environment", environment::command_tool),
    ("model_key_in_a_reply", leaks::model_reply),
    ("model_key_in_an_error", leaks::model_error),
    ("http_tool_echoes_headers", leaks::http_tool),
    ("http_tool_other_forms", leaks::http_tool_other_forms),
    ("upstream_environment", leaks::upstream_environment),
    ("upstream_log_and_stdout", leaks::upstream_log),
    ("upstream_http_token", leaks::upstream_http_token),
    ("upstream_tool_list", leaks::upstream_tool_list),
    ("terminal_and_key", terminal::run),
    ("live_output_in_pieces", live_output::run),
    ("redaction_oracle", oracle::run),
    ("model_tokens_past_budget", budgets::model_tokens),
    ("loop_config", budgets::loop_config),
    ("model_reply_headers", reply_headers::model_reply_headers),
    ("model_reply_flood", reply_headers::model_reply_flood),
    ("event_stream_between_tenants", event_stream::run),
    ("principal_names", principal_names::run),
    ("principal_budget_race", budget_race::run),
    ("prompt_estimate_gap", budget_race::estimate_gap),
    ("upstream_http_between_tenants", crossing::upstream_http),
    ("session_paths_between_tenants", crossing::session_paths),
    ("cancel_between_tenants", cancel::run),
    ("context_cpu", context_cpu::run),
    ("upstream_list_flood", upstream_flood::run),
];

/// Run the attacks whose name (with its `agent_` prefix) contains
/// `filter`; print a table; return (passed, failed, ran).
pub fn run(
    cellbox: &std::path::Path,
    filter: Option<&str>,
) -> Result<(usize, usize, usize), String> {
    let chosen: Vec<(String, AttackFn)> = ATTACKS
        .iter()
        .map(|(n, f)| (format!("agent_{n}"), *f))
        .filter(|(n, _)| filter.is_none_or(|f| n.contains(f)))
        .collect();
    if chosen.is_empty() {
        return Ok((0, 0, 0));
    }
    let env = Env::new(cellbox)?;
    let (mut passed, mut failed) = (0, 0);
    println!("== agent surface (models, tools, upstreams, the agent loop)");
    for (name, attack) in &chosen {
        eprintln!("security suite: {name} ...");
        let t0 = Instant::now();
        let (verdict, detail) = match attack(&env) {
            Ok(o) if o.control.trim().is_empty() => {
                ("error", format!("no positive control: {}", o.evidence))
            }
            Ok(o) if o.blocked => (
                "blocked",
                format!("{} (control: {})", o.evidence, o.control),
            ),
            Ok(o) => (
                "ESCAPED",
                format!("{} (control: {})", o.evidence, o.control),
            ),
            Err(e) => ("error", e),
        };
        if verdict == "blocked" {
            passed += 1;
        } else {
            failed += 1;
        }
        println!(
            "{name:<32} {verdict:<8} {:>5.1}s  {detail}",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok((passed, failed, chosen.len()))
}
