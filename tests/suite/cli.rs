//! The command line: exit codes and clear messages for bad input.

use super::common::*;
use serde_json::Value;

#[test]
fn run_prints_output_and_value() {
    let out = cellbox(&["run", "-"], Some("print(\"hey\"); 6 * 7"));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hey\n42\n");
}

#[test]
fn run_json_is_the_result_object() {
    let out = cellbox(&["run", "--json", "--lang", "rhai", "-"], Some("1 + 1"));
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["value"], 2);
    for key in [
        "stdout",
        "stderr",
        "truncated",
        "error",
        "final_answer",
        "vars",
        "calls",
        "usage",
        "run",
        "sandbox",
        "exit",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
}

#[test]
fn exit_codes_follow_the_status() {
    assert_eq!(
        cellbox(&["run", "-"], Some("throw 1")).status.code(),
        Some(1)
    );
    assert_eq!(
        cellbox(
            &["run", "--timeout", "0.5", "--max-operations", "0", "-"],
            Some("loop {}")
        )
        .status
        .code(),
        Some(3)
    );
    assert_eq!(
        cellbox(&["run", "--max-operations", "1000", "-"], Some("loop {}"))
            .status
            .code(),
        Some(4)
    );
    assert_eq!(
        cellbox(&["run", "-"], Some("answer(1)")).status.code(),
        Some(5)
    );
    assert_eq!(
        cellbox(&["run", "--allow", "answer", "-"], Some("answer(1)"))
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn bad_input_gets_a_clear_message() {
    let out = cellbox(&["run", "/no/such/file.rhai"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open /no/such/file.rhai"));

    let out = cellbox(&["run", "--lang", "cobol", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown language"));

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("script.txt");
    std::fs::write(&f, "1").unwrap();
    let out = cellbox(&["run", f.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lang"));

    let big = dir.path().join("big.rhai");
    std::fs::write(&big, "1;".repeat(600_000)).unwrap();
    let out = cellbox(&["run", big.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_script_bytes"));

    // A shell script is an argument of /bin/sh: a C string, no NUL inside.
    let out = cellbox(&["run", "--lang", "shell", "-"], Some("echo a\0b"));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot contain a NUL byte (found at byte 6)"),
        "{out:?}"
    );

    let bin = dir.path().join("bin.rhai");
    std::fs::write(&bin, b"1 + \xff\xfe").unwrap();
    let out = cellbox(&["run", bin.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8"));

    let out = cellbox(&["run", "--allow", "no good", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a capability name"));

    let out = cellbox(&["run", "--timeout", "-3", "-"], Some("1"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn repl_keeps_a_session_and_answers_commands() {
    let script = "let x = 40;\nfn add(a,\n b) { a + b }\n:set y 2\n:get y\nadd(x, y)\n:show vars\n:show history\n:call answer {\"value\": 1}\n:reset\n:show vars\n:quit\n";
    let out = cellbox(&["repl", "--allow", "answer"], Some(script));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "2", "{stdout}");
    assert_eq!(lines[1], "42", "{stdout}");
    assert!(stdout.contains("x = 40"), "{stdout}");
    assert!(stdout.contains("add (rhai definition)"), "{stdout}");
    assert!(stdout.contains("[3] rhai ok add(x, y)"), "{stdout}");
    assert!(stdout.contains("answer: 1"), "{stdout}");
    assert!(stdout.contains("namespace cleared"), "{stdout}");
    let after_reset = stdout.split("namespace cleared").nth(1).unwrap();
    assert!(!after_reset.contains("x = 40"), "{stdout}");
}

#[test]
fn doctor_reports_the_warm_workers() {
    let out = cellbox(&["doctor", "--json"], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warm = &v["warm_workers"];
    assert_eq!(warm["cells"]["rhai"], "ok", "{warm}");
    assert_eq!(warm["cells"]["python"], "ok", "{warm}");
    assert_eq!(warm["pools"]["rhai_fork_server"], true, "{warm}");
    assert!(
        warm["pools"]["python"]
            .as_array()
            .unwrap()
            .iter()
            .any(|z| z["alive"] == true),
        "{warm}"
    );
    // As root (CI), the scratch of all cells is bounded by a tmpfs.
    assert_eq!(
        warm["pools"]["scratch_quota_bytes"],
        1u64 << 30,
        "the suite runs as root, so the scratch quota must be enforced: {warm}"
    );
    let text = cellbox(&["doctor"], None);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("scratch          1024 MiB in all"), "{text}");
    // And each session's scratch by a tmpfs of its own.
    assert_eq!(
        warm["pools"]["session_scratch_quota"],
        serde_json::json!({"bytes": 256u64 << 20, "inodes": 16384}),
        "{warm}"
    );
    assert!(
        text.contains("session scratch  256 MiB and 16384 inodes per session"),
        "{text}"
    );
    // And sessions and cells apart, by cgroups of their own.
    assert_eq!(warm["pools"]["session_cgroups"], true, "{warm}");
    assert!(text.contains("sessions         a cgroup each"), "{text}");
    // And the memory of all cells by a memory cgroup.
    assert_eq!(
        warm["pools"]["cells_memory_bytes"],
        4u64 << 30,
        "the suite runs as root, so the cells' memory must be bounded: {warm}"
    );
    assert!(
        text.contains("memory           4096 MiB for all cells together (cgroup v"),
        "{text}"
    );
}

// `cellbox exec` (and `cellbox run` of a shell cell) runs its cell from the
// CLI process itself; these tests hold it to the library path's behaviour.

/// The same program through the library (worker process, tokio supervisor).
async fn library_exec(argv: &[&str], timeout_ms: Option<u64>) -> Value {
    let mut config = config(&[]);
    if let Some(t) = timeout_ms {
        config.limits.timeout_ms = t;
    }
    let argv = argv.iter().map(|s| s.to_string()).collect();
    // Bounded like `cellbox exec`'s one cell, so the reports match.
    let sup = cellbox::Supervisor::builder()
        .worker_exe(bin())
        .cells_memory_bytes(config.limits.rlimits.memory_bytes)
        .build()
        .unwrap();
    let r = sup.exec(argv, config, false).await;
    serde_json::to_value(&r).unwrap()
}

/// The keys of a JSON object, recursively, as dotted paths.
fn shape(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, v) in m {
            let p = format!("{prefix}.{k}");
            out.push(p.clone());
            shape(v, &p, out);
        }
    }
}

/// Take the cgroup layer's detail out of a result's `sandbox`.
fn cgroup_detail(sandbox: &mut Value) -> String {
    let Some(layers) = sandbox["layers"].as_array_mut() else {
        return String::new();
    };
    match layers.iter_mut().find(|l| l["name"] == "cgroup") {
        Some(l) => l["detail"].take().as_str().unwrap_or_default().to_owned(),
        None => String::new(),
    }
}

#[tokio::test]
async fn exec_json_is_the_library_result() {
    let cases: [&[&str]; 4] = [
        &["/bin/sh", "-c", "echo out; echo err >&2; exit 3"],
        &["/bin/sh", "-c", "echo fine"],
        // A fault the kernel forces even on PID 1 of the cell.
        &[
            "/usr/bin/python3",
            "-I",
            "-c",
            "import ctypes; ctypes.string_at(0)",
        ],
        &["/no/such/program"],
    ];
    for argv in cases {
        let (code, fast) = exec_json(&[], argv);
        let lib = library_exec(argv, None).await;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        shape(&fast, "", &mut a);
        shape(&lib, "", &mut b);
        assert_eq!(a, b, "{argv:?}: result shapes differ");
        for key in [
            "status",
            "execution_count",
            "language",
            "stdout",
            "stderr",
            "truncated",
            "value",
            "error",
            "final_answer",
            "vars",
            "calls",
            "sandbox",
            "exit",
        ] {
            let (mut f, mut l) = (fast[key].clone(), lib[key].clone());
            if key == "sandbox" {
                // A library cell's cgroup layer also names its session's
                // and its own cgroup (a one-shot cell has neither).
                let (fc, lc) = (cgroup_detail(&mut f), cgroup_detail(&mut l));
                assert!(lc.starts_with(&fc), "{argv:?}: {lc} / {fc}");
            }
            assert_eq!(f, l, "{argv:?}: {key}");
        }
        let status = fast["status"].as_str().unwrap();
        let want = match status {
            "ok" => 0,
            "error" => 1,
            "killed" => 4,
            "sandbox_error" => 6,
            other => panic!("{argv:?}: unexpected status {other}"),
        };
        assert_eq!(code, Some(want), "{argv:?}");
    }
    // Every layer applied, as the library reports it.
    let (_, r) = exec_json(&[], &["/bin/true"]);
    let layers: Vec<(&str, bool)> = r["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap(), l["applied"] == true))
        .collect();
    assert_eq!(
        layers,
        [
            ("hygiene", true),
            ("namespaces", true),
            ("rlimits", true),
            ("privileges", true),
            ("landlock", true),
            ("seccomp", true),
            ("cgroup", true)
        ]
    );
}

#[tokio::test]
async fn exec_timeout_is_the_library_timeout() {
    let argv = ["/bin/sh", "-c", "echo started; sleep 30"];
    let (code, fast) = exec_json(&["--timeout", "0.5"], &argv);
    let lib = library_exec(&argv, Some(500)).await;
    assert_eq!(code, Some(3));
    for key in ["status", "error", "stdout", "exit"] {
        assert_eq!(fast[key], lib[key], "{key}");
    }
    assert_eq!(fast["status"], "timeout");
    assert_eq!(
        fast["error"]["message"],
        "the cell ran past its wall-clock limit of 500 ms and was killed"
    );
    assert_eq!(fast["exit"]["signal"], 9);
    assert_eq!(fast["stdout"], "started\n");
}

/// Processes of the cell that are still running, found by a marker in
/// their command line.
fn running_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}

#[test]
fn exec_timeout_kills_the_whole_process_group() {
    // With the cell's own PID namespace (shipped profile) and without one
    // (namespaces off: only the group kill stops the background jobs).
    let mut p = cellbox::profiles::Profile::load("shell").unwrap();
    p.layers.namespaces = cellbox::profiles::LayerMode::Off;
    let dir = tempfile::tempdir().unwrap();
    let no_ns = dir.path().join("no-ns.toml");
    std::fs::write(&no_ns, toml::to_string(&p).unwrap()).unwrap();
    for (i, extra) in [vec![], vec!["--profile", no_ns.to_str().unwrap()]]
        .into_iter()
        .enumerate()
    {
        let marker = format!("{}.{}{}", 40 + i, std::process::id(), i);
        let script = format!("sleep {marker} & sleep {marker} & echo up; wait");
        let mut args = extra.clone();
        args.extend(["--timeout", "1"]);
        let (code, r) = exec_json(&args, &["/bin/sh", "-c", &script]);
        assert_eq!(code, Some(3), "{r:#}");
        assert_eq!(r["status"], "timeout");
        assert_eq!(r["stdout"], "up\n");
        let ns = r["sandbox"]["layers"][1]["applied"].clone();
        assert_eq!(ns, i == 0, "namespaces applied: {r:#}");
        assert_eq!(
            running_with(&marker),
            0,
            "background jobs outlived the cell"
        );
    }
}

#[test]
fn exec_output_is_capped_in_the_result_and_forwarded_whole() {
    let script = "head -c 100000 /dev/zero | tr '\\0' a; head -c 3000 /dev/zero | tr '\\0' b >&2";
    let (code, r) = exec_json(&["--max-output", "100"], &["/bin/sh", "-c", script]);
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(
        r["truncated"]["stdout"],
        serde_json::json!({"total_bytes": 100000, "kept_head": 50, "kept_tail": 50})
    );
    assert_eq!(
        r["truncated"]["stderr"],
        serde_json::json!({"total_bytes": 3000, "kept_head": 50, "kept_tail": 50})
    );
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.starts_with(&"a".repeat(50)) && stdout.ends_with(&"a".repeat(50)));
    assert!(stdout.contains("[... 99900 bytes omitted ...]"), "{stdout}");

    // Without --json the program's output passes through uncut.
    let out = cellbox(
        &["exec", "--max-output", "100", "--", "/bin/sh", "-c", script],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, vec![b'a'; 100_000]);
    assert_eq!(out.stderr, vec![b'b'; 3000]);
}

#[test]
fn exec_mirrors_the_exit_status_and_reports_failures() {
    let out = cellbox(&["exec", "--", "/bin/sh", "-c", "exit 42"], None);
    assert_eq!(out.status.code(), Some(42));
    assert!(out.stderr.is_empty(), "{out:?}");

    let out = cellbox(
        &[
            "exec",
            "--",
            "/usr/bin/python3",
            "-I",
            "-c",
            "import ctypes; ctypes.string_at(0)",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cellbox: Killed: the worker was killed by SIGSEGV [killed]\n"
    );

    let out = cellbox(&["exec", "--", "no-such-program-here"], None);
    assert_eq!(out.status.code(), Some(6));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was not found"),
        "{out:?}"
    );

    // The program cannot be executed inside the cell (Landlock: the
    // scratch directory is not executable).
    let (code, r) = exec_json(&[], &["/bin/sh", "-c", "cp /bin/true ./t && exec ./t"]);
    assert_eq!(code, Some(1));
    assert_eq!(r["exit"]["code"], 126, "{r:#}");
}

#[test]
fn a_shell_cell_runs_like_exec() {
    let out = cellbox(
        &["run", "--lang", "shell", "--json", "-"],
        Some("echo hi; id -u; exit 3"),
    );
    assert_eq!(out.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["language"], "shell");
    assert_eq!(r["stdout"], "hi\n65534\n");
    assert_eq!(r["error"]["message"], "the program exited with status 3");
    assert_eq!(r["sandbox"]["profile"], "shell");

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.sh");
    std::fs::write(&f, "echo from-file").unwrap();
    let out = cellbox(&["run", f.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-file\n");

    let out = cellbox(
        &["run", "--lang", "shell", "--timeout", "0.3", "-"],
        Some("sleep 5"),
    );
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn exec_events_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let out = cellbox(
        &[
            "exec",
            "--events",
            events.to_str().unwrap(),
            "--",
            "/bin/true",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&events).unwrap();
    let kinds: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["cell_start", "cell_end"]);
}

#[test]
fn exec_help_and_usage_errors_are_the_full_clis() {
    let out = cellbox(&["exec", "--help"], None);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.starts_with("Run any program under the sandbox"),
        "{help}"
    );
    assert!(
        help.contains("Usage: cellbox exec [OPTIONS] <ARGV>..."),
        "{help}"
    );
    assert!(help.contains("--max-output <BYTES>"), "{help}");

    let out = cellbox(&["exec"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("required arguments were not provided"));

    let out = cellbox(&["exec", "--timeout", "soon", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'soon'"));

    // Options after the program belong to the program.
    let out = cellbox(&["exec", "/bin/echo", "--json", "-x"], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "--json -x\n");
}

/// `cellbox exec` clones the cell sharing its memory, the cell writing its
/// own one-id maps; `CELLBOX_CLONE=parent-maps` takes the other way (the
/// one a refused fast way falls back to), and `self-maps-refused` makes the
/// fast way's child act as if the kernel had refused its maps: the parent
/// must reap it and fall back (its maps show the parent wrote them). All
/// end in the same sandbox and the same result.
#[test]
fn exec_clones_either_way_into_the_same_sandbox() {
    let probe = "cat /proc/self/uid_map /proc/self/gid_map /proc/self/setgroups; \
                 grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; \
                 id -u; echo x > f && cat f; ls /proc | grep -c '^[0-9]'";
    let root = nix::unistd::geteuid().is_root();
    let mut results = Vec::new();
    for way in [None, Some("parent-maps"), Some("self-maps-refused")] {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["exec", "--json", "--", "/bin/sh", "-c", probe]);
        match way {
            Some(w) => cmd.env("CELLBOX_CLONE", w),
            None => cmd.env_remove("CELLBOX_CLONE"),
        };
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{way:?}: {out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "ok", "{way:?}: {v}");
        let stdout = v["stdout"].as_str().unwrap().to_owned();
        let maps: Vec<Vec<&str>> = stdout
            .lines()
            .take_while(|l| !l.contains(':') && *l != "allow" && *l != "deny")
            .map(|l| l.split_whitespace().collect())
            .collect();
        let self_mapped = way.is_none();
        if root {
            let want: Vec<Vec<&str>> = if self_mapped {
                vec![vec!["65534", "65534", "1"]; 2]
            } else {
                let two = [vec!["0", "0", "1"], vec!["65534", "65534", "1"]];
                two.iter().chain(two.iter()).cloned().collect()
            };
            assert_eq!(maps, want, "{way:?}: {stdout}");
            let setgroups = if self_mapped { "deny" } else { "allow" };
            assert!(stdout.lines().any(|l| l == setgroups), "{way:?}: {stdout}");
        }
        for line in [
            "Groups:\t",
            "CapInh:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapEff:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "CapAmb:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
        ] {
            assert!(
                stdout.lines().any(|l| l.trim_end() == line.trim_end()),
                "{way:?}: {line:?} missing in {stdout}"
            );
        }
        let tail: Vec<&str> = stdout.lines().rev().take(3).collect();
        // Only the cell's own processes (sh, ls, grep) are in its /proc.
        let uid = if root {
            "65534".to_owned()
        } else {
            nix::unistd::geteuid().to_string()
        };
        assert_eq!(tail[2], uid, "{stdout}");
        assert_eq!(tail[1], "x", "{stdout}");
        let procs: usize = tail[0].parse().unwrap();
        assert!((1..=3).contains(&procs), "{stdout}");
        results.push(v);
    }
    for key in ["status", "exit", "sandbox", "stderr"] {
        for other in &results[1..] {
            assert_eq!(results[0][key], other[key], "{key}");
        }
    }
}

/// A one-shot cell's scratch directory is made in its new root (a
/// directory of its private `/tmp` tmpfs): owned by the cell, private,
/// bounded by that tmpfs, and nothing is made for it on the host. Without
/// namespaces it is a host directory, removed when the cell ends.
#[test]
fn exec_scratch_is_made_in_the_cell_or_is_a_host_dir_removed_after() {
    let probe = "pwd; stat -f -c %T .; stat -c '%u %a' .; \
                 head -c 40000000 /dev/zero > a && echo first; \
                 head -c 40000000 /dev/zero > b 2>/dev/null || echo second-refused";
    let (code, v) = exec_json(&[], &["/bin/sh", "-c", probe]);
    assert_eq!(code, Some(0), "{v}");
    let out = v["stdout"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = out.lines().collect();
    let scratch = std::path::Path::new(lines[0]);
    assert!(lines[0].starts_with("/tmp/cellbox-"), "{out}");
    assert_eq!(lines[1], "tmpfs", "{out}");
    let uid = if nix::unistd::geteuid().is_root() {
        "65534".to_owned()
    } else {
        nix::unistd::geteuid().to_string()
    };
    assert_eq!(lines[2], format!("{uid} 700"), "{out}");
    // 64 MiB of /tmp: one 40 MB file fits, a second does not.
    assert_eq!(&lines[3..], ["first", "second-refused"], "{out}");
    assert!(
        !scratch.exists(),
        "{} exists on the host",
        scratch.display()
    );

    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/shell.toml"
    ))
    .unwrap()
    .replace("namespaces = \"best_effort\"", "namespaces = \"off\"");
    assert!(text.contains("namespaces = \"off\""));
    let profile = dir.path().join("no-ns.toml");
    std::fs::write(&profile, text).unwrap();
    let (code, v) = exec_json(
        &["--profile", profile.to_str().unwrap()],
        &["/bin/sh", "-c", "pwd; echo x > f && cat f"],
    );
    assert_eq!(code, Some(0), "{v}");
    let out = v["stdout"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = out.lines().collect();
    let scratch = std::path::Path::new(lines[0]);
    assert_eq!(lines[1], "x", "{out}");
    assert!(
        scratch.starts_with(std::env::temp_dir()),
        "{} is not a host scratch dir",
        scratch.display()
    );
    assert!(!scratch.exists(), "{} left on the host", scratch.display());
    let layers = v["sandbox"]["layers"].as_array().unwrap();
    let ns = layers.iter().find(|l| l["name"] == "namespaces").unwrap();
    assert_eq!(ns["applied"], false, "{ns}");
}

/// Run a binary this test has just written. Another test's thread may fork
/// while the copy's fd is open for writing, and its child holds that fd
/// until it execs: the exec fails with ETXTBSY meanwhile, so try again.
fn retrying_busy<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    for _ in 0..100 {
        match start() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r,
        }
    }
    start()
}

fn output_retrying_busy(cmd: &mut std::process::Command) -> std::process::Output {
    retrying_busy(|| cmd.output()).unwrap()
}

/// The front binary runs `exec` itself and hands everything else to
/// `cellbox-engine` next to it; without the engine it says so.
#[test]
fn the_front_binary_hands_other_commands_to_the_engine() {
    let engine = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cellbox-engine"));
    assert_eq!(bin().parent(), engine.parent());
    let front = std::fs::metadata(bin()).unwrap().len();
    let full = std::fs::metadata(&engine).unwrap().len();
    assert!(front * 3 < full, "front {front} bytes, engine {full} bytes");
    // Through the front: the engine's answer, arguments and stdin intact.
    let out = cellbox(&["run", "--lang", "rhai", "-"], Some("40 + 2"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("42"),
        "{out:?}"
    );
    // Alone, the front binary still runs exec, and names what is missing
    // for anything else.
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("cellbox");
    std::fs::copy(bin(), &alone).unwrap();
    let out = output_retrying_busy(std::process::Command::new(&alone).args([
        "exec",
        "--",
        "/bin/echo",
        "fine",
    ]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
    let out = output_retrying_busy(
        std::process::Command::new(&alone)
            .args(["run", "x.rhai"])
            .env("PATH", "/usr/bin:/bin"),
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cellbox-engine"), "{err}");
    assert!(err.contains("nor on PATH"), "{err}");
}

/// `cellbox` works from PATH as from the build directory: through a
/// symlink to the build directory, as a copy of both binaries, and as a
/// copy of the front binary alone with the engine elsewhere on PATH.
#[test]
fn cellbox_works_from_path_as_from_the_build_directory() {
    let engine = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cellbox-engine"));
    let root = tempfile::tempdir().unwrap();
    let dir = |name: &str| {
        let d = root.path().join(name);
        std::fs::create_dir(&d).unwrap();
        d
    };
    let linked = dir("linked");
    std::os::unix::fs::symlink(bin(), linked.join("cellbox")).unwrap();
    let copied = dir("copied");
    std::fs::copy(bin(), copied.join("cellbox")).unwrap();
    std::fs::copy(&engine, copied.join("cellbox-engine")).unwrap();
    let front_only = dir("front-only");
    std::fs::copy(bin(), front_only.join("cellbox")).unwrap();
    let engine_dir = engine.parent().unwrap().to_str().unwrap().to_owned();
    let cases = [
        (
            linked.to_str().unwrap().to_owned(),
            "a symlink to the build",
        ),
        (
            copied.to_str().unwrap().to_owned(),
            "a copy of both binaries",
        ),
        (
            format!("{}:{engine_dir}", front_only.display()),
            "the front binary alone, the engine further on PATH",
        ),
    ];
    for (path, what) in cases {
        let path = format!("{path}:/usr/bin:/bin");
        let run = |args: &[&str], stdin: &str| {
            use std::io::Write;
            let mut cmd = std::process::Command::new("cellbox");
            cmd.args(args)
                .env("PATH", &path)
                .env_remove("CELLBOX_WORKER_EXE")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = retrying_busy(|| cmd.spawn()).unwrap_or_else(|e| panic!("{what}: {e}"));
            child
                .stdin
                .take()
                .unwrap()
                .write_all(stdin.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        };
        // The engine's commands, a Python cell (a worker the engine starts
        // again from its own file) and the front binary's own exec.
        let out = run(&["run", "-"], "40 + 2");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "42\n",
            "{what}: {out:?}"
        );
        let out = run(&["run", "--lang", "python", "-"], "6 * 7");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "42\n",
            "{what}: {out:?}"
        );
        let out = run(&["exec", "--", "/bin/echo", "ok"], "");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ok\n",
            "{what}: {out:?}"
        );
    }
}

/// A temporary directory owned by uid 1000 (mode 0755), for a test that
/// runs cellbox as that user; such a test needs root.
fn user_1000_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        panic!("this test runs cellbox as uid 1000 and needs root to do so");
    }
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(tmp.path(), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    tmp
}

/// `cellbox` run as uid 1000 (no groups), with a bare environment whose
/// HOME and TMPDIR are `dir` and stdin `/dev/null`; add its arguments.
fn cellbox_as_user_1000(dir: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=1000", "--regid=1000", "--clear-groups", "--"])
        .arg(bin())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("TMPDIR", dir)
        .stdin(std::process::Stdio::null());
    cmd
}

/// What a cell leaves in its scratch directory goes with it, whatever modes
/// and depth it left: a supervisor that is not root cannot remove entries of
/// a directory the cell made `chmod 0`, and a chain of directories deeper
/// than the supervisor's descriptor limit used to stop the removal too. Both
/// left the cell's files on the host disk. Run as a plain user (uid 1000,
/// descriptor limit 256), for a Python cell (a scratch beneath the
/// supervisor's scratch root) and for `exec` without namespaces (a host
/// scratch directory).
#[test]
fn what_a_cell_leaves_is_removed_whatever_modes_and_depth() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = user_1000_dir();
    let as_user = |args: &[&str]| {
        let out = std::process::Command::new("prlimit")
            .args([
                "--nofile=256:256",
                "--",
                "setpriv",
                "--reuid=1000",
                "--regid=1000",
            ])
            .args(["--clear-groups", "--"])
            .arg(bin())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", tmp.path())
            .env("TMPDIR", tmp.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let left = || -> Vec<String> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("cellbox-shim-"))
            .collect()
    };

    let py = tmp.path().join("leave.py");
    std::fs::write(
        &py,
        "import os\n\
         os.makedirs('locked/inner')\n\
         open('locked/inner/f', 'w').write('x')\n\
         os.chmod('locked/inner', 0)\n\
         os.chmod('locked', 0o500)\n\
         top = os.open('.', os.O_RDONLY)\n\
         for i in range(600):\n\
         \x20   os.mkdir('d')\n\
         \x20   os.chdir('d')\n\
         open('deepest', 'w').write('y')\n\
         os.chdir(top)\n\
         print('left', os.getcwd())\n",
    )
    .unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out) = as_user(&["run", "--lang", "python", py.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("left /"), "{out}");
    std::fs::remove_file(&py).unwrap();
    assert_eq!(left(), Vec::<String>::new(), "{out}");

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/shell.toml"
    ))
    .unwrap()
    .replace("namespaces = \"best_effort\"", "namespaces = \"off\"");
    let profile = tmp.path().join("no-ns.toml");
    std::fs::write(&profile, text).unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = "mkdir -p a/b && echo x > a/b/f && chmod 0 a/b && chmod 500 a && \
                  i=0; while [ $i -lt 400 ]; do mkdir d && cd d || exit 9; i=$((i+1)); done; \
                  echo made $i";
    let (code, out) = as_user(&[
        "exec",
        "--profile",
        profile.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("made 400"), "{out}");
    std::fs::remove_file(&profile).unwrap();
    assert_eq!(left(), Vec::<String>::new(), "{out}");
}

/// `cellbox exec` (and a shell cell run once) supervises one cell from its
/// own process: that process joins a memory cgroup of the cell's limit
/// first, so a program that forks is held to the limit in all, not per
/// process. Eight children touching 300 MiB each under 1 GiB: at most three
/// hold theirs at once, the rest are killed. Without root, in a cgroup v2
/// subtree delegated to the user (tests/vm.rs runs it so), the same.
#[test]
fn exec_holds_a_forking_program_to_the_memory_limit_in_all() {
    let code = format!("{MEMORY_FORK_PY}print(*held_killed)\n");
    // Time enough on an emulated machine too (tests/vm.rs).
    let (status, v) = exec_json(
        &["--memory", "1073741824", "--timeout", "180"],
        &["/usr/bin/python3", "-c", &code],
    );
    let cgroup = v["sandbox"]["layers"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "cgroup"))
        .map(|l| l["detail"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    if nix::unistd::geteuid().is_root() {
        assert!(cgroup.ends_with("1024 MiB in all"), "{v}");
    } else {
        let uid = nix::unistd::geteuid();
        assert!(
            cgroup.contains(&format!("in a subtree delegated to uid {uid}")),
            "without root the cell's memory cgroup needs a delegated cgroup v2 subtree \
             (run the suite as root): {v}"
        );
    }
    assert_eq!(status, Some(0), "{v}");
    let out = v["stdout"].as_str().unwrap_or_default();
    let n: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(n.len(), 2, "{v}");
    assert!(n[0] <= 3, "{} children held 300 MiB each: {v}", n[0]);
    assert_eq!(n[0] + n[1], 8, "{v}");
}

/// A profile that requires the cgroup layer refuses to run where there can
/// be none (a supervisor that is not root), saying which layer; one that
/// leaves it best-effort runs.
#[test]
fn a_required_cgroup_layer_that_cannot_be_made_refuses_the_cell() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = user_1000_dir();
    let shell = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/shell.toml"
    ))
    .unwrap();
    let required = shell.replace("cgroup = \"best_effort\"", "cgroup = \"required\"");
    assert_ne!(required, shell);
    let profile = tmp.path().join("req.toml");
    std::fs::write(&profile, required).unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |profile: &str| {
        cellbox_as_user_1000(tmp.path())
            .args([
                "exec",
                "--json",
                "--profile",
                profile,
                "--",
                "/bin/echo",
                "hi",
            ])
            .output()
            .unwrap()
    };
    let out = run(profile.to_str().unwrap());
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "sandbox_error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("the cgroup layer could not be applied"), "{v}");
    let out = run("shell");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn the_answer_is_printed_without_json() {
    let out = cellbox(
        &["run", "--allow", "answer", "-"],
        Some("print(\"working\"); answer(#{total: 42}); 7"),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "working\n7\nanswer: {\"total\":42}\n"
    );
    // The same cell with --json carries it in `final_answer`.
    let out = cellbox(
        &["run", "--json", "--allow", "answer", "-"],
        Some("answer(#{total: 42}); 7"),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["final_answer"]["total"], 42);
}

#[test]
fn a_one_shot_run_does_not_warn_about_values_it_could_not_keep() {
    let code = "import threading\nlock = threading.Lock()\nx = 1\n";
    // The cell does leave a value no session could keep (positive control).
    let out = cellbox(&["run", "--json", "--lang", "python", "-"], Some(code));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["vars"]["dropped"][0]["name"], "lock", "{v}");
    // A one-shot run has no session: nothing to warn about.
    let out = cellbox(&["run", "--lang", "python", "-"], Some(code));
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("not kept"), "{stderr}");
    // The REPL's session is live: the lock is kept, and the next cell
    // uses it.
    let repl = format!("{code}lock.acquire()\n");
    let out = cellbox(&["repl", "--lang", "python"], Some(&repl));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("not kept"), "{stderr}");
    assert!(stdout.contains("True"), "{stdout}\n{stderr}");
}

#[test]
fn a_directory_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for args in [
        vec!["run", d],
        vec!["run", "--lang", "shell", d],
        vec!["run", "--lang", "python", d],
        vec!["run", "/tmp"],
    ] {
        let out = cellbox(&args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = args.last().unwrap();
        assert!(
            stderr.contains(&format!("{name} is a directory")),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("extension"), "{args:?}: {stderr}");
    }
}

#[test]
fn run_help_says_what_the_language_defaults_to_and_it_is_so() {
    let out = cellbox(&["run", "--help"], None);
    let help = String::from_utf8_lossy(&out.stdout).replace(char::is_whitespace, " ");
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("Default: from the file's extension (.rhai, .py, .sh; any other is an error that asks for --lang); rhai for stdin (`-`) and the REPL"),
        "{help}"
    );
    // Each claim: an unknown extension is an error asking for --lang ...
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("script.txt");
    std::fs::write(&txt, "40 + 2").unwrap();
    let out = cellbox(&["run", txt.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lang"));
    // ... stdin is Rhai ...
    let out = cellbox(&["run", "-"], Some("let x = 40; x + 2"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    // ... and each extension picks its language.
    for (ext, code, lang) in [
        ("rhai", "1", "rhai"),
        ("py", "1", "python"),
        ("sh", "true", "shell"),
    ] {
        let f = dir.path().join(format!("cell.{ext}"));
        std::fs::write(&f, code).unwrap();
        let out = cellbox(&["run", "--json", f.to_str().unwrap()], None);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["language"], lang, "{v}");
    }
}

/// The `"landlock_abi": N` of the `--json` sample in docs/guide.md.
fn readme_landlock_abi() -> u64 {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md")).unwrap();
    let at = readme
        .find("\"landlock_abi\": ")
        .expect("the guide's sample shows landlock_abi");
    let rest = &readme[at + "\"landlock_abi\": ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a number")
}

#[test]
fn the_readme_sample_shows_the_landlock_abi_a_cell_gets() {
    let shown = readme_landlock_abi();
    for (lang, code) in [("rhai", "1"), ("python", "1"), ("shell", "true")] {
        let out = cellbox(&["run", "--json", "--lang", lang, "-"], Some(code));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            v["sandbox"]["landlock_abi"], shown,
            "{lang}: {}",
            v["sandbox"]
        );
    }
}

#[test]
fn doctor_names_the_cgroup_version_it_uses_for_memory() {
    let out = cellbox(&["doctor", "--json"], None);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kind = v["host"]["memory_cgroup"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("no memory cgroup here: {}", v["host"]));
    // What a cell really gets: its cgroup layer names the same hierarchy.
    let run = cellbox(&["run", "--json", "-"], Some("1"));
    let r: Value = serde_json::from_slice(&run.stdout).unwrap();
    let layer = r["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "cgroup")
        .unwrap()
        .clone();
    assert_eq!(layer["applied"], true, "{layer}");
    assert!(
        layer["detail"].as_str().unwrap().starts_with(kind),
        "doctor says {kind}, the cell got {layer}"
    );
    // The hierarchy the kernel holds this process's memory cgroup in.
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let v1 = cgroups.lines().any(|l| {
        l.split(':')
            .nth(1)
            .is_some_and(|c| c.split(',').any(|c| c == "memory"))
    });
    assert_eq!(
        kind,
        if v1 {
            "cgroup v1 memory"
        } else {
            "cgroup v2 memory"
        }
    );
    let text = cellbox(&["doctor"], None);
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("memory cgroup"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(kind), "{line}");
}

#[test]
fn python_values_are_shown_with_their_repr() {
    let code = "'a'";
    let out = cellbox(&["run", "--lang", "python", "-"], Some(code));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "'a'\n");
    for (code, shown, json) in [
        (
            "(1, 'b', True, None)",
            "(1, 'b', True, None)",
            "[1,\"b\",true,null]",
        ),
        ("{'k': 1.5}", "{'k': 1.5}", "{\"k\":1.5}"),
        ("{1, 2}", "{1, 2}", "\"{1, 2}\""),
    ] {
        let out = cellbox(&["run", "--json", "--lang", "python", "-"], Some(code));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["value_repr"], shown, "{v}");
        assert_eq!(v["value"].to_string(), json, "{v}");
    }
    // No value, no repr; other languages have none either.
    let out = cellbox(&["run", "--json", "--lang", "python", "-"], Some("None"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("value_repr").is_none(), "{v}");
    let out = cellbox(&["run", "--json", "-"], Some("\"a\""));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("value_repr").is_none(), "{v}");
    // The REPL shows the repr (warm path: the zygote's cells).
    let out = cellbox(
        &["repl", "--lang", "python"],
        Some("s = 'hi'\ns\n[s, True]\n"),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "'hi'\n['hi', True]\n");
}

#[test]
fn a_cell_lists_no_path_of_another_architecture() {
    let other = if cfg!(target_arch = "x86_64") {
        "ld-linux-aarch64"
    } else {
        "ld-linux-x86-64"
    };
    for lang in ["python", "shell"] {
        let code = if lang == "shell" { "true" } else { "1" };
        let out = cellbox(&["run", "--json", "--lang", lang, "-"], Some(code));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let sandbox = v["sandbox"].to_string();
        // The report does list the optional paths it looked for and missed
        // (positive control: the key exists), just not another machine's.
        assert!(!sandbox.contains(other), "{lang}: {sandbox}");
        let profile = std::fs::read_to_string(format!(
            "{}/sandbox-profiles/{lang}.toml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert!(profile.contains(other), "{lang}: the profile has the rule");
    }
}

/// Wait until a process beneath `root` sleeps in `clock_nanosleep` (the
/// cell's `time.sleep`, after what it printed first).
fn wait_for_a_sleeping_cell(root: u32) {
    let nr = if cfg!(target_arch = "aarch64") {
        "115"
    } else {
        "230"
    };
    for _ in 0..1200 {
        let asleep = descendants(root as i32).into_iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/syscall"))
                .is_ok_and(|s| s.split_whitespace().next() == Some(nr))
        });
        if asleep {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no cell beneath {root} went to sleep within a minute");
}

/// Wait for `child`, at most a minute (then kill it and fail).
fn wait_bounded(mut child: std::process::Child) -> std::process::Output {
    for _ in 0..600 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("{:?}", child.wait_with_output().unwrap());
}

const SLEEPY_PYTHON: &str =
    "import sys, time\nprint('first', flush=True)\nprint('err', file=sys.stderr, flush=True)\ntime.sleep(60)\nprint('never')\n";

const SLEEPY_SHELL: &str = "echo first\necho err >&2\nsleep 60\necho never\n";

/// `cellbox run` shows the output as the cell writes it, and on Ctrl-C
/// (SIGINT) kills the cell and keeps what it printed: a Python cell (the
/// library path, under the async runtime) and a shell cell (run from the
/// command line's own single thread).
#[test]
fn run_streams_output_and_keeps_it_when_interrupted() {
    use std::io::Read;
    for (lang, code) in [("python", SLEEPY_PYTHON), ("shell", SLEEPY_SHELL)] {
        let start = |json: bool| {
            let mut args = vec!["run", "--lang", lang, "-"];
            if json {
                args.insert(1, "--json");
            }
            serve::spawn_with_input(std::process::Command::new(bin()).args(&args), code)
        };
        let interrupt = |child: &std::process::Child| {
            wait_for_a_sleeping_cell(child.id());
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        };
        let mut child = start(false);
        // Streamed: the first line arrives while the cell still runs
        // (without streaming this read would wait for the whole minute, and
        // the cell would then have printed "never" too).
        let mut first = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(&first, b"first\n", "{lang}");
        interrupt(&child);
        let out = wait_bounded(child);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stdout, "", "{lang}: printed once, as it came");
        assert!(stderr.starts_with("err\n"), "{lang}: {stderr}");
        assert!(stderr.contains("Interrupted: "), "{lang}: {stderr}");
        assert!(stderr.contains("[killed]"), "{lang}: {stderr}");
        assert_eq!(out.status.code(), Some(4), "{lang}: {stderr}");

        // With --json the result comes at the end, with what was printed.
        let child = start(true);
        interrupt(&child);
        let out = wait_bounded(child);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "killed", "{lang}: {v}");
        assert_eq!(v["error"]["type"], "Interrupted", "{lang}: {v}");
        assert_eq!(v["stdout"], "first\n", "{lang}: {v}");
        assert_eq!(v["stderr"], "err\n", "{lang}: {v}");
        assert_eq!(out.status.code(), Some(4), "{lang}: {v}");
    }
}

/// Streaming keeps to the result's cap: the head streams, the omitted count
/// and the tail follow at the end, so what is printed is what `--json` keeps.
#[test]
fn streamed_output_keeps_to_the_cap() {
    for lang in ["python", "shell"] {
        let code = if lang == "python" {
            "print('a' * 100 + 'b' * 100 + 'c' * 100)"
        } else {
            "printf 'a%.0s' $(seq 100); printf 'b%.0s' $(seq 100); printf 'c%.0s' $(seq 100); echo"
        };
        let args = ["run", "--max-output", "100", "--lang", lang, "-"];
        let out = cellbox(&args, Some(code));
        assert_eq!(out.status.code(), Some(0), "{lang}: {out:?}");
        let json = cellbox(
            &["run", "--json", "--max-output", "100", "--lang", lang, "-"],
            Some(code),
        );
        let v: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            v["stdout"].as_str().unwrap(),
            "{lang}"
        );
        assert!(
            v["stdout"].as_str().unwrap().contains("bytes omitted"),
            "{v}"
        );
    }
}

/// The REPL in a real terminal: Ctrl-C drops the input typed so far (the
/// session goes on), and interrupts a running cell, whose session keeps its
/// state. Driven through a pseudo-terminal by Python's `pty` module.
#[test]
fn ctrl_c_in_the_repl_interrupts_the_cell_and_clears_the_line() {
    const DRIVER: &str = r#"
import os, pty, select, sys, time
exe, lang = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(exe, [exe, "repl", "--lang", lang, "--timeout", "120", "--max-operations", "0"])
buf = b""
def expect(token, what):
    global buf
    end = time.time() + 60
    while token not in buf:
        left = end - time.time()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            sys.exit("waiting for %r (%s), got %r" % (token, what, buf))
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            sys.exit("the REPL ended while waiting for %r (%s): %r" % (token, what, buf))
        buf += data
    i = buf.index(token) + len(token)
    seen, buf = buf[:i], buf[i:]
    return seen
prompt = lang.encode() + b"> "
expect(prompt, "the first prompt")
# Ctrl-C at a continuation prompt, with a line half typed: both go.
os.write(fd, b"[1,\n")
expect(b"... ", "the continuation prompt")
os.write(fd, b"xyz\x03")
expect(prompt, "a fresh prompt after Ctrl-C")
os.write(fd, b"40 + 2\n")
seen = expect(prompt, "the result of 40 + 2")
if b"42" not in seen:
    sys.exit("40 + 2 gave %r" % seen)
# Ctrl-C during a cell: the cell is killed, the session keeps its state.
os.write(fd, (b"x = 5\n" if lang == "python" else b"let x = 5; x\n"))
expect(prompt, "the prompt after x = 5")
if lang == "python":
    os.write(fd, b"import time; print('st' + 'arted', flush=True); time.sleep(100)\n")
else:
    os.write(fd, b"print(`st${\"arted\"}`); loop {}\n")
expect(b"started", "the running cell's output")
os.write(fd, b"\x03")
expect(b"Interrupted", "the interrupted cell's error")
expect(prompt, "the prompt after the interrupted cell")
os.write(fd, b"x + 1\n")
seen = expect(prompt, "the result of x + 1")
if b"6" not in seen:
    sys.exit("x + 1 gave %r" % seen)
os.write(fd, b":quit\n")
_, status = os.waitpid(pid, 0)
if status != 0:
    sys.exit("the REPL exited with %d: %r" % (status, buf))
print("ok")
"#;
    for lang in ["rhai", "python"] {
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", DRIVER, bin().to_str().unwrap(), lang])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ok\n",
            "{lang}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// An unprivileged `cellbox` (uid 1000) runs a `--warm` Python cell from a
/// zygote (a child in the zygote's PID namespace, not PID 1 of a cold
/// worker's), as root does: its pool processes keep what they need to
/// build their sandbox.
#[test]
fn an_unprivileged_cellbox_runs_warm_cells_from_its_pools() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = user_1000_dir();
    let py = tmp.path().join("pid.py");
    std::fs::write(&py, "import os\nprint(os.getpid())\n").unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o644)).unwrap();
    for warm in [true, false] {
        let out = cellbox_as_user_1000(tmp.path())
            .arg("run")
            .args(warm.then_some("--warm"))
            .arg(&py)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let pid: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        if warm {
            assert!(pid > 1, "the --warm cell ran cold (PID 1): {out:?}");
        } else {
            assert_eq!(pid, 1, "a cold cell is PID 1 of its namespace: {out:?}");
        }
    }
}

/// The secret of [`live_output_on_the_terminal_is_redacted`]: none of its
/// 8-byte runs is text other tests print.
const RUN_SECRET: &str = "cbx-run-7QpLz4WkVt9Hs2RmXe5NcJ8u";

/// `cellbox run` and the REPL show a cell's output on the terminal as it
/// comes; that copy passes the one redaction like the result does, as one
/// stream: a secret the config names, printed whole, in two writes with a
/// pause between (two reads of the pipe), base64-encoded, or on stderr,
/// reaches neither stream, in full or in part, nor the result with `--json`
/// (`--json` and the result were redacted already).
/// Every language's path: Python (the library path), shell (the one-shot
/// path run from the command line's thread), Rhai (the library path, as a
/// config file sends it there), and the REPL.
#[test]
fn live_output_on_the_terminal_is_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cellbox.toml");
    std::fs::write(
        &cfg,
        "[models.m]\nendpoint = \"http://127.0.0.1:9/v1\"\nmodel = \"x\"\n\
         api_key_env = \"CELLBOX_RUN_SECRET\"\n",
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let (a, b) = RUN_SECRET.split_at(10);
    let python = format!(
        "import sys, time, base64\nS = '{a}' + '{b}'\nprint('before', flush=True)\n\
         print(S, flush=True)\nsys.stdout.write(S[:10]); sys.stdout.flush(); time.sleep(0.5)\n\
         sys.stdout.write(S[10:] + '\\n'); sys.stdout.flush()\n\
         print(base64.b64encode(S.encode()).decode(), flush=True)\n\
         print(S, file=sys.stderr, flush=True)\nprint('after')\n"
    );
    let shell = format!(
        "S='{a}''{b}'\necho before\necho \"$S\"\nprintf %s '{a}'; sleep 0.5; echo '{b}'\n\
         printf %s \"$S\" | base64\necho \"$S\" >&2\necho after\n"
    );
    let rhai = format!(
        "let s = \"{a}\" + \"{b}\";\nprint(\"before\");\nprint(s);\nprint(\"{a}\");\n\
         print(\"after\");\n"
    );
    let repl = format!(
        "import sys, base64\nS = '{a}' + '{b}'\nprint('before')\nprint(S)\n\
         print(base64.b64encode(S.encode()).decode())\nprint(S, file=sys.stderr)\n\
         print('after')\n:quit\n"
    );
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(RUN_SECRET);
    let mut ran = 0;
    for (what, args, input) in [
        (
            "python",
            vec!["run", "--lang", "python", "-"],
            python.as_str(),
        ),
        ("shell", vec!["run", "--lang", "shell", "-"], shell.as_str()),
        ("rhai", vec!["run", "--lang", "rhai", "-"], rhai.as_str()),
        ("repl", vec!["repl", "--lang", "python"], repl.as_str()),
        (
            "python --json",
            vec!["run", "--json", "--lang", "python", "-"],
            python.as_str(),
        ),
        (
            "shell --json",
            vec!["run", "--json", "--lang", "shell", "-"],
            shell.as_str(),
        ),
    ] {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(&args[..1])
            .args(["--config", cfg])
            .args(&args[1..])
            .env("CELLBOX_RUN_SECRET", RUN_SECRET);
        let out = wait_bounded(serve::spawn_with_input(&mut cmd, input));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("{stdout}\n{stderr}");
        // The output did flow (the cell ran and printed around the secret),
        // and the secret was replaced where it was.
        assert!(
            stdout.contains("before") && stdout.contains("after"),
            "{what}: {all}"
        );
        assert!(
            all.contains("[REDACTED:CELLBOX_RUN_SECRET]"),
            "{what}: {all}"
        );
        // (Rhai has no stderr of its own to print to; with --json, the
        // result holds it.)
        assert!(
            what == "rhai"
                || what.ends_with("--json")
                || stderr.contains("[REDACTED:CELLBOX_RUN_SECRET]"),
            "{what}: {stderr}"
        );
        for leaked in [RUN_SECRET, a, b, encoded.as_str()] {
            assert!(!all.contains(leaked), "{what}: {leaked:?} in {all}");
        }
        ran += 1;
    }
    assert_eq!(ran, 6);
}
