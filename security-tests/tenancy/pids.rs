//! Process count: one session takes every process it can so that another
//! principal's cells cannot fork.
//!
//! X runs cells at once until every zygote of the pool carries one (three
//! to start with; where the host shows a zygote without one, another, up
//! to six: which zygote takes a cell depends on which answers first);
//! each forks until refused and holds its children. Then Y's cell forks 30
//! children. Defence (a pids cgroup per session and cell,
//! RLIMIT_NPROC lifted for warm cells): Y's 30 forks succeed (Y's own
//! result).
//!
//! Control: `--session-cgroups false`: RLIMIT_NPROC is counted per user of
//! the zygote's user namespace, shared by every cell of that zygote, and
//! Y's forks are refused.

use super::harness::{
    marker, proc_line, python, session, spawn_exec, wait_holders, Client, Env, Serve,
};
use super::Outcome;
use serde_json::json;
use std::time::Duration;

fn hog(token: &str) -> String {
    format!(
        r#"import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(4)
            os._exit(0)
        n += 1
except OSError:
    pass
f = open({token:?}, "w")
time.sleep(4)
print("HOG", n)
"#
    )
}

const VICTIM: &str = r#"import os, time
ok = 0
err = ""
for i in range(30):
    try:
        if os.fork() == 0:
            time.sleep(1)
            os._exit(0)
        ok += 1
    except OSError as e:
        err = e.strerror
print("FORKED", ok, err)
"#;

/// The host's parent of `pid`.
fn parent(pid: i32) -> Option<i32> {
    proc_line(pid, "status", "PPid:")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The Python zygotes of the server (its children running `__zygote`;
/// each of its threads lists the children it forked).
fn zygotes(server: i32) -> Vec<i32> {
    let mut children = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{server}/task")) {
        for t in tasks.flatten() {
            let listed = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            children.extend(
                listed
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    children
        .into_iter()
        .filter(|c| {
            std::fs::read(format!("/proc/{c}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).contains("__zygote"))
                .unwrap_or(false)
        })
        .collect()
}

/// The server's child that `pid` descends from.
fn zygote_of(server: i32, mut pid: i32) -> Option<i32> {
    for _ in 0..16 {
        let up = parent(pid)?;
        if up == server {
            return Some(pid);
        }
        pid = up;
    }
    None
}

async fn attack(server: i32, x: &Client, y: &Client) -> Result<(String, Vec<String>), String> {
    let sy = session(y).await?;
    let mut hogs = Vec::new();
    let mut carrying = std::collections::BTreeSet::new();
    let start = |hogs: &mut Vec<_>| {
        let t = marker("cbx-pids-");
        hogs.push(spawn_exec(
            x,
            json!({"language": "python", "code": hog(&t), "timeout_seconds": 20}),
        ));
        t
    };
    let mut tokens: Vec<String> = (0..3).map(|_| start(&mut hogs)).collect();
    loop {
        for t in tokens.drain(..) {
            for h in wait_holders(&t, Duration::from_secs(15)).await? {
                carrying.extend(zygote_of(server, h));
            }
        }
        let bare = zygotes(server)
            .into_iter()
            .filter(|z| !carrying.contains(z))
            .count();
        if bare == 0 || hogs.len() >= 6 {
            break;
        }
        tokens.push(start(&mut hogs));
    }
    let b = python(y, Some(&sy), VICTIM, 20).await;
    let mut said = Vec::new();
    for h in hogs {
        said.push(super::harness::join(h).await?.stdout().trim().to_owned());
    }
    Ok((b.stdout().trim().to_owned(), said))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let common = ["--language", "python", "--max-concurrency", "8"];
    let control = {
        let mut args = common.to_vec();
        args.extend(["--session-cgroups", "false"]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (b, hogs) = env.block_on("control", attack(serve.pid(), &x, &y))??;
        if b.starts_with("FORKED 30") {
            return Err(format!(
                "without session cgroups Y still forked 30 ({b}; X: {hogs:?}); the attack is \
                 broken"
            ));
        }
        format!("with --session-cgroups false Y got {b:?} (X: {hogs:?})")
    };
    let serve = Serve::start(env, &["x", "y"], &common)?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (b, hogs) = env.block_on("attack", attack(serve.pid(), &x, &y))??;
    Ok(Outcome {
        control,
        blocked: b == "FORKED 30",
        evidence: format!("Y's cell: {b:?} (its own result); X's cells: {hogs:?}"),
    })
}
