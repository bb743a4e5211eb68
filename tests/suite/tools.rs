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
