//! A cell's end: its worker gone (a worker that said `done` first gets a
//! grace to exit by itself), reaped by us or reported by its parent, and
//! then what is left of its process tree ended. A worker that said `done`
//! and lingers has what it used read first ([`at_done`]), so the cell can
//! be answered at once while its [`Tail`] does the rest.

use super::launch::Reap;
use crate::sandbox::process;
use crate::supervisor::tenancy::{CellGroup, TreeUsage};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a worker that reported `done` may take to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A worker whose conversation is over: what it takes to see it gone.
pub(super) struct Worker {
    pub(super) pid: i32,
    pub(super) guard: process::KillOnDrop,
    pub(super) reap: Reap,
    /// Held until it is reaped (see `Started::in_flight`).
    pub(super) in_flight: Option<Box<dyn Send>>,
}

/// See `worker` gone (one that reported `done` first gets its grace to
/// exit by itself) and reaped, or its end reported by its parent; then the
/// rest of its process tree in `group`. How it ended, as far as known.
pub(super) async fn end(
    worker: Worker,
    exit_fd: &process::ExitWatch,
    done: bool,
    group: Option<&Arc<CellGroup>>,
) -> Result<process::Reaped, ReapError> {
    let Worker {
        pid,
        mut guard,
        reap: mut reap_src,
        in_flight,
    } = worker;
    let mut early = None;
    // A forked worker that reported exits by itself, and its parent's
    // report of that exit means it is gone: no need to watch it too.
    let mut graced = false;
    if done {
        if let Reap::Parent(parent, rx) = &mut reap_src {
            graced = true;
            // Once it has answered (a report, or its reporter gone or
            // stalled) it must not be awaited again.
            match await_report(parent.as_ref(), exit_fd, rx, EXIT_GRACE).await {
                Report::Reported(r) => early = Some(Some(r)),
                Report::Gone => early = Some(None),
                Report::NotExited => {}
            }
        }
    }
    if !matches!(early, Some(Some(_))) {
        let forked = !matches!(reap_src, Reap::Direct);
        // Its grace after `done` is used up: kill it now.
        let grace = done && !graced;
        finish_process(pid, exit_fd, grace, forked).await;
    }
    let reaped = match (early, reap_src) {
        (Some(Some(r)), _) => Ok(r),
        (_, Reap::Direct) => tokio::task::spawn_blocking(move || process::reap(pid))
            .await
            .map_err(ReapError::from)
            .and_then(|r| r.map_err(ReapError::from)),
        (Some(None), Reap::Parent(parent, _)) => {
            parent.forget(pid);
            Err(ReapError::ParentGone(parent.name()))
        }
        (None, Reap::Parent(parent, mut rx)) => {
            // It is gone (or beyond our reach): its parent reports that at
            // once, unless it is stalled.
            match await_report(parent.as_ref(), exit_fd, &mut rx, Duration::ZERO).await {
                Report::Reported(r) => Ok(r),
                Report::Gone | Report::NotExited => {
                    parent.forget(pid);
                    Err(ReapError::NoReport(parent.name()))
                }
            }
        }
    };
    drop(in_flight);
    if reaped.is_ok() {
        guard.disarm();
    }
    // The cell is over when its whole process tree is: whatever it started
    // (in its own session, double-forked) is killed and waited for here,
    // before its output is collected and before its slot, its scratch
    // directory or its session's next cell are released.
    let tree = end_tree(group).await;
    let mut reaped = reaped;
    if let (Ok(r), Some(cpu_ms)) = (reaped.as_mut(), tree.cpu_ms) {
        // The group counts every process the cell had; the report only
        // the first and the children it waited for.
        r.cpu_ms = r.cpu_ms.max(cpu_ms);
    }
    reaped
}

/// What a worker that said `done` and lingers (see
/// [`crate::protocol::Start::linger`]) used, read from the kernel while it
/// is alive through its `probe`, taken when it was started: its peak
/// resident size, and the CPU time of its cell group (else its own). It
/// exits with code 0 once let go. `None` when that cannot be read (it is
/// gone already, having not lingered; or not on Linux): then the cell
/// waits for its reaping, as any other.
#[cfg(target_os = "linux")]
pub(super) fn at_done(
    probe: Option<&process::Probe>,
    exit: &process::ExitWatch,
    group: Option<&Arc<CellGroup>>,
) -> Option<process::Reaped> {
    let probe = probe?;
    let max_rss_kb = probe.peak_rss_kb()?;
    let cpu_ms = match group.and_then(|g| g.usage().cpu_ms) {
        Some(ms) => ms,
        None => process::cpu_ns(probe.pid())? / 1_000_000,
    };
    // Read from that process, not another given its pid after it was gone.
    if exit.has_exited() {
        return None;
    }
    Some(process::Reaped {
        code: Some(0),
        signal: None,
        cpu_ms,
        max_rss_kb,
    })
}

/// Stop a worker that said `done`, and every process it started, before
/// its cell is answered: nothing of a cell runs once its result is out.
/// With a cell group every process in it is sent SIGKILL (see
/// [`CellGroup::stop`]); else the worker and its process group (a warm
/// cell cannot leave its group; a fresh one is PID 1 of its own PID
/// namespace, whose processes die with it). It does not wait for them to
/// be gone: the cell's [`Tail`] does, holding whatever was the cell's
/// until then. `host` is the worker's pid in our PID namespace, when
/// known (for a forked worker, as its probe read it while it lived).
pub(super) fn stop_at_done(
    worker: &Worker,
    host: Option<i32>,
    exit: &process::ExitWatch,
    group: Option<&Arc<CellGroup>>,
) {
    let _ = exit.kill();
    if let Some(g) = group {
        match g.stop() {
            Ok(_) => return,
            Err(e) => tracing::warn!("failed to stop a cell's processes at its done: {e}"),
        }
    }
    let leader = match worker.reap {
        Reap::Direct => Some(worker.pid),
        Reap::Parent(..) => host,
    };
    // The leader has not been reaped (it lingers, or is a zombie of its
    // parent's): its group id is still its own.
    if let Some(pgid) = leader {
        let _ = process::kill_group(pgid);
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn at_done(
    _exit: &process::ExitWatch,
    _group: Option<&Arc<CellGroup>>,
) -> Option<process::Reaped> {
    None
}

/// The rest of a cell that was answered at its worker's `done`: the
/// worker, let go, seen gone and reaped, and the rest of its process tree
/// ended. Whatever was the cell's waits for it: its cgroup and scratch
/// directory are held here, and the session's next cell and a server's
/// concurrency slot wait for [`Tail::wait`].
#[derive(Debug, Clone)]
pub(crate) struct Tail(tokio_util::sync::CancellationToken);

impl Tail {
    /// Let go of `worker` (closing `channel`, its end of the protocol
    /// socket, which it lingers on), and end it (watched by `exit`) and its
    /// tree in `group`, holding `scratch` until then.
    pub(super) fn start(
        worker: Worker,
        channel: Option<tokio::net::unix::OwnedWriteHalf>,
        exit: process::ExitWatch,
        group: Option<Arc<CellGroup>>,
        scratch: Arc<crate::supervisor::scratch::Scratch>,
    ) -> Tail {
        let over = tokio_util::sync::CancellationToken::new();
        // Over when the task is, however it ends.
        let guard = over.clone().drop_guard();
        tokio::spawn(async move {
            let _over = guard;
            // Let go here rather than before the cell is answered: its
            // exit then takes no core from the answer.
            drop(channel);
            // It exits by itself (code 0, as its result says), or is
            // killed after its grace.
            if let Err(e) = end(worker, &exit, true, group.as_ref()).await {
                tracing::warn!("a cell answered at its `done`: {e}");
            }
            release_group(group).await;
            if Arc::strong_count(&scratch) == 1 {
                let _ = tokio::task::spawn_blocking(move || drop(scratch)).await;
            }
        });
        Tail(over)
    }

    /// Resolves once the cell's worker and process tree are gone.
    pub(crate) async fn wait(&self) {
        self.0.cancelled().await
    }

    /// Whether the cell's worker and process tree are gone.
    pub(crate) fn is_over(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// Let go of a cell's group. Emptying it may wait for its last processes:
/// off the runtime (an empty one, the usual case, is kept for the
/// session's next cell; one still held elsewhere is let go there).
pub(super) async fn release_group(group: Option<Arc<CellGroup>>) {
    if let Some(g) = group {
        if Arc::strong_count(&g) > 1 || g.is_empty() {
            drop(g);
        } else {
            let _ = tokio::task::spawn_blocking(move || drop(g)).await;
        }
    }
}

/// A live cell whose process became its session's next state process: it
/// is not waited for, killed or reaped (its parent, the previous state
/// process, forgets it); the rest of its tree in `group` is ended as
/// after any cell. `usage` is what it used, read from it.
pub(super) async fn kept_as_state(
    worker: Worker,
    usage: process::Reaped,
    group: Option<&Arc<CellGroup>>,
) -> process::Reaped {
    let Worker {
        pid,
        mut guard,
        reap,
        in_flight,
    } = worker;
    guard.disarm();
    if let Reap::Parent(parent, _) = reap {
        parent.forget(pid);
    }
    drop(in_flight);
    let tree = end_tree(group).await;
    let mut usage = usage;
    if let Some(cpu_ms) = tree.cpu_ms {
        usage.cpu_ms = usage.cpu_ms.max(cpu_ms);
    }
    usage
}

/// Why a worker's end is not known.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReapError {
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Wait(#[from] std::io::Error),
    #[error("{0} went away before it reported how the cell ended")]
    ParentGone(&'static str),
    #[error("{0} did not report how the cell ended")]
    NoReport(&'static str),
}

/// What a forked worker's parent said of its end.
enum Report {
    Reported(process::Reaped),
    /// No report will come: the parent is gone, or stalled (and replaced).
    Gone,
    /// The worker had not exited within its grace.
    NotExited,
}

/// Wait for a forked worker's end as its parent reports it: the worker may
/// take `grace` to exit; once it has, its parent must report that within
/// its stall window, or the parent is stalled (and replaced), so a stopped
/// parent costs a cell at most that window, not a fixed wait.
async fn await_report(
    parent: &dyn crate::supervisor::warm::ForkingParent,
    exit: &process::ExitWatch,
    rx: &mut tokio::sync::oneshot::Receiver<process::Reaped>,
    grace: Duration,
) -> Report {
    let answer = |a: Result<process::Reaped, _>| match a {
        Ok(r) => Report::Reported(r),
        Err(_) => Report::Gone,
    };
    tokio::select! {
        biased;
        a = &mut *rx => return answer(a),
        _ = exit.exited() => {}
        _ = tokio::time::sleep(grace) => return Report::NotExited,
    }
    let within = parent.report_within();
    let gone_at = Instant::now();
    match tokio::time::timeout(within, &mut *rx).await {
        Ok(a) => answer(a),
        Err(_) => {
            parent.stalled("a cell's end", gone_at.elapsed());
            Report::Gone
        }
    }
}

/// How long the rest of a cell's process tree may take to die once killed.
const TREE_END_WITHIN: Duration = Duration::from_secs(10);

/// Kill what is left of a cell's tree and wait until nothing is; what its
/// group measured of it.
async fn end_tree(group: Option<&Arc<CellGroup>>) -> TreeUsage {
    let Some(g) = group else {
        return TreeUsage::default();
    };
    if !g.is_empty() {
        let g2 = g.clone();
        match tokio::task::spawn_blocking(move || g2.end(TREE_END_WITHIN)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("a cell's processes outlived it: {e}"),
            Err(e) => tracing::warn!("failed to end a cell's processes: {e}"),
        }
    }
    g.usage()
}

/// Wait for the worker to be gone, killing it (and its whole process group)
/// as needed. Returns once the leader has exited (it stays a zombie until
/// reaped, so its pid and pgid cannot be reused while we kill the group).
/// With `grace` (a worker that reported `done` exits by itself) it first
/// gets [`EXIT_GRACE`] to do so.
async fn finish_process(pid: i32, exit: &process::ExitWatch, grace: bool, forked: bool) {
    if grace {
        let _ = tokio::time::timeout(EXIT_GRACE, exit.exited()).await;
    }
    if forked {
        // The fork server kills the child's group before reaping it.
        let _ = exit.kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), exit.exited()).await;
        return;
    }
    let _ = process::kill_group(pid);
    let _ = process::kill_pid(pid);
    let _ = tokio::time::timeout(Duration::from_secs(10), exit.exited()).await;
    // Anything it left in its group dies too.
    let _ = process::kill_group(pid);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// What a process used is read from it while it lives; once it is
    /// gone there is nothing to read (and the cell waits for its reaping).
    #[tokio::test]
    async fn what_a_lingering_worker_used_is_read_from_it_alive() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .expect("spawn");
        let exit = process::ExitWatch::open(child.id() as i32).expect("watch");
        let probe = exit.probe().expect("a live process is probed");
        assert_eq!(probe.pid(), child.id() as i32);
        let used = at_done(Some(&probe), &exit, None).expect("read from the live process");
        assert_eq!((used.code, used.signal), (Some(0), None));
        assert!(used.max_rss_kb > 0, "{used:?}");
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(at_done(Some(&probe), &exit, None).is_none());
        assert!(probe.peak_rss_kb().is_none(), "read from a reaped process");
        assert!(exit.probe().is_none(), "a reaped process is probed");
        assert!(at_done(None, &exit, None).is_none());
    }
}
