//! The reader of a stdio MCP server's stdout: it passes each JSON-RPC line
//! on to rmcp's transport and stops at the first line that is not one.
//!
//! rmcp's stdio transport skips a line it cannot parse, so a server that
//! writes its log or a banner on stdout would leave a call waiting for its
//! whole timeout. A well-behaved MCP server writes nothing but JSON-RPC
//! messages on stdout, so the first line that is not one ends the
//! connection at once: the reader records it, closes the stream rmcp reads
//! (the call in flight, or the handshake, fails now) and the server is
//! started again on the next call. A line is read up to a cap; a longer one
//! ends the connection the same way, so no more than the cap is buffered.

use serde::Deserialize;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader, DuplexStream};

/// Bytes of an offending line quoted in the error.
const EXCERPT_BYTES: usize = 200;
/// The least of the cap on one line read from a server.
pub const MIN_LINE_CAP: usize = 4 * 1024 * 1024;
/// Bytes buffered between the reader and rmcp's transport.
const PIPE_BYTES: usize = 64 * 1024;

/// The cap on one line from a server whose results may be `max_output`
/// bytes: room for the result escaped inside a JSON-RPC reply, at least
/// [`MIN_LINE_CAP`] (a long tool list).
pub fn line_cap(max_output: usize) -> usize {
    max_output
        .saturating_mul(4)
        .saturating_add(64 * 1024)
        .max(MIN_LINE_CAP)
}

/// What ended a connection: set once by the reader, read by a call that
/// failed.
pub type Fault = Arc<OnceLock<String>>;

/// Deepest nesting of arrays and objects a message may have: what the
/// JSON parser of rmcp reads (serde_json's recursion limit). A deeper one
/// would be skipped there without a word, leaving its call to time out.
pub const MAX_DEPTH: usize = 128;

/// Most JSON values (objects, arrays, scalars) one message may hold. A
/// parsed value takes some hundred bytes of memory whatever its text (a
/// 16 MiB message of `[{},{},...]` would take over a gigabyte), so a
/// message of more is refused before it is parsed: at most about 40 MiB
/// held for one, where a tool list of 1024 tools with rich schemas has
/// some tens of thousands, and a result of `max_output_bytes` (256 KiB)
/// at most 131,072.
pub const MAX_VALUES: usize = 1 << 18;

/// Why a line is not passed on.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    NotJson(String),
    NotJsonRpc,
    TooDeep,
    TooMany,
}

/// What makes a JSON text too costly to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooCostly {
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    Deep,
    /// More than [`MAX_VALUES`] values.
    Many,
}

impl TooCostly {
    /// Why a message is not read, for an error.
    pub fn why(self) -> String {
        match self {
            TooCostly::Deep => format!("a message nested deeper than {MAX_DEPTH} levels"),
            TooCostly::Many => format!("a message of more than {MAX_VALUES} JSON values"),
        }
    }
}

/// Whether the JSON text `line` nests arrays and objects deeper than
/// [`MAX_DEPTH`] or holds more than [`MAX_VALUES`] values (each element of
/// an array and member of an object counted, as the commas and the
/// non-empty brackets outside strings show them), found in one pass before
/// anything is parsed (brackets and commas inside strings do not count).
pub fn too_costly(line: &[u8]) -> Option<TooCostly> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut values, mut opened) = (1usize, false);
    for &b in line {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        // The first element of a container that is not empty.
        if opened && !b.is_ascii_whitespace() {
            opened = false;
            if b != b']' && b != b'}' {
                values += 1;
            }
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(TooCostly::Deep);
                }
                opened = true;
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' => values += 1,
            _ => {}
        }
        if values > MAX_VALUES {
            return Some(TooCostly::Many);
        }
    }
    None
}

/// The envelope every JSON-RPC 2.0 message has; the rest of the line is
/// checked to be JSON without being kept.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
}

/// Whether a line (without its newline) is a JSON-RPC message: `Ok(true)`
/// to pass on, `Ok(false)` for a blank line (skipped, as rmcp does).
fn check(line: &[u8]) -> Result<bool, Bad> {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(false);
    }
    match too_costly(line) {
        Some(TooCostly::Deep) => return Err(Bad::TooDeep),
        Some(TooCostly::Many) => return Err(Bad::TooMany),
        None => {}
    }
    match serde_json::from_slice::<Envelope>(line) {
        Err(e) if e.is_syntax() || e.is_eof() => Err(Bad::NotJson(e.to_string())),
        // An object is the only JSON a message can be (a derived struct
        // also accepts an array).
        Ok(Envelope { jsonrpc: Some(v) }) if v == "2.0" && line.starts_with(b"{") => Ok(true),
        _ => Err(Bad::NotJsonRpc),
    }
}

/// The start of `line`, redacted (whole, before it is cut: a cut secret
/// leaves a prefix no redaction recognises) and escaped, for an error
/// message.
pub fn excerpt(line: &[u8]) -> String {
    let redacted = crate::secrets::redact_bytes(line);
    let head = &redacted[..redacted.len().min(EXCERPT_BYTES)];
    let text = format!("{:?}", String::from_utf8_lossy(head));
    if line.len() > EXCERPT_BYTES {
        format!("{text}... ({} bytes in all)", line.len())
    } else {
        text
    }
}

/// Read `from` (a server's stdout) line by line, passing JSON-RPC lines to
/// the returned stream; the first other line, or one over `cap` bytes, is
/// described in `fault` and closes the stream.
pub fn tap<R>(server: &str, from: R, cap: usize, fault: &Fault) -> DuplexStream
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (rmcp_end, ours) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(forward(server.to_owned(), from, ours, fault.clone(), cap));
    rmcp_end
}

async fn forward<R>(server: String, from: R, mut to: DuplexStream, fault: Fault, cap: usize)
where
    R: AsyncRead + Unpin,
{
    let mut reader = BufReader::with_capacity(PIPE_BYTES, from);
    let mut line = Vec::new();
    loop {
        let (take, ended) = {
            let Ok(buf) = reader.fill_buf().await else {
                return;
            };
            if buf.is_empty() {
                // EOF: rmcp sees it when `to` is dropped.
                return;
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.map_or(buf.len(), |i| i + 1);
            if line.len().saturating_add(take) > cap {
                line.extend_from_slice(&buf[..take.min(EXCERPT_BYTES)]);
                let _ = fault.set(format!(
                    "upstream {server} wrote a line of more than {cap} bytes on stdout, over the \
                     most read from it (4 x max_output_bytes + 64 KiB, at least {MIN_LINE_CAP}): {}",
                    excerpt(&line)
                ));
                tracing::warn!("{}", fault.get().map_or("", String::as_str));
                return;
            }
            line.extend_from_slice(&buf[..take]);
            (take, newline.is_some())
        };
        reader.consume(take);
        if !ended {
            continue;
        }
        match check(&line) {
            Ok(true) => {
                if to.write_all(&line).await.is_err() {
                    return;
                }
            }
            Ok(false) => {}
            Err(bad @ (Bad::TooDeep | Bad::TooMany)) => {
                let what = if bad == Bad::TooDeep {
                    TooCostly::Deep
                } else {
                    TooCostly::Many
                };
                let _ = fault.set(format!(
                    "upstream {server} wrote {}, the most read: {}",
                    what.why(),
                    excerpt(line.strip_suffix(b"\n").unwrap_or(&line))
                ));
                tracing::warn!("{}", fault.get().map_or("", String::as_str));
                return;
            }
            Err(bad) => {
                let why = match bad {
                    Bad::NotJson(e) => format!("not JSON: {e}"),
                    Bad::NotJsonRpc | Bad::TooDeep | Bad::TooMany => {
                        "JSON, but not a JSON-RPC 2.0 message".to_owned()
                    }
                };
                let _ = fault.set(format!(
                    "upstream {server} wrote output that is not JSON-RPC: {} ({why}; an MCP \
                     server writes only JSON-RPC messages on stdout, its log belongs on stderr)",
                    excerpt(line.strip_suffix(b"\n").unwrap_or(&line))
                ));
                tracing::warn!("{}", fault.get().map_or("", String::as_str));
                return;
            }
        }
        line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn lines_are_checked() {
        assert_eq!(check(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), Ok(true));
        assert_eq!(check(b"\xEF\xBB\xBF{\"jsonrpc\": \"2.0\"}\r"), Ok(true));
        assert_eq!(check(b"  \r"), Ok(false));
        assert!(matches!(check(b"starting up"), Err(Bad::NotJson(_))));
        assert!(matches!(
            check(b"{\"jsonrpc\": \"2.0\""),
            Err(Bad::NotJson(_))
        ));
        assert_eq!(check(br#"{"hello": "world"}"#), Err(Bad::NotJsonRpc));
        assert_eq!(check(br#"{"jsonrpc": 2}"#), Err(Bad::NotJsonRpc));
        assert_eq!(check(br#"["2.0"]"#), Err(Bad::NotJsonRpc));
        assert_eq!(check(b"42"), Err(Bad::NotJsonRpc));
        let deep = |n: usize| {
            format!(
                "{{\"jsonrpc\":\"2.0\",\"result\":{}1{}}}",
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert_eq!(check(deep(MAX_DEPTH - 1).as_bytes()), Ok(true));
        assert_eq!(check(deep(MAX_DEPTH).as_bytes()), Err(Bad::TooDeep));
        let many = |n: usize| {
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[{}]}}",
                vec!["{}"; n].join(",")
            )
        };
        assert_eq!(check(many(MAX_VALUES - 10).as_bytes()), Ok(true));
        assert_eq!(check(many(MAX_VALUES).as_bytes()), Err(Bad::TooMany));
        // Commas and brackets inside strings are not values.
        let text = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"{}\"}}",
            ",".repeat(MAX_VALUES * 2)
        );
        assert_eq!(check(text.as_bytes()), Ok(true));
        // Brackets in strings (escaped quotes too) do not count.
        let quoted = format!("{{\"jsonrpc\":\"2.0\",\"s\":\"\\\"{}\"}}", "[".repeat(500));
        assert_eq!(check(quoted.as_bytes()), Ok(true));
    }

    #[test]
    fn excerpts_are_escaped_and_cut() {
        assert_eq!(excerpt(b"a\"b\x1b"), r#""a\"b\u{1b}""#);
        let long = vec![b'x'; 1000];
        let e = excerpt(&long);
        assert!(e.ends_with("... (1000 bytes in all)"), "{e}");
        assert!(e.len() < 260, "{e}");
    }

    async fn through(input: &'static [u8], cap: usize) -> (Vec<u8>, Option<String>) {
        let fault = Fault::default();
        let mut out = tap("s", input, cap, &fault);
        let mut got = Vec::new();
        let _ = out.read_to_end(&mut got).await;
        (got, fault.get().cloned())
    }

    #[tokio::test]
    async fn json_rpc_passes_and_the_first_other_line_ends_the_stream() {
        let (got, fault) = through(
            b"{\"jsonrpc\":\"2.0\",\"id\":1}\n\n{\"jsonrpc\":\"2.0\",\"id\":2}\nnoise\n{\"jsonrpc\":\"2.0\"}\n",
            1024,
        )
        .await;
        assert_eq!(
            got,
            b"{\"jsonrpc\":\"2.0\",\"id\":1}\n{\"jsonrpc\":\"2.0\",\"id\":2}\n"
        );
        let f = fault.unwrap_or_default();
        assert!(
            f.contains("upstream s wrote output that is not JSON-RPC: \"noise\""),
            "{f}"
        );
        let (got, fault) = through(b"{\"jsonrpc\":\"2.0\",\"id\":1}\n", 1024).await;
        assert_eq!(got.len(), 25);
        assert_eq!(fault, None);
    }

    #[tokio::test]
    async fn a_line_over_the_cap_ends_the_stream() {
        static LONG: [u8; 5000] = [b'x'; 5000];
        let (got, fault) = through(&LONG, 1000).await;
        assert!(got.is_empty());
        let f = fault.unwrap_or_default();
        assert!(f.contains("a line of more than 1000 bytes"), "{f}");
        assert!(f.contains("\"xxxx"), "{f}");
    }
}
