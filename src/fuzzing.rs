//! Fuzz-target bodies: one function per target of `fuzz/` (run there with
//! `cargo fuzz`) and of `tests/suite/fuzz_corpus.rs` (run over the seed
//! corpora and their mutations on every `cargo test`).
//!
//! Each function takes arbitrary bytes and asserts properties of the code
//! it drives, not only that it returns: a decoded frame re-encodes to a
//! frame that decodes to the same message, a parsed config serializes and
//! parses back equal, the line scanner agrees with a full JSON parse, the
//! HTTP path answers the request's own id. A broken property panics, which
//! is what a fuzzer reports.

use crate::profiles::{Profile, ProfileError};
use crate::protocol::{
    decode_body, encode_frame, read_frame_blocking, FrameError, FromWorker, Tagged, ToWorker,
    LEN_PREFIX,
};
use crate::serve::config::ConfigError;
use crate::serve::jsonrpc;
use crate::serve::lines::{next_line, Line, OVERSIZED_METHOD};
use crate::serve::ServeConfig;
use serde_json::Value;
use std::path::Path;

/// The frame cap the targets read with: small, so the oversize path is
/// reached, large enough for every seed.
const FUZZ_MAX_FRAME: usize = 64 * 1024;

/// A message that decoded re-encodes (with a cap it cannot exceed), and the
/// frame decodes to the same message and re-encodes to the same bytes.
fn round_trip<M: Tagged + PartialEq + std::fmt::Debug>(msg: &M) {
    let frame = match encode_frame(msg, usize::MAX) {
        Ok(f) => f,
        Err(e) => panic!("a decoded message does not encode: {e}: {msg:?}"),
    };
    let back: M = match read_frame_blocking(&mut &frame[..], usize::MAX) {
        Ok(m) => m,
        Err(e) => panic!("an encoded frame does not decode: {e}: {msg:?}"),
    };
    assert_eq!(&back, msg, "the message changed in a round trip");
    match encode_frame(&back, usize::MAX) {
        Ok(again) => assert_eq!(again, frame, "re-encoding is not stable"),
        Err(e) => panic!("a message does not encode twice: {e}"),
    }
}

/// Read the frames of `data` one after the other as `M`, checking each
/// outcome against what the length prefix says it must be.
fn frames_as<M: Tagged + PartialEq + std::fmt::Debug>(data: &[u8]) {
    let mut rest = data;
    loop {
        let before = rest;
        let got = read_frame_blocking::<M, _>(&mut rest, FUZZ_MAX_FRAME);
        if before.len() < LEN_PREFIX {
            match got {
                Err(FrameError::Closed) => assert!(before.is_empty()),
                Err(FrameError::Truncated { expected, got }) => {
                    assert_eq!((expected, got), (LEN_PREFIX, before.len()))
                }
                other => panic!("{} bytes left gave {other:?}", before.len()),
            }
            return;
        }
        let mut prefix = [0u8; LEN_PREFIX];
        prefix.copy_from_slice(&before[..LEN_PREFIX]);
        let len = u32::from_be_bytes(prefix) as usize;
        if len > FUZZ_MAX_FRAME {
            assert!(
                matches!(got, Err(FrameError::Oversize { len: l, max }) if l == len && max == FUZZ_MAX_FRAME),
                "a {len}-byte frame gave {got:?}"
            );
            return;
        }
        let Some(body) = before.get(LEN_PREFIX..LEN_PREFIX + len) else {
            assert!(
                matches!(got, Err(FrameError::Truncated { expected, .. }) if expected == len),
                "a cut-off frame gave {got:?}"
            );
            return;
        };
        // The reader and the body decoder agree, and the reader consumed
        // exactly this frame.
        assert_eq!(rest.len(), before.len() - LEN_PREFIX - len);
        match (&got, decode_body::<M>(body)) {
            (Ok(a), Ok(b)) => assert_eq!(a, &b),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("the reader gave {a:?}, the decoder {b:?}"),
        }
        match got {
            Ok(m) => round_trip(&m),
            Err(e) => assert!(
                matches!(
                    e,
                    FrameError::InvalidUtf8(_)
                        | FrameError::InvalidJson(_)
                        | FrameError::MissingTag
                        | FrameError::UnknownTag(_)
                        | FrameError::BadShape { .. }
                ),
                "a whole frame gave {e:?}"
            ),
        }
    }
}

/// Target `frame`: `data` is a stream of frames, read in both directions.
pub fn frame(data: &[u8]) {
    frames_as::<FromWorker>(data);
    frames_as::<ToWorker>(data);
}

fn body_as<M: Tagged + PartialEq + std::fmt::Debug>(data: &[u8]) {
    match decode_body::<M>(data) {
        Ok(m) => round_trip(&m),
        Err(FrameError::UnknownTag(t)) => assert!(!M::TAGS.contains(&t.as_str())),
        Err(FrameError::BadShape { tag, .. }) => assert!(M::TAGS.contains(&tag.as_str())),
        Err(FrameError::InvalidUtf8(_) | FrameError::InvalidJson(_) | FrameError::MissingTag) => {}
        Err(e) => panic!("decoding a body gave {e:?}"),
    }
}

/// Target `from_worker`: `data` is one frame body, worker → supervisor.
pub fn from_worker(data: &[u8]) {
    body_as::<FromWorker>(data);
}

/// Target `to_worker`: `data` is one frame body, supervisor → worker.
pub fn to_worker(data: &[u8]) {
    body_as::<ToWorker>(data);
}

/// Target `profile_toml`: a profile that parses either validates, and then
/// serializes to TOML that parses and validates to the same profile, or is
/// refused with an error naming the key.
pub fn profile_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Profile::from_toml(text, "fuzz.toml") {
        Ok(p) => {
            let again = match toml::to_string(&p) {
                Ok(t) => t,
                Err(e) => panic!("a valid profile does not serialize: {e}: {p:?}"),
            };
            match Profile::from_toml(&again, "fuzz.toml") {
                Ok(back) => assert_eq!(back, p, "the profile changed in a round trip"),
                Err(e) => panic!("a serialized valid profile is refused: {e}\n{again}"),
            }
        }
        Err(ProfileError::Invalid { key, problem, .. }) => {
            assert!(!key.is_empty(), "an invalid profile with no key: {problem}");
            assert!(!problem.is_empty(), "key {key}: no problem named");
        }
        Err(ProfileError::Parse { .. }) => {}
        Err(e) => panic!("parsing a profile text gave {e:?}"),
    }
}

/// A profile path the serve-config target uses in place of any file path,
/// so validation touches nothing on the host.
const NO_SUCH_FILE: &str = "/nonexistent/cellbox-fuzz/file";

/// Target `serve_config`: a config that parses serializes to TOML that
/// parses back equal; validating it gives settings or an error naming a key.
pub fn serve_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut config) = ServeConfig::from_toml(text, Path::new("fuzz.toml")) else {
        return;
    };
    let again = match toml::to_string(&config) {
        Ok(t) => t,
        Err(e) => panic!("a parsed config does not serialize: {e}: {config:?}"),
    };
    match ServeConfig::from_toml(&again, Path::new("fuzz.toml")) {
        Ok(back) => assert_eq!(back, config, "the config changed in a round trip"),
        Err(e) => panic!("a serialized config is refused: {e}\n{again}"),
    }
    // Files named in the config are replaced by one that does not exist;
    // built-in profile names are kept (they load from memory).
    let p = &mut config.profiles;
    for name in [&mut p.rhai, &mut p.python, &mut p.shell]
        .into_iter()
        .flatten()
    {
        if !["rhai", "python", "shell"].contains(&name.as_str()) && !name.trim().is_empty() {
            *name = NO_SUCH_FILE.to_owned();
        }
    }
    if config.http.token_file.is_some() {
        config.http.token_file = Some(NO_SUCH_FILE.into());
    }
    match config.validate() {
        Ok(_) => {}
        Err(ConfigError::Invalid { key, problem }) => {
            assert!(!key.is_empty(), "an invalid config with no key: {problem}");
            assert!(!problem.is_empty(), "key {key}: no problem named");
        }
        Err(ConfigError::Read { path, .. }) => assert_eq!(path, Path::new(NO_SUCH_FILE)),
        Err(e) => panic!("validating a parsed config gave {e:?}"),
    }
}

/// The top-level `id` and `method` of `line` by a full JSON parse, if it is
/// a JSON object; and whether the scanner must find them too (their raw
/// text is their serialized text, and within the scanner's 256 bytes).
struct Parsed {
    id: Option<Value>,
    method: Option<Value>,
    plain: bool,
}

fn parse_line(line: &[u8]) -> Option<Parsed> {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    // Without an escape anywhere, a string's raw text is its serialized
    // text; an integer's raw text is its digits.
    let plain = !line.contains(&b'\\');
    Some(Parsed {
        id: map.get("id").cloned(),
        method: map.get("method").cloned(),
        plain,
    })
}

/// Whether the scanner must keep `v` whole: a string or an integer whose
/// raw text fits its 256 bytes.
fn kept(v: &Value, plain: bool) -> bool {
    match v {
        Value::String(s) => plain && s.len() + 2 < 256,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// Target `serve_lines`: the stdio line reader. The first byte picks the
/// line limit, the second the read buffer's size; the rest is the input.
/// Every input byte is accounted for exactly once, line by line; a line
/// within the limit passes unchanged; a longer one is replaced by a
/// stand-in carrying the id and method a full parse finds, or dropped when
/// there is no id to answer.
pub fn serve_lines(data: &[u8]) {
    let [a, b, input @ ..] = data else {
        return;
    };
    let limit = 1 + usize::from(*a);
    let cap = 1 + usize::from(*b % 64);
    let mut reader = std::io::BufReader::with_capacity(cap, input);
    let mut at = 0;
    loop {
        let got = match next_line(&mut reader, limit) {
            Ok(l) => l,
            Err(e) => panic!("reading from memory failed: {e}"),
        };
        let rest = &input[at..];
        let end = rest
            .iter()
            .position(|c| *c == b'\n')
            .map_or(rest.len(), |i| i + 1);
        let line = &rest[..end];
        match got {
            Line::End => {
                assert!(rest.is_empty(), "end of input with {} bytes left", end);
                return;
            }
            Line::Pass(bytes) if bytes == line => {
                assert!(line.len() <= limit + 1, "a {}-byte line passed", line.len());
            }
            Line::Pass(bytes) => {
                assert!(line.len() > limit, "a line within the limit was replaced");
                let Ok(stand_in) = serde_json::from_slice::<Value>(&bytes) else {
                    panic!("the stand-in is not JSON");
                };
                assert_eq!(stand_in["method"], OVERSIZED_METHOD);
                assert_eq!(stand_in["params"]["bytes"], line.len());
                assert_eq!(stand_in["params"]["limit"], limit);
                let id = &stand_in["id"];
                assert!(id.is_string() || id.is_number(), "stand-in id {id}");
                let method = &stand_in["params"]["method"];
                // Whatever the scanner found is what a full parse finds.
                if let Some(p) = parse_line(line) {
                    assert_eq!(p.id.as_ref(), Some(id), "the stand-in's id");
                    if !method.is_null() {
                        assert_eq!(p.method.as_ref(), Some(method), "the stand-in's method");
                    } else if let Some(m) = &p.method {
                        assert!(!(m.is_string() && kept(m, p.plain)), "method {m} missed");
                    }
                }
            }
            Line::Dropped { bytes } => {
                assert_eq!(bytes, line.len() as u64, "the dropped line's size");
                assert!(line.len() > limit, "a line within the limit was dropped");
                if let Some(p) = parse_line(line) {
                    if let Some(id) = &p.id {
                        assert!(!kept(id, p.plain), "id {id} missed in a dropped line");
                    }
                }
            }
        }
        at += end;
    }
}

/// Target `jsonrpc_http`: the body of a POST to the HTTP listener. A body
/// answered here gets a JSON-RPC error reply with the request's own id that
/// a client can read; a body passed on reads as an MCP message, or has no
/// id and method to answer.
pub fn jsonrpc_http(data: &[u8]) {
    let body = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match jsonrpc::check(data) {
        Some(u) => {
            let Some(v) = parsed else {
                panic!("an answer for a body that is not JSON");
            };
            assert_eq!(v.get("id"), Some(&u.id), "the reply's id");
            let reply = u.error_reply();
            assert_eq!(reply["id"], u.id);
            assert_eq!(reply["jsonrpc"], "2.0");
            let code = &reply["error"]["code"];
            assert!(*code == -32600 || *code == -32602, "error code {code}");
            assert!(reply["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
            // An MCP client (rmcp's types: an id is a string or an i64)
            // reads the reply. Other ids (1.5, 2^64) are echoed as JSON-RPC
            // asks, and only a client that sends such ids reads them back.
            let text = reply.to_string();
            if u.id.is_string() || u.id.is_i64() {
                if let Err(e) = serde_json::from_str::<rmcp::model::ServerJsonRpcMessage>(&text) {
                    panic!("a client cannot read the reply {text}: {e}");
                }
            }
            // The stdio stand-in for the same message reads as MCP. (With
            // an id rmcp cannot hold it does not: such a request gets
            // rmcp's error with a null id over stdio.)
            if u.id.is_string() || u.id.is_i64() {
                let stand_in = u.stand_in();
                assert!(
                    jsonrpc::check(&stand_in).is_none(),
                    "the stand-in is refused"
                );
                if let Err(e) =
                    serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(&stand_in)
                {
                    panic!("the stand-in does not read: {e}");
                }
            }
        }
        None => {
            let reads = serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body).is_ok();
            let answerable = parsed.as_ref().is_some_and(|v| {
                v.get("id").is_some_and(|i| i.is_string() || i.is_number())
                    && v.get("method").is_some_and(Value::is_string)
            });
            assert!(reads || !answerable, "a request with an id went unanswered");
        }
    }
}
