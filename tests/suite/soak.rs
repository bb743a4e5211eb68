//! A short `cellbox soak`: `serve` through an MCP client with benign,
//! session and hostile cells, every result checked, and the server back to
//! its idle descriptors, processes, cgroups, scratch and RSS afterwards.

use super::common::bin;
use std::time::Instant;

#[test]
fn a_short_soak_loses_nothing_and_leaves_nothing() {
    let started = Instant::now();
    let out = std::process::Command::new(bin())
        .args([
            "soak",
            "--cells",
            "1000",
            "--concurrency",
            "3",
            "--seed",
            "11",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "{report}{}(took {:.1} s)",
        String::from_utf8_lossy(&out.stderr),
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "soak failed: {}\n{report}",
        out.status
    );
    assert!(report.contains("PASS"), "{report}");
    assert!(report.contains("soak: 1000 cells"), "{report}");
}
