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

/// Spawn `cmd` (a `serve --http ... --metrics ...`); its MCP and metrics
/// addresses as it announces them.
fn serve_with_metrics(cmd: &mut Command) -> (Child, String, String) {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("[serve] {line}");
            let _ = tx.send(line);
        }
    });
    let (mut mcp, mut metrics) = (None, None);
    while mcp.is_none() || metrics.is_none() {
        let line = rx
            .recv_timeout(PATIENCE)
            .expect("the server did not announce its addresses");
        if let Some(rest) = line.split("MCP over streamable HTTP at http://").nth(1) {
            mcp = Some(rest.trim().trim_end_matches('/').to_owned());
        }
        if let Some(rest) = line.split("Prometheus metrics on http://").nth(1) {
            metrics = Some(rest.trim().to_owned());
        }
    }
    (child, mcp.unwrap(), metrics.unwrap())
}

/// `/metrics` parses with the official Prometheus text parser, and its
/// counters move by exactly the cells, tool and capability calls,
/// refusals and sessions a client makes (tests/clients/metrics_client.py);
/// the probes answer on the metrics listener too.
#[test]
fn metrics_parse_and_count_exactly_what_the_calls_did() {
    let python = installed("py1/bin/python");
    let (mut server, mcp, metrics) = serve_with_metrics(Command::new(bin()).args([
        "serve",
        "--http",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--language",
        "rhai",
        "--allow",
        "emit",
    ]));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/metrics_client.py");
    let client = Command::new(python)
        .arg(script)
        .args([format!("http://{mcp}/"), format!("http://{metrics}")])
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    eprintln!(
        "--- metrics client ---\n{out}--- stderr ---\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let _ = server.kill();
    let _ = server.wait();
    assert!(client.status.success(), "the metrics client failed");
    assert!(out.contains("PASS"), "the metrics client did not finish");
}

/// The lines of `r` until one is a JSON-RPC message with `id`; that one.
fn response(r: &mut impl std::io::BufRead, id: u64) -> serde_json::Value {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "no answer to {id}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    }
}

/// Over stdio, the end of input drains: a cell running when the client
/// closes its input still answers `ok`, and the server then exits 0 with
/// no traceback or error line (a zygote whose supervisor went away used to
/// print `BrokenPipeError`). With `--log-format json` every stderr line is
/// one JSON object, the call's line carries the request id its result names
/// (`run.request_id`) with its principal, tool and the cell's status, and
/// the call's events name the same id.
#[test]
fn stdio_end_of_input_drains_and_logs_json_with_the_request_id() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let mut child = super::common::serve::spawn_piped(
        Command::new(bin())
            .args(["serve", "--language", "python", "--log-format", "json"])
            .arg("--events")
            .arg(&events)
            .env("CELLBOX_LOG", "warn,cellbox::pool=info,cellbox::serve=info"),
    );
    let stderr = child.stderr.take().unwrap();
    let logged = std::thread::spawn(move || {
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .inspect(|l| eprintln!("[serve] {l}"))
            .collect::<Vec<String>>()
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: serde_json::Value| writeln!(stdin, "{v}").unwrap();
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    response(&mut out, 1);
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    response(&mut out, 2);
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"language": "python", "verbose": true,
            "code": "import time\ntime.sleep(2)\nprint('finished')"}}}),
    );
    // The end of input while the cell runs.
    drop(stdin);
    let answer = response(&mut out, 3);
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["status"], "ok", "{answer}");
    assert_eq!(result["stdout"], "finished\n", "{answer}");
    let request_id = result["run"]["request_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run.request_id in {answer}"))
        .to_owned();
    let status = wait_exit(&mut child, PATIENCE);
    assert_eq!(
        status.code(),
        Some(0),
        "the server's exit at the end of input"
    );

    let lines = logged.join().unwrap();
    let text = lines.join("\n");
    for bad in ["BrokenPipeError", "Traceback", "\"ERROR\""] {
        assert!(
            !text.contains(bad),
            "{bad} in the log of a normal end:\n{text}"
        );
    }
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let call = parsed
        .iter()
        .find(|v| v["fields"]["message"] == "call answered")
        .unwrap_or_else(|| panic!("no line for the call in:\n{text}"));
    let span = call["spans"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "call"))
        .unwrap_or_else(|| panic!("the call's line has no call span: {call}"));
    assert_eq!(span["request_id"], request_id.as_str(), "{call}");
    assert_eq!(span["principal"], "local", "{call}");
    assert_eq!(span["tool"], "execute_code", "{call}");
    assert_eq!(call["fields"]["status"], "ok", "{call}");
    assert_eq!(call["fields"]["outcome"], "ok", "{call}");

    let events = std::fs::read_to_string(&events).unwrap();
    let ours: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["request_id"] == request_id.as_str())
        .collect();
    let kinds: Vec<&str> = ours.iter().filter_map(|e| e["event"].as_str()).collect();
    assert!(
        kinds.contains(&"cell_start") && kinds.contains(&"cell_end"),
        "the call's events name its request id: {kinds:?} in\n{events}"
    );
}

/// A second SIGTERM during the drain ends the server at once: a cell that
/// would run far past it is killed, the server exits 0 long before its
/// drain timeout (300 s) and leaves no scratch, cgroup or process behind.
#[test]
fn a_second_signal_ends_the_drain_at_once() {
    use std::io::BufRead;
    let mut child = super::common::serve::spawn_piped(Command::new(bin()).args([
        "serve",
        "--language",
        "python",
        "--timeout",
        "600",
        "--drain-timeout",
        "300",
    ]));
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("[serve] {line}");
            let _ = tx.send(line);
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: serde_json::Value| writeln!(stdin, "{v}").unwrap();
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    response(&mut out, 1);
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    response(&mut out, 2);
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "execute_code", "_meta": {"progressToken": "p"},
            "arguments": {"language": "python", "code": "import time\ntime.sleep(500)"}}}),
    );
    // Running once the server says so.
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the server closed its output"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["method"] == "notifications/progress"
            && v["params"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("running"))
        {
            break;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let seen = watch_descendants(pid as i32, stop.clone());
    let term = || {
        let s = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(s.success());
    };
    term();
    // The first signal's drain has begun.
    loop {
        let l = rx
            .recv_timeout(PATIENCE)
            .expect("the server never said it was draining");
        if l.contains("draining") {
            break;
        }
    }
    term();
    let status = wait_exit(&mut child, PATIENCE);
    stop.store(true, Ordering::Release);
    assert_eq!(
        status.code(),
        Some(0),
        "the server's exit on a second signal"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no worker of the server was ever seen");
    let alive: Vec<_> = seen
        .iter()
        .filter(|(p, t)| start_time(*p) == Some(*t))
        .collect();
    assert!(alive.is_empty(), "processes left behind: {alive:?}");
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}
