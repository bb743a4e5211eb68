//! Spawning a worker: the protocol socket lands on fd 3, the worker gets its
//! own session and process group, and dies with its supervisor.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Arrange for `fd` to be the child's fd 3 and for the child to start a new
/// session (so the supervisor can kill its whole process group) with a
/// parent-death SIGKILL. With `cgroups` (open `tasks` or `cgroup.procs`
/// files, one per hierarchy, see [`crate::sandbox::linux::cgroup`]), the
/// child joins each first, so nothing it or its descendants do escapes
/// them. `fd` and `cgroups` must stay open until the child is spawned.
pub fn prepare_worker(cmd: &mut std::process::Command, fd: &OwnedFd, cgroups: Vec<RawFd>) {
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    let supervisor = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (write, dup2, fcntl, setsid, prctl,
    // getppid); it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            #[cfg(target_os = "linux")]
            for cg in &cgroups {
                crate::sandbox::linux::cgroup::join_fd(*cg)?;
            }
            #[cfg(not(target_os = "linux"))]
            let _ = &cgroups;
            if raw == crate::sandbox::PROTOCOL_FD {
                // dup2 onto itself would keep CLOEXEC; clear it instead.
                if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, crate::sandbox::PROTOCOL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
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

/// A long-lived helper process of the supervisor (an upstream tool server):
/// it starts a new session, so the supervisor can kill its whole process
/// group, and gets a parent-death SIGKILL.
pub fn prepare_helper(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let supervisor = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (setsid, prctl, getppid); it allocates
    // nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Take ownership of the protocol channel on fd 3 (worker side). Fails if
/// fd 3 is not an open socket, so a worker started by hand says so clearly.
pub fn take_protocol_channel() -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::FromRawFd;
    let fd = crate::sandbox::PROTOCOL_FD;
    // SAFETY: fstat writes only into `st`; a zeroed stat is a valid buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a possibly-closed fd is safe; it returns EBADF.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "fd 3 is not a socket: the worker must be started by the cellbox supervisor",
        ));
    }
    // SAFETY: fd 3 is an open socket that the spawn hook placed there for
    // this process alone; nothing else in this process owns it.
    Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}
