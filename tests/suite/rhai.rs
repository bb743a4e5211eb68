//! Rhai cells end to end through the library.

use super::common::*;
use cellbox::{CellRequest, Language, Limits, SessionConfig, Status, Supervisor};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn last_value_and_print_capture() {
    let r = run_once(Language::Rhai, "print(\"hi\"); let x = 20; x * 2 + 2", &[]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.exit.code, Some(0));
    let r = run_once(Language::Rhai, "#{a: [1, 2.5, \"s\", ()], b: true}", &[]).await;
    assert_eq!(r.value, json!({"a": [1, 2.5, "s", null], "b": true}));
}

#[tokio::test]
async fn syntax_and_runtime_errors_have_positions() {
    let r = run_once(Language::Rhai, "let x = 1;\nlet y = ;", &[]).await;
    assert_eq!(r.status, Status::Error);
    let e = r.error.unwrap();
    assert_eq!(e.kind, "SyntaxError");
    assert_eq!(e.line, Some(2));
    assert!(e.column.is_some());

    let r = run_once(
        Language::Rhai,
        "let a = 1;\nlet b = 0;\nlet c = a / b;",
        &[],
    )
    .await;
    assert_eq!(r.status, Status::Error);
    let e = r.error.unwrap();
    assert_eq!(e.kind, "ArithmeticError", "{e:?}");
    assert_eq!(e.line, Some(3));

    let r = run_once(Language::Rhai, "fn f(x) { x.nope() }\n\nf(1)", &[]).await;
    let e = r.error.unwrap();
    assert_eq!(e.kind, "FunctionNotFound");
    assert!(e.traceback.unwrap().contains("in call to function f"));
}

#[tokio::test]
async fn timeout_kills_an_endless_loop() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0; // unlimited: only the clock stops it
    cfg.limits.timeout_ms = 1000;
    let t0 = Instant::now();
    let r = sup
        .run(CellRequest::new(Language::Rhai, "loop {}"), cfg.clone())
        .await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t0.elapsed()
    );
    // The supervisor is fine afterwards.
    let r = sup.run(CellRequest::new(Language::Rhai, "1"), cfg).await;
    assert_eq!(r.value, json!(1));
}

#[tokio::test]
async fn operation_limit() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 10_000;
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "let i = 0; while true { i += 1; }"),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::LimitExceeded);
    assert!(r.error.unwrap().message.contains("operations"));
}

#[tokio::test]
async fn output_over_the_cap_keeps_head_and_tail_with_exact_totals() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_output_bytes = 1000;
    // 5000 lines of "line NNNN\n" (10 bytes each) = 50_000 bytes.
    let code = r#"for i in 0..5000 { print(`line ${(i + 10000).to_string().sub_string(1)}`); }"#;
    let r = sup.run(CellRequest::new(Language::Rhai, code), cfg).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let t = r.truncated.stdout.unwrap();
    assert_eq!(t.total_bytes, 50_000);
    assert_eq!(t.kept_head + t.kept_tail, 1000);
    assert!(r.stdout.starts_with("line 0000\nline 0001\n"));
    assert!(r.stdout.ends_with("line 4999\n"));
    assert!(r.stdout.contains("bytes omitted"));
    assert!(r.truncated.stderr.is_none());
}

#[tokio::test]
async fn unknown_and_denied_capabilities_are_catchable_and_recorded() {
    let code = r#"
        let seen = [];
        try { answer(1); } catch (e) { seen.push(e.kind); }
        try { invoke("no_such_cap", #{}); } catch (e) { seen.push(e.kind); }
        emit(#{step: 1});
        seen
    "#;
    let r = run_once(Language::Rhai, code, &["emit"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(["denied", "unknown"]));
    let outcomes: Vec<(&str, &str)> = r
        .calls
        .iter()
        .map(|c| (c.cap.as_str(), c.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("answer", "denied"),
            ("no_such_cap", "unknown"),
            ("emit", "ok")
        ]
    );
    // Uncaught, a denial ends the cell as policy_denied.
    let r = run_once(Language::Rhai, "answer(1)", &[]).await;
    assert_eq!(r.status, Status::PolicyDenied);
    assert_eq!(r.error.unwrap().kind, "PermissionError");
}

#[tokio::test]
async fn answer_sets_the_final_answer() {
    let r = run_once(Language::Rhai, "answer(#{n: 42}); 1", &["answer"]).await;
    assert_eq!(r.final_answer, Some(json!({"n": 42})));
}

#[tokio::test]
async fn call_budget_ends_the_cell() {
    let sup = supervisor();
    let mut cfg = config(&["emit"]);
    cfg.policy.max_calls = 5;
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "for i in 0..100 { emit(i) }"),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    assert!(r.error.unwrap().message.contains("budget"));
    assert_eq!(r.calls.iter().filter(|c| c.outcome == "ok").count(), 5);
}

#[tokio::test]
async fn host_capability_with_schema_validation() {
    let add = add_capability();
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .capability(add)
        .unwrap()
        .build()
        .unwrap();
    let code = r#"
        let r = add(40, 2);
        let bad = "";
        try { add("x", 2) } catch (e) { bad = e.kind }
        [r, bad, invoke("add", #{a: 1, b: 2})]
    "#;
    let r = sup
        .run(CellRequest::new(Language::Rhai, code), config(&["add"]))
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([42, "invalid_args", 3]));
}

#[tokio::test]
async fn run_cell_recursion_is_bounded_and_forms_one_event_tree() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let sup = with_events(&events);
    let mut cfg = config(&["run_cell"]);
    cfg.policy.max_depth = 2;
    // depth 0 → 1 → 2 works; depth 3 is refused.
    let code = r#"run_cell("rhai", `1 + run_cell("rhai", "40 + 1")`)"#;
    let r = sup
        .run(CellRequest::new(Language::Rhai, code), cfg.clone())
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    let code = r#"run_cell("rhai", `run_cell("rhai", "run_cell(\"rhai\", \"1\")")`)"#;
    let r = sup.run(CellRequest::new(Language::Rhai, code), cfg).await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(
        r.calls
            .iter()
            .any(|c| c.outcome == "denied"
                && c.message.as_deref().unwrap_or("").contains("max_depth")),
        "{:?}",
        r.calls
    );
    // The events of the first run form a tree: root → child → grandchild.
    let (_, starts) = cell_starts(&events);
    let root = &starts[0];
    assert_eq!(root["depth"], 0);
    assert!(root["parent_run_id"].is_null());
    let child = &starts[1];
    assert_eq!(child["depth"], 1);
    assert_eq!(child["parent_run_id"], root["run_id"]);
    assert_eq!(child["root_run_id"], root["run_id"]);
    let grand = &starts[2];
    assert_eq!(grand["depth"], 2);
    assert_eq!(grand["parent_run_id"], child["run_id"]);
    assert_eq!(grand["root_run_id"], root["run_id"]);
}

#[tokio::test]
async fn namespace_persists_values_and_functions() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    let r = rhai(
        &s,
        "let x = 40; let m = #{k: [1, 2]}; fn double(v) { v * 2 }",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.vars.changed, vec!["x", "m"]);
    let r = rhai(&s, "x += 1; fn inc(v) { v + 1 }").await;
    assert_eq!(r.vars.changed, vec!["x"]);
    let r = rhai(&s, "[inc(x), double(m.k[1])]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([42, 4]));
    assert_eq!(s.get_var("x").await, Some(json!(41)));
    assert_eq!(r.execution_count, 3);
}

#[tokio::test]
async fn a_failing_cell_changes_nothing() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    rhai(&s, "let x = 1; fn f() { 1 }").await;
    let before = s.vars().await;
    let r = rhai(&s, "x = 99; let y = 2; fn f() { 2 } throw \"boom\";").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.error.as_ref().unwrap().message, "boom");
    assert_eq!(s.vars().await, before);
    let r = rhai(&s, "[x, f()]").await;
    assert_eq!(r.value, json!([1, 1]));
    // A timed-out cell changes nothing either.
    let r = s
        .run(CellRequest::new(Language::Rhai, "x = 5; loop {}").timeout(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(r.status, Status::Timeout | Status::LimitExceeded),
        "{r:?}"
    );
    assert_eq!(s.get_var("x").await, Some(json!(1)));
}

#[tokio::test]
async fn values_that_cannot_be_carried_are_reported() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    let r = rhai(&s, "let f = Fn(\"foo\"); let n = 0.0 / 0.0; let ok = 1;").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let dropped: Vec<&str> = r.vars.dropped.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(dropped, vec!["f", "n"]);
    assert!(r.vars.dropped[0].type_name.contains("Fn"));
    assert_eq!(s.vars().await.keys().collect::<Vec<_>>(), vec!["ok"]);
}

#[tokio::test]
async fn a_worker_killed_from_outside_reports_killed() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0;
    cfg.limits.timeout_ms = 20_000;
    // A unique address-space limit marks this cell's process among
    // concurrent ones: it shows in /proc/<pid>/limits.
    // (Below rhai.toml's 512 MiB ceiling, which would replace it.)
    let marker: u64 = 400_000_000 + u64::from(std::process::id() % 10_000) * 4096;
    cfg.limits.rlimits.memory_bytes = marker;
    let code = "loop {}".to_string();
    let task =
        tokio::spawn(async move { sup.run(CellRequest::new(Language::Rhai, code), cfg).await });
    let marked = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .map(|l| {
                l.lines().any(|line| {
                    line.starts_with("Max address space")
                        && line.split_whitespace().nth(3) == Some(&marker.to_string())
                })
            })
            .unwrap_or(false)
    };
    // Find the worker: a child of ours whose cell (the worker itself or,
    // with a PID namespace, its child) carries the marker and is running.
    let mut killed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for (pid, _state, cmd) in children() {
            if !(cmd.contains("__worker") || cmd.contains("__forkserver")) {
                continue;
            }
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            let cells: Vec<String> = std::iter::once(pid.to_string())
                .chain(children.split_whitespace().map(str::to_owned))
                .collect();
            let utime: u64 = cells
                .iter()
                .map(|p| {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                    stat.rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().nth(11))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                })
                .sum();
            if cells.iter().any(|p| marked(p)) && utime > 5 {
                unsafe_kill(pid);
                killed = true;
                break;
            }
        }
        if killed {
            break;
        }
    }
    assert!(killed, "did not find the worker");
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Killed, "{r:?}");
    assert_eq!(r.exit.signal, Some(9));
}

fn unsafe_kill(pid: i32) {
    let st = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[tokio::test]
async fn fifty_concurrent_cells_return_their_own_results() {
    let sup = supervisor();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let sup = sup.clone();
        tasks.push(tokio::spawn(async move {
            let r = sup
                .run(
                    CellRequest::new(Language::Rhai, format!("print(\"cell {i}\"); {i} * 1000")),
                    SessionConfig::default(),
                )
                .await;
            (i, r)
        }));
    }
    for t in tasks {
        let (i, r) = t.await.unwrap();
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.value, json!(i * 1000));
        assert_eq!(r.stdout, format!("cell {i}\n"));
    }
}

#[tokio::test]
async fn rhai_engine_refuses_eval_import_and_giant_data() {
    let r = run_once(Language::Rhai, "eval(\"1\")", &[]).await;
    assert_ne!(r.status, Status::Ok);
    let r = run_once(Language::Rhai, "import \"std\" as s; 1", &[]).await;
    assert_ne!(r.status, Status::Ok);
    let sup = supervisor();
    let cfg = SessionConfig {
        limits: Limits {
            max_string_bytes: 1000,
            ..Limits::default()
        },
        ..SessionConfig::default()
    };
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "let s = \"x\"; loop { s += s; }"),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    let r = run_once(Language::Rhai, "fn f(n) { f(n + 1) } f(0)", &[]).await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
}

#[tokio::test]
async fn repl_call_goes_through_the_policy() {
    let sup = supervisor();
    let s = sup.session(config(&["answer"])).unwrap();
    let r = s
        .call("answer", json!({"value": 7}).as_object().unwrap().clone())
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.final_answer, Some(json!(7)));
    let r = s
        .call("emit", json!({"event": 1}).as_object().unwrap().clone())
        .await;
    assert_eq!(r.status, Status::PolicyDenied);
}

#[tokio::test]
async fn a_cancelled_cell_leaves_no_process() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0;
    cfg.limits.timeout_ms = 60_000;
    let before: Vec<i32> = children().iter().map(|c| c.0).collect();
    let fut = Box::pin(sup.run(CellRequest::new(Language::Rhai, "loop {}"), cfg));
    // Let it start, note its worker, then drop the future (as a cancelled
    // request would).
    let mut fut = fut;
    tokio::select! {
        _ = &mut fut => panic!("the cell should still have been running"),
        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
    }
    let ours: Vec<i32> = children()
        .into_iter()
        .filter(|c| !before.contains(&c.0))
        .map(|c| c.0)
        .collect();
    drop(fut);
    assert!(!ours.is_empty(), "the running worker was not found");
    // Every worker alive at the moment of the drop is gone soon after
    // (other tests' workers end within their own short timeouts).
    let mut left = ours.clone();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now: Vec<i32> = children().iter().map(|c| c.0).collect();
        left.retain(|p| now.contains(p));
        if left.is_empty() {
            break;
        }
    }
    assert!(left.is_empty(), "still running: {left:?}");
}

/// The fork server keeps three sandboxed spares: a cell with the default OS
/// limits runs in one (it renames itself from `cellbox-spare` to
/// `cellbox-cell`), the pool refills after it, and a cell with other limits
/// gets a child forked for it.
/// A supervisor with its pools started, and its fork server's pid.
async fn with_fork_server() -> (Supervisor, u32) {
    // Without session cgroups: with them, every cell is forked for it
    // (and joins its groups itself), and the server keeps no spares. And
    // without sessions prepared for the next cell, whose workers would
    // take spares between the cells these tests count.
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .session_cgroups(false)
        .prepare_runs(false)
        .build()
        .unwrap();
    sup.start_pools().await.unwrap();
    let server = sup
        .pool_status()
        .await
        .rhai_fork_server_pid
        .expect("a running fork server");
    (sup, server)
}

/// The fork server's children named `name`.
fn forked_named(server: u32, name: &str) -> Vec<i32> {
    forked_by(server)
        .into_iter()
        .filter(|(_, comm)| comm == name)
        .map(|(pid, _)| pid)
        .collect()
}

#[tokio::test]
async fn warm_cells_run_in_spares_and_the_pool_refills() {
    let (sup, server) = with_fork_server().await;
    let named = |name: &str| forked_named(server, name);
    let wait_spares = |n: usize| {
        let named = &named;
        let sup = &sup;
        async move {
            for _ in 0..300 {
                let s = named("cellbox-spare");
                if s.len() == n && sup.pool_status().await.rhai_spares == n {
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!(
                "the fork server never had {n} spares: {:?}",
                forked_by(server)
            );
        }
    };
    let before = wait_spares(3).await;
    for p in &before {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
        let field = |k: &str| {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .map(|l| l[k.len()..].trim().to_owned())
                .unwrap_or_default()
        };
        // A spare waits fully sandboxed, before it has any cell.
        assert_eq!(field("Seccomp:"), "2", "spare {p}: {status}");
        assert_eq!(field("NoNewPrivs:"), "1", "spare {p}");
        assert_ne!(field("Uid:").split_whitespace().next(), Some("0"));
    }
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0;
    cfg.limits.timeout_ms = 1500;
    let s2 = sup.clone();
    let c2 = cfg.clone();
    let task = tokio::spawn(async move {
        s2.run(CellRequest::new(Language::Rhai, "loop {}"), c2)
            .await
    });
    // The running cell is one of the spares, renamed.
    let mut cell = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let [p] = named("cellbox-cell")[..] {
            cell = Some(p);
            break;
        }
    }
    let cell = cell.expect("no spare became the running cell");
    assert!(before.contains(&cell), "{cell} is not one of {before:?}");
    // While it runs the others wait; its replacement comes once it ends
    // (so making it does not compete with the cell for the CPUs).
    let now = named("cellbox-spare");
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(!now.contains(&cell), "{now:?}");
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    let after = wait_spares(3).await;
    assert!(!after.contains(&cell), "{after:?}");
    // A cell with other OS limits is forked for it, not taken from spares.
    let mut other = config(&[]);
    other.limits.rlimits.memory_bytes = 300 << 20;
    let r = sup
        .run(CellRequest::new(Language::Rhai, "40 + 2"), other)
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    let sandbox = r.sandbox.expect("a sandbox report");
    let rl = sandbox.layers.iter().find(|l| l.name == "rlimits").unwrap();
    assert!(rl.applied, "{rl:?}");
    assert!(rl.detail.contains(&(300u64 << 20).to_string()), "{rl:?}");
}

/// A fork server that dies (killed from outside) is replaced, and no cell
/// started after its death fails for it: one that finds it gone runs in a
/// fresh worker, and the next ones get a new server.
#[tokio::test]
async fn a_killed_fork_server_is_replaced_and_no_cell_fails() {
    let sup = supervisor();
    sup.start_pools().await.unwrap();
    let first = sup.pool_status().await.rhai_fork_server_pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Once the supervisor has noticed (a cell in flight at that moment may
    // fail, as with any worker killed from outside)...
    for _ in 0..200 {
        let status = sup.pool_status().await;
        if status.rhai_fork_server_pid != Some(first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(sup.pool_status().await.rhai_fork_server_pid, Some(first));
    // ... every cell runs.
    let mut seen_new = None;
    for i in 0..50 {
        let r = sup
            .run(
                CellRequest::new(Language::Rhai, format!("{i} + 1")),
                config(&[]),
            )
            .await;
        assert_eq!(r.status, Status::Ok, "cell {i}: {r:?}");
        assert_eq!(r.value, json!(i + 1));
        let status = sup.pool_status().await;
        if let Some(pid) = status.rhai_fork_server_pid.filter(|p| *p != first) {
            seen_new = Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let new = seen_new.expect("the fork server was never replaced");
    assert!(std::path::Path::new(&format!("/proc/{new}")).exists());
    // The old one is gone, not a zombie of ours.
    assert!(
        !std::path::Path::new(&format!("/proc/{first}")).exists(),
        "the killed fork server {first} was not reaped"
    );
}

/// A fork-server cell is complete when its worker says `done` (the worker
/// closed its output first): everything it printed is in the result, with
/// its exit code and its own CPU time and peak RSS, and the worker is gone
/// shortly after while the pool is back to its spares.
#[tokio::test]
async fn a_done_cell_has_all_its_output_and_its_worker_then_exits() {
    let (sup, server) = with_fork_server().await;
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0;
    cfg.limits.max_output_bytes = 1 << 20;
    // 300 000 bytes (more than a pipe holds) to stdout, then some CPU.
    let code = r#"
        let line = "01234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678";
        for i in 0..1000 { print(line); }
        let n = 0;
        for i in 0..1000000 { n += i % 7; }
        n > 0
    "#;
    let r = sup.run(CellRequest::new(Language::Rhai, code), cfg).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(true));
    assert_eq!(r.stdout.len(), 300_000, "stdout cut short");
    assert!(r.truncated.stdout.is_none());
    assert_eq!(r.exit.code, Some(0));
    assert_eq!(r.exit.signal, None);
    // A fixed amount of work (about 0.1 s here): CPU time, not wall time.
    assert!(r.usage.cpu_ms >= 20, "{:?}", r.usage);
    assert!(r.usage.max_rss_kb > 0, "{:?}", r.usage);
    // The worker that ran it exits by itself and the pool refills.
    let mut left = Vec::new();
    for _ in 0..300 {
        left = forked_by(server)
            .into_iter()
            .filter(|(_, comm)| comm == "cellbox-cell")
            .collect();
        if left.is_empty() && sup.pool_status().await.rhai_spares == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(left.is_empty(), "workers still running: {left:?}");
    assert_eq!(sup.pool_status().await.rhai_spares, 3);
}

/// Shell code and program arguments are C strings: a NUL byte in them is
/// the caller's mistake, named as such on every path (a cell, a program run
/// with `exec`, a sub-cell), not a failed exec inside the sandbox.
#[tokio::test]
async fn a_nul_byte_in_shell_code_or_arguments_is_a_usage_error() {
    let r = run_once(Language::Shell, "echo a\0b", &[]).await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.as_ref().unwrap();
    assert_eq!(e.kind, "UsageError", "{r:?}");
    assert!(e.message.contains("NUL byte (found at byte 6)"), "{r:?}");

    let sup = supervisor();
    let r = sup
        .exec(vec!["/bin/echo".into(), "a\0b".into()], config(&[]), false)
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.as_ref().unwrap();
    assert_eq!(e.kind, "UsageError", "{r:?}");
    assert!(e.message.contains("argument 1 of the program"), "{r:?}");

    let code = r#"
        let got = "";
        try { run_cell("shell", "echo \x00") } catch (e) { got = e.kind + ": " + e.message }
        got
    "#;
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, code),
            config(&["run_cell"]),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = r.value.as_str().unwrap_or_default();
    assert!(
        v.starts_with("invalid_args: ") && v.contains("sub-cell: shell code cannot contain a NUL"),
        "{r:?}"
    );
}

/// A Rhai cell is answered at its worker's `done`, before the worker has
/// exited: all it printed (more than a pipe holds at once) is in the
/// result, with exit code 0 and its usage read from the live worker; once
/// the session has settled (as it does before its next cell) the worker
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_answered_at_done_has_all_its_output_and_its_worker_goes_after() {
    let (sup, server) = with_fork_server().await;
    let session = sup
        .session(SessionConfig {
            prepare_next: true,
            ..config(&[])
        })
        .unwrap();
    let code = "for i in 0..5000 { print(`line ${i} abcdefghijklmnopqrstuvwxyz0123456789`); } 7";
    let expected: String = (0..5000)
        .map(|i| format!("line {i} abcdefghijklmnopqrstuvwxyz0123456789\n"))
        .collect();
    for _ in 0..10 {
        let r = rhai(&session, code).await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.value, json!(7));
        assert!(r.stdout == expected, "stdout: {} bytes", r.stdout.len());
        assert!(r.truncated.stdout.is_none());
        assert_eq!((r.exit.code, r.exit.signal), (Some(0), None));
        assert!(r.usage.max_rss_kb > 0, "{:?}", r.usage);
        session.settled().await;
        assert_eq!(
            forked_named(server, "cellbox-cell"),
            Vec::<i32>::new(),
            "a settled cell's worker lives"
        );
    }
}

/// A cell whose worker was started ahead has what it used read through
/// what was opened when its worker started, and read at its `done`: its
/// peak RSS is what it reached by then, not what its worker had when it
/// was started. Its worker's sandbox report is in its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_ahead_reports_what_its_cell_used() {
    let (sup, _server) = with_fork_server().await;
    let session = sup
        .session(SessionConfig {
            prepare_next: true,
            ..config(&[])
        })
        .unwrap();
    let small = rhai(&session, "1").await;
    assert_eq!(small.status, Status::Ok, "{small:?}");
    for _ in 0..3 {
        // Its next worker is started ahead meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // 8 MiB, doubled into place (and not kept).
        let r = rhai(
            &session,
            "fn f() { let s = \"0123456789abcdef\"; for i in 0..19 { s += s; } s.len() } f()",
        )
        .await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.value, json!(8 << 20));
        assert_eq!((r.exit.code, r.exit.signal), (Some(0), None));
        // Its worker's sandbox report is in its result.
        let report = r.sandbox.as_ref().expect("a sandbox report");
        assert!(
            report
                .layers
                .iter()
                .any(|l| l.name == "seccomp" && l.applied),
            "{report:?}"
        );
        assert!(
            r.usage.max_rss_kb >= small.usage.max_rss_kb + 6 * 1024,
            "{:?} after {:?}",
            r.usage,
            small.usage
        );
    }
}

/// A Rhai session's next worker, started ahead, is sent the session's
/// variables and makes them ready while it waits: its cell sends only its
/// code, and gives back only what it changed (a session that holds a
/// large value has it neither sent nor sent back on every cell). What the
/// cell sees and what the session keeps are as if it had been sent all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_ahead_is_sent_the_sessions_variables() {
    let sup = supervisor();
    let session = sup.session(config(&[])).unwrap();
    let fill = r#"let ctx = ""; ctx.pad(200000, 'a');
let rows = []; for i in 0..100 { rows.push(#{id: i, name: `row ${i}`}) }
let n = 1; ctx.len()"#;
    let r = rhai(&session, fill).await;
    assert_eq!(r.value, json!(200000), "{r:?}");
    let ready = || async {
        assert!(session.prepare_cell(Language::Rhai).await);
        assert!(session.next_cell_has_vars(Language::Rhai).await);
    };

    // A cell that changes nothing: nothing changed, everything kept.
    ready().await;
    let r = rhai(&session, "n + ctx.len() + rows.len() + rows[99].id").await;
    assert_eq!(r.value, json!(200200), "{r:?}");
    assert!(
        r.vars.changed.is_empty() && r.vars.deleted.is_empty(),
        "{:?}",
        r.vars
    );
    let names: Vec<String> = session.vars().await.keys().cloned().collect();
    assert_eq!(names, ["ctx", "rows", "n"]);

    // Changed in place, rebound, new: each reported and kept.
    ready().await;
    let r = rhai(
        &session,
        r#"rows[0].id = 99; n = 2; let m = "new"; rows[0].id"#,
    )
    .await;
    assert_eq!(r.value, json!(99), "{r:?}");
    let mut changed = r.vars.changed.clone();
    changed.sort();
    assert_eq!(changed, ["m", "n", "rows"], "{:?}", r.vars);
    assert_eq!(session.get_var("rows").await.unwrap()[0]["id"], json!(99));
    assert_eq!(session.get_var("n").await, Some(json!(2)));
    let ctx = session.get_var("ctx").await.unwrap();
    assert_eq!(ctx.as_str().map(str::len), Some(200000));

    // Rebound to an equal value, shadowed: not a change; a value that
    // cannot be carried is dropped, and deleted.
    ready().await;
    let r = rhai(
        &session,
        "let n = 2; let m = 5; let m = \"new\"; let f = Fn(\"x\"); n",
    )
    .await;
    assert_eq!(r.value, json!(2), "{r:?}");
    assert!(r.vars.changed.is_empty(), "{:?}", r.vars);
    assert_eq!(r.vars.dropped.len(), 1, "{:?}", r.vars);
    assert_eq!(r.vars.dropped[0].name, "f");

    // Set by the host after its worker was started: the cell sees the
    // host's value, sent with it.
    ready().await;
    session.set_var("n", json!(7)).await.unwrap();
    assert!(!session.next_cell_has_vars(Language::Rhai).await);
    let r = rhai(&session, "n * 6").await;
    assert_eq!(r.value, json!(42), "{r:?}");
    assert!(r.vars.changed.is_empty(), "{:?}", r.vars);
    // One started ahead and set afterwards is ended and started again
    // when a worker is asked for: it is then sent the host's value.
    ready().await;
    session.set_var("n", json!(8)).await.unwrap();
    ready().await;
    let r = rhai(&session, "n * 6").await;
    assert_eq!(r.value, json!(48), "{r:?}");
    session.set_var("n", json!(7)).await.unwrap();

    // A failed cell changes nothing, and the next is sent the same.
    ready().await;
    let r = rhai(&session, "n = 8; throw \"no\"").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    ready().await;
    let r = rhai(&session, "[n, ctx.len(), rows[0].id, m]").await;
    assert_eq!(r.value, json!([7, 200000, 99, "new"]), "{r:?}");
}

/// Cells that follow each other at once, in a session that holds values
/// and starts each next worker ahead: each waits for the worker being
/// started for it rather than starting another beside it, and sees what
/// the cell before it left, whichever worker it runs in.
#[tokio::test]
async fn cells_in_quick_succession_see_what_the_cell_before_left() {
    let sup = supervisor();
    let session = sup
        .session(SessionConfig {
            prepare_next: true,
            ..config(&[])
        })
        .unwrap();
    let r = rhai(
        &session,
        r#"let ctx = ""; ctx.pad(300000, 'a'); let n = 0; n"#,
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    for i in 1..=30_i64 {
        let code = if i % 10 == 0 {
            // Now and then one that does not name the counter.
            "ctx.len()"
        } else {
            "n += 1; ctx += \"b\"; n * 1000000 + ctx.len()"
        };
        let r = rhai(&session, code).await;
        assert_eq!(r.status, Status::Ok, "{i}: {r:?}");
        let n = i - i / 10;
        let expected = if i % 10 == 0 {
            300_000 + n
        } else {
            n * 1_000_000 + 300_000 + n
        };
        assert_eq!(r.value, json!(expected), "{i}: {r:?}");
    }
    session.settled().await;
    assert_eq!(session.get_var("n").await, Some(json!(27)));
    // The last one started ahead is sent the variables as they are now.
    let mut holds = false;
    for _ in 0..200 {
        holds = session.next_cell_has_vars(Language::Rhai).await;
        if holds {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        holds,
        "no worker started ahead holds the session's variables"
    );
}
