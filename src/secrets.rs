//! The one redaction: every secret the supervisor holds (model keys, tool
//! and upstream tokens, the values a helper's environment takes from the
//! supervisor's, the bearer tokens of `serve`'s principals) is known here by
//! value, and every string the supervisor sends toward a cell, a client, an
//! event file, a transcript or a log passes through [`redact`] (or one of
//! its typed forms) first (`docs/architecture.md` §2, rule 4). The places:
//! what a host capability answers (`Capability::new` wraps every handler:
//! declared, upstream, file tools), a model's reply and error
//! (`models::client`), every reply to a cell (`cell::calls`), every cell's
//! result (`cell::run_with`), every tool result and live output `serve`
//! sends, every event (`EventSink::record`), every log line
//! ([`crate::terminal::LogWriter`], and an upstream's stderr), `cellbox
//! agent`'s answer, trajectory and transcript. Error texts quoted from
//! outside are redacted whole before they are cut.
//!
//! A secret enters only through [`from_env`] (a configured environment
//! variable, the one way the crate reads one: clippy refuses
//! `std::env::var` elsewhere) or [`register`]; both add it to the process's
//! redactor, so a secret is known before any text that could hold it is
//! read. Secrets are never forgotten: redacting more never leaks.
//!
//! What is caught: any run of [`WINDOW`] or more consecutive bytes of a
//! secret, as it is, JSON-escaped, URL-encoded (upper- and lower-case hex,
//! form encoding), base64 (standard and URL-safe, at each of the three
//! alignments a secret can have in the encoded bytes) and hex (any run of
//! [`WINDOW`] bytes of the secret, so twice as many hex digits). A secret
//! shorter than [`WINDOW`] is caught only whole (and [`load`] warns about
//! it). Each stretch of text made of such runs reads `[REDACTED:NAME]`,
//! NAME being the environment variable (or principal) the secret came from.
//!
//! It is one Aho-Corasick automaton over every window of every encoding:
//! linear in the text, whatever the number of secrets.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::{Arc, RwLock};

/// Bytes of a secret that, found together, are redacted.
pub const WINDOW: usize = 8;

/// A secret value and the name it is reported under. Neither `Debug` nor
/// any other formatting shows the value.
#[derive(Clone)]
pub struct Secret {
    name: String,
    value: Arc<SecretString>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({})", self.name)
    }
}

impl Secret {
    /// A secret named `name` (what `[REDACTED:NAME]` shows). It is not
    /// registered: see [`register`].
    pub fn new(name: &str, value: String) -> Secret {
        Secret {
            name: name.to_owned(),
            value: Arc::new(SecretString::from(value)),
        }
    }

    /// The name it is reported under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value, for the one place that sends it where it belongs (a
    /// request header, a helper's environment).
    pub fn expose(&self) -> &str {
        self.value.expose_secret()
    }

    /// Shorter than [`WINDOW`]: only whole occurrences are caught.
    pub fn is_short(&self) -> bool {
        self.expose().len() < WINDOW
    }
}

/// Redaction could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("failed to build the redaction of {count} secret(s): {message}")]
    Build { count: usize, message: String },
}

/// An automaton over every window of every encoding of a set of secrets.
pub struct Redactor {
    secrets: Vec<Secret>,
    /// Which secret each pattern belongs to.
    owner: Vec<usize>,
    automaton: Option<AhoCorasick>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets)
            .field("patterns", &self.owner.len())
            .finish()
    }
}

/// The forms a secret can take in text, each with the window (in bytes of
/// that form) whose every occurrence is redacted.
fn encodings(secret: &str) -> Vec<(String, usize)> {
    let raw = secret.as_bytes();
    let mut forms: Vec<(String, usize)> = vec![(secret.to_owned(), WINDOW)];
    // JSON: as serde writes it, with every non-ASCII character escaped (as
    // Python's json.dumps does), and with '/' escaped too.
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or("")
        .to_owned();
    let mut ascii = String::new();
    for c in json.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                ascii.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    let slashed = ascii.replace('/', "\\/");
    forms.extend([json, ascii, slashed].map(|f| (f, WINDOW)));
    // URL: RFC 3986 (unreserved kept), form encoding, everything but
    // letters and digits; upper- and lower-case hex.
    let url = |keep: &dyn Fn(u8) -> bool, space_plus: bool, upper: bool| {
        let mut out = String::new();
        for &b in raw {
            if keep(b) {
                out.push(b as char);
            } else if space_plus && b == b' ' {
                out.push('+');
            } else if upper {
                out.push_str(&format!("%{b:02X}"));
            } else {
                out.push_str(&format!("%{b:02x}"));
            }
        }
        out
    };
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    let form = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'*');
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    for upper in [true, false] {
        forms.push((url(&unreserved, false, upper), WINDOW));
        forms.push((url(&form, true, upper), WINDOW));
        forms.push((url(&alnum, false, upper), WINDOW));
    }
    // Hex of the bytes: WINDOW bytes are twice as many digits.
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    forms.push((hex.to_ascii_uppercase(), 2 * WINDOW));
    forms.push((hex, 2 * WINDOW));
    // Base64: the secret may start at any of three offsets of a 3-byte
    // group of the encoded bytes; from the first whole group inside it,
    // its encoding is that of `raw[k..]` in whole groups (the last, partial
    // group depends on what follows). Only forms of at least a window.
    for k in 0..3.min(raw.len()) {
        let whole = (raw.len() - k) / 3 * 3;
        if whole == 0 {
            continue;
        }
        let part = &raw[k..k + whole];
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            let enc = engine.encode(part);
            if enc.len() >= WINDOW {
                forms.push((enc, WINDOW));
            }
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// Every pattern of one secret: each window of each form (the whole form
/// when it is shorter than its window).
fn patterns(secret: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for (form, window) in encodings(secret) {
        let b = form.as_bytes();
        if b.is_empty() {
            continue;
        }
        if b.len() <= window {
            out.push(b.to_vec());
        } else {
            out.extend(b.windows(window).map(<[u8]>::to_vec));
        }
    }
    out.sort();
    out.dedup();
    out
}

impl Redactor {
    /// A redactor of `secrets` (empty ones are ignored).
    pub fn new(secrets: Vec<Secret>) -> Result<Redactor, SecretsError> {
        let secrets: Vec<Secret> = secrets
            .into_iter()
            .filter(|s| !s.expose().is_empty())
            .collect();
        let mut all: Vec<Vec<u8>> = Vec::new();
        let mut owner = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, s) in secrets.iter().enumerate() {
            for p in patterns(s.expose()) {
                if seen.insert(p.clone()) {
                    all.push(p);
                    owner.push(i);
                }
            }
        }
        let automaton = if all.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(&all)
                    .map_err(|e| SecretsError::Build {
                        count: secrets.len(),
                        message: e.to_string(),
                    })?,
            )
        };
        Ok(Redactor {
            secrets,
            owner,
            automaton,
        })
    }

    /// A redactor of no secret.
    pub fn empty() -> Redactor {
        Redactor {
            secrets: Vec::new(),
            owner: Vec::new(),
            automaton: None,
        }
    }

    /// True when it knows no secret (redaction is a no-op).
    pub fn is_empty(&self) -> bool {
        self.automaton.is_none()
    }

    /// The secrets it knows.
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// True when `text` holds something this redactor would replace.
    pub fn finds(&self, text: &[u8]) -> bool {
        self.automaton.as_ref().is_some_and(|a| a.is_match(text))
    }

    /// The stretches of `text` to replace, in order, each with the index of
    /// the secret it is reported as; extended to character boundaries.
    fn stretches(&self, text: &str) -> Vec<(usize, usize, usize)> {
        let Some(a) = &self.automaton else {
            return Vec::new();
        };
        let mut found: Vec<(usize, usize, usize)> = a
            .find_overlapping_iter(text.as_bytes())
            .map(|m| (m.start(), m.end(), self.owner[m.pattern().as_usize()]))
            .collect();
        if found.is_empty() {
            return found;
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize, usize)> = Vec::new();
        for (mut s, mut e, who) in found {
            while !text.is_char_boundary(s) {
                s -= 1;
            }
            while !text.is_char_boundary(e) {
                e += 1;
            }
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e, who)),
            }
        }
        merged
    }

    /// `text` with every occurrence of a secret replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.finds(text.as_bytes()) {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for (s, e, who) in self.stretches(text) {
            out.push_str(&text[at..s]);
            out.push_str("[REDACTED:");
            out.push_str(self.secrets[who].name());
            out.push(']');
            at = e;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// [`Redactor::redact`] of an owned string, in place.
    pub fn redact_string(&self, s: &mut String) {
        if let Cow::Owned(r) = self.redact(s) {
            *s = r;
        }
    }

    /// Every string of `v` (keys too) redacted, in place.
    pub fn redact_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => self.redact_string(s),
            Value::Array(a) => a.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(o) => {
                if o.keys().any(|k| self.finds(k.as_bytes())) {
                    let old = std::mem::take(o);
                    for (k, v) in old {
                        o.insert(self.redact(&k).into_owned(), v);
                    }
                }
                o.values_mut().for_each(|v| self.redact_value(v));
            }
            _ => {}
        }
    }

    /// Bytes (lossy UTF-8 when they are not text) with every secret
    /// replaced.
    pub fn redact_bytes<'a>(&self, b: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.finds(b) {
            return Cow::Borrowed(b);
        }
        Cow::Owned(
            self.redact(&String::from_utf8_lossy(b))
                .into_owned()
                .into_bytes(),
        )
    }
}

/// The process's redactor: every secret registered so far.
static CURRENT: RwLock<Option<Arc<Redactor>>> = RwLock::new(None);

/// The process's redactor (see [`register`]).
pub fn current() -> Arc<Redactor> {
    let guard = CURRENT
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match guard.as_ref() {
        Some(r) => r.clone(),
        None => Arc::new(Redactor::empty()),
    }
}

/// Add `secrets` to the process's redactor (a value already known keeps
/// its first name).
pub fn register(secrets: Vec<Secret>) -> Result<(), SecretsError> {
    let mut guard = CURRENT
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut all: Vec<Secret> = guard
        .as_ref()
        .map(|r| r.secrets.clone())
        .unwrap_or_default();
    let before = all.len();
    for s in secrets {
        if !s.expose().is_empty() && !all.iter().any(|k| k.expose() == s.expose()) {
            all.push(s);
        }
    }
    if all.len() == before {
        return Ok(());
    }
    *guard = Some(Arc::new(Redactor::new(all)?));
    Ok(())
}

/// The value of the environment variable `var`, a secret of the
/// configuration: registered (under the name `var`) before it is returned.
/// `None` when it is unset, empty or not Unicode.
pub fn from_env(var: &str) -> Result<Option<Secret>, SecretsError> {
    #[allow(clippy::disallowed_methods)]
    let value = std::env::var(var).ok().filter(|v| !v.is_empty());
    let Some(value) = value else {
        return Ok(None);
    };
    let secret = Secret::new(var, value);
    register(vec![secret.clone()])?;
    Ok(Some(secret))
}

/// Read and register every variable of `vars` that is set (a missing one
/// is the business of the part of the configuration that needs it). The
/// warnings: the names of short secrets, caught only whole.
pub fn load<'a>(vars: impl IntoIterator<Item = &'a str>) -> Result<Vec<String>, SecretsError> {
    let mut warnings = Vec::new();
    for var in vars {
        if let Some(s) = from_env(var)? {
            if s.is_short() {
                warnings.push(format!(
                    "the secret in {var} is shorter than {WINDOW} characters: only whole \
                     occurrences of it are redacted"
                ));
            }
        }
    }
    Ok(warnings)
}

/// `text` with every registered secret replaced.
pub fn redact(text: &str) -> Cow<'_, str> {
    let r = current();
    if r.is_empty() {
        return Cow::Borrowed(text);
    }
    match r.redact(text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// [`redact`] of an owned string.
pub fn redact_owned(text: String) -> String {
    let r = current();
    let mut text = text;
    r.redact_string(&mut text);
    text
}

/// [`redact`] of bytes (lossy UTF-8 where a secret is found).
pub fn redact_bytes(b: &[u8]) -> Cow<'_, [u8]> {
    let r = current();
    if !r.finds(b) {
        return Cow::Borrowed(b);
    }
    match r.redact_bytes(b) {
        Cow::Borrowed(_) => Cow::Borrowed(b),
        Cow::Owned(v) => Cow::Owned(v),
    }
}

/// [`redact`] of every string in `v`.
pub fn redact_value(v: &mut Value) {
    let r = current();
    if !r.is_empty() {
        r.redact_value(v);
    }
}

/// A typed value (a cell's result, a call's reply) with every string in it
/// redacted: it is scanned as JSON, and rebuilt only when a secret is
/// found. `Err` when the redacted form no longer reads as `T` (a secret
/// short enough to match a field's fixed vocabulary): the caller must not
/// send the value.
pub fn redact_typed<T>(t: T) -> Result<T, T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let r = current();
    if r.is_empty() {
        return Ok(t);
    }
    let Ok(text) = serde_json::to_vec(&t) else {
        return Err(t);
    };
    if !r.finds(&text) {
        return Ok(t);
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(&text) else {
        return Err(t);
    };
    r.redact_value(&mut v);
    serde_json::from_value(v).map_err(|_| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c";

    fn red(secrets: &[(&str, &str)]) -> Redactor {
        Redactor::new(
            secrets
                .iter()
                .map(|(n, v)| Secret::new(n, (*v).to_owned()))
                .collect(),
        )
        .unwrap()
    }

    fn leaks(text: &str, secret: &str) -> Option<String> {
        // Any run of WINDOW bytes of the secret left in the text.
        secret
            .as_bytes()
            .windows(WINDOW)
            .find(|w| text.as_bytes().windows(WINDOW).any(|t| t == *w))
            .map(|w| String::from_utf8_lossy(w).into_owned())
    }

    #[test]
    fn whole_and_partial_occurrences_are_replaced() {
        let r = red(&[("MODEL_KEY", KEY)]);
        let text = format!("auth: Bearer {KEY}, again {KEY}.");
        let out = r.redact(&text);
        assert_eq!(
            out,
            "auth: Bearer [REDACTED:MODEL_KEY], again [REDACTED:MODEL_KEY]."
        );
        // Every cut of the key of at least WINDOW bytes, anywhere in text.
        for start in 0..KEY.len() - WINDOW {
            for end in start + WINDOW..=KEY.len() {
                let part = &KEY[start..end];
                let text = format!("x{part}y");
                assert_eq!(r.redact(&text), "x[REDACTED:MODEL_KEY]y", "{part}");
            }
        }
        // Seven bytes are not a run.
        assert_eq!(r.redact(&KEY[3..10]), &KEY[3..10]);
        assert_eq!(r.redact("nothing here"), "nothing here");
    }

    #[test]
    fn encodings_are_caught_at_every_alignment() {
        let key = "tok/with+odd=chars \"and\" é and more";
        let r = red(&[("TOKEN", key)]);
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let b64u = |s: &[u8]| base64::engine::general_purpose::URL_SAFE.encode(s);
        for pre in ["", "a", "ab", "abc", "user:"] {
            let mut plain = pre.as_bytes().to_vec();
            plain.extend_from_slice(key.as_bytes());
            plain.extend_from_slice(b"-tail");
            for enc in [b64(&plain), b64u(&plain)] {
                let out = r.redact(&enc);
                assert!(out.contains("[REDACTED:TOKEN]"), "{pre:?}: {out}");
                // What is left is at most a group or two at each end.
                let left = out.replace("[REDACTED:TOKEN]", "");
                assert!(left.len() <= 20, "{pre:?}: {out}");
            }
        }
        let json = serde_json::to_string(key).unwrap();
        assert_eq!(r.redact(&json), "\"[REDACTED:TOKEN]\"");
        let py_json = "\"tok\\/with+odd=chars \\\"and\\\" \\u00e9 and more\"";
        assert_eq!(r.redact(py_json), "\"[REDACTED:TOKEN]\"");
        let url: String = key
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        assert_eq!(r.redact(&format!("q={url}&x")), "q=[REDACTED:TOKEN]&x");
        let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(r.redact(&hex), "[REDACTED:TOKEN]");
        assert_eq!(
            r.redact(&hex.to_uppercase()[4..40]),
            "[REDACTED:TOKEN]",
            "a part of the hex"
        );
        // A partial base64 run (of a part of the key).
        let part = b64(&key.as_bytes()[5..20]);
        assert!(r.redact(&part).contains("[REDACTED:TOKEN]"), "{part}");
    }

    #[test]
    fn short_secrets_are_caught_whole_only() {
        let r = red(&[("PIN", "4711x")]);
        assert_eq!(r.redact("pin 4711x!"), "pin [REDACTED:PIN]!");
        assert_eq!(r.redact("4711"), "4711");
        assert!(r.secrets()[0].is_short());
    }

    #[test]
    fn several_secrets_values_and_multibyte_text() {
        let r = red(&[("A", KEY), ("B", "another-secret-value-123")]);
        let mut v = serde_json::json!({
            "text": format!("é{KEY}é and another-secret"),
            "list": [format!("{}", &KEY[10..30])],
            format!("key-{KEY}"): 1,
        });
        r.redact_value(&mut v);
        let s = v.to_string();
        assert!(leaks(&s, KEY).is_none(), "{s}");
        assert!(leaks(&s, "another-secret-value-123").is_none(), "{s}");
        assert!(s.contains("é[REDACTED:A]é and [REDACTED:B]"), "{s}");
        assert!(s.contains("key-[REDACTED:A]"), "{s}");
    }

    #[test]
    fn debug_never_shows_a_value() {
        let s = Secret::new("K", KEY.to_owned());
        let r = Redactor::new(vec![s.clone()]).unwrap();
        assert!(!format!("{s:?} {r:?}").contains(&KEY[..WINDOW]));
    }

    #[test]
    fn large_text_is_redacted_in_one_pass() {
        let r = red(&[("A", KEY), ("B", "another-secret-value-123")]);
        let mut text = "lorem ipsum dolor sit amet ".repeat(100_000);
        text.push_str(KEY);
        let out = r.redact(&text);
        assert!(out.ends_with("[REDACTED:A]"));
        assert_eq!(out.len(), text.len() - KEY.len() + "[REDACTED:A]".len());
    }
}
