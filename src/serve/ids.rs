//! Request ids rmcp cannot hold, over stdio.
//!
//! JSON-RPC lets a request's id be any number; rmcp keeps a numeric id as
//! an `i64`. A request whose id is a fraction (`1.5`) or an integer past
//! `i64` (`18446744073709551615`) does not read, and rmcp answers it with
//! an error that carries no id, so the client waiting on that id waits
//! forever.
//!
//! Here, over stdio, such a request goes to rmcp with its id swapped for a
//! string token ([`IdSwap::admit`]); [`Restoring`], around rmcp's writer,
//! puts the original id text back into the reply that carries the token.
//! The request is then served like any other (a `ping` gets its `{}`). The
//! tokens carry a random part chosen when the server starts, so a client
//! cannot name one; at most [`MAX_HELD`] are held at once (past that, a
//! request keeps its id and gets rmcp's answer). Over HTTP the listener
//! answers such a request itself, with its id (see `jsonrpc`).

use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWrite;

/// Swapped ids held at once (each is let go when its reply is written).
pub const MAX_HELD: usize = 1024;

/// The ids swapped for tokens, until their replies are written.
pub struct IdSwap {
    /// `"id":"cellbox-id-<random>-`: what a reply carrying a token starts
    /// its id with.
    needle: String,
    prefix: String,
    next: AtomicU64,
    held: Mutex<HashMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

/// Whether rmcp reads `raw` (an id's JSON text) as an id: a string, or an
/// integer within `i64`.
fn readable(raw: &str) -> bool {
    raw.starts_with('"') || raw.parse::<i64>().is_ok()
}

impl IdSwap {
    pub fn new() -> Arc<IdSwap> {
        use std::hash::BuildHasher;
        let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        let prefix = format!("cellbox-id-{random:016x}-");
        Arc::new(IdSwap {
            needle: format!("\"id\":\"{prefix}"),
            prefix,
            next: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        crate::util::lock(&self.held)
    }

    /// Whether any id is swapped now.
    pub fn holding(&self) -> bool {
        !self.held().is_empty()
    }

    /// `line` (one JSON-RPC message) with its id swapped for a token, when
    /// the id is a number rmcp cannot hold; `None` when there is nothing to
    /// swap (or too many are held already).
    pub fn admit(&self, line: &[u8]) -> Option<Vec<u8>> {
        let raw = serde_json::from_slice::<IdOnly>(line)
            .ok()?
            .id?
            .get()
            .to_owned();
        if readable(&raw) || !raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return None;
        }
        let mut value: Value = serde_json::from_slice(line).ok()?;
        let obj = value.as_object_mut()?;
        let mut held = self.held();
        if held.len() >= MAX_HELD {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let token = format!("{}{n}", self.prefix);
        obj.insert("id".into(), Value::String(token.clone()));
        held.insert(token, raw);
        let mut text = value.to_string().into_bytes();
        text.push(b'\n');
        Some(text)
    }

    /// `line` (one reply) with a token in its id replaced by the id it
    /// stood for.
    fn restore(&self, line: Vec<u8>) -> Vec<u8> {
        let Some(at) = find(&line, self.needle.as_bytes()) else {
            return line;
        };
        let start = at + "\"id\":".len();
        let Some(len) = line[start + 1..].iter().position(|b| *b == b'"') else {
            return line;
        };
        let end = start + 1 + len + 1;
        let token = String::from_utf8_lossy(&line[start + 1..end - 1]).into_owned();
        let Some(raw) = self.held().remove(&token) else {
            return line;
        };
        let mut out = Vec::with_capacity(line.len() + raw.len());
        out.extend_from_slice(&line[..start]);
        out.extend_from_slice(raw.as_bytes());
        out.extend_from_slice(&line[end..]);
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// rmcp's writer, with swapped ids put back (see the module doc). While no
/// id is swapped, writes pass straight through; while one is, whole lines
/// are kept until their newline and rewritten.
pub struct Restoring<W> {
    inner: W,
    swap: Arc<IdSwap>,
    /// The part of a line seen so far.
    line: Vec<u8>,
    /// Finished lines not yet written to `inner`, from `sent`.
    out: Vec<u8>,
    sent: usize,
}

impl<W> Restoring<W> {
    pub fn new(inner: W, swap: Arc<IdSwap>) -> Restoring<W> {
        Restoring {
            inner,
            swap,
            line: Vec::new(),
            out: Vec::new(),
            sent: 0,
        }
    }
}

impl<W: AsyncWrite + Unpin> Restoring<W> {
    /// Write out what is kept in `out`.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Move a line without its newline to `out` once no token can be in it.
    fn release_partial(&mut self) {
        if !self.line.is_empty() && !self.swap.holding() {
            self.out.append(&mut self.line);
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Restoring<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if this.line.is_empty() && !this.swap.holding() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        this.line.extend_from_slice(buf);
        while let Some(i) = this.line.iter().position(|b| *b == b'\n') {
            let rest = this.line.split_off(i + 1);
            let whole = std::mem::replace(&mut this.line, rest);
            let restored = this.swap.restore(whole);
            this.out.extend_from_slice(&restored);
        }
        // Start writing; what does not go now goes on the next call.
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.release_partial();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.out.append(&mut this.line);
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn only_ids_rmcp_cannot_hold_are_swapped() {
        let swap = IdSwap::new();
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":"1.5","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"not json"#,
        ] {
            assert_eq!(swap.admit(line.as_bytes()), None, "{line}");
        }
        assert!(!swap.holding());
        for id in [
            "1.5",
            "18446744073709551615",
            "-1e3",
            "123456789012345678901234567890",
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let swapped = swap.admit(line.as_bytes()).unwrap();
            let v: Value = serde_json::from_slice(&swapped).unwrap();
            assert!(v["id"].as_str().unwrap().starts_with("cellbox-id-"), "{v}");
            assert_eq!(v["method"], "ping");
        }
        assert!(swap.holding());
    }

    #[tokio::test]
    async fn replies_get_their_ids_back_exactly() {
        let swap = IdSwap::new();
        let mut tokens = Vec::new();
        let ids = [
            "1.5",
            "18446744073709551615",
            "123456789012345678901234567890",
        ];
        for id in ids {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let v: Value = serde_json::from_slice(&swap.admit(line.as_bytes()).unwrap()).unwrap();
            tokens.push(v["id"].as_str().unwrap().to_owned());
        }
        let mut out = Vec::new();
        {
            let mut w = Restoring::new(&mut out, swap.clone());
            w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n")
                .await
                .unwrap();
            // The second reply arrives in pieces, across the token.
            let second = format!(r#"{{"jsonrpc":"2.0","id":"{}","result":{{}}}}"#, tokens[1]);
            let (a, b) = second.split_at(20);
            w.write_all(a.as_bytes()).await.unwrap();
            w.write_all(b.as_bytes()).await.unwrap();
            let rest = format!(
                "\n{{\"jsonrpc\":\"2.0\",\"id\":\"{}\",\"result\":{{}}}}\n\
                 {{\"jsonrpc\":\"2.0\",\"id\":\"{}\",\"error\":{{\"code\":-32600}}}}\n",
                tokens[0], tokens[2]
            );
            w.write_all(rest.as_bytes()).await.unwrap();
            w.flush().await.unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                r#"{"jsonrpc":"2.0","method":"notifications/message"}"#,
                r#"{"jsonrpc":"2.0","id":18446744073709551615,"result":{}}"#,
                r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
                r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"error":{"code":-32600}}"#,
            ]
        );
        assert!(!swap.holding(), "every token let go");
    }

    #[test]
    fn a_token_not_issued_is_left_alone() {
        let swap = IdSwap::new();
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":"{}99","result":{{}}}}"#,
            swap.prefix
        );
        assert_eq!(swap.restore(line.clone().into_bytes()), line.into_bytes());
    }

    #[test]
    fn at_most_max_held_ids_are_swapped() {
        let swap = IdSwap::new();
        let line = br#"{"jsonrpc":"2.0","id":0.5,"method":"ping"}"#;
        for _ in 0..MAX_HELD {
            assert!(swap.admit(line).is_some());
        }
        assert_eq!(swap.admit(line), None);
    }
}
