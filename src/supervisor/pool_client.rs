//! The supervisor's client of a pool control channel (the Rhai fork
//! server's, a Python zygote's; see `crate::protocol::pool`): send a
//! request with an id and await the answer for that id with its fds, match
//! each child's end with whoever asks for it, and fail every waiter once
//! the channel closes or carries something that is not a message.

use super::warm::ExitTable;
use crate::protocol::pool::{PoolMessage, PoolReply};
use crate::sandbox::process::Reaped;
use crate::util::lock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A child a pool parent forked for a request, with the fds that came with
/// the answer (the pidfd first).
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) pid: i32,
    pub(crate) fds: Vec<OwnedFd>,
}

/// The parent answered a request with `error {id, message}`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refused(pub(crate) String);

/// The answer to one request; the receiver fails when the channel closed
/// before it came.
pub(crate) type Answer = oneshot::Receiver<Result<Spawned, Refused>>;

#[derive(Default)]
struct State {
    /// Requests waiting for an answer, and when each was sent.
    pending: HashMap<u64, (Instant, oneshot::Sender<Result<Spawned, Refused>>)>,
    exits: ExitTable,
    /// When the oldest request still unanswered was sent, once its asker
    /// gave up waiting; cleared by any answer.
    unanswered: Option<Instant>,
}

/// Whose channel it is, which decides what a descriptor it sends is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parent {
    /// A pool process (the fork server, a zygote): it runs no cell's code,
    /// and the first fd of its `spawned` is its new child's pidfd; a child
    /// nobody waits for any more is killed through it.
    Pool,
    /// A live session's state process: it has run the session's code, so
    /// nothing it sends is acted on unasked. An answer to a request never
    /// made breaks the protocol (the channel is closed, the reason kept:
    /// see [`PoolClient::violation`]); the fds of an answer nobody waits
    /// for any more are closed unused, never signalled through.
    Untrusted,
}

/// One control channel to a pool parent.
pub(crate) struct PoolClient {
    ctl: Mutex<OwnedFd>,
    state: Mutex<State>,
    closed: AtomicBool,
    next_id: AtomicU64,
    /// How a child ended when its parent is gone before reporting it
    /// (`None`: nobody is answered).
    lost: Option<Reaped>,
    parent: Parent,
    /// Why the channel was closed on a message that broke the protocol.
    violation: Mutex<Option<String>>,
}

impl PoolClient {
    pub(crate) fn new(ctl: OwnedFd, lost: Option<Reaped>) -> PoolClient {
        Self::of(ctl, lost, Parent::Pool)
    }

    /// A client of a channel whose other end is `parent`'s.
    pub(crate) fn of(ctl: OwnedFd, lost: Option<Reaped>, parent: Parent) -> PoolClient {
        PoolClient {
            ctl: Mutex::new(ctl),
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            lost,
            parent,
            violation: Mutex::new(None),
        }
    }

    /// Why the channel was closed on a message that broke the protocol,
    /// if it was.
    pub(crate) fn violation(&self) -> Option<String> {
        lock(&self.violation).clone()
    }

    /// Close the channel because the other end broke the protocol.
    pub(crate) fn refuse(&self, why: String) {
        lock(&self.violation).get_or_insert(why);
        self.shutdown();
    }

    /// A second fd of the channel, for the reading task.
    pub(crate) fn reader_fd(&self) -> std::io::Result<OwnedFd> {
        lock(&self.ctl).try_clone()
    }

    /// Whether the channel closed (the reading task ended).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Send a message that asks for no answer.
    pub(crate) fn send<M: Serialize>(
        &self,
        msg: &M,
        fds: &[BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let ctl = lock(&self.ctl);
        crate::sandbox::packet::send(ctl.as_fd(), msg, fds)
    }

    /// Send the request `make(id)` with `fds` attached and return its id
    /// and the answer to await. A failed send leaves nothing pending.
    pub(crate) fn request<M: Serialize>(
        &self,
        make: impl FnOnce(u64) -> M,
        fds: &[BorrowedFd<'_>],
    ) -> std::io::Result<(u64, Answer)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.state).pending.insert(id, (Instant::now(), tx));
        if let Err(e) = self.send(&make(id), fds) {
            lock(&self.state).pending.remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    /// The asker of `id` stopped waiting; `unanswered`: remember when it
    /// was asked (see [`Self::overdue`]).
    pub(crate) fn give_up(&self, id: u64, unanswered: Option<Instant>) {
        let mut s = lock(&self.state);
        s.pending.remove(&id);
        if let Some(asked) = unanswered {
            s.unanswered.get_or_insert(asked);
        }
    }

    /// Whether some request has waited for its answer `within` or longer
    /// (counting those given up on and still unanswered).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // the zygotes' (Linux)
    pub(crate) fn waiting_since(&self, within: Duration) -> bool {
        let s = lock(&self.state);
        let slow = |t: &Instant| t.elapsed() >= within;
        s.pending.values().any(|(t, _)| slow(t)) || s.unanswered.as_ref().is_some_and(slow)
    }

    /// Whether a request given up on is unanswered `within` or longer.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // the zygotes' (Linux)
    pub(crate) fn overdue(&self, within: Duration) -> bool {
        lock(&self.state)
            .unanswered
            .is_some_and(|t| t.elapsed() >= within)
    }

    /// How child `pid` ended, once reported (at once with the lost end
    /// when the channel is closed).
    pub(crate) fn exit_of(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        let lost = if self.is_closed() { self.lost } else { None };
        lock(&self.state).exits.ask(pid, lost)
    }

    /// Whether `pid`'s end was reported and not yet asked for.
    pub(crate) fn exit_arrived(&self, pid: i32) -> bool {
        lock(&self.state).exits.arrived(pid)
    }

    /// Forget a child whose end will not be asked for.
    pub(crate) fn forget(&self, pid: i32) {
        lock(&self.state).exits.forget(pid);
    }

    /// Shut the channel down both ways (the parent sees EOF; the reading
    /// task sees the channel close): it counts as closed from now on.
    /// Whether it was open until now.
    pub(crate) fn shutdown(&self) -> bool {
        let was_open = !self.closed.swap(true, Ordering::SeqCst);
        let ctl = lock(&self.ctl);
        let _ = nix::sys::socket::shutdown(ctl.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        was_open
    }

    /// The channel is closed: every waiting request fails, every waiting
    /// end is answered with the lost one (or dropped).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut s = lock(&self.state);
        s.pending.clear();
        s.exits.close(self.lost);
    }

    /// Take one message: answers go to their askers, ends to the exit
    /// table, anything else to `other` (which says whether the channel is
    /// still good). An answer nobody waits for any more is a child that
    /// must not run: it is killed through its pidfd.
    fn dispatch<M: PoolMessage>(
        &self,
        msg: M,
        fds: Vec<OwnedFd>,
        other: &mut impl FnMut(M, Vec<OwnedFd>) -> bool,
    ) -> bool {
        let answer = |s: &mut State, id: u64| {
            s.unanswered = None;
            s.pending.remove(&id).map(|(_, tx)| tx)
        };
        match msg.sort() {
            PoolReply::Spawned { id, pid } => {
                let asked = id > 0 && id < self.next_id.load(Ordering::Relaxed);
                if self.parent == Parent::Untrusted && !asked {
                    // Its fds are closed here, unused.
                    drop(fds);
                    lock(&self.violation)
                        .get_or_insert(format!("it answered request {id}, which was never made"));
                    return false;
                }
                let tx = {
                    let mut s = lock(&self.state);
                    s.exits.born(pid);
                    answer(&mut s, id)
                };
                let reply = Ok(Spawned { pid, fds });
                let unclaimed = match tx {
                    Some(tx) => tx.send(reply).err(),
                    None => Some(reply),
                };
                if let (Some(Ok(s)), Parent::Pool) = (unclaimed, self.parent) {
                    if let Some(pidfd) = s.fds.first() {
                        let _ = crate::sandbox::process::pidfd_kill(pidfd.as_fd());
                    }
                }
                true
            }
            PoolReply::Error { id, message } => {
                if let Some(tx) = answer(&mut lock(&self.state), id) {
                    let _ = tx.send(Err(Refused(message)));
                }
                true
            }
            PoolReply::Exited(r) => {
                lock(&self.state).exits.record(r.pid, r.reaped);
                true
            }
            PoolReply::Other(m) => other(m, fds),
        }
    }

    /// Read the channel until it closes, carries a malformed packet, or
    /// `other` refuses a message; then [`Self::close`].
    pub(crate) async fn read<M: PoolMessage + DeserializeOwned>(
        &self,
        fd: &tokio::io::unix::AsyncFd<OwnedFd>,
        max: usize,
        mut other: impl FnMut(M, Vec<OwnedFd>) -> bool,
    ) {
        while let Some((msg, fds)) = next_packet::<M>(fd, max).await {
            if !self.dispatch(msg, fds, &mut other) {
                break;
            }
        }
        self.close();
    }
}

/// The next control packet from a pool parent on a channel watched by the
/// runtime. `None`: the channel closed or carried something that is not a
/// message.
pub(crate) async fn next_packet<T: DeserializeOwned>(
    fd: &tokio::io::unix::AsyncFd<OwnedFd>,
    max: usize,
) -> Option<(T, Vec<OwnedFd>)> {
    loop {
        let mut ready = fd.readable().await.ok()?;
        match ready.try_io(|fd| crate::sandbox::packet::try_recv(fd.get_ref().as_fd(), max)) {
            Ok(Ok(msg)) => return msg,
            Ok(Err(_)) => return None,
            // Nothing waiting after all.
            Err(_) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pool::ZygoteMsg;
    use crate::sandbox::packet;
    use std::sync::Arc;

    /// A client on one end of a channel, its reading task running, and the
    /// other end for the test to play the pool parent on.
    fn connected(
        lost: Option<Reaped>,
    ) -> (
        Arc<PoolClient>,
        OwnedFd,
        tokio::task::JoinHandle<Vec<ZygoteMsg>>,
    ) {
        connected_to(lost, Parent::Pool)
    }

    fn connected_to(
        lost: Option<Reaped>,
        parent: Parent,
    ) -> (
        Arc<PoolClient>,
        OwnedFd,
        tokio::task::JoinHandle<Vec<ZygoteMsg>>,
    ) {
        let (ours, theirs) = crate::sandbox::compat::seqpacket_pair().unwrap();
        let client = Arc::new(PoolClient::of(ours, lost, parent));
        let fd = crate::sandbox::process::watch_readable(client.reader_fd().unwrap()).unwrap();
        let reader = client.clone();
        let task = tokio::spawn(async move {
            let mut others = Vec::new();
            reader
                .read::<ZygoteMsg>(&fd, 4096, |m, _| {
                    let go_on = !matches!(m, ZygoteMsg::SandboxError { .. });
                    others.push(m);
                    go_on
                })
                .await;
            others
        });
        (client, theirs, task)
    }

    fn raw(fd: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        packet::send(fd.as_fd(), &v, fds).unwrap();
    }

    /// The parent's side, on a thread of its own: read one request.
    fn serve_one(theirs: OwnedFd) -> std::thread::JoinHandle<(OwnedFd, ZygoteMsg, usize)> {
        std::thread::spawn(move || {
            let (msg, fds) = packet::recv::<ZygoteMsg>(theirs.as_fd(), 4096)
                .unwrap()
                .unwrap();
            (theirs, msg, fds.len())
        })
    }

    #[tokio::test]
    async fn each_answer_goes_to_the_request_with_its_id_and_fds() {
        let (client, theirs, task) = connected(None);
        let (a, rx_a) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        let (theirs, first, _) = serve_one(theirs).join().unwrap();
        assert_eq!(
            first,
            ZygoteMsg::Spawn {
                id: a,
                state: false
            }
        );
        let (b, rx_b) = client
            .request(|id| ZygoteMsg::Spawn { id, state: true }, &[])
            .unwrap();
        let (theirs, second, _) = serve_one(theirs).join().unwrap();
        assert_eq!(second, ZygoteMsg::Spawn { id: b, state: true });
        assert_ne!(a, b);
        // Answered out of order: the second first, with two fds.
        let (p1, p2) = nix::unistd::pipe().unwrap();
        raw(
            &theirs,
            format!(r#"{{"op":"spawned","id":{b},"pid":41}}"#).as_bytes(),
            &[p1.as_fd(), p2.as_fd()],
        );
        raw(
            &theirs,
            format!(r#"{{"op":"error","id":{a},"message":"no fork"}}"#).as_bytes(),
            &[],
        );
        let got_b = rx_b.await.unwrap().unwrap();
        assert_eq!((got_b.pid, got_b.fds.len()), (41, 2));
        let got_a = rx_a.await.unwrap().unwrap_err();
        assert_eq!(got_a.to_string(), "no fork");
        drop(theirs);
        assert!(task.await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_end_reaches_whoever_asks_before_or_after_it_came() {
        let (client, theirs, task) = connected(None);
        let early = client.exit_of(7);
        // 8's end first: once 7's is answered, 8's has arrived too.
        raw(
            &theirs,
            br#"{"op":"ended","pid":8,"status":9,"utime":[0,0],"stime":[0,0],"max_rss_kb":5}"#,
            &[],
        );
        raw(
            &theirs,
            br#"{"op":"ended","pid":7,"status":0,"utime":[0,2000],"stime":[0,0],"max_rss_kb":5}"#,
            &[],
        );
        raw(&theirs, br#"{"op":"spawn","id":1}"#, &[]);
        let r = early.await.unwrap();
        assert_eq!(
            (r.code, r.signal, r.cpu_ms, r.max_rss_kb),
            (Some(0), None, 2, 5)
        );
        assert!(client.exit_arrived(8));
        let late = client.exit_of(8).await.unwrap();
        assert_eq!((late.code, late.signal), (None, Some(9)));
        assert!(!client.exit_arrived(8), "an end is answered once");
        drop(theirs);
        // The message outside the envelope went to the pool's own handler.
        let others = task.await.unwrap();
        assert_eq!(
            others,
            [ZygoteMsg::Spawn {
                id: 1,
                state: false
            }]
        );
    }

    #[tokio::test]
    async fn an_unclaimed_end_is_not_taken_for_a_new_child_with_its_pid() {
        let (client, theirs, task) = connected(None);
        // An earlier child 5 ended and nobody asked (a spare that never had
        // a cell).
        raw(
            &theirs,
            br#"{"op":"ended","pid":5,"status":9,"utime":[0,0],"stime":[0,0],"max_rss_kb":1}"#,
            &[],
        );
        // A new child gets pid 5, said as the answer to a request.
        let (id, answer) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        let spawned = format!(r#"{{"op":"spawned","id":{id},"pid":5}}"#);
        raw(&theirs, spawned.as_bytes(), &[]);
        assert_eq!(answer.await.unwrap().unwrap().pid, 5);
        assert!(!client.exit_arrived(5), "the earlier end was dropped");
        // The new child's own end is its.
        let end = client.exit_of(5);
        raw(
            &theirs,
            br#"{"op":"ended","pid":5,"status":0,"utime":[0,1000],"stime":[0,0],"max_rss_kb":3}"#,
            &[],
        );
        let r = end.await.unwrap();
        assert_eq!((r.code, r.cpu_ms, r.max_rss_kb), (Some(0), 1, 3));
        drop(theirs);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_closed_channel_fails_every_waiter() {
        let lost = Reaped {
            code: None,
            signal: Some(libc::SIGKILL),
            cpu_ms: 0,
            max_rss_kb: 0,
        };
        let (client, theirs, task) = connected(Some(lost));
        let (_, rx) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        let end = client.exit_of(3);
        drop(theirs);
        task.await.unwrap();
        assert!(client.is_closed());
        assert!(rx.await.is_err());
        assert_eq!(end.await.unwrap(), lost);
        // Asked after the close: answered at once.
        assert_eq!(client.exit_of(4).await.unwrap(), lost);
        // And a request cannot be sent any more.
        assert!(client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .is_err());
    }

    #[tokio::test]
    async fn a_malformed_message_closes_the_channel_and_is_no_panic() {
        for bad in [
            &br#"{"op":"spawned","id":"x","pid":1}"#[..],
            br#"{"op":"bogus"}"#,
            br#"not json"#,
        ] {
            let (client, theirs, task) = connected(None);
            let (_, rx) = client
                .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
                .unwrap();
            let _ = packet::recv::<ZygoteMsg>(theirs.as_fd(), 4096).unwrap();
            nix::sys::socket::send(theirs.as_raw_fd(), bad, nix::sys::socket::MsgFlags::empty())
                .unwrap();
            assert!(task.await.unwrap().is_empty());
            assert!(client.is_closed(), "{bad:?}");
            assert!(rx.await.is_err());
        }
    }

    #[tokio::test]
    async fn a_message_the_pool_refuses_closes_the_channel() {
        let (client, theirs, task) = connected(None);
        let (_, rx) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        raw(
            &theirs,
            br#"{"op":"sandbox_error","layer":"l","message":"m"}"#,
            &[],
        );
        let others = task.await.unwrap();
        assert!(matches!(
            others.as_slice(),
            [ZygoteMsg::SandboxError { .. }]
        ));
        assert!(client.is_closed());
        assert!(rx.await.is_err());
    }

    /// What a state process (untrusted) sends is never acted on unasked:
    /// an answer to a request never made, carrying a pidfd, closes the
    /// channel with the reason kept, and the process behind the pidfd is
    /// not signalled (a pool parent's unclaimed child would be: see
    /// `an_answer_nobody_waits_for_kills_its_child`, the same message on a
    /// pool's channel). A late answer to a request given up on is closed
    /// unused too, without breaking the protocol.
    #[tokio::test]
    async fn an_untrusted_parent_is_never_acted_on_unasked() {
        let sleeper = || {
            let child = std::process::Command::new("/bin/sleep")
                .arg("60")
                .spawn()
                .unwrap();
            let pidfd = crate::sandbox::process::pidfd_open(child.id() as i32).unwrap();
            (child, pidfd)
        };
        let (client, theirs, task) = connected_to(None, Parent::Untrusted);
        // Asked, given up on, then answered: closed unused.
        let (id, rx) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        client.give_up(id, None);
        drop(rx);
        let (mut late, late_fd) = sleeper();
        raw(
            &theirs,
            format!(r#"{{"op":"spawned","id":{id},"pid":{}}}"#, late.id()).as_bytes(),
            &[late_fd.as_fd()],
        );
        // Never asked: the channel closes.
        let (mut victim, victim_fd) = sleeper();
        raw(
            &theirs,
            format!(r#"{{"op":"spawned","id":4242,"pid":{}}}"#, victim.id()).as_bytes(),
            &[victim_fd.as_fd()],
        );
        task.await.unwrap();
        assert!(client.is_closed());
        let why = client.violation().expect("a violation");
        assert!(why.contains("4242"), "{why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (child, what) in [(&mut late, "late"), (&mut victim, "unasked")] {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the {what} answer's process was signalled"
            );
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[tokio::test]
    async fn an_answer_nobody_waits_for_kills_its_child() {
        let (client, theirs, task) = connected(None);
        let (id, rx) = client
            .request(|id| ZygoteMsg::Spawn { id, state: false }, &[])
            .unwrap();
        client.give_up(id, Some(Instant::now()));
        drop(rx);
        assert!(client.overdue(Duration::ZERO));
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pidfd = crate::sandbox::process::pidfd_open(child.id() as i32).unwrap();
        raw(
            &theirs,
            format!(r#"{{"op":"spawned","id":{id},"pid":{}}}"#, child.id()).as_bytes(),
            &[pidfd.as_fd()],
        );
        // The kill comes before the wait can end.
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(!client.overdue(Duration::ZERO), "any answer clears it");
        drop(theirs);
        task.await.unwrap();
    }
}
