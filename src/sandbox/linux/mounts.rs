//! The mount namespace: a new, read-only root holding only what the backend
//! needs.
//!
//! Runs in the cell's first process, inside fresh mount and PID namespaces:
//! 1. make every mount a slave, so nothing done here reaches the host (the
//!    new root is made private as a whole before step 4, but for the
//!    scratch directory, which keeps receiving what the host mounts beneath
//!    it: the sessions' own scratch tmpfs, for a zygote);
//! 2. mount a scratch tmpfs over a base directory (`/tmp`) and `pivot_root`
//!    into it: the host is now at `/oldroot`, and every bind below reads its
//!    source from there, so a host path is never hidden by our own mounts;
//! 3. bind `/newroot` (a directory of that tmpfs) onto itself, so that it
//!    is a mount of its own, and fill it: a private `/tmp` tmpfs,
//!    `/dev/{null,zero,urandom,random}` and `/dev/fd` links, the scratch
//!    directory read-write at its own path (a bind of the host's, or for a
//!    one-shot cell a directory of its own in the private `/tmp`, else a
//!    tmpfs of its own); then the host's tree at `/oldroot` (our private
//!    copy of it) is made `ro,nosuid,nodev` in one recursive call, and the
//!    read-only binds of the [`FsView`] entries follow: a bind mount copies
//!    the flags of its source, so each arrives read-only without a call of
//!    its own; then recreated symlinks, a fresh `/proc` for the PID
//!    namespace, minimal `/etc/passwd` and `/etc/group`;
//! 4. make the new root read-only and `pivot_root` into it, detaching the
//!    old root and the host's tree below it entirely.
//!
//! Host binds are `ro,nosuid,nodev`, device nodes `nosuid,noexec`, writable
//! mounts `nosuid,nodev,noexec`.

use super::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use super::view::{FsView, Kind};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Host directories a base tmpfs may be mounted on, first existing wins.
const BASE_CANDIDATES: &[&str] = &["/tmp", "/mnt", "/run", "/var/tmp"];
/// Device nodes every cell gets.
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];
/// Size of the new root tmpfs (holds directories, links and two small files).
const NEWROOT_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[error("failed to {op} {path}: {source}")]
pub struct MountError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn nix_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError {
        op,
        path: path.to_path_buf(),
        source: io::Error::from(e),
    }
}

/// What the cell sees as its identity, for `/etc/passwd`.
#[derive(Debug, Clone, Copy)]
pub struct CellIds {
    pub uid: u32,
    pub gid: u32,
}

/// `/etc/passwd` and `/etc/group` for the cell: root, nobody and the cell's
/// own ids, nothing from the host.
pub fn passwd_files(ids: CellIds, home: &Path) -> (String, String) {
    let mut passwd = String::from(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    );
    if ids.uid != 0 && ids.uid != 65534 {
        passwd.push_str(&format!(
            "cell:x:{}:{}:cell:{}:/bin/sh\n",
            ids.uid,
            ids.gid,
            home.display()
        ));
    }
    let mut group = String::from("root:x:0:\nnogroup:x:65534:\n");
    if ids.gid != 0 && ids.gid != 65534 {
        group.push_str(&format!("cell:x:{}:\n", ids.gid));
    }
    (passwd, group)
}

/// `base` + absolute `path`.
fn under(base: &Path, path: &Path) -> PathBuf {
    base.join(path.strip_prefix("/").unwrap_or(path))
}

fn mkdir_p(path: &Path) -> Result<(), MountError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(err("create directory", path))
}

/// Run `make` (which creates `path`); if `path`'s parent is missing,
/// create it and try once more. `Ok(false)`: something is already at
/// `path`, left as it is. One call in the usual case, where the parent
/// exists: these run for every mount point and file of every cell.
fn create_with_parents(
    path: &Path,
    what: &'static str,
    make: impl Fn() -> io::Result<()>,
) -> Result<bool, MountError> {
    let outcome = match make() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent)?;
            }
            make()
        }
        other => other,
    };
    match outcome {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(err(what, path)(e)),
    }
}

/// A new empty file at `path` (`Ok(false)` if anything is there already).
fn create_file(path: &Path, what: &'static str) -> Result<bool, MountError> {
    create_with_parents(path, what, || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
            .map(drop)
    })
}

/// Something to mount on at `path`: what is there already, or a new
/// directory or empty file.
fn mount_point(path: &Path, kind: Kind) -> Result<(), MountError> {
    match kind {
        Kind::Dir => create_with_parents(path, "create directory", || {
            std::fs::DirBuilder::new().mode(0o755).create(path)
        })
        .map(drop),
        Kind::File => create_file(path, "create mount point").map(drop),
    }
}

/// Inodes of every tmpfs mounted here but a session's scratch.
const TMPFS_INODES: u64 = 65536;

/// A tmpfs at `target`, its root owned by `owner` if given (else by us).
fn tmpfs(
    target: &Path,
    bytes: u64,
    mode: u32,
    flags: MsFlags,
    owner: Option<CellIds>,
) -> Result<(), MountError> {
    tmpfs_with_inodes(target, bytes, TMPFS_INODES, mode, flags, owner)
}

/// [`tmpfs`] with at most `inodes` inodes (the root directory is one).
fn tmpfs_with_inodes(
    target: &Path,
    bytes: u64,
    inodes: u64,
    mode: u32,
    flags: MsFlags,
    owner: Option<CellIds>,
) -> Result<(), MountError> {
    let mut data = format!("size={bytes},mode={mode:o},nr_inodes={inodes}");
    if let Some(o) = owner {
        data.push_str(&format!(",uid={},gid={}", o.uid, o.gid));
    }
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(nix_err("mount tmpfs on", target))
}

/// A tmpfs of at most `bytes` bytes and 65536 inodes on `target` in the
/// caller's own mount namespace, `nosuid,nodev,noexec`, its root with
/// `mode`: the supervisor's scratch root, so that cells together cannot
/// fill the disk it would otherwise live on. Needs `CAP_SYS_ADMIN`.
///
/// The mount is made shared (a peer group of its own), so that what is
/// mounted beneath it later — each session's own scratch tmpfs, see
/// [`mount_session_scratch`] — reaches the copies of it that the Python
/// zygotes hold in their own mount namespaces, where [`build_root`] keeps
/// it a slave: mounts propagate in, nothing propagates out.
pub fn mount_scratch_root(target: &Path, bytes: u64, mode: u32) -> Result<(), MountError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    tmpfs(target, bytes, mode, flags, None)?;
    let shared = mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    );
    if let Err(e) = shared {
        let _ = detach(target);
        return Err(nix_err("make shared", target)(e));
    }
    Ok(())
}

/// A session's own scratch tmpfs on `target` (a directory beneath the
/// scratch root, in the caller's mount namespace): at most `bytes` bytes
/// and `inodes` inodes (its root directory is one), `nosuid,nodev,noexec`,
/// its root owned by us with `mode`. A session that fills it fills only
/// its own. Needs `CAP_SYS_ADMIN`.
pub fn mount_session_scratch(
    target: &Path,
    bytes: u64,
    inodes: u64,
    mode: u32,
) -> Result<(), MountError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    tmpfs_with_inodes(target, bytes, inodes, mode, flags, None)
}

/// Detach the mount on `target` from the caller's mount namespace (it goes
/// away once nothing uses it any more). A symlink at `target` is not
/// followed.
pub fn detach(target: &Path) -> Result<(), MountError> {
    umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)
        .map_err(nix_err("detach the mount on", target))
}

/// Build the new root and switch into it. On return the process's root is
/// the new root and its cwd is `/`.
pub fn build_root(
    view: &FsView,
    tmp_bytes: u64,
    hide_pids: bool,
    ids: CellIds,
) -> Result<(), MountError> {
    let root = Path::new("/");
    // Slave, not private: nothing done here reaches the host either way,
    // but the host's scratch root (a shared mount) keeps sending the
    // sessions' scratch mounts to the copy of it bound below. Everything
    // else in the new root is made private before the pivot.
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(nix_err("make slave", root))?;

    let base = BASE_CANDIDATES
        .iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .ok_or_else(|| MountError {
            op: "find a base directory among",
            path: PathBuf::from(BASE_CANDIDATES.join(",")),
            source: io::Error::from(io::ErrorKind::NotFound),
        })?;
    tmpfs(
        base,
        NEWROOT_BYTES,
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    std::env::set_current_dir(base).map_err(err("enter", base))?;
    for d in ["newroot", "oldroot"] {
        mkdir_p(Path::new(d))?;
    }
    sys::pivot_root(Path::new("."), Path::new("oldroot")).map_err(err("pivot into", base))?;
    std::env::set_current_dir("/").map_err(err("enter", root))?;

    let old = Path::new("/oldroot");
    let new = Path::new("/newroot");
    // The new root is the base tmpfs's `newroot` directory, bound onto
    // itself so that it is a mount of its own (made read-only and pivoted
    // into below); the rest of the base tmpfs goes with the old root.
    mount(Some(new), new, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(nix_err("bind-mount", new))?;

    // Private /tmp first: host paths below /tmp (a program to run) get their
    // mount points inside it rather than being hidden by it.
    if tmp_bytes > 0 {
        let tmp = under(new, Path::new("/tmp"));
        mkdir_p(&tmp)?;
        tmpfs(
            &tmp,
            tmp_bytes,
            0o1777,
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None,
        )?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
            .map_err(err("set mode of", &tmp))?;
    }

    // /dev: a few nodes and the fd links, nothing else. Bound before the
    // host's tree goes `nodev` below, from our copy of the host's /dev made
    // `nosuid,noexec` first (one call for all nodes, whose binds copy the
    // flags); where /dev is no mount of its own, each node gets its own.
    let dev = under(new, Path::new("/dev"));
    mkdir_p(&dev)?;
    let host_dev = under(old, Path::new("/dev"));
    let node_attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    let per_node = match sys::mount_setattr(&host_dev, node_attrs, true) {
        Ok(()) => false,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => true,
        Err(e) => return Err(err("set mount attributes on", &host_dev)(e)),
    };
    for node in DEVICES {
        let src = under(old, Path::new(node));
        let target = under(new, Path::new(node));
        create_file(&target, "create mount point")?;
        match mount(
            Some(&src),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            Ok(()) if per_node => sys::mount_setattr(&target, node_attrs, false)
                .map_err(err("set mount attributes on", &target))?,
            Ok(()) => {}
            // A node this host does not have: none in the cell either.
            Err(nix::errno::Errno::ENOENT) => {
                std::fs::remove_file(&target).map_err(err("remove", &target))?
            }
            Err(e) => return Err(nix_err("bind-mount", &target)(e)),
        }
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let link = dev.join(name);
        symlink(target, &link).map_err(err("create symlink", &link))?;
    }

    // The scratch directory, read-write, at its own path: the host's, or a
    // fresh one of the cell's own. The host's is bound now, before the
    // host's tree goes read-only, onto a stage in the base tmpfs, and moved
    // into place after the read-only binds (one of which may hold it).
    let scratch = under(new, &view.scratch);
    let stage = Path::new("/scratch");
    match view.scratch_in_cell {
        None => {
            mkdir_p(stage)?;
            mount(
                Some(&under(old, &view.scratch)),
                stage,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(nix_err("bind-mount", &scratch))?;
            sys::mount_setattr(
                stage,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                true,
            )
            .map_err(err("set mount attributes on", &scratch))?;
        }
        // Inside the private /tmp: a directory of the cell's own there.
        Some(_) if tmp_bytes > 0 && view.scratch.parent() == Some(Path::new("/tmp")) => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&scratch)
                .map_err(err("create directory", &scratch))?;
            nix::unistd::chown(
                &scratch,
                Some(nix::unistd::Uid::from_raw(ids.uid)),
                Some(nix::unistd::Gid::from_raw(ids.gid)),
            )
            .map_err(nix_err("chown", &scratch))?;
        }
        Some(bytes) => {
            mkdir_p(&scratch)?;
            tmpfs(
                &scratch,
                bytes,
                0o700,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(ids),
            )?;
        }
    }

    // Host paths, read-only: our copy of the host's tree is made
    // `ro,nosuid,nodev` as a whole, and every bind taken from it below
    // carries those flags (a bind copies its source's), so no bind needs a
    // call of its own.
    sys::mount_setattr(
        old,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        true,
    )
    .map_err(err("make read-only", old))?;
    for e in view.entries.iter().filter(|e| e.mount) {
        let target = under(new, &e.path);
        mount_point(&target, e.kind)?;
        mount(
            Some(&under(old, &e.path)),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(nix_err("bind-mount", &target))?;
    }
    for s in &view.symlinks {
        let link = under(new, &s.link);
        // Something already there (a bound path) stays.
        create_with_parents(&link, "create symlink", || symlink(&s.target, &link))?;
    }
    // The host's mounts and unmounts stop here for all but the scratch
    // directory, moved in (still a slave) just after.
    mount(
        None::<&str>,
        new,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(nix_err("make private", new))?;
    if view.scratch_in_cell.is_none() {
        mount_point(&scratch, Kind::Dir)?;
        mount(
            Some(stage),
            &scratch,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(nix_err("move the scratch mount to", &scratch))?;
    }

    // /proc for the new PID namespace. A pool (fork server, zygote) shares
    // one PID namespace among the cells of every session, so `/proc/<pid>`
    // of a process the reader may not ptrace-read (PTRACE_MODE_READ: same
    // uid, dumpable, and a Landlock domain that is the reader's own or
    // nested in it) does not exist for it (`hidepid=invisible`): a warm
    // cell, in a nested domain of its own, sees its own processes only,
    // not its siblings' status/stat (RSS, CPU ticks, start time), nor its
    // zygote's.
    let proc_dir = under(new, Path::new("/proc"));
    mkdir_p(&proc_dir)?;
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        hide_pids.then_some("hidepid=invisible"),
    )
    .map_err(nix_err("mount proc on", &proc_dir))?;

    // Identity files, unless the profile binds its own.
    let etc = under(new, Path::new("/etc"));
    let (passwd, group) = passwd_files(ids, &view.scratch);
    for (name, text) in [("passwd", passwd), ("group", group)] {
        let path = etc.join(name);
        // Already there: the profile binds its own.
        create_with_parents(&path, "write", || {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)?
                .write_all(text.as_bytes())
        })?;
    }

    sys::mount_setattr(new, MOUNT_ATTR_RDONLY, false).map_err(err("make read-only", new))?;
    std::env::set_current_dir(new).map_err(err("enter", new))?;
    sys::pivot_root(Path::new("."), Path::new(".")).map_err(err("pivot into", new))?;
    // The old root (the base tmpfs) is now stacked on the new one; detaching
    // it takes everything mounted below it along, the host's tree at
    // `oldroot` included (one detach, one RCU grace period, not two).
    umount2(".", MntFlags::MNT_DETACH).map_err(nix_err("detach the old root", root))?;
    std::env::set_current_dir("/").map_err(err("enter", root))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lists_only_root_nobody_and_the_cell() {
        let (p, g) = passwd_files(
            CellIds {
                uid: 1000,
                gid: 1000,
            },
            Path::new("/s"),
        );
        assert_eq!(p.lines().count(), 3);
        assert!(p.contains("cell:x:1000:1000:cell:/s:/bin/sh"));
        assert_eq!(g.lines().count(), 3);
        let (p, g) = passwd_files(
            CellIds {
                uid: 65534,
                gid: 65534,
            },
            Path::new("/s"),
        );
        assert_eq!(p.lines().count(), 2);
        assert_eq!(g.lines().count(), 2);
        assert!(!p.contains(":/root:/bin/bash"));
    }

    #[test]
    fn under_joins_absolute_paths() {
        assert_eq!(
            under(Path::new("/newroot"), Path::new("/usr/lib")),
            PathBuf::from("/newroot/usr/lib")
        );
    }
}
