//! Nothing a cell starts outlives it: every process a cell starts is in
//! its cell's group (a live cell's: its session's) and can run no more
//! once the cell is answered, whoever its parent is (a pool process, a
//! state process: `clone(CLONE_PARENT)` makes a child its parent's
//! sibling), and whatever the cell did to the runtime shim it runs in.
//! Each test is judged from the host's `/proc`, and sees the attack work
//! while the cell runs (its positive control).

use super::common::{self, *};
#[path = "../shared/hijack.rs"]
mod hijack;
use cellbox::{CellRequest, CellResult, Language, SessionConfig, Status, Supervisor};
use std::time::Duration;

fn py(code: &str) -> CellRequest {
    CellRequest::new(Language::Python, code)
}

fn token(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7);
    format!("{name}-{}-{nanos}", std::process::id())
}

fn require_root() {
    common::require_root("these tests need root: cells' cgroups are made by a root supervisor");
}

/// A Python cell whose process starts a child with `clone(CLONE_PARENT)`
/// (the child of the cell's parent: a zygote, a state process; a fresh
/// worker is PID 1 of its namespace, which may not, so there a child of
/// it does), the child holding a file named `token` open; the cell then
/// replaces `posix._exit`, which the runtime shim calls once it has said
/// `done`, so its process would linger rather than exit. Its value is the
/// pid the clone returned.
pub fn clone_parent_code(token: &str) -> String {
    format!(
        r#"
import ctypes, os, platform, posix, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {{"x86_64": 56, "aarch64": 220}}[platform.machine()]
CLONE_PARENT, SIGCHLD = 0x8000, 17

def sibling():
    pid = libc.syscall(NR, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        f = open({token:?}, "w")
        while True:
            time.sleep(0.01)
    return pid, ctypes.get_errno()

pid, err = sibling()
if pid < 0 and err == 22:
    # PID 1 of its namespace: a child of it clones instead.
    r, w = os.pipe()
    if os.fork() == 0:
        pid, err = sibling()
        os.write(w, str(pid).encode())
        os._exit(0)
    pid = int(os.read(r, 64))
if pid < 0:
    raise OSError(err, "clone(CLONE_PARENT)")
posix._exit = lambda code: time.sleep(60)
time.sleep(0.3)
pid
"#
    )
}

/// Run `run` while watching for holders of `token`: whether one was seen
/// while it ran, its result, and the holders that could still run code
/// once it returned.
async fn watched<F>(token: &str, run: F) -> (bool, CellResult, Vec<i32>)
where
    F: std::future::Future<Output = CellResult> + Send + 'static,
{
    let running = tokio::spawn(run);
    let mut seen = false;
    while !running.is_finished() {
        seen |= !holders_of(token).is_empty();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = running.await.unwrap();
    (seen, r, running_holders_of(token))
}

/// Kill what a failed test left (by pid, processes it started).
fn kill_left(token: &str) {
    for p in holders_of(token) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL);
    }
}

async fn a_clone_parent_child_is_stopped_before_the_answer(sup: Supervisor, path: &str) {
    let t = token("clone-parent");
    let code = clone_parent_code(&t);
    // A session of its own, answered at the cell's `done`, as `serve`'s
    // calls are (`Supervisor::run` returns once the cell's tree is gone).
    let session = sup.session(replay(SessionConfig::default())).unwrap();
    let (seen, r, alive) = watched(&t, async move { session.run(py(&code)).await }).await;
    kill_left(&t);
    assert_eq!(r.status, Status::Ok, "{path}: {r:?}");
    assert!(seen, "{path}: the child never held its file: {r:?}");
    assert!(
        alive.is_empty(),
        "{path}: the cell's CLONE_PARENT child could still run once it was answered: {alive:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_parent_child_of_a_warm_cell_is_stopped_before_the_answer() {
    require_root();
    a_clone_parent_child_is_stopped_before_the_answer(supervisor(), "warm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_parent_child_of_a_fresh_cell_is_stopped_before_the_answer() {
    require_root();
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .build()
        .unwrap();
    a_clone_parent_child_is_stopped_before_the_answer(sup, "fresh").await;
}

/// A cell without a state process takes over the shim it runs in (see
/// `hijack::shim_sender_code`): its sender forks a child as the shim sends
/// `done`, then its process never leaves and forks on a timer. The answer
/// comes (through the taken-over sender: it says what it forked), and once
/// it has come no child of the cell's can run, nor after the next cell.
/// Control: the host sees the cell's children while the cell runs, and
/// the answer names the child forked at `done`.
async fn a_hijacked_shim_forks_nothing_past_the_answer(sup: Supervisor, path: &str) {
    let t = token("hijacked-shim");
    let code = hijack::shim_sender_code(&t);
    let session = sup.session(replay(SessionConfig::default())).unwrap();
    let s2 = session.clone();
    let (seen, r, alive) = watched(&t, async move { s2.run(py(&code)).await }).await;
    let next = session.run(py("6 * 7")).await;
    let after_next = running_holders_of(&t);
    kill_left(&t);
    assert_eq!(r.status, Status::Ok, "{path}: {r:?}");
    let value = r.value.as_str().unwrap_or_default();
    assert!(
        value.starts_with("hijacked, forked ") && !value.contains("forked 0 "),
        "{path}: the taken-over sender did not answer: {r:?}"
    );
    assert!(
        seen,
        "{path}: the cell's children never held their files: {r:?}"
    );
    assert!(
        alive.is_empty(),
        "{path}: a child of the hijacked shim could still run once the cell was answered: {alive:?}"
    );
    assert_eq!(next.value, serde_json::json!(42), "{path}: {next:?}");
    assert!(
        after_next.is_empty(),
        "{path}: a child of the hijacked shim could run after the next cell: {after_next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hijacked_shim_of_a_warm_cell_forks_nothing_past_the_answer() {
    require_root();
    a_hijacked_shim_forks_nothing_past_the_answer(supervisor(), "warm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hijacked_shim_of_a_fresh_cell_forks_nothing_past_the_answer() {
    require_root();
    let sup = Supervisor::builder()
        .worker_exe(bin())
        .warm(false)
        .build()
        .unwrap();
    a_hijacked_shim_forks_nothing_past_the_answer(sup, "fresh").await;
}

/// A live session's cell attaches a child to the session's state process
/// (`clone(CLONE_PARENT)`, from the cell's own process): the state
/// processes' children are not spared when the cell ends, so the child is
/// killed before the answer, and the result and the events say so. The
/// session goes on with its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_parent_child_of_a_live_cell_is_killed_before_the_answer_and_recorded() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let sup = with_events(&events);
    let session = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(&session, "x = 41").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let t = token("live-clone-parent");
    let code = clone_parent_code(&t);
    let s2 = session.clone();
    let (seen, r, alive) = watched(&t, async move { s2.run(py(&code)).await }).await;
    kill_left(&t);
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(seen, "the child never held its file: {r:?}");
    assert!(
        alive.is_empty(),
        "the child attached to the state process could still run once the cell was answered: {alive:?}"
    );
    assert!(
        r.notes.iter().any(|n| n.contains("were killed")),
        "the result does not say what was killed: {:?}",
        r.notes
    );
    let text = std::fs::read_to_string(&events).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("\"session_processes_killed\"")),
        "no event recorded it: {text}"
    );
    let r = py_in(&session, "x + 1").await;
    assert_eq!(r.value, serde_json::json!(42), "{r:?}");
}

/// The session's cgroup directory in the `cpuacct` and `freezer`
/// hierarchies, from a cell's `/proc/self/cgroup` text.
fn session_dirs(cgroup: &str) -> (String, String) {
    let path = |controller: &str| {
        cgroup
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, c, p) = (f.next()?, f.next()?, f.next()?);
                c.split(',').any(|c| c == controller).then(|| p.to_owned())
            })
            .unwrap_or_else(|| panic!("no {controller} line in {cgroup}"))
    };
    (
        format!("/sys/fs/cgroup/cpuacct{}", path("cpuacct")),
        format!("/sys/fs/cgroup/freezer{}", path("freezer")),
    )
}

fn cpu_ns(dir: &str) -> u64 {
    std::fs::read_to_string(format!("{dir}/cpuacct.usage"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A live session whose state loop was taken over runs nothing between
/// cells: once a cell is over (and the session settled) its group is
/// frozen, and the CPU time its cgroup counts does not move while it is
/// idle, though the hijacked state process spins whenever it may run (as
/// it does during a cell: the positive control); the children it forks
/// during a cell are killed at the cell's end and said so, and none can
/// run between cells. The session still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hijacked_state_loop_runs_nothing_between_cells() {
    require_root();
    let sup = supervisor();
    let session = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(&session, "x = 1").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let t = token("hijacked-state");
    let r = py_in(&session, &hijack::state_loop_code(&t)).await;
    assert_eq!(r.value, serde_json::json!("hijacked"), "{r:?}");
    // During a cell the hijacked state process runs: it forks (the cell
    // itself forks nothing) and spins.
    let r = py_in(&session, "open('/proc/self/cgroup').read()").await;
    let (cpu, freezer) = session_dirs(r.value.as_str().unwrap());
    let before = cpu_ns(&cpu);
    let s2 = session.clone();
    let (seen, r, _) = watched(&t, async move {
        s2.run(py("import time\ntime.sleep(1)\nx")).await
    })
    .await;
    let during = cpu_ns(&cpu) - before;
    assert_eq!(r.value, serde_json::json!(1), "{r:?}");
    assert!(
        seen && during > 0,
        "the hijacked state did not run during a cell ({during} ns in 1 s): the attack is broken"
    );
    assert!(
        r.notes.iter().any(|n| n.contains("were killed")),
        "the children the hijacked state forked during the cell were not reported: {:?}",
        r.notes
    );
    // Between cells: frozen, no CPU, nothing of it running.
    session.settled().await;
    let a = cpu_ns(&cpu);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = cpu_ns(&cpu) - a;
    let running = running_holders_of(&t);
    let state = std::fs::read_to_string(format!("{freezer}/freezer.state")).unwrap();
    kill_left(&t);
    assert_eq!(idle, 0, "an idle session used {idle} ns of CPU in 1 s");
    assert!(
        running.is_empty(),
        "children of the hijacked state could run between cells: {running:?}"
    );
    assert_eq!(state.trim(), "FROZEN");
    let r = py_in(&session, "x + 1").await;
    assert_eq!(r.value, serde_json::json!(2), "{r:?}");
}

/// A state process whose loop was taken over answers a request the
/// supervisor never made, with a pidfd of a child of its own: the
/// supervisor closes its channel, kills it (through the pidfd it opened
/// and checked itself), tells the next result why, and seeds the next
/// state from the session's JSON variables; what it sent is never used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_answer_from_a_state_process_is_refused_and_recorded() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let sup = with_events(&events);
    let session = sup.session(SessionConfig::default()).unwrap();
    let r = py_in(&session, "x = 5").await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let code = r#"
import ctypes, os, platform, time
G = call.__globals__
serve = G["_state_serve"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": 56, "aarch64": 220}[platform.machine()]
CLONE_PIDFD, SIGCHLD = 0x1000, 17

def hijacked():
    fd = ctypes.c_int(-1)
    pid = libc.syscall(NR, CLONE_PIDFD | SIGCHLD, 0, ctypes.byref(fd), 0, 0)
    if pid == 0:
        while True:
            time.sleep(0.01)
    G["_state_serve"] = serve
    # Its `ready` first (the loop sends it), then the forged answer.
    real = G["_zsend"]
    def forge(obj, fds=()):
        real(obj, fds)
        if obj.get("op") == "ready" and fd.value >= 0:
            real({"op": "spawned", "id": 424242, "pid": pid}, (fd.value,))
    G["_zsend"] = forge
    serve()

G["_state_serve"] = hijacked
"#;
    // The forged answer is read once the supervisor has taken the cell's
    // successor in: that cell's result says so when it came by then, else
    // the next one does.
    let hijack = py_in(&session, code).await;
    assert_eq!(hijack.status, Status::Ok, "{hijack:?}");
    let next = py_in(&session, "x").await;
    let said = |r: &CellResult| {
        r.notes
            .iter()
            .any(|n| n.contains("broke its protocol") && n.contains("424242"))
    };
    assert!(said(&hijack) || said(&next), "{hijack:?} {next:?}");
    assert_eq!(next.value, serde_json::json!(5), "{next:?}");
    let text = std::fs::read_to_string(&events).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("\"state_protocol_error\"") && l.contains("424242")),
        "no event recorded it: {text}"
    );
    let r = py_in(&session, "x + 1").await;
    assert_eq!(r.value, serde_json::json!(6), "{r:?}");
}

/// A chain of processes, each spinning 0.6 s of CPU and forking the next
/// before it exits: each stays under its own RLIMIT_CPU of 1 s (the chain
/// says how far each went), so only a count over all of the cell's
/// processes ends it. The cell (warm and sessionless, then in a live
/// session, whose processes are counted in the session's group) ends
/// `limit_exceeded` at its `cpu_seconds`, not at its wall-clock limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_children_cannot_reset_its_cpu_count() {
    require_root();
    let code = r#"
import os, sys, time
def link(n):
    t = time.process_time()
    while time.process_time() - t < 0.6:
        pass
    sys.stderr.write("link %d used %.2f s\n" % (n, time.process_time() - t))
    sys.stderr.flush()
    if os.fork() == 0:
        link(n + 1)
    os._exit(0)
if os.fork() == 0:
    link(0)
time.sleep(60)
"#;
    let sup = supervisor();
    let mut cfg = replay(config(&[]));
    cfg.limits.rlimits.cpu_seconds = 1;
    cfg.limits.timeout_ms = 40_000;
    let mut live = config(&[]);
    live.limits = cfg.limits.clone();
    for (path, cfg) in [("warm", cfg), ("live", live)] {
        let session = sup.session(cfg).unwrap();
        let r = session.run(py(code)).await;
        assert_eq!(r.status, Status::LimitExceeded, "{path}: {r:?}");
        let e = r.error.as_ref().unwrap();
        assert!(e.message.contains("cpu_seconds"), "{path}: {r:?}");
        // Its first link stayed under its own bound and handed on: the
        // control (RLIMIT_CPU alone would let the chain run to the
        // wall-clock limit).
        assert!(r.stderr.contains("link 0 used 0.6"), "{path}: {r:?}");
    }
}

/// A session's CPU budget holds over all its cells: each cell forks a
/// chain of three processes, each spinning 0.4 s of CPU and forking the
/// next (under its own RLIMIT_CPU and its cell's `cpu_seconds` of 2), and
/// waits for the chain's end. With `session_cpu_seconds` of 3, the first
/// two cells run whole (the control: the chain works and the budget is not
/// spent by them), a later one is ended `limit_exceeded` naming the
/// session's budget, and the next is refused, naming it too. The cells'
/// CPU times, read from their cgroups, add up to about the budget: no
/// chain started its count afresh. Warm (state replayed) and live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cpu_budget_holds_across_cells() {
    require_root();
    let code = r#"
import os, sys, time
r, w = os.pipe()
def link(n):
    t = time.process_time()
    while time.process_time() - t < 0.4:
        pass
    if n == 2:
        os.write(w, b"x")
        os._exit(0)
    if os.fork() == 0:
        link(n + 1)
    os._exit(0)
if os.fork() == 0:
    link(0)
os.read(r, 1)
"chain done"
"#;
    let sup = supervisor();
    let mut cfg = replay(config(&[]));
    cfg.limits.rlimits.cpu_seconds = 2;
    cfg.limits.session_cpu_seconds = 3;
    cfg.limits.timeout_ms = 40_000;
    let mut live = config(&[]);
    live.limits = cfg.limits.clone();
    for (path, cfg) in [("warm", cfg), ("live", live)] {
        let session = sup.session(cfg).unwrap();
        let mut cpu_ms = 0;
        let mut ended = None;
        for n in 0..6 {
            let r = session.run(py(code)).await;
            cpu_ms += r.usage.cpu_ms;
            if n < 2 {
                assert_eq!(r.status, Status::Ok, "{path}, cell {n}: {r:?}");
                assert_eq!(r.value, serde_json::json!("chain done"), "{path}: {r:?}");
                assert!(r.usage.cpu_ms >= 1_200, "{path}, cell {n}: {r:?}");
                continue;
            }
            if r.status == Status::Ok {
                continue;
            }
            ended = Some(r);
            break;
        }
        let ended = ended.unwrap_or_else(|| panic!("{path}: no cell was ended in 6"));
        assert_eq!(ended.status, Status::LimitExceeded, "{path}: {ended:?}");
        let e = ended.error.as_ref().unwrap();
        assert!(
            e.message.contains("session_cpu_seconds"),
            "{path}: {ended:?}"
        );
        // (A live session's state process also runs a little outside its
        // cells' count, on the session's.)
        assert!(
            cpu_ms >= 2_700,
            "{path}: the cells' groups counted {cpu_ms} ms: {ended:?}"
        );
        let refused = session.run(py("1")).await;
        assert_eq!(refused.status, Status::LimitExceeded, "{path}: {refused:?}");
        let e = refused.error.as_ref().unwrap();
        assert!(
            e.message.contains("session_cpu_seconds") && e.message.contains("spent"),
            "{path}: {refused:?}"
        );
    }
}
