//! Removing a directory tree that a cell wrote.
//!
//! A cell decides what its scratch directory holds. `std::fs::remove_dir_all`
//! (and so `tempfile::TempDir`) recurses once per level and holds a
//! descriptor for each: a chain of directories deeper than the supervisor's
//! descriptor limit makes it give up, and a directory left without write or
//! search permission (`chmod 0`) stops it when the supervisor is not root.
//! Either way the cell's files stayed behind after the cell: on the host disk,
//! or in the supervisor's scratch quota (bytes and inodes) for the rest of its
//! life, taken from every later session.
//!
//! [`remove_tree`] walks the tree with one directory open at a time and no
//! recursion, going back up through `..` and checking that it arrives where
//! it came from. It gives a directory back `u+rwx` before entering it,
//! through the parent's descriptor and never following a link, so a link a
//! cell planted cannot turn the walk into a chmod or a removal outside the
//! tree.

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmodat, fstat, fstatat, FchmodatFlags, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Remove `path` and everything beneath it, whatever modes and depth a cell
/// left there. A path that does not exist is not an error.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    remove(path).map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("failed to remove {}: {e}", path.display()),
        )
    })
}

/// Another way to remove a tree, for what [`remove_tree`] cannot: files of
/// ids this process has no power over (a cell's subordinate ids, see
/// `crate::sandbox::linux::subids::remove_tree_mapped`).
pub type Remover = std::sync::Arc<dyn Fn(&Path) -> std::io::Result<()> + Send + Sync>;

/// A directory removed with [`remove_tree`] when dropped, or where that
/// fails with its [`Remover`] if it has one (a failure is logged). Made
/// from a `TempDir`, whose own removal it replaces.
pub struct OwnedTree {
    path: PathBuf,
    remover: Option<Remover>,
}

impl std::fmt::Debug for OwnedTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedTree")
            .field("path", &self.path)
            .field("remover", &self.remover.is_some())
            .finish()
    }
}

impl OwnedTree {
    pub fn new(dir: tempfile::TempDir) -> OwnedTree {
        OwnedTree::with_remover(dir, None)
    }

    /// With `remover` tried where [`remove_tree`] fails.
    pub fn with_remover(dir: tempfile::TempDir, remover: Option<Remover>) -> OwnedTree {
        OwnedTree {
            path: dir.keep(),
            remover,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Let the tree go without removing it: something else takes it away
    /// (unmounting the tmpfs it is on frees it all at once).
    pub fn release(mut self) {
        self.path = PathBuf::new();
    }
}

impl Drop for OwnedTree {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        // The processes that wrote it are gone (a cell ends with its whole
        // process tree), so nothing renames entries under the walk any
        // more; a pass that still failed is tried again before giving up.
        let mut last = None;
        for _ in 0..3 {
            let removed = remove_tree(&self.path).or_else(|e| match &self.remover {
                Some(remover) => remover(&self.path),
                None => Err(e),
            });
            match removed {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            tracing::warn!("{e}");
        }
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

type Id = (u64, u64);

fn id(st: &FileStat) -> Id {
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    (st.st_dev as u64, st.st_ino as u64)
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// Give the directory `name` in `at` (already stat'ed as `st`) `u+rwx` if it
/// lacks any of them. Never follows a link: a link swapped in since the stat
/// makes this fail instead.
fn make_usable<Fd: AsFd>(at: Fd, name: &CStr, st: &FileStat) -> nix::Result<()> {
    let mode = Mode::from_bits_truncate(st.st_mode);
    if mode.contains(Mode::S_IRWXU) {
        return Ok(());
    }
    fchmodat(
        at,
        name,
        mode | Mode::S_IRWXU,
        FchmodatFlags::NoFollowSymlink,
    )
}

/// Open the directory `name` in `at` and check that it is the one stat'ed.
fn enter<Fd: AsFd>(at: Fd, name: &CStr, expect: Id) -> nix::Result<OwnedFd> {
    let fd = openat(at, name, dir_flags(), Mode::empty())?;
    if id(&fstat(&fd)?) != expect {
        return Err(Errno::ESTALE);
    }
    Ok(fd)
}

fn remove(path: &Path) -> nix::Result<()> {
    let st = match fstatat(AT_FDCWD, path, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => return Ok(()),
        other => other?,
    };
    if !is_dir(&st) {
        return unlinkat(AT_FDCWD, path, UnlinkatFlags::NoRemoveDir);
    }
    let top = id(&st);
    make_usable(AT_FDCWD, &cstring(path)?, &st)?;
    let mut cur = enter(AT_FDCWD, &cstring(path)?, top)?;
    // The directories entered below the top: name in its parent, and id.
    let mut below: Vec<(CString, Id)> = Vec::new();
    loop {
        match empty_but_subdirs(&cur)? {
            Some((name, st)) => {
                make_usable(&cur, &name, &st)?;
                let child = enter(&cur, &name, id(&st))?;
                below.push((name, id(&st)));
                cur = child;
            }
            None => {
                let Some((name, _)) = below.pop() else {
                    break;
                };
                let parent = enter(&cur, c"..", below.last().map_or(top, |(_, id)| *id))?;
                drop(std::mem::replace(&mut cur, parent));
                unlinkat(&cur, name.as_c_str(), UnlinkatFlags::RemoveDir)?;
            }
        }
    }
    drop(cur);
    unlinkat(AT_FDCWD, path, UnlinkatFlags::RemoveDir)
}

fn cstring(path: &Path) -> nix::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Unlink everything in `dir` that is not a directory; the first
/// subdirectory found (name and stat), or `None` once `dir` is empty.
fn empty_but_subdirs(dir: &OwnedFd) -> nix::Result<Option<(CString, FileStat)>> {
    loop {
        let mut listing = Dir::openat(dir, c".", dir_flags(), Mode::empty())?;
        let mut removed = false;
        for entry in listing.iter() {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if matches!(entry.file_type(), Some(Type::Directory) | None) {
                let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                if is_dir(&st) {
                    return Ok(Some((name.to_owned(), st)));
                }
            }
            match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => removed = true,
                Err(e) => return Err(e),
            }
        }
        // Entries unlinked while listing may hide others from the same
        // listing: look again until a listing finds nothing.
        if !removed {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testing::in_child;
    use std::os::unix::fs::PermissionsExt;

    const UID: u32 = 1000;

    /// Make the test tree as a non-root user (when the tests run as root),
    /// with a low descriptor limit: `chmod 0` then really stops a removal.
    fn as_user<F: FnOnce() -> Result<String, String>>(base: &Path, f: F) -> Result<String, String> {
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(base, Some(UID), Some(UID)).unwrap();
        }
        in_child(|| {
            if nix::unistd::geteuid().is_root() {
                let (u, g) = (
                    nix::unistd::Uid::from_raw(UID),
                    nix::unistd::Gid::from_raw(UID),
                );
                nix::unistd::setgroups(&[]).map_err(|e| e.to_string())?;
                nix::unistd::setresgid(g, g, g).map_err(|e| e.to_string())?;
                nix::unistd::setresuid(u, u, u).map_err(|e| e.to_string())?;
            }
            rlimit::setrlimit(rlimit::Resource::NOFILE, 256, 256).map_err(|e| e.to_string())?;
            f()
        })
    }

    /// A chain of `depth` directories named `d` under `top`, each holding a
    /// file; every 500th (and the deepest) left with mode 0.
    fn chain(top: &Path, depth: usize) -> Result<(), String> {
        let err = |e: Errno| e.to_string();
        std::fs::create_dir(top).map_err(|e| e.to_string())?;
        let mut cur = openat(AT_FDCWD, top, dir_flags(), Mode::empty()).map_err(err)?;
        let mut locked = Vec::new();
        for i in 0..depth {
            nix::sys::stat::mkdirat(&cur, c"d", Mode::S_IRWXU).map_err(err)?;
            let f = openat(
                &cur,
                c"f",
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::S_IRUSR,
            )
            .map_err(err)?;
            drop(f);
            let next = openat(&cur, c"d", dir_flags(), Mode::empty()).map_err(err)?;
            if i % 500 == 0 || i + 1 == depth {
                locked.push(nix::unistd::dup(&next).map_err(err)?);
            }
            cur = next;
            if locked.len() > 100 {
                return Err("too many locked levels".into());
            }
        }
        for fd in locked {
            nix::sys::stat::fchmod(&fd, Mode::empty()).map_err(err)?;
        }
        Ok(())
    }

    #[test]
    fn a_deep_tree_with_locked_directories_and_links_out_is_removed() {
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        let b = base.path().to_path_buf();
        let result = as_user(base.path(), move || {
            std::fs::create_dir(&outside).map_err(|e| format!("{}: {e}", outside.display()))?;
            std::fs::write(outside.join("keep"), "x").map_err(|e| format!("keep: {e}"))?;
            let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode());
            let before = (mode(&outside).ok(), mode(&outside.join("keep")).ok());
            // What std gives up on: a locked directory, and a deep chain.
            let locked = b.join("locked");
            chain(&locked, 3).map_err(|e| format!("chain: {e}"))?;
            if std::fs::remove_dir_all(&locked).is_ok() {
                return Err("std removed a locked tree: the test proves nothing".into());
            }
            let deep = b.join("deep");
            chain(&deep, 3000).map_err(|e| format!("chain: {e}"))?;
            std::os::unix::fs::symlink(&outside, deep.join("out")).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(outside.join("keep"), deep.join("keep"))
                .map_err(|e| e.to_string())?;
            remove_tree(&locked).map_err(|e| format!("locked: {e}"))?;
            remove_tree(&deep).map_err(|e| format!("deep: {e}"))?;
            let after = (mode(&outside).ok(), mode(&outside.join("keep")).ok());
            if before != after {
                return Err(format!(
                    "modes outside the tree changed: {before:?} -> {after:?}"
                ));
            }
            Ok(format!("{} {}", locked.exists(), deep.exists()))
        });
        assert_eq!(result, Ok("false false".into()));
        let outside = base.path().join("outside");
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
    }

    #[test]
    fn a_file_a_link_and_nothing_are_removed_or_fine() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(!link.exists() && target.join("keep").exists());
        let file = base.path().join("file");
        std::fs::write(&file, "y").unwrap();
        remove_tree(&file).unwrap();
        assert!(!file.exists());
        remove_tree(&base.path().join("missing")).unwrap();
    }

    #[test]
    fn an_owned_tree_goes_with_its_last_handle() {
        let dir = tempfile::tempdir().unwrap();
        let tree = OwnedTree::new(dir);
        let path = tree.path().to_path_buf();
        std::fs::create_dir(path.join("sub")).unwrap();
        std::fs::set_permissions(path.join("sub"), std::fs::Permissions::from_mode(0o0)).unwrap();
        drop(tree);
        assert!(!path.exists());
    }
}
