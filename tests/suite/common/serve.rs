//! `cellbox serve` (or any cellbox command) as a child process: spoken to
//! line by line over stdio (JSON-RPC), or over HTTP at the address it
//! announces.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Generous bound for anything that should finish; a hang fails the test
/// instead of stalling the suite.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Spawn `cmd` with piped stdin and stdout (stderr as the caller set it):
/// the child, its stdin, and every JSON line it writes, read on a thread
/// of its own.
pub fn json_lines(cmd: &mut Command) -> (Child, ChildStdin, mpsc::Receiver<Value>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(v) = serde_json::from_str(&line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    (child, stdin, rx)
}

/// Write `v` as one JSON line and flush.
pub fn send_line(stdin: &mut impl Write, v: &Value) {
    let mut line = serde_json::to_vec(v).unwrap();
    line.push(b'\n');
    stdin.write_all(&line).unwrap();
    stdin.flush().unwrap();
}

/// Spawn `cmd` (a `serve --http ...`) with stderr piped and echoed as
/// `[serve] ...`; the child and what its log line says after `at http://`
/// (the address it listens on), waited for up to [`PATIENCE`].
pub fn http_serve(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("[serve] {line}");
            if let Some(rest) = line.split("at http://").nth(1) {
                if let Some(t) = tx.take() {
                    let _ = t.send(rest.to_owned());
                }
            }
        }
    });
    let announced = rx
        .recv_timeout(PATIENCE)
        .expect("the server did not announce its address");
    (child, announced)
}

/// Spawn `cmd` with stdin, stdout and stderr piped, write `input` to its
/// stdin and close it.
pub fn spawn_with_input(cmd: &mut Command, input: &str) -> Child {
    let mut child = spawn_piped(cmd);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child
}

/// Spawn `cmd` with stdin, stdout and stderr piped.
pub fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}
