//! A cell's display items over MCP: an image as image content, HTML and
//! Markdown as text content, after the readable rendering. In
//! `structuredContent` each item keeps its MIME type and size and names
//! the content block that holds it (`content_index`), so its bytes are sent
//! once.

use crate::protocol::DisplayItem;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};

/// Append a cell's `display` items to `tool`'s content and point its
/// `structuredContent` at them.
pub fn attach(display: &[DisplayItem], tool: &mut CallToolResult) {
    if display.is_empty() {
        return;
    }
    let mut described = Vec::with_capacity(display.len());
    for item in display {
        let index = tool.content.len();
        tool.content.push(if item.mime.starts_with("image/") {
            ContentBlock::image(item.data.clone(), item.mime.clone())
        } else {
            ContentBlock::text(item.data.clone())
        });
        described.push(json!({
            "mime": item.mime,
            "bytes": item.data.len(),
            "content_index": index,
        }));
    }
    if let Some(Value::Object(m)) = tool.structured_content.as_mut() {
        m.insert("display".into(), Value::Array(described));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CellResult, RunInfo};

    #[test]
    fn images_become_image_content_named_by_index() {
        let mut r = CellResult::new("python", RunInfo::root());
        r.display = vec![
            DisplayItem {
                mime: "image/png".into(),
                data: "iVBORw==".into(),
            },
            DisplayItem {
                mime: "text/html".into(),
                data: "<b>x</b>".into(),
            },
        ];
        let mut tool = CallToolResult::structured(serde_json::to_value(&r).unwrap());
        tool.content = vec![ContentBlock::text("rendering")];
        attach(&r.display, &mut tool);
        assert_eq!(tool.content.len(), 3);
        let v = serde_json::to_value(&tool.content).unwrap();
        assert_eq!(v[1]["type"], "image");
        assert_eq!(v[1]["data"], "iVBORw==");
        assert_eq!(v[1]["mimeType"], "image/png");
        assert_eq!(v[2]["text"], "<b>x</b>");
        let s = tool.structured_content.unwrap();
        assert_eq!(
            s["display"],
            json!([
                {"mime": "image/png", "bytes": 8, "content_index": 1},
                {"mime": "text/html", "bytes": 8, "content_index": 2}
            ])
        );
    }
}
