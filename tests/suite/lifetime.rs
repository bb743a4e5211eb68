//! Nothing a cell starts outlives it: every process a cell starts is in
//! its cell's group (a live cell's: its session's) and can run no more
//! once the cell is answered, whoever its parent is (a pool process, a
//! state process: `clone(CLONE_PARENT)` makes a child its parent's
//! sibling), and whatever the cell did to the runtime shim it runs in.
//! Each test is judged from the host's `/proc`, and sees the attack work
//! while the cell runs (its positive control).

use super::common::{self, *};
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
