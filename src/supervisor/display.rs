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

/// Move `done`'s display items into `result`, within `limits`.
pub(crate) fn take(limits: &Limits, result: &mut CellResult, done: &Done) {
    let mut total = 0;
    result.display.clear();
    result.display_dropped = done.display_dropped.clone();
    for item in &done.display {
        match refusal(item, limits, total) {
            None => {
                total += item.data.len();
                result.display.push(item.clone());
            }
            Some(reason) => result.display_dropped.push(DisplayDropped {
                mime: item.mime.chars().take(100).collect(),
                bytes: item.data.len() as u64,
                reason,
            }),
        }
    }
    // A hostile worker's list of reasons is bounded too.
    result.display_dropped.truncate(1000);
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
}
