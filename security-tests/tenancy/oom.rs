//! OOM targeting: one session fills memory so that the kernel's OOM killer
//! picks another session's cell (the largest process in a shared cgroup).
//!
//! Y's cell holds 180 MB and sleeps; X's cell forks 4 children that each
//! touch 150 MB (600 MB, each within its 256 MiB address-space limit).
//! Defence (`--memory 268435456`, `--cells-memory-bytes` 3 GiB, per-session
//! memory cgroups): Y's cell ends ok and prints the size it held (Y's own
//! result); X's children are killed.
//!
//! Control: `--session-cgroups false` with the cells' shared cgroup bounded
//! at 500 MiB (room for Y's cell and part of X's): the kernel kills the
//! largest process of the shared cgroup, Y's cell.

use super::harness::{marker, python, session, spawn_exec, wait_holders, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::Duration;

fn victim(token: &str) -> String {
    format!(
        r#"import time
x = b"\x01" * (180 << 20)
f = open({token:?}, "w")
time.sleep(4)
print("VICTIM-OK", len(x))
"#
    )
}

const ATTACK: &str = r#"import os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            y = b"\x02" * (150 << 20)
            time.sleep(2)
        finally:
            os._exit(0)
    kids.append(pid)
ends = [os.waitpid(p, 0)[1] for p in kids]
print("KIDS", " ".join("sig%d" % os.WTERMSIG(s) if os.WIFSIGNALED(s) else "exit%d" % os.WEXITSTATUS(s) for s in ends))
"#;

/// Y's result and X's report.
async fn attack(x: &Client, y: &Client) -> Result<(super::ToolAnswer, String), String> {
    let sx = session(x).await?;
    let sy = session(y).await?;
    let token = marker("cbx-oom-");
    let b = spawn_exec(
        y,
        json!({"language": "python", "code": victim(&token), "session_id": sy,
               "timeout_seconds": 20}),
    );
    wait_holders(&token, Duration::from_secs(15)).await?;
    let a = python(x, Some(&sx), ATTACK, 20).await;
    let b = super::harness::join(b).await?;
    Ok((b, a.all_text()))
}

const HELD: &str = "VICTIM-OK 188743680";

pub fn run(env: &Env) -> Result<Outcome, String> {
    let control = {
        let serve = Serve::start(
            env,
            &["x", "y"],
            &[
                "--language",
                "python",
                "--memory",
                "268435456",
                "--cells-memory-bytes",
                "524288000",
                "--session-cgroups",
                "false",
            ],
        )?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (b, a) = env.block_on("control", attack(&x, &y))??;
        if b.stdout().contains(HELD) {
            return Err(format!(
                "with one shared 500 MiB cgroup Y's cell survived ({}; X: {a}); the attack is \
                 broken",
                b.status()
            ));
        }
        format!(
            "with --session-cgroups false and the cells' cgroup at 500 MiB, Y's cell was killed \
             (status {})",
            b.status()
        )
    };
    let serve = Serve::start(
        env,
        &["x", "y"],
        &[
            "--language",
            "python",
            "--memory",
            "268435456",
            "--cells-memory-bytes",
            "3221225472",
        ],
    )?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (b, a) = env.block_on("attack", attack(&x, &y))??;
    let blocked = b.status() == "ok" && b.stdout().contains(HELD);
    let kids = a
        .split("KIDS")
        .nth(1)
        .map(|s| {
            s.split(['\\', '\n', '"'])
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|| "no report".into());
    Ok(Outcome {
        control,
        blocked,
        evidence: if blocked {
            format!("Y's cell ended ok holding its 180 MB (its own result); X's children: {kids}")
        } else {
            format!(
                "Y's cell: {} {}; X's children: {kids}",
                b.status(),
                b.stdout()
            )
        },
    })
}
