//! `cellbox serve` run as a service: `/healthz` and `/readyz`, and the drain
//! on SIGTERM, driven by the official MCP Python SDK
//! (tests/clients/drain_client.py) against a real `serve --http`.

use super::clients::installed;
use super::common::bin;
use super::common::procs::descendants;
use super::common::serve::http_serve;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the server gets past its drain timeout to exit, and the client
/// to finish (both take seconds when they work).
const PATIENCE: Duration = Duration::from_secs(120);

/// `GET path` on `addr` (host:port); the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// What server `pid` made on the host: its scratch root, its cgroups.
fn leftovers(pid: u32) -> Vec<PathBuf> {
    let mine = |dir: &Path, prefix: String| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut v = mine(&std::env::temp_dir(), format!("cellbox-scratch-{pid}-"));
    v.extend(mine(
        &std::env::temp_dir(),
        format!("cellbox-forkserver-{pid}-"),
    ));
    let cgroups = Path::new("/sys/fs/cgroup");
    for c in std::fs::read_dir(cgroups).into_iter().flatten().flatten() {
        v.extend(mine(&c.path(), format!("cellbox-{pid}-")));
    }
    v.extend(mine(cgroups, format!("cellbox-{pid}-")));
    v
}

/// A process as seen once: its pid and start time (against pid reuse).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    // After the name: state is the 1st field, starttime the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Every process seen below `root` until `stop`, polled.
fn watch_descendants(root: i32, stop: Arc<AtomicBool>) -> Arc<Mutex<BTreeSet<(i32, u64)>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let out = seen.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            for pid in descendants(root) {
                if let Some(t) = start_time(pid) {
                    seen.lock().unwrap().insert((pid, t));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    out
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not exit within {within:?} of the drain");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start `serve --http` with `drain_timeout`, run the drain client in
/// `mode` against it, and check the server exits 0 leaving nothing behind.
fn drain(mode: &str, drain_timeout: u64) {
    let python = installed("py1/bin/python");
    let (mut server, announced) = http_serve(Command::new(bin()).args([
        "serve",
        "--http",
        "127.0.0.1:0",
        "--language",
        "python",
        "--timeout",
        "300",
        "--drain-timeout",
        &drain_timeout.to_string(),
    ]));
    let addr = announced.trim().trim_end_matches('/').to_owned();
    let pid = server.id();
    assert_eq!(get(&addr, "/healthz").0, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = watch_descendants(pid as i32, stop.clone());

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/drain_client.py");
    let client = Command::new(python)
        .arg(script)
        .args([mode, &format!("http://{addr}/"), &pid.to_string()])
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    eprintln!(
        "--- drain client ---\n{out}--- stderr ---\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(client.status.success(), "the drain client failed");
    assert!(out.contains("PASS"), "the drain client did not finish");

    let status = wait_exit(&mut server, Duration::from_secs(drain_timeout) + PATIENCE);
    stop.store(true, Ordering::Release);
    assert_eq!(status.code(), Some(0), "the server's exit after a drain");
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.is_empty(),
        "no worker of the server was ever seen (the watch is broken)"
    );
    let alive: Vec<_> = seen
        .iter()
        .filter(|(p, t)| start_time(*p) == Some(*t))
        .collect();
    assert!(alive.is_empty(), "processes left behind: {alive:?}");
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A 5 s cell started before SIGTERM still ends `ok` for its client while
/// `/readyz` says 503 draining, a new call gets "server is draining" and a
/// new connection HTTP 503 with Retry-After; the server then exits 0 and
/// leaves no scratch, cgroup or process behind.
#[test]
fn sigterm_drains_running_cells_and_refuses_new_calls() {
    drain("finish", 25);
}

/// A cell still running when the drain timeout passes is killed and its
/// client gets `killed` with error type `Draining`, not a dropped
/// connection.
#[test]
fn a_cell_past_the_drain_timeout_is_killed_as_draining() {
    drain("expire", 3);
}

/// The probes need no token: a server that requires one still answers
/// them, and only them, without it.
#[test]
fn health_and_readiness_need_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "ops-test-token-0123456789\n").unwrap();
    let (mut server, announced) = http_serve(Command::new(bin()).args([
        "serve",
        "--http",
        "127.0.0.1:0",
        "--language",
        "rhai",
        "--token-file",
        &tokens.to_string_lossy(),
    ]));
    let addr = announced.trim().trim_end_matches('/').to_owned();
    let (status, body) = get(&addr, "/healthz");
    assert_eq!((status, body.trim()), (200, r#"{"status":"ok"}"#));
    // Ready once the warm workers are up and the sandbox probed.
    let t0 = Instant::now();
    loop {
        let (status, body) = get(&addr, "/readyz");
        if status == 200 {
            assert_eq!(body.trim(), r#"{"status":"ready"}"#);
            break;
        }
        assert_eq!(status, 503, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "not_ready", "{body}");
        assert!(
            t0.elapsed() < PATIENCE,
            "never ready: {body} (the warm workers start without a client)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Anything else still needs the token.
    assert_eq!(get(&addr, "/").0, 401);
    assert_eq!(get(&addr, "/metrics-or-anything").0, 401);
    let _ = server.kill();
    let _ = server.wait();
}
