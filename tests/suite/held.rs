//! Bytes the supervisor holds for a session and its tenant, outside every
//! cgroup (the namespace's JSON mirror, definitions, history, checkpoints'
//! copies): each budget is charged before anything is kept, and what would
//! pass one is refused with an error naming it.

use super::common::*;
use cellbox::{ErrorKind, SessionConfig, StateOutcome, Status, Tenant};
use serde_json::json;

const MIB: u64 = 1 << 20;

fn budget(bytes: u64) -> SessionConfig {
    SessionConfig {
        max_held_bytes: bytes,
        ..SessionConfig::default()
    }
}

/// A Rhai session: a cell whose namespace would pass the budget ends
/// `limit_exceeded` naming it, and changes nothing; under the budget the
/// same cell is kept (the control).
#[tokio::test]
async fn a_carried_namespace_past_its_budget_is_refused_whole() {
    let sup = supervisor();
    let big = "let a = []; a.pad(200000, 7); let keep = 1;";
    let s = sup.session(budget(4 * MIB)).unwrap();
    assert_eq!(rhai(&s, "let small = 1;").await.status, Status::Ok);
    let (before, max) = s.held_bytes().await;
    assert_eq!(max, 4 * MIB);
    let r = rhai(&s, big).await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    let e = r.error.unwrap();
    assert_eq!(e.kind, ErrorKind::LimitExceeded.as_str());
    assert!(e.message.contains("max_held_bytes"), "{}", e.message);
    assert!(e.message.contains("not kept"), "{}", e.message);
    // Nothing of it is in the namespace; what is held did not grow by it.
    let vars = s.vars().await;
    assert!(
        vars.contains_key("small") && !vars.contains_key("a"),
        "{vars:?}"
    );
    assert!(s.held_bytes().await.0 < before + (64 << 10));

    // Control: with room, the same cell is kept and charged.
    let roomy = sup.session(budget(64 * MIB)).unwrap();
    let r = rhai(&roomy, big).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let held = roomy.held_bytes().await.0;
    assert!(held > 4 * MIB, "200000 numbers held in {held} bytes");
}

/// A tenant's budget covers all its sessions: a second session cannot
/// hold what the first left no room for; another tenant is not touched.
#[tokio::test]
async fn a_tenants_sessions_share_its_budget() {
    let sup = supervisor();
    // 100000 numbers take this much of the supervisor each.
    let one = 100_000 * std::mem::size_of::<serde_json::Value>() as u64;
    let alice = Tenant::new("alice", false, one * 3 / 2);
    let bob = Tenant::new("bob", false, one * 3 / 2);
    let config = |t: &Tenant| SessionConfig {
        max_held_bytes: 64 * MIB,
        account: cellbox::Account {
            chain: Default::default(),
            tenant: Some(t.clone()),
        },
        ..SessionConfig::default()
    };
    let fill = "let a = []; a.pad(100000, 7);";
    let s1 = sup.session(config(&alice)).unwrap();
    let r = rhai(&s1, fill).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(alice.held_bytes() >= one, "{}", alice.held_bytes());
    let s2 = sup.session(config(&alice)).unwrap();
    let r = rhai(&s2, fill).await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    let message = r.error.unwrap().message;
    assert!(
        message.contains("max_held_bytes_per_principal"),
        "{message}"
    );
    assert!(message.contains("principal alice"), "{message}");
    // Bob has his own.
    let s3 = sup.session(config(&bob)).unwrap();
    assert_eq!(rhai(&s3, fill).await.status, Status::Ok);
    // What a session held is given back when it goes.
    drop(s1);
    assert!(alice.held_bytes() < one / 4, "{}", alice.held_bytes());
    assert_eq!(rhai(&s2, fill).await.status, Status::Ok);
}

/// A live Python session keeps its namespace whatever its size (the state
/// process holds it, charged to its cgroup): the values past the budget are
/// left out of the mirror and the cell says so; a checkpoint past it is
/// refused. The history keeps a bounded excerpt of each cell.
#[tokio::test]
async fn a_live_mirror_leaves_out_what_passes_its_budget() {
    require_root("live sessions need the cells' cgroups");
    let sup = supervisor();
    let s = sup.session(budget(2 * MIB)).unwrap();
    let r = py_in(&s, "small = [1, 2, 3]\nbig = list(range(300_000))").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("max_held_bytes") && n.contains("big")),
        "{:?}",
        r.notes
    );
    let vars = s.vars().await;
    assert_eq!(vars.get("small"), Some(&json!([1, 2, 3])));
    assert!(
        !vars.contains_key("big"),
        "the mirror holds {} names",
        vars.len()
    );
    // The value lives on in the state process.
    let r = py_in(&s, "len(big)").await;
    assert_eq!(r.value, json!(300_000), "{r:?}");
    let (held, max) = s.held_bytes().await;
    assert!(held <= max, "{held} > {max}");

    // A checkpoint's copy counts: with the mirror over half its budget,
    // one is refused, naming it.
    let v = 30_000 * std::mem::size_of::<serde_json::Value>() as u64;
    let s = sup.session(budget(v * 3 / 2)).unwrap();
    let r = py_in(&s, "v = list(range(30_000))").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(s.vars().await.contains_key("v"));
    let e = s.checkpoint("a").await.unwrap_err().to_string();
    assert!(
        e.contains("max_held_bytes") && e.contains("checkpoint"),
        "{e}"
    );
    // Control: with room, the checkpoint is made.
    let roomy = sup.session(budget(64 * MIB)).unwrap();
    assert_eq!(
        py_in(&roomy, "v = list(range(30_000))").await.status,
        Status::Ok
    );
    roomy.checkpoint("a").await.unwrap();

    // History: a bounded excerpt of the code.
    let long = format!("x = 1\n# {}\n", "y".repeat(100_000));
    assert_eq!(py_in(&roomy, &long).await.status, Status::Ok);
    let h = roomy.history().await;
    let last = h.last().unwrap();
    assert!(last.code.len() < 2048, "{}", last.code.len());
}
