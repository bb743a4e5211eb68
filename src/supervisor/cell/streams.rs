//! A worker's stdout and stderr: captured under the cell's cap, copied
//! live where the cell asks, and collected once the worker is gone.

use super::CellSpec;
use crate::supervisor::output::Capture;
use crate::supervisor::OutputStream;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// A worker's two output streams, being read.
pub(super) struct Streams {
    stdout: Arc<Mutex<Capture>>,
    stderr: Arc<Mutex<Capture>>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

impl Streams {
    /// Start reading the worker's `stdout` and `stderr` pipes.
    pub(super) fn start(spec: &CellSpec, stdout: OwnedFd, stderr: OwnedFd) -> Streams {
        let cap = spec.limits.max_output_bytes;
        let out_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let err_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let mut pumps = Vec::new();
        for (fd, capture, is_out, stream) in [
            (stdout, &out_cap, true, OutputStream::Stdout),
            (stderr, &err_cap, false, OutputStream::Stderr),
        ] {
            if let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
                let fwd = (spec.forward_output, is_out);
                let tap = spec.output.clone().map(|tx| Tap {
                    tx,
                    stream,
                    budget: cap,
                });
                pumps.push(tokio::spawn(pump(rx, capture.clone(), fwd, tap)));
            }
        }
        Streams {
            stdout: out_cap,
            stderr: err_cap,
            pumps,
        }
    }

    /// What the streams held, once their writers are gone (stragglers get
    /// a moment).
    pub(super) async fn collect(self) -> (Capture, Capture) {
        collect_output(self.pumps).await;
        (take_capture(&self.stdout), take_capture(&self.stderr))
    }
}

/// Where a live copy of a stream's output goes (at most `budget` bytes).
struct Tap {
    tx: tokio::sync::mpsc::Sender<crate::supervisor::OutputChunk>,
    stream: crate::supervisor::OutputStream,
    budget: usize,
}

async fn pump<R: AsyncRead + Unpin>(
    mut r: R,
    cap: Arc<Mutex<Capture>>,
    forward: (crate::supervisor::Forward, bool),
    mut tap: Option<Tap>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if let Some(t) = tap.as_mut() {
            // Live output is best effort (the result always has it): never
            // wait for a slow consumer, never pass more than the cap.
            let take = chunk.len().min(t.budget);
            if take > 0 {
                let c = crate::supervisor::OutputChunk {
                    stream: t.stream,
                    text: String::from_utf8_lossy(&chunk[..take]).into_owned(),
                };
                if t.tx.try_send(c).is_ok() {
                    t.budget -= take;
                }
            }
        }
        let to_head = crate::util::lock(&cap).push(chunk);
        let shown = forward.0.shown(chunk, to_head);
        // Flushed before the next read, so that it is out before the result
        // the caller prints after it.
        if !shown.is_empty() {
            if forward.1 {
                let mut out = tokio::io::stdout();
                let _ = out.write_all(shown).await;
                let _ = out.flush().await;
            } else {
                let mut err = tokio::io::stderr();
                let _ = err.write_all(shown).await;
                let _ = err.flush().await;
            }
        }
    }
}

fn take_capture(cap: &Arc<Mutex<Capture>>) -> Capture {
    let mut guard = crate::util::lock(cap);
    std::mem::replace(&mut *guard, Capture::new(0))
}

/// Output pipes close once every process holding them is gone (or has
/// closed them); give stragglers a moment, then stop reading.
async fn collect_output(pumps: Vec<tokio::task::JoinHandle<()>>) {
    for p in pumps {
        let abort = p.abort_handle();
        if tokio::time::timeout(Duration::from_millis(500), p)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}
