//! Process count: one session takes every process it can so that another
//! principal's cells cannot fork.
//!
//! X runs three cells at once (so that every zygote of the pool carries
//! one); each forks until refused and holds its children. Then Y's cell
//! forks 30 children. Defence (a pids cgroup per session and cell,
//! RLIMIT_NPROC lifted for warm cells): Y's 30 forks succeed (Y's own
//! result).
//!
//! Control: `--session-cgroups false`: RLIMIT_NPROC is counted per user of
//! the zygote's user namespace, shared by every cell of that zygote, and
//! Y's forks are refused.

use super::harness::{marker, python, session, spawn_exec, wait_holders, Client, Env, Serve};
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

async fn attack(x: &Client, y: &Client) -> Result<(String, Vec<String>), String> {
    let sy = session(y).await?;
    let mut hogs = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let t = marker("cbx-pids-");
        hogs.push(spawn_exec(
            x,
            json!({"language": "python", "code": hog(&t), "timeout_seconds": 20}),
        ));
        tokens.push(t);
    }
    for t in &tokens {
        wait_holders(t, Duration::from_secs(15)).await?;
    }
    let b = python(y, Some(&sy), VICTIM, 20).await;
    let mut said = Vec::new();
    for h in hogs {
        said.push(super::harness::join(h).await?.stdout().trim().to_owned());
    }
    Ok((b.stdout().trim().to_owned(), said))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let common = ["--language", "python", "--max-concurrency", "4"];
    let control = {
        let mut args = common.to_vec();
        args.extend(["--session-cgroups", "false"]);
        let serve = Serve::start(env, &["x", "y"], &args)?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let (b, hogs) = env.block_on("control", attack(&x, &y))??;
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
    let (b, hogs) = env.block_on("attack", attack(&x, &y))??;
    Ok(Outcome {
        control,
        blocked: b == "FORKED 30",
        evidence: format!("Y's cell: {b:?} (its own result); X's cells: {hogs:?}"),
    })
}
