//! The worker's own steps when `sandbox-exec` started it (see
//! [`crate::macos`]): the kernel already enforces the SBPL policy from the
//! worker's first instruction, so what is left is what a policy cannot
//! say, done by the worker on itself as its first steps after exec:
//!
//! 1. **hygiene**: the protocol socket arrives as stdin (std's `Command`
//!    can place no other descriptor) and moves to fd 3, stdin becomes
//!    `/dev/null`; every descriptor above 3 is closed; the environment is
//!    the fixed set of [`crate::sandbox`]'s docs (`TMPDIR` is the scratch
//!    directory: there is no private `/tmp`); the working directory is the
//!    scratch directory;
//! 2. **rlimits**: the plan's limits, plus no core dumps and the profile's
//!    stack, set by the worker on itself (a launcher in `std::process`
//!    has no hook between fork and exec without `unsafe`, and the limits
//!    bind the same before any untrusted code runs).
//!
//! Portable: the same code runs on Linux, where a test starts the worker
//! through a stand-in `sandbox-exec` that applies no policy.

use super::{Layer, SandboxError, SandboxPlan, SandboxReport};
use crate::profiles::LayerMode;
use std::ffi::OsString;
use std::os::unix::net::UnixStream;

/// Take the protocol socket the launcher passed as stdin: it becomes fd 3
/// (where the Python runtime shim expects it) and stdin `/dev/null`.
pub fn take_stdin_channel() -> std::io::Result<UnixStream> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed stat is a valid buffer; fstat writes only into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on fd 0 (which may be closed: EBADF) reads no memory of ours.
    if unsafe { libc::fstat(0, &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "stdin is not a socket: the worker must be started by the cellbox supervisor",
        ));
    }
    // SAFETY: dup2 onto fd 3 closes whatever fd 3 was; nothing in this
    // process owns fd 3 yet (it is the protocol fd, taken just below).
    if unsafe { libc::dup2(0, crate::sandbox::PROTOCOL_FD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let null = std::fs::File::open("/dev/null")?;
    // SAFETY: fd 0 is ours (the copy of the socket just moved to fd 3);
    // dup2 replaces it with /dev/null, and `null` stays owned by its File.
    if unsafe { libc::dup2(null.as_raw_fd(), 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(null);
    super::spawn::take_protocol_channel()
}

/// The environment of a cell started this way.
pub fn environment(plan: &SandboxPlan) -> Vec<(&'static str, OsString)> {
    vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME", plan.scratch.clone().into_os_string()),
        ("LANG", "C.UTF-8".into()),
        ("LC_ALL", "C.UTF-8".into()),
        ("TMPDIR", plan.scratch.clone().into_os_string()),
    ]
}

/// The worker's steps under sandbox-exec (module docs), and the report of
/// what holds: the policy (applied by the launcher), hygiene, rlimits.
/// Call single-threaded, before any untrusted code runs.
pub fn enter(plan: &SandboxPlan) -> Result<SandboxReport, SandboxError> {
    let mut report = SandboxReport {
        profile: plan.profile.clone(),
        ..SandboxReport::default()
    };
    report.push(
        Layer::SandboxExec,
        LayerMode::Required,
        true,
        "started by sandbox-exec under the profile's SBPL policy (deny default); \
         no seccomp, namespaces, Landlock or cgroups on macOS"
            .into(),
    );
    let closed = close_inherited().map_err(|e| SandboxError::new(Layer::Hygiene, e))?;
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in environment(plan) {
        std::env::set_var(k, v);
    }
    std::env::set_current_dir(&plan.scratch).map_err(|e| SandboxError::new(Layer::Hygiene, e))?;
    report.push(
        Layer::Hygiene,
        LayerMode::Required,
        true,
        format!(
            "fds 0-3 only ({closed} inherited closed), fixed environment, cwd = scratch; \
             no parent-death signal (the supervisor kills the process group)"
        ),
    );
    let detail = apply_rlimits(plan).map_err(|e| SandboxError::new(Layer::Rlimits, e))?;
    report.push(Layer::Rlimits, plan.layers.rlimits, true, detail);
    Ok(report)
}

/// Close every descriptor above the protocol fd. Returns how many.
fn close_inherited() -> std::io::Result<usize> {
    // Collect first: closing while the directory is open would close its
    // own descriptor under it.
    let fds: Vec<i32> = std::fs::read_dir("/dev/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > crate::sandbox::PROTOCOL_FD)
        .collect();
    let mut closed = 0;
    for fd in fds {
        // SAFETY: nothing in this process owns a descriptor above 3 yet
        // (the worker opened none but the directory listing, now closed);
        // EBADF (the listing's own, gone) is ignored.
        if unsafe { libc::close(fd) } == 0 {
            closed += 1;
        }
    }
    Ok(closed)
}

/// The rlimit table: the plan's five, no core dumps, the profile's stack.
/// Returns the report's detail.
fn apply_rlimits(plan: &SandboxPlan) -> Result<String, std::io::Error> {
    use rlimit::Resource;
    let mut table: Vec<(&str, Resource, u64, u64)> = plan
        .limits
        .each()
        .iter()
        .map(|l| {
            let hard = if l.resource == Resource::CPU {
                l.value.saturating_add(1)
            } else {
                l.value
            };
            (l.name, l.resource, l.value, hard)
        })
        .collect();
    table.push(("core", Resource::CORE, 0, 0));
    table.push((
        "stack_bytes",
        Resource::STACK,
        plan.stack_bytes,
        plan.stack_bytes,
    ));
    let mut detail = Vec::new();
    for (name, resource, soft, hard) in table {
        let (_, cur_hard) = rlimit::getrlimit(resource)?;
        let hard = hard.min(cur_hard);
        let soft = soft.min(hard);
        rlimit::setrlimit(resource, soft, hard).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("failed to set {name} to {soft}/{hard}: {e}"),
            )
        })?;
        detail.push(format!("{name}={soft}"));
    }
    if cfg!(target_os = "macos") {
        detail.push("(macOS does not enforce RLIMIT_AS; RLIMIT_NPROC counts per user)".into());
    }
    Ok(detail.join(", "))
}

/// Replace the worker with `argv[0]` (an absolute path), keeping the
/// environment [`enter`] set plus `extra_env`. Returns only on failure.
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    use std::os::unix::process::CommandExt;
    let Some(program) = argv.first() else {
        return SandboxError::new(Layer::Exec, "empty argv");
    };
    if !program.starts_with('/') {
        return SandboxError::new(
            Layer::Exec,
            format!("program path {program:?} is not absolute"),
        );
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(&argv[1..]);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    SandboxError::new(Layer::Exec, cmd.exec())
}
