//! The client matrix: MCP clients nobody on this project wrote drive
//! `cellbox serve` over stdio and streamable HTTP. The official Python SDK
//! 1.x and 2.x (tests/clients/python_client.py), the TypeScript SDK
//! (tests/clients/ts_client.mjs) and the Inspector CLI each list the tools,
//! run cells in a session, get an error, a timeout, cancel a cell and find
//! its session free at once, and a 2 MB output; and run a cell that asks a
//! model (a fake endpoint in this process) and one that calls a declared
//! tool, whose results carry the model usage and call details the output
//! schema must allow.
//!
//! The clients are installed by `tests/clients/install.sh` (which `.ci/run`
//! calls) under `target/mcp-clients/`, or where `CELLBOX_MCP_CLIENTS`
//! points. A client that is not installed fails its test, loudly.

use super::common::bin;
use super::common::fake_model::FakeModel;
use super::common::serve::http_serve;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest one client's run may take (each takes seconds when it works).
const CLIENT_DEADLINE: Duration = Duration::from_secs(300);

/// What the servers run with: a wall-clock limit well above the cancelled
/// cell's sleep (120 s), so only a cancellation can free its session early;
/// a model (a fake endpoint that echoes) and a declared command tool.
fn serve_args() -> Vec<String> {
    let mut args: Vec<String> = ["--language", "python,rhai", "--timeout", "300", "--config"]
        .map(str::to_owned)
        .to_vec();
    args.push(model_and_tool_config().to_string_lossy().into_owned());
    args
}

/// A config file naming a fake model endpoint (alive as long as this test
/// process) and a command tool `shout` (`/bin/echo {text}`).
fn model_and_tool_config() -> &'static Path {
    static CONFIG: std::sync::OnceLock<(FakeModel, tempfile::TempDir, PathBuf)> =
        std::sync::OnceLock::new();
    let (_, _, path) = CONFIG.get_or_init(|| {
        let fake = FakeModel::start(Vec::new());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cellbox.toml");
        std::fs::write(
            &path,
            format!(
                r#"
[models.fake]
endpoint = "{url}"
model = "m"
[tools.shout]
kind = "command"
description = "echo text"
argv = ["/bin/echo", "{{text}}"]
schema = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
[policy]
allow = ["model_query", "shout"]
"#,
                url = fake.url
            ),
        )
        .unwrap();
        (fake, dir, path)
    });
    path
}

fn clients_dir() -> PathBuf {
    match std::env::var_os("CELLBOX_MCP_CLIENTS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-clients"),
    }
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `path` under the clients directory; panics, naming the fix, if absent.
pub(super) fn installed(path: &str) -> PathBuf {
    let p = clients_dir().join(path);
    assert!(
        p.exists(),
        "MCP client not installed: {} is missing. Run `bash tests/clients/install.sh` \
         (.ci/run does) to install the client matrix.",
        p.display()
    );
    p
}

/// Run a client to its end (or the deadline); its output is shown, and it
/// must exit 0 having printed `expect`.
fn run_client(cmd: Command, what: &str, expect: &str) -> String {
    run_client_to(cmd, what, expect, 0)
}

/// As [`run_client`], for a client that must exit with `code`.
fn run_client_to(mut cmd: Command, what: &str, expect: &str, code: i32) -> String {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {what}: {e}"));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > CLIENT_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    eprintln!("--- {what}: stdout ---\n{out}--- {what}: stderr ---\n{err}");
    let status = status.unwrap_or_else(|| panic!("{what} ran past {CLIENT_DEADLINE:?}"));
    assert_eq!(
        status.code(),
        Some(code),
        "{what} failed ({status}); its output is above"
    );
    assert!(out.contains(expect), "{what} did not print {expect:?}");
    out
}

/// `cellbox serve --http 127.0.0.1:0`, killed when dropped.
struct HttpServe {
    child: std::process::Child,
    url: String,
}

impl HttpServe {
    fn start(extra: &[&str]) -> HttpServe {
        let (child, announced) = http_serve(
            Command::new(bin())
                .args(["serve", "--http", "127.0.0.1:0"])
                .args(serve_args())
                .args(extra),
        );
        let url = format!("http://{}", announced.trim());
        HttpServe { child, url }
    }
}

impl Drop for HttpServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `execute_code` listing its full output schema (every nested part typed).
const FULL_SCHEMA: &[&str] = &["--output-schema", "full"];

fn python_client(venv: &str, transport: &str, big_cap: bool) {
    let python = installed(&format!("{venv}/bin/python"));
    let mut cmd = Command::new(python);
    cmd.arg(scripts().join("python_client.py"))
        .arg(transport)
        .env_remove("PYTHONPATH")
        .env("CELLBOX_BIG_CAP", if big_cap { "1" } else { "0" });
    let extra: &[&str] = if big_cap {
        &["--max-output", "4194304"]
    } else {
        &[]
    };
    let _server;
    match transport {
        "stdio" => {
            // SDK 1.x checks results against the compact output schema;
            // 2.x reads the default listing, which names none.
            let listed: &[&str] = if venv == "py1" {
                &["--output-schema", "compact"]
            } else {
                &[]
            };
            cmd.arg(bin()).args(serve_args()).args(extra).args(listed);
        }
        _ => {
            // Each SDK checks results against the full output schema over
            // HTTP.
            let s = HttpServe::start(&[extra, FULL_SCHEMA].concat());
            cmd.arg(&s.url);
            _server = s;
        }
    }
    run_client(
        cmd,
        &format!("python SDK ({venv}) over {transport}"),
        "PASS",
    );
}

#[test]
fn python_sdk_1_over_stdio() {
    python_client("py1", "stdio", false);
}

#[test]
fn python_sdk_1_over_http() {
    python_client("py1", "http", false);
}

#[test]
fn python_sdk_2_over_stdio() {
    python_client("py2", "stdio", false);
}

#[test]
fn python_sdk_2_over_http() {
    python_client("py2", "http", false);
}

/// The Python SDK 2.x refuses a server-sent event over 1 MiB: with a cap
/// that keeps all of a 2 MB output, the server still sends a result it
/// accepts (cut to the response budget).
#[test]
fn python_sdk_2_over_http_with_output_above_its_event_limit() {
    python_client("py2", "http", true);
}

fn ts_client(transport: &str) {
    let node_dir = installed("node");
    installed("node/node_modules/@modelcontextprotocol/sdk/package.json");
    // The script resolves the SDK from node_modules beside it.
    let script = node_dir.join("ts_client.mjs");
    std::fs::copy(scripts().join("ts_client.mjs"), &script).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&script).arg(transport);
    let _server;
    match transport {
        "stdio" => {
            cmd.arg(bin()).args(serve_args());
        }
        _ => {
            let s = HttpServe::start(FULL_SCHEMA);
            cmd.arg(&s.url);
            _server = s;
        }
    }
    run_client(cmd, &format!("TypeScript SDK over {transport}"), "PASS");
}

#[test]
fn typescript_sdk_over_stdio() {
    ts_client("stdio");
}

#[test]
fn typescript_sdk_over_http() {
    ts_client("http");
}

/// The Inspector CLI: one method per run, against a server it starts
/// (stdio) or one already listening (HTTP).
#[test]
fn inspector_cli_over_stdio_and_http() {
    let cli = installed("node/node_modules/@modelcontextprotocol/inspector");
    let entry = installed("node/node_modules/.bin/mcp-inspector");
    let catalog = tempfile::tempdir().unwrap();
    let server = HttpServe::start(&[]);
    for transport in ["stdio", "http"] {
        // The CLI exits with 5 when the tool result is an error.
        let inspect_to = |method_args: &[&str], expect: &str, code: i32| {
            let mut cmd = Command::new("node");
            cmd.arg(&entry)
                .arg("--cli")
                .current_dir(&cli)
                .env("MCP_CATALOG_PATH", catalog.path().join("mcp.json"))
                .env("HOME", catalog.path());
            if transport == "stdio" {
                // The Inspector reads a `--config` anywhere on its command
                // line as its own: over stdio, the server has no config.
                cmd.arg(bin())
                    .arg("serve")
                    .args(&serve_args()[..serve_args().len() - 2]);
            } else {
                cmd.args([&server.url, "--transport", "http"]);
            }
            cmd.args(method_args);
            run_client_to(
                cmd,
                &format!("Inspector CLI over {transport}: {method_args:?}"),
                expect,
                code,
            )
        };
        let inspect = |method_args: &[&str], expect: &str| inspect_to(method_args, expect, 0);
        inspect(&["--method", "tools/list"], "\"execute_code\"");
        inspect(
            &["--method", "logging/setLevel", "--log-level", "warning"],
            "{",
        );
        let out = inspect(
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "execute_code",
                "--tool-arg",
                "language=python",
                "--tool-arg",
                "code=import statistics; statistics.mean([1, 2, 3, 4])",
            ],
            "=> 2.5",
        );
        assert!(
            !out.contains("landlock"),
            "no sandbox report unless asked: {out}"
        );
        let out = inspect_to(
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "execute_code",
                "--tool-arg",
                "language=python",
                "--tool-arg",
                "code=1/0",
            ],
            "ZeroDivisionError",
            5,
        );
        assert!(out.contains("\"isError\": true"), "{out}");
        if transport == "http" {
            inspect(
                &[
                    "--method",
                    "tools/call",
                    "--tool-name",
                    "execute_code",
                    "--tool-arg",
                    "language=python",
                    "--tool-arg",
                    "code=model_query('hi') + tools.shout(text='!')['stdout']",
                ],
                "echo:hi!",
            );
        }
    }
}
