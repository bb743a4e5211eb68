//! Scratch directories made on first use. A warm Rhai cell never needs one
//! (its sandbox grants no file access at all), and making and removing a
//! directory costs more than the rest of such a cell.
//!
//! Every session has a [`Home`] beneath the supervisor's scratch root,
//! made when a cell of it first needs a scratch directory: when the
//! supervisor may mount, a tmpfs of the session's own (at most
//! [`ScratchQuota::bytes`] bytes and [`ScratchQuota::inodes`] inodes), so
//! that a session filling its scratch fills only its own space, and its
//! files, idle or not, count against nothing else. The session's scratch
//! directory and those of its sub-cells (`run_cell`) are directories in
//! it: a sub-cell's files count against the session that started it. The
//! home itself belongs to the supervisor (mode 0711), so no cell can
//! rename, replace or read the list of what is in it.

use crate::sandbox::tree::{remove_tree, OwnedTree};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Bounds of one session's scratch space (its directory and its
/// sub-cells' together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ScratchQuota {
    /// Bytes its files may hold.
    pub bytes: u64,
    /// Files, directories and links it may hold (its own directory is one).
    pub inodes: u64,
}

/// The per-session bound used unless configured: 256 MiB, 16384 inodes.
pub const DEFAULT_SESSION_SCRATCH: ScratchQuota = ScratchQuota {
    bytes: 256 << 20,
    inodes: 16384,
};

impl ScratchQuota {
    /// Why these bounds cannot be used, if they cannot: a session's scratch
    /// needs at least 1 MiB and 64 inodes (a Python cell writes a few files
    /// of its own there).
    pub fn problem(&self) -> Option<String> {
        if self.bytes < 1 << 20 {
            return Some(format!(
                "{} bytes per session's scratch: give at least 1048576 (1 MiB)",
                self.bytes
            ));
        }
        if self.inodes < 64 {
            return Some(format!(
                "{} inodes per session's scratch: give at least 64",
                self.inodes
            ));
        }
        None
    }
}

/// Where a [`Home`] is made.
pub(crate) enum Parent {
    /// The supervisor's scratch root, itself made when first needed (a
    /// Rhai cell never needs one). Holding the supervisor keeps that root
    /// until every directory beneath it is gone.
    Supervisor(Arc<super::Inner>),
    /// A directory, and the bounds of a tmpfs to mount on each home if
    /// given.
    #[cfg(test)]
    Path(PathBuf, Option<ScratchQuota>),
}

impl Parent {
    fn path(&self) -> PathBuf {
        match self {
            Parent::Supervisor(sup) => sup.scratch_parent(),
            #[cfg(test)]
            Parent::Path(p, _) => p.clone(),
        }
    }

    /// How to remove what cells with subordinate ids wrote, if they may.
    fn remover(&self) -> Option<crate::sandbox::tree::Remover> {
        match self {
            Parent::Supervisor(sup) => sup.tree_remover.clone(),
            #[cfg(test)]
            Parent::Path(..) => None,
        }
    }

    /// The bounds of a session's own tmpfs, if one may be mounted.
    fn quota(&self) -> Option<ScratchQuota> {
        match self {
            Parent::Supervisor(sup) => sup.session_scratch_quota(),
            #[cfg(test)]
            Parent::Path(_, q) => *q,
        }
    }
}

/// A session's scratch space: a directory beneath the parent, made (and
/// its tmpfs mounted) the first time one of the session's scratch
/// directories is, and removed (unmounted) with the last of them.
pub(crate) struct Home {
    parent: Parent,
    dir: OnceLock<HomeDir>,
}

struct HomeDir {
    tree: OwnedTree,
    /// The bounds of the tmpfs mounted on it, if one is.
    quota: Option<ScratchQuota>,
}

impl Drop for HomeDir {
    fn drop(&mut self) {
        // Unmounting frees every file at once. The mount point is removed
        // with `self.tree` just after; removing it also takes the copies
        // of the mount the zygotes hold with it.
        #[cfg(target_os = "linux")]
        if self.quota.is_some() {
            if let Err(e) = crate::sandbox::linux::mounts::detach(self.tree.path()) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// Homes are named `cellbox-home-<random>`.
const HOME_PREFIX: &str = "cellbox-home-";

impl Home {
    pub(crate) fn new(parent: Parent) -> Arc<Home> {
        Arc::new(Home {
            parent,
            dir: OnceLock::new(),
        })
    }

    fn path(&self) -> std::io::Result<&Path> {
        if let Some(d) = self.dir.get() {
            return Ok(d.tree.path());
        }
        let tree = tempfile::Builder::new()
            .prefix(HOME_PREFIX)
            .tempdir_in(self.parent.path())
            .map(|d| OwnedTree::with_remover(d, self.parent.remover()))?;
        let quota = self
            .parent
            .quota()
            .filter(|q| session_tmpfs(tree.path(), *q));
        if quota.is_none() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(tree.path(), std::fs::Permissions::from_mode(HOME_MODE))?;
        }
        // Two callers racing both make one; the loser's is removed at once.
        Ok(self.dir.get_or_init(|| HomeDir { tree, quota }).tree.path())
    }

    /// The bounds of the home's own tmpfs, if it was made and has one.
    #[cfg(test)]
    fn quota(&self) -> Option<ScratchQuota> {
        self.dir.get().and_then(|d| d.quota)
    }
}

/// A home: the supervisor's, searchable (not readable) by the cells, whose
/// directories are in it.
const HOME_MODE: u32 = 0o711;

/// Mount a session's tmpfs on `dir`; whether it was.
#[cfg(target_os = "linux")]
fn session_tmpfs(dir: &Path, q: ScratchQuota) -> bool {
    match crate::sandbox::linux::mounts::mount_session_scratch(dir, q.bytes, q.inodes, HOME_MODE) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "this session's scratch is not bounded on its own ({e}); the scratch root's \
                 bound holds"
            );
            false
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn session_tmpfs(_dir: &Path, _q: ScratchQuota) -> bool {
    false
}

/// A scratch directory in a session's [`Home`], created the first time its
/// path is asked for and removed with the last handle (whatever depth and
/// modes its cells left: see [`remove_tree`]).
pub(crate) struct Scratch {
    home: Arc<Home>,
    prefix: &'static str,
    dir: OnceLock<OwnedTree>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("prefix", &self.prefix)
            .field("dir", &self.dir.get().map(OwnedTree::path))
            .finish_non_exhaustive()
    }
}

impl Scratch {
    /// A session's scratch directory, in a home of its own.
    pub(crate) fn new(parent: Parent, prefix: &'static str) -> Scratch {
        Scratch {
            home: Home::new(parent),
            prefix,
            dir: OnceLock::new(),
        }
    }

    /// Another directory in the same home as `other` (a sub-cell's, in
    /// its session's space and quota).
    pub(crate) fn beside(other: &Scratch, prefix: &'static str) -> Scratch {
        Scratch {
            home: other.home.clone(),
            prefix,
            dir: OnceLock::new(),
        }
    }

    /// The directory, made now if it does not exist yet.
    pub(crate) fn path(&self) -> std::io::Result<&Path> {
        if let Some(d) = self.dir.get() {
            return Ok(d.path());
        }
        let made = tempfile::Builder::new()
            .prefix(self.prefix)
            .tempdir_in(self.home.path()?)
            .map(|d| OwnedTree::with_remover(d, self.home.parent.remover()))?;
        // Two callers racing both make one; the loser's is removed at once.
        Ok(self.dir.get_or_init(|| made).path())
    }

    /// The bounds of the space this directory is in, once it was made
    /// there, if that space is bounded on its own.
    #[cfg(test)]
    pub(crate) fn quota(&self) -> Option<ScratchQuota> {
        self.home.quota()
    }

    /// The directory if it was made.
    #[cfg(test)]
    pub(crate) fn made(&self) -> Option<&Path> {
        self.dir.get().map(OwnedTree::path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(tree) = self.dir.take() else {
            return;
        };
        // The last directory of a home that is a tmpfs of its own: the
        // home is unmounted just after, which frees every file at once
        // (removing a full session's 16384 files one by one would take
        // a tenth of a second of the thread that closes it).
        let mounted = self.home.dir.get().is_some_and(|d| d.quota.is_some());
        if mounted && Arc::strong_count(&self.home) == 1 {
            tree.release();
        }
        // Otherwise the tree is removed now (a sub-cell's, whose files
        // leave its session's space as it ends).
    }
}

/// Where every session's [`Home`] is made. When the supervisor may mount
/// (it runs as root on Linux), a tmpfs of at most `bytes` bytes and 65536
/// inodes that lives as long as the supervisor, so that its cells together
/// cannot fill the disk beneath the system temp dir (RLIMIT_FSIZE bounds
/// each file, not how many there are); each home is then a tmpfs of its
/// own mounted on it, and the root holds only what a home that could not
/// be mounted holds. Otherwise a plain directory there, where only each
/// file's size is bounded.
#[derive(Debug)]
pub(crate) struct ScratchRoot {
    dir: OwnedTree,
    quota: Option<u64>,
}

impl ScratchRoot {
    pub(crate) fn new(bytes: u64) -> std::io::Result<ScratchRoot> {
        let parent = std::env::temp_dir();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{ROOT_PREFIX}{}-", std::process::id()))
            .tempdir_in(&parent)
            .map(OwnedTree::new)?;
        let quota = quota_tmpfs(dir.path(), bytes);
        Ok(ScratchRoot { dir, quota })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The bytes all scratch directories may hold together, when bounded.
    pub(crate) fn quota(&self) -> Option<u64> {
        self.quota
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.quota.is_some() {
            if let Err(e) = crate::sandbox::linux::mounts::detach(self.dir.path()) {
                tracing::warn!("{e}");
            }
        }
        // The directory itself goes with `self.dir`.
    }
}

/// Scratch roots are named `cellbox-scratch-<pid of the supervisor>-<random>`.
const ROOT_PREFIX: &str = "cellbox-scratch-";
/// The fork server's directory: `cellbox-forkserver-<pid>-<random>`.
pub(crate) const FORKSERVER_PREFIX: &str = "cellbox-forkserver-";

/// Sweep what supervisors that are gone without cleaning up (killed) left
/// on this host: their scratch roots (and the tmpfs on each) and fork
/// server directories in the temp dir, and their cgroups (see
/// [`crate::sandbox::linux::cgroup::sweep_gone`]). Run once as a
/// supervisor starts.
pub(crate) fn sweep_gone_supervisors() {
    sweep_stale(&std::env::temp_dir());
    #[cfg(target_os = "linux")]
    crate::sandbox::linux::cgroup::sweep_gone();
}

/// Remove the scratch roots (and their tmpfs) and fork server directories
/// of supervisors that are gone: a tmpfs holds memory until it is
/// unmounted. Only directories named as ours whose supervisor's pid no
/// longer runs, whoever owns them (a scratch root's tmpfs belongs to the
/// sandbox uid); never through a link (the name itself, or anything
/// beneath: see [`remove_tree`]).
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if ![ROOT_PREFIX, FORKSERVER_PREFIX]
            .iter()
            .any(|p| crate::sandbox::process::named_for_a_gone_process(&name, p))
        {
            continue;
        }
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            _ => continue,
        }
        // Never follows a link (UMOUNT_NOFOLLOW); not a mount point: EINVAL.
        #[cfg(target_os = "linux")]
        let _ = crate::sandbox::linux::mounts::detach(&path);
        match remove_tree(&path) {
            Ok(()) => tracing::info!("removed what a gone supervisor left: {}", path.display()),
            Err(e) => tracing::warn!("failed to remove {}: {e}", path.display()),
        }
    }
}

/// Mount the quota tmpfs on `dir` if this process may; the quota if it did.
#[cfg(target_os = "linux")]
fn quota_tmpfs(dir: &Path, bytes: u64) -> Option<u64> {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let mode = std::fs::metadata(dir)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o700);
    match crate::sandbox::linux::mounts::mount_scratch_root(dir, bytes, mode) {
        Ok(()) => Some(bytes),
        Err(e) => {
            tracing::warn!(
                "scratch directories are not bounded in total ({e}); each file still is"
            );
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn quota_tmpfs(_dir: &Path, _bytes: u64) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_on_first_use_and_removed_on_drop() {
        let parent = tempfile::tempdir().unwrap();
        let s = Scratch::new(Parent::Path(parent.path().to_path_buf(), None), "cellbox-");
        assert!(s.made().is_none());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
        let p = s.path().unwrap().to_path_buf();
        assert!(p.is_dir() && p.starts_with(parent.path()));
        assert_eq!(s.path().unwrap(), p, "the same directory every time");
        // In the session's home, which only the supervisor may change.
        let home = p.parent().unwrap().to_path_buf();
        assert_eq!(home.parent().unwrap(), parent.path());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&home).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, HOME_MODE, "{mode:o}");
        assert_eq!(s.quota(), None);
        std::fs::write(p.join("f"), "x").unwrap();
        // A sub-cell's directory is beside it, in the same home.
        let sub = Scratch::beside(&s, "cellbox-sub-");
        let q = sub.path().unwrap().to_path_buf();
        assert_eq!(q.parent().unwrap(), home);
        assert_ne!(q, p);
        drop(sub);
        assert!(!q.exists() && p.exists(), "a sub-cell's goes alone");
        drop(s);
        assert!(!p.exists() && !home.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_parent_is_an_error_not_a_panic() {
        let s = Scratch::new(
            Parent::Path(PathBuf::from("/nonexistent/cellbox-test"), None),
            "cellbox-",
        );
        assert!(s.path().is_err());
    }

    #[test]
    fn quota_bounds_are_checked() {
        assert_eq!(DEFAULT_SESSION_SCRATCH.problem(), None);
        let q = |bytes, inodes| ScratchQuota { bytes, inodes }.problem();
        assert_eq!(q(1 << 20, 64), None);
        assert!(q((1 << 20) - 1, 64).unwrap().contains("1 MiB"));
        assert!(q(1 << 20, 63).unwrap().contains("at least 64"));
    }

    /// Each session's home is a tmpfs of its own: bytes and inodes stop at
    /// its bounds, another session's home is untouched, and unmounting
    /// frees the files at once.
    #[test]
    fn each_session_home_is_bounded_on_its_own() {
        if !nix::unistd::geteuid().is_root() {
            // Only root may mount; the tests run as root in CI.
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let quota = ScratchQuota {
            bytes: 2 << 20,
            inodes: 100,
        };
        let a = Scratch::new(Parent::Path(parent.path().to_path_buf(), Some(quota)), "a-");
        let b = Scratch::new(Parent::Path(parent.path().to_path_buf(), Some(quota)), "b-");
        let (pa, pb) = (
            a.path().unwrap().to_path_buf(),
            b.path().unwrap().to_path_buf(),
        );
        assert_eq!((a.quota(), b.quota()), (Some(quota), Some(quota)));
        let home = pa.parent().unwrap().to_path_buf();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(home.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{} is not a mount:\n{mounts}", home.display()));
        assert!(
            line.contains(" - tmpfs ")
                && line.contains("size=2048k")
                && line.contains("nr_inodes=100"),
            "{line}"
        );
        // Inodes: the home's root and a's directory are two of them.
        let mut made = 0;
        let err = (0..200)
            .find_map(|i| {
                let r = std::fs::File::create(pa.join(format!("e{i}")));
                made += usize::from(r.is_ok());
                r.err()
            })
            .expect("the inode bound must stop a");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert_eq!(made, 98);
        // b is not affected; a sub-cell of a is.
        std::fs::write(pb.join("f"), "x").unwrap();
        let sub = Scratch::beside(&a, "sub-");
        assert!(
            sub.path().is_err(),
            "a sub-cell's directory counts against a"
        );
        drop(sub);
        for i in 0..98 {
            std::fs::remove_file(pa.join(format!("e{i}"))).unwrap();
        }
        // A sub-cell's directory, files and all, leaves a's space as it
        // goes (a's does not go with it).
        let sub = Scratch::beside(&a, "sub-");
        let ps = sub.path().unwrap().to_path_buf();
        std::fs::write(ps.join("f"), vec![0u8; 1 << 20]).unwrap();
        drop(sub);
        assert!(!ps.exists() && pa.exists());
        // Bytes.
        let r = std::fs::write(pa.join("big"), vec![0u8; 3 << 20]).unwrap_err();
        assert_eq!(r.raw_os_error(), Some(libc::ENOSPC), "{r}");
        std::fs::write(pb.join("g"), vec![0u8; 1 << 20]).unwrap();
        drop(a);
        assert!(!home.exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(home.to_str().unwrap()), "{mounts}");
        drop(b);
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn roots_of_gone_supervisors_are_swept() {
        // A pid that does not run: above the kernel's maximum.
        let parent = tempfile::tempdir().unwrap();
        let stale = parent.path().join(format!("{ROOT_PREFIX}4194305-abc"));
        let live = parent
            .path()
            .join(format!("{ROOT_PREFIX}{}-abc", std::process::id()));
        let other = parent.path().join("cellbox-scratch-x-abc");
        let forkserver = parent
            .path()
            .join(format!("{FORKSERVER_PREFIX}4194305-abc"));
        for d in [&stale, &live, &other, &forkserver] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("f"), "x").unwrap();
        }
        // Owned by another user (as a tmpfs root given to the sandbox uid):
        // swept all the same.
        std::os::unix::fs::lchown(&forkserver, Some(65534), Some(65534)).unwrap();
        // A link named like a stale root is neither followed nor removed.
        let target = parent.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        let link = parent.path().join(format!("{ROOT_PREFIX}4194306-abc"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mounted = nix::unistd::geteuid().is_root();
        if mounted {
            crate::sandbox::linux::mounts::mount_scratch_root(&stale, 1 << 20, 0o700).unwrap();
            std::fs::write(stale.join("f"), "x").unwrap();
            // A session's home mounted beneath it goes too.
            let home = stale.join(format!("{HOME_PREFIX}abc"));
            std::fs::create_dir(&home).unwrap();
            crate::sandbox::linux::mounts::mount_session_scratch(&home, 1 << 20, 64, HOME_MODE)
                .unwrap();
            std::fs::write(home.join("f"), "x").unwrap();
        }
        if mounted {
            // The tmpfs root belongs to another uid, as a real one does.
            std::os::unix::fs::lchown(&stale, Some(65534), Some(65534)).unwrap();
        }
        sweep_stale(parent.path());
        assert!(!stale.exists() && !forkserver.exists());
        assert!(live.join("f").exists() && other.join("f").exists());
        assert!(target.join("keep").exists() && link.exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(stale.to_str().unwrap()), "{mounts}");
    }

    #[test]
    fn the_scratch_root_is_bounded_when_root_and_goes_away() {
        let root = ScratchRoot::new(4 << 20).unwrap();
        let path = root.path().to_path_buf();
        assert!(path.is_dir());
        if !nix::unistd::geteuid().is_root() {
            // Only root may mount; the tests run as root in CI.
            assert_eq!(root.quota(), None);
            return;
        }
        assert_eq!(root.quota(), Some(4 << 20));
        let s = Scratch::new(Parent::Path(path.clone(), None), "cellbox-");
        let dir = s.path().unwrap().to_path_buf();
        // Many files, each small: the total stops at the quota.
        let mut written = 0u64;
        let err = (0..16)
            .find_map(|i| {
                let r = std::fs::write(dir.join(format!("f{i}")), vec![0u8; 1 << 20]);
                if r.is_ok() {
                    written += 1 << 20;
                }
                r.err()
            })
            .expect("the quota must stop the writes");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert!(written <= 4 << 20, "{written}");
        drop(s);
        drop(root);
        assert!(!path.exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(path.to_str().unwrap()), "{mounts}");
    }
}
