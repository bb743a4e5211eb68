//! The namespaces layer: the worker clones itself into new user, mount, PID,
//! network, IPC and UTS namespaces.
//!
//! ```text
//!  worker (host, waits)  ──clone(CLONE_NEW*)──▶  cell process (PID 1)
//!   writes the child's uid/gid maps                waits for "go"
//!   sends "go", closes the protocol fd             builds its root, …
//!   waits; exits exactly as the cell did           returns from enter()
//! ```
//!
//! A user namespace is used whether or not cellbox runs as root: as root the
//! worker maps root to root (for the setup before the privilege drop) and the
//! profile's uid/gid to the same host ids, so the cell is a real unprivileged
//! user on the host, and RLIMIT_NPROC counts only this cell's processes
//! (process counts are kept per user namespace). Unprivileged,
//! the worker maps its own uid and gid. If user namespaces are unavailable and
//! the worker is root, the other namespaces are created without one.
//!
//! The pool processes (the Rhai fork server, the Python zygotes) are
//! started the other way round: the supervisor clones them straight into
//! their namespaces and writes their maps itself
//! ([`clone_exec_mapped`]), so each is PID 1 there and the supervisor's
//! child, and no process of theirs stays on the host side only to wait.
//!
//! The maps must be written from outside the new user namespace, which is why
//! the parent does it. The cell gets `PR_SET_PDEATHSIG(SIGKILL)` so that the
//! whole PID namespace dies with the worker; since its parent is outside the
//! PID namespace (`getppid` is 0 there), it watches the sync socket instead of
//! the parent's pid to detect a parent that died before the signal was set.

use super::sys;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Namespaces cloned together, by name.
pub const ALL: &[(&str, libc::c_int)] = &[
    ("user", libc::CLONE_NEWUSER),
    ("mount", libc::CLONE_NEWNS),
    ("pid", libc::CLONE_NEWPID),
    ("net", libc::CLONE_NEWNET),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
];

/// The clone flags for a set of namespace names.
pub fn flags(names: &[&str]) -> libc::c_int {
    ALL.iter()
        .filter(|(n, _)| names.contains(n))
        .fold(0, |acc, (_, f)| acc | f)
}

/// One line of a uid_map/gid_map: `inside outside 1`.
pub fn id_map_line(inside: u32, outside: u32) -> String {
    format!("{inside} {outside} 1\n")
}

/// Who the cell is, as seen from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    /// The worker runs as real root.
    pub root: bool,
    /// The ids the cell ends up with (profile ids when root or with
    /// subordinate ids, own otherwise), as seen inside its user namespace.
    pub uid: u32,
    pub gid: u32,
    /// Unprivileged with subordinate ids: 0 inside is the user, `uid` and
    /// `gid` inside are these subordinate ids ([`super::subids`]).
    pub sub: Option<super::subids::SubMap>,
}

impl HostIds {
    /// Whether the maps leave the namespace's root able to change ids and
    /// clear its groups before the drop (root's maps, or subordinate ids
    /// written by the setuid helpers), rather than only the creator's own
    /// id mapped to itself.
    pub fn switches_ids(&self) -> bool {
        self.root || self.sub.is_some()
    }
}

/// The cell-side state after a successful clone.
#[derive(Debug)]
pub struct InNamespaces {
    pub names: Vec<&'static str>,
    /// Whether `setgroups(2)` is allowed in the cell's user namespace (not
    /// when the maps were written by an unprivileged writer, which must
    /// deny it first).
    pub setgroups: bool,
    /// A socket whose other end the process on the host side of the clone
    /// holds for as long as it lives: its hangup means that process died.
    pub sync: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("namespaces are not usable here: {0}")]
    Unsupported(&'static str),
    #[error("failed to create the sync socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("failed to clone into new namespaces ({names}): {source}")]
    Clone {
        names: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker could not set up the user namespace: {0}")]
    Setup(String),
    #[error("the worker died before the namespaces were ready")]
    ParentGone,
    #[error("failed to set the parent-death signal: {0}")]
    DeathSignal(#[source] std::io::Error),
}

impl NamespaceError {
    /// Errors after which the process is still the worker, unchanged, so a
    /// best-effort profile may continue without namespaces.
    pub fn before_clone(&self) -> bool {
        matches!(
            self,
            NamespaceError::Socket(_) | NamespaceError::Clone { .. }
        )
    }
}

/// Clone into new namespaces. Returns only in the cell process; the worker
/// waits for it and exits the same way.
pub fn clone_into(ids: HostIds) -> Result<InNamespaces, NamespaceError> {
    match clone_split(ids)? {
        Cloned::Parent { pid, sync, user_ns } => worker_side(pid, sync, user_ns, ids),
        Cloned::Child { names, sync } => cell_side(names, sync, ids),
    }
}

/// The two sides of [`clone_split`].
#[derive(Debug)]
pub enum Cloned {
    /// The calling process: it must finish the child's user namespace with
    /// [`release`] before the child can go on.
    Parent {
        pid: libc::pid_t,
        sync: UnixStream,
        user_ns: bool,
    },
    /// The new process, PID 1 of the new namespaces; it must wait for the
    /// parent with [`wait_for_parent`] before anything else.
    Child {
        names: Vec<&'static str>,
        sync: UnixStream,
    },
}

/// The namespace sets a clone whose maps the parent writes tries, in
/// order: all of them, and as root also all but the user namespace.
/// Checked and prepared before any clone: `mount_setattr(2)` (so that a
/// best-effort profile can go on without namespaces rather than fail
/// half-way through the mounts), and, unprivileged, this process made
/// dumpable (writing the child's maps needs the child's /proc files to be
/// owned by it, not by root).
fn parent_maps_attempts(ids: HostIds) -> Result<Vec<Vec<&'static str>>, NamespaceError> {
    if !sys::mount_setattr_available() {
        return Err(NamespaceError::Unsupported(
            "mount_setattr(2) is missing (Linux before 5.12)",
        ));
    }
    if !ids.root {
        sys::set_dumpable()
            .map_err(|e| NamespaceError::Setup(format!("failed to set dumpable: {e}")))?;
    }
    let all: Vec<&'static str> = ALL.iter().map(|(n, _)| *n).collect();
    let without_user: Vec<&'static str> = all.iter().copied().filter(|n| *n != "user").collect();
    Ok(if ids.root {
        vec![all, without_user]
    } else {
        vec![all]
    })
}

/// Clone into new namespaces (all of them; as root also without a user
/// namespace if that fails) and return on both sides of the clone.
pub fn clone_split(ids: HostIds) -> Result<Cloned, NamespaceError> {
    let attempts = parent_maps_attempts(ids)?;
    let (parent_end, child_end) = UnixStream::pair().map_err(NamespaceError::Socket)?;
    let mut last_err = None;
    for names in attempts {
        match sys::clone_fork(flags(&names)) {
            Ok(Some(pid)) => {
                drop(child_end);
                let user_ns = names.contains(&"user");
                return Ok(Cloned::Parent {
                    pid,
                    sync: parent_end,
                    user_ns,
                });
            }
            Ok(None) => {
                drop(parent_end);
                return Ok(Cloned::Child {
                    names,
                    sync: child_end,
                });
            }
            Err(source) => {
                last_err = Some(NamespaceError::Clone {
                    names: names.join(","),
                    source,
                })
            }
        }
    }
    Err(last_err.unwrap_or(NamespaceError::Setup("no clone attempted".into())))
}

/// Clone a child into new namespaces (all of them; as root also without a
/// user namespace if that fails) that executes `image` once its maps are
/// written: the calling process writes them (as [`release`] does), then
/// tells the child to go on. The child makes only system calls until it
/// executes `image` ([`sys::clone_exec`]), so the caller may have other
/// threads. Returns the child's pid and the namespaces it is in; an error
/// means no child is left (one that was made is killed and reaped).
///
/// This is how the supervisor starts its pool processes: the process it
/// executes is PID 1 of the new namespaces and applies the rest of the
/// sequence itself ([`crate::sandbox::enter_cloned`]), with no process of
/// its own left on the host side to wait for it.
pub fn clone_exec_mapped(
    ids: HostIds,
    image: &mut sys::ExecImage,
) -> Result<(libc::pid_t, Vec<&'static str>), NamespaceError> {
    use std::os::fd::AsRawFd;
    let mut last_err = None;
    for names in parent_maps_attempts(ids)? {
        let (parent_end, child_end) = UnixStream::pair().map_err(NamespaceError::Socket)?;
        image.go = child_end.as_raw_fd();
        image.close = parent_end.as_raw_fd();
        let cloned = sys::clone_exec(flags(&names), image);
        drop(child_end);
        match cloned {
            Ok(pid) => {
                let user_ns = names.contains(&"user");
                if let Err(e) = release(pid, &parent_end, user_ns, ids) {
                    // The child saw an error message, not "go": it exits.
                    drop(parent_end);
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(pid, None);
                    return Err(NamespaceError::Setup(e.to_string()));
                }
                return Ok((pid, names));
            }
            Err(source) => {
                last_err = Some(NamespaceError::Clone {
                    names: names.join(","),
                    source,
                })
            }
        }
    }
    Err(last_err.unwrap_or(NamespaceError::Setup("no clone attempted".into())))
}

/// Clone into all six namespaces with a child that shares this process's
/// memory while this thread waits (`CLONE_VM | CLONE_VFORK`, see
/// [`sys::clone_vfork`]) and that writes its own one-id maps
/// ([`map_self`]), so that no round trip with the parent is needed and
/// nothing of the parent's address space is copied.
///
/// A process may map only its own effective ids into a user namespace it
/// created, so as root the clone is made with the cell's ids as effective
/// ids (real and saved ids stay root, and are restored at once after): the
/// namespace's creator, and the only id mapped in it, is then the cell's,
/// as on the host. Supplementary groups cannot be cleared in such a
/// namespace, so as root they are cleared here, in the calling process,
/// first.
///
/// `child` runs in the new process with the namespace names; it must end
/// by executing a program or exiting. Returns the child's pid once it has
/// done either. An error means no child was created (the caller may fall
/// back to [`clone_split`]).
pub fn clone_vfork_mapped(
    ids: HostIds,
    child: &mut dyn FnMut(Vec<&'static str>) -> libc::c_int,
) -> Result<libc::pid_t, NamespaceError> {
    if !sys::mount_setattr_available() {
        return Err(NamespaceError::Unsupported(
            "mount_setattr(2) is missing (Linux before 5.12)",
        ));
    }
    let names: Vec<&'static str> = ALL.iter().map(|(n, _)| *n).collect();
    let clone_err = |source| NamespaceError::Clone {
        names: names.join(","),
        source,
    };
    if ids.root {
        nix::unistd::setgroups(&[]).map_err(|e| clone_err(e.into()))?;
        sys::set_effective_ids(ids.uid, ids.gid).map_err(clone_err)?;
    }
    let flags = flags(&names);
    let mut run = || child(names.clone());
    let cloned = sys::clone_vfork(flags, &mut run);
    if ids.root {
        if let Err(e) = sys::restore_effective_ids() {
            if let Ok(pid) = cloned {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            }
            return Err(NamespaceError::Setup(format!(
                "failed to restore the effective ids after the clone: {e}"
            )));
        }
    }
    cloned.map_err(clone_err)
}

/// The child side of [`clone_vfork_mapped`], first thing: map its own
/// effective uid and gid (the namespace's creator's) to the same ids
/// inside, denying `setgroups` as the kernel requires of such a writer.
pub fn map_self(ids: HostIds) -> Result<(), NamespaceError> {
    // A uid change made this process's /proc files root-owned; make them
    // its own again so it may write its maps.
    sys::set_dumpable()
        .map_err(|e| NamespaceError::Setup(format!("failed to set dumpable: {e}")))?;
    write_own_id_maps("self", ids).map_err(|e| NamespaceError::Setup(e.to_string()))
}

/// The child side after [`clone_split`]: set the parent-death signal and
/// wait until the parent has finished the user namespace ("go"), or fail
/// with the reason it sent.
pub fn wait_for_parent(sync: &UnixStream) -> Result<(), NamespaceError> {
    sys::set_parent_death_signal(libc::SIGKILL).map_err(NamespaceError::DeathSignal)?;
    let mut sync = sync;
    let mut msg = Vec::new();
    let mut byte = [0u8; 1];
    // The worker sends "G" (go) or "E<message>\n".
    loop {
        match sync.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {
                if msg.is_empty() && byte[0] == b'G' {
                    msg.push(b'G');
                    break;
                }
                if byte[0] == b'\n' {
                    break;
                }
                msg.push(byte[0]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    match msg.first() {
        Some(b'G') => Ok(()),
        Some(b'E') => Err(NamespaceError::Setup(
            String::from_utf8_lossy(&msg[1..]).into_owned(),
        )),
        _ => Err(NamespaceError::ParentGone),
    }
}

fn cell_side(
    names: Vec<&'static str>,
    sync: UnixStream,
    ids: HostIds,
) -> Result<InNamespaces, NamespaceError> {
    wait_for_parent(&sync)?;
    Ok(InNamespaces {
        // Root's maps and the setuid helpers' are written without denying
        // setgroups; an unprivileged worker's own are not.
        setgroups: ids.switches_ids(),
        names,
        sync: sync.into(),
    })
}

/// A user namespace's id map (or its `setgroups`) could not be written.
#[derive(Debug, thiserror::Error)]
#[error("failed to write {path}: {source}")]
pub struct IdMapError {
    path: String,
    #[source]
    source: std::io::Error,
}

/// Write `text` to `/proc/<entry>/<file>` (`entry`: a pid, or `self`).
fn write_proc(entry: &str, file: &str, text: &str) -> Result<(), IdMapError> {
    let path = format!("/proc/{entry}/{file}");
    std::fs::write(&path, text).map_err(|source| IdMapError { path, source })
}

/// The maps an unprivileged writer may write for `/proc/<entry>`: its own
/// ids only, after giving up setgroups.
fn write_own_id_maps(entry: &str, ids: HostIds) -> Result<(), IdMapError> {
    write_proc(entry, "setgroups", "deny")?;
    write_proc(entry, "uid_map", &id_map_line(ids.uid, ids.uid))?;
    write_proc(entry, "gid_map", &id_map_line(ids.gid, ids.gid))
}

fn write_maps(pid: libc::pid_t, ids: HostIds) -> Result<(), IdMapError> {
    if let Some(map) = ids.sub {
        // The set-up runs as the user (0 inside), the cell drops to its
        // ids, which are the subordinate ones on the host.
        return super::subids::write_maps(pid, ids.uid, ids.gid, map).map_err(|e| IdMapError {
            path: format!("/proc/{pid}/uid_map and gid_map"),
            source: std::io::Error::other(e),
        });
    }
    let entry = pid.to_string();
    let write = |file: &str, text: &str| write_proc(&entry, file, text);
    if ids.root {
        // Root inside is root outside: the setup code before the privilege
        // drop is host root either way, and needs a mapped id to create its
        // mount points. The cell then drops to the profile's ids, mapped to
        // the same host ids; nothing it can exec is setuid (nosuid mounts,
        // no_new_privs), so it cannot get back to 0.
        write(
            "uid_map",
            &format!("{}{}", id_map_line(0, 0), id_map_line(ids.uid, ids.uid)),
        )?;
        write(
            "gid_map",
            &format!("{}{}", id_map_line(0, 0), id_map_line(ids.gid, ids.gid)),
        )?;
    } else {
        write_own_id_maps(&entry, ids)?;
    }
    Ok(())
}

/// The parent after [`clone_split`]: write the child's uid/gid maps (when
/// it has a user namespace) and tell it to go on, or why it cannot. The
/// error, if any, is the child's too: it ends with it.
pub fn release(
    pid: libc::pid_t,
    sync: &UnixStream,
    user_ns: bool,
    ids: HostIds,
) -> Result<(), IdMapError> {
    let result = if user_ns {
        write_maps(pid, ids)
    } else {
        Ok(())
    };
    let msg = match &result {
        Ok(()) => "G".to_string(),
        Err(e) => format!("E{}\n", e.to_string().replace('\n', " ")),
    };
    // If the child is already gone the caller's wait reports it.
    let mut sync = sync;
    let _ = sync.write_all(msg.as_bytes());
    result
}

/// The worker after the clone: finish the cell's user namespace, let it go,
/// then wait and mirror its end. Never returns.
///
/// Fd 3 is closed here behind the back of the object that owns it (the
/// worker's protocol channel, up the stack): that object must never be
/// dropped, so this function never returns or unwinds (a second close is
/// an IO-safety violation, which debug builds abort on).
fn worker_side(pid: libc::pid_t, sync: UnixStream, user_ns: bool, ids: HostIds) -> ! {
    let side = std::panic::AssertUnwindSafe(move || {
        let _ = release(pid, &sync, user_ns, ids);
        // The supervisor must see EOF on the protocol channel when the cell
        // dies, so the worker keeps no copy of it.
        // SAFETY: fd 3 belongs to the protocol channel, which this process
        // never uses again (it only waits and exits from here on, and the
        // channel's owner is never dropped: see above).
        unsafe { libc::close(crate::sandbox::PROTOCOL_FD) };
        wait_and_mirror(pid, sync)
    });
    // `wait_and_mirror` never returns: only a panic gets past this.
    let _ = std::panic::catch_unwind(side);
    // SAFETY: _exit ends the process at once, running no destructor.
    unsafe { libc::_exit(crate::sandbox::linux::EXIT_WORKER_LOST) }
}

/// Wait for `pid` and exit with its status. `_keep` stays open until then:
/// the cell watches it to notice a dead worker.
pub fn wait_and_mirror(pid: libc::pid_t, _keep: UnixStream) -> ! {
    use nix::sys::wait::{waitpid, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => std::process::exit(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                let sig = sig as libc::c_int;
                sys::die_by_signal(sig);
                std::process::exit(128 + sig)
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => std::process::exit(crate::sandbox::linux::EXIT_WORKER_LOST),
        }
    }
}

/// After the privilege drop (which clears the parent-death signal): set it
/// again and make sure the process on the host side is still alive (its end
/// of the sync socket is open), so the cell can never outlive it. Nothing
/// is read from the socket (it may be the pool's protocol channel).
pub fn confirm_parent(state: &InNamespaces) -> Result<(), NamespaceError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    sys::set_parent_death_signal(libc::SIGKILL).map_err(NamespaceError::DeathSignal)?;
    let mut fds = [PollFd::new(state.sync.as_fd(), PollFlags::empty())];
    loop {
        match poll(&mut fds, PollTimeout::ZERO) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                return Err(NamespaceError::Setup(format!(
                    "failed to poll the sync socket: {e}"
                )))
            }
            Ok(_) => break,
        }
    }
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    if fds[0].revents().is_some_and(|r| r.intersects(gone)) {
        Err(NamespaceError::ParentGone)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_cover_all_six() {
        let names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
        let f = flags(&names);
        // Every namespace the seccomp filter keeps a cell from creating,
        // except the cgroup one (a cell keeps its supervisor's view).
        let mask = super::super::seccomp::CLONE_NEW_MASK & !(libc::CLONE_NEWCGROUP as u64);
        assert_eq!(mask.count_ones(), 6);
        assert_eq!(f as u64, mask);
        assert_eq!(flags(&["mount"]), libc::CLONE_NEWNS);
    }

    #[test]
    fn id_maps_map_one_id() {
        assert_eq!(id_map_line(65534, 65534), "65534 65534 1\n");
    }
}
