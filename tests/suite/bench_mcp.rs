//! `cellbox bench --mcp`: `serve` driven over stdio through an MCP client
//! gives every line of its report (each call it timed had to succeed, or
//! the bench fails; a chatty cell's output had to come whole), with the
//! ratios against the baselines of the run.

use super::common::*;

#[test]
fn bench_mcp_reports_each_line_from_calls_that_succeeded() {
    let out = std::process::Command::new(bin())
        .args(["bench", "--mcp", "--iterations", "3"])
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
        "python cells at concurrency 2 (4 rounds, alternating with the library):",
        "mcp serve + pools, 16 idle sessions:",
        "mcp a session's next Rhai worker, waiting:",
    ] {
        assert!(report.contains(line), "no {line:?} in:\n{report}");
    }
    assert!(report.contains("x bare python3 -c pass"), "{report}");
    assert!(report.contains("x list_sessions"), "{report}");
    assert!(report.contains("vs the library's"), "{report}");
    assert!(report.contains("ms over its rhai 1"), "{report}");
    assert!(report.contains("MiB PSS"), "{report}");
}
