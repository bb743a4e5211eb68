//! Run events as JSON lines (plus `tracing`), so a recursive run reads as one
//! tree: every event carries run_id, parent_run_id, root_run_id and depth.

use super::result::RunInfo;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the events file may hold by default before it is rotated (see
/// [`EventSink::to_file_bounded`]).
pub const DEFAULT_EVENTS_MAX_BYTES: u64 = 64 << 20;

#[derive(Clone, Default)]
pub struct EventSink {
    file: Option<Arc<Mutex<Rotating>>>,
}

/// An append-only file that is moved to `<path>.1` (replacing the one
/// before) once it holds `max` bytes: the events take at most twice `max`
/// on disk, whatever cells emit.
struct Rotating {
    path: std::path::PathBuf,
    file: std::fs::File,
    written: u64,
    max: u64,
}

impl Rotating {
    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.written > 0 && self.written + line.len() as u64 > self.max {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(&self.path, &old)?;
            self.file = open_append(&self.path)?;
            self.written = 0;
        }
        self.file.write_all(line)?;
        self.written += line.len() as u64;
        Ok(())
    }
}

fn open_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.file.is_some())
            .finish()
    }
}

impl EventSink {
    /// Append events to `path` (created if missing), rotated at
    /// [`DEFAULT_EVENTS_MAX_BYTES`].
    pub fn to_file(path: &std::path::Path) -> std::io::Result<Self> {
        Self::to_file_bounded(path, DEFAULT_EVENTS_MAX_BYTES)
    }

    /// Append events to `path` (created if missing); once it holds
    /// `max_bytes` it is renamed to `<path>.1` (replacing an older one) and
    /// a new file is started, so the events never take more than twice
    /// `max_bytes`.
    pub fn to_file_bounded(path: &std::path::Path, max_bytes: u64) -> std::io::Result<Self> {
        let file = open_append(path)?;
        let written = file.metadata()?.len();
        Ok(EventSink {
            file: Some(Arc::new(Mutex::new(Rotating {
                path: path.to_path_buf(),
                file,
                written,
                max: max_bytes.max(1),
            }))),
        })
    }

    /// Record one event; its fields are redacted first (see
    /// [`crate::secrets`]: the operator's records, which no tenant reads),
    /// for the file and the log alike.
    pub fn record(&self, kind: &str, run: &RunInfo, mut fields: Value) {
        crate::secrets::redact_record_value(&mut fields);
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
        if let (Some(o), Some(id)) = (obj.as_object_mut(), &run.request_id) {
            o.insert("request_id".into(), json!(id));
        }
        if let (Some(o), Value::Object(extra)) = (obj.as_object_mut(), fields) {
            for (k, v) in extra {
                o.insert(k, v);
            }
        }
        let mut line = obj.to_string();
        line.push('\n');
        let mut guard = crate::util::lock(file);
        if let Err(e) = guard.write(line.as_bytes()) {
            tracing::warn!("failed to write an event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_file_is_rotated_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev.jsonl");
        let sink = EventSink::to_file_bounded(&path, 10_000).unwrap();
        let run = RunInfo {
            run_id: "r".into(),
            parent_run_id: None,
            root_run_id: "r".into(),
            depth: 0,
            request_id: None,
        };
        for i in 0..2000 {
            sink.record("emit", &run, json!({"data": "x".repeat(100), "i": i}));
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(dir.path().join("ev.jsonl.1"))
            .unwrap()
            .len();
        assert!(now <= 10_000 && old <= 10_000, "{now} {old}");
        // The newest event is in the current file.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.lines().last().unwrap().contains("\"i\":1999"),
            "{text}"
        );
    }
}
