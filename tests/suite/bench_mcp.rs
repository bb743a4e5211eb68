//! `cellbox bench --mcp`: `serve` driven over stdio through an MCP client
//! gives every line of its report (each call it timed had to succeed, or
//! the bench fails; a chatty cell's output had to come whole), with the
//! ratios against the baselines of the run. With `--mcp-python`, the
//! official Python SDK (1.x and 2.x, from the client matrix) drives it too.

use super::clients::installed;
use super::common::*;

#[test]
fn bench_mcp_reports_each_line_from_calls_that_succeeded() {
    let (py1, py2) = (installed("py1/bin/python"), installed("py2/bin/python"));
    let out = std::process::Command::new(bin())
        .args(["bench", "--mcp", "--iterations", "3", "--mcp-python"])
        .arg(&py1)
        .arg("--mcp-python")
        .arg(&py2)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench --mcp failed: {}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "baseline /usr/bin/python3 -c pass",
        "mcp list_sessions (round trip)",
        "mcp execute_code python pass, no session",
        "mcp execute_code python pass, in a session",
        "mcp execute_code rhai 1, no session",
        "mcp execute_code rhai 1, in a session",
        "library rhai 1, in a session, its worker started ahead",
        "mcp execute_code rhai printing 32000 bytes, in a session",
        "mcp execute_code rhai 1, in a session holding a 1 MB string and 10,000 maps, 50 ms apart",
        "python cells at concurrency 2 (4 rounds, alternating with the library):",
        "mcp serve + pools, 16 idle sessions:",
        "mcp a session's next Rhai worker, waiting:",
        "mcp serve started for one task (20 starts: spawned, initialize, tools/list, python pass), to the first result",
    ] {
        assert!(report.contains(line), "no {line:?} in:\n{report}");
    }
    assert!(report.contains("x bare python3 -c pass"), "{report}");
    assert!(report.contains("x list_sessions"), "{report}");
    assert!(report.contains("vs the library's"), "{report}");
    assert!(report.contains("ms over its rhai 1"), "{report}");
    assert!(
        report.contains("x rhai 1 in a session holding nothing"),
        "{report}"
    );
    assert!(report.contains("MiB PSS"), "{report}");
    assert!(
        report.contains("x bare python3 -c pass in turn with it")
            && report.contains("tools/list p50"),
        "{report}"
    );
    // Each SDK's lines, under the version it reported.
    for major in ["1.", "2."] {
        let who = format!("mcp (Python SDK {major}");
        for line in [
            ": serve over stdio, the SDK's ClientSession run by",
            " list_sessions (round trip)",
            " execute_code python pass, no session",
            " execute_code python pass, no session, serve listing the full output schema",
            " execute_code rhai 1, no session",
            " execute_code rhai 1, in a session",
        ] {
            let found = report
                .lines()
                .any(|l| l.starts_with(&who) && l.contains(line));
            assert!(found, "no {who}...{line:?} in:\n{report}");
        }
    }
    assert!(report.contains("x its list_sessions"), "{report}");
    assert!(report.contains("ms over the compact one's"), "{report}");
}

/// An interpreter without the SDK fails the bench at once, saying so, not
/// after the rest of the run or with a report that lacks its lines.
#[test]
fn bench_mcp_with_an_interpreter_lacking_the_sdk_fails_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    // A Python without site-packages (-S), so without the SDK even where
    // it is installed for the system's interpreter.
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("python");
    std::fs::write(&bare, "#!/bin/sh\nexec /usr/bin/python3 -I -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&bare, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(bin())
        .args(["bench", "--mcp", "--iterations", "1", "--mcp-python"])
        .arg(&bare)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot import mcp"), "{err}");
    assert!(err.contains("No module named 'mcp'"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // And one that does not exist.
    let out = std::process::Command::new(bin())
        .args(["bench", "--mcp", "--mcp-python", "/nonexistent/python"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("/nonexistent/python: cannot run it"), "{err}");
}
