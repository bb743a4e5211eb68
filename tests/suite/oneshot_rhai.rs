//! `cellbox run` of a Rhai cell from the CLI process (no runtime, no worker
//! binary) against the library path (`CELLBOX_RUN=supervisor`): the same
//! results, exit codes and messages; and what only the library path can do
//! still works there.

use super::common::*;
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Output, Stdio};

/// `cellbox ARGS` with piped stdio, on the path `library` picks.
fn command(args: &[&str], library: bool) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_remove("CELLBOX_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if library {
        cmd.env("CELLBOX_RUN", "supervisor");
    } else {
        cmd.env_remove("CELLBOX_RUN");
    }
    cmd
}

/// `cellbox ARGS` with `stdin`, on the path `library` picks.
fn run(args: &[&str], stdin: &str, library: bool) -> Output {
    let mut child = command(args, library).spawn().unwrap();
    {
        let mut si = child.stdin.take().unwrap();
        let _ = si.write_all(stdin.as_bytes());
    }
    child.wait_with_output().unwrap()
}

/// A `--json` result without what differs from run to run (timings, ids)
/// or by who made the cell's cgroup (its detail).
fn normalized(out: &Output) -> Value {
    let mut v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a JSON result ({e}): {out:?}"));
    let o = v.as_object_mut().unwrap();
    o.remove("usage");
    o.remove("run");
    if let Some(calls) = o.get_mut("calls").and_then(Value::as_array_mut) {
        for c in calls {
            let c = c.as_object_mut().unwrap();
            c.remove("ms");
            c.remove("run_id");
        }
    }
    if let Some(layers) = o
        .get_mut("sandbox")
        .and_then(|s| s.get_mut("layers"))
        .and_then(Value::as_array_mut)
    {
        for l in layers {
            if l["name"] == "cgroup" {
                l.as_object_mut().unwrap().remove("detail");
            }
        }
    }
    v
}

/// Both paths, with and without `--json`: the same normalized result, exit
/// code, and printed output. Returns the fast path's result.
fn same_on_both_paths(args: &[&str], code: &str) -> Value {
    let mut json_args = vec!["run", "--json"];
    json_args.extend_from_slice(args);
    json_args.push("-");
    let fast = run(&json_args, code, false);
    let lib = run(&json_args, code, true);
    assert_eq!(
        fast.status.code(),
        lib.status.code(),
        "{code}: {fast:?} {lib:?}"
    );
    let (f, l) = (normalized(&fast), normalized(&lib));
    assert_eq!(f, l, "{args:?} {code}");
    let mut plain_args = vec!["run"];
    plain_args.extend_from_slice(args);
    plain_args.push("-");
    let fast = run(&plain_args, code, false);
    let lib = run(&plain_args, code, true);
    assert_eq!(fast.status.code(), lib.status.code(), "{code}");
    assert_eq!(
        String::from_utf8_lossy(&fast.stdout),
        String::from_utf8_lossy(&lib.stdout),
        "{code}"
    );
    assert_eq!(
        String::from_utf8_lossy(&fast.stderr),
        String::from_utf8_lossy(&lib.stderr),
        "{code}"
    );
    f
}

#[test]
fn a_plain_cell_and_its_sandbox_are_the_library_paths() {
    let v = same_on_both_paths(&[], "print(\"hey\"); let x = 40; x + 2");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["value"], 42);
    assert_eq!(v["stdout"], "hey\n");
    assert_eq!(v["vars"]["changed"], serde_json::json!(["x"]));
    // Every layer is there, applied as on the library path (compared
    // above); the OS layers are applied on this host.
    let layers: Vec<&str> = v["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        layers,
        [
            "hygiene",
            "namespaces",
            "rlimits",
            "privileges",
            "landlock",
            "seccomp",
            "cgroup"
        ]
    );
}

#[test]
fn capability_calls_allowed_denied_unknown_and_malformed() {
    let allowed = same_on_both_paths(&["--allow", "emit,answer"], "emit(#{a: 1}); answer(5); 7");
    assert_eq!(allowed["status"], "ok", "{allowed}");
    assert_eq!(allowed["final_answer"], 5);
    let outcomes: Vec<&str> = allowed["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["ok", "ok"]);

    let denied = same_on_both_paths(&[], "answer(1)");
    assert_eq!(denied["status"], "policy_denied", "{denied}");
    assert_eq!(denied["calls"][0]["outcome"], "denied");

    let caught = same_on_both_paths(
        &[],
        "let r = \"no\"; try { answer(1); } catch (e) { r = \"caught\"; } r",
    );
    assert_eq!(caught["value"], "caught", "{caught}");

    // `run_cell` is not allowed here (it would take the library path).
    let sub = same_on_both_paths(&[], "run_cell(\"rhai\", \"1\")");
    assert_eq!(sub["status"], "policy_denied", "{sub}");

    let unknown = same_on_both_paths(&["--allow", "emit"], "invoke(\"nope.tool\")");
    assert_eq!(unknown["calls"][0]["outcome"], "unknown", "{unknown}");

    let long = format!("invoke(\"{}\")", "n".repeat(200));
    let long = same_on_both_paths(&[], &long);
    assert_eq!(long["calls"][0]["outcome"], "unknown", "{long}");

    let bad = same_on_both_paths(&["--allow", "emit"], "invoke(\"emit\", #{bad: 1})");
    assert_eq!(bad["calls"][0]["outcome"], "invalid_args", "{bad}");
    let worse = same_on_both_paths(
        &["--allow", "emit,answer"],
        "try { invoke(\"emit\", #{event: 1, bad: 2, worse: 3}) } catch {} \
         invoke(\"answer\", #{})",
    );
    assert_eq!(worse["calls"][1]["outcome"], "invalid_args", "{worse}");
}

#[test]
fn limits_end_the_cell_as_on_the_library_path() {
    let t = same_on_both_paths(&["--timeout", "0.5", "--max-operations", "0"], "loop {}");
    assert_eq!(t["status"], "timeout", "{t}");
    let ops = same_on_both_paths(&["--max-operations", "1000"], "loop {}");
    assert_eq!(ops["status"], "limit_exceeded", "{ops}");
    let out = same_on_both_paths(
        &["--max-output", "100"],
        "for i in 0..300 { print(\"line \" + i); }",
    );
    assert!(
        out["stdout"].as_str().unwrap().contains("bytes omitted"),
        "{out}"
    );
    // Strings that double until a limit stops them: the string size, on
    // both paths alike. (A limit of address space counts the whole process
    // on the library path, its program included, so with a tight one that
    // path can run out first: 128 MiB leaves both room.)
    let mem = same_on_both_paths(
        &["--memory", "134217728", "--max-operations", "0"],
        "let a = []; let s = \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; \
         loop { s += s; a.push(s); }",
    );
    assert_ne!(mem["status"], "ok", "{mem}");
}

#[test]
fn script_errors_and_what_a_script_may_not_reach() {
    let e = same_on_both_paths(&[], "throw \"boom\"");
    assert_eq!(e["status"], "error", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("boom"),
        "{e}"
    );
    let syntax = same_on_both_paths(&[], "let = ;");
    assert_eq!(syntax["status"], "error", "{syntax}");
    // No file or module access: `import` is disabled, no `open` exists.
    for code in [
        "import \"/etc/passwd\" as p; 1",
        "open(\"/etc/passwd\")",
        "eval(\"1\")",
    ] {
        let r = same_on_both_paths(&[], code);
        assert_eq!(r["status"], "error", "{code}: {r}");
    }
}

#[test]
fn events_are_recorded_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = |library: bool| {
        let path = dir.path().join(format!("events-{library}.jsonl"));
        let p = path.to_str().unwrap();
        let out = run(
            &["run", "--allow", "emit", "--events", p, "-"],
            "emit(#{n: 1}); answer(2)",
            library,
        );
        assert_eq!(out.status.code(), Some(5), "{out:?}");
        std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let kind = v["kind"].as_str().or(v["event"].as_str());
                kind.unwrap_or("?").to_string()
            })
            .collect::<Vec<_>>()
    };
    let fast = kinds(false);
    assert_eq!(fast, kinds(true));
    assert!(fast.len() >= 4, "{fast:?}");
}

/// What only the library path has still works: a policy that allows
/// `run_cell`, a config file's declared tools, `--warm`.
#[test]
fn what_needs_the_supervisor_takes_the_library_path() {
    let sub = run(
        &["run", "--json", "--allow", "run_cell", "-"],
        "run_cell(\"rhai\", \"40 + 2\")",
        false,
    );
    let v: Value = serde_json::from_slice(&sub.stdout).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["value"], 42);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellbox.toml");
    std::fs::write(
        &config,
        "[policy]\nallow = [\"echo\"]\n\
         [tools.echo]\nkind = \"command\"\ndescription = \"echo words\"\n\
         argv = [\"/bin/echo\", \"{word}\"]\n\
         schema = { type = \"object\", properties = { word = { type = \"string\" } }, required = [\"word\"] }\n",
    )
    .unwrap();
    let tool = run(
        &["run", "--json", "--config", config.to_str().unwrap(), "-"],
        "invoke(\"echo\", #{word: \"hi\"})",
        false,
    );
    let v: Value = serde_json::from_slice(&tool.stdout).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["calls"][0]["outcome"], "ok", "{v}");

    let warm = run(&["run", "--json", "--warm", "-"], "40 + 2", false);
    let v: Value = serde_json::from_slice(&warm.stdout).unwrap();
    assert_eq!(v["value"], 42, "{v}");
}

/// The cell is a copy of the CLI process, not a program executed afresh:
/// the environment the CLI had (an API key in it) is gone from its
/// environment and from its memory.
#[test]
fn the_callers_environment_is_not_in_the_cell() {
    if !nix::unistd::geteuid().is_root() {
        // Reading another id's memory needs root; the cell runs as nobody.
        eprintln!("skipped: needs root to read the cell's memory");
        return;
    }
    let secret = format!("cbx-secret-{}", std::process::id());
    let mut child = Command::new(bin())
        .args(["run", "--timeout", "20", "--max-operations", "0", "-"])
        .env("CBX_TEST_SECRET", &secret)
        .env_remove("CELLBOX_RUN")
        .env_remove("CELLBOX_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        let mut si = child.stdin.take().unwrap();
        si.write_all(b"loop {}").unwrap();
    }
    let parent = child.id().to_string();
    // The cell: our child's child, named cellbox-cell once it runs code.
    let mut cell = None;
    for _ in 0..2000 {
        cell = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let ppid = status.lines().find(|l| l.starts_with("PPid:"))?;
            let named = status.lines().next()? == "Name:\tcellbox-cell";
            (named && ppid.split_whitespace().nth(1)? == parent).then(|| e.path())
        });
        if cell.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let cell = cell.expect("the cell process appears");
    let environ = std::fs::read(cell.join("environ")).unwrap();
    let found_env = String::from_utf8_lossy(&environ).contains(&secret);
    // Every readable mapping of its memory.
    let maps = std::fs::read_to_string(cell.join("maps")).unwrap();
    let mut mem = std::fs::File::open(cell.join("mem")).unwrap();
    let mut found_mem = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        use std::io::{Read, Seek, SeekFrom};
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        if buf.windows(secret.len()).any(|w| w == secret.as_bytes()) {
            found_mem.push(line.to_owned());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!found_env, "the secret is in the cell's /proc/PID/environ");
    assert!(found_mem.is_empty(), "the secret is in {found_mem:?}");
}

#[test]
fn profiles_as_on_the_library_path() {
    let v = same_on_both_paths(&["--profile", "rhai"], "1");
    assert_eq!(v["status"], "ok", "{v}");
    let missing = same_on_both_paths(&["--profile", "/no/such/profile.toml"], "1");
    assert_eq!(missing["status"], "sandbox_error", "{missing}");
}

/// Ctrl-C kills the cell; its result (status `killed`) keeps what it
/// printed, on both paths.
#[test]
fn ctrl_c_kills_the_cell_and_keeps_its_output() {
    use std::io::{BufRead, BufReader};
    let mut ends = Vec::new();
    for library in [false, true] {
        let args = ["run", "--max-operations", "0", "--timeout", "30", "-"];
        let mut child = command(&args, library).spawn().unwrap();
        {
            let mut si = child.stdin.take().unwrap();
            si.write_all(b"print(\"started\"); loop {}").unwrap();
        }
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert_eq!(first, "started\n", "library path: {library}");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(
            err.contains("interrupted"),
            "library path: {library}: {err}"
        );
        ends.push((status.code(), rest, err));
    }
    assert_eq!(ends[0], ends[1]);
    assert_eq!(ends[0].0, Some(4), "{:?}", ends[0]);
}
