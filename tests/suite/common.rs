//! Helpers shared by the integration tests.
#![allow(dead_code)]

use cellbox::{CellRequest, CellResult, Language, Policy, Session, SessionConfig, Supervisor};
use std::path::PathBuf;

/// The cellbox binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cellbox"))
}

pub fn supervisor() -> Supervisor {
    Supervisor::builder().worker_exe(bin()).build().unwrap()
}

pub fn config(allow: &[&str]) -> SessionConfig {
    let mut policy = Policy::deny_all();
    for a in allow {
        policy.allow.insert((*a).to_owned());
    }
    SessionConfig {
        policy,
        ..SessionConfig::default()
    }
}

pub async fn rhai(session: &Session, code: &str) -> CellResult {
    session.run(CellRequest::new(Language::Rhai, code)).await
}

pub async fn run_once(lang: Language, code: &str, allow: &[&str]) -> CellResult {
    supervisor()
        .run(CellRequest::new(lang, code), config(allow))
        .await
}

/// Run the binary with arguments and optional stdin.
pub fn cellbox(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut si = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            let _ = si.write_all(s.as_bytes());
        }
    }
    child.wait_with_output().unwrap()
}

/// Open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// (pid, ppid, state, cmdline) of every process.
fn all_processes() -> Vec<(i32, i32, char, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(rp) = stat.rfind(')') else { continue };
        let rest: Vec<&str> = stat[rp + 2..].split_whitespace().collect();
        let (Some(state), Some(Ok(ppid))) = (rest.first(), rest.get(1).map(|p| p.parse::<i32>()))
        else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.push((pid, ppid, state.chars().next().unwrap_or('?'), cmd));
    }
    out
}

/// Whether `pid` is a fork-server spare: a sandboxed child waiting for a
/// cell it has not been given (it renames itself when it gets one), or one
/// just forked that has not named itself yet (a child of the inner fork
/// server not named `cellbox-cell`).
pub fn is_spare(pid: i32) -> bool {
    let comm = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .map(|c| c.trim_end().to_owned())
            .unwrap_or_default()
    };
    let name = comm(pid);
    if name == "cellbox-spare" {
        return true;
    }
    if name == "cellbox-cell" {
        return false;
    }
    // Forked (not executed) from the fork server, so the same command
    // line; its parent is the inner server, whose parent is the outer one.
    let parent = |p: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let rp = stat.rfind(')')?;
        stat[rp + 2..].split_whitespace().nth(1)?.parse().ok()
    };
    let forkserver = |p: i32| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).contains("__forkserver"))
            .unwrap_or(false)
    };
    let Some(inner) = parent(pid) else {
        return false;
    };
    let Some(outer) = parent(inner) else {
        return false;
    };
    forkserver(pid) && forkserver(inner) && forkserver(outer)
}

/// (pid, state, cmdline) of every cell worker descended from this process:
/// direct workers and fork-server children alike (not the fork server, not
/// its waiting spares).
pub fn children() -> Vec<(i32, char, String)> {
    let me = std::process::id() as i32;
    let all = all_processes();
    let inner = fork_servers(&all);
    all.into_iter()
        .filter(|p| (p.1 == me && !p.3.contains("__forkserver")) || inner.contains(&p.1))
        .filter(|p| !is_spare(p.0))
        .map(|p| (p.0, p.2, p.3))
        .collect()
}

/// The fork servers of this process's supervisors. A fork server runs as
/// two processes: the outer one (our child) waits for the inner one, PID 1
/// of the pool's namespaces, which forks cells; this is the inner one.
fn fork_servers(all: &[(i32, i32, char, String)]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let outer: Vec<i32> = all
        .iter()
        .filter(|p| p.1 == me && p.3.contains("__forkserver"))
        .map(|p| p.0)
        .collect();
    all.iter()
        .filter(|p| outer.contains(&p.1))
        .map(|p| p.0)
        .collect()
}

/// The workers (pid, comm) forked by the fork server whose outer process is
/// `server`: its spares and its running cells.
pub fn forked_by(server: u32) -> Vec<(i32, String)> {
    let all = all_processes();
    let inner: Vec<i32> = all
        .iter()
        .filter(|p| p.1 == server as i32)
        .map(|p| p.0)
        .collect();
    all.iter()
        .filter(|p| inner.contains(&p.1))
        .map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.0)).unwrap_or_default();
            (p.0, comm.trim_end().to_owned())
        })
        .collect()
}

/// The spares waiting in this process's fork servers.
pub fn spares() -> Vec<i32> {
    let all = all_processes();
    let inner = fork_servers(&all);
    all.iter()
        .filter(|p| inner.contains(&p.1) && is_spare(p.0))
        .map(|p| p.0)
        .collect()
}

/// Python: 8 children each touch 300 MiB and hold it until released;
/// `held_killed` is then [children that still held it at release, children
/// killed by SIGKILL]. Append `held_killed` (a cell's value) or
/// `print(*held_killed)`.
pub const MEMORY_FORK_PY: &str = r#"
import os
N, SIZE = 8, 300 << 20
release_r, release_w = os.pipe()
kids = []
for i in range(N):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r); os.close(release_w)
        b = bytearray(SIZE)
        for j in range(0, SIZE, 4096):
            b[j] = 1
        os.write(w, b"1")
        os.read(release_r, 1)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
for pid, r in kids:
    os.read(r, 1)
os.close(release_w)
ends = [os.waitpid(pid, 0)[1] for pid, _ in kids]
held_killed = [sum(1 for s in ends if os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0),
               sum(1 for s in ends if os.WIFSIGNALED(s) and os.WTERMSIG(s) == 9)]
"#;
