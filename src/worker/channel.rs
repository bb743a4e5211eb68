//! The worker's end of the protocol channel (blocking I/O).

use crate::protocol::{
    read_frame_blocking, write_frame_blocking, FrameError, FromWorker, ToWorker,
};
use std::os::unix::net::UnixStream;

pub(crate) struct Channel {
    stream: UnixStream,
    max_frame: usize,
    next_id: u64,
}

impl Channel {
    pub(crate) fn new(stream: UnixStream, max_frame: usize) -> Self {
        Channel {
            stream,
            max_frame,
            next_id: 1,
        }
    }

    pub(crate) fn stream(&mut self) -> &mut UnixStream {
        &mut self.stream
    }

    pub(crate) fn into_stream(self) -> UnixStream {
        self.stream
    }

    pub(crate) fn set_max_frame(&mut self, max: usize) {
        self.max_frame = max;
    }

    pub(crate) fn send(&mut self, msg: &FromWorker) -> Result<(), FrameError> {
        write_frame_blocking(&mut self.stream, msg, self.max_frame)
    }

    pub(crate) fn recv(&mut self) -> Result<ToWorker, FrameError> {
        read_frame_blocking(&mut self.stream, self.max_frame)
    }

    /// Whether a frame (or the channel's end) is there to be read now. An
    /// error counts as something there: the read that follows says what.
    pub(crate) fn readable_now(&self) -> bool {
        use std::os::fd::AsFd;
        let flags = nix::poll::PollFlags::POLLIN;
        let mut fds = [nix::poll::PollFd::new(self.stream.as_fd(), flags)];
        !matches!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO),
            Ok(0)
        )
    }

    /// Wait until the supervisor closes the channel (what it sends
    /// meanwhile is not for a cell that is over, and is dropped).
    pub(crate) fn wait_closed(&mut self) {
        use std::io::Read;
        let mut buf = [0u8; 512];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}
