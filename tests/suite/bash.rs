//! `bash` as a language: `/bin/bash -c` under the shell profile, from the
//! command line and through `execute_code`, in a session and without; its
//! bash-only features (arrays, `[[ ]]`, `/dev/tcp`) under the same jail.

use super::common::bin;
use super::common::serve::{json_lines, send_line, spawn_with_input, PATIENCE};
use serde_json::{json, Value};
use std::process::{Command, Stdio};

/// Arrays and `[[ ]]` are bash's, not POSIX sh's.
const BASH_ONLY: &str =
    "a=(x y z); [[ ${a[1]} == y ]] && echo \"n=${#a[@]} major=${BASH_VERSINFO[0]}\"";

fn run(lang: &str, code: &str) -> Value {
    let out = spawn_with_input(
        Command::new(bin()).args(["run", "--json", "--lang", lang, "-"]),
        code,
    )
    .wait_with_output()
    .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn major(stdout: &str) -> u32 {
    let m = stdout
        .trim()
        .rsplit("major=")
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no bash version in {stdout:?}"));
    assert!(m >= 4, "{stdout}");
    m
}

#[test]
fn a_bash_cell_runs_bash_from_the_command_line() {
    let r = run("bash", BASH_ONLY);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["language"], "bash", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with("n=3 "), "{r}");
    major(out);
    // The same code is not POSIX sh: the shell language is still /bin/sh.
    let sh = run("shell", BASH_ONLY);
    assert_ne!(sh["status"], "ok", "{sh}");

    // A `.bash` file is bash.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cell.bash");
    std::fs::write(&file, BASH_ONLY).unwrap();
    let out = Command::new(bin())
        .args(["run", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["stdout"].as_str().unwrap().starts_with("n=3 "), "{r}");
}

#[test]
fn a_bash_cell_is_jailed_like_a_shell_cell() {
    // bash's /dev/tcp: a connection to a listener the host reaches.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let r = run(
        "bash",
        &format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; \
             cat /etc/shadow && echo read-shadow; \
             touch /etc/cellbox-bash-probe && echo wrote-etc; echo done"
        ),
    );
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("done"), "{r}");
    for escaped in ["connected", "read-shadow", "wrote-etc"] {
        assert!(!out.contains(escaped), "{escaped}: {r}");
    }
    assert!(!std::path::Path::new("/etc/cellbox-bash-probe").exists());
    let report = &r["sandbox"];
    assert!(
        report.to_string().contains("seccomp") && report.to_string().contains("landlock"),
        "{r}"
    );
}

fn call(
    stdin: &mut std::process::ChildStdin,
    lines: &std::sync::mpsc::Receiver<Value>,
    id: u64,
    method: &str,
    params: Value,
) -> Value {
    send_line(
        stdin,
        &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    );
    loop {
        let v = lines.recv_timeout(PATIENCE).unwrap();
        if v["id"] == id {
            return v;
        }
    }
}

fn execute(
    stdin: &mut std::process::ChildStdin,
    lines: &std::sync::mpsc::Receiver<Value>,
    id: u64,
    args: Value,
) -> Value {
    let reply = call(
        stdin,
        lines,
        id,
        "tools/call",
        json!({"name": "execute_code", "arguments": args}),
    );
    reply["result"]["structuredContent"].clone()
}

#[test]
fn execute_code_takes_bash_in_a_session_and_without() {
    let (mut child, mut stdin, lines) =
        json_lines(Command::new(bin()).args(["serve"]).stderr(Stdio::null()));
    call(
        &mut stdin,
        &lines,
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}}),
    );
    send_line(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let list = call(&mut stdin, &lines, 2, "tools/list", json!({}));
    let exec = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "execute_code")
        .unwrap()
        .clone();
    let langs = &exec["inputSchema"]["properties"]["language"]["enum"];
    assert!(
        langs.as_array().unwrap().contains(&json!("bash")),
        "{langs}"
    );

    let r = execute(
        &mut stdin,
        &lines,
        3,
        json!({"language": "bash", "code": BASH_ONLY}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["stdout"].as_str().unwrap().starts_with("n=3 "), "{r}");

    // In a session, files carry over to the next call; shell variables do
    // not (each call is a new bash), as the description says.
    let created = call(
        &mut stdin,
        &lines,
        4,
        "tools/call",
        json!({"name": "create_session", "arguments": {}}),
    );
    let sid = created["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = execute(
        &mut stdin,
        &lines,
        5,
        json!({"language": "bash", "session_id": sid,
               "code": "declare -A m=([k]=kept); echo \"${m[k]}\" > note.txt; v=set"}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    let r = execute(
        &mut stdin,
        &lines,
        6,
        json!({"language": "bash", "session_id": sid,
               "code": "cat note.txt; echo \"v=[${v:-}]\""}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "kept\nv=[]\n", "{r}");
    // The shell language sees the same files.
    let r = execute(
        &mut stdin,
        &lines,
        7,
        json!({"language": "shell", "session_id": sid, "code": "cat note.txt"}),
    );
    assert_eq!(r["stdout"], "kept\n", "{r}");
    // An exit status other than 0 is an error, as for shell.
    let r = execute(
        &mut stdin,
        &lines,
        8,
        json!({"language": "bash", "code": "echo partial; exit 3"}),
    );
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["stdout"], "partial\n", "{r}");
    drop(stdin);
    let _ = child.wait();
}
