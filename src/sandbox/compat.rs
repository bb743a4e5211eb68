//! The few process primitives that differ between Linux and macOS, behind
//! one name each, so the code that uses them builds on both. Linux keeps
//! exactly the calls it made before; macOS gets the nearest equivalent.

use nix::sys::socket::MsgFlags;
use std::io;
use std::os::fd::OwnedFd;

/// `send` flags for a packet: no SIGPIPE on a closed peer. macOS has no
/// such flag; Rust programs ignore SIGPIPE there (the error comes back as
/// EPIPE all the same).
#[cfg(target_os = "linux")]
pub const MSG_NOSIGNAL: MsgFlags = MsgFlags::MSG_NOSIGNAL;
#[cfg(not(target_os = "linux"))]
pub const MSG_NOSIGNAL: MsgFlags = MsgFlags::empty();

/// `recvmsg` flags: received descriptors close-on-exec. On macOS they are
/// made so just after they arrive ([`cloexec_received`]).
#[cfg(target_os = "linux")]
pub const MSG_CMSG_CLOEXEC: MsgFlags = MsgFlags::MSG_CMSG_CLOEXEC;
#[cfg(not(target_os = "linux"))]
pub const MSG_CMSG_CLOEXEC: MsgFlags = MsgFlags::empty();

/// Make a descriptor received over a socket close-on-exec where the
/// receive could not (a no-op on Linux).
pub fn cloexec_received(fd: &OwnedFd) -> io::Result<()> {
    if cfg!(target_os = "linux") {
        return Ok(());
    }
    set_cloexec(fd)
}

fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map(drop)
        .map_err(io::Error::from)
}

/// A pipe whose both ends are close-on-exec: `(read, write)`.
pub fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    #[cfg(target_os = "linux")]
    {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // No pipe2: the window before the flags are set is harmless in the
        // supervisor, which starts its children with std (which closes
        // every descriptor not meant for them in the child) or fork+exec
        // from a single thread.
        let (r, w) = nix::unistd::pipe().map_err(io::Error::from)?;
        set_cloexec(&r)?;
        set_cloexec(&w)?;
        Ok((r, w))
    }
}

/// A connected pair of `SOCK_SEQPACKET` sockets, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    #[cfg(target_os = "linux")]
    let flags = SockFlag::SOCK_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = SockFlag::empty();
    let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, flags)
        .map_err(io::Error::from)?;
    if !cfg!(target_os = "linux") {
        set_cloexec(&a)?;
        set_cloexec(&b)?;
    }
    Ok((a, b))
}

/// Name the calling thread (`comm` on Linux, what `ps` shows); nothing on
/// macOS, where a process cannot rename itself this way.
pub fn set_name(name: &std::ffi::CStr) {
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_name(name);
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}

/// A kqueue that becomes readable when `pid` exits (macOS's stand-in for
/// a pidfd).
#[cfg(target_os = "macos")]
pub fn exit_kqueue(pid: i32) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: kqueue takes no arguments and returns a new fd or -1.
    let kq = unsafe { libc::kqueue() };
    if kq < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `kq` to us; nothing else owns it.
    let kq = unsafe { OwnedFd::from_raw_fd(kq) };
    let pid_ident = usize::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let change = libc::kevent {
        ident: pid_ident,
        filter: libc::EVFILT_PROC,
        flags: libc::EV_ADD | libc::EV_ONESHOT,
        fflags: libc::NOTE_EXIT,
        data: 0,
        udata: std::ptr::null_mut(),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: one change record read from `change`; no event list.
    let rc = unsafe {
        libc::kevent(
            kq.as_raw_fd(),
            &change,
            1,
            std::ptr::null_mut(),
            0,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(kq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_and_pairs_are_close_on_exec() {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let (r, w) = pipe_cloexec().unwrap();
        let (a, b) = seqpacket_pair().unwrap();
        for fd in [&r, &w, &a, &b] {
            let flags = FdFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFD).unwrap());
            assert!(flags.contains(FdFlag::FD_CLOEXEC));
        }
    }
}
