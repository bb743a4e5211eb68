//! `cellbox tools`: the tools `serve` lists, in MCP's, OpenAI's and
//! Anthropic's formats; the last two checked by those APIs' own Python
//! packages (installed by tests/clients/install.sh).

use super::clients::installed;
use super::common::bin;
use super::common::serve::spawn_with_input;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn config(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("repo");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), "one\ntwo\n").unwrap();
    let path = dir.join("cellbox.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[files]
roots = ["{}"]

[tools.count_lines]
kind = "command"
description = "Count the lines of a file"
argv = ["/usr/bin/wc", "-l", "--", "{{path}}"]
schema = {{ type = "object", properties = {{ path = {{ type = "string" }} }}, required = ["path"] }}

[policy]
allow = ["read_file", "count_lines"]
"#,
            root.display()
        ),
    )
    .unwrap();
    path
}

fn tools(config: &Path, format: &str) -> Value {
    let out = Command::new(bin())
        .args(["tools", "--format", format, "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cellbox tools --format {format}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `tools/list` of a stdio `serve` with the same config, through the wire.
fn served(config: &Path) -> Value {
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let reply = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no tools/list reply in {text}"));
    reply["result"].clone()
}

fn check_with_package(api: &str, definitions: &Value) {
    let python = installed("apitypes/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/tool_types.py");
    let out = spawn_with_input(
        Command::new(python).arg(script).arg(api),
        &definitions.to_string(),
    )
    .wait_with_output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let n = definitions.as_array().unwrap().len();
    assert!(
        out.status.success() && stdout.trim() == format!("ok {n}"),
        "{api}'s package refused the definitions: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_tool_definitions_are_the_served_list_in_each_apis_format() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());

    // MCP: the very list a client reads from `serve`.
    let mcp = tools(&config, "mcp");
    assert_eq!(mcp, served(&config));
    let listed = mcp["tools"].as_array().unwrap();
    let names: Vec<&str> = listed.iter().filter_map(|t| t["name"].as_str()).collect();
    for name in ["execute_code", "create_session", "read_file"] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }

    let openai = tools(&config, "openai");
    let anthropic = tools(&config, "anthropic");
    for (i, t) in listed.iter().enumerate() {
        let mut schema = t["inputSchema"].clone();
        schema.as_object_mut().unwrap().remove("$schema");
        let f = &openai[i]["function"];
        assert_eq!(openai[i]["type"], "function");
        assert_eq!(f["name"], t["name"]);
        assert_eq!(f["description"], t["description"]);
        assert_eq!(f["parameters"], schema);
        assert_eq!(anthropic[i]["name"], t["name"]);
        assert_eq!(anthropic[i]["description"], t["description"]);
        assert_eq!(anthropic[i]["input_schema"], schema);
    }
    assert_eq!(openai.as_array().unwrap().len(), listed.len());
    assert_eq!(anthropic.as_array().unwrap().len(), listed.len());
    check_with_package("openai", &openai);
    check_with_package("anthropic", &anthropic);
}

#[test]
fn a_bad_configuration_or_format_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[policy]\nallow = [\"launch_missiles\"]\n").unwrap();
    let out = Command::new(bin())
        .args(["tools", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("launch_missiles"), "{err}");
    assert!(out.stdout.is_empty());

    let out = Command::new(bin())
        .args(["tools", "--format", "gemini"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("openai") && err.contains("anthropic"), "{err}");
}
