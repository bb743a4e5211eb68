//! Early done: a cell says it is over while a process of its tree lives
//! on, to get its slot, scratch and session back for the next cell while
//! that process keeps working (or keeps a file open in the scratch).
//!
//! The attacker's Python cell forks a child that tries to leave the cell's
//! session and process group (`setsid`) and forks again; the grandchild
//! keeps a file named with a fresh token open. The cell then writes its
//! own `done` frame on the protocol channel (fd 3) and sleeps, as if it
//! were still working.
//!
//! Defence: once the call has returned, no host process holds the token
//! file open (the host's `/proc/*/fd`), and the other principal's session
//! runs a cell meanwhile.
//!
//! Control: `serve --session-cgroups false` shows the attack running as
//! written: while the call is in flight the host sees the grandchild
//! holding the token file, and the forged `done` is taken (the call
//! returns `ok` long before the cell's sleep ends). It does not show the
//! grandchild surviving: the Python profile denies `setsid` and `setpgid`,
//! so it stays in the cell's process group, which the zygote kills when
//! the cell ends (a second layer beneath the cell's cgroup; `serve` has no
//! switch for it).

use super::harness::{holders, marker, session, Client, Env, Serve};
use super::Outcome;
use serde_json::json;
use std::time::{Duration, Instant};

fn attack_code(token: &str) -> String {
    format!(
        r#"import os, time
if os.fork() == 0:
    try:
        try:
            os.setsid()
        except OSError:
            pass
        if os.fork() == 0:
            f = open({token:?}, "w")
            time.sleep(20)
    finally:
        os._exit(0)
time.sleep(0.5)
frame = b'{{"t":"done","status":"ok","value":null}}'
os.write(3, len(frame).to_bytes(4, "big") + frame)
time.sleep(20)
"#
    )
}

/// What the host saw: the token file held while the call was in flight,
/// the processes holding it right after the call returned, the call's
/// status and how long it took.
struct Seen {
    during: bool,
    left: Vec<i32>,
    status: String,
    took: Duration,
}

async fn attack(x: &Client, y: &Client, token: &str) -> Result<Seen, String> {
    let sx = session(x).await?;
    let sy = session(y).await?;
    let t0 = Instant::now();
    let call = super::harness::spawn_exec(
        x,
        json!({"language": "python", "code": attack_code(token), "session_id": sx,
               "timeout_seconds": 15}),
    );
    let mut during = false;
    while !call.is_finished() && t0.elapsed() < Duration::from_secs(30) {
        during |= !holders(token).is_empty();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = super::harness::join(call).await?;
    let took = t0.elapsed();
    let left = holders(token);
    // The other principal's session goes on working.
    let b = super::harness::python(y, Some(&sy), "6 * 7", 10).await;
    if !b.all_text().contains("42") {
        return Err(format!("Y's cell did not run: {}", b.all_text()));
    }
    Ok(Seen {
        during,
        left,
        status: a.status(),
        took,
    })
}

fn kill_all(pids: &[i32]) {
    for &p in pids {
        // Processes this attack started, by pid.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL);
    }
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let control = {
        let serve = Serve::start(
            env,
            &["x", "y"],
            &["--language", "python", "--session-cgroups", "false"],
        )?;
        let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
        let token = marker("cbx-early-");
        let seen = env.block_on("control", attack(&x, &y, &token))??;
        kill_all(&seen.left);
        if !seen.during || seen.status != "ok" || seen.took > Duration::from_secs(10) {
            return Err(format!(
                "without session cgroups: token file held during the call: {}, status {:?} \
                 after {:?}; the attack is broken",
                seen.during, seen.status, seen.took
            ));
        }
        format!(
            "with --session-cgroups false the grandchild held the token file while the call \
             was in flight and the forged done was taken (ok after {:.1}s of a 20 s sleep); \
             {} host process(es) held it after the call (setsid is denied: the zygote's \
             process-group kill is a second layer)",
            seen.took.as_secs_f64(),
            seen.left.len()
        )
    };
    let serve = Serve::start(env, &["x", "y"], &["--language", "python"])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let token = marker("cbx-early-");
    let seen = env.block_on("attack", attack(&x, &y, &token))??;
    kill_all(&seen.left);
    if !seen.during {
        return Err("the grandchild never held its token file: the attack did not run".into());
    }
    Ok(Outcome {
        control,
        blocked: seen.left.is_empty(),
        evidence: if seen.left.is_empty() {
            format!(
                "after the call returned ({} after {:.1}s) no host process held the token file \
                 (host /proc/*/fd); Y's next cell ran",
                seen.status,
                seen.took.as_secs_f64()
            )
        } else {
            format!(
                "after the call returned ({}) host pid(s) {:?} of the cell still held the token \
                 file",
                seen.status, seen.left
            )
        },
    })
}
