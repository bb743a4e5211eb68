//! The pipe protocol between the supervisor and a worker.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
//! JSON: one object with a `"t"` tag naming the message. The codec here has no
//! I/O policy: it turns bytes into typed messages and back, checks the length
//! against a caller-given maximum *before* allocating, and parses strictly, so
//! a hostile worker can only ever produce a [`FrameError`].
//!
//! Conversation for one cell:
//! ```text
//! supervisor                         worker
//!   setup {sandbox plan}      ──▶
//!                             ◀──   ready {sandbox report} | sandbox_error
//!   start {code, vars, ...}   ──▶
//!                             ◀──   call {id, cap, args}   (any number)
//!   reply {id, ok|error}      ──▶
//!                             ◀──   emit / log             (any number)
//!                             ◀──   done {status, value, vars, error,
//!                                          display, display_dropped}
//! ```
//!
//! `done.display` (Python) lists the rich values the cell showed, in order:
//! `{mime, data}` with `mime` one of `image/png` (data in base64),
//! `text/html`, `text/markdown`; `done.display_dropped` the ones left out,
//! `{mime, bytes, reason}`. Both are absent when empty. The caps come in
//! `start.limits` (`max_display_bytes`, `max_display_item_bytes`) and the
//! supervisor checks them again. `start.python_paths` names the package
//! directories a Python cell appends to `sys.path` (the profile's
//! `[python] paths`).

mod codec;
mod messages;
pub mod pool;
pub mod sandbox;

pub use codec::{
    decode_body, encode_frame, read_frame_async, read_frame_async_within, read_frame_blocking,
    write_frame_async, write_frame_blocking, FrameError, FrameReader, Tagged,
    DEFAULT_MAX_FRAME_BYTES, LEN_PREFIX,
};
pub use messages::*;

pub use sandbox::PROTOCOL_FD;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    fn read(bytes: &[u8]) -> Result<FromWorker, FrameError> {
        read_frame_blocking::<FromWorker, _>(&mut &bytes[..], 1024)
    }

    #[test]
    fn reply_error_kinds_keep_their_wire_names() {
        let names = ["unknown", "denied", "invalid_args", "limit", "failed"];
        assert_eq!(ReplyErrorKind::ALL.len(), names.len());
        for (kind, name) in ReplyErrorKind::ALL.into_iter().zip(names) {
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(ReplyErrorKind::from_name(name), Some(kind));
            assert_eq!(ReplyErrorKind::named(name), kind);
            let v = serde_json::to_value(kind).unwrap();
            assert_eq!(v, json!(name));
            assert_eq!(serde_json::from_value::<ReplyErrorKind>(v).unwrap(), kind);
            assert_eq!(
                kind.is_refusal(),
                matches!(name, "unknown" | "denied"),
                "{name}"
            );
        }
        assert_eq!(ReplyErrorKind::from_name("budget"), None);
        assert_eq!(ReplyErrorKind::named("budget"), ReplyErrorKind::Failed);
        // The frame is byte for byte what a string field gave.
        let reply = ToWorker::Reply(Reply {
            id: 4,
            ok: None,
            error: Some(ReplyError {
                kind: ReplyErrorKind::InvalidArgs,
                message: "m".into(),
            }),
        });
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"t":"reply","id":4,"error":{"kind":"invalid_args","message":"m"}}"#
        );
    }

    #[test]
    fn round_trip_every_direction() {
        let call = FromWorker::Call(Call {
            id: 7,
            cap: "emit".into(),
            args: json!({"event": {"a": 1}}).as_object().unwrap().clone(),
        });
        let bytes = encode_frame(&call, 1024).unwrap();
        assert_eq!(read(&bytes).unwrap(), call);
        let reply = ToWorker::Reply(Reply {
            id: 7,
            ok: Some(json!(1)),
            error: None,
        });
        let bytes = encode_frame(&reply, 1024).unwrap();
        let back: ToWorker = read_frame_blocking(&mut &bytes[..], 1024).unwrap();
        assert_eq!(back, reply);
    }

    #[test]
    fn each_malformation_has_its_own_error() {
        assert!(matches!(read(b""), Err(FrameError::Closed)));
        assert!(matches!(
            read(&[0, 0]),
            Err(FrameError::Truncated {
                expected: 4,
                got: 2
            })
        ));
        let mut short = frame(br#"{"t":"log","level":"x","message":"y"}"#);
        short.truncate(short.len() - 3);
        assert!(matches!(read(&short), Err(FrameError::Truncated { .. })));
        assert!(matches!(
            read(&(u32::MAX).to_be_bytes()),
            Err(FrameError::Oversize { len, max: 1024 }) if len == u32::MAX as usize
        ));
        assert!(matches!(
            read(&frame(b"\xff\xfe")),
            Err(FrameError::InvalidUtf8(_))
        ));
        assert!(matches!(
            read(&frame(b"{not json")),
            Err(FrameError::InvalidJson(_))
        ));
        assert!(matches!(
            read(&frame(b"[1,2]")),
            Err(FrameError::MissingTag)
        ));
        assert!(matches!(
            read(&frame(br#"{"t":"bogus"}"#)),
            Err(FrameError::UnknownTag(t)) if t == "bogus"
        ));
        // Known tag, wrong field type.
        assert!(matches!(
            read(&frame(br#"{"t":"call","id":"x","cap":"emit"}"#)),
            Err(FrameError::BadShape { tag, .. }) if tag == "call"
        ));
        // Known tag, unknown field.
        assert!(matches!(
            read(&frame(
                br#"{"t":"log","level":"x","message":"y","extra":1}"#
            )),
            Err(FrameError::BadShape { .. })
        ));
    }

    /// A frame parsed straight into its type (see `decode_body`) is read
    /// as the strict way reads it: a tagged array is no frame, and of a
    /// key given twice the last counts.
    #[test]
    fn the_quick_parse_reads_frames_as_the_strict_one_does() {
        assert!(matches!(
            read(&frame(br#"["log","x","y"]"#)),
            Err(FrameError::MissingTag)
        ));
        let got = read(&frame(
            br#"{"t":"log","level":"a","level":"x","message":"y"}"#,
        ));
        let want = FromWorker::Log(Log {
            level: "x".into(),
            message: "y".into(),
        });
        assert_eq!(got.expect("a frame with a repeated key"), want);
        let spaced = read(&frame(br#"  {"t":"log","level":"x","message":"y"}"#));
        assert_eq!(spaced.expect("a frame after spaces"), want);
    }

    /// Every seed frame (one of each tag, from the real message types) is
    /// read straight into its variant's type, to what serde's own reading
    /// of the tagged enum gives; and the same fields in another order, or a
    /// key given twice, read the same through the slower ways.
    #[test]
    fn frames_read_into_their_variant_as_serde_reads_the_enum() {
        fn check<M: Tagged + PartialEq + std::fmt::Debug>(dir: &str) -> usize {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
            let mut direct = 0;
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let body = std::fs::read(entry.unwrap().path()).unwrap();
                let want: M = serde_json::from_slice(&body).unwrap();
                assert_eq!(decode_body::<M>(&body).unwrap(), want);
                let (tag, fields) = super::codec::split_tag(&body).unwrap();
                if let Some(got) = M::variant(tag, fields) {
                    assert_eq!(got.unwrap(), want);
                    direct += 1;
                }
                // The tag last: not this codec's way of writing, read the
                // strict way.
                let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let t = v.as_object_mut().unwrap().shift_remove("t").unwrap();
                v.as_object_mut().unwrap().insert("t".into(), t);
                let moved = serde_json::to_vec(&v).unwrap();
                assert!(
                    super::codec::split_tag(&moved).is_none() || v.as_object().unwrap().len() == 1
                );
                assert_eq!(decode_body::<M>(&moved).unwrap(), want);
            }
            direct
        }
        // All but `emit`, which serde reads.
        assert_eq!(check::<ToWorker>("to_worker"), 5);
        assert_eq!(check::<FromWorker>("from_worker"), 5);
        // A key given twice: the direct read refuses it, the last counts.
        let twice = br#"{"t":"reply","id":1,"id":2,"ok":null}"#;
        let (tag, fields) = super::codec::split_tag(twice).unwrap();
        assert!(ToWorker::variant(tag, fields).unwrap().is_err());
        assert!(matches!(decode_body::<ToWorker>(twice), Ok(ToWorker::Reply(r)) if r.id == 2));
        // A tag with an escape, or one alone, is not split.
        assert!(super::codec::split_tag(br#"{"t":"st\u0061rt","code":""}"#).is_none());
        let (_, alone) = super::codec::split_tag(br#"{"t":"x"}"#).unwrap();
        let fields: serde_json::Map<String, serde_json::Value> =
            super::codec::read_fields(alone).unwrap();
        assert!(fields.is_empty());
        // A comma before no key is no JSON: not split, refused as before.
        assert!(super::codec::split_tag(br#"{"t":"preload",}"#).is_none());
        assert!(decode_body::<ToWorker>(br#"{"t":"preload",}"#).is_err());
    }

    #[test]
    fn oversize_is_refused_before_allocation_and_on_encode() {
        // A 4 GiB length prefix with no body must fail at once, not allocate.
        let r = read(&[0xff, 0xff, 0xff, 0xf0]);
        assert!(matches!(r, Err(FrameError::Oversize { .. })));
        let big = FromWorker::Log(Log {
            level: "x".into(),
            message: "y".repeat(2000),
        });
        assert!(matches!(
            encode_frame(&big, 1024),
            Err(FrameError::Oversize { .. })
        ));
    }

    #[tokio::test]
    async fn async_reader_matches_blocking_reader() {
        let msg = FromWorker::Emit {
            event: json!({"step": 1}),
        };
        let bytes = encode_frame(&msg, 1024).unwrap();
        let got: FromWorker = read_frame_async(&mut &bytes[..], 1024).await.unwrap();
        assert_eq!(got, msg);
        let r: Result<FromWorker, _> = read_frame_async(&mut &[0u8, 0][..], 1024).await;
        assert!(matches!(r, Err(FrameError::Truncated { .. })));
        let r: Result<FromWorker, _> =
            read_frame_async(&mut &frame(br#"{"t":"nope"}"#)[..], 1024).await;
        assert!(matches!(r, Err(FrameError::UnknownTag(_))));
    }

    #[tokio::test]
    async fn a_frame_reader_given_up_mid_frame_loses_nothing() {
        use tokio::io::AsyncWriteExt;
        let (mut a, b) = tokio::io::duplex(64);
        let sent: Vec<FromWorker> = (0..20)
            .map(|i| FromWorker::Emit {
                event: json!({"step": i, "pad": "x".repeat(i * 7)}),
            })
            .collect();
        let bytes: Vec<u8> = sent
            .iter()
            .flat_map(|m| encode_frame(m, 4096).unwrap())
            .collect();
        // The peer writes a few bytes at a time, so most frames arrive in
        // pieces, and the reader is given up often in between.
        let writer = tokio::spawn(async move {
            for chunk in bytes.chunks(5) {
                a.write_all(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            drop(a);
        });
        let mut reader = FrameReader::new(b, 4096, Some(std::time::Duration::from_secs(5)));
        let mut got = Vec::new();
        let mut given_up = 0;
        loop {
            tokio::select! {
                f = reader.next::<FromWorker>() => match f {
                    Ok(m) => got.push(m),
                    Err(FrameError::Closed) => break,
                    Err(e) => panic!("{e}"),
                },
                () = tokio::task::yield_now() => given_up += 1,
            }
        }
        writer.await.unwrap();
        assert_eq!(got, sent);
        assert!(given_up > 0, "the read was never given up");
        // After the end it stays ended.
        assert!(matches!(
            reader.next::<FromWorker>().await,
            Err(FrameError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_frame_reader_checks_the_length_before_the_body() {
        let mut bytes = 5000u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let mut reader = FrameReader::new(&bytes[..], 4096, None);
        let r = reader.next::<FromWorker>().await;
        assert!(
            matches!(
                r,
                Err(FrameError::Oversize {
                    len: 5000,
                    max: 4096
                })
            ),
            "{r:?}"
        );
        assert!(reader.failed());
        assert!(matches!(
            reader.next::<FromWorker>().await,
            Err(FrameError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_stalled_body_is_an_error_not_a_wait() {
        use tokio::io::AsyncWriteExt;
        let (mut a, mut b) = tokio::io::duplex(1024);
        // A length prefix promising 100 bytes, then only 3, then silence.
        a.write_all(&100u32.to_be_bytes()).await.unwrap();
        a.write_all(b"abc").await.unwrap();
        let r: Result<FromWorker, _> =
            read_frame_async_within(&mut b, 1024, Some(std::time::Duration::from_millis(100)))
                .await;
        assert!(
            matches!(r, Err(FrameError::Stalled { expected: 100, .. })),
            "{r:?}"
        );
        drop(a);
    }
}
