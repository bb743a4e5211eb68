//! Run process-state tests in a forked child, never in the test harness.
//!
//! Anything that installs a seccomp filter, Landlock domain or rlimit, or
//! changes uid or namespaces, runs in [`in_child`]: the closure's result is
//! sent back through a pipe and the child exits without returning to the
//! harness.

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::ForkResult;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The closure returned this.
    Returned(Result<String, String>),
    /// The child exited without reporting (e.g. `exit` from a mirrored
    /// process) with this code.
    Exited(i32),
    /// The child was killed by this signal.
    Signaled(i32),
}

/// Run `f` in a forked child and report what happened.
pub fn in_child_outcome<F>(f: F) -> Outcome
where
    F: FnOnce() -> Result<String, String>,
{
    let (rd, wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: the child only runs `f` (allocation is fork-safe in glibc) and
    // then `_exit`s; it never returns into the multi-threaded harness.
    match unsafe { nix::unistd::fork() }.expect("fork") {
        ForkResult::Child => {
            drop(rd);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err("panicked".into()));
            let msg = match result {
                Ok(s) => format!("O{s}"),
                Err(s) => format!("E{s}"),
            };
            let mut file = std::fs::File::from(wr);
            let _ = file.write_all(msg.as_bytes());
            drop(file);
            // SAFETY: _exit skips the harness's atexit handlers and destructors.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(wr);
            let mut buf = String::new();
            let mut file = std::fs::File::from(rd);
            let _ = file.read_to_string(&mut buf);
            let status = loop {
                match waitpid(child, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.expect("waitpid"),
                }
            };
            let _ = file.as_raw_fd();
            if let Some(rest) = buf.strip_prefix('O') {
                return Outcome::Returned(Ok(rest.to_owned()));
            }
            if let Some(rest) = buf.strip_prefix('E') {
                return Outcome::Returned(Err(rest.to_owned()));
            }
            match status {
                WaitStatus::Exited(_, code) => Outcome::Exited(code),
                WaitStatus::Signaled(_, sig, _) => Outcome::Signaled(sig as i32),
                other => panic!("unexpected wait status {other:?}"),
            }
        }
    }
}

/// Run `f` in a forked child; a child that did not report is an error.
pub fn in_child<F>(f: F) -> Result<String, String>
where
    F: FnOnce() -> Result<String, String>,
{
    match in_child_outcome(f) {
        Outcome::Returned(r) => r,
        Outcome::Exited(code) => Err(format!("child exited with {code} without reporting")),
        Outcome::Signaled(sig) => Err(format!("child killed by signal {sig}")),
    }
}

/// The raw errno of the last failed libc call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Run `f` in a forked child whose fd 3 is a pipe back to the test, as a
/// worker's protocol fd would be: [`crate::sandbox::enter`] keeps fd 3 open
/// and closes everything above it. `f` reports by writing to fd 3 and
/// returns the text to write; its exit is mirrored by the sandbox's waiting
/// parent. Returns what arrived on the pipe and how the child ended.
pub fn in_worker_child<F>(f: F) -> (String, Outcome)
where
    F: FnOnce() -> Result<String, String>,
{
    let (rd, wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: as in in_child_outcome; the child ends in _exit.
    match unsafe { nix::unistd::fork() }.expect("fork") {
        ForkResult::Child => {
            drop(rd);
            // SAFETY: plain dup2 onto the protocol fd number.
            if unsafe { libc::dup2(wr.as_raw_fd(), 3) } != 3 {
                // SAFETY: exit without running harness code.
                unsafe { libc::_exit(90) }
            }
            drop(wr);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err("panicked".into()));
            let msg = match result {
                Ok(s) => format!("O{s}"),
                Err(s) => format!("E{s}"),
            };
            // SAFETY: writing a byte buffer to fd 3, then exiting.
            unsafe {
                libc::write(3, msg.as_ptr().cast(), msg.len());
                libc::_exit(0)
            }
        }
        ForkResult::Parent { child } => {
            drop(wr);
            let mut buf = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut buf);
            let status = loop {
                match waitpid(child, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.expect("waitpid"),
                }
            };
            let outcome = match status {
                WaitStatus::Exited(_, code) => Outcome::Exited(code),
                WaitStatus::Signaled(_, sig, _) => Outcome::Signaled(sig as i32),
                other => panic!("unexpected wait status {other:?}"),
            };
            (buf, outcome)
        }
    }
}

/// Start `/bin/sleep 300` that first joins the cgroups whose `tasks` files
/// are open on `join` (as a state process joins its session's groups).
#[cfg(target_os = "linux")]
pub fn sleeper_joining(join: &[std::os::fd::OwnedFd]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let raw: Vec<std::os::fd::RawFd> = join.iter().map(AsRawFd::as_raw_fd).collect();
    let mut cmd = std::process::Command::new("/bin/sleep");
    cmd.arg("300");
    // SAFETY: join_fd is async-signal-safe (one write) and the descriptors
    // stay open in the caller until the child has started.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &raw {
                super::linux::cgroup::join_fd(*fd)?;
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn sleep")
}

/// In this (forked, test) process: a private mount namespace whose `/etc`
/// is the host's with `files` laid over it (an overlay whose upper and
/// work directories are made in `base`, which the caller owns and removes),
/// then `uid`/`gid` without supplementary groups. For tests of what an
/// unprivileged user with given `/etc/passwd`, `/etc/subuid`... entries
/// gets, without changing the host's.
#[cfg(target_os = "linux")]
pub fn become_user_with_etc(
    base: &std::path::Path,
    files: &[(&str, String)],
    uid: u32,
    gid: u32,
) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    let (upper, work) = (base.join("upper"), base.join("work"));
    for d in [&upper, &work] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    for (name, text) in files {
        std::fs::write(upper.join(name), text).map_err(|e| format!("{name}: {e}"))?;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| e.to_string())?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))?;
    let data = format!(
        "lowerdir=/etc,upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        "/etc",
        Some("overlay"),
        MsFlags::empty(),
        Some(data.as_str()),
    )
    .map_err(|e| format!("overlay on /etc: {e}"))?;
    let (u, g) = (
        nix::unistd::Uid::from_raw(uid),
        nix::unistd::Gid::from_raw(gid),
    );
    nix::unistd::setgroups(&[]).map_err(|e| e.to_string())?;
    nix::unistd::setresgid(g, g, g).map_err(|e| e.to_string())?;
    nix::unistd::setresuid(u, u, u).map_err(|e| e.to_string())
}
