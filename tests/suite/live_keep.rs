//! Live Python sessions: how a kept cell's namespace becomes the session's
//! next state process. A cell's process that succeeded serves as that
//! state process itself when nothing it carries differs from a fork (one
//! thread, no children, little CPU time used); otherwise it forks it.
//! Every cell's process is a child of the state process it ran from, so a
//! cell's parent pid says which happened.

use super::common::*;
use cellbox::{SessionConfig, StateOutcome, Status};
use serde_json::json;

/// The `[getppid, getpid]` a cell returns as its last value.
fn pids(r: &cellbox::CellResult) -> (i64, i64) {
    let v = r.value.as_array().unwrap_or_else(|| panic!("{r:?}"));
    (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
}

#[tokio::test]
async fn many_kept_cells_in_a_row_each_become_the_state_and_keep_every_object() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import os\nclass K:\n    pass\nk = K()\nk.seen = []\ng = (i for i in range(100))\nn = 0\n[os.getppid(), os.getpid()]",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let (_, mut last) = pids(&r);
    for i in 1..=12 {
        let r = py_in(
            &s,
            "n += 1\nk.seen.append(next(g))\nassert k.seen == list(range(n)), k.seen\n[os.getppid(), os.getpid()]",
        )
        .await;
        assert_eq!(r.status, Status::Ok, "cell {i}: {r:?}");
        assert_eq!(r.state, Some(StateOutcome::Kept), "cell {i}: {r:?}");
        let (parent, me) = pids(&r);
        assert_eq!(
            parent, last,
            "cell {i} ran in a child of the previous cell's own process, which became the state"
        );
        assert_ne!(me, last, "cell {i}");
        last = me;
    }
    // A failed cell after them rolls back to the last kept one, and the
    // cell after it runs from that same state process.
    for code in [
        "n = 100\nk.seen.clear()\n1/0",
        "n = 101\nimport os\nos._exit(3)",
        "n = 102\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    ] {
        let r = py_in(&s, code).await;
        assert_ne!(r.status, Status::Ok, "{code}: {r:?}");
        assert_eq!(r.state, Some(StateOutcome::RolledBack), "{code}: {r:?}");
        let r = py_in(&s, "[n, len(k.seen), os.getppid(), os.getpid()]").await;
        assert_eq!(r.status, Status::Ok, "after {code}: {r:?}");
        let v = r.value.as_array().unwrap();
        assert_eq!(
            &v[..3],
            &[json!(12), json!(12), json!(last)],
            "after {code}: {r:?}"
        );
        // That cell succeeded: its process is the state now.
        last = v[3].as_i64().unwrap();
    }
    let r = sup
        .session(SessionConfig::default())
        .unwrap()
        .run(cellbox::CellRequest::new(cellbox::Language::Python, "1"))
        .await;
    assert_eq!(r.status, Status::Ok, "another session still runs: {r:?}");
}

#[tokio::test]
async fn a_cell_that_leaves_a_thread_running_forks_its_successor_and_the_thread_is_gone() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import os, threading, time\n\
         t = threading.Thread(target=time.sleep, args=(60,), daemon=True)\n\
         t.start()\n\
         m = {'kept': True}\n\
         [os.getppid(), os.getpid()]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    assert!(
        r.notes.iter().any(|n| n.contains("thread")),
        "the running thread is noted: {r:?}"
    );
    let (_, with_thread) = pids(&r);
    let r = py_in(
        &s,
        "import threading\n[os.getppid(), threading.active_count(), m['kept'], t.is_alive()]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = r.value.as_array().unwrap();
    assert_ne!(
        v[0].as_i64().unwrap(),
        with_thread,
        "a process with a thread left running is not the next state: {r:?}"
    );
    assert_eq!(&v[1..], &[json!(1), json!(true), json!(false)], "{r:?}");
}

#[tokio::test]
async fn a_cell_that_leaves_a_child_forks_its_successor_and_the_child_is_ended() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import os, time\n\
         child = os.fork()\n\
         if child == 0:\n    time.sleep(60)\n    os._exit(0)\n\
         [os.getppid(), os.getpid()]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let (_, with_child) = pids(&r);
    let r = py_in(
        &s,
        "import os\n\
         try:\n    state = open(f'/proc/{child}/stat').read().rsplit(')', 1)[1].split()[0]\n\
         except OSError:\n    state = 'gone'\n\
         [os.getppid(), state in ('gone', 'Z', 'X')]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = r.value.as_array().unwrap();
    assert_ne!(v[0].as_i64().unwrap(), with_child, "{r:?}");
    assert_eq!(
        v[1],
        json!(true),
        "the cell's child was ended with it: {r:?}"
    );
}

#[tokio::test]
async fn cpu_time_does_not_accumulate_across_cells_of_a_state_process() {
    let sup = supervisor();
    let mut config = SessionConfig::default();
    config.limits.rlimits.cpu_seconds = 2;
    let s = sup.session(config).unwrap();
    let burn = |secs: f64| {
        format!(
            "import os, resource\n\
             def used():\n    u = resource.getrusage(resource.RUSAGE_SELF)\n    return u.ru_utime + u.ru_stime\n\
             while used() < {secs}:\n    pass\n\
             total = globals().get('total', 0) + 1\n\
             [os.getppid(), os.getpid()]"
        )
    };
    let r = py_in(&s, "import os\n[os.getppid(), os.getpid()]").await;
    let (_, mut last) = pids(&r);
    // Six cells of 0.4 s each: 2.4 s in all, more than the limit, in one
    // line of processes that each became the state.
    for i in 0..6 {
        let r = py_in(&s, &burn(0.4)).await;
        assert_eq!(r.status, Status::Ok, "cell {i}: {r:?}");
        assert_eq!(r.state, Some(StateOutcome::Kept), "cell {i}: {r:?}");
        let (parent, me) = pids(&r);
        assert_eq!(parent, last, "cell {i} became the state: {r:?}");
        last = me;
    }
    // One that used half of the limit or more forks its successor instead.
    let r = py_in(&s, &burn(1.1)).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let (_, heavy) = pids(&r);
    let r = py_in(&s, "[os.getppid(), total]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = r.value.as_array().unwrap();
    assert_ne!(v[0].as_i64().unwrap(), heavy, "{r:?}");
    assert_eq!(v[1], json!(7), "{r:?}");
}

/// The pids (in the sandbox's PID namespace) of the processes in the pids
/// cgroup that `cgroup` (a cell's `/proc/self/cgroup`) names.
fn ns_pids_in_group(cgroup: &str) -> Vec<i64> {
    let path = pids_cgroup_of(cgroup);
    let procs = std::fs::read_to_string(format!("/sys/fs/cgroup/pids{path}/cgroup.procs")).unwrap();
    procs
        .lines()
        .filter_map(|pid| procs::status_field(pid, "NSpid:").parse().ok())
        .collect()
}

#[tokio::test]
async fn the_state_process_a_kept_cell_replaced_ends_after_the_result_without_a_next_cell() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import os\nx = 1\n[os.getppid(), os.getpid(), open('/proc/self/cgroup').read()]",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let v = r.value.as_array().unwrap();
    let (old, me) = (v[0].as_i64().unwrap(), v[1].as_i64().unwrap());
    let cgroup = v[2].as_str().unwrap().to_owned();
    // The state process the cell ran from is ended a moment after the
    // result (not by the next cell: none comes); the cell's own process
    // is the session's state now.
    let mut held = ns_pids_in_group(&cgroup);
    for _ in 0..200 {
        if !held.contains(&old) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        held = ns_pids_in_group(&cgroup);
    }
    assert!(
        !held.contains(&old),
        "the replaced state process {old} is still in the session's group: {held:?}"
    );
    assert!(held.contains(&me), "{me} is not in {held:?}");
    // Cells right after each other: each one's predecessor ends when the
    // next comes, and every cell runs from the one before.
    let mut last = me;
    for i in 2..=6 {
        let r = py_in(
            &s,
            &format!("x += 1\nassert x == {i}\n[os.getppid(), os.getpid()]"),
        )
        .await;
        assert_eq!(r.state, Some(StateOutcome::Kept), "cell {i}: {r:?}");
        let (parent, pid) = pids(&r);
        assert_eq!(parent, last, "cell {i}: {r:?}");
        last = pid;
    }
}
