//! The multi-tenant section of the escape suite: attacks by one client of a
//! shared `cellbox serve --http` on another client, on the server, or on
//! what the clients share.
//!
//! # Adding an attack
//!
//! 1. Write `security-tests/tenancy/<name>.rs` with
//!    `pub fn run(env: &Env) -> Result<Outcome, String>`.
//! 2. Add `mod <name>;` below and a line `("<name>", <name>::run)` to
//!    [`ATTACKS`].
//!
//! In `run`, start servers with [`Serve::start`] (N named principals, extra
//! `serve` flags) and talk to them with [`Serve::client`] (an rmcp client
//! for one principal), [`call`] / [`exec`] (a tool call and its result), or
//! raw TCP ([`Serve::addr`]). Judge from evidence the attacker does not
//! control (the victim's own view, the process table, files on the host),
//! never from what the attacker's code says about itself. Every attack needs
//! a **positive control**: the same attack seen working where the defence
//! is off (for example both clients sharing one token, or a cap raised out
//! of the way), so a broken attack cannot pass as "blocked". Return
//! `Err(..)` when the attack or its control could not be run or judged.
//!
//! `cargo test --profile test-release --test security -- tenant_` runs only this section.

mod call_records;
mod caps;
mod display_flood;
mod early_done;
mod flood;
pub mod harness;
mod held_memory;
mod lifetime;
mod oom;
mod ownership;
mod pids;
mod principal_budget;
mod scratch_quota;
mod session_answers;
mod sibling_proc;
mod slow_body;
mod subcell;
mod upstream_state;
mod workspace;
mod workspace_quota;

pub use harness::{Env, ToolAnswer};

use std::time::Instant;

/// How an attack went.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What the positive control showed (the attack working without the
    /// defence). An empty string is an error: every attack has a control.
    pub control: String,
    /// Whether the defence held.
    pub blocked: bool,
    /// What was seen (why blocked, or what got through).
    pub evidence: String,
}

type AttackFn = fn(&Env) -> Result<Outcome, String>;

/// Every attack of this section: name (prefixed `tenant_` in reports and
/// filters) and function.
pub const ATTACKS: &[(&str, AttackFn)] = &[
    ("ownership", ownership::run),
    ("principal_caps", caps::run),
    ("connection_flood", flood::run),
    ("slow_body", slow_body::run),
    ("subcell_widening", subcell::run),
    ("early_done", early_done::run),
    ("call_records", call_records::run),
    ("scratch_quota", scratch_quota::run),
    ("oom_targeting", oom::run),
    ("process_count", pids::run),
    ("sibling_proc", sibling_proc::run),
    ("workspace_cross_principal", workspace::run),
    ("workspace_quota", workspace_quota::run),
    ("display_flood", display_flood::run),
    ("session_answers", session_answers::run),
    ("held_memory_checkpoints", held_memory::checkpoints),
    ("held_memory_search", held_memory::search),
    ("outlive_cell", lifetime::outlive),
    ("hijacked_shim", lifetime::hijacked_shim),
    ("idle_session", lifetime::idle),
    ("unasked_answer", lifetime::unasked),
    ("principal_budget", principal_budget::run),
    ("upstream_state", upstream_state::run),
];

/// Run the attacks whose name (with its `tenant_` prefix) contains
/// `filter`; print a table; return (passed, failed, ran).
pub fn run(
    cellbox: &std::path::Path,
    filter: Option<&str>,
) -> Result<(usize, usize, usize), String> {
    let chosen: Vec<(String, AttackFn)> = ATTACKS
        .iter()
        .map(|(n, f)| (format!("tenant_{n}"), *f))
        .filter(|(n, _)| filter.is_none_or(|f| n.contains(f)))
        .collect();
    if chosen.is_empty() {
        return Ok((0, 0, 0));
    }
    let env = Env::new(cellbox)?;
    let (mut passed, mut failed) = (0, 0);
    println!("== multi-tenant (cellbox serve --http)");
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
