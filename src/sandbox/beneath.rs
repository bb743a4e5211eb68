//! Opening a path strictly beneath a directory: `openat2(2)` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`. The kernel resolves every
//! component relative to the directory fd and fails with `EXDEV` when `..`,
//! an absolute path or a symlink would leave it, atomically, so a directory
//! swapped for a symlink during a walk cannot lead outside. The file tools
//! (`crate::files`) open everything through here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// How symlinks beneath the directory are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Followed while they stay beneath the directory.
    FollowBeneath,
    /// Refused (`ELOOP`) anywhere in the path.
    Refuse,
}

/// Open `path` (relative) beneath `dir` with `flags` (`O_CLOEXEC` is always
/// added) and `mode` (for `O_CREAT`). Returns the OS error unchanged:
/// `EXDEV` for an escape, `ELOOP` for a refused symlink, `ENOSYS` on kernels
/// before 5.6 (the caller fails closed).
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
    symlinks: Symlinks,
) -> io::Result<OwnedFd> {
    let c = super::linux::sys::cstring(path)?;
    let mut resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if symlinks == Symlinks::Refuse {
        resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & libc::O_CREAT != 0 {
            mode as u64
        } else {
            0
        },
        resolve,
    };
    // SAFETY: `c` is a NUL-terminated string and `how` a fully initialised
    // `OpenHow` (the kernel's `struct open_how`, three u64s) that both outlive the call; the size passed is its size.
    // The kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of openat2 is a new fd that nothing else
    // owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}
