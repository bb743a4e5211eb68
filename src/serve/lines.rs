//! Standard input cut into JSON-RPC lines of bounded length.
//!
//! The MCP transport drops a line longer than its own limit without a word,
//! so a client that sent one waits forever for the answer. Here a line over
//! [`max_message_bytes`] is never buffered whole: it is read through to its
//! end while a small scanner picks its top-level `id` and `method` out of
//! it, and in its place the transport gets a request for
//! [`OVERSIZED_METHOD`] with the same id, which the handler answers with an
//! "invalid request" error that names the size and the limit. A line with no
//! id (a notification or a response) is dropped and logged.

use serde_json::{json, Value};
use std::io::{BufRead, Read};

/// The method of the stand-in request for a line that was too long.
pub const OVERSIZED_METHOD: &str = "cellbox/oversized_message";

/// The longest message accepted: room for the largest accepted script,
/// JSON-escaped (up to 6 bytes per byte), plus the envelope; at least 4 MiB.
pub fn max_message_bytes(max_script_bytes: usize) -> usize {
    max_script_bytes
        .saturating_mul(6)
        .saturating_add(64 * 1024)
        .max(4 * 1024 * 1024)
}

/// What one read from [`next_line`] gave.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A line (with its newline, unless it ended the input) to pass on.
    Pass(Vec<u8>),
    /// A line over the limit with no id to answer; already consumed.
    Dropped { bytes: u64 },
    /// End of input.
    End,
}

/// Read the next line of `input`, at most `limit` bytes of it held at once.
pub fn next_line(input: &mut impl BufRead, limit: usize) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let n = input.by_ref().take(cap).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(Line::End);
    }
    if line.ends_with(b"\n") || line.len() <= limit {
        return Ok(Line::Pass(line));
    }
    // Over the limit: scan what was read and the rest of the line.
    let mut scan = Scanner::default();
    scan.feed(&line);
    let mut bytes = line.len() as u64;
    drop(line);
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        scan.feed(&buf[..take]);
        bytes += take as u64;
        input.consume(take);
        if done {
            break;
        }
    }
    let (id, method) = scan.finish();
    let Some(id) = id else {
        return Ok(Line::Dropped { bytes });
    };
    let stand_in = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": OVERSIZED_METHOD,
        "params": {"method": method, "bytes": bytes, "limit": limit},
    });
    let mut text = stand_in.to_string().into_bytes();
    text.push(b'\n');
    Ok(Line::Pass(text))
}

/// The longest top-level key, and the longest `id` or `method` value, kept.
const MAX_KEPT: usize = 256;

/// Picks the top-level `id` and `method` out of one JSON object given in
/// pieces, holding at most [`MAX_KEPT`] bytes of it. Only the structure is
/// followed (strings, escapes, nesting); values are checked at the end.
#[derive(Default)]
struct Scanner {
    started: bool,
    ended: bool,
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    want_key: bool,
    key: Vec<u8>,
    /// The raw text of the value being kept (`id` or `method`), if any.
    value: Option<(Which, Vec<u8>)>,
    id: Option<Vec<u8>>,
    method: Option<Vec<u8>>,
}

#[derive(Clone, Copy, PartialEq)]
enum Which {
    Id,
    Method,
}

impl Scanner {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.ended {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if !self.started {
            match b {
                b'{' => {
                    self.started = true;
                    self.depth = 1;
                    self.want_key = true;
                }
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => self.ended = true,
            }
            return;
        }
        let at_top = self.depth == 1;
        if self.in_string {
            let closes = self.closes_string(b);
            if at_top && self.want_key {
                if closes {
                    self.in_string = false;
                    self.want_key = false;
                } else if self.key.len() <= MAX_KEPT {
                    self.key.push(b);
                }
            } else {
                self.keep(b);
                self.in_string = !closes;
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if at_top && self.want_key {
                    self.key.clear();
                } else {
                    self.keep(b);
                }
            }
            b':' if at_top => {
                // A key written with escapes (`"meth\u006fd"`) is the same
                // key; a later one replaces an earlier one, as in a full
                // parse (so an earlier value is dropped even when the later
                // one is too long to keep).
                let key = unescaped_key(&self.key);
                self.value = match key.as_deref() {
                    Some(b"id") => {
                        self.id = None;
                        Some((Which::Id, Vec::new()))
                    }
                    Some(b"method") => {
                        self.method = None;
                        Some((Which::Method, Vec::new()))
                    }
                    _ => None,
                };
            }
            b',' if at_top => {
                self.end_value();
                self.want_key = true;
            }
            b'{' | b'[' => {
                self.keep(b);
                self.depth += 1;
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.end_value();
                    self.ended = true;
                } else {
                    self.keep(b);
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => self.keep(b),
        }
    }

    /// Whether `b`, inside a string, ends it (an unescaped quote).
    fn closes_string(&mut self, b: u8) -> bool {
        if self.escaped {
            self.escaped = false;
            false
        } else if b == b'\\' {
            self.escaped = true;
            false
        } else {
            b == b'"'
        }
    }

    /// Keep `b` as part of the value being kept, if one is.
    fn keep(&mut self, b: u8) {
        if let Some((_, v)) = &mut self.value {
            if v.len() < MAX_KEPT {
                v.push(b);
            } else {
                // Too long to be an id or a method name.
                self.value = None;
            }
        }
    }

    fn end_value(&mut self) {
        match self.value.take() {
            Some((Which::Id, v)) => self.id = Some(v),
            Some((Which::Method, v)) => self.method = Some(v),
            None => {}
        }
    }

    /// The id (a number or a string, as JSON-RPC allows) and the method.
    fn finish(mut self) -> (Option<Value>, Option<String>) {
        // A value cut off by the end of the line is not kept.
        self.value = None;
        let id = self
            .id
            .and_then(|v| serde_json::from_slice::<Value>(&v).ok())
            .filter(|v| v.is_number() || v.is_string());
        let method = self
            .method
            .and_then(|v| serde_json::from_slice::<String>(&v).ok());
        (id, method)
    }
}

/// A key's raw text (between its quotes) as the key it names: itself when
/// it has no escape, else decoded as JSON (`None` if that fails).
fn unescaped_key(raw: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    if !raw.contains(&b'\\') {
        return Some(std::borrow::Cow::Borrowed(raw));
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    let key: String = serde_json::from_slice(&quoted).ok()?;
    Some(std::borrow::Cow::Owned(key.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, piece: usize) -> (Option<Value>, Option<String>) {
        let mut s = Scanner::default();
        for chunk in text.as_bytes().chunks(piece) {
            s.feed(chunk);
        }
        s.finish()
    }

    /// As in a full parse, the last of repeated keys counts, and a key
    /// written with escapes is the same key.
    #[test]
    fn repeated_and_escaped_keys_read_as_a_full_parse_does() {
        let long = "y".repeat(300);
        let cases = [
            (
                format!(r#"{{"id":1,"method":"a","method":"{long}","id":2}}"#),
                Some(json!(2)),
                None,
            ),
            (
                r#"{"method":"a","meth\u006fd":"b","\u0069d":"x"}"#.to_owned(),
                Some(json!("x")),
                Some("b".to_owned()),
            ),
            (
                r#"{"id":3,"i\u0064":{"no":1},"method":"m"}"#.to_owned(),
                None,
                Some("m".to_owned()),
            ),
        ];
        for (text, id, method) in cases {
            let full: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(scan(&text, 7), (id, method.clone()), "{text}");
            if let Some(m) = method {
                assert_eq!(full["method"], json!(m), "{text}");
            }
        }
    }

    #[test]
    fn the_id_and_method_are_found_wherever_they_are() {
        let big = "x".repeat(10_000);
        let cases = [
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"code":"{big}"}}}}"#
                ),
                Some(json!(8)),
            ),
            (
                format!(
                    r#"{{"params":{{"a":[1,{{"id":5}}],"code":"{big}\"}},\"id\":9"}},"method":"tools/call","id":"a,b}}"}}"#
                ),
                Some(json!("a,b}")),
            ),
            (
                format!(r#" {{ "method" : "tools/call" , "params" : "{big}" , "id" : -3 }}"#),
                Some(json!(-3)),
            ),
            (
                format!(r#"{{"method":"notifications/x","params":"{big}"}}"#),
                None,
            ),
            (
                format!(r#"{{"id":{{"no":1}},"method":"m","p":"{big}"}}"#),
                None,
            ),
            (format!(r#"{{"id":"{big}","method":"m"}}"#), None),
            (format!(r#"["id",1,"{big}"]"#), None),
        ];
        for (text, id) in cases {
            for piece in [1, 7, 4096, text.len()] {
                let (got, method) = scan(&text, piece);
                assert_eq!(got, id, "{}", &text[..80.min(text.len())]);
                if got.is_some() {
                    assert_eq!(method.as_deref(), Some("tools/call"));
                }
            }
        }
    }

    #[test]
    fn short_lines_pass_and_long_ones_are_replaced_or_dropped() {
        let big = "y".repeat(5000);
        let call = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"code\":\"{big}\"}}}}"
        );
        let input = format!(
            "{{\"id\":1,\"method\":\"ping\"}}\n{call}\n\
             {{\"method\":\"notifications/x\",\"params\":\"{big}\"}}\n\
             {{\"id\":3,\"method\":\"ping\"}}"
        );
        let mut r = std::io::BufReader::with_capacity(64, input.as_bytes());
        let limit = 1000;
        assert_eq!(
            next_line(&mut r, limit).unwrap(),
            Line::Pass(b"{\"id\":1,\"method\":\"ping\"}\n".to_vec())
        );
        let Line::Pass(stand_in) = next_line(&mut r, limit).unwrap() else {
            panic!("no stand-in");
        };
        let v: Value = serde_json::from_slice(&stand_in).unwrap();
        assert_eq!(v["id"], 2);
        assert_eq!(v["method"], OVERSIZED_METHOD);
        assert_eq!(v["params"]["method"], "tools/call");
        assert_eq!(v["params"]["bytes"], call.len() + 1);
        assert_eq!(v["params"]["limit"], 1000);
        assert!(
            matches!(next_line(&mut r, limit).unwrap(), Line::Dropped { bytes } if bytes > 5000)
        );
        assert_eq!(
            next_line(&mut r, limit).unwrap(),
            Line::Pass(b"{\"id\":3,\"method\":\"ping\"}".to_vec())
        );
        assert_eq!(next_line(&mut r, limit).unwrap(), Line::End);
    }

    #[test]
    fn a_line_exactly_at_the_limit_passes() {
        let line = format!("{{\"id\":1,\"p\":\"{}\"}}", "z".repeat(100));
        let limit = line.len();
        let input = format!("{line}\n{line}");
        let mut r = std::io::BufReader::new(input.as_bytes());
        assert_eq!(
            next_line(&mut r, limit).unwrap(),
            Line::Pass(format!("{line}\n").into_bytes())
        );
        assert_eq!(
            next_line(&mut r, limit).unwrap(),
            Line::Pass(line.into_bytes())
        );
    }
}
