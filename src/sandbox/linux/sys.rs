//! Thin safe wrappers over the raw syscalls the layers need and that neither
//! `nix` nor `std` offer. Each returns the OS error unchanged.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn check_int(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Close every fd from `first` upwards.
pub fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range takes plain integers and only closes descriptors;
    // the caller guarantees nothing in this process still uses fds >= first.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    match check(rc) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            // Kernels before 5.9: close one by one up to the fd limit.
            let max = rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(65536)
                .min(1 << 20);
            for fd in u64::from(first)..max {
                if let Ok(fd) = libc::c_int::try_from(fd) {
                    // SAFETY: closing an fd number; EBADF for unused ones is ignored.
                    unsafe { libc::close(fd) };
                }
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `prctl(PR_SET_PDEATHSIG, sig)`.
pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number by value.
    check_int(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })
        .map(|_| ())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: integer-only prctl.
    check_int(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(|_| ())
}

/// `prctl(PR_GET_NO_NEW_PRIVS)`.
pub fn no_new_privs() -> io::Result<bool> {
    // SAFETY: integer-only prctl.
    check_int(unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) }).map(|v| v == 1)
}

/// `prctl(PR_SET_DUMPABLE, 1)`: `/proc/<pid>` of this process (and of a child
/// forked from it) is owned by its uid again, as after a plain execve. A uid
/// change clears it, and then the child's /proc files are root-owned.
pub fn set_dumpable() -> io::Result<()> {
    // SAFETY: integer-only prctl.
    check_int(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) }).map(|_| ())
}

/// Drop every capability from the bounding set. Stops at the first index the
/// kernel does not know (EINVAL).
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..64 {
        // SAFETY: integer-only prctl.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(err);
        }
    }
    Ok(())
}

/// Whether the bounding set still holds any capability.
pub fn bounding_set_empty() -> io::Result<bool> {
    for cap in 0..64 {
        // SAFETY: integer-only prctl.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                return Ok(true);
            }
            return Err(err);
        }
        if rc == 1 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How many supplementary groups the calling process has.
pub fn supplementary_group_count() -> io::Result<usize> {
    // SAFETY: with a size of 0 getgroups only returns the count and writes
    // nothing.
    let n = check_int(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
    Ok(n as usize)
}

/// Clear the ambient capability set.
pub fn clear_ambient_caps() -> io::Result<()> {
    const PR_CAP_AMBIENT: libc::c_int = 47;
    const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;
    // SAFETY: integer-only prctl.
    check_int(unsafe { libc::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) }).map(|_| ())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Empty the effective, permitted and inheritable sets.
pub fn clear_capabilities() -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and data are valid for the duration of the call and
    // have the layout of the v3 ABI (one header, two data words).
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) }).map(|_| ())
}

/// `(effective, permitted, inheritable)` of the calling thread.
pub fn capabilities() -> io::Result<(u64, u64, u64)> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: as in clear_capabilities; the kernel writes two data words.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) })?;
    let join = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
    Ok((
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ))
}

/// `clone(flags | SIGCHLD)` without a new stack: like `fork`, but able to
/// create namespaces at the same time. Returns `Some(pid)` in the parent and
/// `None` in the child.
///
/// Only for a single-threaded caller (the worker): the child gets a copy of
/// the one thread, and no `atfork` handlers run.
pub fn clone_fork(flags: libc::c_int) -> io::Result<Option<libc::pid_t>> {
    let flags = (flags | libc::SIGCHLD) as libc::c_ulong;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: with a NULL stack and without CLONE_VM the child runs on a
    // copy-on-write copy of this stack, exactly as after fork(2). The caller
    // is single-threaded (checked by the hygiene layer), so no lock can be
    // held by a thread that does not exist in the child. The argument order
    // of the remaining (NULL) pointers differs between architectures, which
    // does not matter when all are NULL.
    let rc = check(unsafe { libc::syscall(libc::SYS_clone, flags, null, null, null, null) })?;
    if rc == 0 {
        Ok(None)
    } else {
        Ok(Some(rc as libc::pid_t))
    }
}

/// A program for [`clone_exec`] to execute, and what its child does
/// first, all of it prepared before the clone: the child of a process with
/// other threads may not allocate, take a lock or touch anything another
/// thread could have left half-changed, so it only makes system calls on
/// what is here.
pub struct ExecImage {
    path: CString,
    /// Kept for the pointers in `argv_ptrs` and `envp_ptrs`.
    _strings: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// The child waits for one byte `G` on this fd before anything else
    /// (anything else, or end of file, and it exits with [`NO_GO_EXIT`]).
    pub go: libc::c_int,
    /// Closed in the child first (the parent's end of `go`'s socket, so
    /// that a parent that dies is seen as end of file).
    pub close: libc::c_int,
    /// Open `cgroup.procs` (or `tasks`) files the child joins once it may
    /// go on.
    pub cgroups: Vec<libc::c_int>,
    /// Put on fd 3, without close-on-exec.
    pub protocol: libc::c_int,
    /// Put on fds 0 and 1 (e.g. `/dev/null`).
    pub null: libc::c_int,
}

/// Exit code of a [`clone_exec`] child that was not told to go on.
pub const NO_GO_EXIT: libc::c_int = 125;

impl ExecImage {
    /// `path` executed with `argv` and exactly the environment `env`.
    pub fn new(path: &Path, argv: &[&str], env: &[(&str, &str)]) -> io::Result<ExecImage> {
        let nul = |_| io::Error::new(io::ErrorKind::InvalidInput, "an argument contains NUL");
        let path = cstring(path)?;
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(*a).map_err(nul))
            .collect::<io::Result<_>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")).map_err(nul))
            .collect::<io::Result<_>>()?;
        let (argv_ptrs, envp_ptrs) = (null_terminated(&argv), null_terminated(&envp));
        let mut strings = argv;
        strings.extend(envp);
        Ok(ExecImage {
            path,
            _strings: strings,
            argv_ptrs,
            envp_ptrs,
            go: -1,
            close: -1,
            cgroups: Vec::new(),
            protocol: -1,
            null: -1,
        })
    }
}

/// `clone(flags | SIGCHLD)` with a child that, making only system calls on
/// what `image` holds (so the caller may have other threads): closes
/// `image.close` and every other fd it inherited but 0, 1, 2 and those of
/// `image` (so that it holds none of the caller's files, listening sockets
/// or pipe ends while it waits), sets a parent-death SIGKILL, waits for `G` on
/// `image.go`, joins `image.cgroups`, puts `image.null` on fds 0 and 1
/// and `image.protocol` on fd 3, starts a session, unblocks every signal,
/// gives SIGPIPE its default action back and executes `image`. Returns
/// the child's pid; it exits with [`NO_GO_EXIT`] if not told to go on, 127
/// if a step fails.
pub fn clone_exec(flags: libc::c_int, image: &ExecImage) -> io::Result<libc::pid_t> {
    let flags = (flags | libc::SIGCHLD) as libc::c_ulong;
    let null = std::ptr::null_mut::<libc::c_void>();
    // What the child keeps, sorted, made here: the child may not allocate.
    let mut keep = vec![0, 1, 2, image.go, image.protocol, image.null];
    keep.extend(&image.cgroups);
    keep.retain(|fd| *fd >= 0);
    keep.sort_unstable();
    keep.dedup();
    // SAFETY: with a NULL stack and without CLONE_VM the child runs on a
    // copy-on-write copy of this thread's stack, as after fork(2). It runs
    // only `exec_child`, which makes system calls on memory prepared before
    // the clone and never returns, so no lock another thread held and no
    // allocator state is touched in the child.
    let rc = check(unsafe { libc::syscall(libc::SYS_clone, flags, null, null, null, null) })?;
    if rc == 0 {
        exec_child(image, &keep)
    }
    Ok(rc as libc::pid_t)
}

/// Close every fd but those in `keep` (sorted, without duplicates), with
/// one `close_range(2)` for each gap between them: system calls only, so
/// safe in the child of a clone. Errors are ignored: on a kernel without
/// `close_range` (before 5.9) the fds stay open until the exec, which
/// closes them all (they are close-on-exec).
fn close_all_but(keep: &[libc::c_int]) {
    let mut first: u32 = 0;
    for fd in keep {
        let Ok(fd) = u32::try_from(*fd) else { continue };
        if fd > first {
            // SAFETY: close_range takes plain integers and only closes fds.
            unsafe { libc::syscall(libc::SYS_close_range, first, fd - 1, 0u32) };
        }
        first = fd.saturating_add(1);
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
}

/// The child of [`clone_exec`]. Never returns.
fn exec_child(image: &ExecImage, keep: &[libc::c_int]) -> ! {
    // SAFETY: every call below is a system call (through its libc wrapper,
    // none of which allocates or locks) on integers, on the `image` memory
    // prepared before the clone, or on locals of this frame; the process
    // ends in execve or _exit.
    unsafe {
        let fail = |code: libc::c_int| -> ! { libc::_exit(code) };
        if image.close >= 0 {
            libc::close(image.close);
        }
        close_all_but(keep);
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            fail(127);
        }
        let mut byte = 0u8;
        loop {
            let n = libc::read(image.go, (&mut byte as *mut u8).cast(), 1);
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            if n != 1 || byte != b'G' {
                fail(NO_GO_EXIT);
            }
            break;
        }
        for cg in &image.cgroups {
            if libc::write(*cg, b"0".as_ptr().cast(), 1) != 1 {
                fail(127);
            }
        }
        // Both sources above the targets first, so that neither can be
        // overwritten before it is copied (dup2 leaves the targets without
        // close-on-exec).
        let protocol = libc::fcntl(image.protocol, libc::F_DUPFD_CLOEXEC, 10);
        let null = libc::fcntl(image.null, libc::F_DUPFD_CLOEXEC, 10);
        if protocol < 0
            || null < 0
            || libc::dup2(null, 0) < 0
            || libc::dup2(null, 1) < 0
            || libc::dup2(protocol, crate::sandbox::PROTOCOL_FD) < 0
        {
            fail(127);
        }
        if libc::setsid() < 0 {
            fail(127);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGPIPE, &default, std::ptr::null_mut());
        libc::execve(
            image.path.as_ptr(),
            image.argv_ptrs.as_ptr(),
            image.envp_ptrs.as_ptr(),
        );
        fail(127)
    }
}

/// Stack of a [`clone_vfork`] child: what the sandbox set-up needs, with
/// room to spare (only the pages it touches are ever allocated).
const VFORK_STACK_BYTES: usize = 1 << 20;

/// The child side of [`clone_vfork`]: runs `child` and leaves with its code.
extern "C" fn vfork_trampoline(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&mut &mut dyn FnMut` that clone_vfork passed;
    // it lives in the parent's frame, which stays suspended (CLONE_VFORK)
    // until this process executes a program or exits.
    let child = unsafe { &mut *(arg as *mut &mut dyn FnMut() -> libc::c_int) };
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(127);
    // SAFETY: _exit ends this process at once; it has no preconditions.
    unsafe { libc::_exit(code) }
}

/// `clone(flags | CLONE_VM | CLONE_VFORK | SIGCHLD)`: the child shares this
/// process's memory and runs `child` on a stack of its own, while the
/// calling thread is suspended until the child executes a program or exits
/// (so nothing here runs concurrently with it, as with `vfork`). Nothing of
/// the parent's address space is copied, and the child's exec does not tear
/// a copy down. Returns the child's pid.
///
/// Only for a single-threaded caller. The child must not change state that
/// lives in the shared memory and that the parent relies on afterwards (the
/// environment, buffered stdio); what it allocates stays allocated.
pub fn clone_vfork(
    flags: libc::c_int,
    child: &mut dyn FnMut() -> libc::c_int,
) -> io::Result<libc::pid_t> {
    let page = 4096usize;
    // SAFETY: a fresh private anonymous mapping; no existing memory is
    // touched. Its lowest page is made inaccessible below as a guard.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            VFORK_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let unmap = || {
        // SAFETY: unmapping exactly the mapping made above, once the child
        // no longer runs on it (it has executed a program or exited).
        unsafe { libc::munmap(stack, VFORK_STACK_BYTES) };
    };
    // SAFETY: the first page of our own mapping.
    if unsafe { libc::mprotect(stack, page, libc::PROT_NONE) } < 0 {
        let e = io::Error::last_os_error();
        unmap();
        return Err(e);
    }
    let mut child = child;
    let arg = &mut child as *mut &mut dyn FnMut() -> libc::c_int as *mut libc::c_void;
    // The stack grows down: pass its (16-byte aligned) top.
    // SAFETY: the top of our mapping, one past its last byte.
    let top = unsafe { (stack as *mut u8).add(VFORK_STACK_BYTES) } as *mut libc::c_void;
    let flags = flags | libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    // SAFETY: the trampoline gets `arg`, a pointer into this frame, which
    // outlives the child's use of it: with CLONE_VFORK this call returns
    // only after the child has executed a program or exited. The child runs
    // on its own stack (`top`), so this thread's stack is not disturbed.
    let rc = unsafe { libc::clone(vfork_trampoline, top, flags, arg) };
    let result = if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    };
    unmap();
    result
}

/// Set the effective uid and gid only (the real and saved ids stay), so
/// that a child cloned now is created by `uid`; [`restore_effective_ids`]
/// undoes it. The group goes first, while the uid may still change it.
pub fn set_effective_ids(uid: u32, gid: u32) -> io::Result<()> {
    let keep = libc::uid_t::MAX;
    // SAFETY: integer-only syscalls.
    check_int(unsafe { libc::setresgid(keep, gid, keep) })?;
    // SAFETY: as above.
    if let Err(e) = check_int(unsafe { libc::setresuid(keep, uid, keep) }) {
        // SAFETY: as above; back to the real gid.
        unsafe { libc::setresgid(keep, libc::getgid(), keep) };
        return Err(e);
    }
    Ok(())
}

/// Back to the real uid and gid as effective ids.
pub fn restore_effective_ids() -> io::Result<()> {
    let keep = libc::uid_t::MAX;
    // SAFETY: integer-only syscalls; the real ids are always allowed.
    check_int(unsafe { libc::setresuid(keep, libc::getuid(), keep) })?;
    // SAFETY: as above.
    check_int(unsafe { libc::setresgid(keep, libc::getgid(), keep) }).map(|_| ())
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstring(new_root)?;
    let put_old = cstring(put_old)?;
    // SAFETY: both arguments are valid NUL-terminated strings.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(|_| ())
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set mount attributes on the mount at `path` (and below it when
/// `recursive`). Unlike a `MS_REMOUNT`, this only adds flags, so it also
/// works on mounts whose flags are locked in a user namespace.
pub fn mount_setattr(path: &Path, attr_set: u64, recursive: bool) -> io::Result<()> {
    let c = cstring(path)?;
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } | libc::AT_NO_AUTOMOUNT;
    // SAFETY: path is NUL-terminated, attr is a valid mount_attr of the size
    // passed, and the kernel only reads it.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(|_| ())
}

/// Whether the kernel has `mount_setattr(2)` (Linux 5.12+), which the mount
/// namespace needs to make its binds read-only.
pub fn mount_setattr_available() -> bool {
    // An empty attribute set is rejected (EINVAL) where the call exists and
    // gives ENOSYS where it does not; it never changes anything.
    // SAFETY: NULL attr with size 0 is rejected by the kernel before use.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1i32,
            c"/".as_ptr(),
            0u32,
            std::ptr::null::<libc::c_void>(),
            0usize,
        )
    };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

/// The Landlock ABI version of the running kernel (`None`: no Landlock,
/// either not built in or disabled at boot).
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel only
    // returns the ABI version.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(rc).ok().filter(|v| *v > 0)
}

/// The NULL-terminated array of pointers into `strings` that `execve`
/// takes (valid while `strings` is).
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    let mut p: Vec<*const libc::c_char> = strings.iter().map(|a| a.as_ptr()).collect();
    p.push(std::ptr::null());
    p
}

/// `execve(path, argv, envp)` where `path` is a raw pointer the caller owns
/// (the exec gate's buffer). Returns only on failure.
///
/// # Safety
/// `path` must point to a NUL-terminated string that stays valid for the call.
pub unsafe fn execve_raw(
    path: *const libc::c_char,
    argv: &[CString],
    envp: &[CString],
) -> io::Error {
    let (argv_ptrs, envp_ptrs) = (null_terminated(argv), null_terminated(envp));
    // SAFETY: the caller guarantees `path`; argv and envp are NULL-terminated
    // arrays of pointers into CStrings that outlive the call.
    unsafe { libc::execve(path, argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Number of threads in this process.
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Reset `sig` to its default action, unblock it and send it to this
/// process, to die "the same way" as a child did. Returns if the signal did
/// not end the process.
pub fn die_by_signal(sig: libc::c_int) {
    // Never leave a core file of a privileged process behind.
    let _ = rlimit::setrlimit(rlimit::Resource::CORE, 0, 0);
    // SAFETY: installing SIG_DFL and unblocking are async-signal-safe and
    // take only integer/struct arguments built here.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// The fds `pid` has open, by number.
    fn open_fds(pid: libc::pid_t) -> Vec<i32> {
        let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        fds.sort_unstable();
        fds
    }

    #[test]
    fn a_clone_exec_child_holds_none_of_the_callers_fds_while_it_waits() {
        // What the caller has open besides: a listening socket and the
        // write end of a pipe, both close-on-exec as Rust opens them.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (pipe_r, pipe_w) = crate::sandbox::compat::pipe_cloexec().expect("pipe");
        let (parent_end, child_end) = UnixStream::pair().expect("socketpair");
        let (protocol, _theirs) = UnixStream::pair().expect("socketpair");
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let mut image = ExecImage::new(Path::new("/bin/true"), &["true"], &[]).expect("image");
        image.go = child_end.as_raw_fd();
        image.close = parent_end.as_raw_fd();
        image.protocol = protocol.as_raw_fd();
        image.null = null.as_raw_fd();
        let pid = clone_exec(0, &image).expect("clone");
        drop(child_end);
        // 0, 1 and 2 as far as the test runs with them open.
        let ours = open_fds(std::process::id() as libc::pid_t);
        let mut want: Vec<i32> = [0, 1, 2]
            .into_iter()
            .filter(|fd| ours.contains(fd))
            .chain([image.go, image.protocol, image.null])
            .collect();
        want.sort_unstable();
        // The child closes what it does not keep before it waits for `G`;
        // wait for it to get there (it never goes on without `G`).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seen = open_fds(pid);
        while seen != want && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            seen = open_fds(pid);
        }
        let held = [
            listener.as_raw_fd(),
            pipe_r.as_raw_fd(),
            pipe_w.as_raw_fd(),
            parent_end.as_raw_fd(),
        ];
        (&parent_end).write_all(b"G").expect("go");
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        assert_eq!(
            seen, want,
            "the waiting child's fds (the caller's listener, pipe ends and its end of `go` are {held:?})"
        );
        assert!(
            matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))),
            "{status:?}"
        );
    }
}
