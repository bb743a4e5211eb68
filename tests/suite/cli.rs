//! The command line: exit codes and clear messages for bad input.

use super::common::*;
use serde_json::Value;

#[test]
fn run_prints_output_and_value() {
    let out = cellbox(&["run", "-"], Some("print(\"hey\"); 6 * 7"));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hey\n42\n");
}

#[test]
fn run_json_is_the_result_object() {
    let out = cellbox(&["run", "--json", "--lang", "rhai", "-"], Some("1 + 1"));
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["value"], 2);
    for key in [
        "stdout",
        "stderr",
        "truncated",
        "error",
        "final_answer",
        "vars",
        "calls",
        "usage",
        "run",
        "sandbox",
        "exit",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
}

#[test]
fn exit_codes_follow_the_status() {
    assert_eq!(
        cellbox(&["run", "-"], Some("throw 1")).status.code(),
        Some(1)
    );
    assert_eq!(
        cellbox(
            &["run", "--timeout", "0.5", "--max-operations", "0", "-"],
            Some("loop {}")
        )
        .status
        .code(),
        Some(3)
    );
    assert_eq!(
        cellbox(&["run", "--max-operations", "1000", "-"], Some("loop {}"))
            .status
            .code(),
        Some(4)
    );
    assert_eq!(
        cellbox(&["run", "-"], Some("answer(1)")).status.code(),
        Some(5)
    );
    assert_eq!(
        cellbox(&["run", "--allow", "answer", "-"], Some("answer(1)"))
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn bad_input_gets_a_clear_message() {
    let out = cellbox(&["run", "/no/such/file.rhai"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open /no/such/file.rhai"));

    let out = cellbox(&["run", "--lang", "cobol", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown language"));

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("script.txt");
    std::fs::write(&f, "1").unwrap();
    let out = cellbox(&["run", f.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lang"));

    let big = dir.path().join("big.rhai");
    std::fs::write(&big, "1;".repeat(600_000)).unwrap();
    let out = cellbox(&["run", big.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_script_bytes"));

    let bin = dir.path().join("bin.rhai");
    std::fs::write(&bin, b"1 + \xff\xfe").unwrap();
    let out = cellbox(&["run", bin.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8"));

    let out = cellbox(&["run", "--allow", "no good", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a capability name"));

    let out = cellbox(&["run", "--timeout", "-3", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn repl_keeps_a_session_and_answers_commands() {
    let script = "let x = 40;\nfn add(a,\n b) { a + b }\n:set y 2\n:get y\nadd(x, y)\n:show vars\n:show history\n:call answer {\"value\": 1}\n:reset\n:show vars\n:quit\n";
    let out = cellbox(&["repl", "--allow", "answer"], Some(script));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "2", "{stdout}");
    assert_eq!(lines[1], "42", "{stdout}");
    assert!(stdout.contains("x = 40"), "{stdout}");
    assert!(stdout.contains("add (rhai definition)"), "{stdout}");
    assert!(stdout.contains("[3] rhai ok add(x, y)"), "{stdout}");
    assert!(stdout.contains("answer: 1"), "{stdout}");
    assert!(stdout.contains("namespace cleared"), "{stdout}");
    let after_reset = stdout.split("namespace cleared").nth(1).unwrap();
    assert!(!after_reset.contains("x = 40"), "{stdout}");
}

#[test]
fn doctor_reports_the_warm_workers() {
    let out = cellbox(&["doctor", "--json"], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warm = &v["warm_workers"];
    assert_eq!(warm["cells"]["rhai"], "ok", "{warm}");
    assert_eq!(warm["cells"]["python"], "ok", "{warm}");
    assert_eq!(warm["pools"]["rhai_fork_server"], true, "{warm}");
    assert!(
        warm["pools"]["python"]
            .as_array()
            .unwrap()
            .iter()
            .any(|z| z["alive"] == true),
        "{warm}"
    );
}
