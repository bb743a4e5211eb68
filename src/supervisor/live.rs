//! Live Python sessions: a session's namespace kept in a sandboxed **state
//! process** (see `crate::sandbox::zygote::StateMsg` and `zygote.py`)
//! rather than replayed from JSON values and definitions.
//!
//! The first cell of a live session forks the state process from a zygote,
//! under the cell sandbox and the session's scratch dir and limits. Each
//! cell then runs in a child of the state process. A cell that succeeds
//! leaves the session's next state process: its own process, which serves
//! as that state process once `done` is sent, when it has one thread, no
//! children and less than half of the session's CPU-time limit used (see
//! `_live_become` in zygote.py; it is then not waited for, see
//! [`LiveCell::became`]), or else a fork of it made before `done`. Either
//! is in the session's own group already (a live cell runs there), and the
//! old state process ends. A cell that fails, times out or is killed leaves no successor: the
//! old state process, untouched, stays. Every object, not only JSON, is
//! kept or rolled back whole. A checkpoint is an idle copy of a state
//! process; restoring one makes a copy of it the session's state.
//!
//! State processes have run the session's code (a cell can reach the
//! runtime's globals and replace its loop): nothing they say is trusted
//! beyond that session. Pids they name are looked up among the session's
//! own processes (its cgroup), every pidfd is checked against that group
//! after it is opened (see `groups::open_member`), an answer to a request
//! never made closes the channel (`pool_client::Parent::Untrusted`), and
//! their reports only decide the session's own results. Nor do they run
//! between cells: once a cell is over, everything in the session's group
//! but its state processes is killed (recorded in the result and the
//! events), its next cell's process is forked ahead when the supervisor
//! asks, and the session is frozen ([`settle`]) until its next cell.

use super::pool_client::{next_packet, Parent, PoolClient, Refused};
use super::warm::ForkingParent;
use super::zygote::Zygote;
use crate::plan::Rlimits;
use crate::sandbox::linux::groups::{self, SessionGroup};
use crate::sandbox::process::{self, Reaped};
use crate::sandbox::zygote::{self as wire, StateMsg};
use crate::util::lock;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

/// How long a state process may take to answer (fork a cell, say `ready`).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// How long what a live cell left behind may take to die once killed.
const TREE_END_WITHIN: Duration = Duration::from_secs(10);

/// How a cell ended when its state process vanished before reporting it.
const LOST: Reaped = Reaped {
    code: None,
    signal: Some(libc::SIGKILL),
    cpu_ms: 0,
    max_rss_kb: 0,
};

/// How long after a cell's result its session is settled (see [`settle`]):
/// ending the state process it replaced and forking the next cell's
/// process would otherwise compete with handing the result back.
const SETTLE_AFTER: Duration = Duration::from_millis(2);

/// How long a state process may take to fork its spare, and the spare to
/// warm up, once asked (the settling of a session takes at most this and
/// the freeze).
const SPARE_WITHIN: Duration = Duration::from_secs(2);

/// How long a killed state process may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(2);

/// The state process a cell's successor replaced, ended by the session's
/// settling ([`settle`]) a moment after the cell's result rather than
/// before it: its exit (the kernel freeing an interpreter's pages, most of
/// a millisecond) would otherwise compete with handing the result back,
/// often on the same CPU. The session's next cell ends it at once if it
/// comes sooner.
#[derive(Default, Clone)]
pub(crate) struct Retired(Arc<Mutex<Option<Arc<StateProc>>>>);

impl std::fmt::Debug for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retired").finish_non_exhaustive()
    }
}

impl Retired {
    /// End `state` when the session settles (or at [`Self::now`]).
    pub(crate) fn later(&self, state: Arc<StateProc>) {
        let before = lock(&self.0).replace(state);
        drop(before);
    }

    /// End the retired state process now, if one waits.
    pub(crate) fn now(&self) {
        let state = lock(&self.0).take();
        drop(state);
    }

    fn take(&self) -> Option<Arc<StateProc>> {
        lock(&self.0).take()
    }
}

/// One state process: the supervisor's end of its channel and a pidfd.
pub(crate) struct StateProc {
    /// Its channel: requests by id, the ends of the cells it forked.
    client: Arc<PoolClient>,
    pidfd: OwnedFd,
    /// Its pid in our PID namespace (kept while a cell's leftovers are
    /// killed: see [`LiveCell::end_others`]).
    host: i32,
    /// Its pid in the zygote's PID namespace, as it said when ready.
    ns_pid: i32,
    /// Killed, or found ended (its channel may not have closed yet).
    dead: AtomicBool,
    /// Keeps the zygote, whose PID namespace every state process lives in.
    zygote: Arc<Zygote>,
    /// The session's group, where it and everything it forks live.
    session: Arc<SessionGroup>,
    /// The session's limits, which every cell of it runs under (a cell's
    /// own, when tighter, as soft limits).
    pub(crate) rlimits: Rlimits,
    /// The process it forked ahead for its next cell, once it said so.
    spare: Arc<Mutex<Option<Spare>>>,
    _in_flight: Option<super::zygote::InFlight>,
}

/// A process a state process forked ahead for its next cell when asked
/// (`prefork`, see `_live_prefork` in zygote.py), found among the
/// session's processes: the next cell is sent to it directly, so that the
/// state process, which shares its pages, runs nothing on the cell's way.
/// Killed when dropped unused.
struct Spare {
    ns_pid: i32,
    host: i32,
    pidfd: Option<OwnedFd>,
    /// Its end of the channel it waits on: closed, it exits.
    channel: OwnedFd,
    session: Arc<SessionGroup>,
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(pidfd) = &self.pidfd {
            self.session.kill(pidfd.as_fd());
        }
    }
}

/// The cell's process, as [`StateProc::run`] gives it: its pid in the
/// zygote's namespace, our end of the channel its successor will say
/// `ready` on, and, when it was a spare, its pid in ours and its pidfd
/// (already found among the session's processes).
pub(crate) struct RunCell {
    pub(crate) ns_pid: i32,
    pub(crate) next: OwnedFd,
    pub(crate) found: Option<(i32, OwnedFd)>,
}

/// A live cell's process as launched: its pid in the zygote's namespace
/// and in ours, and a pidfd (see [`LiveCell::cell`]).
pub(crate) type CellProcess = (i32, i32, OwnedFd);

impl Spare {
    /// Take in a state process's answer to `prefork` (`spawned {pid}` with
    /// the spare's channel): `None` (the channel closed, so the process
    /// exits) unless it came with one fd and the pid names one of the
    /// session's processes that is alive.
    fn found(session: &Arc<SessionGroup>, ns_pid: i32, mut fds: Vec<OwnedFd>) -> Option<Spare> {
        if fds.len() != 1 {
            return None;
        }
        let channel = fds.pop()?;
        let host = host_pid(session.pids_path(), ns_pid)?;
        let pidfd = groups::open_member(session.pids_path(), host).ok()?;
        Some(Spare {
            ns_pid,
            host,
            pidfd: Some(pidfd),
            channel,
            session: session.clone(),
        })
    }

    /// Wait (at most `within`) until the spare says it has warmed up, or
    /// its channel closes: a spare frozen while it warms up would do the
    /// rest on its cell's way. What it says is not otherwise used.
    async fn warmed(&self, within: Duration) {
        let Ok(fd) = self.channel.try_clone() else {
            return;
        };
        let Ok(fd) = process::watch_readable(fd) else {
            return;
        };
        let _ = tokio::time::timeout(within, next_packet::<serde_json::Value>(&fd, 256)).await;
    }

    /// Its pid in our namespace and its pidfd, as the process of a cell:
    /// no longer killed when dropped.
    fn into_cell(mut self) -> Option<(i32, OwnedFd)> {
        let pidfd = self.pidfd.take()?;
        Some((self.host, pidfd))
    }

    /// Whether it has ended or is being killed (a SIGKILL sent while the
    /// session was frozen is acted on once it is thawed).
    fn gone(&self) -> bool {
        self.pidfd
            .as_ref()
            .is_none_or(|p| process::ended_or_killed(p.as_fd(), self.host))
    }
}

impl std::fmt::Debug for StateProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateProc")
            .field("dead", &self.is_dead())
            .finish_non_exhaustive()
    }
}

impl StateProc {
    /// Fork a session's first state process from `zygote`, with the
    /// session's scratch dir and limits, into the session's group.
    pub(crate) async fn start(
        zygote: Arc<Zygote>,
        scratch: &Path,
        rlimits: &Rlimits,
        session: &Arc<SessionGroup>,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<StateProc>, String> {
        let (ours, theirs) = crate::sandbox::forkserver::seqpacket_pair()
            .map_err(|e| format!("failed to create a state process channel: {e}"))?;
        let null = || -> Result<OwnedFd, String> {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map(OwnedFd::from)
                .map_err(|e| format!("failed to open /dev/null: {e}"))
        };
        // It joins the session's group itself, first thing, as a zygote's
        // child does (before any of the session's code runs in it).
        let join = session.join_fds().map_err(|e| e.to_string())?;
        let join: Vec<_> = join.iter().map(|f| f.as_fd()).collect();
        let (_pid, pidfd, in_flight) = zygote
            .spawn(
                theirs,
                (null()?, null()?),
                wire::CellSetup {
                    scratch: scratch.to_string_lossy().into_owned(),
                    rlimits: *rlimits,
                    state: true,
                    waits: false,
                },
                &join,
                deadline,
            )
            .await
            .map_err(|e| e.to_string())?;
        let (ctl, ns_pid) = await_ready(ours).await?;
        // It joined the session's group before it said ready.
        let host = groups::member_pid(&pidfd, session.pids_path()).map_err(|e| {
            let _ = process::pidfd_kill(pidfd.as_fd());
            format!("the state process is not the session's: {e}")
        })?;
        Self::serve(
            ctl,
            pidfd,
            (host, ns_pid),
            zygote,
            (*rlimits, session),
            Some(in_flight),
        )
    }

    /// Take over a state process that says `ready` on `ours`, found among
    /// the session's processes. It is in the session's group already: it
    /// was forked there (by a state process, or by a cell, which runs in
    /// the session's group too), so it is never moved. Moving another
    /// process by pid takes the kernel's global cgroup lock, which waits
    /// for an RCU grace period (milliseconds) when it was idle; and a state
    /// process is never handed a `tasks` descriptor to move itself: it has
    /// run the session's code, and such a descriptor could move any process
    /// it can name (another session's too) into a group that is emptied.
    ///
    /// `cell` is the process of the cell that made it, when known: the one
    /// that most often becomes the state process itself (see
    /// `_live_become` in zygote.py), found among the session's processes
    /// when it was launched.
    async fn adopt(
        ours: OwnedFd,
        zygote: Arc<Zygote>,
        rlimits: Rlimits,
        session: &Arc<SessionGroup>,
        cell: Option<CellProcess>,
    ) -> Result<Arc<StateProc>, String> {
        let (ctl, ns_pid) = await_ready(ours).await?;
        let (host, pidfd) = match cell {
            // Alive, so that pid is still that process's (checked to be
            // the session's when the cell was launched).
            Some((ns, host, pidfd)) if ns == ns_pid && !process::pidfd_exited(pidfd.as_fd()) => {
                (host, pidfd)
            }
            _ => {
                let host = host_pid(session.pids_path(), ns_pid).ok_or_else(|| {
                    format!("the state process {ns_pid} is not among the session's")
                })?;
                let pidfd = groups::open_member(session.pids_path(), host)
                    .map_err(|e| format!("failed to open the state process {host}: {e}"))?;
                (host, pidfd)
            }
        };
        Self::serve(ctl, pidfd, (host, ns_pid), zygote, (rlimits, session), None)
    }

    fn serve(
        ctl: AsyncFd<OwnedFd>,
        pidfd: OwnedFd,
        (host, ns_pid): (i32, i32),
        zygote: Arc<Zygote>,
        (rlimits, session): (Rlimits, &Arc<SessionGroup>),
        in_flight: Option<super::zygote::InFlight>,
    ) -> Result<Arc<StateProc>, String> {
        let ours = ctl
            .get_ref()
            .try_clone()
            .map_err(|e| format!("failed to share a state process channel: {e}"))?;
        let client = Arc::new(PoolClient::of(ours, Some(LOST), Parent::Untrusted));
        let reader = client.clone();
        let refuser = client.clone();
        // Nothing of its own comes unasked (`ready` only first on a new
        // channel): anything else breaks the protocol, and its fds are
        // closed unused.
        tokio::spawn(async move {
            reader
                .read::<StateMsg>(&ctl, 4096, |msg, fds| {
                    drop(fds);
                    refuser.refuse(format!("it sent an unasked {}", state_op(&msg)));
                    false
                })
                .await
        });
        Ok(Arc::new(StateProc {
            client,
            pidfd,
            host,
            ns_pid,
            dead: AtomicBool::new(false),
            zygote,
            session: session.clone(),
            rlimits,
            spare: Arc::new(Mutex::new(None)),
            _in_flight: in_flight,
        }))
    }

    /// Why its channel was closed on a message that broke the protocol, if
    /// it was (it is then killed, and the session's live objects lost).
    pub(crate) fn violation(&self) -> Option<String> {
        self.client.violation()
    }

    /// Its pid in our PID namespace.
    pub(crate) fn host_pid(&self) -> i32 {
        self.host
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || self.client.is_closed()
    }

    /// Whether it has ended or is being killed (checked at once, not
    /// when its channel's end is read): a cell can kill its own session's
    /// state processes, so this is asked before one is reported kept.
    pub(crate) fn gone(&self) -> bool {
        if self.is_dead() {
            return true;
        }
        let gone = process::ended_or_killed(self.pidfd.as_fd(), self.host);
        if gone {
            self.dead.store(true, Ordering::SeqCst);
        }
        gone
    }

    pub(crate) fn zygote(&self) -> &Arc<Zygote> {
        &self.zygote
    }

    /// Start the process of one cell (its protocol socket, stdout and
    /// stderr): its spare's, when it has one waiting, else one it forks
    /// when asked. It stays in the session's group (see [`Self::adopt`]
    /// for why it is never moved).
    pub(crate) async fn run(
        &self,
        (proto, out, err): (OwnedFd, OwnedFd, OwnedFd),
        rlimits: &Rlimits,
        deadline: tokio::time::Instant,
    ) -> Result<RunCell, String> {
        if self.is_dead() {
            return Err("the session's state process is gone".into());
        }
        let (next_ours, next_theirs) = crate::sandbox::forkserver::seqpacket_pair()
            .map_err(|e| format!("failed to create a state process channel: {e}"))?;
        let fds = [proto.as_fd(), out.as_fd(), err.as_fd(), next_theirs.as_fd()];
        let spare = lock(&self.spare).take();
        if let Some(spare) = spare {
            // Gone (a cell may kill its session's processes), or it closed
            // its end: the state process forks the cell instead (and the
            // spare is killed).
            if !spare.gone()
                && crate::sandbox::packet::send(spare.channel.as_fd(), rlimits, &fds).is_ok()
            {
                let ns_pid = spare.ns_pid;
                if let Some(found) = spare.into_cell() {
                    return Ok(RunCell {
                        ns_pid,
                        next: next_ours,
                        found: Some(found),
                    });
                }
            }
        }
        let run = |id| StateMsg::Run {
            id,
            rlimits: *rlimits,
        };
        let (id, rx) = self.client.request(run, &fds).map_err(|e| {
            self.dead.store(true, Ordering::SeqCst);
            format!("failed to reach the state process: {e}")
        })?;
        drop((proto, out, err, next_theirs));
        let within = (tokio::time::Instant::now() + ANSWER_WITHIN).min(deadline);
        match tokio::time::timeout_at(within, rx).await {
            Ok(Ok(Ok(spawned))) if spawned.fds.is_empty() => Ok(RunCell {
                ns_pid: spawned.pid,
                next: next_ours,
                found: None,
            }),
            Ok(Ok(Ok(spawned))) => {
                drop(spawned);
                self.client
                    .refuse("it answered `run` with descriptors".to_owned());
                self.kill();
                Err("the session's state process broke its protocol".into())
            }
            Ok(Ok(Err(Refused(message)))) => Err(format!(
                "the session's state process could not fork the cell: {message}"
            )),
            Ok(Err(_)) => Err("the session's state process went away".into()),
            Err(_) => {
                self.client.give_up(id, None);
                self.kill();
                Err("the session's state process did not answer".into())
            }
        }
    }

    /// An idle copy of this state process (a checkpoint, or the session's
    /// state restored from one).
    pub(crate) async fn copy(&self) -> Result<Arc<StateProc>, String> {
        let session = &self.session;
        if self.is_dead() {
            return Err("the state process is gone".into());
        }
        let (ours, theirs) = crate::sandbox::forkserver::seqpacket_pair()
            .map_err(|e| format!("failed to create a state process channel: {e}"))?;
        let (id, _answer) = self
            .client
            .request(|id| StateMsg::Clone { id }, &[theirs.as_fd()])
            .map_err(|e| format!("failed to reach the state process: {e}"))?;
        drop(theirs);
        let adopted = Self::adopt(ours, self.zygote.clone(), self.rlimits, session, None).await;
        self.client.give_up(id, None);
        adopted
    }

    /// How child `pid` (a cell's process) ended.
    pub(crate) fn exit_of(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        if self.dead.load(Ordering::SeqCst) {
            // Nothing more comes from it: what is not reported is lost.
            self.client.close();
        }
        self.client.exit_of(pid)
    }

    /// Ask it to fork the process of its next cell ahead (its spare), and
    /// wait (at most [`SPARE_WITHIN`]) until that has warmed up. Kept
    /// only when the answer names a process of the session's.
    pub(crate) async fn prefork(&self) -> Result<(), String> {
        if self.is_dead() {
            return Err("the session's state process is gone".into());
        }
        // One it forked before, unused, goes first.
        let before = lock(&self.spare).take();
        drop(before);
        let (id, rx) = self
            .client
            .request(|id| StateMsg::Prefork { id }, &[])
            .map_err(|e| format!("failed to reach the state process: {e}"))?;
        let answer = tokio::time::timeout(SPARE_WITHIN, rx).await;
        let spawned = match answer {
            Ok(Ok(Ok(spawned))) => spawned,
            Ok(Ok(Err(Refused(message)))) => {
                return Err(format!("no spare was forked: {message}"));
            }
            Ok(Err(_)) => return Err("the session's state process went away".into()),
            Err(_) => {
                self.client.give_up(id, None);
                return Err("the session's state process forked no spare in time".into());
            }
        };
        let spare = Spare::found(&self.session, spawned.pid, spawned.fds)
            .ok_or("the spare named is not the session's, or came without its channel")?;
        spare.warmed(SPARE_WITHIN).await;
        *lock(&self.spare) = Some(spare);
        Ok(())
    }

    /// The pid (our namespace) of its spare, if it has one.
    pub(crate) fn spare_pid(&self) -> Option<i32> {
        lock(&self.spare).as_ref().map(|s| s.host)
    }

    /// Kill it (and its spare), and wait (at most [`EXIT_WITHIN`]) until it
    /// has exited.
    pub(crate) async fn end(&self) {
        self.kill();
        let Ok(fd) = self.pidfd.try_clone() else {
            return;
        };
        if let Ok(exit) = process::ExitWatch::from_pidfd(fd) {
            let _ = tokio::time::timeout(EXIT_WITHIN, exit.exited()).await;
        }
    }

    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let spare = lock(&self.spare).take();
        drop(spare);
        self.session.kill(self.pidfd.as_fd());
    }
}

impl Drop for StateProc {
    fn drop(&mut self) {
        // Killed before its channel is shut: at the channel's end a state
        // process kills its cells, and one of them may have become the
        // session's next state process (a process with SIGKILL pending
        // runs no more of its code). Killed through the session's group,
        // which ends it while the session is frozen too.
        let spare = lock(&self.spare).take();
        drop(spare);
        self.session.kill(self.pidfd.as_fd());
        self.client.shutdown();
    }
}

/// A state process message's name, for what breaks the protocol.
fn state_op(msg: &StateMsg) -> &'static str {
    match msg {
        StateMsg::Run { .. } => "run",
        StateMsg::Clone { .. } => "clone",
        StateMsg::Prefork { .. } => "prefork",
        StateMsg::Ready { .. } => "ready",
        StateMsg::Spawned { .. } => "spawned",
        StateMsg::Error { .. } => "error",
        StateMsg::Ended { .. } => "ended",
    }
}

impl ForkingParent for StateProc {
    fn name(&self) -> &'static str {
        "the session's state process"
    }

    fn forget(&self, pid: i32) {
        self.client.forget(pid);
    }

    fn report_within(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn stalled(&self, _what: &str, _waited: Duration) {
        self.kill();
    }
}

/// The first packet on a new channel, which must be `ready {pid}`.
async fn await_ready(ours: OwnedFd) -> Result<(AsyncFd<OwnedFd>, i32), String> {
    let fd = process::watch_readable(ours)
        .map_err(|e| format!("failed to watch a state process channel: {e}"))?;
    match tokio::time::timeout(ANSWER_WITHIN, next_packet::<StateMsg>(&fd, 4096)).await {
        Ok(Some((StateMsg::Ready { pid }, fds))) if fds.is_empty() => Ok((fd, pid)),
        Ok(Some(_)) => Err("the state process sent something other than ready".into()),
        Ok(None) => Err("the state process exited before it was ready".into()),
        Err(_) => Err("the state process did not get ready in time".into()),
    }
}

/// The pid, in our namespace, of the session's process that is `ns_pid`
/// in the zygote's: looked for only in the session's cgroup (its own
/// directory, where its state processes and live cells are, then its
/// cells').
pub(crate) fn host_pid(session_pids: &Path, ns_pid: i32) -> Option<i32> {
    let want = ns_pid.to_string();
    if let Some(pid) = host_pid_in(session_pids, &want) {
        return Some(pid);
    }
    let entries = std::fs::read_dir(session_pids).ok()?;
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| host_pid_in(&e.path(), &want))
}

/// The process of the cgroup at `dir` whose innermost pid is `want`.
fn host_pid_in(dir: &Path, want: &str) -> Option<i32> {
    let procs = process::read_small(dir.join("cgroup.procs")).ok()?;
    // Newest first: the one asked for is most often the latest forked.
    for pid in procs
        .lines()
        .rev()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        let Ok(status) = process::read_small(format!("/proc/{pid}/status")) else {
            continue;
        };
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last());
        if inner == Some(want) {
            return Some(pid);
        }
    }
    None
}

/// What one cell of a live session carries through its launch and end.
#[derive(Default)]
pub(crate) struct LiveCell {
    /// The session's state process, if it has one.
    pub(crate) state: Mutex<Option<Arc<StateProc>>>,
    /// Set when the cell started a new state process (its start frame then
    /// seeds it with the session's JSON variables and definitions).
    pub(crate) fresh: AtomicBool,
    /// Set when the cell's process was forked from the state process.
    pub(crate) running: AtomicBool,
    /// Variables set from outside since the last cell (sent to a live
    /// namespace in the next cell's start frame).
    pub(crate) pending_vars: serde_json::Map<String, serde_json::Value>,
    /// Our end of the channel the cell's successor says `ready` on.
    pub(crate) next: Mutex<Option<OwnedFd>>,
    /// The cell's process, once launched.
    pub(crate) cell: Mutex<Option<CellProcess>>,
    /// The session's next state process, once the cell kept its namespace.
    pub(crate) kept: Mutex<Option<Arc<StateProc>>>,
    /// Why the cell did not run on the live namespace or could not keep
    /// it, for the result's notes.
    pub(crate) notes: Mutex<Vec<String>>,
    /// The session's checkpoints' processes, by pid in our namespace:
    /// spared when what the cell left in the session's group is killed.
    pub(crate) checkpoints: Vec<i32>,
}

impl std::fmt::Debug for LiveCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveCell").finish_non_exhaustive()
    }
}

impl LiveCell {
    pub(crate) fn note(&self, n: impl Into<String>) {
        lock(&self.notes).push(n.into());
    }

    /// After the cell's process is gone: kill everything else in the
    /// session's group (a live cell runs there, beside the state
    /// processes) but the session's state processes the supervisor knows
    /// (the one the cell was forked from, the one it left, the
    /// checkpoints), whoever their parent is: a child the cell attached to
    /// its state process (`clone(CLONE_PARENT)`) or one a state process
    /// forked is not spared. A cell of a live session has no process bound
    /// of its own: the session's holds. How many were killed.
    pub(crate) async fn end_others(&self, session: Option<Arc<SessionGroup>>) -> usize {
        let Some(session) = session else {
            return 0;
        };
        let mut keep = self.checkpoints.clone();
        for s in [lock(&self.state).clone(), lock(&self.kept).clone()]
            .into_iter()
            .flatten()
        {
            keep.push(s.host_pid());
        }
        let ended =
            tokio::task::spawn_blocking(move || session.end_others(&keep, TREE_END_WITHIN)).await;
        match ended {
            Ok(Ok(killed)) => killed.len(),
            Ok(Err(e)) => {
                tracing::warn!("a live cell's processes outlived it: {e}");
                0
            }
            Err(e) => {
                tracing::warn!("failed to end a live cell's processes: {e}");
                0
            }
        }
    }

    /// Whether the cell's process (`ns_pid`, in the zygote's namespace)
    /// became the session's next state process itself (see `_live_become`
    /// in zygote.py) rather than forking it: then it does not exit, and
    /// what it used is read from it (its CPU time is the cell's: it was
    /// forked for the cell, and a fork starts at zero).
    pub(crate) fn became(&self, ns_pid: i32) -> Option<Reaped> {
        let kept = lock(&self.kept).clone()?;
        if kept.ns_pid != ns_pid {
            return None;
        }
        let host = kept.host_pid();
        let cpu_ns = crate::sandbox::process::cpu_ns(host).unwrap_or(0);
        let max_rss_kb = crate::sandbox::process::peak_rss_kb(host).unwrap_or(0);
        Some(Reaped {
            code: Some(0),
            signal: None,
            cpu_ms: cpu_ns / 1_000_000,
            max_rss_kb,
        })
    }

    /// After a cell that succeeded: its successor.
    pub(crate) async fn take_over(&self, session: Option<&Arc<SessionGroup>>) {
        let next = lock(&self.next).take();
        let state = lock(&self.state).clone();
        let cell = lock(&self.cell).take();
        let (Some(next), Some(state), Some(session)) = (next, state, session) else {
            return;
        };
        match StateProc::adopt(next, state.zygote.clone(), state.rlimits, session, cell).await {
            Ok(s) => *lock(&self.kept) = Some(s),
            Err(e) => self.note(format!(
                "the cell's namespace could not be kept ({e}); the session's state is the one before it"
            )),
        }
    }
}

/// What a session's settling ([`settle`]) did.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// Processes of the session killed: neither its state processes nor
    /// the spare it asked for.
    pub(crate) killed: usize,
    /// Whether the session is frozen now.
    pub(crate) frozen: bool,
    /// Why no spare waits for the next cell, if none does.
    pub(crate) no_spare: Option<String>,
    /// What went wrong, if the session could not be settled.
    pub(crate) error: Option<String>,
}

/// Settle a live session between its cells: end the state process a cell
/// replaced (`retired`), ask the state process (`state`, if the session
/// has one) for its next cell's process ahead (its spare) unless
/// `cancel` comes first, then kill everything in the session's group but
/// `state`, its spare and the checkpoints (`keep`), and freeze the group:
/// until its next cell thaws it, none of the session's processes runs,
/// whatever its code arranged (a state process's loop replaced, a child
/// attached to it). The freeze comes once the spare has warmed up (a
/// spare frozen while warming would do the rest on its cell's way); the
/// time until then is bounded ([`SPARE_WITHIN`]). A cell that comes sooner
/// cancels the wait for the spare; the session is then not frozen, and
/// that cell's end kills what else is there.
pub(crate) async fn settle(
    session: Arc<SessionGroup>,
    state: Option<Arc<StateProc>>,
    keep: Vec<i32>,
    retired: Retired,
    cancel: tokio_util::sync::CancellationToken,
) -> Settled {
    let mut out = Settled::default();
    tokio::select! {
        biased;
        _ = cancel.cancelled() => return out,
        _ = tokio::time::sleep(SETTLE_AFTER) => {}
    }
    if let Some(r) = retired.take() {
        r.end().await;
    }
    let mut keep = keep;
    if let Some(s) = state.as_ref().filter(|s| !s.is_dead()) {
        let spared = tokio::select! {
            biased;
            _ = cancel.cancelled() => return out,
            r = s.prefork() => r,
        };
        out.no_spare = spared.err();
        keep.push(s.host_pid());
        keep.extend(s.spare_pid());
    }
    let frozen = session.can_freeze();
    let ended = tokio::task::spawn_blocking(move || {
        session.settle(&keep, TREE_END_WITHIN).map(|k| k.len())
    })
    .await;
    match ended {
        Ok(Ok(killed)) => {
            out.killed = killed;
            out.frozen = frozen;
        }
        Ok(Err(e)) => out.error = Some(e.to_string()),
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory standing in for a session's pids cgroup, listing `pids`.
    fn group_of(pids: &[u32]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let list: String = pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(dir.path().join("cgroup.procs"), list).expect("write");
        dir
    }

    #[test]
    fn a_pid_is_found_only_among_the_sessions_processes() {
        let me = std::process::id();
        let ns_me = i32::try_from(me).expect("pid");
        // Ours is the innermost pid here: this test runs in no namespace of
        // its own.
        let ours = group_of(&[1, me]);
        assert_eq!(host_pid(ours.path(), ns_me), Some(ns_me));
        // In a cell's group beneath the session's.
        let nested = group_of(&[]);
        let cell = nested.path().join("cell-1");
        std::fs::create_dir(&cell).expect("mkdir");
        std::fs::write(cell.join("cgroup.procs"), format!("{me}\n")).expect("write");
        assert_eq!(host_pid(nested.path(), ns_me), Some(ns_me));
        // Not listed: not the session's, whatever it is.
        let other = group_of(&[1]);
        assert_eq!(host_pid(other.path(), ns_me), None);
        assert_eq!(host_pid(Path::new("/nonexistent/cellbox"), ns_me), None);
    }

    /// A session group of a supervisor's groups made for the test, and a
    /// `sleep` that joined it (as a state process's spare is in it).
    fn session_with_a_process() -> (
        crate::sandbox::linux::cgroup::CellCgroup,
        Arc<groups::Groups>,
        Arc<SessionGroup>,
        std::process::Child,
    ) {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it makes cgroups"
        );
        let cells = crate::sandbox::linux::cgroup::CellCgroup::create(256 << 20).expect("cgroup");
        let exe = std::env::current_exe().expect("exe");
        let g = Arc::new(groups::Groups::new(cells.path(), &exe).expect("groups"));
        let session = Arc::new(g.session(64 << 20, 8).expect("session group"));
        let fds = session.join_fds().expect("join fds");
        let child = crate::sandbox::testing::sleeper_joining(&fds);
        (cells, g, session, child)
    }

    #[test]
    fn a_spare_is_taken_only_with_one_channel_and_a_pid_of_the_session() {
        let _serial = crate::util::lock(&crate::sandbox::linux::cgroup::TEST_LOCK);
        let (cells, g, session, mut child) = session_with_a_process();
        // Ours is the innermost pid here: this test runs in no namespace of
        // its own.
        let pid = i32::try_from(child.id()).expect("pid");
        let channel = || {
            let (a, b) = crate::sandbox::forkserver::seqpacket_pair().expect("pair");
            (a, b)
        };
        let (ours_end, theirs) = channel();
        let spare = Spare::found(&session, pid, vec![ours_end]).expect("a spare");
        assert_eq!((spare.ns_pid, spare.host), (pid, pid));
        assert!(!spare.gone());
        // The channel it keeps is the one it was given.
        crate::sandbox::packet::send(spare.channel.as_fd(), &Rlimits::default(), &[])
            .expect("send");
        let (got, fds) = crate::sandbox::packet::recv::<Rlimits>(theirs.as_fd(), 4096)
            .expect("recv")
            .expect("a packet");
        assert_eq!(got, Rlimits::default());
        assert!(fds.is_empty());
        // No channel, two, or a pid that is not the session's: nothing is
        // kept, and the channel given is closed (the spare exits).
        assert!(Spare::found(&session, pid, vec![]).is_none());
        let (a, _a) = channel();
        let (b, _b) = channel();
        assert!(Spare::found(&session, pid, vec![a, b]).is_none());
        let (c, their_c) = channel();
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(Spare::found(&session, me, vec![c]).is_none());
        let closed = crate::sandbox::packet::recv::<Rlimits>(their_c.as_fd(), 4096).expect("recv");
        assert!(
            closed.is_none(),
            "the channel of a spare not taken is closed"
        );
        // Dropped unused, it is killed (through the pidfd checked to be
        // the session's).
        drop(spare);
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        drop((session, g, cells));
    }
}
