//! Run events as JSON lines (plus `tracing`), so a recursive run reads as one
//! tree: every event carries run_id, parent_run_id, root_run_id and depth.

use super::result::RunInfo;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Default)]
pub struct EventSink {
    file: Option<Arc<Mutex<std::fs::File>>>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.file.is_some())
            .finish()
    }
}

impl EventSink {
    /// Append events to `path` (created if missing).
    pub fn to_file(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EventSink {
            file: Some(Arc::new(Mutex::new(file))),
        })
    }

    pub fn record(&self, kind: &str, run: &RunInfo, fields: Value) {
        tracing::debug!(event = kind, run_id = %run.run_id, depth = run.depth, "{fields}");
        let Some(file) = &self.file else { return };
        let ts_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut obj = json!({
            "ts_ms": ts_ms,
            "event": kind,
            "run_id": run.run_id,
            "parent_run_id": run.parent_run_id,
            "root_run_id": run.root_run_id,
            "depth": run.depth,
        });
        if let (Some(o), Value::Object(extra)) = (obj.as_object_mut(), fields) {
            for (k, v) in extra {
                o.insert(k, v);
            }
        }
        let mut line = obj.to_string();
        line.push('\n');
        let mut guard = match file.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Err(e) = guard.write_all(line.as_bytes()) {
            tracing::warn!("failed to write an event: {e}");
        }
    }
}
