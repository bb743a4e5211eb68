//! A cell's display items (figures, rich values) as they go into its
//! result. The worker's `done` frame brings them; the worker is not
//! trusted to have kept its limits, so they are checked again here: a known
//! MIME type, base64 for an image, within `max_display_item_bytes` each and
//! `max_display_bytes` in all. What is left out is listed with the reason.

use super::result::CellResult;
use super::Limits;
use crate::protocol::{DisplayDropped, DisplayItem, Done, DISPLAY_MIMES};

/// Whether `data` is plausible standard base64 (alphabet and padding).
fn is_base64(data: &str) -> bool {
    let body = data.trim_end_matches('=');
    data.len().is_multiple_of(4)
        && data.len() - body.len() <= 2
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// Why `item` is left out, if it is.
fn refusal(item: &DisplayItem, limits: &Limits, total: usize) -> Option<String> {
    if !DISPLAY_MIMES.contains(&item.mime.as_str()) {
        return Some(format!(
            "unsupported MIME type (supported: {})",
            DISPLAY_MIMES.join(", ")
        ));
    }
    if item.mime.starts_with("image/") && !is_base64(&item.data) {
        return Some("an image that is not base64".into());
    }
    if item.data.len() > limits.max_display_item_bytes {
        return Some(format!(
            "larger than max_display_item_bytes ({})",
            limits.max_display_item_bytes
        ));
    }
    if total + item.data.len() > limits.max_display_bytes {
        return Some(format!(
            "over max_display_bytes ({}) for the whole cell",
            limits.max_display_bytes
        ));
    }
    None
}

/// Display items one cell's result keeps at most, whatever their size:
/// each becomes a content block of its own, and a block costs a client
/// something even when empty.
pub const MAX_DISPLAY_ITEMS: usize = 64;
/// Entries of `display_dropped` a result keeps at most (the last one then
/// counts the rest).
pub const MAX_DISPLAY_DROPPED: usize = 32;
/// Bytes of a `display_dropped` entry's MIME type and reason kept.
const MAX_MIME_CHARS: usize = 100;
const MAX_REASON_BYTES: usize = 300;

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Move `done`'s display items into `result`, within `limits` and
/// [`MAX_DISPLAY_ITEMS`]; what is left out is listed (at most
/// [`MAX_DISPLAY_DROPPED`] entries, each bounded: the worker's own reasons
/// are its words, not the supervisor's).
pub(crate) fn take(limits: &Limits, result: &mut CellResult, done: &Done) {
    let mut total = 0;
    result.display.clear();
    let mut dropped: Vec<DisplayDropped> = done
        .display_dropped
        .iter()
        .take(MAX_DISPLAY_DROPPED + 1)
        .map(|d| DisplayDropped {
            mime: d.mime.chars().take(MAX_MIME_CHARS).collect(),
            bytes: d.bytes,
            reason: cut(&d.reason, MAX_REASON_BYTES),
        })
        .collect();
    let mut unlisted = done.display_dropped.len().saturating_sub(dropped.len()) as u64;
    for item in &done.display {
        let reason = if result.display.len() >= MAX_DISPLAY_ITEMS {
            Some(format!(
                "past the first {MAX_DISPLAY_ITEMS} items (at most {MAX_DISPLAY_ITEMS} per cell)"
            ))
        } else {
            refusal(item, limits, total)
        };
        match reason {
            None => {
                total += item.data.len();
                result.display.push(item.clone());
            }
            Some(_) if dropped.len() > MAX_DISPLAY_DROPPED => unlisted += 1,
            Some(reason) => dropped.push(DisplayDropped {
                mime: item.mime.chars().take(MAX_MIME_CHARS).collect(),
                bytes: item.data.len() as u64,
                reason,
            }),
        }
    }
    if dropped.len() > MAX_DISPLAY_DROPPED {
        unlisted += (dropped.len() - MAX_DISPLAY_DROPPED) as u64;
        dropped.truncate(MAX_DISPLAY_DROPPED);
    }
    if unlisted > 0 {
        dropped.push(DisplayDropped {
            mime: "*".into(),
            bytes: 0,
            reason: format!(
                "{unlisted} more items were left out and are not listed (at most \
                 {MAX_DISPLAY_DROPPED} listed)"
            ),
        });
    }
    result.display_dropped = dropped;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunInfo;

    fn item(mime: &str, data: &str) -> DisplayItem {
        DisplayItem {
            mime: mime.into(),
            data: data.into(),
        }
    }

    /// A successful cell's `done` with these display items and reasons.
    fn done_showing(display: Vec<DisplayItem>, display_dropped: Vec<DisplayDropped>) -> Done {
        Done {
            status: crate::protocol::DoneStatus::Ok,
            value: serde_json::Value::Null,
            repr: None,
            vars: Default::default(),
            kept: vec![],
            dropped: vec![],
            definitions: vec![],
            error: None,
            limit: None,
            live: None,
            display,
            display_dropped,
        }
    }

    #[test]
    fn items_are_checked_again_and_capped() {
        let limits = Limits {
            max_display_bytes: 12,
            max_display_item_bytes: 8,
            ..Limits::default()
        };
        let done = Done {
            status: crate::protocol::DoneStatus::Ok,
            value: serde_json::Value::Null,
            repr: None,
            vars: Default::default(),
            kept: vec![],
            dropped: vec![],
            definitions: vec![],
            error: None,
            limit: None,
            live: None,
            display: vec![
                item("image/png", "iVBORw=="),
                item("text/html", "<b>x</b>"),
                item("text/markdown", "*a*"),
                item("image/png", "not base64!"),
                item("application/x-evil", "x"),
                item("text/html", "123456789"),
            ],
            display_dropped: vec![],
        };
        let mut r = CellResult::new("python", RunInfo::root());
        take(&limits, &mut r, &done);
        let kept: Vec<_> = r.display.iter().map(|i| i.data.as_str()).collect();
        assert_eq!(kept, ["iVBORw==", "*a*"]);
        let reasons: Vec<_> = r
            .display_dropped
            .iter()
            .map(|d| d.reason.as_str())
            .collect();
        assert!(reasons[0].contains("max_display_bytes"), "{reasons:?}");
        assert!(reasons[1].contains("not base64"), "{reasons:?}");
        assert!(reasons[2].contains("unsupported MIME"), "{reasons:?}");
        assert!(reasons[3].contains("max_display_item_bytes"), "{reasons:?}");
    }

    #[test]
    fn item_counts_and_reasons_are_bounded() {
        let limits = Limits::default();
        let mut done = done_showing(
            // Empty items cost no bytes: only the count holds them.
            vec![item("text/markdown", ""); 200_001],
            vec![
                DisplayDropped {
                    mime: "m".repeat(10_000),
                    bytes: 1,
                    reason: "é".repeat(100_000),
                };
                5000
            ],
        );
        let mut r = CellResult::new("python", RunInfo::root());
        take(&limits, &mut r, &done);
        assert_eq!(r.display.len(), MAX_DISPLAY_ITEMS);
        assert_eq!(r.display_dropped.len(), MAX_DISPLAY_DROPPED + 1);
        let last = r.display_dropped.last().unwrap();
        let unlisted = 5000 + 200_001 - MAX_DISPLAY_ITEMS - MAX_DISPLAY_DROPPED;
        assert!(
            last.reason.starts_with(&format!("{unlisted} more items")),
            "{}",
            last.reason
        );
        for d in &r.display_dropped {
            assert!(d.mime.chars().count() <= MAX_MIME_CHARS);
            assert!(
                d.reason.len() <= MAX_REASON_BYTES + 100,
                "{}",
                d.reason.len()
            );
        }
        // The cell's own items are listed when there is room.
        done.display_dropped.clear();
        done.display.truncate(MAX_DISPLAY_ITEMS + 2);
        take(&limits, &mut r, &done);
        assert_eq!(r.display_dropped.len(), 2);
        assert!(
            r.display_dropped[0].reason.contains("past the first 64"),
            "{:?}",
            r.display_dropped
        );
    }
}
