//! The fuzz targets' properties (`cellbox::fuzzing`) over their committed
//! seed corpora (`fuzz/corpus/<target>/`) and deterministic mutations of
//! them, so every `cargo test` checks them without cargo-fuzz.

use std::path::Path;
use std::time::Instant;

/// Mutations per seed file (bit flips, byte sets, truncations, splices,
/// insertions, duplications).
const MUTATIONS_PER_SEED: usize = 3000;

/// A xorshift64* generator: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Bytes that matter to the parsers under test.
const INTERESTING: &[u8] = b"{}[]\":,\\\n0-9eE.tfn \x00\xff\x7f#=";

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => v.truncate(rng.below(len + 1)),
            3 => {
                // Splice: a prefix of this with a suffix of another seed.
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            4 => {
                let i = rng.below(len + 1);
                v.insert(i, INTERESTING[rng.below(INTERESTING.len())]);
            }
            5 if len > 0 => {
                // Duplicate a slice in place.
                let a = rng.below(len);
                let b = a + rng.below(len - a).min(64);
                let piece = v[a..b].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, piece);
            }
            6 if len > 0 => {
                v.remove(rng.below(len));
            }
            _ => {}
        }
    }
    v
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn exercise(target: &str, f: fn(&[u8])) {
    let t = Instant::now();
    let seeds = seeds(target);
    assert!(seeds.len() >= 3, "{target}: too few seeds");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    let mut runs = 0;
    for (i, seed) in seeds.iter().enumerate() {
        f(seed);
        runs += 1;
        for _ in 0..MUTATIONS_PER_SEED {
            let other = &seeds[rng.below(seeds.len())];
            let input = mutate(&mut rng, seed, other);
            let guard = std::panic::catch_unwind(|| f(&input));
            if let Err(e) = guard {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "{target}: a mutation of seed {i} broke a property: {msg}\ninput: {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
            runs += 1;
        }
    }
    eprintln!("{target}: {runs} inputs in {:?}", t.elapsed());
}

#[test]
fn fuzz_corpus_frame() {
    exercise("frame", cellbox::fuzzing::frame);
}

#[test]
fn fuzz_corpus_from_worker() {
    exercise("from_worker", cellbox::fuzzing::from_worker);
}

#[test]
fn fuzz_corpus_to_worker() {
    exercise("to_worker", cellbox::fuzzing::to_worker);
}

#[test]
fn fuzz_corpus_profile_toml() {
    exercise("profile_toml", cellbox::fuzzing::profile_toml);
}

#[test]
fn fuzz_corpus_serve_config() {
    exercise("serve_config", cellbox::fuzzing::serve_config);
}

#[test]
fn fuzz_corpus_serve_lines() {
    exercise("serve_lines", cellbox::fuzzing::serve_lines);
}

#[test]
fn fuzz_corpus_jsonrpc_http() {
    exercise("jsonrpc_http", cellbox::fuzzing::jsonrpc_http);
}

/// Rewrites the protocol seeds from the real message types:
/// `CELLBOX_WRITE_SEEDS=1 cargo test --profile test-release --test all -- --ignored write_protocol_seeds`.
#[test]
#[ignore]
fn write_protocol_seeds() {
    use cellbox::profiles::{LayerMode, Profile};
    use cellbox::protocol::*;
    use cellbox::sandbox::{LayerReport, SandboxPlan, SandboxReport};
    use serde_json::json;
    if std::env::var_os("CELLBOX_WRITE_SEEDS").is_none() {
        return;
    }
    let profile = Profile::load("python").unwrap();
    let plan = SandboxPlan::new(&profile, "/tmp/cell".into(), profile.default_limits());
    let to: Vec<(&str, ToWorker)> = vec![
        (
            "setup",
            ToWorker::Setup(Setup {
                backend: Backend::Python {
                    interpreter: "/usr/bin/python3".into(),
                    precompiled: Some("/tmp/shim.pyc".into()),
                },
                plan,
            }),
        ),
        (
            "start",
            ToWorker::Start(Start {
                language: "python".into(),
                code: "x = 1 + 1\nemit({'x': x})\nx".into(),
                vars: json!({"a": [1, 2.5, "s"], "b": {"c": null}})
                    .as_object()
                    .unwrap()
                    .clone()
                    .into(),
                definitions: vec![Definition {
                    names: vec!["f".into()],
                    source: "def f(y):\n    return y * 2\n".into(),
                }],
                capabilities: vec![CapabilitySpec {
                    name: "run_cell".into(),
                    params: vec!["language".into(), "code".into()],
                    allowed: true,
                }],
                limits: ScriptLimits {
                    timeout_ms: 5000,
                    max_operations: 1_000_000,
                    max_call_levels: 64,
                    max_expr_depth: 64,
                    max_string_bytes: 1 << 20,
                    max_array_len: 100_000,
                    max_map_len: 100_000,
                    max_display_bytes: 320 * 1024,
                    max_display_item_bytes: 256 * 1024,
                },
                max_frame_bytes: 8 << 20,
                python_paths: Vec::new(),
                linger: true,
                preloaded: false,
            }),
        ),
        (
            "preload",
            ToWorker::Preload(Preload {
                vars: json!({"context": "a long text", "rows": [{"id": 1}, {"id": 2}]})
                    .as_object()
                    .unwrap()
                    .clone()
                    .into(),
            }),
        ),
        (
            "reply_ok",
            ToWorker::Reply(Reply {
                id: 3,
                ok: Some(json!({"stdout": "hi\n", "value": 2})),
                error: None,
            }),
        ),
        (
            "reply_error",
            ToWorker::Reply(Reply {
                id: 4,
                ok: None,
                error: Some(ReplyError {
                    kind: ReplyErrorKind::Denied,
                    message: "capability run_cell is not allowed".into(),
                }),
            }),
        ),
    ];
    let from: Vec<(&str, FromWorker)> = vec![
        (
            "ready",
            FromWorker::Ready(Ready {
                report: SandboxReport {
                    profile: "python".into(),
                    layers: vec![LayerReport {
                        name: "seccomp".into(),
                        applied: true,
                        mode: LayerMode::Required,
                        detail: "filter of 212 syscalls".into(),
                    }],
                    landlock_abi: Some(4),
                    namespaces: vec!["user".into(), "mount".into(), "net".into()],
                },
            }),
        ),
        (
            "sandbox_error",
            FromWorker::SandboxError(SandboxFailure {
                layer: "landlock".into(),
                message: "not supported by this kernel".into(),
            }),
        ),
        (
            "call",
            FromWorker::Call(Call {
                id: 1,
                cap: "run_cell".into(),
                args: json!({"language": "rhai", "code": "40 + 2"})
                    .as_object()
                    .unwrap()
                    .clone(),
            }),
        ),
        (
            "emit",
            FromWorker::Emit {
                event: json!({"progress": 0.5, "note": "h\u{e9}llo \"q\""}),
            },
        ),
        (
            "log",
            FromWorker::Log(Log {
                level: "warn".into(),
                message: "slow".into(),
            }),
        ),
        (
            "done",
            FromWorker::Done(Box::new(Done {
                status: DoneStatus::Error,
                value: json!(null),
                repr: Some("None".into()),
                vars: json!({"x": 2, "big": 12345678901234567890u64, "neg": -7, "f": 1e-7})
                    .as_object()
                    .unwrap()
                    .clone(),
                kept: vec!["context".into()],
                dropped: vec![DroppedVar {
                    name: "fh".into(),
                    type_name: "TextIOWrapper".into(),
                    reason: "not JSON".into(),
                }],
                definitions: vec![],
                error: Some(ScriptError {
                    kind: "ZeroDivisionError".into(),
                    message: "division by zero".into(),
                    traceback: Some("Traceback ...".into()),
                    line: Some(3),
                    column: None,
                }),
                limit: None,
                live: None,
                display: vec![],
                display_dropped: vec![],
            })),
        ),
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for d in ["frame", "from_worker", "to_worker"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let mut stream = Vec::new();
    for (name, m) in &to {
        let f = encode_frame(m, usize::MAX).unwrap();
        std::fs::write(root.join("to_worker").join(name), &f[LEN_PREFIX..]).unwrap();
        std::fs::write(root.join("frame").join(format!("to_{name}")), &f).unwrap();
    }
    for (name, m) in &from {
        let f = encode_frame(m, usize::MAX).unwrap();
        std::fs::write(root.join("from_worker").join(name), &f[LEN_PREFIX..]).unwrap();
        std::fs::write(root.join("frame").join(format!("from_{name}")), &f).unwrap();
        stream.extend_from_slice(&f);
    }
    // A cell's whole worker side in one stream, then a cut-off frame.
    stream.extend_from_slice(&[0, 0, 0, 9, b'{']);
    std::fs::write(root.join("frame").join("from_stream"), &stream).unwrap();
}
