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
//! Y's forks are refused. Where each cell lands is the pool's choice, so a
//! control in which Y still forks 30 is tried once more on a new server
//! before the attack is called broken. Every cell's place (its zygote's
//! pid, or that it ran in none) and each hog's count and the errno that
//! stopped it are in the evidence.

use super::harness::{marker, proc_line, session, spawn_exec, wait_holders, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::Duration;

fn hog(token: &str) -> String {
    format!(
        r#"import errno, os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(4)
            os._exit(0)
        n += 1
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
else:
    err = "none"
f = open({token:?}, "w")
time.sleep(4)
print("HOG", n, err)
"#
    )
}

/// Y's cell: holds the file `token` open (so the harness can see where it
/// runs) while it forks 30 children.
fn victim(token: &str) -> String {
    format!(
        r#"import os, time
f = open({token:?}, "w")
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
time.sleep(0.5)
print("FORKED", ok, err)
"#
    )
}

/// The host's parent of `pid`.
fn parent(pid: i32) -> Option<i32> {
    proc_line(pid, "status", "PPid:")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The Python zygotes of the server: its children running the zygote
/// (`python3 ... --zygote CONFIG` when the server is root and clones them,
/// `cellbox __zygote` when it starts them by exec). Each of the server's
/// threads lists the children it forked.
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
                .map(|b| {
                    b.split(|c| *c == 0)
                        .any(|arg| arg == b"--zygote" || arg == b"__zygote")
                })
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

/// Where a cell runs, by a process holding its token: "zygote PID", or
/// what else the server's child it descends from is.
fn place(server: i32, holders: &[i32]) -> String {
    let zygotes = zygotes(server);
    match holders.iter().find_map(|h| zygote_of(server, *h)) {
        Some(z) if zygotes.contains(&z) => format!("zygote {z}"),
        Some(z) => format!("not in a zygote (server's child {z})"),
        None => "not found under the server".into(),
    }
}

async fn attack(server: i32, x: &Client, y: &Client) -> Result<(String, Vec<String>), String> {
    let sy = session(y).await?;
    let mut hogs = Vec::new();
    let mut carrying = std::collections::BTreeSet::new();
    let mut places = Vec::new();
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
            let held = wait_holders(&t, Duration::from_secs(15)).await?;
            places.push(place(server, &held));
            carrying.extend(held.iter().filter_map(|h| zygote_of(server, *h)));
        }
        let all = zygotes(server);
        if all.is_empty() {
            return Err(format!(
                "no Python zygote found among the children of the server (pid {server})"
            ));
        }
        let bare = all.iter().filter(|z| !carrying.contains(z)).count();
        if bare == 0 || hogs.len() >= 6 {
            break;
        }
        tokens.push(start(&mut hogs));
    }
    let t = marker("cbx-pids-y-");
    let mut args = json!({"language": "python", "code": victim(&t), "timeout_seconds": 20});
    args["session_id"] = json!(sy);
    let b = spawn_exec(y, args);
    let y_place = match wait_holders(&t, Duration::from_secs(15)).await {
        Ok(held) => place(server, &held),
        Err(e) => e,
    };
    let b = super::harness::join(b).await?;
    let mut said = Vec::new();
    for (h, at) in hogs.into_iter().zip(places) {
        let out = super::harness::join(h).await?.stdout().trim().to_owned();
        said.push(format!("{out} ({at})"));
    }
    Ok((format!("{} ({y_place})", b.stdout().trim()), said))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let common = ["--language", "python", "--max-concurrency", "8"];
    // Which zygote each cell lands in is the pool's choice, so the control
    // gets a second server before it calls the attack broken; both tries
    // are reported.
    let mut tries = Vec::new();
    let control = loop {
        let mut args = common.to_vec();
        args.extend(["--session-cgroups", "false"]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (b, hogs) = env.block_on("control", attack(serve.pid(), &x, &y))??;
        if !b.starts_with("FORKED 30") {
            let before = if tries.is_empty() {
                String::new()
            } else {
                format!("; at the first try {}", tries.join("; "))
            };
            break format!("with --session-cgroups false Y got {b:?} (X: {hogs:?}){before}");
        }
        tries.push(format!("Y still forked 30: {b}; X: {hogs:?}"));
        if tries.len() == 2 {
            return Err(format!(
                "without session cgroups, twice: {}; the attack is broken",
                tries.join("; ")
            ));
        }
    };
    let serve = Serve::start(env, &["x", "y"], &common)?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (b, hogs) = env.block_on("attack", attack(serve.pid(), &x, &y))??;
    Ok(Outcome {
        control,
        blocked: b.starts_with("FORKED 30 "),
        evidence: format!("Y's cell: {b:?} (its own result); X's cells: {hogs:?}"),
    })
}
