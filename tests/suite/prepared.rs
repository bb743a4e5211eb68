//! `Supervisor::run` in sessions prepared ahead: the session a cell finds
//! waiting has run nothing, was made with the cell's own configuration,
//! and goes with the supervisor.

use super::common::*;
use cellbox::{CellRequest, Language, Limits, SessionConfig, Status, Supervisor};
use serde_json::json;
use std::time::{Duration, Instant};

/// Wait until `sup` has a session prepared for its next `run`.
async fn until_prepared(sup: &Supervisor) {
    let until = Instant::now() + Duration::from_secs(20);
    while sup.pool_status().await.prepared_runs == 0 {
        assert!(
            Instant::now() < until,
            "no session was prepared for the next run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_prepared_session_has_seen_nothing_of_the_cell_before() {
    let sup = supervisor();
    let leave = "import os, subprocess
open('left.txt', 'w').write('x')
os.makedirs('d/e', exist_ok=True)
secret = 41
os.getcwd()";
    let r = run_py(&sup, leave).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let cwd = r.value.clone();
    until_prepared(&sup).await;
    let look = "import os
[os.getcwd(), sorted(os.listdir('.')), 'secret' in globals()]";
    let r = run_py(&sup, look).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    // A scratch of its own, new and empty.
    assert_ne!(r.value[0], cwd, "{r:?}");
    assert_eq!(r.value[1], json!([]), "a file of the cell before: {r:?}");
    assert_eq!(r.value[2], json!(false), "{r:?}");

    // Rhai the same: nothing of the cell before, whose session prepared
    // this one with a Rhai worker waiting.
    let r = run_rhai(&sup, "let kept = 5; kept").await;
    assert_eq!(r.value, json!(5), "{r:?}");
    until_prepared(&sup).await;
    let r = run_rhai(&sup, "kept").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(
        r.error.as_ref().is_some_and(|e| e.message.contains("kept")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_run_with_another_configuration_gets_a_session_made_with_it() {
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .capability(add_capability())
        .unwrap()
        .build()
        .unwrap();
    let add = || CellRequest::new(Language::Rhai, "add(40, 2)");
    let allowed = config(&["add"]);
    let denied = config(&[]);
    let r = sup.run(add(), allowed.clone()).await;
    assert_eq!(r.value, json!(42), "{r:?}");
    // The session prepared for the next run allows `add`; this run's
    // policy does not, and holds.
    until_prepared(&sup).await;
    let r = sup.run(add(), denied.clone()).await;
    assert_eq!(r.status, Status::PolicyDenied, "{r:?}");
    assert_eq!(r.calls.len(), 1, "{r:?}");
    assert_eq!(r.calls[0].outcome, "denied", "{r:?}");
    until_prepared(&sup).await;
    let r = sup.run(add(), allowed.clone()).await;
    assert_eq!(r.value, json!(42), "{r:?}");

    // Limits too: a session prepared with the default operations bound
    // does not serve a cell whose configuration has a tight one, nor the
    // other way round.
    let tight = SessionConfig {
        limits: Limits {
            max_operations: 1_000,
            ..Limits::default()
        },
        ..allowed.clone()
    };
    let busy = || {
        CellRequest::new(
            Language::Rhai,
            "let n = 0; for i in 0..100000 { n += i; } n",
        )
    };
    until_prepared(&sup).await;
    let r = sup.run(busy(), tight.clone()).await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    until_prepared(&sup).await;
    let r = sup.run(busy(), allowed).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(4_999_950_000i64), "{r:?}");
}

#[tokio::test]
async fn without_prepare_runs_nothing_is_prepared_and_release_gives_it_back() {
    let off = Supervisor::builder()
        .worker_exe(bin())
        .prepare_runs(false)
        .build()
        .unwrap();
    let on = supervisor();
    for sup in [&off, &on] {
        let r = run_rhai(sup, "1").await;
        assert_eq!(r.value, json!(1), "{r:?}");
    }
    until_prepared(&on).await;
    // What `on` prepared in the same time, `off` did not.
    assert_eq!(off.pool_status().await.prepared_runs, 0);
    on.release_prepared().await;
    assert_eq!(on.pool_status().await.prepared_runs, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        on.pool_status().await.prepared_runs,
        0,
        "a session was prepared after the release, before any cell"
    );
    // The next cell prepares again.
    let r = run_rhai(&on, "2").await;
    assert_eq!(r.value, json!(2), "{r:?}");
    until_prepared(&on).await;
}

#[tokio::test]
async fn prepared_sessions_go_with_the_supervisor() {
    let sup = supervisor();
    let r = run_py(&sup, "1").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    until_prepared(&sup).await;
    let status = sup.pool_status().await;
    let root = status
        .scratch_root
        .expect("a warm supervisor's scratch root");
    assert!(root.exists());
    // The prepared session holds the supervisor; dropping the last handle
    // lets it go, and the supervisor with it (its scratch root removed).
    drop(sup);
    let until = Instant::now() + Duration::from_secs(20);
    while root.exists() {
        assert!(
            Instant::now() < until,
            "{} is still there: the prepared session kept the supervisor",
            root.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn prepare_for_runs_makes_the_first_runs_session_before_it_comes() {
    let sup = supervisor();
    assert_eq!(sup.pool_status().await.prepared_runs, 0);
    // Returns once the session is ready, workers and all.
    sup.prepare_for_runs(SessionConfig::default()).await;
    assert_eq!(sup.pool_status().await.prepared_runs, 1);
    // Asked again while one is ready: nothing more is made.
    sup.prepare_for_runs(SessionConfig::default()).await;
    assert_eq!(sup.pool_status().await.prepared_runs, 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = now_s();
    // The cell's scratch was made before the cell was asked for: the
    // session is the one prepared, and it has seen nothing.
    let r = run_py(
        &sup,
        "import os\n[os.stat('.').st_mtime, sorted(os.listdir('.'))]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let made = r.value[0].as_f64().unwrap();
    assert!(
        made < asked - 1.0,
        "the scratch was made at {made}, the cell asked for at {asked}: {r:?}"
    );
    assert_eq!(r.value[1], json!([]), "{r:?}");
    // The first Rhai cell finds a worker of its own language in the next
    // one, prepared after that cell.
    until_prepared(&sup).await;
    let r = run_rhai(&sup, "40 + 2").await;
    assert_eq!(r.value, json!(42), "{r:?}");

    // Prepared for one configuration, a cell with another gets its own:
    // the policy of the prepared session is not the cell's.
    let other = supervisor();
    let allowed = config(&["emit"]);
    other.prepare_for_runs(allowed).await;
    assert_eq!(other.pool_status().await.prepared_runs, 1);
    let r = other
        .run(
            CellRequest::new(Language::Rhai, "emit(\"x\"); 1"),
            config(&[]),
        )
        .await;
    assert_eq!(r.status, Status::PolicyDenied, "{r:?}");

    // Without `prepare_runs`, nothing.
    let off = Supervisor::builder()
        .worker_exe(bin())
        .prepare_runs(false)
        .build()
        .unwrap();
    off.prepare_for_runs(SessionConfig::default()).await;
    assert_eq!(off.pool_status().await.prepared_runs, 0);
}

#[tokio::test]
async fn prepare_for_runs_given_up_on_still_prepares() {
    let sup = supervisor();
    // Given up on at once: the session is still made, and so is the next
    // after a cell.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(1),
        sup.prepare_for_runs(SessionConfig::default()),
    )
    .await;
    assert!(gave_up.is_err(), "prepared within 1 ms?");
    until_prepared(&sup).await;
    let r = run_py(&sup, "6 * 7").await;
    assert_eq!(r.value, json!(42), "{r:?}");
    until_prepared(&sup).await;
}

#[tokio::test]
async fn release_returns_once_the_sessions_of_cells_over_are_gone() {
    let sup = supervisor();
    let r = run_rhai(&sup, "1").await;
    assert_eq!(r.value, json!(1), "{r:?}");
    let root = sup
        .pool_status()
        .await
        .scratch_root
        .expect("a warm supervisor's scratch root");
    let listed = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    sup.release_prepared().await;
    let before = listed();
    // Cells whose sessions hold something to give back: files in their
    // scratch, and a process left running that their end has to stop.
    for i in 0..3 {
        let r = run_py(
            &sup,
            &format!(
                "import os, time\nopen('f{i}', 'w').write('x')\nif os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n{i}"
            ),
        )
        .await;
        assert_eq!(r.value, json!(i), "{r:?}");
        let r = run_rhai(&sup, &format!("{i}")).await;
        assert_eq!(r.value, json!(i), "{r:?}");
    }
    // Straight after the last result: the release waits for the cells'
    // sessions too, not only for those prepared.
    sup.release_prepared().await;
    assert_eq!(
        listed(),
        before,
        "scratch of the cells' sessions left in {} after the release",
        root.display()
    );
    assert_eq!(sup.pool_status().await.prepared_runs, 0);
}
