//! Starting one process for a run (the supervisor, or an unsandboxed control),
//! feeding it, bounding it, and finding anything it left behind.

use super::cgroup::RunCgroup;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// The wrapper that joins the run's cgroup before exec'ing the real program,
/// so nothing the program starts can be outside it: `$0` is the cgroup's
/// `cgroup.procs`, `$@` the program and its arguments.
const JOIN_CGROUP: &str = "echo $$ > \"$0\" || exit 97; exec \"$@\"";
const JOIN_FAILED: i32 = 97;

pub(crate) struct Launch {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// Start from an empty environment (control runs); else inherit ours.
    pub(crate) clear_env: bool,
    pub(crate) cwd: Option<PathBuf>,
    /// When to give up on the process and kill it.
    pub(crate) deadline: Duration,
    pub(crate) stdout_cap: usize,
    pub(crate) stderr_cap: usize,
    /// Sample the process's peak RSS while it runs.
    pub(crate) watch_rss: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stdout_total: u64,
    pub(crate) stderr: Vec<u8>,
    pub(crate) status: Option<ExitStatus>,
    /// The harness had to kill the process at `deadline`.
    pub(crate) deadline_hit: bool,
    pub(crate) peak_rss_kb: Option<u64>,
    /// Processes from this run alive after it ended (then killed).
    pub(crate) survivors: Vec<String>,
    pub(crate) elapsed: Duration,
}

fn reader(mut r: impl Read + Send + 'static, cap: usize) -> Receiver<(Vec<u8>, u64)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send((kept, total));
    });
    rx
}

fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn describe(pid: i32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_owned()
        })
        .unwrap_or_default();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_default();
    let mut cmd: String = cmd.chars().take(80).collect();
    if cmd.is_empty() {
        cmd = format!("[{comm}]");
    }
    format!("pid {pid} `{cmd}`")
}

/// Processes whose command line or name carries `marker`.
pub(crate) fn marker_scan(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let short = &marker[..marker.len().min(15)];
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim() == short || cmd.windows(marker.len()).any(|w| w == marker.as_bytes())
        })
        .collect()
}

fn kill_pid(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Run `launch` to completion (or its deadline). `stdin_for` gets the pid of
/// the started program (the supervisor's pid is a placeholder in attacks) and
/// returns what to write on its stdin; `started` runs once it is up.
pub(crate) fn run(
    launch: &Launch,
    cgroup: Option<&RunCgroup>,
    marker: &str,
    stdin_for: impl FnOnce(u32) -> Result<Vec<u8>, String>,
    started: impl FnOnce(),
) -> Result<Outcome, String> {
    let mut cmd = match cgroup {
        Some(cg) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg(JOIN_CGROUP)
                .arg(cg.procs_file())
                .arg(&launch.program);
            c
        }
        None => Command::new(&launch.program),
    };
    cmd.args(&launch.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if launch.clear_env {
        cmd.env_clear();
    }
    for (k, v) in &launch.env {
        cmd.env(k, v);
    }
    if let Some(d) = &launch.cwd {
        cmd.current_dir(d);
    }
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("failed to start {}: {e}", launch.program.display()))?;
    let pid = child.id();
    let out_rx = child.stdout.take().map(|s| reader(s, launch.stdout_cap));
    let err_rx = child.stderr.take().map(|s| reader(s, launch.stderr_cap));
    let input = match stdin_for(pid) {
        Ok(i) => i,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(cg) = cgroup {
                cg.kill_all();
            }
            return Err(e);
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    started();
    let mut out = Outcome::default();
    let mut last_sample = Instant::now() - Duration::from_secs(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "failed to wait for {}: {e}",
                    launch.program.display()
                ))
            }
        }
        if launch.watch_rss && last_sample.elapsed() >= Duration::from_millis(50) {
            last_sample = Instant::now();
            if let Some(kb) = peak_rss_kb(pid) {
                out.peak_rss_kb = Some(out.peak_rss_kb.unwrap_or(0).max(kb));
            }
        }
        if t0.elapsed() >= launch.deadline {
            out.deadline_hit = true;
            if let Some(cg) = cgroup {
                cg.kill_all();
            }
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    out.elapsed = t0.elapsed();
    if let Some(st) = status {
        if cgroup.is_some()
            && st.code() == Some(JOIN_FAILED)
            && out.elapsed < Duration::from_secs(1)
        {
            return Err("the run's wrapper could not join its cgroup".into());
        }
    }
    out.status = status;
    // Survivors: anything left in the run's cgroup once the pid namespace
    // (if any) had a moment to tear down, and anything carrying the marker.
    let mut survivors: Vec<i32> = match cgroup {
        Some(cg) => cg.wait_empty(Duration::from_millis(500)),
        None => Vec::new(),
    };
    for pid in marker_scan(marker) {
        if !survivors.contains(&pid) {
            survivors.push(pid);
        }
    }
    out.survivors = survivors.iter().map(|&p| describe(p)).collect();
    for &p in &survivors {
        kill_pid(p);
    }
    if let Some(cg) = cgroup {
        cg.kill_all();
    }
    let grace = Duration::from_secs(3);
    if let Some(rx) = out_rx {
        if let Ok((b, total)) = rx.recv_timeout(grace) {
            out.stdout = b;
            out.stdout_total = total;
        }
    }
    if let Some(rx) = err_rx {
        if let Ok((b, _)) = rx.recv_timeout(grace) {
            out.stderr = b;
        }
    }
    Ok(out)
}
