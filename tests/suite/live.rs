//! Live Python sessions: every object survives between cells in the
//! session's state process, and a cell that does not succeed is rolled back
//! whole.

use super::common::*;
use cellbox::{PythonState, SessionConfig, StateOutcome, Status};
use serde_json::json;

#[tokio::test]
async fn objects_of_every_kind_survive_and_a_failed_cell_rolls_back() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import collections, re\n\
         c = collections.Counter('hello')\n\
         class P:\n    def __init__(self): self.n = 1\n\
         p = P()\n\
         rx = re.compile(r'l+')\n\
         g = (i * i for i in range(10))\n\
         f = open('kept.txt', 'w+')\n\
         f.write('abc'); f.flush()\n\
         def make():\n    k = 41\n    return lambda: k + 1\n\
         clo = make()\n\
         n = 1",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    assert!(r.vars.dropped.is_empty(), "nothing is dropped: {r:?}");
    assert!(r.vars.changed.contains(&"c".to_owned()), "{r:?}");
    let r = py_in(
        &s,
        "f.seek(0)\n[c['l'], p.n, rx.search('hello').group(), next(g), next(g), f.read(), clo(), n]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([2, 1, "ll", 0, 1, "abc", 42, 1]));
    assert_eq!(r.state, Some(StateOutcome::Kept));

    // A failed cell changes nothing: not the counter, not the generator.
    let r = py_in(&s, "c['z'] = 9\nnext(g)\np.n = 5\nn = 2\n1/0").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::RolledBack), "{r:?}");
    let r = py_in(&s, "[c['z'], next(g), p.n, n]").await;
    assert_eq!(r.value, json!([0, 4, 1, 1]), "{r:?}");

    // Nor does one that crashes the interpreter, exits or is timed out.
    for code in [
        "n = 3\nimport ctypes\nctypes.string_at(0)",
        "n = 4\nimport os\nos._exit(3)",
        "n = 5\nwhile True: pass",
        "n = 6\nimport os, time\nfor _ in range(1000):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)",
        "n = 7\nx = bytearray(3 << 30)",
        "n = 8\nimport os\nos.close(3)",
        "n = 9\nimport sys\nsys.modules.clear()\nraise SystemExit(2)",
    ] {
        let r = s
            .run(
                cellbox::CellRequest::new(cellbox::Language::Python, code)
                    .timeout(std::time::Duration::from_millis(1500)),
            )
            .await;
        assert_ne!(r.status, Status::Ok, "{code}: {r:?}");
        assert_eq!(r.state, Some(StateOutcome::RolledBack), "{code}: {r:?}");
        let r = py_in(&s, "n").await;
        assert_eq!(r.value, json!(1), "after {code}: {r:?}");
    }
}

#[tokio::test]
async fn checkpoints_are_kept_restored_and_bounded() {
    let sup = supervisor();
    let s = sup
        .session(SessionConfig {
            max_checkpoints: 2,
            ..Default::default()
        })
        .unwrap();
    let r = py_in(&s, "xs = [1, 2]\ncheckpoint('two')").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(s.checkpoints().await, vec!["two".to_owned()]);
    let r = py_in(&s, "xs.append(3)\nlen(xs)").await;
    assert_eq!(r.value, json!(3));
    s.restore("two").await.unwrap();
    assert_eq!(py_in(&s, "xs").await.value, json!([1, 2]));
    // A checkpoint survives a restore from it, and restore(...) in a cell.
    py_in(&s, "xs.append(9)").await;
    let r = py_in(&s, "restore('two')").await;
    assert_eq!(r.state, Some(StateOutcome::Restored), "{r:?}");
    assert_eq!(py_in(&s, "xs").await.value, json!([1, 2]));
    s.checkpoint("b").await.unwrap();
    let e = s.checkpoint("c").await.unwrap_err().to_string();
    assert!(e.contains("max_checkpoints"), "{e}");
    let e = s.restore("nope").await.unwrap_err().to_string();
    assert!(e.contains("no checkpoint named \"nope\""), "{e}");
    let e = s.checkpoint("../x").await.unwrap_err().to_string();
    assert!(e.contains("not a checkpoint name"), "{e}");
}

#[tokio::test]
async fn replay_sessions_still_carry_json_only() {
    let sup = supervisor();
    let s = sup
        .session(SessionConfig {
            python_state: PythonState::Replay,
            ..Default::default()
        })
        .unwrap();
    let r = py_in(
        &s,
        "import collections\nc = collections.Counter('ab')\nn = 1",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.state, None);
    assert_eq!(r.vars.dropped.len(), 1, "{r:?}");
    assert!(!s.is_live().await);
}

#[tokio::test]
async fn variables_set_from_outside_reach_the_live_namespace_even_after_a_failed_first_cell() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    s.set_var("context", json!("hello world")).await.unwrap();
    let r = py_in(&s, "n = len(context)\n1/0").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.state, Some(StateOutcome::RolledBack));
    let r = py_in(&s, "import re\nw = re.compile('o')\nlen(context)").await;
    assert_eq!(r.value, json!(11), "{r:?}");
    s.set_var("extra", json!([1, 2])).await.unwrap();
    let r = py_in(&s, "[extra, w.pattern]").await;
    assert_eq!(r.value, json!([[1, 2], "o"]), "{r:?}");
}

#[tokio::test]
async fn a_lost_state_process_is_reseeded_from_json_variables_and_definitions() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import threading\nlock = threading.Lock()\nx = 5\ndef f():\n    return x * 2",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    assert!(s.is_live().await);
    // The zygote (PID 1 of the namespace every state process is in) dies.
    let status = sup.pool_status().await;
    let zygote = status
        .python
        .iter()
        .find(|z| z.alive)
        .expect("a zygote")
        .pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut waited = 0;
    while s.is_live().await && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    assert!(!s.is_live().await, "the state process died with its zygote");
    let r = py_in(&s, "[x, f(), 'lock' in globals()]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([5, 10, false]), "{r:?}");
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("live namespace was lost")),
        "{r:?}"
    );
    assert_eq!(r.state, Some(StateOutcome::Kept));
}

#[tokio::test]
async fn a_live_cell_runs_in_its_sessions_group_and_what_it_leaves_is_killed() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let read = "import os\n(open('/proc/self/cgroup').read(), os.getppid())";
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = py_in(&s, read).await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.state, Some(StateOutcome::Kept));
        seen.push(r.value.clone());
    }
    let pids_of = |v: &serde_json::Value| -> String { pids_cgroup_of(v[0].as_str().unwrap()) };
    for v in &seen {
        // …/s<k>: the session's group, beside its state processes (a cell
        // is never moved by pid).
        let path = pids_of(v);
        let last = path.rsplit('/').next().unwrap();
        assert!(last.starts_with('s'), "{path}");
    }
    // Each later cell is the child of the state process the one before
    // left, not of the zygote (PID 1).
    assert!(seen[1][1].as_i64().unwrap() > 1, "{seen:?}");
    assert_ne!(seen[1][1], seen[2][1], "{seen:?}");
    // What a cell leaves running (a detached child) is killed when it
    // ends, whether it kept its namespace or not; the state lives on.
    let leave = |fail: bool| {
        format!(
            "import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n\
             open('stray', 'w').write(str(pid))\nkept = 1\n{}",
            if fail { "raise ValueError('after a stray')" } else { "" }
        )
    };
    // (Killed, it may still be a zombie for a moment, until the zygote
    // reaps it: a live one is still there after two seconds.)
    let check = "import os, time\npid = int(open('stray').read())\nalive = True\n\
                 for _ in range(200):\n    try:\n        os.kill(pid, 0)\n    \
                 except ProcessLookupError:\n        alive = False\n        break\n    \
                 time.sleep(0.01)\nalive";
    for fail in [false, true] {
        let r = py_in(&s, &leave(fail)).await;
        let want = if fail {
            StateOutcome::RolledBack
        } else {
            StateOutcome::Kept
        };
        assert_eq!(r.state, Some(want), "{r:?}");
        let r = py_in(&s, check).await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(
            r.value,
            json!(false),
            "a stray outlived its cell (failed: {fail})"
        );
    }
    assert_eq!(py_in(&s, "kept").await.value, json!(1));
    // Between cells the session holds its state process and, once that
    // has been idle a moment, its spare (the next cell's process, forked
    // ahead: a child of the state process); the first state process, and
    // each one a later cell replaced, are gone.
    // (A replaced one is killed, not waited for: it may take a moment.)
    let procs = format!("/sys/fs/cgroup/pids{}/cgroup.procs", pids_of(&seen[0]));
    let ppid = |pid: &str| -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(|p| p.trim().to_owned())
            .unwrap_or_default()
    };
    let one_state = |held: &str| -> bool {
        let pids: Vec<&str> = held.lines().collect();
        match pids.as_slice() {
            [_] => true,
            [a, b] => ppid(a) == *b || ppid(b) == *a,
            _ => false,
        }
    };
    let mut held = String::new();
    for _ in 0..200 {
        held = std::fs::read_to_string(&procs).unwrap();
        if one_state(&held) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(one_state(&held), "{procs}: {held}");
}

#[tokio::test]
async fn a_live_cell_shows_its_own_rich_values_only() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\nh = H()\nh",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.display.len(), 1, "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept));
    let r = py_in(&s, "1").await;
    assert!(
        r.display.is_empty(),
        "the last cell's items are not shown again: {r:?}"
    );
    let r = py_in(&s, "h").await;
    assert_eq!(r.display.len(), 1, "the kept object still shows: {r:?}");
}

/// One session's cell cannot signal or read another session's state
/// process (or its checkpoints): they share the zygote's PID namespace, so
/// it tries every pid there.
#[tokio::test]
async fn a_cell_cannot_reach_another_sessions_state_process() {
    let sup = supervisor();
    let victim = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &victim,
        "secret = object()\nmark = 'victim-state'\ncheckpoint('c')",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let attacker = sup.session(SessionConfig::default()).unwrap();
    py_in(&attacker, "x = 1").await;
    let r = py_in(
        &attacker,
        r#"
import os
me = os.getpid()
read = []
for pid in range(1, 4096):
    for f in ("environ", "cmdline", "maps", "mem"):
        try:
            with open("/proc/%d/%s" % (pid, f), "rb") as fh:
                if pid != me and b"victim-state" in fh.read(1 << 20):
                    read.append(pid)
        except OSError:
            pass
read
"#,
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        json!([]),
        "another session's memory was read: {r:?}"
    );
    // SIGKILL to every pid: its own session's processes may go (its state
    // processes are in its own Landlock domain), never the victim's.
    let _ = py_in(
        &attacker,
        "import os, signal\nfor pid in range(1, 4096):\n    if pid != os.getpid():\n        try: os.kill(pid, signal.SIGKILL)\n        except OSError: pass",
    )
    .await;
    let r = py_in(&victim, "[mark, type(secret).__name__]").await;
    assert_eq!(r.value, json!(["victim-state", "object"]), "{r:?}");
    assert_eq!(r.state, Some(StateOutcome::Kept));
    assert!(r.notes.is_empty(), "{r:?}");
    victim.restore("c").await.unwrap();
    assert_eq!(py_in(&victim, "mark").await.value, json!("victim-state"));
}

/// A session's live namespace is memory of the cells' cgroup while it is
/// open, and given back when it closes.
#[tokio::test]
async fn a_closed_sessions_live_memory_is_given_back() {
    let sup = supervisor();
    let usage = |sup: &cellbox::Supervisor| {
        let sup = sup.clone();
        async move {
            let path = sup
                .pool_status()
                .await
                .cells_memory_cgroup
                .expect("a cells cgroup");
            let dir = path.rsplit(' ').next().unwrap().to_owned();
            std::fs::read_to_string(format!("{dir}/memory.usage_in_bytes"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        }
    };
    let s = sup.session(SessionConfig::default()).unwrap();
    py_in(&s, "x = 1").await;
    let before = usage(&sup).await;
    let r = py_in(
        &s,
        "blob = bytearray(300 << 20)\nfor i in range(0, len(blob), 4096): blob[i] = 1",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    let held = s.memory_bytes().expect("the session's memory");
    assert!(held > 250 << 20, "{held}");
    assert!(usage(&sup).await > before + (250 << 20));
    drop(s);
    let mut after = usage(&sup).await;
    for _ in 0..100 {
        if after < before + (50 << 20) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        after = usage(&sup).await;
    }
    assert!(
        after < before + (50 << 20),
        "before {before}, after {after}"
    );
}

/// A session's state process is forked from the cell before it (or from a
/// checkpoint): the hundredth one must run as the first did. Each used to
/// serve from inside its predecessor's call stack, so a session failed with
/// a sandbox error after about two hundred successful cells.
#[tokio::test]
async fn a_long_session_keeps_a_shallow_stack_and_keeps_running() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let depth = "import inspect\nlen(inspect.stack())";
    let r = py_in(&s, &format!("n = 0\ncheckpoint('start')\n{depth}")).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let first = r.value.clone();
    for i in 1..=300 {
        let r = py_in(&s, "n += 1").await;
        assert_eq!(r.status, Status::Ok, "cell {i}: {r:?}");
        assert_eq!(r.state, Some(StateOutcome::Kept), "cell {i}: {r:?}");
        if i % 60 == 0 {
            // A restore makes the state process from a checkpoint's copy.
            s.restore("start").await.unwrap();
            let r = py_in(&s, "n = 60 * 1000").await;
            assert_eq!(r.status, Status::Ok, "after restore {i}: {r:?}");
        }
    }
    let r = py_in(&s, depth).await;
    assert_eq!(r.value, first, "the stack grew over the session: {r:?}");
    assert_eq!(py_in(&s, "n").await.value, json!(60 * 1000));
}

#[tokio::test]
async fn a_cell_that_kills_its_own_state_never_reports_it_kept() {
    // Every process of the session it can signal (its state process, the
    // checkpoint's, the successor it forked) killed: by the cell while it
    // runs, or by a process it leaves, once the cell's own process is gone.
    let killers = [
        "import os\nos.kill(-1, 9)\ny = 6\n'after'",
        "import os\n\
         if os.fork() == 0:\n\
         \x20   parent = os.getppid()\n\
         \x20   while os.getppid() == parent:\n\
         \x20       pass\n\
         \x20   while True:\n\
         \x20       try:\n\
         \x20           os.kill(-1, 9)\n\
         \x20       except OSError:\n\
         \x20           pass\n\
         y = 6\n\
         'after'",
    ];
    for (i, code) in killers.into_iter().enumerate() {
        let sup = supervisor();
        let s = sup.session(SessionConfig::default()).unwrap();
        let r = py_in(&s, "x = 5\nobj = object()\ncheckpoint('c')").await;
        assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
        let r = py_in(&s, code).await;
        // (The process left behind may be ended before it kills.)
        let killed = i == 0 || r.state != Some(StateOutcome::Kept);
        if r.state == Some(StateOutcome::Kept) {
            assert!(
                i > 0
                    || r.notes
                        .iter()
                        .any(|n| n.contains("was killed while it ran")),
                "{code}: {r:?}"
            );
            // Only if the namespace the cell left really is the session's.
            let next = py_in(&s, "[x, y, 'obj' in globals()]").await;
            assert_eq!(next.status, Status::Ok, "{code}: {r:?} then {next:?}");
            assert_eq!(
                next.value,
                json!([5, 6, true]),
                "{code}: {r:?} then {next:?}"
            );
            assert!(next.notes.is_empty(), "{code}: {r:?} then {next:?}");
        } else {
            assert_eq!(r.state, Some(StateOutcome::RolledBack), "{code}: {r:?}");
            assert!(
                r.notes.iter().any(|n| n.contains("state process")),
                "{code}: a lost state is said: {r:?}"
            );
            let next = py_in(&s, "[x, 'y' in globals()]").await;
            assert_eq!(
                next.status,
                Status::Ok,
                "{code}: the next cell runs: {next:?}"
            );
            assert_eq!(next.value, json!([5, false]), "{code}: {next:?}");
        }
        // The checkpoint's process is gone too: restoring it says so (at
        // once: no answer is waited for from a process that is gone).
        if killed {
            let e = s.restore("c").await.unwrap_err().to_string();
            assert!(e.contains("checkpoint \"c\" is gone"), "{code}: {e}");
            assert!(s.checkpoints().await.is_empty(), "{code}: it is dropped");
        } else {
            s.restore("c").await.unwrap();
        }
        let r = py_in(&s, "x + 1").await;
        assert_eq!(r.status, Status::Ok, "{code}: {r:?}");
        assert_eq!(r.value, json!(6), "{code}: {r:?}");
    }
}

#[tokio::test]
async fn an_idle_state_process_runs_its_next_cell_in_a_spare_forked_ahead() {
    let sup = supervisor();
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &s,
        "import os\nx = 1\n[open('/proc/self/cgroup').read(), os.getpid()]",
    )
    .await;
    assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
    // The session's state process: the kept cell's own process (see
    // `live_keep`), by its pid in the sandbox's PID namespace.
    let mut state = r.value[1].to_string();
    let pids = pids_cgroup_of(r.value[0].as_str().unwrap());
    let procs = format!("/sys/fs/cgroup/pids{pids}/cgroup.procs");
    let status = procs::status_field;
    // The state process's spare: its child, once it has been idle a
    // moment (and the state process the cell replaced is gone); its pid in
    // the sandbox's PID namespace.
    let spare = |state: &str| -> Option<(String, String)> {
        let held = std::fs::read_to_string(&procs).ok()?;
        let pids: Vec<&str> = held.lines().collect();
        let [a, b] = pids.as_slice() else {
            return None;
        };
        let (parent, child) = if status(a, "NSpid:") == state {
            (a, b)
        } else {
            (b, a)
        };
        (status(parent, "NSpid:") == state && status(child, "PPid:") == **parent)
            .then(|| (status(child, "NSpid:"), child.to_string()))
    };
    for round in 0..4 {
        let mut found = None;
        for _ in 0..500 {
            found = spare(&state);
            if found.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (ns_pid, host) = found.unwrap_or_else(|| panic!("round {round}: no spare in {procs}"));
        if round == 3 {
            // A spare gone before its cell comes (a cell may kill its
            // session's processes): the cell is forked then instead. (The
            // session is frozen: the spare dies once its cell thaws it.)
            let pid: i32 = host.parse().unwrap();
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
                .unwrap();
            for _ in 0..500 {
                if !super::common::can_run(pid) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        // The next cell runs in it, under its own limits, and a cell that
        // fails there rolls back as any does.
        let code = match round {
            0 => "import os\nx = 2\nos.getpid()",
            1 => "import os\nx = 3\nb = bytearray(3 << 30)\nos.getpid()",
            _ => "import os\n[x, os.getpid()]",
        };
        let r = py_in(&s, code).await;
        match round {
            0 => {
                assert_eq!(r.status, Status::Ok, "{r:?}");
                assert_eq!(r.value.to_string(), ns_pid, "{r:?}");
                // Kept: the cell's own process is the state now.
                assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
                state = ns_pid.clone();
            }
            1 => {
                assert_ne!(r.status, Status::Ok, "{r:?}");
                assert_eq!(r.state, Some(StateOutcome::RolledBack), "{r:?}");
            }
            2 => {
                assert_eq!(r.status, Status::Ok, "{r:?}");
                assert_eq!(r.value, json!([2, ns_pid.parse::<i64>().unwrap()]), "{r:?}");
                assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
                state = ns_pid.clone();
            }
            _ => {
                assert_eq!(r.status, Status::Ok, "{r:?}");
                assert_eq!(r.value[0], json!(2), "{r:?}");
                assert_ne!(r.value[1].to_string(), ns_pid, "{r:?}");
                assert_eq!(r.state, Some(StateOutcome::Kept), "{r:?}");
            }
        }
    }
}
