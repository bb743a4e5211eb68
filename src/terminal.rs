//! Text for a person's terminal: what a cell, a model or an endpoint wrote
//! is shown, never obeyed. Control characters (escape sequences that clear
//! the screen, write the clipboard or retitle the window, a carriage return
//! that hides a line, C1 controls) and the bidirectional overrides that
//! reorder what is shown are printed as `\u{1b}`; newlines and tabs stay.
//! Every human-facing stream goes through here: `cellbox run` and the REPL
//! (not `--json`), `cellbox agent`'s answer and messages, `serve`'s log
//! (see [`LogWriter`], which also redacts, see [`crate::secrets`]).

use std::borrow::Cow;

/// True for a character a terminal would act on rather than show.
fn acts(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    out.push_str(&format!("\\u{{{:x}}}", c as u32));
}

/// `text` with every character a terminal would act on written out.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if acts(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// JSON text (as serde writes it: C0 controls already escaped) with the
/// other characters a terminal would act on written `\uXXXX`: the same
/// JSON, safe to print.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    if !json.chars().any(acts) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if acts(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Redacted (see [`crate::secrets`], as the operator's records are) and
/// escaped: text from outside, for a person at the operator's terminal.
pub fn for_person(text: &str) -> String {
    escape(&crate::secrets::redact_record(text)).into_owned()
}

/// `eprintln!` for the operator's terminal: the line redacted and escaped
/// ([`for_person`]). Every message cellbox writes on stderr goes through
/// it (`clippy.toml` disallows `eprintln!` itself): an error may quote a
/// config file, a path, a principal's name or an endpoint's words, any of
/// which can carry escape sequences or a secret.
#[macro_export]
macro_rules! report {
    () => {{
        #[allow(clippy::disallowed_macros)]
        {
            ::std::eprintln!();
        }
    }};
    ($($arg:tt)*) => {{
        #[allow(clippy::disallowed_macros)]
        {
            ::std::eprintln!(
                "{}",
                $crate::terminal::for_person(&::std::format!($($arg)*))
            );
        }
    }};
}

/// [`escape`] of a byte stream that arrives in pieces: a character split
/// between two pieces is held until it is whole; bytes that are not UTF-8
/// are written `\xNN`.
#[derive(Debug, Default)]
pub struct Escaper {
    held: Vec<u8>,
}

impl Escaper {
    /// The escaped form of what `bytes` completes.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(bytes);
        let mut out = String::with_capacity(data.len());
        let mut rest = &data[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(&escape(s));
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // Valid up to there by the error's own account.
                    out.push_str(&escape(&String::from_utf8_lossy(good)));
                    match e.error_len() {
                        Some(n) => {
                            for b in &bad[..n] {
                                out.push_str(&format!("\\x{b:02x}"));
                            }
                            rest = &bad[n..];
                        }
                        None => {
                            // An incomplete character at the end.
                            self.held = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out.into_bytes()
    }
}

/// The writer of `serve`'s log (and of every command's diagnostics): each
/// line redacted and escaped before it reaches stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let shown = for_person(&text);
        std::io::stderr().lock().write_all(shown.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

/// The writer of `serve --log-format json`: each line is one JSON object
/// (one event; the layer writes it whole), whose strings are redacted as a
/// log line's are (see [`crate::secrets`]) and whose characters a terminal
/// would act on are escaped; still one JSON object a line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLogWriter;

impl std::io::Write for JsonLogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = String::with_capacity(buf.len());
        for line in String::from_utf8_lossy(buf).split_inclusive('\n') {
            let body = line.trim_end_matches('\n');
            match serde_json::from_str::<serde_json::Value>(body) {
                Ok(mut v) => {
                    crate::secrets::redact_record_value(&mut v);
                    out.push_str(&escape_json(&v.to_string()));
                }
                // Not JSON (it should not happen): shown as a JSON string.
                Err(_) => {
                    out.push_str(&serde_json::json!({ "message": for_person(body) }).to_string())
                }
            }
            if line.ends_with('\n') {
                out.push('\n');
            }
        }
        std::io::stderr().lock().write_all(out.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for JsonLogWriter {
    type Writer = JsonLogWriter;
    fn make_writer(&'a self) -> JsonLogWriter {
        JsonLogWriter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_not_obeyed() {
        assert_eq!(escape("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape("a\x1b[2Jb\x07c\rd\u{9b}e\u{202e}f\x7f"),
            "a\\u{1b}[2Jb\\u{7}c\\u{d}d\\u{9b}e\\u{202e}f\\u{7f}"
        );
        // OSC 52 (write the clipboard).
        assert!(!escape("\x1b]52;c;aGk=\x07").contains('\x1b'));
    }

    #[test]
    fn json_stays_json() {
        let v = serde_json::json!({"a": "x\u{9b}y\u{202e}z\x1b"});
        let text = v.to_string();
        let safe = escape_json(&text);
        assert!(!safe.chars().any(acts), "{safe}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), v);
    }

    #[test]
    fn a_stream_in_pieces() {
        let mut e = Escaper::default();
        let text = "é\u{9b}x\x1b";
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        for b in bytes {
            out.extend(e.push(&[*b]));
        }
        assert_eq!(String::from_utf8(out).unwrap(), "é\\u{9b}x\\u{1b}");
        assert_eq!(e.push(b"\xff\x9bok"), b"\\xff\\x9bok");
    }
}
