//! Warm Python cells: forked from a sandboxed zygote of the pool. Each test
//! first checks that its cells really came from a zygote.

use super::common::*;
use cellbox::{CellRequest, CellResult, Language, Session, SessionConfig, Status, Supervisor};
use serde_json::{json, Value};

async fn py_in(session: &Session, code: &str) -> CellResult {
    session.run(CellRequest::new(Language::Python, code)).await
}

/// Panic unless the cell was forked from a zygote.
fn require_warm(r: &CellResult) {
    let report = r
        .sandbox
        .as_ref()
        .unwrap_or_else(|| panic!("no sandbox report in {r:?}"));
    let hygiene = report.layer("hygiene").map(|l| l.detail.clone());
    assert!(
        hygiene.as_deref().unwrap_or("").contains("Python zygote"),
        "the cell did not come from a zygote: {report:?}"
    );
    for l in &report.layers {
        assert!(l.applied, "layer {} not applied: {report:?}", l.name);
    }
}

#[tokio::test]
async fn warm_cells_come_from_a_live_zygote_and_cold_ones_do_not() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(&s, "import os\n[os.getpid(), os.getuid(), 6 * 7]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    let v = r.value.as_array().unwrap().clone();
    assert!(
        v[0].as_i64().unwrap() > 1,
        "a warm cell is a child, not PID 1: {v:?}"
    );
    assert_eq!(v[2], json!(42));
    let status = sup.pool_status().await;
    assert!(status.warm);
    let live: Vec<_> = status.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{status:?}");
    assert!(live[0].cells >= 1, "{status:?}");
    assert!(s.scratch_dir().starts_with(status.scratch_root.unwrap()));

    let cold = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .build()
        .unwrap();
    let r = cold
        .run(
            CellRequest::new(Language::Python, "import os\nos.getpid()"),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        Value::from(1),
        "a cold cell is PID 1 of its namespace"
    );
    assert!(!format!("{:?}", r.sandbox).contains("zygote"));
    assert!(cold.pool_status().await.python.is_empty());
}
