#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_macros)] // test code: a panic is a failed test; stderr is for the developer
//! The debug build works: a warm Rhai cell, a warm and a live Python cell,
//! one `serve` call, and the README's "From Rust" program, each run by
//! binaries built with the plain `dev` profile (debug assertions on).
//!
//! Debug builds check what release builds do not (among them the standard
//! library's IO-safety check, which aborts a process that closes a
//! descriptor a second time through its owner), and `cargo run`, `cargo
//! build` and an embedding program built plainly all get them. The test
//! suite itself is built with the `test-release` profile, so without this
//! test such a failure would only show on users' machines.
//!
//! A test binary of its own: the build takes a few minutes of both cores
//! the first time, and would disturb timing-sensitive tests beside it. It
//! builds into `target/debug-smoke` (its own target directory, so it never
//! waits for the lock of the build that runs it), without debug info (the
//! assertions are what matter, and linking is faster).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(90);

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    manifest_dir().join("target").join("debug-smoke")
}

/// `cargo build` in `dir` with the `dev` profile into the smoke target
/// directory; the paths of the executables it built, by name.
fn cargo_build(dir: &Path, args: &[&str]) -> Vec<(String, PathBuf)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // Not the outer build's jobserver (its descriptors are not ours) or
    // profile settings.
    for var in [
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO_BUILD_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("failed to run cargo");
    assert!(
        out.status.success(),
        "the debug build failed ({}): see the compiler's messages above",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            let name = m["target"]["name"].as_str()?;
            Some((name.to_owned(), PathBuf::from(exe)))
        })
        .collect()
}

fn exe(built: &[(String, PathBuf)], name: &str) -> PathBuf {
    built
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| panic!("the debug build made no {name}: {built:?}"))
}

/// Run `cmd` with `stdin`, killed past [`PATIENCE`]: its exit status,
/// stdout and stderr.
fn run(cmd: &mut Command, stdin: &str) -> (std::process::ExitStatus, String, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().unwrap();
            panic!(
                "{cmd:?} did not end within {PATIENCE:?} ({status}); stderr: {}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

/// `cellbox run --warm --json` of `code` in `lang`: the result.
fn warm_cell(cellbox: &Path, lang: &str, code: &str) -> Value {
    let (status, out, err) = run(
        Command::new(cellbox).args(["run", "--warm", "--json", "--lang", lang, "-"]),
        code,
    );
    let result: Value = serde_json::from_str(&out).unwrap_or_else(|e| {
        panic!("{lang}: no JSON result ({e}); status {status}, stdout {out:?}, stderr {err:?}")
    });
    assert_eq!(
        result["status"], "ok",
        "a warm {lang} cell of the debug build: {result:#}\nstderr: {err}"
    );
    result
}

/// The README's "From Rust" program, as written there.
fn readme_program() -> String {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let section = readme
        .split("### From Rust")
        .nth(1)
        .expect("the README has a From Rust section");
    let code = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the From Rust section has a rust block");
    format!("{code}\n")
}

/// The README's program as a crate of its own, beneath the smoke target
/// directory (so the repository's `.cargo/config.toml` applies, as it does
/// to the binaries, and their dependencies are built once), using this
/// repository's `cellbox` and its locked dependency versions.
fn readme_crate() -> PathBuf {
    let dir = target_dir().join("readme-from-rust");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"readme-from-rust\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[workspace]\n\n[dependencies]\n\
         cellbox = {{ path = {:?} }}\n\
         tokio = {{ version = \"1\", features = [\"rt-multi-thread\"] }}\n\
         serde_json = \"1\"\n",
        manifest_dir().display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(manifest_dir().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::write(dir.join("src/main.rs"), readme_program()).unwrap();
    dir
}

/// One JSON-RPC exchange with a `cellbox serve` over stdio.
struct Stdio2 {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl Stdio2 {
    fn start(cellbox: &Path) -> Stdio2 {
        let mut child = Command::new(cellbox)
            .args(["serve", "--language", "rhai,python"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
        });
        let mut s = Stdio2 {
            child,
            stdin,
            lines,
        };
        s.request(
            0,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "debug-smoke", "version": "0"}}),
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let v = self
                .lines
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("serve (debug build) did not answer {method}"));
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn call(&mut self, id: u64, tool: &str, args: Value) -> Value {
        let v = self.request(id, "tools/call", json!({"name": tool, "arguments": args}));
        v["result"]["structuredContent"].clone()
    }
}

impl Drop for Stdio2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_debug_build_runs_warm_and_live_cells_and_serve() {
    let built = cargo_build(&manifest_dir(), &["--bins"]);
    let cellbox = exe(&built, "cellbox");

    // A warm Rhai cell (forked from the fork server).
    let r = warm_cell(&cellbox, "rhai", "let x = 40; x + 2");
    assert_eq!(r["value"], 42, "{r:#}");
    // A warm Python cell (forked from a zygote).
    let r = warm_cell(&cellbox, "python", "import math\nint(math.sqrt(1764))");
    assert_eq!(r["value"], 42, "{r:#}");

    // Through `serve`: a sessionless Rhai cell, and a session whose Python
    // namespace is live (a state process) where the host has cgroups.
    let mut serve = Stdio2::start(&cellbox);
    let r = serve.call(
        1,
        "execute_code",
        json!({"language": "rhai", "code": "6 * 7"}),
    );
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["value"], 42, "{r:#}");
    let created = serve.call(2, "create_session", json!({}));
    let id = created["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned();
    let r = serve.call(
        3,
        "execute_code",
        json!({"language": "python", "code": "x = 41", "session_id": id}),
    );
    assert_eq!(r["status"], "ok", "{r:#}");
    let r = serve.call(
        4,
        "execute_code",
        json!({"language": "python", "code": "x + 1", "session_id": id}),
    );
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["value"], 42, "a variable kept between cells: {r:#}");
    // Running as root (cgroups), the namespace is a live state process.
    if nix_is_root() {
        assert_eq!(r["state"], "kept", "a live Python cell: {r:#}");
    }
    drop(serve);

    // The README's program, built plainly.
    let built = cargo_build(&readme_crate(), &[]);
    let program = exe(&built, "readme-from-rust");
    let (status, out, err) = run(&mut Command::new(program), "");
    assert!(
        status.success(),
        "the README's From Rust program (debug build): {status}\nstdout: {out}\nstderr: {err}"
    );
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
