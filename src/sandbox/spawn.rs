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

/// A pool process (the Rhai fork server, a Python zygote) just started.
#[derive(Debug)]
pub struct PoolProcess {
    /// As the host sees it; the caller's child, to reap.
    pub pid: i32,
    /// The namespaces it was started in, its maps written: it applies the
    /// rest of its sandbox there ([`crate::sandbox::enter_cloned`]). `None`:
    /// it was started on the host and clones itself into them, if the
    /// profile has them ([`crate::sandbox::enter`]).
    pub cloned: Option<Vec<String>>,
}

/// The environment a worker or pool process starts with (its sandbox
/// replaces it).
pub const WORKER_ENV: [(&str, &str); 2] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("LANG", "C.UTF-8"),
];

/// Start `worker_exe mode` as a pool process under `plan`: fd 3 is `fd`,
/// stdin and stdout are `/dev/null`, stderr is ours, it has a session of
/// its own, joins `cgroups` (see [`prepare_worker`]) and dies with the
/// calling thread (run this on a thread that lives as long as the pool
/// process is used).
///
/// On Linux, when the plan has namespaces and the supervisor is root, the
/// process is cloned straight into them and its maps are written here
/// ([`crate::sandbox::linux::namespaces::clone_exec_mapped`]), so it is PID
/// 1 there and the caller's child: no process stays on the host side to
/// wait for it. Where that clone is refused, it is started on the host as
/// a worker is, and clones itself; `CELLBOX_POOL_CLONE=refused` in the
/// supervisor's environment acts as if it were (to exercise that way on a
/// kernel that allows the clone).
pub fn start_pool_process(
    worker_exe: &std::path::Path,
    mode: &str,
    fd: &OwnedFd,
    cgroups: Vec<RawFd>,
    plan: &crate::sandbox::SandboxPlan,
) -> std::io::Result<PoolProcess> {
    // Only as root: the process executed in the new user namespace keeps
    // its capabilities there (to build its root) only if it is that
    // namespace's root, as root's maps (0 to 0) make it. An unprivileged
    // supervisor may map only its own id, so its pool processes clone
    // themselves and keep the capabilities the clone gave them.
    #[cfg(target_os = "linux")]
    if plan.layers.namespaces != crate::profiles::LayerMode::Off
        && crate::sandbox::linux::host_ids(plan).root
        && std::env::var_os("CELLBOX_POOL_CLONE").is_none_or(|v| v != "refused")
    {
        match clone_pool_process(worker_exe, mode, fd, &cgroups, plan) {
            Ok(started) => return Ok(started),
            Err(e) => tracing::debug!("starting the pool process on the host: {e}"),
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = plan;
    let mut cmd = std::process::Command::new(worker_exe);
    cmd.arg(mode)
        .env_clear()
        .envs(WORKER_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    prepare_worker(&mut cmd, fd, cgroups);
    let child = cmd.spawn()?;
    Ok(PoolProcess {
        pid: child.id() as i32,
        cloned: None,
    })
}

#[cfg(target_os = "linux")]
fn clone_pool_process(
    worker_exe: &std::path::Path,
    mode: &str,
    fd: &OwnedFd,
    cgroups: &[RawFd],
    plan: &crate::sandbox::SandboxPlan,
) -> Result<PoolProcess, String> {
    use crate::sandbox::linux::{host_ids, namespaces, sys};
    let exe = worker_exe.to_str().ok_or("the worker path is not UTF-8")?;
    let mut image =
        sys::ExecImage::new(worker_exe, &[exe, mode], &WORKER_ENV).map_err(|e| e.to_string())?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("failed to open /dev/null: {e}"))?;
    image.null = null.as_raw_fd();
    image.protocol = fd.as_raw_fd();
    image.cgroups = cgroups.to_vec();
    let (pid, names) =
        namespaces::clone_exec_mapped(host_ids(plan), &mut image).map_err(|e| e.to_string())?;
    Ok(PoolProcess {
        pid,
        cloned: Some(names.into_iter().map(String::from).collect()),
    })
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
