//! Sibling `/proc`: a warm cell reads another session's running cell in
//! `/proc` (its name, command line, status: memory, CPU, start time).
//!
//! Y's cell renames itself to a fresh 15-character canary
//! (`prctl(PR_SET_NAME)`) and sleeps. X runs three cells at once (so one
//! lands on Y's zygote, in Y's PID namespace); each reads `comm`,
//! `cmdline` and `status` of every process it sees in `/proc` and prints
//! them. Defence: the canary, which X cannot know otherwise, is in none of
//! X's results.
//!
//! Control: an operator profile with `show_other_processes = true` (its
//! `/proc` without `hidepid=invisible`): X prints Y's canary.

use super::harness::{marker, session, spawn_exec, wait_holders, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::Duration;

fn victim(canary: &str, token: &str) -> String {
    format!(
        r#"import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(15, {canary:?}.encode(), 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl")
f = open({token:?}, "w")
time.sleep(3)
print(open("/proc/self/comm").read().strip())
"#
    )
}

const SPY: &str = r#"import os
me = os.getpid()
seen = []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == me:
        continue
    for name in ("comm", "cmdline", "status"):
        try:
            seen.append("%s/%s=%r" % (p, name, open("/proc/%s/%s" % (p, name), "rb").read()[:300]))
        except OSError as e:
            seen.append("%s/%s:%s" % (p, name, e.errno))
print(len(seen), " ".join(seen))
"#;

async fn attack(x: &Client, y: &Client) -> Result<(String, Vec<String>), String> {
    let sy = session(y).await?;
    let canary = marker("cbx")[..15].to_owned();
    let token = marker("cbx-proc-");
    let b = spawn_exec(
        y,
        json!({"language": "python", "code": victim(&canary, &token), "session_id": sy,
               "timeout_seconds": 20}),
    );
    wait_holders(&token, Duration::from_secs(15)).await?;
    let spies: Vec<_> = (0..3)
        .map(|_| {
            spawn_exec(
                x,
                json!({"language": "python", "code": SPY, "timeout_seconds": 10}),
            )
        })
        .collect();
    let mut seen = Vec::new();
    for s in spies {
        seen.push(super::harness::join(s).await?.all_text());
    }
    let b = super::harness::join(b).await?;
    if !b.stdout().contains(&canary) {
        return Err(format!("Y's cell did not take its name: {}", b.all_text()));
    }
    Ok((canary, seen))
}

fn profile(dir: &std::path::Path) -> Result<String, String> {
    let text = include_str!("../../sandbox-profiles/python.toml");
    let anchor = "\n[filesystem]\n";
    if text.matches(anchor).count() != 1 {
        return Err("sandbox-profiles/python.toml changed shape ([filesystem])".into());
    }
    let text = text.replace(anchor, "\n[filesystem]\nshow_other_processes = true\n");
    let path = dir.join("python-show.toml");
    std::fs::write(&path, text).map_err(|e| format!("profile: {e}"))?;
    Ok(format!("python={}", path.display()))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let show = profile(dir.path())?;
    let common = ["--language", "python", "--max-concurrency", "4"];
    let control = {
        let mut args = common.to_vec();
        args.extend(["--profile", &show]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (canary, seen) = env.block_on("control", attack(&x, &y))??;
        let hits = seen.iter().filter(|s| s.contains(&canary)).count();
        if hits == 0 {
            return Err(format!(
                "with show_other_processes no cell of X saw Y's name {canary}; the attack is \
                 broken: {seen:?}"
            ));
        }
        format!("with show_other_processes = true, {hits} of X's 3 cells printed Y's name")
    };
    let serve = Serve::start(env, &["x", "y"], &common)?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (canary, seen) = env.block_on("attack", attack(&x, &y))??;
    let hits = seen.iter().filter(|s| s.contains(&canary)).count();
    Ok(Outcome {
        control,
        blocked: hits == 0,
        evidence: if hits == 0 {
            "Y's canary name is in none of X's 3 results (comm, cmdline, status of every \
             process X's /proc lists)"
                .into()
        } else {
            format!("{hits} of X's cells printed Y's canary name")
        },
    })
}
