//! One JSON message per `SOCK_SEQPACKET` packet, with file descriptors
//! attached (`SCM_RIGHTS`): the control channel of the Rhai fork server and
//! of the Python zygotes.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Largest control packet (a setup message carries a whole sandbox plan).
pub const MAX_PACKET_BYTES: usize = 1 << 20;

/// Send one JSON packet with `fds` attached.
pub fn send<T: Serialize>(fd: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let data = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if data.len() > MAX_PACKET_BYTES {
        return Err(io::Error::other(format!(
            "a control message of {} bytes exceeds {MAX_PACKET_BYTES}",
            data.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &[IoSlice::new(&data)],
            &cmsgs,
            super::compat::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receive one JSON packet and its fds. `Ok(None)`: the peer closed.
/// A truncated packet or truncated fd list is an error (the fds that did
/// arrive are closed).
pub fn recv<T: DeserializeOwned>(
    fd: BorrowedFd<'_>,
    max: usize,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    recv_with(fd, max, MsgFlags::empty())
}

/// [`recv`] without blocking: `WouldBlock` when no packet is waiting (for
/// a caller driven by readiness, e.g. tokio's `AsyncFd`).
pub fn try_recv<T: DeserializeOwned>(
    fd: BorrowedFd<'_>,
    max: usize,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    recv_with(fd, max, MsgFlags::MSG_DONTWAIT)
}

fn recv_with<T: DeserializeOwned>(
    fd: BorrowedFd<'_>,
    max: usize,
    extra: MsgFlags,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    // Size the buffer to the packet waiting (MSG_PEEK|MSG_TRUNC reports a
    // seqpacket's whole length) instead of zeroing the largest one per call.
    let cap = max.min(MAX_PACKET_BYTES);
    let waiting = loop {
        match nix::sys::socket::recv(
            fd.as_raw_fd(),
            &mut [],
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC | extra,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // One byte more than allowed, so an oversized packet shows as truncated.
    let mut buf = vec![0u8; waiting.min(cap) + 1];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let (n, fds, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            super::compat::MSG_CMSG_CLOEXEC | extra,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for r in raw {
                            // SAFETY: SCM_RIGHTS just installed `r` in our fd
                            // table; nothing else owns it.
                            let fd = unsafe { OwnedFd::from_raw_fd(r) };
                            super::compat::cloexec_received(&fd)?;
                            fds.push(fd);
                        }
                    }
                }
                let truncated = msg
                    .flags
                    .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
                break (msg.bytes, fds, truncated);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if truncated {
        return Err(io::Error::other("a control message was truncated"));
    }
    if n == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..n]).map_err(io::Error::other)?;
    Ok(Some((msg, fds)))
}
