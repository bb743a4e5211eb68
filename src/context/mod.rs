//! `aggregate_context`: fit the results of several tools into a token
//! budget. Results are merged into pieces (the same file read twice and
//! overlapping or adjacent line ranges become one piece; identical text is
//! kept once), ranked by relevance to the query ([`Relevance`]; BM25 over
//! the query's terms by default, the seam for embeddings), and added in rank
//! order while the text, counted with a real BPE tokenizer (o200k_base or
//! cl100k_base), stays within the budget. Whole pieces are cut first; only
//! when not even the best one fits is it shortened, and marked so.
//!
//! Its work grows with its input, not with pieces times text: each piece is
//! counted once (the text of pieces put one after another counts as the
//! sum of theirs: each ends with a newline and the next starts with `=`,
//! where the tokenizer splits anyway), and the input is bounded
//! ([`MAX_RESULTS`], [`MAX_INPUT_BYTES`]). It runs on a blocking thread
//! that stops, at the next piece or [`CHUNK_BYTES`] of text (at most
//! [`MAX_CHUNK_BYTES`] in a text without a place to cut), once its caller
//! gave up (the cell ended, the client cancelled) or [`MAX_SECONDS`]
//! passed.

use crate::supervisor::{Capability, CapabilityError};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Most results (and `search_files` matches, counted one each) one call
/// may pass.
pub const MAX_RESULTS: usize = 20_000;
/// Most bytes of text (and of JSON for results that are not text) one call
/// may pass, the query included.
pub const MAX_INPUT_BYTES: usize = 16 << 20;
/// Text counted between two looks at whether to stop.
pub const CHUNK_BYTES: usize = 64 << 10;
/// Most text counted between two looks at whether to stop, when the text
/// has no place where the tokenizer splits anyway.
pub const MAX_CHUNK_BYTES: usize = 16 * CHUNK_BYTES;
/// Longest one call may run, whoever waits for it.
pub const MAX_SECONDS: u64 = 60;

/// Why an aggregation gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AggregateError {
    #[error(
        "aggregate_context: {given} results (search matches counted one each), over the limit \
         of {MAX_RESULTS}"
    )]
    TooMany { given: usize },
    #[error(
        "aggregate_context: the results and query hold more than {MAX_INPUT_BYTES} bytes, the \
         limit of one call"
    )]
    TooLarge,
    #[error("aggregate_context: stopped: its caller gave up")]
    Cancelled,
    #[error("aggregate_context: stopped after {MAX_SECONDS} s, the most one call may run")]
    TimedOut,
}

/// When an aggregation is to stop: a token its caller cancels (or that is
/// cancelled when its caller gives up), and a deadline.
#[derive(Debug, Clone)]
pub struct Stop {
    token: CancellationToken,
    deadline: Option<Instant>,
}

impl Stop {
    pub fn new(deadline: Option<Instant>) -> Stop {
        Stop::with(&CancellationToken::new(), deadline)
    }

    /// A stop that also comes when `caller` is cancelled (stopping this
    /// one leaves `caller` as it is).
    pub fn with(caller: &CancellationToken, deadline: Option<Instant>) -> Stop {
        Stop {
            token: caller.child_token(),
            deadline,
        }
    }

    /// A stop that never comes.
    pub fn never() -> Stop {
        Stop::new(None)
    }

    /// Stop the aggregation at its next look.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// A guard that stops the aggregation when dropped: held by the future
    /// its caller awaits, so that the work ends when the caller goes.
    pub fn on_drop(&self) -> StopOnDrop {
        StopOnDrop(self.clone())
    }

    fn check(&self) -> Result<(), AggregateError> {
        if self.token.is_cancelled() {
            return Err(AggregateError::Cancelled);
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(AggregateError::TimedOut),
            _ => Ok(()),
        }
    }
}

/// See [`Stop::on_drop`].
#[derive(Debug)]
pub struct StopOnDrop(Stop);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Aggregations running now (on blocking threads), and those stopped
/// before their end (their caller gone, or out of time): for tests and
/// metrics.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static STOPPED: AtomicUsize = AtomicUsize::new(0);

/// How many aggregations are running now.
pub fn running() -> usize {
    RUNNING.load(Ordering::Relaxed)
}

/// How many aggregations were stopped before their end since the start.
pub fn stopped() -> usize {
    STOPPED.load(Ordering::Relaxed)
}

struct Running;

impl Running {
    fn start() -> Running {
        RUNNING.fetch_add(1, Ordering::Relaxed);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Appended to a piece shortened to fit the budget.
pub const CUT_MARK: &str = "\n[... cut to fit the token budget]\n";

/// Scores documents against a query, higher is more relevant. BM25 is the
/// built-in; an embedding model would be another implementation.
pub trait Relevance: Send + Sync {
    fn scores(&self, query: &str, docs: &[&str]) -> Vec<f64>;
}

/// Okapi BM25 (k1 = 1.2, b = 0.75) over lower-cased alphanumeric terms.
#[derive(Debug, Default, Clone, Copy)]
pub struct Bm25;

fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

impl Relevance for Bm25 {
    fn scores(&self, query: &str, docs: &[&str]) -> Vec<f64> {
        let (k1, b) = (1.2, 0.75);
        let docs: Vec<Vec<String>> = docs.iter().map(|d| terms(d)).collect();
        let n = docs.len() as f64;
        let avg = docs.iter().map(Vec::len).sum::<usize>() as f64 / n.max(1.0);
        let q: HashSet<String> = terms(query).into_iter().collect();
        let mut df: HashMap<&str, f64> = HashMap::new();
        for d in &docs {
            let seen: HashSet<&str> = d.iter().map(String::as_str).collect();
            for t in seen {
                if q.contains(t) {
                    *df.entry(t).or_default() += 1.0;
                }
            }
        }
        docs.iter()
            .map(|d| {
                let mut tf: HashMap<&str, f64> = HashMap::new();
                for t in d {
                    if q.contains(t.as_str()) {
                        *tf.entry(t.as_str()).or_default() += 1.0;
                    }
                }
                let len = d.len() as f64;
                tf.iter()
                    .map(|(t, f)| {
                        let df = df.get(t).copied().unwrap_or(0.0);
                        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                        idf * f * (k1 + 1.0) / (f + k1 * (1.0 - b + b * len / avg.max(1.0)))
                    })
                    .sum()
            })
            .collect()
    }
}

/// The tokenizer a budget is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    /// Tokens of `text`, counted [`CHUNK_BYTES`] at a time with a look at
    /// `stop` between: it is cut where the tokenizer splits anyway (after a
    /// newline that a non-space follows, else before a space between a
    /// non-space and a letter), so the sum is the count of the whole.
    pub fn count_stoppable(self, text: &str, stop: &Stop) -> Result<usize, AggregateError> {
        let mut total = 0;
        let mut rest = text;
        while !rest.is_empty() {
            stop.check()?;
            let cut = split_point(rest, CHUNK_BYTES);
            total += self.count(&rest[..cut]);
            rest = &rest[cut..];
        }
        Ok(total)
    }

    pub fn count(self, text: &str) -> usize {
        #[cfg(test)]
        tests::COUNTED.with(|c| c.set(c.get() + text.len()));
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton()
                .encode_ordinary(text)
                .len(),
        }
    }
}

/// Where to cut `text` into a first chunk of about `want` bytes that the
/// tokenizer counts apart from the rest (see [`Encoding::count_stoppable`]):
/// all of it when it is short or has no such place, unless it is longer
/// than 16 times `want` ([`MAX_CHUNK_BYTES`]): then it is cut there.
fn split_point(text: &str, want: usize) -> usize {
    let b = text.as_bytes();
    if b.len() <= want {
        return b.len();
    }
    let last = b.len() - 1;
    // Cut after this newline, or before this space.
    let newline = |i: usize| b[i] == b'\n' && !b[i + 1].is_ascii_whitespace();
    let space = |i: usize| {
        b[i] == b' ' && i > 0 && !b[i - 1].is_ascii_whitespace() && b[i + 1].is_ascii_alphabetic()
    };
    let window = want.max(1)..want.saturating_mul(4).min(last);
    if let Some(i) = window.clone().find(|&i| newline(i)) {
        return i + 1;
    }
    if let Some(i) = window.clone().find(|&i| space(i)) {
        return i;
    }
    // None near: the first place past the window (each byte of the text
    // is looked at by one such search at most), but no further than
    // [`MAX_CHUNK_BYTES`]: a text with no such place (digits and spaces, a
    // run of one letter) is cut there anyway, at a character's start, so
    // that a look at whether to stop comes that often whatever the text
    // (the count may then differ by a token or two at the cut).
    let far = want.saturating_mul(16).max(1);
    let found = (window.end..far.min(last))
        .find(|&i| newline(i) || space(i))
        .map(|i| if b[i] == b'\n' { i + 1 } else { i });
    match found {
        Some(at) => at,
        None if b.len() <= far => b.len(),
        None => {
            let mut at = far;
            while !text.is_char_boundary(at) {
                at += 1;
            }
            at
        }
    }
}

/// One merged piece of context.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    source: String,
    text: String,
}

impl Piece {
    fn formatted(&self) -> String {
        let mut s = format!("=== {} ===\n{}", self.source, self.text);
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s
    }
}

/// Lines of files, by path, then line number.
type FileLines = BTreeMap<String, BTreeMap<u64, String>>;

fn add_lines(files: &mut FileLines, path: &str, start: u64, content: &str) {
    let lines = files.entry(path.to_owned()).or_default();
    for (i, l) in content.split_inclusive('\n').enumerate() {
        let mut l = l.to_owned();
        if !l.ends_with('\n') {
            l.push('\n');
        }
        lines.entry(start + i as u64).or_insert(l);
    }
}

/// Merge tool results into pieces: file lines (from `read_file` and
/// `search_files` results) per contiguous range, everything else as text,
/// identical text once.
fn pieces(results: &[Value], stop: &Stop) -> Result<Vec<Piece>, AggregateError> {
    let mut files = FileLines::new();
    let mut order: Vec<String> = Vec::new();
    let mut known: HashSet<String> = HashSet::new();
    let mut other: Vec<Piece> = Vec::new();
    let mut note_path = |p: &str, order: &mut Vec<String>| {
        if known.insert(p.to_owned()) {
            order.push(p.to_owned());
        }
    };
    for (i, r) in results.iter().enumerate() {
        stop.check()?;
        let fallback = format!("result {}", i + 1);
        match r {
            Value::String(s) => other.push(Piece {
                source: fallback,
                text: s.clone(),
            }),
            Value::Object(o) => {
                let path = o.get("path").and_then(Value::as_str);
                if let Some(ms) = o.get("matches").and_then(Value::as_array) {
                    for m in ms {
                        let (Some(p), Some(line), Some(text)) = (
                            m.get("path").and_then(Value::as_str),
                            m.get("line").and_then(Value::as_u64),
                            m.get("text").and_then(Value::as_str),
                        ) else {
                            continue;
                        };
                        note_path(p, &mut order);
                        add_lines(&mut files, p, line, text);
                    }
                } else if let (Some(p), Some(content)) =
                    (path, o.get("content").and_then(Value::as_str))
                {
                    let start = o.get("start_line").and_then(Value::as_u64).unwrap_or(1);
                    note_path(p, &mut order);
                    add_lines(&mut files, p, start.max(1), content);
                } else {
                    let source = o
                        .get("source")
                        .and_then(Value::as_str)
                        .or(path)
                        .map(str::to_owned)
                        .unwrap_or(fallback);
                    let text = o
                        .get("text")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .unwrap_or_else(|| r.to_string());
                    other.push(Piece { source, text });
                }
            }
            v => other.push(Piece {
                source: fallback,
                text: v.to_string(),
            }),
        }
    }
    let mut out = Vec::new();
    for p in order {
        let Some(lines) = files.get(&p) else { continue };
        let mut run: Option<(u64, u64, String)> = None;
        for (n, l) in lines {
            run = match run {
                Some((s, e, mut t)) if *n == e + 1 => {
                    t.push_str(l);
                    Some((s, *n, t))
                }
                Some((s, e, t)) => {
                    out.push(Piece {
                        source: format!("{p}:{s}-{e}"),
                        text: t,
                    });
                    Some((*n, *n, l.clone()))
                }
                None => Some((*n, *n, l.clone())),
            };
        }
        if let Some((s, e, t)) = run {
            out.push(Piece {
                source: format!("{p}:{s}-{e}"),
                text: t,
            });
        }
    }
    let mut seen = HashSet::new();
    for p in other {
        if seen.insert(p.text.clone()) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Check the size of the input before any work: the results (a search
/// result's matches counted one each) and the bytes of their text.
fn check_input(results: &[Value], query: &str) -> Result<(), AggregateError> {
    let mut count = 0usize;
    let mut bytes = query.len();
    let text_of = |v: &Value| -> usize {
        match v {
            Value::String(s) => s.len(),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| {
                    k.len()
                        + match v {
                            Value::String(s) => s.len(),
                            Value::Array(_) => 0,
                            other => other.to_string().len(),
                        }
                })
                .sum(),
            other => other.to_string().len(),
        }
    };
    for r in results {
        match r.get("matches").and_then(Value::as_array) {
            Some(ms) => {
                count += ms.len().max(1);
                bytes += ms.iter().map(text_of).sum::<usize>() + text_of(r);
            }
            None => {
                count += 1;
                bytes += text_of(r);
            }
        }
        if count > MAX_RESULTS {
            return Err(AggregateError::TooMany { given: count });
        }
        if bytes > MAX_INPUT_BYTES {
            return Err(AggregateError::TooLarge);
        }
    }
    Ok(())
}

/// Merge, rank and fit `results` into `budget` tokens.
pub fn aggregate(
    results: &[Value],
    query: &str,
    budget: usize,
    enc: Encoding,
    relevance: &dyn Relevance,
) -> Result<Value, AggregateError> {
    aggregate_until(results, query, budget, enc, relevance, &Stop::never())
}

/// [`aggregate`], stopping when `stop` says.
pub fn aggregate_until(
    results: &[Value],
    query: &str,
    budget: usize,
    enc: Encoding,
    relevance: &dyn Relevance,
    stop: &Stop,
) -> Result<Value, AggregateError> {
    check_input(results, query)?;
    let pieces = pieces(results, stop)?;
    stop.check()?;
    let texts: Vec<String> = pieces
        .iter()
        .map(|p| format!("{}\n{}", p.source, p.text))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let scores = relevance.scores(query, &refs);
    drop(texts);
    stop.check()?;
    let mut ranked: Vec<(usize, f64)> = scores.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));

    // Each piece counted once: the count of pieces one after another is
    // the sum of theirs (see the module docs).
    let mut counts = Vec::with_capacity(pieces.len());
    for p in &pieces {
        counts.push(enc.count_stoppable(&p.formatted(), stop)?);
    }
    let mut text = String::new();
    let mut tokens = 0usize;
    let mut included = Vec::new();
    let mut omitted = Vec::new();
    for (i, score) in &ranked {
        let p = &pieces[*i];
        if tokens + counts[*i] <= budget {
            tokens += counts[*i];
            text.push_str(&p.formatted());
            included.push(json!({"source": p.source, "score": score}));
        } else {
            omitted.push(json!({"source": p.source, "score": score, "tokens": counts[*i]}));
        }
    }
    let mut cut = Value::Null;
    if included.is_empty() {
        if let Some((i, score)) = ranked.first() {
            let p = &pieces[*i];
            if let Some(short) = shorten(p, budget, enc, stop)? {
                text = short;
                cut = json!({"source": p.source, "score": score});
                omitted.remove(0);
            }
        }
    }
    let tokens = enc.count_stoppable(&text, stop)?;
    Ok(json!({
        "text": text,
        "tokens": tokens,
        "budget_tokens": budget,
        "included": included,
        "cut": cut,
        "omitted": omitted,
    }))
}

/// The longest prefix of `p`'s text that fits in `budget` with its header
/// and [`CUT_MARK`].
fn shorten(
    p: &Piece,
    budget: usize,
    enc: Encoding,
    stop: &Stop,
) -> Result<Option<String>, AggregateError> {
    let with = |n: usize| format!("=== {} (cut) ===\n{}{CUT_MARK}", p.source, &p.text[..n]);
    let bounds: Vec<usize> = p
        .text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(p.text.len()))
        .collect();
    if enc.count_stoppable(&with(0), stop)? > budget {
        return Ok(None);
    }
    // No prefix longer than a token per byte of the budget fits.
    let longest = bounds.partition_point(|b| *b <= budget.saturating_mul(8).max(1));
    let (mut lo, mut hi) = (0usize, longest.saturating_sub(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if enc.count_stoppable(&with(bounds[mid]), stop)? <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(Some(with(bounds[lo])))
}

/// `aggregate_context` with `args` (as its schema gives them) on a blocking
/// thread; it stops when `cancel` is cancelled or the returned future is
/// dropped (its caller gave up: the cell ended, the client went away), or
/// after [`MAX_SECONDS`].
pub async fn run(args: Map<String, Value>, cancel: CancellationToken) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(MAX_SECONDS);
    let stop = Stop::with(&cancel, Some(deadline));
    let _stop_with_caller = stop.on_drop();
    run_until(args, stop).await
}

/// [`run`], stopping when `stop` says (and only then).
async fn run_until(args: Map<String, Value>, stop: Stop) -> Result<Value, String> {
    let work = tokio::task::spawn_blocking(move || {
        let _running = Running::start();
        let results = match args.get("results") {
            Some(Value::Array(a)) => a.as_slice(),
            _ => &[],
        };
        let query = args.get("query").and_then(Value::as_str).unwrap_or("");
        let budget = args
            .get("budget_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(1) as usize;
        let enc = match args.get("encoding").and_then(Value::as_str) {
            Some("cl100k_base") => Encoding::Cl100kBase,
            _ => Encoding::O200kBase,
        };
        let done = aggregate_until(results, query, budget, enc, &Bm25, &stop);
        if matches!(
            done,
            Err(AggregateError::Cancelled | AggregateError::TimedOut)
        ) {
            STOPPED.fetch_add(1, Ordering::Relaxed);
        }
        done
    });
    match work.await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("aggregate_context failed: {e}")),
    }
}

/// `aggregate_context` as a capability.
pub fn capability() -> Result<Capability, CapabilityError> {
    Capability::new(
        "aggregate_context",
        "Merge tool results (read_file, search_files, text), drop duplicates and merge overlapping \
         line ranges, rank by relevance to the query (BM25) and fit them into budget_tokens \
         (o200k_base tokens unless encoding says cl100k_base), cutting whole results first.",
        json!({"type": "object", "properties": {
            "results": {"type": "array"},
            "query": {"type": "string"},
            "budget_tokens": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
            "encoding": {"type": "string", "enum": ["o200k_base", "cl100k_base"]}},
          "required": ["results", "query", "budget_tokens"], "additionalProperties": false}),
        |ctx, args: Map<String, Value>| run(args, ctx.cancel),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Bytes this thread handed the tokenizer.
        pub(super) static COUNTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn the_work_grows_with_the_input_not_pieces_times_text() {
        // 2000 small pieces (the shape that took 34 CPU-seconds when each
        // piece recounted all the text before it).
        let results: Vec<Value> = (0..2000)
            .map(|i| json!(format!("piece {i} about tokio runtimes and blocking calls")))
            .collect();
        let input: usize = results.iter().map(|r| r.to_string().len()).sum();
        COUNTED.with(|c| c.set(0));
        let v = aggregate(
            &results,
            "tokio blocking",
            1_000_000,
            Encoding::O200kBase,
            &Bm25,
        )
        .unwrap();
        let counted = COUNTED.with(|c| c.get());
        assert_eq!(v["included"].as_array().unwrap().len(), 2000);
        // Each piece's text and the final text, with their headers: a few
        // times the input, not a thousand times it.
        assert!(
            counted < 4 * input,
            "{counted} bytes tokenized for {input} of input"
        );
        // The sum of the pieces' counts is the count of their text.
        assert_eq!(
            v["tokens"].as_u64().unwrap() as usize,
            Encoding::O200kBase.count(v["text"].as_str().unwrap())
        );
        // Many paths (each file's pieces kept in first-seen order).
        let results: Vec<Value> = (0..3000)
            .map(|i| json!({"path": format!("f{i}.rs"), "start_line": 1, "content": "x\n"}))
            .collect();
        let v = aggregate(&results, "x", 1_000_000, Encoding::O200kBase, &Bm25).unwrap();
        assert_eq!(v["included"].as_array().unwrap().len(), 3000);
        assert_eq!(v["included"][0]["source"], "f0.rs:1-1");
    }

    #[test]
    fn counting_in_chunks_counts_what_counting_whole_does() {
        let texts = [
            "fn main() {\n    println!(\"hi\");\n}\n".repeat(5000),
            "word ".repeat(40_000),
            "élan naïve café\n  indented\n\nx".repeat(4000),
            "a".repeat(300_000),
            "x\r\ny don't 12 34567 (paren) [b] {c}\n".repeat(6000),
        ];
        for (n, t) in texts.iter().enumerate() {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let chunked = enc.count_stoppable(t, &Stop::never()).unwrap();
                assert_eq!(chunked, enc.count(t), "text {n}, {enc:?}");
            }
            // Cut into chunks near the size asked (but the run of one
            // letter, which has no place to cut).
            let cut = split_point(t, CHUNK_BYTES);
            assert!(n == 3 || cut <= 4 * CHUNK_BYTES, "text {n}: {cut}");
        }
        // A long text with no place to cut is cut anyway, at
        // MAX_CHUNK_BYTES, at a character's start.
        for t in ["7 ".repeat(MAX_CHUNK_BYTES), "é".repeat(MAX_CHUNK_BYTES)] {
            let cut = split_point(&t, CHUNK_BYTES);
            assert!(
                (MAX_CHUNK_BYTES..=MAX_CHUNK_BYTES + 1).contains(&cut) && t.is_char_boundary(cut),
                "{cut}"
            );
        }
    }

    #[test]
    fn the_input_is_bounded_with_an_error_naming_the_limit() {
        let many: Vec<Value> = (0..MAX_RESULTS + 1).map(|_| json!("x")).collect();
        let e = aggregate(&many, "x", 10, Encoding::O200kBase, &Bm25).unwrap_err();
        assert_eq!(
            e,
            AggregateError::TooMany {
                given: MAX_RESULTS + 1
            }
        );
        assert!(e.to_string().contains("over the limit of 20000"), "{e}");
        let matches: Vec<Value> = (0..MAX_RESULTS)
            .map(|i| json!({"path": "a", "line": i + 1, "text": "x"}))
            .collect();
        let e = aggregate(
            &[json!({"matches": matches}), json!("one more")],
            "x",
            10,
            Encoding::O200kBase,
            &Bm25,
        )
        .unwrap_err();
        assert!(matches!(e, AggregateError::TooMany { .. }), "{e}");
        let big = vec![json!("y".repeat(MAX_INPUT_BYTES / 2)); 3];
        let e = aggregate(&big, "y", 10, Encoding::O200kBase, &Bm25).unwrap_err();
        assert_eq!(e, AggregateError::TooLarge);
        assert!(e.to_string().contains("16777216 bytes"), "{e}");
        // Control: just within both bounds, it runs.
        let ok = vec![json!("y y"); MAX_RESULTS];
        assert!(aggregate(&ok, "y", 10, Encoding::O200kBase, &Bm25).is_ok());
    }

    #[test]
    fn it_stops_when_told_or_at_its_deadline() {
        let results = vec![json!("some text to count")];
        let stop = Stop::never();
        stop.stop();
        let e = aggregate_until(&results, "t", 100, Encoding::O200kBase, &Bm25, &stop);
        assert_eq!(e.unwrap_err(), AggregateError::Cancelled);
        let past = Stop::new(Some(Instant::now()));
        let e = aggregate_until(&results, "t", 100, Encoding::O200kBase, &Bm25, &past);
        assert_eq!(e.unwrap_err(), AggregateError::TimedOut);
        // A guard dropped stops it.
        let stop = Stop::never();
        drop(stop.on_drop());
        assert_eq!(stop.check(), Err(AggregateError::Cancelled));
    }

    fn big_args() -> Map<String, Value> {
        // Text up to the input bound, in distinct results (identical ones
        // are kept once).
        let line = "the quick brown fox jumps over the lazy dog again and again\n".repeat(64);
        let n = (MAX_INPUT_BYTES - 1024) / (line.len() + 8);
        let results: Vec<String> = (0..n).map(|i| format!("{i}\n{line}")).collect();
        json!({"results": results, "query": "fox", "budget_tokens": 10_000_000})
            .as_object()
            .cloned()
            .unwrap()
    }

    /// Wait (at most a minute) until `running()` is `n`.
    async fn until_running(n: usize) {
        let t0 = Instant::now();
        while running() != n {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{} aggregations run, not {n}",
                running()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    // One test for all that looks at the counters, which are the process's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_gives_up_stops_the_work() {
        // Control: left alone, the same work runs to its end.
        let before = stopped();
        let whole = run(big_args(), CancellationToken::new()).await.unwrap();
        assert!(
            whole["tokens"].as_u64().unwrap() > 1_000_000,
            "{}",
            whole["tokens"]
        );
        assert_eq!((running(), stopped()), (0, before));
        // Told to stop while it runs: it ends with the reason, not a result.
        let stop = Stop::never();
        let call = tokio::spawn(run_until(big_args(), stop.clone()));
        until_running(1).await;
        stop.stop();
        let r = call.await.unwrap();
        assert_eq!(
            r.unwrap_err(),
            "aggregate_context: stopped: its caller gave up"
        );
        assert_eq!(stopped(), before + 1);
        // Its caller's future dropped while it runs (the cell ended, the
        // client went away): the blocking thread stops too.
        let call = tokio::spawn(run(big_args(), CancellationToken::new()));
        until_running(1).await;
        call.abort();
        until_running(0).await;
        assert_eq!(stopped(), before + 2, "the work went on to its end");
        // Its caller's token cancelled (a call whose future is kept until
        // the work has stopped): it ends stopped, and says so.
        let cancel = CancellationToken::new();
        let call = tokio::spawn(run(big_args(), cancel.clone()));
        until_running(1).await;
        cancel.cancel();
        let r = call.await.unwrap();
        assert_eq!(
            r.unwrap_err(),
            "aggregate_context: stopped: its caller gave up"
        );
        assert_eq!(stopped(), before + 3);
    }

    fn agg(results: Value, query: &str, budget: usize) -> Value {
        let r = results.as_array().cloned().unwrap_or_default();
        aggregate(&r, query, budget, Encoding::O200kBase, &Bm25).unwrap()
    }

    #[test]
    fn dedupes_and_merges_overlapping_ranges() {
        let v = agg(
            json!([
                {"path": "a.rs", "start_line": 1, "content": "one\ntwo\nthree\n"},
                {"path": "a.rs", "start_line": 3, "content": "three\nfour\n"},
                {"path": "a.rs", "start_line": 1, "content": "one\ntwo\nthree\n"},
                {"matches": [{"path": "a.rs", "line": 5, "text": "five"},
                             {"path": "a.rs", "line": 9, "text": "nine"}]},
                "same text", "same text"
            ]),
            "four",
            10_000,
        );
        let text = v["text"].as_str().unwrap();
        assert!(
            text.contains("=== a.rs:1-5 ===\none\ntwo\nthree\nfour\nfive\n"),
            "{text}"
        );
        assert!(text.contains("=== a.rs:9-9 ===\nnine\n"), "{text}");
        assert_eq!(text.matches("same text").count(), 1, "{text}");
        assert_eq!(v["included"].as_array().unwrap().len(), 3);
        assert!(v["omitted"].as_array().unwrap().is_empty());
    }

    #[test]
    fn ranks_by_bm25() {
        let v = agg(
            json!([
                "the cat sat on the mat",
                "tokio runtime spawn blocking task",
                "a blocking call in the tokio runtime stalls it"
            ]),
            "tokio blocking",
            10_000,
        );
        let inc: Vec<&str> = v["included"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["source"].as_str().unwrap())
            .collect();
        assert_eq!(inc.last(), Some(&"result 1"), "{inc:?}");
        let text = v["text"].as_str().unwrap();
        assert!(text.find("tokio").unwrap() < text.find("cat").unwrap());
    }

    #[test]
    fn budget_exactly_met_then_one_short() {
        let results = json!(["alpha beta gamma", "beta delta", "epsilon zeta eta theta"]);
        let all = agg(results.clone(), "beta", 100_000);
        let exact = all["tokens"].as_u64().unwrap() as usize;
        let v = agg(results.clone(), "beta", exact);
        assert_eq!(v["tokens"].as_u64().unwrap() as usize, exact);
        assert_eq!(v["included"].as_array().unwrap().len(), 3);
        assert!(v["omitted"].as_array().unwrap().is_empty());
        let v = agg(results, "beta", exact - 1);
        assert!((v["tokens"].as_u64().unwrap() as usize) < exact);
        assert_eq!(v["omitted"].as_array().unwrap().len(), 1);
        // The least relevant whole result is the one cut.
        assert_eq!(v["omitted"][0]["source"], "result 3");
        assert_eq!(
            Encoding::O200kBase.count(v["text"].as_str().unwrap()),
            v["tokens"].as_u64().unwrap() as usize
        );
    }

    #[test]
    fn budget_smaller_than_one_result_cuts_it_and_says_so() {
        let long = "word ".repeat(500);
        let v = agg(json!([long]), "word", 40);
        let text = v["text"].as_str().unwrap();
        assert!(v["tokens"].as_u64().unwrap() <= 40);
        assert!(v["tokens"].as_u64().unwrap() >= 30, "{v}");
        assert!(text.ends_with(CUT_MARK), "{text}");
        assert_eq!(v["cut"]["source"], "result 1");
        assert!(v["included"].as_array().unwrap().is_empty());
        // Too small even for the header: nothing, and it is listed as omitted.
        let v = agg(json!([long]), "word", 3);
        assert_eq!(v["text"], "");
        assert_eq!(v["omitted"].as_array().unwrap().len(), 1);
    }
}
