//! The Rhai fork server: a single-threaded process, started once by
//! re-exec, that forks one child per cell. Forking a small, already
//! initialized process is far cheaper than exec'ing the binary per cell, and
//! the multi-threaded supervisor itself is never forked.
//!
//! Each child is made whole by the server: it creates the cell's protocol
//! socket pair and output pipes, forks, and the child applies its per-cell
//! layers at once and reports `ready` on its protocol socket, then waits for
//! `start`. So the server can keep **spares**: children already sandboxed
//! with the default limits, handed to the supervisor before anyone asks, and
//! a cell only has to take one and send `start`.
//!
//! Control channel (a `SOCK_SEQPACKET` pair, one message per packet, JSON):
//! - supervisor → server: `init` (the pool plan, the number of spares to
//!   keep), then `spawn {id, limits, ahead}` (a child with these limits,
//!   now; `ahead`: for a cell whose code comes later, so it waits under the
//!   spares' name) or `refill` (a spare was taken: make another);
//! - server → supervisor: `spare {pid, limits}` or `spawned {id, pid}`, each
//!   with four fds attached: the child's pidfd, the supervisor's end of its
//!   protocol socket, and the read ends of its stdout and stderr pipes; or
//!   `error {id, message}`;
//! - server → supervisor: `exited {pid, code, signal, cpu_ms, max_rss_kb}`
//!   once a child is gone. Before reaping a child the server SIGKILLs its
//!   whole process group, so nothing a cell started in its group outlives
//!   it, and a pid is never reused while the supervisor may still signal it
//!   (the supervisor signals through the pidfd, which cannot hit a reused
//!   pid).
// The server side (signalfd, subreaper) is Linux-only.
#![cfg_attr(not(target_os = "linux"), allow(dead_code, unused_imports))]

use super::process::{reap, Reaped};
use nix::sys::signal::{SigSet, Signal};
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Largest control message.
pub const MAX_CONTROL_BYTES: usize = super::packet::MAX_PACKET_BYTES;

pub use crate::protocol::pool::Control;

/// A connected pair of `SOCK_SEQPACKET` sockets (close-on-exec).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    super::compat::seqpacket_pair()
}

/// Send one message with `fds` attached.
pub fn send(fd: BorrowedFd<'_>, msg: &Control, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    super::packet::send(fd, msg, fds)
}

/// Receive one message and the fds attached to it. `Ok(None)` = the peer
/// closed the channel.
pub fn recv(fd: BorrowedFd<'_>) -> io::Result<Option<(Control, Vec<OwnedFd>)>> {
    super::packet::recv(fd, MAX_CONTROL_BYTES)
}

fn exited_message(pid: i32, r: Reaped) -> Control {
    Control::Exited {
        pid,
        code: r.code,
        signal: r.signal,
        cpu_ms: r.cpu_ms,
        max_rss_kb: r.max_rss_kb,
    }
}

/// In the forked child: put the cell's fds on 1, 2, 3, stdin on /dev/null,
/// close everything else, own session, die with the server.
fn child_setup(sock: &OwnedFd, out: &OwnedFd, err: &OwnedFd) -> io::Result<()> {
    let devnull = std::fs::File::open("/dev/null")?;
    for (from, to) in [
        (devnull.as_raw_fd(), 0),
        (out.as_raw_fd(), 1),
        (err.as_raw_fd(), 2),
        (sock.as_raw_fd(), crate::sandbox::PROTOCOL_FD),
    ] {
        // SAFETY: dup2 on fds we own; the target numbers are the fixed
        // worker layout. dup2 clears close-on-exec on the target.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // Closed by its owner before close_range, so nothing owns an fd that
    // close_range closes: a second close of it would be an IO-safety
    // violation (debug builds abort on it).
    drop(devnull);
    // SAFETY: close_range closes every fd from 4 up; nothing above 3 is
    // needed by the cell. The objects that own the fds above 3 (the
    // caller's `sock`, `out`, `err` and the fork server's own) are never
    // dropped in this process: the child ends in `_exit`.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32)
    };
    // SAFETY: setsid/prctl take no pointers.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    #[cfg(target_os = "linux")]
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The process name (`comm`) of a spare while it waits; a worker renames
/// itself [`CELL_NAME`] once it has its cell, so `ps` tells them apart.
pub const SPARE_NAME: &CStr = c"cellbox-spare";
/// The process name of a worker running a cell.
pub const CELL_NAME: &CStr = c"cellbox-cell";

/// What a forked child runs: its protocol channel, its limits and whether
/// it waits for its cell (a spare, or a child made ahead: it has time to
/// warm up before its `start` comes) in, its exit code out.
pub type RunCell = fn(UnixStream, &crate::plan::Rlimits, bool) -> i32;

/// The fork server is Linux's (signalfd, subreaper): elsewhere it refuses
/// to run, and cells start fresh under sandbox-exec.
#[cfg(not(target_os = "linux"))]
pub fn serve(
    _ctl: OwnedFd,
    _run_cell: RunCell,
    _default_limits: crate::plan::Rlimits,
    _spares: usize,
) -> i32 {
    7
}

/// The fork server's main loop. `ctl` is the control channel; `run_cell` is
/// what a forked child runs; `spares` children with `default_limits` are
/// kept ready. Returns when the supervisor closes the channel.
#[cfg(target_os = "linux")]
pub fn serve(
    ctl: OwnedFd,
    run_cell: RunCell,
    default_limits: crate::plan::Rlimits,
    spares: usize,
) -> i32 {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if mask.thread_block().is_err() {
        return 7;
    }
    let sigfd = match nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    ) {
        Ok(s) => s,
        Err(_) => return 7,
    };
    // Orphans of cells (daemons) are re-parented to us, so we reap them.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut server = Server {
        ctl,
        mask,
        run_cell,
        cells: BTreeSet::new(),
    };
    for _ in 0..spares {
        server.spare(&default_limits);
    }
    loop {
        let mut fds = [
            nix::poll::PollFd::new(server.ctl.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(sigfd.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 7,
        }
        let ctl_ready = fds[0].any().unwrap_or(false);
        let sig_ready = fds[1].any().unwrap_or(false);
        if sig_ready {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            reap_exited(&server.ctl, &mut server.cells);
        }
        if ctl_ready {
            match recv(server.ctl.as_fd()) {
                // The fds attached to a spawn, if any, are the `tasks` files
                // of the cgroups the child joins.
                Ok(Some((Control::Spawn { id, limits, ahead }, join))) => {
                    let name = if ahead { SPARE_NAME } else { CELL_NAME };
                    let sent = match server.fork_cell(&limits, name, &join) {
                        Ok(child) => {
                            child.send(&server.ctl, &Control::Spawned { id, pid: child.pid })
                        }
                        Err(e) => {
                            let message = e.to_string();
                            send(server.ctl.as_fd(), &Control::Error { id, message }, &[])
                        }
                    };
                    if sent.is_err() {
                        return server.shut_down();
                    }
                }
                Ok(Some((Control::Refill, _))) => server.spare(&default_limits),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return server.shut_down(),
            }
        }
    }
}

/// Why the fork server could not fork a child (its `error` message).
#[derive(Debug, thiserror::Error)]
enum ForkError {
    #[error("failed to create a protocol socket pair: {0}")]
    SocketPair(#[source] io::Error),
    #[error("failed to create an output pipe: {0}")]
    Pipe(#[source] io::Error),
    #[error("{0}")]
    Pidfd(#[source] io::Error),
    #[error("fork failed: {0}")]
    Fork(#[source] nix::errno::Errno),
}

struct Server {
    ctl: OwnedFd,
    mask: SigSet,
    run_cell: RunCell,
    /// Every unreaped child (cells and spares).
    cells: BTreeSet<i32>,
}

/// A forked child and the supervisor's ends of its channels.
struct Child {
    pid: i32,
    pidfd: OwnedFd,
    sock: OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
}

impl Child {
    fn send(&self, ctl: &OwnedFd, msg: &Control) -> io::Result<()> {
        send(
            ctl.as_fd(),
            msg,
            &[
                self.pidfd.as_fd(),
                self.sock.as_fd(),
                self.out.as_fd(),
                self.err.as_fd(),
            ],
        )
    }
}

impl Server {
    /// Make a spare and hand it over. A spare that cannot be made is not an
    /// error here: the next cell asks with `spawn` and learns why.
    fn spare(&mut self, limits: &crate::plan::Rlimits) {
        if let Ok(child) = self.fork_cell(limits, SPARE_NAME, &[]) {
            let msg = Control::Spare {
                pid: child.pid,
                limits: *limits,
            };
            let _ = child.send(&self.ctl, &msg);
        }
    }

    /// The supervisor is gone: take every child with us.
    fn shut_down(&self) -> i32 {
        for pid in &self.cells {
            // SAFETY: killpg with integer args; pids are our unreaped
            // children, so their groups are theirs.
            unsafe { libc::killpg(*pid, libc::SIGKILL) };
        }
        0
    }

    /// Fork a child. It first joins the cgroups whose `tasks` files are
    /// open on `join` (a thread moving itself, which the kernel does
    /// without the global lock that moving another process by its pid
    /// takes); one that cannot exits before it runs anything.
    fn fork_cell(
        &mut self,
        limits: &crate::plan::Rlimits,
        name: &CStr,
        join: &[OwnedFd],
    ) -> Result<Child, ForkError> {
        let (sock, theirs) = UnixStream::pair().map_err(ForkError::SocketPair)?;
        let pipe = || super::compat::pipe_cloexec().map_err(ForkError::Pipe);
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let theirs = OwnedFd::from(theirs);
        // SAFETY: this process is single-threaded (the fork server never
        // starts threads), so the child may run arbitrary code after fork.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                let _ = self.mask.thread_unblock();
                #[cfg(target_os = "linux")]
                for fd in join {
                    if super::linux::cgroup::join_fd(fd.as_raw_fd()).is_err() {
                        // SAFETY: as below: end the child at once.
                        unsafe { libc::_exit(crate::exit::Exit::Sandbox.code().into()) }
                    }
                }
                #[cfg(not(target_os = "linux"))]
                let _ = join;
                super::compat::set_name(name);
                let run_cell = self.run_cell;
                // A panic must not unwind out of here: it would drop the
                // objects that own fds close_range closed (a second close,
                // which debug builds abort on) and go on running the fork
                // server's loop in the cell's process.
                let code =
                    std::panic::catch_unwind(|| match child_setup(&theirs, &out_w, &err_w) {
                        Ok(()) => match super::spawn::take_protocol_channel() {
                            Ok(stream) => run_cell(stream, limits, name == SPARE_NAME),
                            Err(_) => 7,
                        },
                        Err(_) => 7,
                    })
                    .unwrap_or(crate::exit::Exit::Internal.raw());
                use std::io::Write;
                let _ = std::io::stdout().flush();
                // SAFETY: _exit ends the child without running the parent's
                // atexit handlers or destructors a second time (the fds the
                // Rust objects above own were closed by close_range).
                unsafe { libc::_exit(code) }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                drop((theirs, out_w, err_w));
                let pid = child.as_raw();
                self.cells.insert(pid);
                let pidfd = super::process::pidfd_open(pid).map_err(ForkError::Pidfd)?;
                Ok(Child {
                    pid,
                    pidfd,
                    sock: OwnedFd::from(sock),
                    out: out_r,
                    err: err_r,
                })
            }
            Err(e) => Err(ForkError::Fork(e)),
        }
    }
}

/// Reap every exited child; cells are reported after their group is killed.
fn reap_exited(ctl: &OwnedFd, cells: &mut BTreeSet<i32>) {
    loop {
        // SAFETY: zeroed siginfo_t is a valid out-buffer for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child
        // unreaped so its pid and group id stay ours while we kill the group.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is valid to read for the SIGCHLD-type info waitid fills.
        let pid = unsafe { info.si_pid() };
        if rc < 0 || pid == 0 {
            return;
        }
        if cells.remove(&pid) {
            // SAFETY: killpg with integer args on the group of an unreaped child.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
            if let Ok(r) = reap(pid) {
                let _ = send(ctl.as_fd(), &exited_message(pid, r), &[]);
            }
        } else {
            let _ = reap(pid);
        }
    }
}
