//! Capped capture of a worker's stdout/stderr: keeps the head and the tail,
//! counts every byte, never grows past the cap.

use super::result::Truncation;
use super::Forward;
use std::collections::VecDeque;

impl Forward {
    /// The part of `chunk` to copy to our own stream, of which the first
    /// `to_head` bytes went to the capture's head.
    pub(crate) fn shown(self, chunk: &[u8], to_head: usize) -> &[u8] {
        match self {
            Forward::No => &chunk[..0],
            Forward::All => chunk,
            Forward::Head => &chunk[..to_head],
        }
    }
}

/// What of a stream is copied to this process's own stdout or stderr, as
/// it arrives (see [`Forward`]). For [`Forward::Head`], a person's
/// terminal: control characters are shown escaped (see
/// [`crate::terminal`]) and the text passes the one redaction as one stream,
/// so that a secret written in pieces is caught across them (see
/// [`crate::secrets::StreamRedaction`]). The terminal is the operator's and
/// the cell never reads it back: the operator's rule applies (see
/// [`crate::secrets::Reader`]).
#[derive(Debug)]
pub(crate) struct Shown {
    forward: Forward,
    escaper: crate::terminal::Escaper,
    redaction: crate::secrets::StreamRedaction,
}

impl Shown {
    pub(crate) fn new(forward: Forward) -> Shown {
        Shown {
            forward,
            escaper: crate::terminal::Escaper::default(),
            redaction: crate::secrets::StreamRedaction::new(crate::secrets::Reader::Operator),
        }
    }

    /// What to copy of `chunk` now, of which the first `to_head` bytes went
    /// to the capture's head (possibly nothing: the redaction may hold back
    /// the start of a possible secret until the next piece or the end).
    pub(crate) fn pass(&mut self, chunk: &[u8], to_head: usize) -> Vec<u8> {
        let shown = self.forward.shown(chunk, to_head);
        if self.forward != Forward::Head {
            return shown.to_vec();
        }
        let escaped = self.escaper.push(shown);
        let text = String::from_utf8_lossy(&escaped);
        self.redaction.push(&text).into_bytes()
    }

    /// The stream ended: what was held back.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        if self.forward != Forward::Head {
            return Vec::new();
        }
        self.redaction.finish().into_bytes()
    }
}

#[derive(Debug)]
pub struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl Capture {
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Capture {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            total: 0,
        }
    }

    /// Take in `data`; returns how many of its first bytes went to the
    /// head (what a caller that shows the output as it comes shows).
    pub fn push(&mut self, mut data: &[u8]) -> usize {
        self.total += data.len() as u64;
        let mut to_head = 0;
        if self.head.len() < self.head_cap {
            to_head = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..to_head]);
            data = &data[to_head..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return to_head;
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
        } else {
            let over = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..over);
            self.tail.extend(data);
        }
        to_head
    }

    /// The kept text (lossy UTF-8) and, when bytes were dropped, what was kept.
    pub fn finish(self) -> (String, Option<Truncation>) {
        let kept = (self.head.len() + self.tail.len()) as u64;
        if kept == self.total {
            let mut all = self.head;
            all.extend(self.tail);
            return (text_of(all), None);
        }
        let omitted = self.total - kept;
        let tail: Vec<u8> = self.tail.into_iter().collect();
        let text = format!(
            "{}\n[... {} bytes omitted ...]\n{}",
            text_from(&self.head),
            omitted,
            text_from(&tail)
        );
        (
            text,
            Some(Truncation {
                total_bytes: self.total,
                kept_head: self.head.len() as u64,
                kept_tail: tail.len() as u64,
            }),
        )
    }
}

/// `bytes` as text: taken as it is when it is UTF-8 (checked, not copied),
/// else with each invalid sequence replaced by U+FFFD.
fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`text_of`] for borrowed bytes. The check of valid UTF-8 is many times
/// faster than the lossy conversion's walk, which only text that is not
/// valid takes.
pub(crate) fn text_from(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_output_is_text_with_invalid_bytes_replaced() {
        let mut c = Capture::new(1024);
        c.push(b"ok \xff\xfe \xc3\xa9");
        let (text, trunc) = c.finish();
        assert_eq!(text, "ok \u{fffd}\u{fffd} \u{e9}");
        assert!(trunc.is_none());
        let mut c = Capture::new(1024);
        c.push("é and 🙂\n".as_bytes());
        assert_eq!(c.finish().0, "é and 🙂\n");
        assert_eq!(text_from(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(text_from("é".as_bytes()), "é");
    }

    #[test]
    fn under_cap_is_verbatim() {
        let mut c = Capture::new(10);
        c.push(b"hello");
        assert_eq!(c.finish(), ("hello".to_string(), None));
    }

    #[test]
    fn over_cap_keeps_head_and_tail_with_exact_total() {
        let mut c = Capture::new(10);
        for chunk in [&b"0123"[..], b"456789", b"abcdefgh", b"XYZ"] {
            c.push(chunk);
        }
        let (text, t) = c.finish();
        let t = t.unwrap();
        assert_eq!(t.total_bytes, 21);
        assert_eq!(t.kept_head, 5);
        assert_eq!(t.kept_tail, 5);
        assert!(text.starts_with("01234"));
        assert!(text.ends_with("fghXYZ".get(1..).unwrap()));
        assert!(text.contains("11 bytes omitted"));
    }
}
