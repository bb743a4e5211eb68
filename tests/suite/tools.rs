//! Declared tools: a command run under the sandbox, an HTTP tool against a
//! fake server on 127.0.0.1, called from cells by name, through `tools.`,
//! in a batch, under a policy and a tool-call budget.

use super::common::{assert_tool_budget_ends_the_cell, config, supervisor_with};
use cellbox::{CellRequest, Language, Status};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

/// A fake tool server: answers each POST with a JSON echo of its body and
/// its Authorization header; `/text` answers with something not JSON.
pub(crate) fn fake_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            let (mut len, mut auth) = (0usize, String::new());
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(": ").unwrap();
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.parse().unwrap(),
                    "authorization" => auth = v.to_owned(),
                    _ => {}
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let out = if first.contains("/text") {
                "this is not json".to_owned()
            } else {
                let body: Value = serde_json::from_slice(&body).unwrap();
                json!({"got": body, "auth": auth}).to_string()
            };
            write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
                out.len()
            )
            .unwrap();
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_http_tool_from_a_python_cell_with_a_secret_header() {
    let url = fake_server();
    // The secret lives in the supervisor's environment only.
    std::env::set_var("CELLBOX_TEST_TOOL_TOKEN", "s3cret");
    let sup = supervisor_with(&format!(
        r#"
[tools.weather]
kind = "http"
description = "weather for a city"
url = "{url}/weather"
headers = {{ Authorization = {{ env = "CELLBOX_TEST_TOOL_TOKEN", prefix = "Bearer " }} }}
schema = {{ type = "object", properties = {{ city = {{ type = "string" }} }}, required = ["city"], additionalProperties = false }}
[tools.broken]
kind = "http"
description = "answers with text"
url = "{url}/text"
"#
    ));
    let code = r#"
import os
a = tools.weather(city="Oslo")
b = tool_call("weather", {"city": "Bergen"})
def err(f):
    try:
        f()
    except Exception as e:
        return [type(e).__name__, str(e)]
batch = tool_call_batched([("weather", {"city": "Tromsø"}), ("weather", {"city": 3}), ("nope", {})])
{"a": a, "b": b["got"]["city"], "env": os.environ.get("CELLBOX_TEST_TOOL_TOKEN"),
 "schema": err(lambda: tools.weather(city=3)),
 "undeclared": err(lambda: tool_call("no_such_tool", {})),
 "not_json": err(lambda: tools.broken()),
 "batch": batch}
"#;
    let r = sup
        .run(
            CellRequest::new(Language::Python, code),
            config(&["weather", "broken"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    // The endpoint got the secret and echoed it (the redaction shows it
    // was there): what the cell sees of it is redacted.
    assert_eq!(
        v["a"],
        json!({"got": {"city": "Oslo"}, "auth": "Bearer [REDACTED:CELLBOX_TEST_TOOL_TOKEN]"})
    );
    assert_eq!(v["b"], "Bergen");
    assert_eq!(v["env"], Value::Null, "the secret reached the cell");
    assert_eq!(v["schema"][0], "ValueError", "{v}");
    assert!(v["schema"][1].as_str().unwrap().contains("city"), "{v}");
    assert_eq!(v["undeclared"][0], "PermissionError", "{v}");
    assert!(
        v["undeclared"][1]
            .as_str()
            .unwrap()
            .contains("unknown capability"),
        "{v}"
    );
    assert_eq!(v["not_json"][0], "RuntimeError", "{v}");
    assert!(
        v["not_json"][1].as_str().unwrap().contains("not JSON"),
        "{v}"
    );
    assert_eq!(v["batch"][0]["got"]["city"], "Tromsø");
    assert_eq!(v["batch"][1]["type"], "ValueError");
    assert_eq!(v["batch"][2]["type"], "PermissionError");
    let outcomes: Vec<(&str, &str)> = r
        .calls
        .iter()
        .map(|c| (c.cap.as_str(), c.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes.iter().filter(|c| **c == ("weather", "ok")).count(),
        3,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&("weather", "invalid_args")));
    assert!(outcomes.contains(&("broken", "failed")));
    assert!(outcomes.contains(&("no_such_tool", "unknown")));

    // Not in the policy: denied, catchable, recorded.
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "try:\n    tools.weather(city='x')\nexcept PermissionError as e:\n    r = str(e)\nr",
            ),
            config(&[]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.value.as_str().unwrap().contains("not allowed"), "{r:?}");
    assert_eq!(r.calls[0].outcome, "denied");

    // max_tool_calls ends the cell when spent.
    assert_tool_budget_ends_the_cell(&sup, "weather", "tools.weather(city=str(i))").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_command_tool_runs_under_the_sandbox_without_a_shell() {
    let sup = supervisor_with(
        r#"
[tools.echo]
kind = "command"
description = "echo words"
argv = ["/bin/echo", "{word}", "{args}"]
schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
[tools.fail]
kind = "command"
description = "exits 3"
argv = ["/bin/sh", "-c", "exit 3"]
"#,
    );
    let r = sup
        .run(
            CellRequest::new(
                Language::Rhai,
                r#"let a = tool_call("echo", #{word: "a b; $(id)"}); let b = fail(); [a.stdout, a.exit_code, b.exit_code]"#,
            ),
            config(&["echo", "fail"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        json!(["a b; $(id) {\"word\":\"a b; $(id)\"}\n", 0, 3])
    );
}

/// The secret the command tools below are given (a long random-looking
/// value, so that any part of it is caught).
const CMD_SECRET: &str = "ct-8f3a9c1e7b5d2f4068a1c3e5b7d9f1a2c4e6b8d0";

/// Command tools with an `env` and a `pass_env`: `showenv` prints its
/// environment and a digest of the secret; `halves` prints the secret in
/// two writes on stdout, and whole on stderr.
fn env_tools() -> String {
    r#"
[tools.showenv]
kind = "command"
description = "print the environment"
argv = ["/bin/sh", "-c", "/usr/bin/env; printf 'digest %s\\n' \"$(printf %s \"$TOOL_TOKEN\" | sha256sum)\""]
env = { TOOL_TOKEN = { env = "CELLBOX_TEST_CMD_SECRET" }, MODE = "plain-literal-value" }
pass_env = ["CELLBOX_TEST_CMD_PASSED", "CELLBOX_TEST_CMD_NOT_SET"]
[tools.halves]
kind = "command"
description = "print the secret in two writes, and on stderr"
argv = ["/bin/sh", "-c", "printf 'first:%s' \"$(printf %s \"$TOOL_TOKEN\" | cut -c1-20)\"; sleep 0.2; printf '%s :second\\n' \"$(printf %s \"$TOOL_TOKEN\" | cut -c21-)\"; printf 'err:%s\\n' \"$TOOL_TOKEN\" >&2"]
env = { TOOL_TOKEN = { env = "CELLBOX_TEST_CMD_SECRET" } }
[tools.unset]
kind = "command"
description = "a secret whose variable is not set"
argv = ["/usr/bin/env"]
env = { K = { env = "CELLBOX_TEST_CMD_NEVER_SET" } }
"#
    .to_owned()
}

/// Where `text` holds 8 bytes or more of [`CMD_SECRET`].
fn holds_secret(text: &str) -> Option<String> {
    CMD_SECRET
        .as_bytes()
        .windows(8)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .find(|w| text.contains(w.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_command_tool_env_reaches_the_program_and_its_secret_is_redacted() {
    use sha2::Digest;
    std::env::set_var("CELLBOX_TEST_CMD_SECRET", CMD_SECRET);
    std::env::set_var("CELLBOX_TEST_CMD_PASSED", "passed-value");
    std::env::remove_var("CELLBOX_TEST_CMD_NOT_SET");
    std::env::remove_var("CELLBOX_TEST_CMD_NEVER_SET");
    let sup = supervisor_with(&env_tools());
    let code = r#"
a = tools.showenv()
b = tools.halves()
try:
    tools.unset()
    c = "no error"
except RuntimeError as e:
    c = str(e)
print(a["stdout"], b["stdout"], b["stderr"])
{"showenv": a, "halves": b, "unset": c}
"#;
    let r = sup
        .run(
            CellRequest::new(Language::Python, code),
            config(&["showenv", "halves", "unset"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let shown = &r.value["showenv"]["stdout"].as_str().unwrap().to_owned();
    // The program sees the real value (its digest), the literal and the
    // passed variable, and nothing of the supervisor's but those.
    let digest = format!("{:x}", sha2::Sha256::digest(CMD_SECRET.as_bytes()));
    assert!(shown.contains(&format!("digest {digest}")), "{shown}");
    assert!(shown.contains("MODE=plain-literal-value\n"), "{shown}");
    assert!(
        shown.contains("CELLBOX_TEST_CMD_PASSED=passed-value\n"),
        "{shown}"
    );
    assert!(
        shown.contains("TOOL_TOKEN=[REDACTED:CELLBOX_TEST_CMD_SECRET]\n"),
        "{shown}"
    );
    // (PWD is the shell's own.)
    let mut names: Vec<&str> = shown
        .lines()
        .filter(|l| !l.starts_with("digest "))
        .filter_map(|l| l.split('=').next())
        .filter(|n| *n != "PWD")
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "CELLBOX_TEST_CMD_PASSED",
            "HOME",
            "LANG",
            "LC_ALL",
            "MODE",
            "PATH",
            "TMPDIR",
            "TOOL_TOKEN"
        ],
        "{shown}"
    );
    // Printed in two writes and on stderr: the placeholder each time.
    assert_eq!(
        r.value["halves"]["stdout"],
        json!("first:[REDACTED:CELLBOX_TEST_CMD_SECRET] :second\n")
    );
    assert_eq!(
        r.value["halves"]["stderr"],
        json!("err:[REDACTED:CELLBOX_TEST_CMD_SECRET]\n")
    );
    // A secret whose variable is not set: the call fails naming the tool,
    // the variable and the key.
    assert_eq!(
        r.value["unset"],
        json!(
            "tools.unset: the environment variable CELLBOX_TEST_CMD_NEVER_SET (env.K) is not set"
        )
    );
    let everything = format!("{} {} {}", r.value, r.stdout, r.stderr);
    assert_eq!(holds_secret(&everything), None, "{everything}");
    assert!(
        r.stdout.contains("[REDACTED:CELLBOX_TEST_CMD_SECRET]"),
        "{}",
        r.stdout
    );
}

#[test]
fn tools_command_tool_env_names_are_checked_when_declared() {
    #[derive(serde::Deserialize)]
    struct F {
        tools: cellbox::tools::ToolsConfig,
    }
    let declare = |extra: &str| {
        let f: F = toml::from_str(&format!(
            "[tools.t]\nkind = \"command\"\ndescription = \"\"\nargv = [\"/usr/bin/env\"]\n{extra}\n"
        ))
        .unwrap();
        cellbox::tools::host_and_declared(&Default::default(), &f.tools, &Default::default())
            .err()
            .map(|e| e.to_string())
    };
    for (extra, want) in [
        (
            "env = { PATH = \"/opt/bin\" }",
            "tools.t.env: PATH is set by the sandbox",
        ),
        (
            "pass_env = [\"HOME\"]",
            "tools.t.pass_env: HOME is set by the sandbox",
        ),
        (
            "env = { \"A-B\" = \"x\" }",
            "tools.t.env: \"A-B\" is not a variable name",
        ),
        (
            "pass_env = [\"A=B\"]",
            "tools.t.pass_env: \"A=B\" is not a variable name",
        ),
        (
            "env = { A = \"x\" }\npass_env = [\"A\"]",
            "tools.t.pass_env: A is named twice",
        ),
    ] {
        let e = declare(extra).unwrap_or_default();
        assert!(e.contains(want), "{extra}: {e:?}");
    }
    assert_eq!(declare("env = { A = \"x\" }\npass_env = [\"B\"]"), None);
}

/// Through `serve` (stdio): a cell calls the command tools over MCP
/// `tools/call` of `execute_code`; the result, the live output sent as
/// log notifications, the server's log and its events file show the
/// placeholder and no part of the secret.
#[test]
fn tools_command_tool_secret_is_redacted_through_serve() {
    use super::common::serve::{json_lines, send_line, PATIENCE};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellbox.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[policy]\nallow = [\"showenv\", \"halves\"]\n",
            env_tools()
        ),
    )
    .unwrap();
    let log = dir.path().join("log");
    let events = dir.path().join("events");
    let mut cmd = std::process::Command::new(super::common::bin());
    cmd.args(["serve", "--language", "python", "--config"])
        .arg(&config)
        .arg("--events")
        .arg(&events)
        .env("CELLBOX_TEST_CMD_SECRET", CMD_SECRET)
        .env("CELLBOX_TEST_CMD_PASSED", "passed-value")
        .env("RUST_LOG", "debug")
        .stderr(std::fs::File::create(&log).unwrap());
    let (mut child, mut stdin, rx) = json_lines(&mut cmd);
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    );
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let code = "a = tools.showenv()\nb = tools.halves()\n\
                print(a['stdout'], b['stdout'], b['stderr'], flush=True)\n[a, b]";
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_code", "_meta": {"progressToken": "p"},
            "arguments": {"language": "python", "code": code}}}),
    );
    let mut seen = Vec::new();
    let answer = loop {
        let v = rx.recv_timeout(PATIENCE).expect("no answer");
        if v["id"] == json!(2) {
            break v;
        }
        seen.push(v);
    };
    let _ = child.kill();
    let _ = child.wait();
    let result = answer["result"]["structuredContent"].clone();
    assert_eq!(result["status"], json!("ok"), "{answer}");
    // What the program printed reached the client, redacted.
    let value = result["value"].to_string();
    assert!(
        value.contains("TOOL_TOKEN=[REDACTED:CELLBOX_TEST_CMD_SECRET]"),
        "{value}"
    );
    assert!(
        value.contains("first:[REDACTED:CELLBOX_TEST_CMD_SECRET] :second"),
        "{value}"
    );
    assert!(value.contains("MODE=plain-literal-value"), "{value}");
    let live = serde_json::to_string(&seen).unwrap();
    assert!(
        live.contains("[REDACTED:CELLBOX_TEST_CMD_SECRET]"),
        "no live output: {live}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let events = std::fs::read_to_string(&events).unwrap();
    assert!(events.contains("showenv"), "{events}");
    for (place, text) in [
        ("the answer", answer.to_string()),
        ("the notifications", live),
        ("the log", log),
        ("the events", events),
    ] {
        assert_eq!(holds_secret(&text), None, "{place}: {text}");
    }
}
