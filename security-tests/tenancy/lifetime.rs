//! A cell's life is the cell's: what X's cells start does not outlive
//! them, X's idle session runs nothing, and X's state process, which runs
//! X's own interpreter, cannot make the server act on what it sends
//! unasked.
//!
//! - `outlive_cell`: X's cell attaches a child to its parent with
//!   `clone(CLONE_PARENT)` (the zygote's, on a call without a session; the
//!   state process's, in a live session), the child holding a token file
//!   open, and replaces `posix._exit` (which the runtime calls once it has
//!   said `done`) so its own process would linger. Defence: once the call
//!   has returned, no host process holding the token file can run (the
//!   host's `/proc`: gone, a zombie, or SIGKILL pending), and Y's cell
//!   runs meanwhile. Control: no switch turns it off; the host sees the
//!   child holding the token file while the call is in flight (the attack
//!   ran as written). Before, the child ran on for 2 s past the answer on
//!   the sessionless path, and until the session closed in a live one.
//! - `hijacked_shim`: X's cell without a session (the server's warm path)
//!   and a cell of `cellbox run` (a fresh worker) take over the runtime
//!   shim they run in (its globals, through `call.__globals__`): its frame
//!   sender forks a child as the shim sends `done` and writes the child's
//!   pid into the answer, then never returns, forking a child every 20 ms;
//!   `posix._exit` sleeps instead. Defence: once the answer is in (the
//!   call returned, `cellbox run` exited), no host process holding a token
//!   file can run, nor after Y's next cell. Control: the answer names the
//!   child forked at `done` (the taken-over sender ran) and the host saw
//!   the cell's children while it ran.
//! - `idle_session`: X takes over its live session's state loop (the
//!   runtime's globals are one `__globals__` away): each state process
//!   from then on forks a child holding a token file and spins the CPU on
//!   a 50 ms timer, around the real loop. Defence: between X's cells its
//!   session's cgroup counts no CPU time over 1 s (the host's
//!   `cpuacct.usage` of the group the state's children are in, found from
//!   the host's `/proc/PID/cgroup`), its freezer says `FROZEN`, and no
//!   process holding the token file can run. Control: the same group's
//!   count during one of X's cells (the session thawed), which grows.
//! - `unasked_answer`: X's hijacked state process answers a request the
//!   server never made (`spawned` with a pidfd of a child of its own).
//!   Defence: the server records a protocol error for X's session (its
//!   events file), X's cells say the live objects were lost and go on from
//!   the JSON variables, and Y is untouched. Control: no switch turns it
//!   off; X's cell makes a child with a pidfd as the forging state process
//!   does (the forged answer can be built).

use super::harness::{holders, marker, python, session, spawn_exec, Client, Env, Serve};
#[path = "../../tests/shared/hijack.rs"]
mod hijack;
use super::Outcome;
use serde_json::json;
use std::time::{Duration, Instant};

/// Whether host process `pid` can still run code of its own (there, not a
/// zombie, no SIGKILL pending).
fn can_run(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    !status.lines().any(|l| {
        if let Some(state) = l.strip_prefix("State:") {
            let state = state.trim_start();
            return state.starts_with('Z') || state.starts_with('X');
        }
        l.strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << 8) != 0)
    })
}

fn running_holders(token: &str) -> Vec<i32> {
    holders(token).into_iter().filter(|p| can_run(*p)).collect()
}

fn kill_all(pids: &[i32]) {
    for &p in pids {
        // Processes this attack started, by pid.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL);
    }
}

fn clone_parent_code(token: &str) -> String {
    format!(
        r#"import ctypes, os, platform, posix, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {{"x86_64": 56, "aarch64": 220}}[platform.machine()]
pid = libc.syscall(NR, 0x8000 | 17, 0, 0, 0, 0)
if pid == 0:
    f = open({token:?}, "w")
    while True:
        time.sleep(0.01)
if pid < 0:
    raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT)")
posix._exit = lambda code: time.sleep(60)
time.sleep(0.5)
"#
    )
}

/// One call of X's: whether the host saw the token file held while it ran,
/// and the holders that could run once it returned.
async fn outlive_once(
    x: &Client,
    y: &Client,
    sid: Option<&str>,
) -> Result<(bool, Vec<i32>, String), String> {
    let token = marker("cbx-outlive-");
    let mut args = json!({"language": "python", "code": clone_parent_code(&token),
                          "timeout_seconds": 15});
    if let Some(s) = sid {
        args["session_id"] = json!(s);
    }
    let call = spawn_exec(x, args);
    let t0 = Instant::now();
    let mut during = false;
    while !call.is_finished() && t0.elapsed() < Duration::from_secs(30) {
        during |= !holders(&token).is_empty();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let a = super::harness::join(call).await?;
    let alive = running_holders(&token);
    let b = python(y, None, "6 * 7", 10).await;
    let left = holders(&token);
    kill_all(&left);
    if !b.all_text().contains("42") {
        return Err(format!("Y's cell did not run: {}", b.all_text()));
    }
    Ok((during, alive, a.status()))
}

pub fn outlive(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(env, &["x", "y"], &["--language", "python"])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let (warm, live) = env.block_on("attack", async {
        let warm = outlive_once(&x, &y, None).await?;
        let sid = session(&x).await?;
        let first = python(&x, Some(&sid), "x = 1", 10).await;
        if first.status() != "ok" {
            return Err(format!("X's session did not start: {}", first.all_text()));
        }
        let live = outlive_once(&x, &y, Some(&sid)).await?;
        Ok::<_, String>((warm, live))
    })??;
    for (path, (during, _, status)) in [("sessionless", &warm), ("live", &live)] {
        if !during || status != "ok" {
            return Err(format!(
                "{path}: the child never held its token file (status {status:?}): the attack is broken"
            ));
        }
    }
    let blocked = warm.1.is_empty() && live.1.is_empty();
    Ok(Outcome {
        control: "no switch turns it off; on both paths the host saw the CLONE_PARENT child \
                  holding its token file while the call was in flight"
            .into(),
        blocked,
        evidence: format!(
            "processes holding the token file that could still run once the call returned: \
             sessionless {:?}, live session {:?} (host /proc); Y's cell ran",
            warm.1, live.1
        ),
    })
}

/// Where `pid`'s session is counted and frozen, on the host: the v1
/// `cpuacct` and `freezer` directories of its cgroups, or under cgroup v2
/// its one cgroup (the session's leaf) for both.
fn session_dirs(pid: i32) -> Option<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = |controller: &str| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',')
                .any(|c| c == controller)
                .then(|| format!("/sys/fs/cgroup/{controller}{p}"))
        })
    };
    if let Some(dirs) = v1("cpuacct").zip(v1("freezer")) {
        return Some(dirs);
    }
    let v2 = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| format!("/sys/fs/cgroup{p}"))?;
    Some((v2.clone(), v2))
}

/// CPU time (ns) its cgroup at `dir` counts: v1 `cpuacct.usage`, v2
/// `cpu.stat`'s `usage_usec`.
fn usage_ns(dir: &str) -> Result<u64, String> {
    if let Ok(t) = std::fs::read_to_string(format!("{dir}/cpuacct.usage")) {
        return t.trim().parse().map_err(|e| format!("{dir}: {e}"));
    }
    let stat =
        std::fs::read_to_string(format!("{dir}/cpu.stat")).map_err(|e| format!("{dir}: {e}"))?;
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us * 1000)
        .ok_or_else(|| format!("{dir}/cpu.stat has no usage_usec"))
}

/// What the cgroup at `dir` says of its freeze: v1 `freezer.state`, or
/// under v2 `FROZEN` when `cgroup.events` says `frozen 1`.
fn freeze_state(dir: &str) -> String {
    if let Ok(t) = std::fs::read_to_string(format!("{dir}/freezer.state")) {
        return t.trim().to_owned();
    }
    match std::fs::read_to_string(format!("{dir}/cgroup.events")) {
        Ok(t) if t.lines().any(|l| l.trim() == "frozen 1") => "FROZEN".into(),
        Ok(_) => "THAWED".into(),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// CPU time a frozen session's group may count in the second it is
/// watched (see `idle`): 0.2% of it.
const IDLE_SLACK_NS: u64 = 2_000_000;

pub fn idle(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(env, &["x", "y"], &["--language", "python"])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let token = marker("cbx-idle-");
    let seen = env.block_on("attack", async {
        let sid = session(&x).await?;
        for code in [
            "x = 1".to_owned(),
            hijack::state_loop_code(&token),
            "x".to_owned(),
        ] {
            let a = python(&x, Some(&sid), &code, 10).await;
            if a.status() != "ok" {
                return Err(format!("X's cell failed: {}", a.all_text()));
            }
        }
        // A cell of X's that sleeps: the hijacked state runs meanwhile,
        // and its children show where the session's group is.
        let call = spawn_exec(
            &x,
            json!({"language": "python", "code": "import time\ntime.sleep(1.5)\nx",
                   "session_id": sid, "timeout_seconds": 10}),
        );
        let mut dirs = None;
        let t0 = Instant::now();
        while dirs.is_none() && t0.elapsed() < Duration::from_secs(5) {
            if let Some(p) = holders(&token).first() {
                dirs = session_dirs(*p);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (cpu, freezer) =
            dirs.ok_or("the hijacked state forked no child during X's cell: the attack is broken")?;
        let before = usage_ns(&cpu)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = usage_ns(&cpu)? - before;
        let a = super::harness::join(call).await?;
        if a.status() != "ok" {
            return Err(format!("X's sleeping cell failed: {}", a.all_text()));
        }
        // Between cells: frozen once the session has settled.
        let t0 = Instant::now();
        let mut state = String::new();
        while t0.elapsed() < Duration::from_secs(10) {
            state = freeze_state(&freezer);
            if state == "FROZEN" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let a0 = usage_ns(&cpu)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = usage_ns(&cpu)? - a0;
        let running = running_holders(&token);
        let b = python(&y, None, "6 * 7", 10).await;
        if !b.all_text().contains("42") {
            return Err(format!("Y's cell did not run: {}", b.all_text()));
        }
        Ok::<_, String>((during, idle, state, running))
    })??;
    kill_all(&holders(&token));
    let (during, idle, state, running) = seen;
    if during == 0 {
        return Err("X's session used no CPU while its cell ran: the attack is broken".into());
    }
    Ok(Outcome {
        control: format!(
            "during X's cell (the session thawed) its group counted {} ms of CPU in 0.5 s",
            during / 1_000_000
        ),
        // Frozen means nothing of it runs: the hijacked loop spins on a
        // 50 ms timer (hundreds of ms a second, as the control shows); a
        // cgroup v2 count may still take in a few hundred microseconds of
        // the freeze itself (each task enters the freezer through the
        // kernel's signal path), never anything of the tenant's code.
        blocked: idle < IDLE_SLACK_NS && state == "FROZEN" && running.is_empty(),
        evidence: format!(
            "between X's cells its group counted {idle} ns of CPU in 1 s (host cgroup), \
             freezer {state:?}, token holders that could run: {running:?}; Y's cell ran"
        ),
    })
}

const FORGER: &str = r#"import ctypes, os, platform, time
G = call.__globals__
serve = G["_state_serve"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": 56, "aarch64": 220}[platform.machine()]

def child_with_pidfd():
    fd = ctypes.c_int(-1)
    pid = libc.syscall(NR, 0x1000 | 17, 0, ctypes.byref(fd), 0, 0)
    if pid == 0:
        while True:
            time.sleep(0.01)
    return pid, fd

# The forged answer can be built here: a child and its pidfd.
pid, fd = child_with_pidfd()
if pid > 0 and fd.value >= 0:
    print("PIDFD", fd.value)
    os.kill(pid, 9)
    os.waitpid(pid, 0)

def hijacked():
    pid, fd = child_with_pidfd()
    G["_state_serve"] = serve
    real = G["_zsend"]
    def forge(obj, fds=()):
        real(obj, fds)
        if obj.get("op") == "ready" and fd.value >= 0:
            real({"op": "spawned", "id": 424242, "pid": pid}, (fd.value,))
    G["_zsend"] = forge
    serve()

G["_state_serve"] = hijacked
"#;

pub fn unasked(env: &Env) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let events = dir.path().join("events.jsonl");
    let events_arg = events.to_string_lossy().into_owned();
    let serve = Serve::start(
        env,
        &["x", "y"],
        &["--language", "python", "--events", &events_arg],
    )?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let code = FORGER;
    let seen = env.block_on("attack", async {
        let sx = session(&x).await?;
        let sy = session(&y).await?;
        for (c, s, code) in [(&x, &sx, "v = 5"), (&y, &sy, "w = 7")] {
            let a = python(c, Some(s), code, 10).await;
            if a.status() != "ok" {
                return Err(format!("a first cell failed: {}", a.all_text()));
            }
        }
        let forged = python(&x, Some(&sx), code, 10).await;
        let next = python(&x, Some(&sx), "v", 10).await;
        let yours = python(&y, Some(&sy), "w", 10).await;
        Ok::<_, String>((forged, next, yours))
    })??;
    let (forged, next, yours) = seen;
    if !forged.stdout().contains("PIDFD ") {
        return Err(format!(
            "X's cell could not make a child with a pidfd: the attack is broken: {}",
            forged.all_text()
        ));
    }
    let forged = forged.all_text();
    let recorded = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"state_protocol_error\"") && l.contains("424242"));
    let said = [forged.as_str(), next.all_text().as_str()]
        .iter()
        .any(|t| t.contains("broke its protocol"));
    let value = |a: &super::ToolAnswer| a.structured.as_ref().map(|v| v["value"].clone());
    let x_went_on = next.status() == "ok" && value(&next) == Some(json!(5));
    let y_untouched = yours.status() == "ok" && value(&yours) == Some(json!(7));
    Ok(Outcome {
        control: "no switch turns it off; X's cell made a child with a pidfd (clone with \
                  CLONE_PIDFD), as its hijacked state process does to forge its answer"
            .into(),
        blocked: recorded && said && x_went_on && y_untouched,
        evidence: format!(
            "the server's events record a state protocol error for request 424242: {recorded}; \
             X's results say its state broke its protocol: {said}; X's next cell ran from its \
             JSON variables: {x_went_on}; Y's session untouched: {y_untouched}"
        ),
    })
}

/// One hijacked cell of X's without a session, on the server's warm path:
/// whether the host saw the token held while it ran, the answer's value,
/// and the holders that could run once it returned and after Y's cell.
async fn hijacked_sessionless(x: &Client, y: &Client) -> Result<Hijacked, String> {
    let token = marker("cbx-hijack-warm-");
    let call = spawn_exec(
        x,
        json!({"language": "python", "code": hijack::shim_sender_code(&token),
               "timeout_seconds": 15}),
    );
    let t0 = Instant::now();
    let mut during = false;
    while !call.is_finished() && t0.elapsed() < Duration::from_secs(30) {
        during |= !holders(&token).is_empty();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let a = super::harness::join(call).await?;
    let alive = running_holders(&token);
    let b = python(y, None, "6 * 7", 10).await;
    let after = running_holders(&token);
    kill_all(&holders(&token));
    if !b.all_text().contains("42") {
        return Err(format!("Y's cell did not run: {}", b.all_text()));
    }
    let value = a
        .structured
        .as_ref()
        .and_then(|v| v["value"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok(Hijacked {
        during,
        value,
        alive,
        after,
    })
}

/// The same cell through `cellbox run` (a fresh worker, no pool): the
/// answer is in once the command has exited.
fn hijacked_fresh(env: &Env) -> Result<Hijacked, String> {
    use std::io::Write;
    let token = marker("cbx-hijack-fresh-");
    let mut child = std::process::Command::new(&env.cellbox)
        .args(["run", "--lang", "python", "--json", "--timeout", "15", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cellbox run: {e}"))?;
    let code = hijack::shim_sender_code(&token);
    child
        .stdin
        .take()
        .ok_or("cellbox run: no stdin")?
        .write_all(code.as_bytes())
        .map_err(|e| format!("cellbox run's stdin: {e}"))?;
    let t0 = Instant::now();
    let mut during = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < Duration::from_secs(30) => {}
            Ok(None) => {
                let _ = child.kill();
                return Err("cellbox run did not end in 30 s".into());
            }
            Err(e) => return Err(format!("cellbox run: {e}")),
        }
        during |= !holders(&token).is_empty();
        std::thread::sleep(Duration::from_millis(10));
    }
    let alive = running_holders(&token);
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cellbox run: {e}"))?;
    std::thread::sleep(Duration::from_millis(200));
    let after = running_holders(&token);
    kill_all(&holders(&token));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "cellbox run printed no result ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    Ok(Hijacked {
        during,
        value: result["value"].as_str().unwrap_or_default().to_owned(),
        alive,
        after,
    })
}

/// What one hijacked cell showed (see `hijacked_shim`).
struct Hijacked {
    during: bool,
    value: String,
    alive: Vec<i32>,
    after: Vec<i32>,
}

pub fn hijacked_shim(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(env, &["x", "y"], &["--language", "python"])?;
    let (x, y) = (serve.client(env, "x")?, serve.client(env, "y")?);
    let warm = env.block_on("attack", hijacked_sessionless(&x, &y))??;
    let fresh = hijacked_fresh(env)?;
    for (path, h) in [("sessionless", &warm), ("fresh", &fresh)] {
        if !h.during || !h.value.starts_with("hijacked, forked ") || h.value.contains("forked 0 ") {
            return Err(format!(
                "{path}: the taken-over sender did not answer or no child was seen (value {:?}, \
                 seen {}): the attack is broken",
                h.value, h.during
            ));
        }
    }
    Ok(Outcome {
        control: format!(
            "the answers came through the taken-over sender ({:?}, {:?}) and the host saw the \
             cells' children while they ran",
            warm.value, fresh.value
        ),
        blocked: [&warm, &fresh]
            .iter()
            .all(|h| h.alive.is_empty() && h.after.is_empty()),
        evidence: format!(
            "token holders that could run once the answer was in: sessionless {:?} (after Y's \
             cell {:?}), fresh {:?} (after 200 ms {:?}) (host /proc)",
            warm.alive, warm.after, fresh.alive, fresh.after
        ),
    })
}
