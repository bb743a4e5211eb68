//! Waiting for, killing and measuring worker processes (supervisor side).

use std::io;

pub use crate::protocol::pool::Reaped;

/// Block until `pid` has exited, without reaping it, so its pid (and process
/// group id) stay reserved while the caller kills the rest of its group.
pub fn wait_exited_keep_zombie(pid: i32) -> io::Result<()> {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child
        // waitable so its pid cannot be reused under us.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Reap `pid` and collect its rusage.
pub fn reap(pid: i32) -> io::Result<Reaped> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes only into `status` and `usage`.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            let tv_ms = |tv: libc::timeval| {
                (tv.tv_sec.max(0) as u64) * 1000 + (tv.tv_usec.max(0) as u64) / 1000
            };
            let (code, signal) = if libc::WIFEXITED(status) {
                (Some(libc::WEXITSTATUS(status)), None)
            } else if libc::WIFSIGNALED(status) {
                (None, Some(libc::WTERMSIG(status)))
            } else {
                (None, None)
            };
            return Ok(Reaped {
                code,
                signal,
                cpu_ms: tv_ms(usage.ru_utime) + tv_ms(usage.ru_stime),
                max_rss_kb: usage.ru_maxrss.max(0) as u64,
            });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// What [`sigkill`] signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every process in a process group.
    Group(i32),
    /// One process.
    Pid(i32),
}

/// SIGKILL `target`. One that is already gone is not an error; an id of 1
/// or less (our own group, every process, init) is refused with EINVAL.
pub fn sigkill(target: Target) -> io::Result<()> {
    let (Target::Group(id) | Target::Pid(id)) = target;
    if id <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let rc = match target {
        // SAFETY: killpg has no memory effects; id > 1 so this never
        // signals our own group by accident (0) or every process (-1 / 1).
        Target::Group(_) => unsafe { libc::killpg(id, libc::SIGKILL) },
        // SAFETY: kill has no memory effects; id > 1.
        Target::Pid(_) => unsafe { libc::kill(id, libc::SIGKILL) },
    };
    killed(rc.into())
}

/// A kill call's return code as a result: a target that is already gone
/// (ESRCH) is not an error.
fn killed(rc: i64) -> io::Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// SIGKILL every process in process group `pgid` (see [`sigkill`]).
pub fn kill_group(pgid: i32) -> io::Result<()> {
    sigkill(Target::Group(pgid))
}

/// Whether `name` is `<prefix><pid>-<anything>` for a pid that is not this
/// process and no longer runs: what a supervisor that was killed left
/// behind (scratch roots, cgroups), for the next one to clean up.
pub fn named_for_a_gone_process(name: &std::ffi::OsStr, prefix: &str) -> bool {
    let Some(pid) = name
        .to_str()
        .and_then(|n| n.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
    else {
        return false;
    };
    pid != std::process::id() && !std::path::Path::new("/proc").join(pid.to_string()).exists()
}

/// SIGKILL one process (used on a worker that has not exited yet and has
/// not been reaped, so `pid` is still ours; see [`sigkill`]).
pub fn kill_pid(pid: i32) -> io::Result<()> {
    sigkill(Target::Pid(pid))
}

/// Open a pidfd for `pid` (readable once the process exits).
#[cfg(target_os = "linux")]
pub fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// There are no pidfds outside Linux.
#[cfg(not(target_os = "linux"))]
pub fn pidfd_open(_pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Becomes ready when a process exits (a pidfd registered with tokio; on
/// macOS a kqueue watching the process, which must then be our child:
/// `pid` is what it kills).
pub struct ExitWatch(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, i32);

/// Register an fd we own with the runtime's reactor, for readiness to read.
pub fn watch_readable(
    fd: std::os::fd::OwnedFd,
) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: `fd` is an OwnedFd moved into the AsyncFd: it stays open and
    // refers to the same file for the AsyncFd's whole lifetime.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// The peak resident size (kB) of live process `pid`, from its
/// `/proc/PID/status` (`None` once it has let go of its memory).
#[cfg(target_os = "linux")]
pub fn peak_rss_kb(pid: i32) -> Option<u64> {
    vm_hwm_kb(&read_small(format!("/proc/{pid}/status")).ok()?)
}

/// Whether the process behind `pidfd` has exited by now (it does not
/// wait): a pidfd is readable once its process is a zombie or gone.
pub fn pidfd_exited(pidfd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [nix::poll::PollFd::new(pidfd, nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// A small kernel file (of `/proc`, of a cgroup) read whole, most often in
/// one `read`: such a file says it has no size, so `fs::read_to_string`
/// would start small and grow, a `read` a step.
pub fn read_small(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(4096);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The `VmHWM` (kB) of a `/proc/PID/status` text.
#[cfg(target_os = "linux")]
fn vm_hwm_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What a watched process uses, read while it lives: its pid, learned once,
/// and its `/proc/PID/status`, kept open (see [`ExitWatch::probe`]), so that
/// reading it at the end of its cell is one `pread`.
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub struct Probe {
    pid: i32,
    status: std::fs::File,
}

#[cfg(target_os = "linux")]
impl Probe {
    /// Its pid in our PID namespace.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its peak resident size (kB) so far; `None` once it has let go of its
    /// memory (exited).
    pub fn peak_rss_kb(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        // The whole file is about 1.5 kB; `VmHWM` is in its first lines.
        let mut buf = [0u8; 4096];
        let n = self.status.read_at(&mut buf, 0).ok()?;
        vm_hwm_kb(std::str::from_utf8(buf.get(..n)?).ok()?)
    }
}

/// The CPU time (ns) process `pid` has had, from `/proc/PID/schedstat`.
#[cfg(target_os = "linux")]
pub fn cpu_ns(pid: i32) -> Option<u64> {
    read_small(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl ExitWatch {
    /// Watch `pid`, which must be our unreaped child.
    #[cfg(not(target_os = "macos"))]
    pub fn open(pid: i32) -> io::Result<Self> {
        Self::from_pidfd(pidfd_open(pid)?)
    }

    /// Watch `pid`, which must be our unreaped child.
    #[cfg(target_os = "macos")]
    pub fn open(pid: i32) -> io::Result<Self> {
        Ok(ExitWatch(
            watch_readable(super::compat::exit_kqueue(pid)?)?,
            pid,
        ))
    }

    /// Watch the process behind a pidfd.
    pub fn from_pidfd(fd: std::os::fd::OwnedFd) -> io::Result<Self> {
        Ok(ExitWatch(watch_readable(fd)?, 0))
    }

    /// SIGKILL the watched process (safe against pid reuse: a pidfd, or
    /// on macOS our unreaped child).
    pub fn kill(&self) -> io::Result<()> {
        use std::os::fd::AsFd;
        if cfg!(target_os = "macos") && self.1 > 0 {
            return kill_pid(self.1);
        }
        pidfd_kill(self.0.get_ref().as_fd())
    }

    /// A second handle on the pidfd (for a [`KillOnDrop`]).
    pub fn try_clone_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.0.get_ref().try_clone()
    }

    /// The watched process's pid in our PID namespace, while it has not
    /// exited (`None` once it has, or where it cannot be told).
    #[cfg(target_os = "linux")]
    pub fn pid_now(&self) -> Option<i32> {
        super::linux::groups::pidfd_pid(self.0.get_ref()).ok()
    }

    /// Its [`Probe`]: its pid and its `/proc/PID/status` opened now, while
    /// it lives (`None` once it has exited, or where it cannot be told).
    #[cfg(target_os = "linux")]
    pub fn probe(&self) -> Option<Probe> {
        let pid = self.pid_now()?;
        let status = std::fs::File::open(format!("/proc/{pid}/status")).ok()?;
        // Opened while it lived: the file is that process's, not another's
        // given its pid after it was gone.
        if self.has_exited() {
            return None;
        }
        Some(Probe { pid, status })
    }

    /// Whether the process has exited by now (it does not wait).
    pub fn has_exited(&self) -> bool {
        use std::os::fd::AsFd;
        pidfd_exited(self.0.get_ref().as_fd())
    }

    /// Resolves once the process has exited (it is not reaped).
    pub async fn exited(&self) {
        // A pidfd reports readable (without clearing) once the process is a
        // zombie; an error here means the fd is unusable, which we also
        // treat as "gone" rather than wait forever.
        let _ = self.0.readable().await;
    }
}

/// Kills a worker's process group and reaps it if dropped while armed, so a
/// cancelled cell (its future dropped) leaves nothing behind.
#[derive(Debug)]
pub struct KillOnDrop {
    pid: i32,
    /// Set for a fork-server child: we kill through the pidfd and the fork
    /// server (its parent) reaps it.
    pidfd: Option<std::os::fd::OwnedFd>,
    armed: bool,
}

impl KillOnDrop {
    /// For our own child `pid`.
    pub fn new(pid: i32) -> Self {
        KillOnDrop {
            pid,
            pidfd: None,
            armed: true,
        }
    }

    /// For a process we do not parent, known by its pidfd.
    pub fn pidfd(fd: std::os::fd::OwnedFd) -> Self {
        KillOnDrop {
            pid: 0,
            pidfd: Some(fd),
            armed: true,
        }
    }

    /// The worker was reaped normally; nothing left to do.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(fd) = &self.pidfd {
            use std::os::fd::AsFd;
            let _ = pidfd_kill(fd.as_fd());
            return;
        }
        let pid = self.pid;
        // The leader is unreaped, so its pgid cannot have been reused.
        let _ = kill_group(pid);
        let _ = kill_pid(pid);
        // Reap off-thread: wait4 blocks until the kill lands.
        let _ = std::thread::Builder::new()
            .name("cellbox-reap".into())
            .spawn(move || {
                let _ = reap(pid);
            });
    }
}

/// SIGKILL the process behind a pidfd (never a reused pid).
#[cfg(target_os = "linux")]
pub fn pidfd_kill(pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a valid pidfd, a signal number and a
    // null siginfo pointer (the kernel fills a default one).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    killed(rc)
}

/// Whether the process behind `pidfd` has ended or is ending: it has
/// exited (the pidfd is readable), or a SIGKILL is pending on it (sent,
/// not yet acted on: it will never run again). `host` is its pid in our
/// PID namespace, for the second question (its `/proc` entry).
#[cfg(target_os = "linux")]
pub fn ended_or_killed(pidfd: std::os::fd::BorrowedFd<'_>, host: i32) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => {}
        Ok(_) => return true,
        Err(_) => return false,
    }
    let Ok(status) = read_small(format!("/proc/{host}/status")) else {
        // Gone from /proc while its pidfd was not yet readable: reaped.
        return true;
    };
    let sigkill = 1u64 << (libc::SIGKILL - 1);
    status.lines().any(|l| {
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

/// There are no pidfds outside Linux.
#[cfg(not(target_os = "linux"))]
pub fn pidfd_kill(_pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// End this process at once with `code`: no exit handlers, no destructors,
/// no stdio flush (flush first what must be written).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and never returns; skipping destructors
    // is the point.
    unsafe { libc::_exit(code) }
}
