//! The pipe protocol between the supervisor and a worker.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
//! JSON: one object with a `"t"` tag naming the message. The codec here has no
//! I/O policy: it turns bytes into typed messages and back, checks the length
//! against a caller-given maximum *before* allocating, and parses strictly, so
//! a hostile worker can only ever produce a [`FrameError`].
//!
//! Conversation for one cell:
//! ```text
//! supervisor                         worker
//!   setup {sandbox plan}      ──▶
//!                             ◀──   ready {sandbox report} | sandbox_error
//!   start {code, vars, ...}   ──▶
//!                             ◀──   call {id, cap, args}   (any number)
//!   reply {id, ok|error}      ──▶
//!                             ◀──   emit / log             (any number)
//!                             ◀──   done {status, value, vars, error}
//! ```

mod codec;
mod messages;

pub use codec::{
    decode_body, encode_frame, read_frame_async, read_frame_blocking, write_frame_async,
    write_frame_blocking, FrameError, DEFAULT_MAX_FRAME_BYTES, LEN_PREFIX,
};
pub use messages::*;

/// The fd on which a worker finds its protocol channel.
pub const PROTOCOL_FD: i32 = 3;
