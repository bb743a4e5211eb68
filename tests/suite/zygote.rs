//! Warm Python cells: forked from a sandboxed zygote of the pool. Each test
//! first checks that its cells really came from a zygote.

use super::common::*;
use cellbox::{CellRequest, CellResult, Language, Session, SessionConfig, Status, Supervisor};
use serde_json::{json, Value};

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
    assert!(s
        .scratch_dir()
        .unwrap()
        .starts_with(status.scratch_root.unwrap()));

    let cold = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .build()
        .unwrap();
    let r = run_py(&cold, "import os\nos.getpid()").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        Value::from(1),
        "a cold cell is PID 1 of its namespace"
    );
    assert!(!format!("{:?}", r.sandbox).contains("zygote"));
    assert!(cold.pool_status().await.python.is_empty());
}

/// The supervisor starts each pool process straight in its namespaces:
/// the process the pool status names is the supervisor's child and PID 1
/// there, and no process of the supervisor's waits for it on the host side.
#[tokio::test]
async fn pool_processes_are_the_supervisors_children_and_pid_1_of_their_namespaces() {
    // Nothing prepared for a next cell: the pool alone is counted.
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .prepare_runs(false)
        .build()
        .unwrap();
    let r = run_py(&sup, "6 * 7").await;
    require_warm(&r);
    let r = sup
        .run(
            CellRequest::new(Language::Rhai, "6 * 7"),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.value, json!(42), "{r:?}");
    let status = sup.pool_status().await;
    let mut pool: Vec<i32> = status
        .python
        .iter()
        .filter(|z| z.alive)
        .map(|z| z.pid)
        .collect();
    assert_eq!(pool.len(), 1, "{status:?}");
    pool.extend(status.rhai_fork_server_pid.map(|p| p as i32));
    assert_eq!(pool.len(), 2, "a zygote and the fork server: {status:?}");
    let me = std::process::id() as i32;
    let ns =
        |pid: String, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    for pid in pool {
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| {
            st.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(field("PPid:"), [me.to_string()], "{pid}: {st}");
        assert_eq!(
            field("NSpid:"),
            [pid.to_string(), "1".to_string()],
            "{pid} is PID 1 of a PID namespace of its own: {st}"
        );
        for kind in ["user", "mnt", "net", "ipc", "uts", "pid"] {
            assert_ne!(
                ns(pid.to_string(), kind),
                ns("self".into(), kind),
                "{pid}: {kind}"
            );
        }
        // It does not run as root on the host.
        assert_ne!(field("Uid:").first().map(String::as_str), Some("0"), "{st}");
    }
}

#[tokio::test]
async fn a_cell_cannot_signal_trace_or_read_its_zygote() {
    let sup = one_zygote(pool(1));
    let code = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
out = {"ppid": os.getppid()}
def attempt(name, f):
    try:
        f()
        out[name] = "allowed"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("kill", lambda: os.kill(1, 0))
attempt("sigterm", lambda: os.kill(1, 15))
attempt("killpg", lambda: os.killpg(0, 0) if False else os.killpg(1, 0))
attempt("mem", lambda: open("/proc/1/mem", "rb").read(1))
attempt("environ", lambda: open("/proc/1/environ", "rb").read())
attempt("maps", lambda: open("/proc/1/maps", "rb").read())
def trace():
    if libc.ptrace(16, 1, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
attempt("ptrace", trace)
def vm_read():
    if libc.process_vm_readv(1, 0, 0, 0, 0, 0) < 0:
        raise OSError(ctypes.get_errno(), "process_vm_readv")
attempt("process_vm_readv", vm_read)
attempt("setsid", os.setsid)
attempt("setpgid", lambda: os.setpgid(0, 0))
def dumpable():
    if libc.prctl(4, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")
attempt("set_dumpable", dumpable)
out["dumpable"] = libc.prctl(3, 0, 0, 0, 0)
attempt("pidfd_open", lambda: os.close(os.pidfd_open(1)))
out
"#;
    let r = run_py(&sup, code).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(
        r.value["ppid"], 1,
        "the zygote is the cell's parent, PID 1 of the pool's namespace"
    );
    for key in [
        "kill",
        "sigterm",
        "killpg",
        "mem",
        "environ",
        "maps",
        "ptrace",
        "process_vm_readv",
        "setsid",
        "setpgid",
        "set_dumpable",
        "pidfd_open",
    ] {
        let got = r.value[key].as_str().unwrap_or_default();
        assert!(
            // ENOENT: /proc shows a cell nothing it may not ptrace-read.
            got == "EPERM" || got == "EACCES" || got == "ESRCH" || got == "ENOENT",
            "{key}: {got} (value {})",
            r.value
        );
    }
    assert_eq!(r.value["kill"], "EPERM", "Landlock's signal scope");
    assert_eq!(r.value["ptrace"], "EPERM");
    assert_eq!(
        r.value["dumpable"], 0,
        "the zygote's cells are not dumpable"
    );
    // The zygote is unharmed: the next cell works.
    let r = run_py(&sup, "1 + 1").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
}

/// Start a cell in session `a` that writes its pid into its scratch dir
/// and sleeps 3 s; run `attack` (given that pid) as a cell of session `b`
/// while it sleeps. Returns b's result and a's (which must be undisturbed).
async fn against_a_running_sibling(
    a: &Session,
    b: &Session,
    attack: impl FnOnce(&str) -> String,
) -> (CellResult, CellResult) {
    let a_dir = a.scratch_dir().unwrap().to_path_buf();
    let a2 = a.clone();
    let running = tokio::spawn(async move {
        py_in(
            &a2,
            "import os, time\nopen('secret', 'w').write('a-only')\nbig = bytearray(64 << 20)\nfor i in range(0, len(big), 4096):\n    big[i] = 1\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(3)\n'done'",
        )
        .await
    });
    let pid_file = a_dir.join("pid");
    let mut pid = String::new();
    for _ in 0..500 {
        if let Ok(p) = std::fs::read_to_string(&pid_file) {
            if !p.is_empty() {
                pid = p;
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!pid.is_empty(), "the first cell never started");
    let r = py_in(b, &attack(pid.trim())).await;
    let ra = running.await.unwrap();
    assert_eq!(ra.status, Status::Ok, "the sibling was disturbed: {ra:?}");
    require_warm(&ra);
    assert_eq!(ra.value, json!("done"));
    (r, ra)
}

/// Python: what a cell learns of process `pid` and of the pool through
/// `/proc` (the sibling's status and stat: its RSS, CPU ticks, start time).
fn proc_attack(pid: &str) -> String {
    format!(
        r#"
import errno, os
pid, mine = {pid}, os.getpid()
def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
status = read("/proc/%d/status" % pid)
stat = read("/proc/%d/stat" % pid)
rss = [l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:")]
{{
    "mine": mine,
    "listed": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "visible": os.path.exists("/proc/%d" % pid),
    "status": "read" if rss else status,
    "rss_kb": int(rss[0]) if rss else 0,
    "stat": "read" if stat.startswith("%d (" % pid) else stat,
    "self": "VmRSS" in read("/proc/self/status") and read("/proc/%d/stat" % mine).startswith("%d (" % mine),
}}
"#
    )
}

#[tokio::test]
async fn a_cell_cannot_reach_a_concurrent_sibling() {
    let sup = one_zygote(pool(1));
    let a = sup.session(SessionConfig::default()).unwrap();
    let b = sup.session(SessionConfig::default()).unwrap();
    let a_dir = a.scratch_dir().unwrap().to_path_buf();
    let d = a_dir.display().to_string();
    let (r, _) = against_a_running_sibling(&a, &b, |pid| {
        format!(
            r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
pid, d = {pid}, {d:?}
out = {{"visible": os.path.exists("/proc/%d" % pid)}}
def attempt(name, f):
    try:
        f()
        out[name] = "allowed"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("kill", lambda: os.kill(pid, 9))
attempt("mem", lambda: open("/proc/%d/mem" % pid, "rb").read(1))
attempt("environ", lambda: open("/proc/%d/environ" % pid, "rb").read())
attempt("status", lambda: open("/proc/%d/status" % pid, "rb").read())
def trace():
    if libc.ptrace(16, pid, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
attempt("ptrace", trace)
attempt("read_secret", lambda: open(d + "/secret").read())
attempt("list_scratch", lambda: os.listdir(d))
attempt("write_scratch", lambda: open(d + "/planted", "w").write("x"))
out
"#
        )
    })
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    // Both cells share one zygote (one PID namespace): the sibling runs
    // (the kill below is refused, not ESRCH) but is not in this /proc.
    assert_eq!(r.value["visible"], false, "{}", r.value);
    for key in ["kill", "ptrace"] {
        assert_eq!(r.value[key], "EPERM", "{key}: {}", r.value);
    }
    for key in ["mem", "environ", "status"] {
        assert_eq!(r.value[key], "ENOENT", "{key}: {}", r.value);
    }
    for key in ["read_secret", "list_scratch", "write_scratch"] {
        assert_eq!(r.value[key], "EACCES", "{key}: {}", r.value);
    }
    assert!(!a_dir.join("planted").exists());
}

/// The sibling-/proc attack: a warm cell of another session, running in the
/// same zygote, is not in this cell's `/proc` (neither listed nor readable:
/// no RSS, CPU ticks or start time), while the cell still reads its own.
/// Positive control: the same attack under a profile that shows other
/// processes (`show_other_processes = true`) reads the sibling's RSS.
#[tokio::test]
async fn a_warm_cell_reads_nothing_of_a_sibling_in_proc() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sandbox-profiles/python.toml"
    ))
    .unwrap();
    let shown = text.replacen(
        "[filesystem]\n",
        "[filesystem]\nshow_other_processes = true\n",
        1,
    );
    assert_ne!(shown, text);
    let dir = tempfile::tempdir().unwrap();
    let shown_path = dir.path().join("python-shown.toml");
    std::fs::write(&shown_path, shown).unwrap();

    for show in [false, true] {
        let mut b = Supervisor::builder().worker_exe(bin()).python_pool(pool(1));
        if show {
            b = b.profile(Language::Python, shown_path.display().to_string());
        }
        let sup = b.build().unwrap();
        let a = sup.session(SessionConfig::default()).unwrap();
        let b = sup.session(SessionConfig::default()).unwrap();
        let (r, ra) = against_a_running_sibling(&a, &b, proc_attack).await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        require_warm(&r);
        let v = &r.value;
        assert_eq!(v["self"], true, "a cell reads its own /proc: {v}");
        let mine = v["mine"].clone();
        if show {
            assert_eq!(v["visible"], true, "control: {v}");
            assert_eq!(v["status"], "read", "control: {v}");
            assert_eq!(v["stat"], "read", "control: {v}");
            assert!(
                v["rss_kb"].as_u64().unwrap() >= 60 << 10,
                "control: the sibling's RSS (64 MiB touched): {v}"
            );
            assert!(v["listed"].as_array().unwrap().len() >= 3, "{v}");
        } else {
            assert_eq!(v["visible"], false, "{v}");
            assert_eq!(v["status"], "ENOENT", "{v}");
            assert_eq!(v["stat"], "ENOENT", "{v}");
            assert_eq!(
                v["listed"],
                json!([mine]),
                "only the cell itself is in its /proc (not the zygote, not the sibling): {v}"
            );
        }
        // The sibling was running all along.
        assert!(ra.usage.wall_ms >= 3000, "{ra:?}");
    }
}

/// Python: how often the bytes `needle` (given XOR 0x55, so the cell's
/// own code does not hold them) occur in this process's anonymous memory
/// (heap, arenas, stack: where a request's leftovers would be), leaving out
/// the scan's own buffer and the needle itself. Read in place with
/// memmove (a warm cell is not dumpable, so /proc/self/mem is root's).
fn memory_scan(encoded: &[u8]) -> String {
    let hex: String = encoded.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        r#"
import ctypes
def hits(hexed):
    needle = bytes.fromhex(hexed).translate(bytes(b ^ 0x55 for b in range(256)))
    at = ctypes.cast(ctypes.c_char_p(needle), ctypes.c_void_p).value
    buf = bytearray(1 << 20)
    lo = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    found = 0
    maps = open("/proc/self/maps").read().splitlines()
    for line in maps:
        f = line.split()
        if f[1][0] != "r" or (len(f) > 5 and f[5] not in ("[heap]", "[stack]")):
            continue
        start, end = (int(x, 16) for x in f[0].split("-"))
        while start < end:
            n = min(len(buf), end - start)
            ctypes.memmove(lo, start, n)
            i = buf.find(needle, 0, n)
            while i >= 0:
                a = start + i
                if a != at and not (lo <= a < lo + len(buf)):
                    found += 1
                i = buf.find(needle, i + 1, n)
            # Overlap by one byte less than the needle: a match across two
            # reads is seen once.
            start += n - (len(needle) - 1) if n > len(needle) and start + n < end else n
    return found
hits("{hex}")
"#
    )
}

/// A forked cell holds nothing of another session's request: the zygote
/// never reads a cell's setup (its scratch dir and limits go in a pipe only
/// the child reads), so after a cell of session A ran, a cell of session B
/// forked from the same zygote finds A's scratch dir name nowhere in its
/// own memory. Control: the same scan finds B's own scratch dir name.
#[tokio::test]
async fn a_forked_cell_holds_nothing_of_another_sessions_request() {
    let sup = one_zygote(pool(1));
    let a = sup.session(SessionConfig::default()).unwrap();
    let b = sup.session(SessionConfig::default()).unwrap();
    let name = |s: &Session| {
        s.scratch_dir()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let (a_name, b_name) = (name(&a), name(&b));
    assert_ne!(a_name, b_name);
    let enc = |n: &str| n.bytes().map(|c| c ^ 0x55).collect::<Vec<u8>>();
    for _ in 0..3 {
        let r = py_in(&a, "open('f', 'w').write('a')\n1").await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        require_warm(&r);
    }
    let r = py_in(&b, &memory_scan(&enc(&b_name))).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert!(
        r.value.as_u64().unwrap() >= 1,
        "control: the scan finds the cell's own scratch name: {r:?}"
    );
    let r = py_in(&b, &memory_scan(&enc(&a_name))).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value, json!(0), "another session's scratch name: {r:?}");
}

#[tokio::test]
async fn leftovers_of_one_cell_are_never_seen_by_the_next() {
    let sup = one_zygote(pool(1));
    let first = r#"
import json, os, sys, tempfile, threading, time
open(os.path.join(tempfile.gettempdir(), "left.txt"), "w").write("x")
try:
    open("/tmp/left.txt", "w").write("x")
    tmp = "written"
except OSError as e:
    tmp = type(e).__name__
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
json.dumps = lambda *a, **k: "patched"
sys.modules["planted"] = sys
os.environ["PLANTED"] = "1"
count = threading.active_count()
import builtins
builtins.len = lambda x: 42
[tmp, count]
"#;
    let r = run_py(&sup, first).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value[1], 2, "{r:?}");
    let second = r#"
import json, os, sys, tempfile, threading
[
    os.path.exists(os.path.join(tempfile.gettempdir(), "left.txt")),
    os.path.exists("/tmp/left.txt"),
    threading.active_count(),
    json.dumps([1]),
    "planted" in sys.modules,
    os.environ.get("PLANTED"),
    len([1, 2]),
]
"#;
    let r = run_py(&sup, second).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value, json!([false, false, 1, "[1]", false, null, 2]));
}

/// Host pids of the live (not zombie) processes in the PID namespace
/// `ns` (as `readlink /proc/<pid>/ns/pid` names it), with their pid in it.
fn in_pid_ns(ns: &str) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    for pid in pids() {
        let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap_or_default();
        if link.to_string_lossy() != ns {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        if field("State:").starts_with('Z') || field("State:").is_empty() {
            continue;
        }
        let inner = field("NSpid:")
            .split_whitespace()
            .last()
            .and_then(|p| p.parse().ok());
        if let Some(inner) = inner {
            out.push((pid, inner));
        }
    }
    out
}

/// Python: whether process `pid` exists, by a null signal (ESRCH: gone;
/// EPERM: it runs but may not be signalled). Unlike `/proc/<pid>`, which a
/// cell sees only for its own processes, this works for any pid.
/// Whether process `p` still runs, from a cell: a zombie (ended, not yet
/// reaped by its namespace's init) does not, nor one reaped between the
/// two looks.
const ALIVE_PY: &str = "import os\ndef alive(p):\n    try:\n        os.kill(p, 0)\n    except ProcessLookupError:\n        return False\n    except PermissionError:\n        return True\n    try:\n        st = open(f'/proc/{p}/stat').read()\n    except FileNotFoundError:\n        return False\n    except OSError:\n        return True\n    return st[st.rindex(')') + 2] != 'Z'\n";

#[tokio::test]
async fn processes_a_cell_starts_die_with_it() {
    let sup = one_zygote(pool(1));
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\n[pid, os.readlink('/proc/self/ns/pid')]",
            ),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    let orphan = r.value[0].as_i64().unwrap();
    let ns = r.value[1].as_str().unwrap().to_owned();
    // The zygote kills the cell's group when the cell ends, and reaps it.
    // These are cells of different sessions, which do not wait for each
    // other (a session's next cell does: see
    // `a_warm_cell_ends_at_done_and_what_it_started_is_gone_before_the_next`),
    // so on a loaded machine the next cell may start a moment before that:
    // the sleeper must be gone within a few seconds, not after 60. Seen
    // from the host (a cell's /proc shows only its own processes), and
    // from a cell of another session by a null signal.
    let check = format!("{ALIVE_PY}alive({orphan})");
    let mut r = run_py(&sup, check.clone()).await;
    let mut left = in_pid_ns(&ns);
    for _ in 0..50 {
        assert_eq!(r.status, Status::Ok, "{r:?}");
        if r.value == false && left.len() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        r = run_py(&sup, check.clone()).await;
        left = in_pid_ns(&ns);
    }
    assert_eq!(r.value, false, "the sleeper outlived its cell: {r:?}");
    assert!(
        !left.iter().any(|p| p.1 == orphan),
        "the sleeper outlived its cell: {left:?}"
    );
    assert_eq!(
        left.iter().map(|p| p.1).collect::<Vec<_>>(),
        vec![1],
        "only the zygote is left in the pool's namespace: {left:?}"
    );
}

#[tokio::test]
async fn killing_the_zygote_mid_cell_kills_the_cell_and_the_next_cell_gets_a_new_one() {
    let sup = one_zygote(pool(1));
    let s2 = sup.clone();
    let running = tokio::spawn(async move { run_py(&s2, "import time\ntime.sleep(30)").await });
    let mut old = None;
    for _ in 0..300 {
        let st = sup.pool_status().await;
        if let Some(z) = st.python.iter().find(|z| z.in_flight == 1) {
            old = Some(z.pid);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let old = old.expect("the cell never reached the zygote");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .expect("the cell outlived its zygote")
        .unwrap();
    assert_eq!(r.status, Status::Killed, "{r:?}");
    assert_eq!(r.exit.signal, Some(libc::SIGKILL), "{r:?}");
    let r = run_py(&sup, "40 + 2").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value, json!(42));
    let st = sup.pool_status().await;
    let live: Vec<_> = st.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{st:?}");
    assert_ne!(live[0].pid, old, "the zygote was replaced");
}

#[tokio::test]
async fn a_zygote_is_replaced_after_its_cell_count() {
    let sup = one_zygote(cellbox::PoolConfig {
        size: 1,
        max_cells: 2,
        ..cellbox::PoolConfig::default()
    });
    let mut pids = Vec::new();
    for _ in 0..5 {
        let r = run_py(&sup, "1").await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        require_warm(&r);
        let st = sup.pool_status().await;
        pids.push(st.python.iter().find(|z| z.alive).unwrap().pid);
    }
    assert_eq!(pids[0], pids[1], "{pids:?}");
    assert_ne!(pids[1], pids[2], "{pids:?}");
    assert_eq!(pids[2], pids[3], "{pids:?}");
    assert_ne!(pids[3], pids[4], "{pids:?}");
    // Retired zygotes are gone, not lingering.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for old in [pids[0], pids[2]] {
        assert!(
            !std::path::Path::new(&format!("/proc/{old}")).exists(),
            "retired zygote {old} still runs"
        );
    }
}

#[tokio::test]
async fn cells_above_the_pool_ceiling_run_cold_and_per_cell_limits_apply_warm() {
    let sup = one_zygote(pool(1));
    let mut cfg = SessionConfig::default();
    cfg.limits.rlimits.memory_bytes = 4 << 30;
    let r = sup
        .run(
            CellRequest::new(Language::Python, "import os\nos.getpid()"),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value,
        json!(1),
        "above the ceiling the cell runs cold: {r:?}"
    );
    let mut cfg = SessionConfig::default();
    cfg.limits.rlimits.memory_bytes = 256 << 20;
    cfg.limits.rlimits.max_open_files = 100;
    cfg.limits.rlimits.cpu_seconds = 7;
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "import resource as r\n[r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_NOFILE)[0], r.getrlimit(r.RLIMIT_CPU)[0], r.getrusage(r.RUSAGE_SELF).ru_utime < 1]",
            ),
            cfg,
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value, json!([256 << 20, 100, 7, true]));
}

/// A warm cell is returned at `done` (its worker closed its output first),
/// with all its output, exit code 0 and its own usage; a process it started
/// that closed its output too is gone before the session's next cell runs;
/// and one that still holds stdout makes the cell end the usual way.
#[tokio::test]
async fn a_warm_cell_ends_at_done_and_what_it_started_is_gone_before_the_next() {
    let sup = one_zygote(pool(1));
    let session = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(
        &session,
        "import sys\nfor i in range(3000):\n    print('x' * 99)\nsys.stderr.write('e' * 5000)\nn = sum(i % 7 for i in range(300000))\nn",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.stdout.len(), 300_000, "stdout cut short");
    assert_eq!(r.stderr.len(), 5000, "stderr cut short");
    assert_eq!(r.exit.code, Some(0), "{r:?}");
    assert!(
        r.usage.cpu_ms > 0 && r.usage.max_rss_kb > 0,
        "{:?}",
        r.usage
    );

    // A child that closes its output and sleeps: the cell returns at
    // `done`, the child dies with the cell's worker, and the next cell of
    // the session starts only after that.
    let r = py_in(
        &session,
        // (300 MB touched: the worker's exit takes a while, and the child
        // is killed only once the worker has exited.)
        "import os, time\npid = os.fork()\nif pid == 0:\n    os.close(1)\n    os.close(2)\n    time.sleep(60)\n    os._exit(0)\nbig = bytearray(300 << 20)\nfor i in range(0, len(big), 4096):\n    big[i] = 1\ndel i\n[pid, os.readlink('/proc/self/ns/pid')]",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let orphan = r.value[0].as_i64().unwrap();
    let ns = r.value[1].as_str().unwrap().to_owned();
    let r = py_in(
        &session,
        &format!("{ALIVE_PY}[os.readlink('/proc/self/ns/pid'), alive({orphan})]"),
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    // A pid means the same process only in the same PID namespace (a cell
    // that ran cold, in a namespace of its own, cannot judge it).
    assert_eq!(r.value[0], json!(ns), "the next cell ran cold: {r:?}");
    assert_eq!(
        r.value[1],
        json!(false),
        "the child of the previous cell is still running"
    );

    // A child that keeps stdout open: the cell still ends (with its exit),
    // and what the parent printed is there.
    let r = py_in(
        &session,
        "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nprint('parent')\n1",
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.stdout, "parent\n");
    assert_eq!(r.value, json!(1));
}

/// Each process's RLIMIT_AS does not bound a cell that forks: the memory of
/// all cells together is held in a memory cgroup (1 GiB here, so at most 3
/// children of 300 MiB hold theirs at once, and the rest are killed), on
/// the warm path and the cold one; the cgroup goes with the supervisor.
#[tokio::test]
async fn cells_that_fork_are_held_to_the_memory_of_all_cells() {
    if !nix::unistd::geteuid().is_root() {
        panic!("the cells' memory cgroup needs root; run the suite as root");
    }
    for warm in [true, false] {
        let sup = Supervisor::builder()
            .worker_exe(bin())
            .warm(warm)
            .cells_memory_bytes(1 << 30)
            .build()
            .unwrap();
        assert_eq!(sup.cells_memory(), Some(1 << 30));
        let s = sup.session(SessionConfig::default()).unwrap();
        let r = py_in(&s, &format!("{MEMORY_FORK_PY}held_killed\n")).await;
        assert_eq!(r.status, Status::Ok, "warm {warm}: {r:?}");
        if warm {
            require_warm(&r);
        }
        let v = r.value.as_array().unwrap().clone();
        let (held, killed) = (v[0].as_u64().unwrap(), v[1].as_u64().unwrap());
        assert!(held <= 3, "warm {warm}: {held} children held 300 MiB each");
        assert_eq!(held + killed, 8, "warm {warm}: {r:?}");
        // A cell after it runs as usual.
        let r = py_in(&s, "sum(range(10))").await;
        assert_eq!(r.value, json!(45), "warm {warm}: {r:?}");
        // The cell's memory cgroup, as the host sees it; gone with the
        // supervisor.
        let code = "[l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines() \
                    if 'memory' in l.split(':')[1].split(',') or l.startswith('0::')]";
        let r = py_in(&s, code).await;
        let paths: Vec<String> = serde_json::from_value(r.value.clone()).unwrap();
        let dir = paths
            .iter()
            .flat_map(|p| {
                let p = p.trim_start_matches('/').to_owned();
                [
                    "/sys/fs/cgroup/memory",
                    "/sys/fs/cgroup/unified",
                    "/sys/fs/cgroup",
                ]
                .map(move |root| std::path::Path::new(root).join(&p))
            })
            // The cells' cgroup, or a session's beneath it.
            .filter(|d| d.join("cgroup.procs").exists())
            .find_map(|d| {
                d.ancestors()
                    .find(|a| {
                        a.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("cellbox-"))
                    })
                    .map(std::path::Path::to_path_buf)
            })
            .unwrap_or_else(|| panic!("warm {warm}: the cell is in no cgroup of ours: {r:?}"));
        drop(s);
        drop(sup);
        // Background tasks (a worker's reaper) may hold the supervisor a
        // moment longer.
        let t0 = std::time::Instant::now();
        while dir.exists() && t0.elapsed() < std::time::Duration::from_secs(10) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(!dir.exists(), "warm {warm}: {} left behind", dir.display());
    }
}

/// `(state, ppid, comm)` of a process, from /proc (None once it is gone).
fn proc_stat(pid: i32) -> Option<(char, i32, String)> {
    stat(pid).map(|s| (s.state, s.ppid, s.comm))
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn is_live(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// The Python zygote process behind the pool status's `pid` (the
/// supervisor's child): that process itself once it runs Python (it is
/// PID 1 of its namespaces), or, where it cloned itself into them, its
/// child running Python. Panics unless the zygote is found and live: a
/// test that stops it must stop the process that answers the supervisor.
fn zygote_process(outer: i32) -> i32 {
    // The zygote reports ready before it executes the interpreter: under
    // load the process may not be Python yet for a moment.
    let t0 = std::time::Instant::now();
    loop {
        assert!(is_live(outer), "the pool's zygote {outer} is not running");
        if proc_stat(outer).is_some_and(|(_, _, comm)| comm.starts_with("python")) {
            return outer;
        }
        let mut found = Vec::new();
        for pid in pids() {
            if let Some((_, ppid, comm)) = proc_stat(pid) {
                if ppid == outer && comm.starts_with("python") && is_live(pid) {
                    found.push(pid);
                }
            }
        }
        if found.len() == 1 {
            return found[0];
        }
        assert!(
            found.len() < 2 && t0.elapsed() < std::time::Duration::from_secs(20),
            "expected one live Python zygote at or under {outer}: {found:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A process stopped with SIGSTOP for the length of a test; continued and
/// killed at its end whatever happened (it may be gone already).
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Stopped {
        assert!(is_live(pid), "{pid} is not running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let stopped = Stopped(pid);
        // The signal is delivered asynchronously: see it take effect.
        for _ in 0..200 {
            if proc_stat(pid).is_some_and(|(state, _, _)| state == 'T') {
                return stopped;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("{pid} did not stop: {:?}", proc_stat(pid));
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// The one live zygote of a pool of one, after a cell made sure it runs.
async fn the_live_zygote(sup: &Supervisor) -> i32 {
    let r = run_py(sup, "1").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    let st = sup.pool_status().await;
    let live: Vec<_> = st.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{st:?}");
    live[0].pid
}

#[tokio::test]
async fn a_stopped_zygote_is_replaced_and_a_cell_moves_to_a_new_one_within_its_deadline() {
    let sup = one_zygote(pool(1));
    let old = the_live_zygote(&sup).await;
    let zygote = zygote_process(old);
    let stopped = Stopped::new(zygote);
    let r = sup
        .run(
            CellRequest::new(Language::Python, "40 + 2").timeout(std::time::Duration::from_secs(5)),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    require_warm(&r);
    assert!(r.usage.wall_ms < 5000, "{r:?}");
    let st = sup.pool_status().await;
    let live: Vec<_> = st.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{st:?}");
    assert_ne!(live[0].pid, old, "the stopped zygote was replaced: {st:?}");
    assert!(st.python.iter().all(|z| z.pid != old || !z.alive), "{st:?}");
    // Nothing of it was in use any more: it is killed, not left stopped.
    let mut gone = false;
    for _ in 0..100 {
        if !is_live(zygote) {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        gone,
        "the stalled zygote {zygote} still exists: {:?}",
        proc_stat(zygote)
    );
    drop(stopped);
}

#[tokio::test]
async fn cells_move_off_a_stopped_zygote_to_a_running_one_of_the_pool() {
    let sup = one_zygote(pool(2));
    sup.start_pools().await.unwrap();
    let st = sup.pool_status().await;
    let pids: Vec<i32> = st
        .python
        .iter()
        .filter(|z| z.alive)
        .map(|z| z.pid)
        .collect();
    assert_eq!(pids.len(), 2, "{st:?}");
    let stopped = Stopped::new(zygote_process(pids[0]));
    // The pool hands cells to its zygotes in turn: one of these two is
    // given the stopped one and moves.
    for _ in 0..2 {
        let r = sup
            .run(
                CellRequest::new(Language::Python, "6 * 7")
                    .timeout(std::time::Duration::from_secs(5)),
                SessionConfig::default(),
            )
            .await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.value, json!(42));
        require_warm(&r);
    }
    // The stopped one is replaced behind the moved cell.
    let mut now = Vec::new();
    for _ in 0..100 {
        let st = sup.pool_status().await;
        now = st
            .python
            .iter()
            .filter(|z| z.alive)
            .map(|z| z.pid)
            .collect();
        if now.len() == 2 && !now.contains(&pids[0]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(!now.contains(&pids[0]), "{now:?} still has {}", pids[0]);
    assert!(now.contains(&pids[1]), "the running zygote stays: {now:?}");
    drop(stopped);
}

#[tokio::test]
async fn cells_in_flight_when_their_zygote_stops_end_by_their_own_deadline() {
    let sup = one_zygote(pool(1));
    let old = the_live_zygote(&sup).await;
    let zygote = zygote_process(old);
    // One cell that would run past its limit (it ignores the shim's own
    // timer, so the supervisor's deadline ends it), one that ends on its
    // own, in a session whose next cell follows it.
    let s1 = sup.clone();
    let long = tokio::spawn(async move {
        s1.run(
            CellRequest::new(
                Language::Python,
                "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(30)",
            )
                .timeout(std::time::Duration::from_secs(5)),
            SessionConfig::default(),
        )
        .await
    });
    let session = sup.session(replay(SessionConfig::default())).unwrap();
    let short = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .run(
                    CellRequest::new(Language::Python, "import time\ntime.sleep(1.5)\n42")
                        .timeout(std::time::Duration::from_secs(5)),
                )
                .await
        })
    };
    let mut both = false;
    for _ in 0..500 {
        let st = sup.pool_status().await;
        if st.python.iter().any(|z| z.pid == old && z.in_flight == 2) {
            both = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(both, "the two cells never ran on zygote {old}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stopped = Stopped::new(zygote);
    let r = tokio::time::timeout(std::time::Duration::from_secs(15), short)
        .await
        .expect("the short cell did not end")
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    let r = tokio::time::timeout(std::time::Duration::from_secs(15), long)
        .await
        .expect("the long cell did not end")
        .unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(
        r.usage.wall_ms < 5000 + 2000,
        "it ended by its 5 s deadline (+2 s): {r:?}"
    );
    // The session's next cell runs (on a new zygote) within its deadline.
    let r = session
        .run(CellRequest::new(Language::Python, "6 * 7").timeout(std::time::Duration::from_secs(5)))
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    require_warm(&r);
    let st = sup.pool_status().await;
    let live: Vec<_> = st.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{st:?}");
    assert_ne!(live[0].pid, old, "{st:?}");
    drop(stopped);
}

/// The pids named `pid=N` in log lines that contain `what`.
fn logged_pids(lines: &[String], what: &str) -> Vec<i32> {
    lines
        .iter()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            let at = l.find(" pid=")? + 5;
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// `serve` logs the pools' events an operator needs at its default level:
/// when the zygotes are all stopped, each found stalled and replaced (WARN)
/// and the cell moved (INFO; it still ends `ok` within its limit). Their
/// start is debug chatter, logged here (the pool's target at debug) only
/// to learn their pids.
#[test]
fn serve_logs_pool_events_by_default_and_cells_move_off_stopped_zygotes() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};
    let (mut child, mut stdin, answers) = serve::json_lines(
        std::process::Command::new(bin())
            .arg("serve")
            .env(
                "CELLBOX_LOG",
                cellbox::serve::DEFAULT_LOG.replace("cellbox::pool=info", "cellbox::pool=debug"),
            )
            .stderr(std::process::Stdio::piped()),
    );
    let stderr = child.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                log.lock().unwrap().push(line);
            }
        });
    }
    let mut send = |v: Value| serve::send_line(&mut stdin, &v);
    let patience = Duration::from_secs(60);
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    // The pools start before the server reads its first request.
    let init = answers.recv_timeout(patience).unwrap();
    assert_eq!(init["id"], 0, "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let wait_for = |what: &str, n: usize| -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let lines = log.lock().unwrap().clone();
            if lines.iter().filter(|l| l.contains(what)).count() >= n {
                return lines;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "serve never logged {what:?} {n} times: {lines:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let lines = wait_for("Python zygote started", 1);
    let started = logged_pids(&lines, "Python zygote started");
    assert!(
        lines.iter().any(|l| l.contains("cellbox::pool")),
        "{lines:#?}"
    );
    let stopped: Vec<Stopped> = started
        .iter()
        .map(|&p| Stopped::new(zygote_process(p)))
        .collect();
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "execute_code",
                   "arguments": {"language": "python", "code": "6 * 7", "timeout_seconds": 5}}}));
    let r = answers.recv_timeout(patience).unwrap();
    assert_eq!(r["id"], 1, "{r}");
    let result = &r["result"]["structuredContent"];
    assert_eq!(result["status"], "ok", "{r}");
    assert_eq!(result["value"], 42, "{r}");
    assert!(
        cellbox::serve::DEFAULT_LOG.contains("cellbox::pool=info"),
        "the default filter shows the pool's INFO and WARN lines"
    );
    let lines = wait_for("cell moved", 1);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" INFO ") && l.contains("cell moved")),
        "{lines:#?}"
    );
    let stalled = logged_pids(&lines, "stalled");
    assert!(
        started.iter().any(|p| stalled.contains(p)),
        "no stopped zygote was logged as stalled: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("stalled")),
        "{lines:#?}"
    );
    drop(stdin);
    // It ends (stopped zygotes and all) once its stdin closes.
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < patience, "the server outlived its stdin");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stopped);
}

/// The Rhai fork server is held to the same bounds: stopped, a cell that
/// must be forked for it (no spare has its limits) runs cold within its
/// limit, and the next cell gets a new server.
#[tokio::test]
async fn a_stopped_rhai_fork_server_is_replaced_and_its_cells_end_within_their_limit() {
    let sup = supervisor();
    sup.start_pools().await.unwrap();
    let st = sup.pool_status().await;
    let outer = st.rhai_fork_server_pid.expect("a fork server runs") as i32;
    // Like a zygote, the server is the child (PID 1 inside) of the
    // process the supervisor started, in a PID namespace; else that one.
    assert!(is_live(outer), "{st:?}");
    let mut inner: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&p| proc_stat(p).is_some_and(|(_, ppid, _)| ppid == outer) && is_live(p))
        .collect();
    if inner.is_empty() {
        inner.push(outer);
    }
    assert_eq!(
        inner.len(),
        1,
        "one server process under {outer}: {inner:?}"
    );
    let stopped = Stopped::new(inner[0]);
    let mut own =
        CellRequest::new(Language::Rhai, "40 + 2").timeout(std::time::Duration::from_secs(5));
    own.limits.memory_bytes = Some(200 << 20);
    let s = sup.session(SessionConfig::default()).unwrap();
    let r = s.run(own).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    assert!(r.usage.wall_ms < 5000, "{r:?}");
    let r = s
        .run(CellRequest::new(Language::Rhai, "6 * 7").timeout(std::time::Duration::from_secs(5)))
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    let st = sup.pool_status().await;
    assert!(st.rhai_fork_server, "{st:?}");
    assert_ne!(
        st.rhai_fork_server_pid,
        Some(outer as u32),
        "the stopped server was replaced: {st:?}"
    );
    drop(stopped);
}

/// A cell whose limit is shorter than the stall window ends `timeout` while
/// it waits for a stopped zygote, saying so and naming the zygote; the
/// answer it gave up on, still missing a window later, gets the zygote
/// replaced when the next cell asks for one.
#[tokio::test]
async fn a_cell_whose_deadline_passes_waiting_for_a_stopped_zygote_says_so() {
    let sup = one_zygote(pool(1));
    let old = the_live_zygote(&sup).await;
    let stopped = Stopped::new(zygote_process(old));
    let r = sup
        .run(
            CellRequest::new(Language::Python, "40 + 2")
                .timeout(std::time::Duration::from_millis(500)),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    let msg = &r.error.as_ref().unwrap().message;
    assert!(
        msg.contains("before it started") && msg.contains(&format!("pid {old}")),
        "{msg}"
    );
    assert!(r.usage.wall_ms < 500 + 2000, "{r:?}");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let r = sup
        .run(
            CellRequest::new(Language::Python, "6 * 7").timeout(std::time::Duration::from_secs(5)),
            SessionConfig::default(),
        )
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!(42));
    require_warm(&r);
    let st = sup.pool_status().await;
    let live: Vec<_> = st.python.iter().filter(|z| z.alive).collect();
    assert_eq!(live.len(), 1, "{st:?}");
    assert_ne!(live[0].pid, old, "{st:?}");
    drop(stopped);
}

/// A Python cell whose worker was started ahead has what it used read at
/// its `done` through what was opened when its worker started: its peak
/// RSS is what it reached, not what its worker had when it was started.
#[tokio::test]
async fn a_worker_started_ahead_reports_what_its_cell_used() {
    let sup = one_zygote(pool(1));
    let session = sup
        .session(SessionConfig {
            prepare_next: true,
            // (A live session's cells are not answered at `done`.)
            python_state: cellbox::PythonState::Replay,
            ..SessionConfig::default()
        })
        .unwrap();
    let small = py_in(&session, "1").await;
    assert_eq!(small.status, Status::Ok, "{small:?}");
    require_warm(&small);
    for _ in 0..3 {
        // Its next worker is started ahead meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let r = py_in(
            &session,
            "big = bytearray(64 << 20)\nfor i in range(0, len(big), 4096):\n    big[i] = 1\nlen(big)",
        )
        .await;
        assert_eq!(r.status, Status::Ok, "{r:?}");
        require_warm(&r);
        assert_eq!(r.value, json!(64 << 20));
        assert_eq!((r.exit.code, r.exit.signal), (Some(0), None));
        assert!(
            r.usage.max_rss_kb >= small.usage.max_rss_kb + 48 * 1024,
            "{:?} after {:?}",
            r.usage,
            small.usage
        );
    }
}

/// What a process was started with, argument by argument.
fn cmdline(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    raw.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[tokio::test]
async fn a_zygote_starts_from_the_precompiled_shim() {
    // Compiling the shim and the zygote's loop took most of a zygote's
    // start: it loads both ready-made, as a cold cell loads the shim.
    let sup = one_zygote(pool(1));
    let zygote = zygote_process(the_live_zygote(&sup).await);
    let argv = cmdline(zygote);
    assert!(argv.len() >= 9, "{argv:?}");
    assert_eq!(argv[1..5], ["-I", "-S", "-B", "-c"], "{argv:?}");
    assert!(
        argv[5].starts_with("# cellbox: start a Python cell, or a zygote"),
        "not the loader: {:?}",
        &argv[5][..argv[5].len().min(80)]
    );
    assert!(argv[6].ends_with(".pyshim"), "{argv:?}");
    assert_eq!(argv[7], "--zygote");
    assert!(
        !argv.iter().any(|a| a.contains("def _main")),
        "the shim's source was given too"
    );
    // Its cells work (the second on the same zygote).
    let r = run_py(&sup, "import sys\n[len(sys.argv), 6 * 7]").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.value, json!([1, 42]));
}

#[test]
fn a_zygote_starts_from_source_when_the_shim_cannot_be_precompiled() {
    // The cache directory is writable by others: the shim made there is
    // not trusted, and the zygote compiles the shim and its loop itself.
    let tmp = tempfile::tempdir().unwrap();
    let euid = nix::unistd::geteuid().as_raw();
    let shared = tmp.path().join(format!("cellbox-shim-{euid}"));
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = tmp.path().join("cell.py");
    std::fs::write(&script, "import sys\nprint(len(sys.argv), 6 * 7)\n").unwrap();
    let out = std::process::Command::new(bin())
        .args(["run", "--warm", "--json"])
        .arg(&script)
        .env("TMPDIR", tmp.path())
        .env("CELLBOX_LOG", "cellbox=warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("running the Python shim from source"),
        "{stderr}"
    );
    let r: CellResult = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.status, Status::Ok, "{r:?}");
    require_warm(&r);
    assert_eq!(r.stdout, "1 42\n");
    assert_eq!(
        std::fs::read_dir(&shared).unwrap().count(),
        0,
        "nothing is cached in a directory others can write"
    );
}
