//! A one-shot cell: the calling process (the CLI, still single-threaded,
//! before any runtime exists) clones the cell straight into its namespaces
//! and stays on the host side as its supervisor. No worker binary is
//! executed and no setup frame is sent: the child has the plan in memory.
//!
//! ```text
//!  caller (host, supervises)  ──clone(CLONE_NEW*)──▶  cell (PID 1)
//!   writes the uid/gid maps, "go" on fd 3             waits for "go"
//!   reads the report from fd 3 (EOF at exec)          hygiene, new root,
//!   pumps stdout/stderr, deadline on a pidfd          rlimits, ids, Landlock,
//!   kills the group, reaps with rusage                seccomp; report on fd 3;
//!                                                     execve the program
//! ```
//!
//! The cell applies exactly the layers of [`crate::sandbox::enter`], in the
//! same order and with the same code; the only difference is who clones:
//! here the caller is the host-side parent (it writes the maps and waits),
//! so there is no intermediate worker process mirroring the cell's exit.
//!
//! The child's fds: 0 is `/dev/null`, 1 and 2 are the output pipes, 3 is
//! its end of a socket pair (close-on-exec): it receives "go" there and
//! sends one JSON message, `ready` with the [`SandboxReport`] or
//! `sandbox_error`, before it executes the program.

use super::linux::{self, namespaces, Stage};
use super::{SandboxError, SandboxPlan, SandboxReport};
use crate::profiles::LayerMode;
use crate::protocol::{FromWorker, Ready, SandboxFailure};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Exit code of a cell whose sandbox could not be applied (as a worker's).
const EXIT_SANDBOX: i32 = 6;
/// Exit code when the program could not be executed (as a worker's).
const EXIT_EXEC: i32 = 127;

/// A started one-shot cell, seen from the caller. The caller must reap
/// `pid` (it is our child) whatever happens.
#[derive(Debug)]
pub struct Cell {
    pub pid: i32,
    /// Readable once the cell has exited.
    pub pidfd: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Our end of the cell's fd 3: its report, then EOF when it executes
    /// the program (or exits).
    pub control: UnixStream,
}

/// Why no cell was started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// A layer that is decided before the clone failed (the filesystem view,
    /// required namespaces).
    #[error(transparent)]
    Sandbox(SandboxError),
    /// Pipes, sockets or the process itself.
    #[error("{0}")]
    Spawn(String),
}

/// The parent's decision about namespaces, carried into the child.
enum Namespaces {
    /// Cloned into them; the child must wait for "go".
    Cloned(Vec<&'static str>),
    /// Not used: the report line to push (mode, why).
    Without(LayerMode, String),
}

/// Start `argv` (its program an absolute path listed in `plan.exec`) as a
/// one-shot cell under `plan`. Call only while the process has one thread.
pub fn spawn(plan: &SandboxPlan, argv: &[String]) -> Result<Cell, SpawnError> {
    let threads = linux::sys::thread_count()
        .map_err(|e| SpawnError::Spawn(format!("failed to count threads: {e}")))?;
    if threads != 1 {
        return Err(SpawnError::Spawn(format!(
            "a one-shot cell must be started by a single-threaded process, this one has {threads} threads"
        )));
    }
    let ids = linux::host_ids(plan);
    let view = linux::resolve_view(plan).map_err(SpawnError::Sandbox)?;
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| SpawnError::Spawn(format!("failed to create an output pipe: {e}")))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| SpawnError::Spawn(format!("failed to open /dev/null: {e}")))?;
    let plain_pair = || {
        UnixStream::pair()
            .map_err(|e| SpawnError::Spawn(format!("failed to create the control socket: {e}")))
    };

    // Namespaces: cloned here, so that this process is the cell's parent.
    let (pid, ns, sync) = if plan.layers.namespaces == LayerMode::Off {
        let (parent, child) = plain_pair()?;
        let ns = Namespaces::Without(LayerMode::Off, "off in this profile".into());
        match fork()? {
            Some(pid) => (Some(pid), ns, parent),
            None => (None, ns, child),
        }
    } else {
        match namespaces::clone_split(ids) {
            Ok(namespaces::Cloned::Parent { pid, sync, user_ns }) => {
                // A failure here reaches the child as an error message on
                // the sync socket; it reports it and exits.
                let _ = namespaces::release(pid, &sync, user_ns, ids);
                (Some(pid), Namespaces::Cloned(Vec::new()), sync)
            }
            Ok(namespaces::Cloned::Child { names, sync }) => {
                (None, Namespaces::Cloned(names), sync)
            }
            Err(e) if e.before_clone() && plan.layers.namespaces == LayerMode::BestEffort => {
                let (parent, child) = plain_pair()?;
                let ns = Namespaces::Without(LayerMode::BestEffort, e.to_string());
                match fork()? {
                    Some(pid) => (Some(pid), ns, parent),
                    None => (None, ns, child),
                }
            }
            Err(e) => {
                return Err(SpawnError::Sandbox(SandboxError::new(
                    "namespaces",
                    e.to_string(),
                )))
            }
        }
    };
    let Some(pid) = pid else {
        cell_main(
            plan,
            ids,
            &view,
            ns,
            [null.into(), out_w, err_w, sync.into()],
            argv,
        )
    };
    drop((out_w, err_w, null));
    let pidfd = match super::process::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = super::process::kill_pid(pid);
            let _ = super::process::reap(pid);
            return Err(SpawnError::Spawn(format!(
                "failed to watch the cell process: {e}"
            )));
        }
    };
    Ok(Cell {
        pid,
        pidfd,
        stdout: out_r,
        stderr: err_r,
        control: sync,
    })
}

/// A plain fork (no namespaces).
fn fork() -> Result<Option<libc::pid_t>, SpawnError> {
    linux::sys::clone_fork(0)
        .map_err(|e| SpawnError::Spawn(format!("failed to fork the cell: {e}")))
}

/// Leave the child without running anything of the caller's (no atexit
/// handlers, no destructors, no buffered output of the parent's).
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; it has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Put `fds` (stdin, stdout, stderr, control) on 0..=3. The control fd is
/// close-on-exec; the rest of the inherited fds are closed by hygiene.
fn place_fds(fds: [OwnedFd; 4]) -> std::io::Result<()> {
    // First move every source above the targets, so that a source that
    // already sits on 0..=3 cannot be overwritten before it is copied.
    let mut high = Vec::with_capacity(4);
    for fd in &fds {
        // SAFETY: F_DUPFD_CLOEXEC on an fd we own returns a new fd or -1.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        high.push(unsafe { OwnedFd::from_raw_fd(rc) });
    }
    drop(fds);
    for (target, fd) in high.iter().enumerate() {
        let target = target as libc::c_int;
        // SAFETY: dup2 onto a small fd number; whatever was there is ours to
        // replace (this child owns its whole fd table).
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: fcntl on fd 3, just placed.
    if unsafe { libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The cell: sandbox itself, report, execute the program. Never returns.
fn cell_main(
    plan: &SandboxPlan,
    ids: namespaces::HostIds,
    view: &linux::view::FsView,
    ns: Namespaces,
    fds: [OwnedFd; 4],
    argv: &[String],
) -> ! {
    if place_fds(fds).is_err() {
        // Without its fds the cell cannot even report; the parent sees an
        // exit without a report.
        exit_now(EXIT_SANDBOX);
    }
    // SAFETY: fd 3 was just placed and belongs to nothing else in this
    // process.
    let control = unsafe { UnixStream::from_raw_fd(3) };
    let send = |msg: &FromWorker| {
        if let Ok(bytes) = serde_json::to_vec(msg) {
            let _ = (&control).write_all(&bytes);
        }
    };
    let fail = |e: SandboxError| -> ! {
        send(&FromWorker::SandboxError(SandboxFailure {
            layer: e.layer.to_owned(),
            message: e.message,
        }));
        exit_now(EXIT_SANDBOX)
    };
    let mut report = SandboxReport {
        profile: plan.profile.clone(),
        ..SandboxReport::default()
    };
    let in_ns = match ns {
        Namespaces::Cloned(names) => {
            // The maps must exist before hygiene: it hands the scratch
            // directory to the cell's ids.
            if let Err(e) = namespaces::wait_for_parent(&control) {
                fail(SandboxError::new("namespaces", e.to_string()));
            }
            if let Err(e) = linux::apply_hygiene(plan, ids, &mut report) {
                fail(e);
            }
            // A second handle on the sync socket, made after hygiene closed
            // everything above fd 3 (close-on-exec, dropped before exec).
            match control.try_clone() {
                Ok(sync) => Some(namespaces::InNamespaces {
                    user_ns: names.contains(&"user"),
                    names,
                    sync,
                }),
                Err(e) => fail(SandboxError::new(
                    "namespaces",
                    format!("failed to keep the sync socket: {e}"),
                )),
            }
        }
        Namespaces::Without(mode, why) => {
            if let Err(e) = linux::apply_hygiene(plan, ids, &mut report) {
                fail(e);
            }
            report.push("namespaces", mode, false, why);
            None
        }
    };
    let report = match linux::enter_cell(plan, Stage::Full, ids, view, in_ns.as_ref(), report) {
        Ok(r) => r,
        Err(e) => fail(e),
    };
    drop(in_ns);
    send(&FromWorker::Ready(Ready { report }));
    let err = linux::exec::exec(argv, &[]);
    eprintln!("cellbox: failed to execute {:?}: {err}", argv.first());
    exit_now(EXIT_EXEC)
}
