//! Python cells end to end: the library and the binary, through the real
//! worker, sandbox and runtime shim (src/worker/python/shim.py).
//!
//! Tests that show an isolation property first check, from the cell's own
//! sandbox report, that the layer they depend on was applied, and fail
//! loudly naming it if not (a bomb is never let loose on an unlimited host).

use super::common::*;
use cellbox::{CellRequest, CellResult, Language, SessionConfig, Status, Supervisor};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn py(code: &str) -> CellResult {
    run_once(Language::Python, code, &[]).await
}

/// Panic unless every named sandbox layer was applied to this cell.
fn require_layers(r: &CellResult, layers: &[&str]) {
    let report = r
        .sandbox
        .as_ref()
        .unwrap_or_else(|| panic!("no sandbox report in {r:?}"));
    for want in layers {
        let applied = report.layers.iter().any(|l| l.name == *want && l.applied);
        assert!(
            applied,
            "the {want:?} sandbox layer was not applied ({:?}); this test needs it and will not run its payload without it",
            report.layers
        );
    }
}

#[tokio::test]
async fn last_value_and_print_capture() {
    let r = py("import sys\nprint('hello')\nprint('warn', file=sys.stderr)\nx = 6\nx * 7").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.language, "python");
    assert_eq!(r.value, json!(42));
    assert_eq!(r.stdout, "hello\n");
    assert_eq!(r.stderr, "warn\n");
    assert_eq!(r.exit.code, Some(0));
    let r = py("{'a': [1, 2.5, None, True], 't': (1, 2)}").await;
    assert_eq!(r.value, json!({"a": [1, 2.5, null, true], "t": [1, 2]}));
    let r = py("{1, 2}").await;
    assert_eq!(
        r.value,
        json!("{1, 2}"),
        "non-JSON values come back as repr"
    );
    let r = py("x = 1").await;
    assert_eq!(r.value, Value::Null);
}

#[tokio::test]
async fn exceptions_have_traceback_and_cell_lines() {
    let r = py("x = 0\ndef f(d):\n    return 10 / d\n\nf(x)\n").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.unwrap();
    assert_eq!(e.kind, "ZeroDivisionError");
    assert_eq!(e.message, "division by zero");
    assert_eq!(e.line, Some(3));
    assert_eq!(e.column, Some(12));
    assert_eq!(
        e.traceback.as_deref(),
        Some(
            "Traceback (most recent call last):\n  File \"<cell>\", line 5, in <module>\n    f(x)\n  File \"<cell>\", line 3, in f\n    return 10 / d\nZeroDivisionError: division by zero\n"
        )
    );
    let r = py("x = (1,\n").await;
    let e = r.error.unwrap();
    assert_eq!(e.kind, "SyntaxError");
    assert_eq!(e.line, Some(1));
    let r = py("def f(n):\n    return f(n + 1)\nf(0)").await;
    assert_eq!(r.status, Status::Error, "RecursionError is a plain error");
    let e = r.error.unwrap();
    assert_eq!(e.kind, "RecursionError");
    assert!(e.traceback.unwrap().contains("[Previous line repeated"));
}

#[tokio::test]
async fn stdlib_imports_work() {
    let r = py("import json, re, math, collections\n[json.dumps({'a': 1}), re.findall(r'\\d', 'a1b2'), math.isqrt(17), collections.Counter('abca')['a']]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(["{\"a\": 1}", ["1", "2"], 4, 2]));
}

#[tokio::test]
async fn network_connect_to_a_local_listener_fails_and_the_listener_sees_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    out = 'connected'\nexcept OSError as e:\n    out = [type(e).__name__, e.errno]\nout"
    );
    let r = py(&code).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = r.value.as_array().cloned().unwrap_or_default();
    assert_eq!(v.len(), 2, "the connection was made: {:?}", r.value);
    let errno = v[1].as_i64().unwrap_or(-1) as i32;
    assert!(
        [
            libc::EPERM,
            libc::EACCES,
            libc::ENETUNREACH,
            libc::EAFNOSUPPORT
        ]
        .contains(&errno),
        "unexpected failure {:?}",
        r.value
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the listener saw a connection: {other:?}"),
    }
}

#[tokio::test]
async fn reading_secrets_and_writing_outside_scratch_fail() {
    // Denied by Landlock or the dropped privileges (EACCES), or absent from
    // the cell's own root (ENOENT): never read.
    let r = py("try:\n    open('/etc/shadow').read()\n    out = 'read'\nexcept OSError as e:\n    out = [type(e).__name__, e.errno]\nout").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let errno = r.value[1].as_i64().unwrap_or(-1) as i32;
    assert!(
        [libc::EACCES, libc::EPERM, libc::ENOENT].contains(&errno),
        "/etc/shadow: {:?}",
        r.value
    );

    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("python-escape-{}", std::process::id()));
    let _ = std::fs::remove_file(&target);
    let code = format!(
        "try:\n    open({:?}, 'w').write('escaped')\n    out = 'written'\nexcept OSError as e:\n    out = [type(e).__name__, e.errno]\nout",
        target.display().to_string()
    );
    let r = py(&code).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(
        r.value.is_array(),
        "a write outside scratch succeeded: {:?}",
        r.value
    );
    assert!(!target.exists(), "{} was written", target.display());

    // The scratch directory itself is writable.
    let r = py("open('note.txt', 'w').write('ok')\nopen('note.txt').read()").await;
    assert_eq!(r.value, json!("ok"), "{r:?}");
}

#[tokio::test]
async fn subprocess_and_libc_system_cannot_run_programs() {
    let r = py("import subprocess\ntry:\n    subprocess.run(['/bin/sh', '-c', 'true'])\n    out = 'ran'\nexcept OSError as e:\n    out = [type(e).__name__, e.errno]\nout").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.value.is_array(), "/bin/sh ran: {:?}", r.value);

    let r = py("import ctypes, os\nrc = ctypes.CDLL(None).system(b'echo pwned > pwned.txt')\n[rc, os.path.exists('pwned.txt')]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_ne!(r.value[0], json!(0), "system() succeeded: {:?}", r.value);
    assert_eq!(r.value[1], json!(false), "the command ran: {:?}", r.value);
}

#[tokio::test]
async fn host_capability_round_trip() {
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .capability(add_capability())
        .unwrap()
        .build()
        .unwrap();
    let code = "bad = None\ntry:\n    add('x', 2)\nexcept ValueError as e:\n    bad = 'ValueError'\n[add(40, 2), add(a=1, b=2), call('add', a=3, b=4), call('add', {'a': 5, 'b': 6}), bad]";
    let r = sup
        .run(CellRequest::new(Language::Python, code), config(&["add"]))
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([42, 3, 7, 11, "ValueError"]));
    let outcomes: Vec<(&str, &str)> = r
        .calls
        .iter()
        .map(|c| (c.cap.as_str(), c.outcome.as_str()))
        .collect();
    assert_eq!(outcomes[0].0, "add");
    assert_eq!(outcomes.len(), 5);
}

#[tokio::test]
async fn denied_capability_raises_permission_error() {
    // A denied capability is not in the cell's namespace; called by name
    // through `capabilities`, the supervisor refuses it.
    let code = "try:\n    emit(1)\nexcept NameError:\n    absent = True\n\
                try:\n    capabilities.answer(1)\nexcept PermissionError as e:\n    msg = str(e)\n\
                absent, msg";
    let r = run_once(Language::Python, code, &[]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value[0], json!(true), "{r:?}");
    assert!(
        r.value[1].as_str().unwrap_or("").contains("answer"),
        "{r:?}"
    );
    assert_eq!(r.calls.len(), 1, "{r:?}");
    assert_eq!(r.calls[0].outcome, "denied");
    // Uncaught, the denial ends the cell as policy_denied.
    let r = run_once(Language::Python, "capabilities.answer(1)", &[]).await;
    assert_eq!(r.status, Status::PolicyDenied, "{r:?}");
    assert_eq!(r.error.unwrap().kind, "PermissionError");
    // Allowed, it works and sets the final answer.
    let r = run_once(Language::Python, "answer({'n': 42})", &["answer"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.final_answer, Some(json!({"n": 42})));
}

#[tokio::test]
async fn run_cell_recursion_python_rhai_python_is_one_event_tree() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let sup = with_events(&events);
    let mut cfg = config(&["run_cell"]);
    cfg.policy.max_depth = 2;
    let code = r#"run_cell("rhai", 'run_cell("python", "6 * 7") + 0')"#;
    let r = sup
        .run(CellRequest::new(Language::Python, code), cfg.clone())
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    let (text, starts) = cell_starts(&events);
    assert_eq!(starts.len(), 3, "{text}");
    let (root, child, grand) = (&starts[0], &starts[1], &starts[2]);
    assert_eq!(
        [&root["language"], &child["language"], &grand["language"]],
        [&json!("python"), &json!("rhai"), &json!("python")]
    );
    assert_eq!(
        [&root["depth"], &child["depth"], &grand["depth"]],
        [&json!(0), &json!(1), &json!(2)]
    );
    assert!(root["parent_run_id"].is_null());
    assert_eq!(child["parent_run_id"], root["run_id"]);
    assert_eq!(grand["parent_run_id"], child["run_id"]);
    assert_eq!(grand["root_run_id"], root["run_id"]);
    // One level deeper is refused, and the refusal is a catchable error.
    let code = r#"
try:
    run_cell("rhai", 'run_cell("python", "run_cell(\'rhai\', \'1\')")')
    out = "ran"
except Exception as e:
    out = type(e).__name__
out"#;
    let r = sup.run(CellRequest::new(Language::Python, code), cfg).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_ne!(r.value, json!("ran"), "{r:?}");
}

#[tokio::test]
async fn namespace_persists_values_functions_classes_and_imports_over_three_cells() {
    let sup = supervisor();
    let s = sup.session(replay(config(&[]))).unwrap();
    let r = py_in(
        &s,
        "import math\nfrom collections import OrderedDict as OD\nn = 2\ndata = {'xs': [1, 2]}\ndef area(r):\n    return round(math.pi * r * r, 1)\nclass Box:\n    def __init__(self, v):\n        self.v = v\n",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.vars.changed, vec!["n", "data"]);
    assert!(r.vars.dropped.is_empty(), "{:?}", r.vars.dropped);
    let r = py_in(
        &s,
        "n += 1\ndata['xs'].append(area(1))\nimport json\ndef dump(o):\n    return json.dumps(OD(v=Box(o).v))\n",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let r = py_in(&s, "[n, data, area(2), Box(5).v, dump(n), math.sqrt(9)]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        json!([3, {"xs": [1, 2, 3.1]}, 12.6, 5, "{\"v\": 3}", 3.0])
    );
    assert_eq!(s.get_var("n").await, Some(json!(3)));
    let names: Vec<Vec<String>> = s.definitions().await.into_iter().map(|d| d.1).collect();
    for want in ["math", "OD", "area", "Box", "json", "dump"] {
        assert!(
            names.iter().any(|n| n.iter().any(|x| x == want)),
            "{want} not carried: {names:?}"
        );
    }
}

#[tokio::test]
async fn a_failing_cell_changes_nothing() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    py_in(&s, "x = 1\ndef f():\n    return 'one'").await;
    let before = s.vars().await;
    let r = py_in(
        &s,
        "x = 99\ny = 2\ndef f():\n    return 'two'\nraise RuntimeError('boom')",
    )
    .await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(s.vars().await, before);
    let r = py_in(&s, "[x, f(), 'y' in globals()]").await;
    assert_eq!(r.value, json!([1, "one", false]), "{r:?}");
}

#[tokio::test]
async fn values_that_cannot_be_carried_are_reported() {
    let sup = supervisor();
    let s = sup.session(replay(config(&[]))).unwrap();
    let r = py_in(
        &s,
        "class P:\n    pass\ngen = (i for i in range(3))\nfn = lambda: 1\nobj = P()\nnan = float('nan')\nok = [1, 'a']\n",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let dropped: Vec<(&str, &str)> = r
        .vars
        .dropped
        .iter()
        .map(|d| (d.name.as_str(), d.type_name.as_str()))
        .collect();
    assert_eq!(
        dropped,
        vec![
            ("gen", "generator"),
            ("fn", "function"),
            ("obj", "P"),
            ("nan", "float")
        ]
    );
    assert!(r.vars.dropped.iter().all(|d| !d.reason.is_empty()));
    assert_eq!(s.vars().await.keys().collect::<Vec<_>>(), vec!["ok"]);
}

#[tokio::test]
async fn names_a_cell_binds_over_capabilities_are_its_own_and_carried() {
    let sup = supervisor();
    let s = sup.session(replay(config(&["answer"]))).unwrap();
    let r = py_in(&s, "answer = 5\ndef call(*a):\n    return 0\n").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.vars.dropped.is_empty(), "{r:?}");
    let r = py_in(&s, "answer, call(1)").await;
    assert_eq!(r.value, json!([5, 0]), "{r:?}");
    assert!(r.calls.is_empty());
    // Without the cell's own names the capabilities answer again.
    let r = py_in(&s, "del answer, call\nanswer(7)").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.final_answer, Some(json!(7)));
}

#[tokio::test]
async fn del_and_atexit_side_effects_do_not_outlive_the_cell() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    let r = py_in(
        &s,
        "import atexit\nclass Mark:\n    def __del__(self):\n        open('del.txt', 'w').write('x')\nm = Mark()\natexit.register(lambda: open('atexit.txt', 'w').write('x'))\n",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let r = py_in(
        &s,
        "import os\n[os.path.exists('del.txt'), os.path.exists('atexit.txt')]",
    )
    .await;
    assert_eq!(r.value, json!([false, false]), "{r:?}");
}

#[tokio::test]
async fn timeout_mid_sleep_and_mid_c_loop() {
    let sup = supervisor();
    for code in [
        "import time\nprint('going', flush=True)\ntime.sleep(10**6)",
        "print('going', flush=True)\nx = 10**10**8",
    ] {
        let mut cfg = config(&[]);
        cfg.limits.timeout_ms = 1000;
        let t0 = Instant::now();
        let r = sup.run(CellRequest::new(Language::Python, code), cfg).await;
        assert_eq!(r.status, Status::Timeout, "{code}: {r:?}");
        assert_eq!(r.stdout, "going\n", "{code}: {r:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{code}: {:?}",
            t0.elapsed()
        );
    }
}

#[tokio::test]
async fn memory_bomb_ends_as_limit_exceeded() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.rlimits.memory_bytes = 256 * 1024 * 1024;
    // One large allocation first: harmless on a host without the limit.
    let r = sup
        .run(
            CellRequest::new(Language::Python, "x = bytearray(512 * 1024 * 1024)\nlen(x)"),
            cfg.clone(),
        )
        .await;
    require_layers(&r, &["rlimits"]);
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
    assert!(
        r.error.as_ref().unwrap().message.contains("memory"),
        "{r:?}"
    );
    // Then a growing one.
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "hog = []\nwhile True:\n    hog.append(bytearray(4 * 1024 * 1024))",
            ),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::LimitExceeded, "{r:?}");
}

#[tokio::test]
async fn fork_bomb_stops_at_the_process_limit() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.rlimits.max_processes = 16;
    cfg.limits.timeout_ms = 10_000;
    let probe = sup
        .run(CellRequest::new(Language::Python, "1"), cfg.clone())
        .await;
    // RLIMIT_NPROC binds only a process without CAP_SYS_RESOURCE/ADMIN.
    require_layers(&probe, &["rlimits", "privileges"]);
    let code = "import os, time\nn = 0\nerr = None\ntry:\n    while n < 10000:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    err = e.errno\n[n, err]";
    let r = sup.run(CellRequest::new(Language::Python, code), cfg).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let n = r.value[0].as_u64().unwrap_or(u64::MAX);
    assert!(n < 16, "{} forks succeeded: {r:?}", n);
    assert_eq!(r.value[1], json!(libc::EAGAIN), "{r:?}");
}

#[tokio::test]
async fn print_flood_of_200_mb_is_capped() {
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.max_output_bytes = 64 * 1024;
    cfg.limits.timeout_ms = 60_000;
    let code = "import sys\nchunk = 'x' * (1 << 20) + '\\n'\nfor _ in range(200):\n    sys.stdout.write(chunk)\n'done'";
    let r = sup.run(CellRequest::new(Language::Python, code), cfg).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!("done"));
    let t = r.truncated.stdout.expect("stdout was not marked truncated");
    assert_eq!(t.total_bytes, 200 * ((1 << 20) + 1));
    assert_eq!(t.kept_head + t.kept_tail, 64 * 1024);
    assert!(r.stdout.len() < 80 * 1024, "{} bytes kept", r.stdout.len());
}

#[test]
fn cli_runs_python_from_stdin_from_a_py_file_and_in_the_repl() {
    let out = cellbox(
        &["run", "--lang", "python", "-"],
        Some("print('hey')\n6 * 7\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hey\n42\n");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cell.py");
    std::fs::write(&file, "import math\nmath.factorial(5)\n").unwrap();
    let out = cellbox(&["run", "--json", file.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["language"], "python");
    assert_eq!(v["value"], 120);

    let out = cellbox(&["run", "--lang", "python", "-"], Some("1/0\n"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ZeroDivisionError"));

    let out = cellbox(
        &["repl", "--lang", "python"],
        Some("def sq(v):\n    return v * v\n\nx = sq(6)\nx + 6\n:quit\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("42"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The shim's own protocol-level suite (tests/python/test_shim.py) plays the
/// supervisor over a socketpair; it runs here so CI runs it.
#[test]
fn shim_protocol_suite() {
    let python = "/usr/bin/python3";
    assert!(
        std::path::Path::new(python).exists(),
        "{python} is needed to run tests/python/test_shim.py"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(python)
        .arg("-B")
        .arg(format!("{root}/tests/python/test_shim.py"))
        .env_clear()
        .current_dir(root)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tests/python/test_shim.py failed:\n{report}"
    );
    assert!(report.matches("\nOK").count() == 2, "{report}");
}

#[tokio::test]
async fn default_config_runs_python() {
    let r = supervisor()
        .run(
            CellRequest::new(Language::Python, "import sys\nsys.version_info[0]"),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(3));
}

#[tokio::test]
async fn carried_floats_and_ints_round_trip_exactly() {
    let sup = supervisor();
    let s = sup.session(config(&[])).unwrap();
    let r = py_in(
        &s,
        "import random\nrandom.seed(7)\nxs = [random.random() * 10 ** random.randint(-300, 300) for _ in range(2000)] + [0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0]\nints = [2**63 - 1, -2**63, 2**64 - 1]\nwant = [repr(x) for x in xs + ints]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let r = py_in(
        &s,
        "got = [repr(x) for x in xs + ints]\n[i for i, (a, b) in enumerate(zip(want, got)) if a != b][:5]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        json!([]),
        "values changed on the way through the session"
    );
}

#[tokio::test]
async fn deleting_or_rebinding_a_definition_forgets_it() {
    let sup = supervisor();
    let s = sup.session(replay(SessionConfig::default())).unwrap();
    let r = py_in(&s, "def f():\n    return 1\ndef g():\n    return 2").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let r = py_in(&s, "del f\ng = lambda: 3").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let r = py_in(&s, "f()").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.error.unwrap().kind, "NameError");
    let r = py_in(&s, "g()").await;
    assert_eq!(r.status, Status::Error, "the stale def g came back: {r:?}");
}

#[tokio::test]
async fn a_call_flood_that_never_reads_replies_cannot_hold_the_supervisor() {
    // Raw `call` frames straight onto the protocol fd, replies never read:
    // the supervisor's writes back block once the socket buffer is full.
    let code = r#"
import os, struct
frame = b'{"t":"call","id":1,"cap":"emit","args":{"event":"' + b"x" * 60000 + b'"}}'
msg = struct.pack(">I", len(frame)) + frame
while True:
    os.write(3, msg)
"#;
    let sup = supervisor();
    let mut cfg = config(&["emit"]);
    cfg.limits.timeout_ms = 3000;
    cfg.policy.max_calls = 1_000_000;
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        sup.run(CellRequest::new(Language::Python, code), cfg),
    )
    .await
    .expect("the supervisor hung on a worker that does not read its replies");
    assert!(
        matches!(r.status, Status::Timeout | Status::ProtocolError),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_frame_that_starts_and_stalls_is_a_protocol_error() {
    // A length prefix promising 1000 bytes, 10 of them, then silence: the
    // supervisor must not wait for the rest until the wall-clock deadline.
    let code = "import os, struct, time\nos.write(3, struct.pack('>I', 1000) + b'{\"t\":\"log\"')\ntime.sleep(60)\n";
    let sup = supervisor();
    let mut cfg = config(&[]);
    cfg.limits.timeout_ms = 60_000;
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        sup.run(CellRequest::new(Language::Python, code), cfg),
    )
    .await
    .expect("the supervisor waited on a stalled frame");
    assert_eq!(r.status, Status::ProtocolError, "{r:?}");
    assert!(r.error.unwrap().message.contains("stalled"));
}
