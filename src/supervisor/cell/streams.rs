//! A worker's stdout and stderr: captured under the cell's cap, copied
//! live where the cell asks, and collected once the worker is gone.

use super::CellSpec;
use crate::supervisor::output::Capture;
use crate::supervisor::OutputStream;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe::Receiver;
use tokio_util::sync::CancellationToken;

/// A worker's two output streams, being read.
pub(super) struct Streams {
    stdout: Arc<Mutex<Capture>>,
    stderr: Arc<Mutex<Capture>>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
    /// Stop at what the pipes hold now (see [`Streams::drain`]).
    stop: CancellationToken,
}

impl Streams {
    /// Start reading the worker's `stdout` and `stderr` pipes.
    pub(super) fn start(spec: &CellSpec, stdout: OwnedFd, stderr: OwnedFd) -> Streams {
        let cap = spec.limits.max_output_bytes;
        let out_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let err_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let mut pumps = Vec::new();
        let stop = CancellationToken::new();
        for (fd, capture, is_out, stream) in [
            (stdout, &out_cap, true, OutputStream::Stdout),
            (stderr, &err_cap, false, OutputStream::Stderr),
        ] {
            if let Ok(rx) = Receiver::from_owned_fd(fd) {
                let fwd = (spec.forward_output, is_out);
                let tap = spec.output.clone().map(|tx| Tap {
                    tx,
                    stream,
                    budget: cap,
                });
                let out = Out {
                    cap: capture.clone(),
                    forward: fwd,
                    tap,
                };
                pumps.push(tokio::spawn(pump(rx, out, stop.clone())));
            }
        }
        Streams {
            stdout: out_cap,
            stderr: err_cap,
            pumps,
            stop,
        }
    }

    /// What the streams hold by now, when their writer has said `done`:
    /// it wrote everything before that, so it is in the pipes (or read
    /// already); what comes later is not the cell's.
    pub(super) async fn drain(self) -> (Capture, Capture) {
        self.stop.cancel();
        self.collect().await
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

/// Where a stream's output goes.
struct Out {
    cap: Arc<Mutex<Capture>>,
    forward: (crate::supervisor::Forward, bool),
    tap: Option<Tap>,
}

/// Read `r` into `out` until its end, or once `stop` is cancelled, until
/// it holds nothing more now.
async fn pump(mut r: Receiver, mut out: Out, stop: CancellationToken) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            biased;
            n = r.read(&mut buf) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = stop.cancelled() => {
                // Read the pipe itself, not the runtime's last word on
                // whether it is readable.
                while let Ok(n @ 1..) = nix::unistd::read(&r, &mut buf) {
                    out.take(&buf[..n]).await;
                }
                return;
            }
        };
        out.take(&buf[..n]).await;
    }
}

impl Out {
    async fn take(&mut self, chunk: &[u8]) {
        let (cap, forward) = (&self.cap, self.forward);
        if let Some(t) = self.tap.as_mut() {
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
        let to_head = crate::util::lock(cap).push(chunk);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::Forward;
    use std::io::Write;

    /// A worker that said `done` wrote its output before: a drain takes all
    /// of it (more than a pipe holds at once, so some was read while it was
    /// written) and ends while the pipe is still open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_takes_what_was_written_without_waiting_for_the_pipes_end() {
        let (rd, wr) = std::io::pipe().expect("pipe");
        let rx = Receiver::from_owned_fd(OwnedFd::from(rd)).expect("receiver");
        let cap = Arc::new(Mutex::new(Capture::new(1 << 20)));
        let out = Out {
            cap: cap.clone(),
            forward: (Forward::No, true),
            tap: None,
        };
        let stop = CancellationToken::new();
        let pump = tokio::spawn(pump(rx, out, stop.clone()));
        let data: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let expected = data.clone();
        // The writer keeps its end open after writing (as a lingering
        // worker does) until it is told to let go.
        let (said_done, done_rx) = std::sync::mpsc::channel();
        let (let_go, let_go_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let mut wr = wr;
            wr.write_all(&data).expect("write");
            said_done.send(()).expect("done");
            let _ = let_go_rx.recv();
        });
        tokio::task::spawn_blocking(move || done_rx.recv())
            .await
            .expect("join")
            .expect("the writer wrote");
        stop.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(30), pump).await;
        assert!(ended.is_ok(), "the drain waited for the pipe's end");
        let (text, truncated) = take_capture(&cap).finish();
        assert!(truncated.is_none());
        assert_eq!(text.as_bytes(), &expected[..]);
        let _ = let_go.send(());
        writer.join().expect("writer");
    }
}
