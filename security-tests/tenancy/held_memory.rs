//! Supervisor memory a tenant makes `serve` hold outside every cgroup.
//!
//! [`checkpoints`]: X's live Python sessions bind large JSON-able values
//! cell after cell and checkpoint after each, so that the server's mirror
//! of each namespace (and the checkpoints' copies of it) grows. Defence:
//! `sessions.max_held_bytes` and `max_held_bytes_per_principal` (16 and 48
//! MiB here): the values past them stay in the sessions' state processes
//! only (each cell says so), checkpoints past them are refused, and the
//! server's resident memory grows by less than X's budget plus a fixed
//! allowance. Control: the same attack with budgets of 1 and 4 GiB: the
//! server grows past that bound.
//!
//! [`search`]: X runs many `search_files` at once over files whose single
//! line is 16 MiB (an operator's root of minified or log files). Defence:
//! a search never holds a line past 1 MiB (such files are skipped and
//! counted), a search is a call like a cell (`max_concurrency` of them at
//! once), and the server's peak memory grows by less than
//! `max_concurrency` searches' bound plus a fixed allowance (every search
//! met the files: each counts them in `skipped_long_lines`). Control: the
//! same searches allowed to hold lines of 64 MiB (`[files]
//! max_search_line_bytes`): the server's peak grows past the bound.

use super::harness::{call, python, session, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// A `/proc/PID/status` field of the server, in bytes.
fn status_bytes(pid: i32, key: &str) -> Result<u64, String> {
    let line = super::harness::proc_line(pid, "status", key)
        .ok_or_else(|| format!("no {key} for the server"))?;
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("unreadable {line:?}"))
}

/// Sessions X fills, and cells in each.
const SESSIONS: usize = 3;
const CELLS: usize = 8;

/// X's sessions, each bound a large value per cell and checkpointed after
/// it; the notes and errors it was answered (joined).
async fn fill(x: &Client) -> Result<String, String> {
    let mut said = String::new();
    for _ in 0..SESSIONS {
        let sid = session(x).await?;
        for k in 0..CELLS {
            let code = format!("v{k} = list(range({k} * 1000, {k} * 1000 + 150_000))\nlen(v{k})");
            let a = python(x, Some(&sid), &code, 60).await;
            if a.status() != "ok" {
                return Err(format!("a fill cell failed: {}", a.all_text()));
            }
            said.push_str(&a.all_text());
            let c = call(
                x,
                "checkpoint_session",
                json!({"session_id": sid, "name": format!("c{k}")}),
            )
            .await;
            said.push_str(&c.all_text());
        }
        // The values are live in the session whatever the mirror holds.
        let a = python(
            x,
            Some(&sid),
            "sum(len(globals()['v%d' % k]) for k in range(8))",
            60,
        )
        .await;
        if a.structured.as_ref().map(|s| s["value"].clone()) != Some(json!(150_000 * CELLS)) {
            return Err(format!("the session lost its values: {}", a.all_text()));
        }
    }
    Ok(said)
}

/// Server memory growth while X fills its sessions, under `budgets`
/// (per session, per principal); with what X was told.
fn grow(env: &Env, budgets: (u64, u64)) -> Result<(u64, String), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let conf = dir.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "[sessions]\nmax_held_bytes = {}\nmax_held_bytes_per_principal = {}\n\
             max_sessions = 8\n",
            budgets.0, budgets.1
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    let conf = conf.display().to_string();
    let serve = Serve::start(
        env,
        &["x", "y"],
        &["--language", "python", "--config", &conf],
    )?;
    let x = serve.client(env, "x")?;
    // Warm: the pools up, a first cell run.
    env.block_on("warm", async { python(&x, None, "1", 30).await })?;
    std::thread::sleep(std::time::Duration::from_secs(3));
    let before = status_bytes(serve.pid(), "VmRSS")?;
    let said = env.block_on("fill", fill(&x))??;
    // The server gives back freed memory once idle (every 2 s).
    std::thread::sleep(std::time::Duration::from_secs(5));
    let after = status_bytes(serve.pid(), "VmRSS")?;
    Ok((after.saturating_sub(before), said))
}

pub fn checkpoints(env: &Env) -> Result<Outcome, String> {
    let budget = (16 * MIB, 48 * MIB);
    // What the server may grow by: X's budget, plus a fixed allowance for
    // the allocator and what a call holds while it runs.
    let bound = budget.1 + 64 * MIB;
    let (open, _) = grow(env, (1 << 30, 4 << 30))?;
    if open <= bound {
        return Err(format!(
            "the control grew the server by only {} MiB (bound {} MiB): the attack is too small",
            open / MIB,
            bound / MIB
        ));
    }
    let control = format!(
        "with budgets of 1 and 4 GiB the server grew by {} MiB",
        open / MIB
    );
    let (grew, said) = grow(env, budget)?;
    let told = said.contains("max_held_bytes");
    Ok(Outcome {
        control,
        blocked: grew <= bound && told,
        evidence: format!(
            "the server grew by {} MiB (bound {} MiB: X's 48 MiB and 64 MiB allowance); X was \
             told of its budget: {told}",
            grow_mib(grew),
            bound / MIB
        ),
    })
}

fn grow_mib(b: u64) -> u64 {
    b / MIB
}

/// Files of one 16 MiB line each, in a root of the server's.
const FILES: usize = 4;
const LINE: usize = 16 << 20;
const SEARCHES: usize = 8;

/// The server's peak memory growth under [`SEARCHES`] concurrent searches
/// of the long-line files in `root`, with searches holding lines up to
/// `max_line` bytes; and how many searches skipped every file as too long.
fn searches(env: &Env, dir: &Path, root: &Path, max_line: u64) -> Result<(u64, usize), String> {
    let conf = dir.join(format!("serve-{max_line}.toml"));
    std::fs::write(
        &conf,
        // (The principal's budget of held bytes raised out of the way:
        // each search reserves its bound from it.)
        format!(
            "[files]\nroots = [{:?}]\nmax_search_line_bytes = {max_line}\n\n[sessions]\n\
             max_held_bytes_per_principal = {}\n",
            root.display().to_string(),
            8u64 << 30
        ),
    )
    .map_err(|e| format!("config: {e}"))?;
    let conf = conf.display().to_string();
    let serve = Serve::start(
        env,
        &["x", "y"],
        &[
            "--language",
            "rhai",
            "--config",
            &conf,
            "--max-concurrency",
            "4",
            "--max-queue",
            "32",
        ],
    )?;
    let x = serve.client(env, "x")?;
    env.block_on("warm", async {
        call(&x, "search_files", json!({"pattern": "nothing-here"})).await
    })?;
    let before = status_bytes(serve.pid(), "VmHWM")?;
    let answers = env.block_on("searches", async {
        let mut tasks = Vec::new();
        for _ in 0..SEARCHES {
            let peer = x.peer().clone();
            tasks.push(tokio::spawn(async move {
                let params = rmcp::model::CallToolRequestParams::new("search_files")
                    .with_arguments(
                        json!({"pattern": "needle"})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    );
                peer.call_tool(params).await
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await);
        }
        out
    })?;
    let peak = status_bytes(serve.pid(), "VmHWM")?;
    let mut skipped = 0;
    let mut searched = 0;
    for a in answers {
        let s = match a {
            Ok(Ok(r)) => r.structured_content.unwrap_or_default(),
            Ok(Err(e)) => return Err(format!("a search failed: {e}")),
            Err(e) => return Err(format!("a search's task failed: {e}")),
        };
        if s["skipped_long_lines"] == json!(FILES) {
            skipped += 1;
        } else if s["files_searched"] == json!(FILES) {
            searched += 1;
        } else {
            return Err(format!("a search answered {s:?}"));
        }
    }
    if skipped + searched != SEARCHES {
        return Err(format!(
            "{skipped} + {searched} searches of {SEARCHES} met the files"
        ));
    }
    Ok((peak.saturating_sub(before), skipped))
}

pub fn search(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let root = dir.path().join("logs");
    std::fs::create_dir(&root).map_err(|e| format!("{e}"))?;
    let mut line = "a".repeat(LINE);
    line.push_str("needle\n");
    for i in 0..FILES {
        std::fs::write(root.join(format!("{i}.log")), &line).map_err(|e| format!("{e}"))?;
    }
    drop(line);
    // Each running search holds at most its bound (13 MiB with 1 MiB
    // lines; max_concurrency 4 run at once); a fixed allowance for the
    // allocator and the calls' answers.
    let bound = 4 * 13 * MIB + 64 * MIB;
    // Control: searches that hold whole lines (64 MiB allowed).
    let (open, _) = searches(env, dir.path(), &root, 64 * MIB)?;
    if open <= bound {
        return Err(format!(
            "the control grew the server's peak by only {} MiB (bound {} MiB)",
            open / MIB,
            bound / MIB
        ));
    }
    let control = format!(
        "with searches holding lines up to 64 MiB, {SEARCHES} concurrent searches of {FILES} \
         files of one {} MiB line grew the server's peak by {} MiB",
        LINE as u64 / MIB,
        open / MIB
    );
    let (grew, skipped) = searches(env, dir.path(), &root, MIB)?;
    Ok(Outcome {
        control,
        blocked: grew <= bound && skipped > 0,
        evidence: format!(
            "the server's peak memory grew by {} MiB under {SEARCHES} concurrent searches \
             (bound {} MiB); {skipped} searches counted all {FILES} files as too long to hold",
            grew / MIB,
            bound / MIB
        ),
    })
}
