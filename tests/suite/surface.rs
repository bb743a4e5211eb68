//! What `serve` offers when its languages are narrowed: the pools of the
//! languages it does not run are not started, and the unknown-tool error
//! names every tool it serves; option-like values refused by command tools.

use super::common::serve::{json_lines, send_line, PATIENCE};
use super::common::{bin, cmdline, descendants};
use serde_json::{json, Value};
use std::process::{Command, Stdio};

fn initialize(stdin: &mut std::process::ChildStdin) {
    send_line(
        stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    );
    send_line(
        stdin,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
}

fn answer(rx: &std::sync::mpsc::Receiver<Value>, id: u64) -> Value {
    loop {
        let v = rx.recv_timeout(PATIENCE).expect("no answer");
        if v["id"] == json!(id) {
            return v;
        }
    }
}

#[test]
fn a_rhai_server_starts_no_python_and_names_every_tool_it_serves() {
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--language", "rhai"])
        .stderr(Stdio::null());
    let (mut child, mut stdin, rx) = json_lines(&mut cmd);
    initialize(&mut stdin);
    answer(&rx, 1);
    // tools/list waits for the pools this server starts.
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    let listed = answer(&rx, 2);
    let names: Vec<String> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "nope", "arguments": {}}}),
    );
    let e = answer(&rx, 3)["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let kids: Vec<String> = descendants(child.id() as i32)
        .into_iter()
        .map(cmdline)
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert!(names.contains(&"aggregate_context".to_owned()), "{names:?}");
    for n in &names {
        assert!(e.contains(n.as_str()), "{n} missing from {e}");
    }
    assert!(
        !kids
            .iter()
            .any(|k| k.contains("zygote") || k.contains("python")),
        "{kids:?}"
    );
    assert!(kids.iter().any(|k| k.contains("fork")), "{kids:?}");
}
