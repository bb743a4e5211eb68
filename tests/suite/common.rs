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

/// (pid, state, cmdline) of every direct child of this process.
pub fn children() -> Vec<(i32, char, String)> {
    let me = std::process::id() as i32;
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
        let (Some(state), Some(ppid)) = (rest.first(), rest.get(1)) else {
            continue;
        };
        if ppid.parse::<i32>().ok() == Some(me) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            out.push((pid, state.chars().next().unwrap_or('?'), cmd));
        }
    }
    out
}
