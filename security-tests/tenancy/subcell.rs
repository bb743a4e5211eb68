//! Sub-cell widening: a cell reaches, through `run_cell`, what the server
//! does not offer its clients: a language left out of `--language`, or
//! looser limits than the operator's profile for a language.
//!
//! The attacker's Rhai cell calls `run_cell("shell", ..)` directly, by
//! `call("run_cell", ..)`, and from a Python sub-cell (Rhai → Python →
//! shell); the shell would keep a file named with a fresh token open. It
//! also starts a Python sub-cell that keeps another token file open while
//! the host reads its rlimits.
//!
//! Control: with `--language python,rhai,shell` the shell sub-cell runs
//! (a host process holds its token file), and without `--profile` the
//! Python sub-cell has the built-in limits (256 files, 1 GiB). Defence:
//! with `--language python,rhai --profile python=FILE` (the operator's
//! profile: 100 files, 512 MiB, 16 processes) no host process ever holds
//! the shell's token file, and the host's `/proc/<pid>/limits` of the
//! Python sub-cell shows the operator's limits.

use super::harness::{holders, marker, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::{Duration, Instant};

const OPERATOR_FILES: u64 = 100;
const OPERATOR_MEMORY: u64 = 512 << 20;

fn operator_profile(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let text = include_str!("../../sandbox-profiles/python.toml");
    let mut changed = 0;
    let text: String = text
        .lines()
        .map(|l| {
            let key = l.split('=').next().unwrap_or("").trim();
            let new = match key {
                "max_open_files" => Some(format!("max_open_files = {OPERATOR_FILES}")),
                "memory_bytes" => Some(format!("memory_bytes = {OPERATOR_MEMORY}")),
                "max_processes" => Some("max_processes = 16".to_owned()),
                _ => None,
            };
            match new {
                Some(n) => {
                    changed += 1;
                    n + "\n"
                }
                None => format!("{l}\n"),
            }
        })
        .collect();
    if changed != 3 {
        return Err(format!(
            "sandbox-profiles/python.toml changed shape ({changed} of 3 limits found)"
        ));
    }
    let path = dir.join("python-operator.toml");
    std::fs::write(&path, text).map_err(|e| format!("operator profile: {e}"))?;
    Ok(path)
}

fn rhai_code(shell_token: &str, py_token: &str) -> String {
    let sh = format!("exec 7>{shell_token}; sleep 0.5; echo SHELL-RAN");
    format!(
        r#"let out = [];
try {{ out.push(run_cell("shell", {sh:?})); }} catch (e) {{ out.push("direct: " + e); }}
try {{ out.push(invoke("run_cell", #{{language: "shell", code: {sh:?}}})); }} catch (e) {{ out.push("invoke: " + e); }}
try {{ out.push(run_cell("python", `
try:
    print(run_cell("shell", {sh:?}))
except Exception as e:
    print("nested:", e)
`)); }} catch (e) {{ out.push("nested: " + e); }}
try {{ out.push(run_cell("python", `
import time
f = open({py_token:?}, "w")
time.sleep(1)
`)); }} catch (e) {{ out.push("python: " + e); }}
print(out);
"#
    )
}

/// What the host saw: whether the shell token file was ever held, and the
/// Python sub-cell's open-files and address-space limits.
struct Seen {
    shell_ran: bool,
    files: String,
    memory: String,
    text: String,
}

async fn attack(x: &Client) -> Result<Seen, String> {
    let shell_token = marker("cbx-sub-sh-");
    let py_token = marker("cbx-sub-py-");
    let code = rhai_code(&shell_token, &py_token);
    let call = tokio::spawn({
        let x = x.peer().clone();
        async move {
            let args = json!({"language": "rhai", "code": code, "timeout_seconds": 30});
            let params = rmcp::model::CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().cloned().unwrap_or_default());
            x.call_tool(params).await
        }
    });
    let t0 = Instant::now();
    let mut shell_ran = false;
    let mut limits = None;
    while !call.is_finished() && t0.elapsed() < Duration::from_secs(40) {
        shell_ran |= !holders(&shell_token).is_empty();
        if limits.is_none() {
            if let Some(&pid) = holders(&py_token).first() {
                let line = |k| super::harness::proc_line(pid, "limits", k).unwrap_or_default();
                limits = Some((line("Max open files"), line("Max address space")));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = match call.await {
        Ok(Ok(r)) => format!("{:?}", r.structured_content),
        Ok(Err(e)) => format!("call error: {e}"),
        Err(e) => return Err(format!("the call's task failed: {e}")),
    };
    // Reap check: nothing of the sub-cells is left either.
    shell_ran |= !holders(&shell_token).is_empty();
    let (files, memory) =
        limits.ok_or_else(|| format!("the Python sub-cell never opened its file: {text}"))?;
    Ok(Seen {
        shell_ran,
        files,
        memory,
        text,
    })
}

fn soft(line: &str) -> Option<u64> {
    line.split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok())
        .next()
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let profile = operator_profile(dir.path())?;
    let profile_arg = format!("python={}", profile.display());
    let common = ["--allow", "run_cell", "--max-concurrency", "4"];

    let control = {
        let mut args = common.to_vec();
        args.extend(["--language", "python,rhai,shell"]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let seen = env.block_on("control", attack(&serve.client(env, "x")?))??;
        let (files, mem) = (soft(&seen.files), soft(&seen.memory));
        if !seen.shell_ran || files == Some(OPERATOR_FILES) || mem == Some(OPERATOR_MEMORY) {
            return Err(format!(
                "control: shell sub-cell ran: {}; Python sub-cell limits {:?} / {:?} ({}); \
                 the attack is broken",
                seen.shell_ran, seen.files, seen.memory, seen.text
            ));
        }
        format!(
            "with shell served, the shell sub-cell ran (a host process held its token file); \
             without --profile the Python sub-cell had {files:?} files, {mem:?} bytes"
        )
    };

    let mut args = common.to_vec();
    args.extend(["--language", "python,rhai", "--profile", &profile_arg]);
    let serve = Serve::start(env, &["x", "y"], &args)?;
    let seen = env.block_on("attack", attack(&serve.client(env, "x")?))??;
    let (files, mem) = (soft(&seen.files), soft(&seen.memory));
    let mut problems = Vec::new();
    if seen.shell_ran {
        problems.push("a shell sub-cell ran (a host process held its token file)".to_owned());
    }
    if files != Some(OPERATOR_FILES) {
        problems.push(format!(
            "the Python sub-cell's open files limit is {files:?}, not the operator's {OPERATOR_FILES}"
        ));
    }
    if mem != Some(OPERATOR_MEMORY) {
        problems.push(format!(
            "the Python sub-cell's address space limit is {mem:?}, not the operator's \
             {OPERATOR_MEMORY}"
        ));
    }
    Ok(Outcome {
        control,
        blocked: problems.is_empty(),
        evidence: if problems.is_empty() {
            format!(
                "no host process ever held the shell token file (run_cell, invoke, nested from \
                 Python); host /proc limits of the Python sub-cell: {files:?} files, {mem:?} \
                 bytes (the operator's)"
            )
        } else {
            format!("{} ({})", problems.join("; "), seen.text)
        },
    })
}
