//! The one redaction: every secret the supervisor holds (model keys, tool
//! and upstream tokens, the values a helper's environment takes from the
//! supervisor's, the bearer tokens of `serve`'s principals) is known here by
//! value, and every string the supervisor sends toward a cell, a client, an
//! event file, a transcript or a log passes through [`redact`] (or one of
//! its typed forms, or [`redact_record`] for the operator's own records)
//! first (`docs/architecture.md` §2, rule 4). The places: what a host
//! capability answers (`Capability::new` wraps every handler: declared,
//! upstream, file tools), an upstream's tool list, a model's reply and
//! error (`models::client`), every reply to a cell (`cell::calls`), every
//! cell's result (`cell::run_with`), every tool result and live output
//! `serve` sends (live output as one stream per cell: [`StreamRedaction`]),
//! every event (`EventSink::record`), every log line
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
//! # Two readers
//!
//! A redaction that answers to any part of a secret is an oracle to
//! whoever can choose text and see it come back: a cell passes candidates
//! through anything that returns them (`aggregate_context`, a file it
//! wrote, a model asked to repeat), learns which one was redacted, and
//! spells a key out a character at a time from its public prefix
//! (`sk-proj-`) or from the known structure of a token (a JWT's header).
//! So text that may reach a **tenant** (a cell, a client, a model:
//! [`redact`]) is redacted where it holds a whole **block** of a secret:
//! the secret cut into consecutive blocks that carry [`GUESS_BITS`] bits
//! by its own alphabet ([`Secret::block`]: 13 characters of a typical API
//! key, 16 hex digits), the last one ending with the secret. Any run of
//! two blocks less one byte holds a block, a whole secret is all blocks,
//! and a tenant confirms a block only by guessing all of it that is not
//! public at once: the oracle gives away at most the few unknown
//! characters of a block that is nearly all public structure, never the
//! next block. A secret shorter than two blocks is redacted at every run
//! of one block. The **operator's** records (the log, the events file,
//! `cellbox agent`'s terminal output and transcript: [`redact_record`]),
//! which no tenant reads, are redacted at any run of [`WINDOW`] bytes.
//!
//! # Forms
//!
//! A run is found as it is, and through the escapes software adds on its
//! own: the text is also read with percent-escapes (of any character, any
//! case), JSON and JavaScript escapes (`\u0041`, surrogate pairs, `\/`,
//! `\u{41}`), `\xNN` and HTML character references (`&#43;`, `&#x2F;`,
//! `&plus;`) undone and line breaks and NULs dropped (line-wrapped text,
//! UTF-16 of ASCII). In that reading, and in the text itself, it is found
//! raw (in any case), in hex (any case), base64 (standard and URL-safe)
//! and base32 (any case), each at every alignment the secret can have in
//! the encoded bytes; a JSON number is read as its digits. What is not: a secret split between separate strings, fields or
//! calls, spaced out, reversed or otherwise transformed on purpose — only
//! the service a secret is sent to can do that, and it holds the secret
//! already. Each stretch of text made of found runs reads
//! `[REDACTED:NAME]`, NAME being the environment variable (or principal)
//! the secret came from.
//!
//! Each reader's runs are one Aho-Corasick automaton (and one more for the
//! case-insensitive forms) run over the text and its decoded reading:
//! linear in the text, with memory bounded by the stretches found, not by
//! the matches.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// Bytes of a secret that, found together in the operator's records, are
/// redacted.
pub const WINDOW: usize = 8;

/// Bits of a secret a tenant must not be able to guess: text reaching a
/// tenant is redacted where it leaves fewer than these unseen.
pub const GUESS_BITS: u32 = 64;

/// Who reads a text, which decides the runs of a secret redacted in it
/// (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// A cell, a client, a model: may choose part of the text and see what
    /// comes back.
    Tenant,
    /// The operator's own records: the log, the events file, `cellbox
    /// agent`'s terminal and transcript.
    Operator,
}

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

    /// Bytes of this secret that carry [`GUESS_BITS`] bits by its own
    /// alphabet, letters in either case counted once (the fewer of the
    /// distinct bytes it uses and the classes they belong to: digits,
    /// letters, other ASCII, non-ASCII), at least [`WINDOW`]: a block (see
    /// [`crate::secrets`]).
    /// An estimate that errs long: a hex key counts 4 bits a character.
    pub fn block(&self) -> usize {
        block_bytes(self.expose().as_bytes())
    }

    /// Too short to be cut into two blocks: a tenant is shown no run of a
    /// block, but a shorter run may leave little of it unseen.
    pub fn is_short(&self) -> bool {
        self.expose().len() < 2 * self.block()
    }
}

/// See [`Secret::block`].
fn block_bytes(raw: &[u8]) -> usize {
    // Letters count once in either case: a secret is found in any case.
    let raw = raw.to_ascii_lowercase();
    let raw = &raw[..];
    let mut seen = [false; 256];
    for &b in raw {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    let class = |f: fn(u8) -> bool, size: usize| {
        if raw.iter().any(|&b| f(b)) {
            size
        } else {
            0
        }
    };
    let classes = class(|b| b.is_ascii_digit(), 10)
        + class(|b| b.is_ascii_lowercase(), 26)
        + class(|b| b.is_ascii() && !b.is_ascii_alphanumeric(), 33)
        + class(|b| !b.is_ascii(), 128);
    let alphabet = distinct.min(classes).max(2) as f64;
    let bytes = (f64::from(GUESS_BITS) / alphabet.log2()).ceil() as usize;
    bytes.max(WINDOW)
}

/// Redaction could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("failed to build the redaction of {count} secret(s): {message}")]
    Build { count: usize, message: String },
}

/// Every window of `len` bytes of `form` (the whole of a shorter one when
/// `whole_ok`).
fn windows(form: &[u8], len: usize, whole_ok: bool, out: &mut Vec<Vec<u8>>) {
    if form.is_empty() || len == 0 {
        return;
    }
    if form.len() < len {
        if whole_ok {
            out.push(form.to_vec());
        }
        return;
    }
    out.extend(form.windows(len).map(<[u8]>::to_vec));
}

/// The secret as form encoding writes it (a space as '+'), when that
/// differs.
fn plus_form(raw: &[u8]) -> Option<Vec<u8>> {
    raw.contains(&b' ').then(|| {
        raw.iter()
            .map(|&b| if b == b' ' { b'+' } else { b })
            .collect()
    })
}

/// The patterns of one secret (case-sensitive: base64; case-insensitive:
/// raw, hex and base32 — a secret in another case is the secret, bar a
/// bit a letter, which [`block_bytes`] counts) for `reader`.
fn patterns(raw: &[u8], reader: Reader) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let block = block_bytes(raw);
    match reader {
        Reader::Operator => windowed(raw, WINDOW.min(raw.len())),
        Reader::Tenant if raw.len() < 2 * block => windowed(raw, block.min(raw.len())),
        Reader::Tenant => blocks(raw, block),
    }
}

/// Every run of `run` bytes, in every form: the base64 of a run is the
/// run's whole 3-byte groups at each of the three offsets the secret can
/// have in the encoded bytes, `run` × 4/3 characters; base32 likewise in
/// 5-byte groups. A secret no longer than `run` is caught whole only (its
/// base64 and base32 are then no stretch of whole groups that could be
/// told apart from other text).
fn windowed(raw: &[u8], run: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut exact = Vec::new();
    let mut folded = Vec::new();
    windows(raw, run, true, &mut folded);
    if let Some(plus) = plus_form(raw) {
        windows(&plus, run, true, &mut folded);
    }
    windows(hex_lower(raw).as_bytes(), 2 * run, true, &mut folded);
    if run >= raw.len() {
        return (exact, folded);
    }
    let run64 = (4 * run).div_ceil(3);
    for k in 0..3.min(raw.len()) {
        let part = &raw[k..k + (raw.len() - k) / 3 * 3];
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            windows(engine.encode(part).as_bytes(), run64, false, &mut exact);
        }
    }
    let run32 = (8 * run).div_ceil(5);
    for k in 0..5.min(raw.len()) {
        let part = &raw[k..k + (raw.len() - k) / 5 * 5];
        let enc = data_encoding::BASE32_NOPAD.encode(part);
        windows(enc.as_bytes(), run32, false, &mut folded);
    }
    (exact, folded)
}

/// Where the blocks of `len` bytes of a secret of `total` bytes start:
/// every `step`, and one more that ends with the secret.
fn block_starts(total: usize, len: usize, step: usize) -> Vec<usize> {
    if len > total || step == 0 {
        return Vec::new();
    }
    let mut starts: Vec<usize> = (0..=total - len).step_by(step).collect();
    if starts.last() != Some(&(total - len)) {
        starts.push(total - len);
    }
    starts
}

/// The blocks of a secret of at least two: consecutive runs of `block`
/// bytes, and the last `block` bytes. Base64 blocks are 4 bytes longer
/// (their whole 3-byte groups, at whichever offset a block has in the
/// encoded bytes, hold at least `block` bytes) and overlap by 2 bytes (so
/// that every whole group of the secret lies in one); base32 blocks, in
/// 5-byte groups, 8 longer and overlapping by 4.
fn blocks(raw: &[u8], block: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut exact = Vec::new();
    let mut folded = Vec::new();
    let plus = plus_form(raw);
    for s in block_starts(raw.len(), block, block) {
        let b = &raw[s..s + block];
        folded.push(b.to_vec());
        if let Some(plus) = &plus {
            folded.push(plus[s..s + block].to_vec());
        }
        folded.push(hex_lower(b).into_bytes());
    }
    let grouped = |len: usize,
                   overlap: usize,
                   group: usize,
                   encode: &dyn Fn(&[u8]) -> Vec<Vec<u8>>,
                   out: &mut Vec<Vec<u8>>| {
        for s in block_starts(raw.len(), len, len - overlap) {
            let b = &raw[s..s + len];
            for skip in 0..group {
                let whole = (len - skip) / group * group;
                out.extend(encode(&b[skip..skip + whole]));
            }
        }
    };
    grouped(
        block + 4,
        2,
        3,
        &|part| {
            [
                &base64::engine::general_purpose::STANDARD_NO_PAD,
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            ]
            .iter()
            .map(|e| e.encode(part).into_bytes())
            .collect()
        },
        &mut exact,
    );
    grouped(
        block + 8,
        4,
        5,
        &|part| vec![data_encoding::BASE32_NOPAD.encode(part).into_bytes()],
        &mut folded,
    );
    (exact, folded)
}

fn hex_lower(raw: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(raw)
}

/// One automaton over some patterns, and the secret each belongs to.
struct Automaton {
    automaton: AhoCorasick,
    owner: Vec<usize>,
}

impl Automaton {
    fn build(
        patterns: Vec<(Vec<u8>, usize)>,
        fold_case: bool,
        count: usize,
    ) -> Result<Option<Automaton>, SecretsError> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        let mut owner = Vec::new();
        for (p, who) in patterns {
            let key = if fold_case {
                p.to_ascii_lowercase()
            } else {
                p.clone()
            };
            if seen.insert(key) {
                all.push(p);
                owner.push(who);
            }
        }
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(fold_case)
            .build(&all)
            .map_err(|e| SecretsError::Build {
                count,
                message: e.to_string(),
            })?;
        Ok(Some(Automaton { automaton, owner }))
    }
}

/// The automata of one reader.
#[derive(Default)]
struct Matcher {
    automata: Vec<Automaton>,
    /// Bytes a match can span in the text: a byte of a pattern, an escape
    /// or a dropped byte of [`decode`]. A match lies in a run of these.
    inner: Vec<bool>,
    /// Bytes of text one match can span at most: its pattern's bytes, each
    /// written as the longest escape [`readings`] undo.
    span: usize,
}

/// Text bytes one decoded byte can take at most, through every reading
/// (`&UnderBar;` is 10 for one, `&amp;UnderBar;` 14).
const ESCAPE_GROWTH: usize = 16;

impl Matcher {
    fn build(secrets: &[Secret], reader: Reader) -> Result<Matcher, SecretsError> {
        let mut exact = Vec::new();
        let mut folded = Vec::new();
        for (i, s) in secrets.iter().enumerate() {
            let raw = s.expose().as_bytes();
            let (e, f) = patterns(raw, reader);
            exact.extend(e.into_iter().map(|p| (p, i)));
            folded.extend(f.into_iter().map(|p| (p, i)));
        }
        let mut inner = vec![false; 256];
        let mut longest = 0;
        for (p, _) in exact.iter().chain(&folded) {
            longest = longest.max(p.len());
            for &b in p {
                inner[usize::from(b)] = true;
                inner[usize::from(b.to_ascii_lowercase())] = true;
                inner[usize::from(b.to_ascii_uppercase())] = true;
            }
        }
        // What escapes are written with (named references take any
        // letter), and the bytes a reading drops.
        for b in (0..=255u8).filter(u8::is_ascii_alphanumeric) {
            inner[usize::from(b)] = true;
        }
        for &b in b"%\\&#;{}\"'/\r\n\0" {
            inner[usize::from(b)] = true;
        }
        let n = secrets.len();
        let automata = [
            Automaton::build(exact, false, n)?,
            Automaton::build(folded, true, n)?,
        ]
        .into_iter()
        .flatten()
        .collect();
        Ok(Matcher {
            automata,
            inner,
            span: longest * ESCAPE_GROWTH,
        })
    }

    /// How much of the end of `text` a stream must hold back until more
    /// arrives: the part a match could begin in and go on past the end. A
    /// match there is made of bytes it can span, and has at most its
    /// longest pattern less one byte of it already written: that many
    /// bytes of its reading (line breaks and NULs are dropped from it), or,
    /// where an escape could be among them, that many escapes.
    fn held(&self, text: &[u8]) -> usize {
        if self.automata.is_empty() {
            return 0;
        }
        let longest = self.span / ESCAPE_GROWTH;
        let run = text
            .iter()
            .rev()
            .take(self.span)
            .take_while(|b| self.inner.get(usize::from(**b)) == Some(&true))
            .count();
        let tail = &text[text.len() - run..];
        if tail.iter().any(|b| matches!(b, b'%' | b'\\' | b'&')) {
            return run;
        }
        let mut read = 0;
        let mut held = 0;
        for &b in tail.iter().rev() {
            if !matches!(b, b'\r' | b'\n' | 0) {
                if read + 1 >= longest {
                    break;
                }
                read += 1;
            }
            held += 1;
        }
        held
    }

    fn is_empty(&self) -> bool {
        self.automata.is_empty()
    }

    fn finds(&self, text: &[u8]) -> bool {
        let hit = |hay: &[u8]| self.automata.iter().any(|a| a.automaton.is_match(hay));
        hit(text) || readings(text).iter().any(|d| hit(&d.bytes))
    }

    /// The stretches of `text` (byte offsets, not yet on character
    /// boundaries) made of runs of a secret, each with the index of the
    /// secret it is reported as; sorted and disjoint.
    fn stretches(&self, text: &[u8]) -> Vec<(usize, usize, usize)> {
        let mut found: Vec<(usize, usize, usize)> = Vec::new();
        for a in &self.automata {
            scan(a, text, |s, e| (s, e), &mut found);
        }
        let levels = readings(text);
        for (n, d) in levels.iter().enumerate() {
            let back = |s, e| {
                levels[..=n]
                    .iter()
                    .rev()
                    .fold((s, e), |(s, e), level| level.span(s, e))
            };
            for a in &self.automata {
                scan(a, &d.bytes, back, &mut found);
            }
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(found.len());
        for (s, e, who) in found {
            push_merged(&mut merged, s, e, who);
        }
        merged
    }
}

/// Add the stretch `s..e` to the sorted, disjoint `stretches`, merged with
/// every stretch at its end that it overlaps or touches. Matches come in
/// order of their ends, so only the last stretches can meet a new one: the
/// list holds stretches, never every (overlapping) match.
fn push_merged(stretches: &mut Vec<(usize, usize, usize)>, s: usize, e: usize, who: usize) {
    let (mut s, mut e, mut who) = (s, e, who);
    while let Some(&(ls, le, lw)) = stretches.last() {
        if le < s {
            break;
        }
        if ls <= s {
            who = lw;
        }
        s = s.min(ls);
        e = e.max(le);
        stretches.pop();
    }
    stretches.push((s, e, who));
}

/// Every match of `a` in `hay`, mapped to the text by `span`, merged into
/// stretches as they come, and added to `out`.
fn scan(
    a: &Automaton,
    hay: &[u8],
    span: impl Fn(usize, usize) -> (usize, usize),
    out: &mut Vec<(usize, usize, usize)>,
) {
    let mut local = Vec::new();
    for m in a.automaton.find_overlapping_iter(hay) {
        let (s, e) = span(m.start(), m.end());
        push_merged(&mut local, s, e, a.owner[m.pattern().as_usize()]);
    }
    out.extend(local);
}

/// A stretch of the decoded reading that is not the text's own bytes: an
/// escape undone (`dec_len` bytes from `orig_len`) or a byte dropped
/// (`dec_len` 0).
#[derive(Debug, Clone, Copy)]
struct Unit {
    dec: usize,
    dec_len: usize,
    orig: usize,
    orig_len: usize,
}

/// A text read with its escapes undone and its line breaks and NULs
/// dropped, and where each byte of the reading came from.
#[derive(Debug)]
struct Decoded {
    bytes: Vec<u8>,
    units: Vec<Unit>,
}

impl Decoded {
    /// Where decoded byte `i` came from in the text.
    fn origin(&self, i: usize) -> (usize, usize) {
        let k = self.units.partition_point(|u| u.dec <= i);
        let Some(u) = k.checked_sub(1).and_then(|k| self.units.get(k)) else {
            return (i, i + 1);
        };
        if i < u.dec + u.dec_len {
            (u.orig, u.orig + u.orig_len)
        } else {
            let o = u.orig + u.orig_len + (i - u.dec - u.dec_len);
            (o, o + 1)
        }
    }

    /// The stretch of the text decoded bytes `s..e` (`s < e`) came from.
    fn span(&self, s: usize, e: usize) -> (usize, usize) {
        (self.origin(s).0, self.origin(e.saturating_sub(1).max(s)).1)
    }
}

/// What one escape stands for.
enum Esc {
    Byte(u8),
    Char(char),
    Drop,
}

fn hex_value(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let s = std::str::from_utf8(digits).ok()?;
    u32::from_str_radix(s, 16).ok()
}

/// The `\uXXXX` at `t[i..]` (a code unit).
fn unit16(t: &[u8], i: usize) -> Option<u32> {
    if t.get(i..i + 2)? != b"\\u" {
        return None;
    }
    hex_value(t.get(i + 2..i + 6)?)
}

/// The escape starting at `t[i]` (a `%`, `\` or `&`), and its length.
fn escape_at(t: &[u8], i: usize) -> Option<(Esc, usize)> {
    match t[i] {
        b'%' => Some((Esc::Byte(hex_value(t.get(i + 1..i + 3)?)? as u8), 3)),
        b'\\' => match *t.get(i + 1)? {
            b'u' if t.get(i + 2) == Some(&b'{') => {
                let close = t.get(i + 3..)?.iter().take(7).position(|&b| b == b'}')?;
                let c = char::from_u32(hex_value(&t[i + 3..i + 3 + close])?)?;
                Some((Esc::Char(c), close + 4))
            }
            b'u' => {
                let hi = unit16(t, i)?;
                if (0xD800..0xDC00).contains(&hi) {
                    let lo = unit16(t, i + 6).filter(|lo| (0xDC00..0xE000).contains(lo))?;
                    let c = char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?;
                    Some((Esc::Char(c), 12))
                } else {
                    Some((Esc::Char(char::from_u32(hi)?), 6))
                }
            }
            b'x' => Some((Esc::Byte(hex_value(t.get(i + 2..i + 4)?)? as u8), 4)),
            b'n' | b'r' | b'0' => Some((Esc::Drop, 2)),
            b't' => Some((Esc::Byte(b'\t'), 2)),
            b @ (b'"' | b'\\' | b'/' | b'\'') => Some((Esc::Byte(b), 2)),
            _ => None,
        },
        b'&' => {
            let semi = t.get(i + 1..)?.iter().take(10).position(|&b| b == b';')?;
            let name = &t[i + 1..i + 1 + semi];
            let code = match name {
                [b'#', b'x' | b'X', hex @ ..] => hex_value(hex)?,
                [b'#', dec @ ..] if !dec.is_empty() && dec.iter().all(u8::is_ascii_digit) => {
                    std::str::from_utf8(dec).ok()?.parse().ok()?
                }
                _ => u32::from(named_entity(name)?),
            };
            Some((Esc::Char(char::from_u32(code)?), semi + 2))
        }
        _ => None,
    }
}

/// The HTML named references of the ASCII punctuation keys and tokens use.
fn named_entity(name: &[u8]) -> Option<u8> {
    Some(match name {
        b"amp" | b"AMP" => b'&',
        b"lt" | b"LT" => b'<',
        b"gt" | b"GT" => b'>',
        b"quot" | b"QUOT" => b'"',
        b"apos" => b'\'',
        b"plus" => b'+',
        b"sol" => b'/',
        b"bsol" => b'\\',
        b"equals" => b'=',
        b"lowbar" | b"UnderBar" => b'_',
        b"period" => b'.',
        b"hyphen" | b"dash" => b'-',
        b"colon" => b':',
        b"semi" => b';',
        b"comma" => b',',
        b"excl" => b'!',
        b"quest" => b'?',
        b"num" => b'#',
        b"dollar" => b'$',
        b"percnt" => b'%',
        b"ast" | b"midast" => b'*',
        b"commat" => b'@',
        b"tilde" => b'~',
        b"Hat" => b'^',
        b"grave" => b'`',
        b"verbar" | b"vert" => b'|',
        b"lpar" => b'(',
        b"rpar" => b')',
        b"lsqb" | b"lbrack" => b'[',
        b"rsqb" | b"rbrack" => b']',
        b"lcub" | b"lbrace" => b'{',
        b"rcub" | b"rbrace" => b'}',
        _ => return None,
    })
}

/// `text` read with its escapes undone (see [`escape_at`]) and its line
/// breaks and NULs dropped; `None` when that reading is the text itself.
/// Each byte of `text` is read at most once: linear.
fn decode(text: &[u8]) -> Option<Decoded> {
    let special = |b: u8| matches!(b, b'%' | b'\\' | b'&' | b'\r' | b'\n' | 0);
    let first = text.iter().position(|&b| special(b))?;
    let mut bytes = Vec::with_capacity(text.len());
    bytes.extend_from_slice(&text[..first]);
    let mut units = Vec::new();
    let mut i = first;
    while i < text.len() {
        let b = text[i];
        if !special(b) {
            bytes.push(b);
            i += 1;
            continue;
        }
        let (esc, used) = match b {
            b'\r' | b'\n' | 0 => (Esc::Drop, 1),
            _ => match escape_at(text, i) {
                Some(e) => e,
                None => {
                    bytes.push(b);
                    i += 1;
                    continue;
                }
            },
        };
        let dec = bytes.len();
        match esc {
            Esc::Byte(b'\r' | b'\n' | 0) | Esc::Char('\r' | '\n' | '\0') | Esc::Drop => {}
            Esc::Byte(b) => bytes.push(b),
            Esc::Char(c) => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
        units.push(Unit {
            dec,
            dec_len: bytes.len() - dec,
            orig: i,
            orig_len: used,
        });
        i += used;
    }
    if units.is_empty() {
        return None;
    }
    Some(Decoded { bytes, units })
}

/// Escapes undone in a text escaped more than once (JSON in a JSON
/// string, a URL in JSON) at most this many times.
const READINGS: usize = 3;

/// The successive readings of `text` (see [`decode`]): each undoes the
/// escapes of the one before; none when the text has nothing to undo.
fn readings(text: &[u8]) -> Vec<Decoded> {
    let mut out: Vec<Decoded> = Vec::new();
    while out.len() < READINGS {
        let next = match out.last() {
            None => decode(text),
            Some(d) => decode(&d.bytes),
        };
        match next {
            Some(d) => out.push(d),
            None => break,
        }
    }
    out
}

/// The automata over every run of every secret, one set for each reader.
pub struct Redactor {
    secrets: Vec<Secret>,
    tenant: Matcher,
    operator: Matcher,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets)
            .finish()
    }
}

impl Redactor {
    /// A redactor of `secrets` (empty ones are ignored).
    pub fn new(secrets: Vec<Secret>) -> Result<Redactor, SecretsError> {
        let secrets: Vec<Secret> = secrets
            .into_iter()
            .filter(|s| !s.expose().is_empty())
            .collect();
        Ok(Redactor {
            tenant: Matcher::build(&secrets, Reader::Tenant)?,
            operator: Matcher::build(&secrets, Reader::Operator)?,
            secrets,
        })
    }

    /// A redactor of no secret.
    pub fn empty() -> Redactor {
        Redactor {
            secrets: Vec::new(),
            tenant: Matcher::default(),
            operator: Matcher::default(),
        }
    }

    fn matcher(&self, reader: Reader) -> &Matcher {
        match reader {
            Reader::Tenant => &self.tenant,
            Reader::Operator => &self.operator,
        }
    }

    /// True when it knows no secret (redaction is a no-op).
    pub fn is_empty(&self) -> bool {
        self.operator.is_empty()
    }

    /// The secrets it knows.
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// True when `text` holds something this redactor would replace for
    /// `reader`.
    pub fn finds(&self, reader: Reader, text: &[u8]) -> bool {
        self.matcher(reader).finds(text)
    }

    /// `text` as `reader` may see it: every stretch of runs of a secret
    /// (on character boundaries) replaced.
    pub fn redact<'a>(&self, reader: Reader, text: &'a str) -> Cow<'a, str> {
        let stretches = self.bounded(reader, text);
        if stretches.is_empty() {
            return Cow::Borrowed(text);
        }
        Cow::Owned(self.render(text, &stretches))
    }

    /// The stretches to replace in `text`, on character boundaries.
    fn bounded(&self, reader: Reader, text: &str) -> Vec<(usize, usize, usize)> {
        let stretches = self.matcher(reader).stretches(text.as_bytes());
        let mut bounded: Vec<(usize, usize, usize)> = Vec::with_capacity(stretches.len());
        for (mut s, mut e, who) in stretches {
            while !text.is_char_boundary(s) {
                s -= 1;
            }
            while !text.is_char_boundary(e) {
                e += 1;
            }
            push_merged(&mut bounded, s, e, who);
        }
        bounded
    }

    /// `text` with `stretches` (within it) replaced.
    fn render(&self, text: &str, stretches: &[(usize, usize, usize)]) -> String {
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for &(s, e, who) in stretches {
            out.push_str(&text[at..s]);
            out.push_str("[REDACTED:");
            out.push_str(self.secrets[who].name());
            out.push(']');
            at = e;
        }
        out.push_str(&text[at..]);
        out
    }

    /// The part of a stream's `text` that may go out now, redacted for
    /// `reader`, and how many bytes of `text` it stands for: all but the
    /// end a match could begin in and go on past (see
    /// [`StreamRedaction`]).
    fn redact_settled(&self, reader: Reader, text: &str) -> (String, usize) {
        let mut cut = text.len() - self.matcher(reader).held(text.as_bytes());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut stretches = self.bounded(reader, text);
        // A stretch across the cut waits with the rest.
        stretches.retain(|&(s, e, _)| {
            if s < cut && cut < e {
                cut = s;
            }
            e <= cut
        });
        (self.render(&text[..cut], &stretches), cut)
    }

    /// [`Redactor::redact`] of an owned string, in place.
    pub fn redact_string(&self, reader: Reader, s: &mut String) {
        if let Cow::Owned(r) = self.redact(reader, s) {
            *s = r;
        }
    }

    /// Every string of `v` (keys too) redacted for `reader`, in place.
    pub fn redact_value(&self, reader: Reader, v: &mut Value) {
        match v {
            Value::String(s) => self.redact_string(reader, s),
            // A secret of digits may come back as a number: it leaves as
            // the redacted text.
            Value::Number(n) => {
                let text = n.to_string();
                if self.finds(reader, text.as_bytes()) {
                    *v = Value::String(self.redact(reader, &text).into_owned());
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|v| self.redact_value(reader, v)),
            Value::Object(o) => {
                if o.keys().any(|k| self.finds(reader, k.as_bytes())) {
                    let old = std::mem::take(o);
                    for (k, v) in old {
                        o.insert(self.redact(reader, &k).into_owned(), v);
                    }
                }
                o.values_mut().for_each(|v| self.redact_value(reader, v));
            }
            _ => {}
        }
    }

    /// Bytes (lossy UTF-8 when they are not text) with every secret
    /// replaced for `reader`.
    pub fn redact_bytes<'a>(&self, reader: Reader, b: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.finds(reader, b) {
            return Cow::Borrowed(b);
        }
        Cow::Owned(
            self.redact(reader, &String::from_utf8_lossy(b))
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
/// warnings: the secrets too short to be cut into two blocks.
pub fn load<'a>(vars: impl IntoIterator<Item = &'a str>) -> Result<Vec<String>, SecretsError> {
    let mut warnings = Vec::new();
    for var in vars {
        if let Some(s) = from_env(var)? {
            if s.is_short() {
                warnings.push(format!(
                    "the secret in {var} is short ({} bytes, under two blocks of {GUESS_BITS} \
                     bits, {} bytes each, by its characters): a cell or client may be shown a \
                     part of it that leaves the rest guessable; use a longer random secret",
                    s.expose().len(),
                    s.block()
                ));
            }
        }
    }
    Ok(warnings)
}

/// `text` with every registered secret replaced, as a tenant may see it.
pub fn redact(text: &str) -> Cow<'_, str> {
    redact_for(Reader::Tenant, text)
}

/// `text` with every registered secret replaced, for the operator's
/// records (the log, the events file, a terminal of the operator's).
pub fn redact_record(text: &str) -> Cow<'_, str> {
    redact_for(Reader::Operator, text)
}

fn redact_for(reader: Reader, text: &str) -> Cow<'_, str> {
    let r = current();
    if r.is_empty() {
        return Cow::Borrowed(text);
    }
    match r.redact(reader, text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// [`redact`] of an owned string.
pub fn redact_owned(text: String) -> String {
    let r = current();
    let mut text = text;
    r.redact_string(Reader::Tenant, &mut text);
    text
}

/// [`redact`] of bytes (lossy UTF-8 where a secret is found).
pub fn redact_bytes(b: &[u8]) -> Cow<'_, [u8]> {
    let r = current();
    if !r.finds(Reader::Tenant, b) {
        return Cow::Borrowed(b);
    }
    match r.redact_bytes(Reader::Tenant, b) {
        Cow::Borrowed(_) => Cow::Borrowed(b),
        Cow::Owned(v) => Cow::Owned(v),
    }
}

/// [`redact`] of every string in `v`.
pub fn redact_value(v: &mut Value) {
    let r = current();
    if !r.is_empty() {
        r.redact_value(Reader::Tenant, v);
    }
}

/// [`redact_record`] of every string in `v`.
pub fn redact_record_value(v: &mut Value) {
    let r = current();
    if !r.is_empty() {
        r.redact_value(Reader::Operator, v);
    }
}

/// A typed value (a cell's result, a call's reply) with every string in it
/// redacted as a tenant may see it: it is scanned as JSON, and rebuilt
/// only when a secret is found. `Err` when the redacted form no longer
/// reads as `T` (a secret short enough to match a field's fixed
/// vocabulary): the caller must not send the value.
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
    if !r.finds(Reader::Tenant, &text) {
        return Ok(t);
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(&text) else {
        return Err(t);
    };
    r.redact_value(Reader::Tenant, &mut v);
    serde_json::from_value(v).map_err(|_| t)
}

/// A stream of text (a cell's live output) redacted as it arrives, not
/// piece by piece: a secret written in two pieces is found across them.
/// Each piece gives what may go out now; the end of the text, where a
/// secret could begin and go on in the next piece, waits (at most the
/// span of one match, and only while it is made of bytes a match can hold:
/// text that ends with a space or punctuation goes out whole).
#[derive(Debug)]
pub struct StreamRedaction {
    reader: Reader,
    pending: String,
}

impl StreamRedaction {
    /// A stream shown to `reader`.
    pub fn new(reader: Reader) -> StreamRedaction {
        StreamRedaction {
            reader,
            pending: String::new(),
        }
    }

    /// Take in `text`; what may go out now (possibly nothing).
    pub fn push(&mut self, text: &str) -> String {
        self.push_with(&current(), text)
    }

    /// The stream ended: the rest, redacted.
    pub fn finish(&mut self) -> String {
        self.finish_with(&current())
    }

    fn push_with(&mut self, r: &Redactor, text: &str) -> String {
        self.pending.push_str(text);
        if r.is_empty() {
            return std::mem::take(&mut self.pending);
        }
        let (out, used) = r.redact_settled(self.reader, &self.pending);
        self.pending.drain(..used);
        out
    }

    fn finish_with(&mut self, r: &Redactor) -> String {
        let rest = std::mem::take(&mut self.pending);
        r.redact(self.reader, &rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of the shape model providers issue: a public prefix, then
    /// letters and digits.
    const KEY: &str =
        "sk-proj-4f9a8B7c6d5E4f3a2b1C0d9e8F7a6b5cQx7f9K2mZpL0aB3cD4eF5gH6iJ7kL8mN9oP0";

    fn red(secrets: &[(&str, &str)]) -> Redactor {
        Redactor::new(
            secrets
                .iter()
                .map(|(n, v)| Secret::new(n, (*v).to_owned()))
                .collect(),
        )
        .unwrap()
    }

    /// The longest run of `secret` left in `text`.
    fn longest_run(text: &str, secret: &str) -> usize {
        let (t, s) = (text.as_bytes(), secret.as_bytes());
        (1..=s.len())
            .rev()
            .find(|&n| s.windows(n).any(|w| t.windows(n).any(|x| x == w)))
            .unwrap_or(0)
    }

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    #[test]
    fn the_operator_sees_no_run_of_a_window() {
        let r = red(&[("MODEL_KEY", KEY)]);
        let text = format!("auth: Bearer {KEY}, again {KEY}.");
        assert_eq!(
            r.redact(Reader::Operator, &text),
            "auth: Bearer [REDACTED:MODEL_KEY], again [REDACTED:MODEL_KEY]."
        );
        for start in 0..KEY.len() - WINDOW {
            for end in start + WINDOW..=KEY.len() {
                let part = &KEY[start..end];
                let text = format!("<{part}>");
                assert_eq!(
                    r.redact(Reader::Operator, &text),
                    "<[REDACTED:MODEL_KEY]>",
                    "{part}"
                );
            }
        }
        // Seven bytes are not a run.
        assert_eq!(r.redact(Reader::Operator, &KEY[3..10]), &KEY[3..10]);
        assert_eq!(r.redact(Reader::Operator, "nothing here"), "nothing here");
    }

    #[test]
    fn a_tenant_sees_no_run_that_holds_a_block() {
        let r = red(&[("MODEL_KEY", KEY)]);
        let block = r.secrets()[0].block();
        // The key uses 40 distinct characters (5.3 bits each): 13 carry
        // 64 bits.
        assert_eq!(block, 13);
        // Every run of two blocks less one, anywhere, and the whole key.
        for start in 0..=KEY.len() - (2 * block - 1) {
            for end in start + 2 * block - 1..=KEY.len() {
                let text = format!("<{}>", &KEY[start..end]);
                let out = r.redact(Reader::Tenant, &text);
                assert!(out.contains("[REDACTED:MODEL_KEY]"), "{out}");
                // What is left of the run is less than a block each side.
                let left = out.replace("[REDACTED:MODEL_KEY]", "");
                assert!(left.len() < 2 * block + 2, "{out}");
            }
        }
        assert_eq!(
            r.redact(Reader::Tenant, &format!("<{KEY}>")),
            "<[REDACTED:MODEL_KEY]>"
        );
        // Runs that hold the first or the last block.
        for n in block..KEY.len() {
            for text in [&KEY[..n], &KEY[KEY.len() - n..]] {
                assert!(
                    r.redact(Reader::Tenant, text).contains("[REDACTED"),
                    "{text}"
                );
            }
        }
        // A run of less than a block is left as it is.
        let text = format!("<{}>", &KEY[20..20 + block - 1]);
        assert_eq!(r.redact(Reader::Tenant, &text), text);
    }

    #[test]
    fn a_short_secret_is_redacted_at_every_run_of_a_block() {
        let token = "tok-0123456789abcdef01234567";
        let r = red(&[("T", token)]);
        let block = r.secrets()[0].block();
        assert!(r.secrets()[0].is_short());
        for start in 0..=token.len() - block {
            let text = format!("<{}>", &token[start..start + block]);
            assert_eq!(r.redact(Reader::Tenant, &text), "<[REDACTED:T]>");
        }
        let text = format!("<{}>", &token[3..3 + block - 1]);
        assert_eq!(r.redact(Reader::Tenant, &text), text);
    }

    #[test]
    fn a_tenant_cannot_spell_a_key_out_through_the_redaction() {
        // The attack: candidates made of what is known (the public prefix,
        // then what the redaction confirmed) and one more character; the
        // one redacted is the next character of the key.
        let r = red(&[("MODEL_KEY", KEY)]);
        let alphabet: Vec<char> = ('a'..='z').chain('A'..='Z').chain('0'..='9').collect();
        let mut known = String::from("sk-proj-");
        for _ in 0..KEY.len() - known.len() {
            let hit: Vec<char> = alphabet
                .iter()
                .copied()
                .filter(|c| {
                    let candidate = format!("<{known}{c}>");
                    r.redact(Reader::Tenant, &candidate) != candidate
                })
                .collect();
            let [c] = hit.as_slice() else { break };
            known.push(*c);
        }
        assert_eq!(known, "sk-proj-", "the redaction confirmed {known:?}");
        // Nor from inside: knowing all of the key but the end of its
        // second block, the next character is not confirmed either.
        let block = r.secrets()[0].block();
        for c in &alphabet {
            let candidate = format!("<{}{c}>", &KEY[block + 1..2 * block - 1]);
            assert_eq!(r.redact(Reader::Tenant, &candidate), candidate);
        }
        // Control: the operator's records answer to such candidates
        // (they reach no tenant).
        let candidate = format!("<{}>", &KEY[..9]);
        assert_ne!(r.redact(Reader::Operator, &candidate), candidate);
    }

    #[test]
    fn the_block_follows_the_alphabet() {
        let hex = "0123456789abcdef0123456789abcdef0123456789abcdef";
        let digits = "31415926535897932384626433832795028841971693993751";
        let s = |v: &str| Secret::new("S", v.to_owned());
        assert_eq!(s(hex).block(), 16);
        assert_eq!(s(digits).block(), 20);
        assert_eq!(s("aaaaaaaaaaaaaaaaaaaaaaaaaaaa").block(), 64);
        assert!(s("0123456789abcdef0123456789abcde").is_short());
        assert!(!s(KEY).is_short());
    }

    #[test]
    fn encodings_are_caught_at_every_alignment() {
        let key = "tok/with+odd=chars \"and\" é and more, long enough to be partly seen";
        let r = red(&[("TOKEN", key)]);
        let b64u = |s: &[u8]| base64::engine::general_purpose::URL_SAFE.encode(s);
        let b32 = |s: &[u8]| data_encoding::BASE32.encode(s);
        for reader in [Reader::Tenant, Reader::Operator] {
            for pre in ["", "a", "ab", "abc", "abcd", "user:"] {
                let mut plain = pre.as_bytes().to_vec();
                plain.extend_from_slice(key.as_bytes());
                plain.extend_from_slice(b"-tail");
                for (enc, group) in [
                    (b64(&plain), 4),
                    (b64u(&plain), 4),
                    (b32(&plain), 8),
                    (b32(&plain).to_lowercase(), 8),
                ] {
                    let out = r.redact(reader, &enc);
                    assert!(out.contains("[REDACTED:TOKEN]"), "{pre:?}: {out}");
                    // What is left is a group or two at each end (and the
                    // encoding of the prefix and tail).
                    let left = out.replace("[REDACTED:TOKEN]", "");
                    assert!(left.len() <= 6 * group, "{reader:?} {pre:?}: {out}");
                }
            }
            let json = serde_json::to_string(key).unwrap();
            assert_eq!(r.redact(reader, &json), "\"[REDACTED:TOKEN]\"");
            let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
            assert_eq!(r.redact(reader, &hex), "[REDACTED:TOKEN]");
            // Hex in mixed case.
            let mixed: String = hex
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 3 == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            assert_eq!(r.redact(reader, &mixed), "[REDACTED:TOKEN]");
        }
    }

    #[test]
    fn escapes_of_any_character_are_read_through() {
        let key = "Zt7/Qp+Lm3=Xv9_Rk2~Wb8.Nc4-Hs6Jd5Fg1Ay0Ue3Io5Pa7Sd9";
        let r = red(&[("TOKEN", key)]);
        let per_char = |f: &dyn Fn(usize, u8) -> String| -> String {
            key.bytes().enumerate().map(|(i, b)| f(i, b)).collect()
        };
        let forms = [
            // Python's quote keeps '/', JavaScript's encodeURIComponent
            // keeps '~' and '-': percent-escapes of some characters.
            per_char(&|_, b| {
                if b.is_ascii_alphanumeric() || b == b'/' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            }),
            // Every character, lower-case hex digits.
            per_char(&|_, b| format!("%{b:02x}")),
            // JSON escapes of ordinary letters, every third one.
            per_char(&|i, b| {
                if i % 3 == 0 {
                    format!("\\u{:04X}", b)
                } else {
                    (b as char).to_string()
                }
            }),
            // HTML character references, decimal, hex and named.
            per_char(&|i, b| match (i % 4, b) {
                (_, b'/') => "&sol;".to_owned(),
                (_, b'+') => "&#43;".to_owned(),
                (0, _) => format!("&#x{b:x};"),
                (1, _) => format!("&#{b};"),
                _ => (b as char).to_string(),
            }),
            // Wrapped every 10 characters, and `\xNN` escapes.
            per_char(&|i, b| {
                let c = if b == b'=' {
                    "\\x3d".to_owned()
                } else {
                    (b as char).to_string()
                };
                if i % 10 == 9 {
                    format!("{c}\r\n")
                } else {
                    c
                }
            }),
            // UTF-16 (little-endian), as a lossy reading shows it.
            per_char(&|_, b| format!("{}\0", b as char)),
            // JSON of a JSON document holding the key with '/' escaped.
            serde_json::to_string(&format!("{{\"k\":\"{}\"}}", key.replace('/', "\\/"))).unwrap(),
        ];
        for form in forms {
            for reader in [Reader::Tenant, Reader::Operator] {
                let text = format!("before {form} after");
                let out = r.redact(reader, &text);
                assert!(
                    out.contains("[REDACTED:TOKEN]"),
                    "{reader:?}: {text} -> {out}"
                );
                assert!(longest_run(&out, key) < 4, "{reader:?}: {out}");
                assert!(
                    out.starts_with("before ") && out.ends_with(" after"),
                    "{out}"
                );
            }
        }
    }

    #[test]
    fn short_secrets_are_caught_whole_only() {
        let r = red(&[("PIN", "4711x")]);
        for reader in [Reader::Tenant, Reader::Operator] {
            assert_eq!(r.redact(reader, "pin 4711x!"), "pin [REDACTED:PIN]!");
            assert_eq!(r.redact(reader, "4711"), "4711");
        }
        assert!(r.secrets()[0].is_short());
    }

    #[test]
    fn several_secrets_values_and_multibyte_text() {
        let other = "another-secret-value-123-with-enough-entropy-XyZ";
        let r = red(&[("A", KEY), ("B", other)]);
        let mut v = serde_json::json!({
            "text": format!("é{KEY}é and {other}"),
            "list": [KEY.to_owned()],
            format!("key-{KEY}"): 1,
        });
        r.redact_value(Reader::Tenant, &mut v);
        let s = v.to_string();
        assert!(longest_run(&s, KEY) < WINDOW, "{s}");
        assert!(longest_run(&s, other) < WINDOW, "{s}");
        assert!(s.contains("é[REDACTED:A]é and [REDACTED:B]"), "{s}");
        assert!(s.contains("key-[REDACTED:A]"), "{s}");
    }

    #[test]
    fn decoded_stretches_map_back_to_the_text() {
        let d = decode(b"a%41\\u0042\r\nc&amp;d").unwrap();
        assert_eq!(d.bytes, b"aABc&d");
        assert_eq!(d.span(0, 1), (0, 1));
        assert_eq!(d.span(1, 2), (1, 4));
        assert_eq!(d.span(1, 3), (1, 10));
        assert_eq!(d.span(3, 4), (12, 13));
        assert_eq!(d.span(2, 5), (4, 18));
        assert!(decode(b"plain text & 100% sure").is_none());
    }

    #[test]
    fn a_stream_is_redacted_across_its_pieces() {
        let r = red(&[("MODEL_KEY", KEY)]);
        let block = r.secrets()[0].block();
        let b64 = b64(KEY.as_bytes());
        let pct: String = KEY.bytes().map(|b| format!("%{b:02x}")).collect();
        for text in [
            format!("line one\nthe key: {KEY}\nlast line\n"),
            format!("encoded {b64} and {pct}."),
        ] {
            for reader in [Reader::Tenant, Reader::Operator] {
                // Cut in two at every byte, and in pieces of every size.
                let mut splits: Vec<Vec<&str>> = (1..text.len())
                    .filter(|&i| text.is_char_boundary(i))
                    .map(|i| vec![&text[..i], &text[i..]])
                    .collect();
                for size in [1, 2, 3, 7, 13] {
                    let bytes = text.as_bytes();
                    splits.push(
                        bytes
                            .chunks(size)
                            .map(|c| std::str::from_utf8(c).unwrap())
                            .collect(),
                    );
                }
                for pieces in splits {
                    let mut stream = StreamRedaction::new(reader);
                    let mut out: String = pieces.iter().map(|p| stream.push_with(&r, p)).collect();
                    out.push_str(&stream.finish_with(&r));
                    assert!(
                        out.contains("[REDACTED:MODEL_KEY]"),
                        "{reader:?} {pieces:?}: {out}"
                    );
                    let limit = match reader {
                        Reader::Tenant => block,
                        Reader::Operator => WINDOW,
                    };
                    assert!(
                        longest_run(&out, KEY) < limit,
                        "{reader:?} {pieces:?}: {out}"
                    );
                    assert!(
                        !out.contains(&b64[..24]) && !out.contains(&pct[..48]),
                        "{out}"
                    );
                }
            }
        }
        // Control: the same pieces redacted one by one leak the key.
        for reader in [Reader::Tenant, Reader::Operator] {
            let each: String = KEY
                .as_bytes()
                .chunks(WINDOW - 1)
                .map(|c| {
                    r.redact(reader, std::str::from_utf8(c).unwrap())
                        .into_owned()
                })
                .collect();
            assert_eq!(each, KEY);
        }
    }

    #[test]
    fn a_stream_holds_back_only_what_could_begin_a_secret() {
        let r = red(&[("MODEL_KEY", KEY)]);
        let mut stream = StreamRedaction::new(Reader::Tenant);
        // Ending in a space or punctuation: all of it goes out now.
        assert_eq!(stream.push_with(&r, "step 1 of 3: "), "step 1 of 3: ");
        assert_eq!(stream.push_with(&r, "done. "), "done. ");
        // Ending in a word: the word waits for what follows it.
        assert_eq!(stream.push_with(&r, "step 2 of 3 done"), "step 2 of 3 ");
        assert_eq!(stream.push_with(&r, ", next\n"), "done, ");
        assert_eq!(stream.finish_with(&r), "next\n");
        // No secret known: nothing waits.
        let none = Redactor::empty();
        let mut stream = StreamRedaction::new(Reader::Tenant);
        assert_eq!(stream.push_with(&none, "word"), "word");
    }

    #[test]
    fn any_case_and_numbers_are_caught() {
        let account = "314159265358979323";
        let r = red(&[("MODEL_KEY", KEY), ("ACCOUNT", account)]);
        let swapped: String = KEY
            .chars()
            .map(|c| {
                if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        for reader in [Reader::Tenant, Reader::Operator] {
            for form in [KEY.to_uppercase(), KEY.to_lowercase(), swapped.clone()] {
                let text = format!("key {form}.");
                assert_eq!(
                    r.redact(reader, &text),
                    "key [REDACTED:MODEL_KEY].",
                    "{reader:?}"
                );
            }
            let mut v: Value =
                serde_json::from_str(&format!("{{\"n\": {account}, \"m\": 7}}")).unwrap();
            r.redact_value(reader, &mut v);
            assert_eq!(v, serde_json::json!({"n": "[REDACTED:ACCOUNT]", "m": 7}));
        }
    }

    #[test]
    fn debug_never_shows_a_value() {
        let s = Secret::new("K", KEY.to_owned());
        let r = Redactor::new(vec![s.clone()]).unwrap();
        assert!(!format!("{s:?} {r:?}").contains(&KEY[..WINDOW]));
    }

    #[test]
    fn text_full_of_secrets_is_redacted_in_one_pass() {
        let token = "tok-0123456789abcdef0123456789abcdef";
        let r = red(&[("A", KEY), ("token:alice", token)]);
        let mut text = "lorem ipsum dolor sit amet\n".repeat(10_000);
        text.push_str(KEY);
        for reader in [Reader::Tenant, Reader::Operator] {
            let out = r.redact(reader, &text);
            assert!(out.ends_with("[REDACTED:A]"));
            assert_eq!(out.len(), text.len() - KEY.len() + "[REDACTED:A]".len());
        }
        // Every byte in a match of every window: one stretch each.
        let dense = format!("{token} ").repeat(20_000);
        let m = &r.operator;
        let stretches = m.stretches(dense.as_bytes());
        assert_eq!(stretches.len(), 20_000);
        let out = r.redact(Reader::Operator, &dense);
        assert_eq!(out, "[REDACTED:token:alice] ".repeat(20_000));
    }
}
