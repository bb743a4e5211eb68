//! Call-record memory: a cell makes the supervisor remember as much as it
//! can about its calls (40 calls under 1.2 MB capability names, 880 under
//! distinct names, 60 `emit` events of 1 MB each: within the run's call
//! budget of 1000), so that the shared
//! server's memory grows with one client's cell.
//!
//! Defence: the server process's peak resident memory (host
//! `/proc/<serve pid>/status` VmHWM) grows by less than 64 MiB, and the
//! result keeps a bounded share of the records (`truncated.calls`).
//!
//! Control: there is no switch that turns the record caps off; the
//! control is that the calls were really made and answered: the
//! supervisor's own count (`truncated.calls.total`, `usage.calls`) is at
//! least the number the cell made, and the kept records are answered
//! `unknown`.

use super::harness::{python, session, Env, Serve};
use super::Outcome;

const HUGE: usize = 40;
/// The three together stay within the run's call budget (1000).
const SMALL: usize = 880;
const EMITS: usize = 60;

fn code() -> String {
    format!(
        r#"huge = 0
for i in range({HUGE}):
    try:
        call(("%07d" % i) + "x" * 1200000)
    except Exception:
        huge += 1
small = 0
for i in range({SMALL}):
    try:
        call("no_such_capability_%06d_" % i + "y" * 100)
    except Exception:
        small += 1
refused_emits = 0
for i in range({EMITS}):
    try:
        emit({{"i": i, "pad": "z" * 1000000}})
    except Exception:
        refused_emits += 1
print("refused", huge, small, refused_emits)
"#
    )
}

fn hwm_kb(pid: i32) -> Result<u64, String> {
    // The front binary replaces itself with the engine: the same pid.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| format!("the server's exe: {e}"))?;
    if !exe.to_string_lossy().contains("cellbox-engine") {
        return Err(format!("pid {pid} is {}, not the server", exe.display()));
    }
    super::harness::proc_line(pid, "status", "VmHWM:")
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .ok_or_else(|| format!("no VmHWM for the server (pid {pid})"))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let serve = Serve::start(
        env,
        &["x", "y"],
        &[
            "--language",
            "python",
            "--allow",
            "emit",
            "--max-sessions",
            "4",
        ],
    )?;
    let x = serve.client(env, "x")?;
    let y = serve.client(env, "y")?;
    // Warm up (a zygote, a first cell) before the baseline.
    let (sx, sy) = env.block_on("sessions", async {
        Ok::<_, String>((session(&x).await?, session(&y).await?))
    })??;
    let warm = env.block_on("warm-up", python(&y, Some(&sy), "1", 10))?;
    if warm.is_error {
        return Err(format!("warm-up failed: {}", warm.all_text()));
    }
    let before = hwm_kb(serve.pid())?;
    let a = env.block_on("attack", python(&x, Some(&sx), &code(), 30))?;
    let after = hwm_kb(serve.pid())?;
    let s = a
        .structured
        .clone()
        .ok_or_else(|| format!("no result: {}", a.all_text()))?;
    let total = s["truncated"]["calls"]["total"].as_u64();
    let kept = s["truncated"]["calls"]["kept"].as_u64();
    let records = s["calls"].as_array().map_or(0, Vec::len);
    let unknown = s["calls"].as_array().map_or(0, |c| {
        c.iter().filter(|r| r["outcome"] == "unknown").count()
    });
    let made = (HUGE + SMALL + EMITS) as u64;
    let control_ok = total.is_some_and(|t| t >= made) && unknown > 0;
    if !control_ok {
        return Err(format!(
            "the supervisor counted {total:?} calls of {made} made ({unknown} kept as unknown): \
             the attack did not make its calls ({})",
            a.text
        ));
    }
    let grew = after.saturating_sub(before);
    let blocked = grew < 64 << 10 && records <= 1000 && kept == Some(records as u64);
    Ok(Outcome {
        control: format!(
            "no switch turns the caps off; the calls were made: the supervisor counted {} \
             (truncated.calls.total, {made} made), kept ones answered unknown",
            total.unwrap_or(0)
        ),
        blocked,
        evidence: format!(
            "server VmHWM {before} kB -> {after} kB (+{grew} kB, bound 65536 kB); {records} \
             call records kept of {}",
            total.unwrap_or(0)
        ),
    })
}
