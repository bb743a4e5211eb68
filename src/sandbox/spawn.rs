//! Spawning a worker: the protocol socket lands on fd 3, the worker gets its
//! own session and process group, and dies with its supervisor.

use std::os::fd::{AsRawFd, OwnedFd};

/// Arrange for `fd` to be the child's fd 3 and for the child to start a new
/// session (so the supervisor can kill its whole process group) with a
/// parent-death SIGKILL. `fd` must stay open until the child is spawned.
pub fn prepare_worker(cmd: &mut tokio::process::Command, fd: &OwnedFd) {
    let raw = fd.as_raw_fd();
    let supervisor = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (dup2, fcntl, setsid, prctl, getppid); it
    // allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            if raw == crate::protocol::PROTOCOL_FD {
                // dup2 onto itself would keep CLOEXEC; clear it instead.
                if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, crate::protocol::PROTOCOL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor may have died between fork and prctl.
            if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
