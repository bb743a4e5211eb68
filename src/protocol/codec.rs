//! Length-prefixed JSON frames.

use serde::{de::DeserializeOwned, Serialize};
use std::io::{Read, Write};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Size of the big-endian length prefix.
pub const LEN_PREFIX: usize = 4;
/// Default cap on one frame's body.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// Everything that can be wrong with a frame. Each kind of malformation has
/// its own variant so callers (and tests) can tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("peer closed the channel")]
    Closed,
    #[error("frame truncated: expected {expected} bytes, got {got}")]
    Truncated { expected: usize, got: usize },
    #[error("frame body stalled: {got} of {expected} bytes arrived in time")]
    Stalled { expected: usize, got: usize },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    Oversize { len: usize, max: usize },
    #[error("frame is not valid UTF-8: {0}")]
    InvalidUtf8(#[source] std::str::Utf8Error),
    #[error("frame is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("frame is not a JSON object with a string \"t\" tag")]
    MissingTag,
    #[error("unknown message tag {0:?}")]
    UnknownTag(String),
    #[error("malformed {tag:?} message: {source}")]
    BadShape {
        tag: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("failed to serialize a frame: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("failed to {op} the protocol channel: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A message type that knows its set of tags, so an unknown tag and a known
/// tag with a bad body give different errors.
pub trait Tagged: Serialize + DeserializeOwned {
    const TAGS: &'static [&'static str];

    /// The message of tag `tag`, read from `fields` (what follows the tag
    /// in the frame, see [`read_fields`]) straight into that variant's own
    /// type: serde reads a tagged enum by copying the whole frame into a
    /// buffer of its own first, which a frame carrying a session's
    /// variables pays for in time and memory. `None` for a tag this type
    /// does not read this way.
    fn variant(_tag: &str, _fields: &[u8]) -> Option<serde_json::Result<Self>> {
        None
    }
}

/// A frame as this codec writes it, `{"t":"<tag>",<fields>}`: its tag (one
/// without escapes), and what follows it (`,"<first key>…}` or `}`; a
/// comma before no key is not JSON, and is left to the strict parse).
pub(super) fn split_tag(body: &[u8]) -> Option<(&str, &[u8])> {
    let rest = body.strip_prefix(br#"{"t":""#)?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    let tag = std::str::from_utf8(&rest[..end]).ok()?;
    let after = rest.get(end..)?.strip_prefix(b"\"")?;
    let well_formed = after.starts_with(b"}") || after.starts_with(b",\"");
    well_formed.then_some((tag, after))
}

/// The fields that follow a frame's tag (see [`split_tag`]), read as an
/// object of their own into `T`.
pub(super) fn read_fields<T: DeserializeOwned>(after_tag: &[u8]) -> serde_json::Result<T> {
    let mut fields = Vec::with_capacity(after_tag.len() + 1);
    fields.push(b'{');
    fields.extend_from_slice(after_tag.strip_prefix(b",").unwrap_or(after_tag));
    serde_json::from_slice(&fields)
}

/// Encode a message as one frame (prefix + body).
pub fn encode_frame<M: Serialize>(msg: &M, max: usize) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg).map_err(FrameError::Encode)?;
    if body.len() > max {
        return Err(FrameError::Oversize {
            len: body.len(),
            max,
        });
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::Oversize {
        len: body.len(),
        max,
    })?;
    let mut out = Vec::with_capacity(LEN_PREFIX + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Parse a frame body strictly into `M`.
pub fn decode_body<M: Tagged>(body: &[u8]) -> Result<M, FrameError> {
    // A well-formed frame (every frame of a worker that keeps to the
    // protocol) is parsed once, straight into its type. Only one that is
    // not takes the slower way below, which says what is wrong with it.
    // (An object only: serde would also take a tagged enum written as an
    // array, which this protocol does not speak.)
    if let Some((tag, fields)) = split_tag(body) {
        if let Some(Ok(m)) = M::variant(tag, fields) {
            return Ok(m);
        }
    }
    if body.trim_ascii_start().first() == Some(&b'{') {
        if let Ok(m) = serde_json::from_slice::<M>(body) {
            return Ok(m);
        }
    }
    let text = std::str::from_utf8(body).map_err(FrameError::InvalidUtf8)?;
    let value: serde_json::Value = serde_json::from_str(text).map_err(FrameError::InvalidJson)?;
    let tag = match value.get("t").and_then(|t| t.as_str()) {
        Some(t) if value.is_object() => t.to_owned(),
        _ => return Err(FrameError::MissingTag),
    };
    if !M::TAGS.contains(&tag.as_str()) {
        return Err(FrameError::UnknownTag(tag));
    }
    serde_json::from_value(value).map_err(|source| FrameError::BadShape { tag, source })
}

fn check_len(prefix: [u8; LEN_PREFIX], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(FrameError::Oversize { len, max });
    }
    Ok(len)
}

/// Read exactly `buf.len()` bytes; `Ok(n)` with `n < len` means EOF after `n`.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(FrameError::Io { op: "read", source }),
        }
    }
    Ok(got)
}

/// Read one frame from a blocking reader (worker side).
pub fn read_frame_blocking<M: Tagged, R: Read>(r: &mut R, max: usize) -> Result<M, FrameError> {
    let mut prefix = [0u8; LEN_PREFIX];
    let got = read_full(r, &mut prefix)?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < LEN_PREFIX {
        return Err(FrameError::Truncated {
            expected: LEN_PREFIX,
            got,
        });
    }
    let len = check_len(prefix, max)?;
    let mut body = vec![0u8; len];
    let got = read_full(r, &mut body)?;
    if got < len {
        return Err(FrameError::Truncated { expected: len, got });
    }
    decode_body(&body)
}

/// Write one frame to a blocking writer (worker side).
pub fn write_frame_blocking<M: Serialize, W: Write>(
    w: &mut W,
    msg: &M,
    max: usize,
) -> Result<(), FrameError> {
    let frame = encode_frame(msg, max)?;
    w.write_all(&frame)
        .and_then(|()| w.flush())
        .map_err(|source| FrameError::Io {
            op: "write",
            source,
        })
}

/// Read one frame from an async reader (supervisor side). The body buffer is
/// only allocated once the length passed the cap.
pub async fn read_frame_async<M: Tagged, R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<M, FrameError> {
    read_frame_async_within(r, max, None).await
}

/// Like [`read_frame_async`], but once a frame has begun its body must
/// arrive within `body_within`: a peer that sends a length prefix and then
/// stalls gets [`FrameError::Stalled`] instead of holding the reader.
pub async fn read_frame_async_within<M: Tagged, R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    body_within: Option<std::time::Duration>,
) -> Result<M, FrameError> {
    FrameReader::new(r, max, body_within).next().await
}

/// Frames read one after another from an async reader, with the checks of
/// [`read_frame_async_within`] (the length against the cap before the body
/// is allocated; the body within `body_within` once its length came).
///
/// [`FrameReader::next`] is cancel-safe: dropped at any await (a branch of
/// `select!` that lost), it loses nothing, since what arrived of a frame
/// stays here for the next call. So one task can read a peer's frames
/// beside its other work, with no reader task and channel between them.
/// After an error it reads no more: every later call is
/// [`FrameError::Closed`].
pub struct FrameReader<R> {
    r: R,
    max: usize,
    body_within: Option<std::time::Duration>,
    prefix: [u8; LEN_PREFIX],
    /// Bytes of the prefix, or of the body once there is one, read so far.
    got: usize,
    /// The body being read and when it must be complete.
    body: Option<(Vec<u8>, Option<tokio::time::Instant>)>,
    failed: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(r: R, max: usize, body_within: Option<std::time::Duration>) -> FrameReader<R> {
        FrameReader {
            r,
            max,
            body_within,
            prefix: [0; LEN_PREFIX],
            got: 0,
            body: None,
            failed: false,
        }
    }

    /// Whether an error ended the reading.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The next frame (cancel-safe, see the type's docs).
    pub async fn next<M: Tagged>(&mut self) -> Result<M, FrameError> {
        if self.failed {
            return Err(FrameError::Closed);
        }
        let r = self.read_one().await;
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    async fn read_one<M: Tagged>(&mut self) -> Result<M, FrameError> {
        let io = |source| FrameError::Io { op: "read", source };
        loop {
            let FrameReader {
                r,
                max,
                body_within,
                prefix,
                got,
                body,
                ..
            } = self;
            let Some((buf, at)) = body else {
                let n = r.read(&mut prefix[*got..]).await.map_err(io)?;
                if n == 0 {
                    return Err(if *got == 0 {
                        FrameError::Closed
                    } else {
                        FrameError::Truncated {
                            expected: LEN_PREFIX,
                            got: *got,
                        }
                    });
                }
                *got += n;
                if *got == LEN_PREFIX {
                    let len = check_len(*prefix, *max)?;
                    let at = body_within.map(|t| tokio::time::Instant::now() + t);
                    *body = Some((vec![0u8; len], at));
                    *got = 0;
                }
                continue;
            };
            let len = buf.len();
            if *got == len {
                let done = std::mem::take(buf);
                *body = None;
                *got = 0;
                return decode_body(&done);
            }
            let read = r.read(&mut buf[*got..]);
            let n = match at {
                Some(at) => match tokio::time::timeout_at(*at, read).await {
                    Ok(n) => n.map_err(io)?,
                    Err(_) => {
                        return Err(FrameError::Stalled {
                            expected: len,
                            got: *got,
                        })
                    }
                },
                None => read.await.map_err(io)?,
            };
            if n == 0 {
                return Err(FrameError::Truncated {
                    expected: len,
                    got: *got,
                });
            }
            *got += n;
        }
    }
}

/// Write one frame to an async writer (supervisor side).
pub async fn write_frame_async<M: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &M,
    max: usize,
) -> Result<(), FrameError> {
    let frame = encode_frame(msg, max)?;
    w.write_all(&frame).await.map_err(|source| FrameError::Io {
        op: "write",
        source,
    })?;
    w.flush().await.map_err(|source| FrameError::Io {
        op: "write",
        source,
    })
}
