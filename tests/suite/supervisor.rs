//! The supervisor's rules over every cell: a profile's `[limits]` is a
//! ceiling on every path, and sub-cells (`run_cell`) obey the supervisor's
//! languages, the operator's profiles and the limits exactly as top-level
//! cells do. Each rule is judged from host-side evidence (what ran, a
//! process's `/proc/<pid>/limits`, the events file).

use super::common::*;
use cellbox::{CellRequest, CellResult, Language, SessionConfig, Status, Supervisor};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A copy of a shipped profile with `cpu_seconds = 7` and
/// `max_open_files = 17` (values no default or shipped profile has).
fn limited_profile(dir: &Path, base: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sandbox-profiles")
        .join(format!("{base}.toml"));
    let text = std::fs::read_to_string(src).unwrap();
    let mut seen = 0;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("cpu_seconds =") {
                seen += 1;
                "cpu_seconds = 7".to_owned()
            } else if l.starts_with("max_open_files =") {
                seen += 1;
                "max_open_files = 17".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert_eq!(seen, 2, "{base}.toml has no cpu_seconds/max_open_files");
    let path = dir.join(format!("{base}-lim.toml"));
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
    path
}

const SHELL_LIMITS: &str = "ulimit -t; ulimit -n";
const PY_LIMITS: &str = "import resource as r\n\
    [r.getrlimit(r.RLIMIT_CPU)[0], r.getrlimit(r.RLIMIT_NOFILE)[0]]";

fn ok(r: &CellResult) {
    assert_eq!(r.status, Status::Ok, "{r:?}");
}

fn hygiene(r: &CellResult) -> String {
    layer_detail(r, "hygiene")
}

/// Processes whose limits read cpu 7 s and 17 open files, with their comm.
fn processes_with_the_limits() -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for pid in pids() {
        let Ok(limits) = std::fs::read_to_string(format!("/proc/{pid}/limits")) else {
            continue;
        };
        let soft = |prefix: &str| {
            limits
                .lines()
                .find(|l| l.starts_with(prefix))
                .and_then(|l| l[prefix.len()..].split_whitespace().next())
                .map(str::to_owned)
        };
        if soft("Max cpu time").as_deref() == Some("7")
            && soft("Max open files").as_deref() == Some("17")
        {
            out.push((pid, comm(pid).trim().to_owned()));
        }
    }
    out
}

/// Run a looping Rhai cell and return the processes seen with the limited
/// profile's limits while it ran, once one has a name `want` accepts.
async fn rhai_cell_processes(sup: &Supervisor, want: fn(&str) -> bool) -> Vec<(i32, String)> {
    let mut cfg = config(&[]);
    cfg.limits.max_operations = 0;
    let sup2 = sup.clone();
    let task = tokio::spawn(async move {
        sup2.run(
            CellRequest::new(Language::Rhai, "loop {}").timeout(Duration::from_secs(4)),
            cfg,
        )
        .await
    });
    let mut seen = Vec::new();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = processes_with_the_limits();
        if seen.iter().any(|(_, comm)| want(comm)) {
            break;
        }
    }
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    seen
}

#[tokio::test]
async fn a_profiles_limits_are_a_ceiling_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let shell = limited_profile(dir.path(), "shell");
    let python = limited_profile(dir.path(), "python");
    let rhai = limited_profile(dir.path(), "rhai");
    let s = |p: &PathBuf| p.to_str().unwrap().to_owned();

    // Positive control: the built-in profiles give other values.
    let plain = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .build()
        .unwrap();
    let r = plain
        .run(CellRequest::new(Language::Shell, SHELL_LIMITS), config(&[]))
        .await;
    ok(&r);
    assert_eq!(r.stdout, "60\n256\n");

    // Cold workers.
    let cold = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .profile(Language::Shell, s(&shell))
        .profile(Language::Python, s(&python))
        .profile(Language::Rhai, s(&rhai))
        .build()
        .unwrap();
    let r = cold
        .run(CellRequest::new(Language::Shell, SHELL_LIMITS), config(&[]))
        .await;
    ok(&r);
    assert_eq!(r.stdout, "7\n17\n", "cold shell");
    // A session asking for more gets the ceiling; asking for less gets less.
    let mut wide = config(&[]);
    wide.limits.rlimits.cpu_seconds = 1000;
    wide.limits.rlimits.max_open_files = 5000;
    let r = cold
        .run(CellRequest::new(Language::Shell, SHELL_LIMITS), wide)
        .await;
    ok(&r);
    assert_eq!(r.stdout, "7\n17\n", "a session cannot widen the profile");
    let mut narrow = config(&[]);
    narrow.limits.rlimits.cpu_seconds = 5;
    narrow.limits.rlimits.max_open_files = 12;
    let r = cold
        .run(CellRequest::new(Language::Shell, SHELL_LIMITS), narrow)
        .await;
    ok(&r);
    assert_eq!(r.stdout, "5\n12\n", "a session narrows the profile");
    let r = cold
        .run(CellRequest::new(Language::Python, PY_LIMITS), config(&[]))
        .await;
    ok(&r);
    assert_eq!(r.value, json!([7, 17]), "cold python");
    let seen = rhai_cell_processes(&cold, |c| c.starts_with("cellbox")).await;
    assert!(
        seen.iter().any(|(_, comm)| comm.starts_with("cellbox")),
        "no cold Rhai worker had the profile's limits: {seen:?}"
    );

    // Warm: the Rhai fork server and a Python zygote.
    let warm = Supervisor::builder()
        .worker_exe(bin())
        .profile(Language::Python, s(&python))
        .profile(Language::Rhai, s(&rhai))
        .build()
        .unwrap();
    let r = warm
        .run(CellRequest::new(Language::Python, PY_LIMITS), config(&[]))
        .await;
    ok(&r);
    assert!(hygiene(&r).contains("Python zygote"), "not warm: {r:?}");
    assert_eq!(r.value, json!([7, 17]), "zygote python");
    let seen = rhai_cell_processes(&warm, |c| c == "cellbox-cell").await;
    assert!(
        seen.iter().any(|(_, comm)| comm == "cellbox-cell"),
        "no Rhai cell forked from the fork server had the profile's limits: {seen:?}"
    );
    assert!(warm.pool_status().await.rhai_fork_server);

    // One-shot: `cellbox exec` and `cellbox run` of a shell cell.
    let out = cellbox(
        &[
            "exec",
            "--profile",
            &s(&shell),
            "--",
            "/bin/cat",
            "/proc/self/limits",
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let soft = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l[prefix.len()..].split_whitespace().next())
            .map(str::to_owned)
    };
    assert_eq!(soft("Max cpu time").as_deref(), Some("7"), "exec: {text}");
    assert_eq!(
        soft("Max open files").as_deref(),
        Some("17"),
        "exec: {text}"
    );
    let out = cellbox(
        &["run", "--profile", &s(&shell), "--lang", "shell", "-"],
        Some(SHELL_LIMITS),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "7\n17\n",
        "run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And doctor says what a cell gets.
    let out = cellbox(&["doctor", "--profile", &s(&shell)], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("at most cpu 7s")
            && text.contains("a cell gets cpu 7s")
            && text.contains("17 files")
            && text.contains("memory 1073741824 bytes"),
        "{text}"
    );
}

/// The Rhai code of a parent cell that tries a sub-cell and returns either
/// its value or the error it caught.
fn try_sub_cell(language: &str, code: &str) -> String {
    format!(
        "let out = #{{}};\n\
         try {{ out.ok = run_cell({language:?}, {code:?}); }} catch (e) {{ out.err = `${{e}}`; }}\n\
         out"
    )
}

/// Languages of the cells the events file says started.
fn started_languages(events: &Path) -> Vec<String> {
    started_at(events, 0)
}

/// Languages of the cells at `min_depth` or deeper the events file says
/// started.
fn started_at(events: &Path, min_depth: u64) -> Vec<String> {
    std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "cell_start" && e["depth"].as_u64() >= Some(min_depth))
        .map(|e| e["language"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn a_sub_cell_obeys_the_supervisors_languages() {
    let dir = tempfile::tempdir().unwrap();
    let build = |langs: &[Language], events: &Path| {
        Supervisor::builder()
            .worker_exe(bin())
            .languages(langs.iter().copied())
            .events(cellbox::EventSink::to_file(events).unwrap())
            .build()
            .unwrap()
    };
    let code = try_sub_cell("shell", "echo ran-in-shell");

    // Positive control: with shell allowed, the sub-cell runs.
    let events = dir.path().join("all.jsonl");
    let all = build(
        &[Language::Rhai, Language::Python, Language::Shell],
        &events,
    );
    let r = all
        .run(
            CellRequest::new(Language::Rhai, &code),
            config(&["run_cell"]),
        )
        .await;
    ok(&r);
    assert!(r.value.get("err").is_none(), "{r:?}");
    assert!(started_at(&events, 1).contains(&"shell".to_owned()));

    // python,rhai: the sub-cell is refused, catchably, and never starts.
    let events = dir.path().join("narrow.jsonl");
    let narrow = build(&[Language::Rhai, Language::Python], &events);
    let r = narrow
        .run(
            CellRequest::new(Language::Rhai, &code),
            config(&["run_cell"]),
        )
        .await;
    ok(&r);
    let err = r.value["err"].as_str().unwrap_or_default();
    assert!(
        err.contains("shell cells are not allowed here (allowed: python, rhai)"),
        "{r:?}"
    );
    assert!(r
        .calls
        .iter()
        .any(|c| c.cap == "run_cell" && c.outcome == "denied"));
    // Uncaught, it ends the parent policy_denied.
    let r = narrow
        .run(
            CellRequest::new(Language::Rhai, "run_cell(\"shell\", \"echo x\")"),
            config(&["run_cell"]),
        )
        .await;
    assert_eq!(r.status, Status::PolicyDenied, "{r:?}");
    // Nested: a python sub-cell's own run_cell("shell") is refused too.
    let r = narrow
        .run(
            CellRequest::new(
                Language::Rhai,
                try_sub_cell(
                    "python",
                    "try:\n    run_cell('shell', 'echo x')\n    r = 'ran'\nexcept Exception as e:\n    r = str(e)\nr",
                ),
            ),
            config(&["run_cell"]),
        )
        .await;
    ok(&r);
    assert!(
        r.value["ok"]
            .as_str()
            .unwrap_or_default()
            .contains("shell cells are not allowed here"),
        "{r:?}"
    );
    // A top-level cell of a refused language too.
    let r = narrow
        .run(CellRequest::new(Language::Shell, "echo x"), config(&[]))
        .await;
    assert_eq!(r.status, Status::PolicyDenied, "{r:?}");
    assert!(
        !started_languages(&events).contains(&"shell".to_owned()),
        "a shell cell started under python,rhai"
    );
}

#[tokio::test]
async fn a_sub_cell_runs_under_the_operators_profile_and_its_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let python = limited_profile(dir.path(), "python");
    let shell = limited_profile(dir.path(), "shell");
    let parent = |sub: &str, code: &str| {
        CellRequest::new(Language::Rhai, format!("run_cell({sub:?}, {code:?})"))
    };
    // Positive control: without the operator's profiles a sub-cell gets the
    // built-in ones.
    let plain = supervisor();
    let r = plain
        .run(parent("python", PY_LIMITS), config(&["run_cell"]))
        .await;
    ok(&r);
    assert_eq!(r.value, json!([60, 256]));

    let sup = Supervisor::builder()
        .worker_exe(bin())
        .profile(Language::Python, python.to_str().unwrap())
        .profile(Language::Shell, shell.to_str().unwrap())
        .build()
        .unwrap();
    let top = sup
        .run(CellRequest::new(Language::Python, PY_LIMITS), config(&[]))
        .await;
    ok(&top);
    assert_eq!(top.value, json!([7, 17]));
    // The sub-cell gets exactly what a top-level cell gets.
    let mut wide = config(&["run_cell"]);
    wide.limits.rlimits.cpu_seconds = 1000;
    let r = sup.run(parent("python", PY_LIMITS), wide).await;
    ok(&r);
    assert_eq!(r.value, top.value, "{r:?}");
    // A shell sub-cell reports its limit through its exit status.
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, try_sub_cell("shell", "exit $(ulimit -n)")),
            config(&["run_cell"]),
        )
        .await;
    ok(&r);
    assert!(
        r.value["err"]
            .as_str()
            .unwrap_or_default()
            .contains("exited with status 17"),
        "{r:?}"
    );
    // A session's own profile is a ceiling too.
    let session_profile = SessionConfig {
        profile: Some(shell.to_str().unwrap().to_owned()),
        ..config(&["run_cell"])
    };
    let r = plain
        .run(
            CellRequest::new(Language::Shell, "ulimit -n"),
            session_profile,
        )
        .await;
    ok(&r);
    assert_eq!(r.stdout, "17\n");
}

/// Peak resident memory (VmHWM, KiB) of a process, sampled until it exits.
fn peak_rss_kb(child: &mut std::process::Child) -> u64 {
    let mut peak = 0;
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            let hwm = status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            peak = peak.max(hwm);
        }
        if child.try_wait().unwrap().is_some() {
            return peak;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The call-record memory attack: 40 calls with 1.2 MB names, a flood of
/// 128 KiB emits, and calls past the budget. The supervisor (the
/// `cellbox run` process) is measured from outside; the attack's own
/// effect (the names arrived whole, the emits and calls were made) shows in
/// what it recorded.
#[test]
fn call_records_emits_and_the_events_file_keep_the_supervisor_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let code = r#"
        let big = "x";
        for i in 0..20 { big += big; }
        big += big.sub_string(0, 200000);
        let n = 0;
        for i in 0..40 { try { invoke(big + i, #{}) } catch (e) { n += 1; } }
        let ev = "y";
        for i in 0..17 { ev += ev; }
        let refused = 0;
        for i in 0..900 { try { emit(ev) } catch (e) { refused += 1; } }
        for i in 0..5000 { try { invoke("nope", #{}) } catch (e) {} }
        n
    "#;
    let mut child = serve::spawn_with_input(
        std::process::Command::new(bin())
            .args([
                "run", "--lang", "rhai", "--json", "--allow", "emit", "--events",
            ])
            .arg(&events)
            .arg("-"),
        code,
    );
    // Read stdout as it comes so the child never blocks on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut s).unwrap();
        s
    });
    let peak_kb = peak_rss_kb(&mut child);
    let out = reader.join().unwrap();
    let r: Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));

    // The attack happened: the budget ran out, the names arrived whole.
    assert_eq!(r["status"], "limit_exceeded", "{}", r["error"]);
    let calls = r["calls"].as_array().unwrap();
    let huge: Vec<&Value> = calls
        .iter()
        .filter(|c| c["cap"].as_str().unwrap_or("").contains("... (124857"))
        .collect();
    assert!(huge.len() >= 39, "{} huge-name records", huge.len());
    for c in &huge {
        assert_eq!(c["outcome"], "unknown");
        assert!(c["cap"].as_str().unwrap().len() < 100, "{c}");
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("over the limit of 128 bytes"),
            "{c}"
        );
    }
    let emitted = calls
        .iter()
        .filter(|c| c["cap"] == "emit" && c["outcome"] == "ok")
        .count();
    let refused = calls
        .iter()
        .filter(|c| c["cap"] == "emit" && c["outcome"] == "limit")
        .count();
    assert!((1..=8).contains(&emitted), "{emitted} emits recorded");
    assert!(refused > 800, "{refused} emits refused");
    // Calls were charged first: the unknown ones ended the cell at the
    // budget, and the records stop at their cap with a note.
    assert_eq!(r["usage"]["calls"], 1001, "{}", r["usage"]);
    assert_eq!(calls.len(), 1000);
    assert_eq!(
        r["truncated"]["calls"],
        json!({"total": 1001, "kept": 1000})
    );

    // The host side: the events file holds under 2 MiB, and the
    // supervisor's peak RSS stayed bounded (it took 300 MB before).
    let ev_bytes = std::fs::metadata(&events).unwrap().len();
    assert!(ev_bytes < 2 << 20, "events file is {ev_bytes} bytes");
    assert!(
        peak_kb < 96 * 1024,
        "the supervisor peaked at {peak_kb} KiB resident"
    );
    eprintln!("supervisor peak RSS {peak_kb} KiB, events file {ev_bytes} bytes");
}

/// `cellbox serve` with these flags (events to `events`); runs the Rhai
/// `code` through execute_code and returns the structured result.
async fn serve_rhai(flags: &[&str], events: &Path, code: &str) -> Value {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;
    use rmcp::ServiceExt;
    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("serve").args(flags).arg("--events").arg(events);
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let Value::Object(args) = json!({"language": "rhai", "code": code}) else {
        unreachable!()
    };
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        client.call_tool(CallToolRequestParams::new("execute_code").with_arguments(args)),
    )
    .await
    .expect("execute_code answered")
    .unwrap();
    client.cancel().await.unwrap();
    r.structured_content.expect("structuredContent")
}

#[tokio::test]
async fn serve_sub_cells_obey_its_languages_and_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let python = limited_profile(dir.path(), "python");
    let py_flag = format!("python={}", python.to_str().unwrap());
    let code = format!(
        "{}\nlet p = run_cell(\"python\", {PY_LIMITS:?});\n#{{shell: out, python: p}}",
        try_sub_cell("shell", "echo ran").replace("\nout", "")
    );
    // Positive control: a server with shell lets the sub-cell run.
    let events = dir.path().join("all.jsonl");
    let r = serve_rhai(&["--allow", "run_cell"], &events, &code).await;
    assert_eq!(r["status"], "ok", "{r:#}");
    assert!(r["value"]["shell"].get("err").is_none(), "{r:#}");
    assert_eq!(r["value"]["python"], json!([60, 256]), "{r:#}");
    assert!(started_at(&events, 1).contains(&"shell".to_owned()));

    // --language python,rhai and the operator's python profile.
    let events = dir.path().join("narrow.jsonl");
    let r = serve_rhai(
        &[
            "--language",
            "python,rhai",
            "--allow",
            "run_cell",
            "--profile",
            &py_flag,
        ],
        &events,
        &code,
    )
    .await;
    assert_eq!(r["status"], "ok", "{r:#}");
    assert!(
        r["value"]["shell"]["err"]
            .as_str()
            .unwrap_or_default()
            .contains("shell cells are not allowed here"),
        "{r:#}"
    );
    assert_eq!(r["value"]["python"], json!([7, 17]), "{r:#}");
    let started = started_languages(&events);
    assert!(!started.contains(&"shell".to_owned()), "{started:?}");
    assert!(
        started_at(&events, 1).contains(&"python".to_owned()),
        "{started:?}"
    );
}

/// A pool process that exits before it reports ready (here the "engine" is
/// a copy of `/bin/true` under a name of its own) is reaped: no zombie of
/// it is left however often a pool is tried.
#[tokio::test]
async fn pool_processes_that_never_get_ready_leave_no_zombies() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("nocbx{}", std::process::id());
    let exe = dir.path().join(&name);
    std::fs::copy("/bin/true", &exe).unwrap();
    let sup = Supervisor::builder().worker_exe(&exe).build().unwrap();
    for language in [Language::Rhai, Language::Python, Language::Rhai] {
        let r = sup
            .run(CellRequest::new(language, "1"), SessionConfig::default())
            .await;
        assert_ne!(r.status, Status::Ok, "{r:?}");
    }
    // The session prepared for a next cell holds a worker that never got
    // ready either: it goes when the session is given back.
    sup.release_prepared().await;
    let me = std::process::id() as i32;
    let left = || -> Vec<i32> {
        procs::process_stats()
            .into_iter()
            .filter(|p| p.ppid == me && procs::comm(p.pid) == name)
            .map(|p| p.pid)
            .collect()
    };
    let mut waited = 0;
    while !left().is_empty() && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert!(left().is_empty(), "left: {:?}", left());
}
