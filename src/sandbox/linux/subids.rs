//! Subordinate ids: an unprivileged cellbox whose user has ranges in
//! `/etc/subuid` and `/etc/subgid` runs its cells as one of those ids
//! rather than as itself, as rootless container engines do.
//!
//! ```text
//!  inside the cell's user namespace      on the host
//!  0 (the set-up, before the drop)   →   the invoking user
//!  the profile's uid/gid (the cell)  →   the first subordinate uid/gid
//! ```
//!
//! Only the setuid helpers `newuidmap` and `newgidmap` may write such maps,
//! and only from outside the namespace: the process on the host side of
//! the clone runs them ([`write_maps`]). A cell then cannot touch the
//! user's own files by uid (they are root's to it, and it has no
//! capability), and the set-up may clear the supplementary groups
//! (`newgidmap` leaves `setgroups` allowed).
//!
//! What such a cell writes belongs to the subordinate id, which the user
//! cannot remove on the host. [`remove_tree_mapped`] removes it from a
//! helper process in a user namespace with the same ids mapped, where it is
//! root (as `podman unshare` does): the worker binary in its hidden mode
//! [`REMOVE_ARG`], which walks the tree with [`crate::sandbox::tree`].

use super::sys;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The ranges of subordinate uids.
pub const SUBUID: &str = "/etc/subuid";
/// The ranges of subordinate gids.
pub const SUBGID: &str = "/etc/subgid";

/// The hidden first argument of the worker binary that removes a tree
/// (the second argument) in a user namespace [`remove_tree_mapped`] made.
pub const REMOVE_ARG: &str = "__remove_tree";

/// Where the map helpers are looked for (never through `PATH`).
const TOOL_DIRS: [&str; 4] = ["/usr/bin", "/bin", "/usr/sbin", "/usr/local/bin"];

/// The ids a namespace with subordinate ids maps, as the host sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubMap {
    /// The invoking user (root inside).
    pub own_uid: u32,
    pub own_gid: u32,
    /// The first subordinate uid and gid (the cell's ids).
    pub uid: u32,
    pub gid: u32,
}

/// The start of the first range of `name` (or of its numeric id `id`) in
/// the text of `/etc/subuid` or `/etc/subgid` (`owner:start:count` lines)
/// that holds at least one id.
pub fn first_range(text: &str, name: &str, id: u32) -> Option<u32> {
    let id = id.to_string();
    text.lines().find_map(|line| {
        let mut fields = line.trim().split(':');
        let owner = fields.next()?;
        let start: u32 = fields.next()?.parse().ok()?;
        let count: u32 = fields.next()?.parse().ok()?;
        ((owner == name || owner == id) && count > 0 && start > 0).then_some(start)
    })
}

/// The path of the map helper `name` (`newuidmap`, `newgidmap`).
pub fn tool(name: &str) -> Result<PathBuf, String> {
    TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} is not installed (Debian: apt install uidmap)"))
}

/// The subordinate ids of the user this process runs as (its real ids, as
/// the map helpers check), or why there are none.
pub fn lookup() -> Result<SubMap, String> {
    let own_uid = nix::unistd::getuid();
    let own_gid = nix::unistd::getgid().as_raw();
    if own_uid.is_root() {
        return Err("root maps the profile's ids directly".into());
    }
    let user = nix::unistd::User::from_uid(own_uid)
        .ok()
        .flatten()
        .ok_or_else(|| format!("uid {own_uid} has no entry in the user database"))?;
    let range = |file: &str, what: &str| -> Result<u32, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        first_range(&text, &user.name, own_uid.as_raw())
            .ok_or_else(|| format!("{file} gives {} no {what}", user.name))
    };
    let uid = range(SUBUID, "subordinate uids")?;
    let gid = range(SUBGID, "subordinate gids")?;
    tool("newuidmap")?;
    tool("newgidmap")?;
    Ok(SubMap {
        own_uid: own_uid.as_raw(),
        own_gid,
        uid,
        gid,
    })
}

/// Write the maps of `pid` (a child in a new user namespace) with
/// `newuidmap` and `newgidmap`: 0 is the invoking user, `inside_uid` and
/// `inside_gid` the subordinate ids of `map`.
pub fn write_maps(
    pid: libc::pid_t,
    inside_uid: u32,
    inside_gid: u32,
    map: SubMap,
) -> Result<(), String> {
    let run = |name: &str, own: u32, inside: u32, sub: u32| -> Result<(), String> {
        let path = tool(name)?;
        let out = std::process::Command::new(&path)
            .args([pid.to_string(), "0".into(), own.to_string(), "1".into()])
            .args([inside.to_string(), sub.to_string(), "1".into()])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("failed to run {}: {e}", path.display()))?;
        if out.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "{name} failed ({}): {}",
            out.status,
            said.trim().replace('\n', " ")
        ))
    };
    run("newuidmap", map.own_uid, inside_uid, map.uid)?;
    run("newgidmap", map.own_gid, inside_gid, map.gid)
}

/// Remove `path` and everything beneath it, whatever a cell running as
/// `map`'s subordinate ids left there (directories of its own without
/// write or search permission for the invoking user): `exe` (the worker
/// binary) is cloned into a new user namespace with `map`'s ids mapped,
/// where it is root, and executed as [`REMOVE_ARG`] to walk the tree.
/// Blocks until it has ended; the caller may have other threads.
pub fn remove_tree_mapped(exe: &Path, path: &Path, map: SubMap) -> std::io::Result<()> {
    let failed = |what: String| std::io::Error::other(format!("{what} ({})", path.display()));
    let exe_text = exe
        .to_str()
        .ok_or_else(|| failed("the worker path is not UTF-8".into()))?;
    let path_text = path
        .to_str()
        .ok_or_else(|| failed("the path is not UTF-8".into()))?;
    let mut image = sys::ExecImage::new(
        exe,
        &[exe_text, REMOVE_ARG, path_text],
        &[("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8")],
    )?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let (parent_end, child_end) = UnixStream::pair()?;
    image.null = null.as_raw_fd();
    image.protocol = null.as_raw_fd();
    image.go = child_end.as_raw_fd();
    image.close = parent_end.as_raw_fd();
    let pid = sys::clone_exec(libc::CLONE_NEWUSER, &image)?;
    drop(child_end);
    let mapped = write_maps(pid, 1, 1, map);
    if mapped.is_ok() {
        use std::io::Write;
        let _ = (&parent_end).write_all(b"G");
    }
    // Without "go" the child exits at once.
    drop(parent_end);
    let status = loop {
        match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    mapped.map_err(failed)?;
    match status {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(other) => Err(failed(format!("the removal helper ended: {other:?}"))),
        Err(e) => Err(failed(format!(
            "failed to wait for the removal helper: {e}"
        ))),
    }
}

/// The helper's side ([`REMOVE_ARG`]): remove `path`. Returns the exit
/// code.
pub fn remove_main(path: Option<std::ffi::OsString>) -> i32 {
    let Some(path) = path else {
        crate::report!("cellbox: {REMOVE_ARG} needs a path");
        return 2;
    };
    match crate::sandbox::tree::remove_tree(Path::new(&path)) {
        Ok(()) => 0,
        Err(e) => {
            crate::report!("cellbox: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_found_by_name_or_id() {
        let text = "alice:100000:65536\n# x\nbob:0:10\n1001:200000:65536\ncarol:300000:0\n";
        assert_eq!(first_range(text, "alice", 1000), Some(100000));
        assert_eq!(first_range(text, "dave", 1001), Some(200000));
        assert_eq!(first_range(text, "bob", 1002), None, "a range from 0");
        assert_eq!(first_range(text, "carol", 1003), None, "an empty range");
        assert_eq!(first_range(text, "erin", 1004), None);
    }
}
