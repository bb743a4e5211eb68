//! Helpers shared by the integration tests: the binary, supervisors and
//! cells ([`procs`]: the host's processes; [`serve`]: `cellbox serve` as a
//! child process).
#![allow(dead_code)]

pub mod fake_model;
pub mod fake_upstream;
pub mod procs;
pub mod serve;

pub use procs::{cmdline, comm, descendants, pids, processes, stat, Proc};

use cellbox::{
    Capability, CellRequest, CellResult, EventSink, Language, Policy, PoolConfig, Session,
    SessionConfig, Supervisor,
};
use std::path::PathBuf;

/// The cellbox binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cellbox"))
}

/// Seconds since the epoch, as a cell's clock reads them.
pub fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub fn supervisor() -> Supervisor {
    Supervisor::builder().worker_exe(bin()).build().unwrap()
}

/// `add(a, b)`: a host capability that adds two integers (schema-checked).
pub fn add_capability() -> Capability {
    Capability::new(
        "add",
        "Add two integers",
        serde_json::json!({"type": "object",
               "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"], "additionalProperties": false}),
        |_ctx, args| async move {
            let a = args["a"].as_i64().unwrap_or(0);
            let b = args["b"].as_i64().unwrap_or(0);
            Ok(serde_json::json!(a + b))
        },
    )
    .unwrap()
}

/// `config` with Python's namespace carried as JSON and replayed
/// definitions (`PythonState::Replay`) rather than kept live.
pub fn replay(config: SessionConfig) -> SessionConfig {
    SessionConfig {
        python_state: cellbox::PythonState::Replay,
        ..config
    }
}

pub fn config(allow: &[&str]) -> SessionConfig {
    let mut policy = Policy::deny_all();
    for a in allow {
        policy.allow.insert((*a).to_owned());
    }
    SessionConfig {
        policy,
        ..SessionConfig::default()
    }
}

pub async fn rhai(session: &Session, code: &str) -> CellResult {
    session.run(CellRequest::new(Language::Rhai, code)).await
}

pub async fn py_in(session: &Session, code: &str) -> CellResult {
    session.run(CellRequest::new(Language::Python, code)).await
}

/// Run a Python cell on `sup` with the default session config.
pub async fn run_py(sup: &Supervisor, code: impl Into<String>) -> CellResult {
    sup.run(
        CellRequest::new(Language::Python, code),
        SessionConfig::default(),
    )
    .await
}

/// Run a Rhai cell on `sup` with the default session config.
pub async fn run_rhai(sup: &Supervisor, code: impl Into<String>) -> CellResult {
    sup.run(
        CellRequest::new(Language::Rhai, code),
        SessionConfig::default(),
    )
    .await
}

/// `detail` of the sandbox layer `name` of a cell's report ("" without one).
pub fn layer_detail(r: &CellResult, name: &str) -> String {
    r.sandbox
        .as_ref()
        .and_then(|s| s.layer(name))
        .map(|l| l.detail.clone())
        .unwrap_or_default()
}

/// A supervisor whose Python pool runs with `config`, and which prepares
/// nothing for its next cell (a prepared worker would be a cell of the
/// pool between those a test counts).
pub fn one_zygote(config: PoolConfig) -> Supervisor {
    Supervisor::builder()
        .worker_exe(bin())
        .prepare_runs(false)
        .python_pool(config)
        .build()
        .unwrap()
}

/// A pool of `size` zygotes, otherwise the defaults.
pub fn pool(size: usize) -> PoolConfig {
    PoolConfig {
        size,
        ..PoolConfig::default()
    }
}

/// A supervisor that writes its events to the file `events`.
pub fn with_events(events: &std::path::Path) -> Supervisor {
    Supervisor::builder()
        .worker_exe(bin())
        .events(EventSink::to_file(events).unwrap())
        .build()
        .unwrap()
}

/// The events file `events` (every line must be an event) and its
/// `cell_start` events, in order.
pub fn cell_starts(events: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(events).unwrap();
    let starts = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "cell_start")
        .collect();
    (text, starts)
}

/// Panic (saying `why`) unless the suite runs as root.
pub fn require_root(why: &str) {
    assert!(nix::unistd::geteuid().is_root(), "{why}");
}

/// Wait until `f` holds (checked every 50 ms), up to `secs`.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub async fn run_once(lang: Language, code: &str, allow: &[&str]) -> CellResult {
    supervisor()
        .run(CellRequest::new(lang, code), config(allow))
        .await
}

/// Run the binary with arguments and optional stdin.
pub fn cellbox(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = serve::spawn_piped(std::process::Command::new(bin()).args(args));
    {
        let mut si = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            let _ = si.write_all(s.as_bytes());
        }
    }
    child.wait_with_output().unwrap()
}

/// `cellbox exec --json [extra] -- argv`: exit code and parsed result.
pub fn exec_json(extra: &[&str], argv: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut args = vec!["exec", "--json"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(argv);
    let out = cellbox(&args, None);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}): stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// Whether `pid` is a fork-server spare: a sandboxed child waiting for a
/// cell it has not been given (it renames itself when it gets one), or one
/// just forked that has not named itself yet (a child of the inner fork
/// server not named `cellbox-cell`).
pub fn is_spare(pid: i32) -> bool {
    let name = comm(pid);
    if name == "cellbox-spare" {
        return true;
    }
    if name == "cellbox-cell" {
        return false;
    }
    // Forked (not executed) from the fork server, so the same command
    // line, and its parent is the server.
    let forkserver = |p: i32| cmdline(p).contains("__forkserver");
    let Some(server) = stat(pid).map(|s| s.ppid) else {
        return false;
    };
    forkserver(pid) && forkserver(server)
}

/// (pid, state, cmdline) of every cell worker descended from this process:
/// direct workers and fork-server children alike (not the fork server, not
/// its waiting spares).
pub fn children() -> Vec<(i32, char, String)> {
    let me = std::process::id() as i32;
    let all = processes();
    let inner = fork_servers(&all);
    all.into_iter()
        .filter(|p| (p.ppid == me && !p.cmd.contains("__forkserver")) || inner.contains(&p.ppid))
        .filter(|p| !is_spare(p.pid))
        .map(|p| (p.pid, p.state, p.cmd))
        .collect()
}

/// The fork servers of this process's supervisors: our children (each PID
/// 1 of its pool's namespaces) that fork cells.
fn fork_servers(all: &[Proc]) -> Vec<i32> {
    let me = std::process::id() as i32;
    all.iter()
        .filter(|p| p.ppid == me && p.cmd.contains("__forkserver"))
        .map(|p| p.pid)
        .collect()
}

/// The workers (pid, comm) forked by the fork server `server` (the pid the
/// pool status gives): its spares and its running cells.
pub fn forked_by(server: u32) -> Vec<(i32, String)> {
    processes()
        .iter()
        .filter(|p| p.ppid == server as i32)
        .map(|p| (p.pid, comm(p.pid)))
        .collect()
}

/// The spares waiting in this process's fork servers.
pub fn spares() -> Vec<i32> {
    let all = processes();
    let inner = fork_servers(&all);
    all.iter()
        .filter(|p| inner.contains(&p.ppid) && is_spare(p.pid))
        .map(|p| p.pid)
        .collect()
}

/// Python: 8 children each touch 300 MiB and hold it until released;
/// `held_killed` is then [children that still held it at release, children
/// killed by SIGKILL]. Append `held_killed` (a cell's value) or
/// `print(*held_killed)`.
pub const MEMORY_FORK_PY: &str = r#"
import os
N, SIZE = 8, 300 << 20
release_r, release_w = os.pipe()
kids = []
for i in range(N):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r); os.close(release_w)
        b = bytearray(SIZE)
        for j in range(0, SIZE, 4096):
            b[j] = 1
        os.write(w, b"1")
        os.read(release_r, 1)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
for pid, r in kids:
    os.read(r, 1)
os.close(release_w)
ends = [os.waitpid(pid, 0)[1] for pid, _ in kids]
held_killed = [sum(1 for s in ends if os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0),
               sum(1 for s in ends if os.WIFSIGNALED(s) and os.WTERMSIG(s) == 9)]
"#;

/// A Python cell that makes `call` five times, with `allow` allowed and a
/// budget of two tool calls, ends `limit_exceeded`, naming
/// `max_tool_calls`.
pub async fn assert_tool_budget_ends_the_cell(sup: &Supervisor, allow: &str, call: &str) {
    let mut c = config(&[allow]);
    c.policy.max_tool_calls = 2;
    let code = format!("for i in range(5):\n    {call}\n");
    let r = sup.run(CellRequest::new(Language::Python, code), c).await;
    assert_eq!(r.status, cellbox::Status::LimitExceeded, "{r:?}");
    assert!(r.error.unwrap().message.contains("max_tool_calls"));
}

/// A supervisor with the tools a `[tools.NAME]` TOML declares.
#[cfg(target_os = "linux")]
pub fn supervisor_with(tools_toml: &str) -> Supervisor {
    #[derive(serde::Deserialize)]
    struct F {
        tools: cellbox::tools::ToolsConfig,
    }
    let f: F = toml::from_str(tools_toml).unwrap();
    let slot = cellbox::tools::SupervisorSlot::default();
    let mut b = Supervisor::builder().worker_exe(bin());
    for cap in cellbox::tools::host_and_declared(&Default::default(), &f.tools, &slot).unwrap() {
        b = b.capability(cap).unwrap();
    }
    let sup = b.build().unwrap();
    let _ = slot.set(sup.downgrade());
    sup
}

/// The path of the pids cgroup named in `cgroup` (a cell's
/// `/proc/self/cgroup`), beneath the hierarchy's mount point.
pub fn pids_cgroup_of(cgroup: &str) -> String {
    cgroup
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "pids"))
        })
        // cgroup v2: the one hierarchy's.
        .or_else(|| cgroup.lines().find(|l| l.starts_with("0::")))
        .and_then(|l| l.rsplit(':').next())
        .unwrap_or_else(|| panic!("no pids cgroup in {cgroup}"))
        .to_owned()
}

/// Host processes holding a file whose path contains `token` open.
pub fn holders_of(token: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for pid in pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path())
                .map(|l| l.to_string_lossy().contains(token))
                .unwrap_or(false)
            {
                out.push(pid);
                break;
            }
        }
    }
    out
}

/// Whether process `pid` can still run code of its own: it is there, not a
/// zombie, and has no SIGKILL pending (a process sent SIGKILL never
/// returns to its code; it may still be closing its descriptors).
pub fn can_run(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let sigkill = 1u64 << 8;
    !status.lines().any(|l| {
        if let Some(state) = l.strip_prefix("State:") {
            let state = state.trim_start();
            return state.starts_with('Z') || state.starts_with('X');
        }
        l.strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & sigkill != 0)
    })
}

/// [`holders_of`] that can still run code (see [`can_run`]).
pub fn running_holders_of(token: &str) -> Vec<i32> {
    holders_of(token)
        .into_iter()
        .filter(|p| can_run(*p))
        .collect()
}

/// A Python cell that forks a child into its own session (holding a file
/// named with `token` open), then writes its own `done` frame on the
/// protocol descriptor and lives on. The old supervisor returned at that
/// `done` and killed the cell's process group, so the child (another
/// session, another group) lived on after the result, with the cell's
/// scratch directory removed under it and its concurrency slot free.
pub fn forged_done(token: &str) -> String {
    format!(
        r#"
import os, struct, time
pid = os.fork()
if pid == 0:
    try:
        os.setsid()  # (refused where the cell may not)
    except OSError:
        pass
    f = open("{token}", "w")
    while True:
        time.sleep(0.05)
time.sleep(0.3)
frame = b'{{"t":"done","status":"ok","value":"forged"}}'
os.write(3, struct.pack(">I", len(frame)) + frame)
time.sleep(60)
"#
    )
}
