//! `aggregate_context`: fit the results of several tools into a token
//! budget. Results are merged into pieces (the same file read twice and
//! overlapping or adjacent line ranges become one piece; identical text is
//! kept once), ranked by relevance to the query ([`Relevance`]; BM25 over
//! the query's terms by default, the seam for embeddings), and added in rank
//! order while the text, counted with a real BPE tokenizer (o200k_base or
//! cl100k_base), stays within the budget. Whole pieces are cut first; only
//! when not even the best one fits is it shortened, and marked so.

use crate::supervisor::{Capability, CapabilityError};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

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
    pub fn count(self, text: &str) -> usize {
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
fn pieces(results: &[Value]) -> Vec<Piece> {
    let mut files = FileLines::new();
    let mut order: Vec<String> = Vec::new();
    let mut other: Vec<Piece> = Vec::new();
    let note_path = |p: &str, order: &mut Vec<String>| {
        if !order.iter().any(|o| o == p) {
            order.push(p.to_owned());
        }
    };
    for (i, r) in results.iter().enumerate() {
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
    out
}

/// Merge, rank and fit `results` into `budget` tokens.
pub fn aggregate(
    results: &[Value],
    query: &str,
    budget: usize,
    enc: Encoding,
    relevance: &dyn Relevance,
) -> Value {
    let pieces = pieces(results);
    let texts: Vec<String> = pieces
        .iter()
        .map(|p| format!("{}\n{}", p.source, p.text))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let scores = relevance.scores(query, &refs);
    let mut ranked: Vec<(usize, f64)> = scores.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));

    let mut text = String::new();
    let mut included = Vec::new();
    let mut omitted = Vec::new();
    for (i, score) in &ranked {
        let p = &pieces[*i];
        let candidate = format!("{text}{}", p.formatted());
        let tokens = enc.count(&candidate);
        if tokens <= budget {
            text = candidate;
            included.push(json!({"source": p.source, "score": score}));
        } else {
            omitted.push(json!({"source": p.source, "score": score,
                                "tokens": enc.count(&p.formatted())}));
        }
    }
    let mut cut = Value::Null;
    if included.is_empty() {
        if let Some((i, score)) = ranked.first() {
            let p = &pieces[*i];
            if let Some(short) = shorten(p, budget, enc) {
                text = short;
                cut = json!({"source": p.source, "score": score});
                omitted.remove(0);
            }
        }
    }
    let tokens = enc.count(&text);
    json!({
        "text": text,
        "tokens": tokens,
        "budget_tokens": budget,
        "included": included,
        "cut": cut,
        "omitted": omitted,
    })
}

/// The longest prefix of `p`'s text that fits in `budget` with its header
/// and [`CUT_MARK`].
fn shorten(p: &Piece, budget: usize, enc: Encoding) -> Option<String> {
    let with = |n: usize| format!("=== {} (cut) ===\n{}{CUT_MARK}", p.source, &p.text[..n]);
    let bounds: Vec<usize> = p
        .text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(p.text.len()))
        .collect();
    if enc.count(&with(0)) > budget {
        return None;
    }
    let (mut lo, mut hi) = (0usize, bounds.len() - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if enc.count(&with(bounds[mid])) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(with(bounds[lo]))
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
        |_ctx, args: Map<String, Value>| async move {
            tokio::task::spawn_blocking(move || {
                let results = args
                    .get("results")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let query = args.get("query").and_then(Value::as_str).unwrap_or("");
                let budget = args
                    .get("budget_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(1) as usize;
                let enc = match args.get("encoding").and_then(Value::as_str) {
                    Some("cl100k_base") => Encoding::Cl100kBase,
                    _ => Encoding::O200kBase,
                };
                aggregate(&results, query, budget, enc, &Bm25)
            })
            .await
            .map_err(|e| format!("aggregate_context failed: {e}"))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(results: Value, query: &str, budget: usize) -> Value {
        let r = results.as_array().cloned().unwrap_or_default();
        aggregate(&r, query, budget, Encoding::O200kBase, &Bm25)
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
