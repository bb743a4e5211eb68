//! The hygiene layer: a single-threaded process with only fds 0–3, a fixed
//! minimal environment, its own session, and the scratch directory ready for
//! the cell's uid.

use super::sys;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum HygieneError {
    #[error("the worker must be single-threaded, it has {0} threads")]
    Threads(usize),
    #[error("failed to {op}: {source}")]
    Call {
        op: String,
        #[source]
        source: std::io::Error,
    },
}

fn call(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> HygieneError {
    let op = op.into();
    move |source| HygieneError::Call { op, source }
}

/// The environment every process of a cell starts with.
pub fn environment(scratch: &Path, private_tmp: bool) -> Vec<(&'static str, OsString)> {
    vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME", scratch.as_os_str().to_owned()),
        ("LANG", "C.UTF-8".into()),
        ("LC_ALL", "C.UTF-8".into()),
        (
            "TMPDIR",
            if private_tmp {
                "/tmp".into()
            } else {
                scratch.as_os_str().to_owned()
            },
        ),
    ]
}

/// Replace the environment with exactly `vars`.
pub fn set_environment(vars: &[(&str, OsString)]) {
    let keys: Vec<OsString> = std::env::vars_os().map(|(k, _)| k).collect();
    for k in keys {
        // Single-threaded (checked before): nothing reads the environment
        // concurrently.
        std::env::remove_var(k);
    }
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
}

/// Replace the environment with exactly `vars` in a process that is a copy
/// of its caller (cloned, not executed afresh), and zero the strings of the
/// environment it had: they would stay in its memory, and in what
/// `/proc/self/environ` shows, whatever the caller held there (an API key).
/// Single-threaded processes only.
pub fn replace_inherited_environment(vars: &[(&str, OsString)]) {
    let old = environment_strings();
    set_environment(vars);
    for (at, len) in old {
        // SAFETY: `at` points at `len` bytes of a string of the environment
        // this process had, which no entry of the environment refers to any
        // more (every variable was removed; the new ones are copies made by
        // setenv). It is the process's own writable memory (the initial
        // stack, or the heap for variables set since), and the process has
        // one thread, so nothing reads it meanwhile.
        unsafe { std::ptr::write_bytes(at, 0, len) };
    }
}

/// The strings of the environment (address, length without the NUL).
fn environment_strings() -> Vec<(*mut libc::c_char, usize)> {
    let mut out = Vec::new();
    // SAFETY: `environ` is libc's NULL-terminated array of pointers to
    // NUL-terminated strings; nothing changes it while this single-threaded
    // process reads it.
    unsafe {
        let mut entry = libc::environ;
        while !entry.is_null() && !(*entry).is_null() {
            out.push((*entry, libc::strlen(*entry)));
            entry = entry.add(1);
        }
    }
    out
}

/// Who applies hygiene.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A worker process, whatever ran in it before: it must check that it
    /// has one thread, and sets its own environment to [`environment`].
    Worker,
    /// A one-shot cell just cloned (without `CLONE_THREAD`) by a caller that
    /// checked it had one thread: one thread by construction. It leaves its
    /// environment alone (it may share its parent's memory) and executes
    /// its program with [`environment`] instead.
    FreshClone,
}

/// Apply hygiene. `owner` is `Some((uid, gid))` when the worker is root and
/// the scratch directory must be handed to the cell's ids. Without
/// `host_scratch` the scratch directory is made later, in the new root: it
/// is neither checked nor entered here.
pub fn apply(
    scratch: &Path,
    host_scratch: bool,
    private_tmp: bool,
    owner: Option<(u32, u32)>,
    caller: Caller,
) -> Result<String, HygieneError> {
    if caller == Caller::Worker {
        let threads = sys::thread_count().map_err(call("count threads"))?;
        if threads != 1 {
            return Err(HygieneError::Threads(threads));
        }
    }
    sys::close_from(4).map_err(call("close inherited fds"))?;
    if caller == Caller::Worker {
        set_environment(&environment(scratch, private_tmp));
    }
    // The spawn hook made us a session leader; a worker started some other
    // way gets its own session here (fails harmlessly if already a leader).
    if nix::unistd::getsid(None).ok() != Some(nix::unistd::getpid()) {
        let _ = nix::unistd::setsid();
    }
    sys::set_parent_death_signal(libc::SIGKILL).map_err(call("set the parent-death signal"))?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    if host_scratch {
        let meta = std::fs::symlink_metadata(scratch)
            .map_err(call(format!("inspect scratch dir {}", scratch.display())))?;
        if !meta.is_dir() {
            return Err(HygieneError::Call {
                op: format!("use scratch dir {}", scratch.display()),
                source: std::io::Error::from(std::io::ErrorKind::NotADirectory),
            });
        }
        if let Some((uid, gid)) = owner {
            hand_over(scratch, uid, gid)?;
        }
        std::env::set_current_dir(scratch)
            .map_err(call(format!("enter scratch dir {}", scratch.display())))?;
    }
    Ok("fds 0-3 only, fixed environment, own session".into())
}

/// Give the scratch directory to the cell's ids, private to them.
pub fn hand_over(scratch: &Path, uid: u32, gid: u32) -> Result<(), HygieneError> {
    std::os::unix::fs::lchown(scratch, Some(uid), Some(gid))
        .map_err(call(format!("chown scratch dir {}", scratch.display())))?;
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o700))
        .map_err(call(format!("chmod scratch dir {}", scratch.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_fixed_and_minimal() {
        let env = environment(Path::new("/s"), true);
        let keys: Vec<_> = env.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"]);
        assert_eq!(env[1].1, "/s");
        assert_eq!(env[4].1, "/tmp");
        assert_eq!(environment(Path::new("/s"), false)[4].1, "/s");
    }
}
