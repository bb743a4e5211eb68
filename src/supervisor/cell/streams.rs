//! A worker's stdout and stderr: captured under the cell's cap, copied
//! live where the cell asks, and collected once the worker is gone.

use super::CellSpec;
use crate::supervisor::output::Capture;
use crate::supervisor::OutputStream;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe::Receiver;

/// Bytes read from a pipe at once.
const READ_BYTES: usize = 64 * 1024;

/// At most this much is drained from a pipe (see [`drain_now`]).
const DRAIN_BYTES: usize = 16 << 20;

/// A worker's two output streams, being read.
pub(super) struct Streams {
    stdout: Arc<Mutex<Capture>>,
    stderr: Arc<Mutex<Capture>>,
    pipes: Vec<Arc<Pipe>>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

/// One output pipe, read by its pump as it becomes readable, or by
/// [`Streams::drain`]; whoever reads holds `out` from the read to the
/// last copy of what it read, so that the output keeps its order.
struct Pipe {
    rx: Receiver,
    /// The same pipe, read by the drain as it is, not as the runtime last
    /// saw it (which may not have seen it readable yet).
    raw: std::fs::File,
    out: tokio::sync::Mutex<Out>,
}

impl Streams {
    /// Start reading the worker's `stdout` and `stderr` pipes.
    pub(super) fn start(spec: &CellSpec, stdout: OwnedFd, stderr: OwnedFd) -> Streams {
        let cap = spec.limits.max_output_bytes;
        let out_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let err_cap = Arc::new(Mutex::new(Capture::new(cap)));
        let mut pipes = Vec::new();
        let mut pumps = Vec::new();
        for (fd, capture, is_out, stream) in [
            (stdout, &out_cap, true, OutputStream::Stdout),
            (stderr, &err_cap, false, OutputStream::Stderr),
        ] {
            let Ok(raw) = fd.try_clone() else { continue };
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
                    shown: crate::supervisor::output::Shown::new(spec.forward_output),
                    tap,
                    buf: Vec::new(),
                    over: false,
                };
                let pipe = Arc::new(Pipe {
                    rx,
                    raw: std::fs::File::from(raw),
                    out: tokio::sync::Mutex::new(out),
                });
                pumps.push(tokio::spawn(pump(pipe.clone())));
                pipes.push(pipe);
            }
        }
        Streams {
            stdout: out_cap,
            stderr: err_cap,
            pipes,
            pumps,
        }
    }

    /// What the streams hold by now, when their writer has said `done`:
    /// it wrote everything before that, so it is in the pipes (or read
    /// already); what comes later is not the cell's. Read here, without
    /// waiting for the pumps, which stop at their next wake.
    pub(super) async fn drain(self) -> (Capture, Capture) {
        for pipe in &self.pipes {
            let mut out = pipe.out.lock().await;
            if !out.over {
                drain_now(&pipe.raw, &mut out).await;
                out.over = true;
            }
        }
        self.finish_shown().await;
        (take_capture(&self.stdout), take_capture(&self.stderr))
    }

    /// What the streams held, once their writers are gone (stragglers get
    /// a moment).
    pub(super) async fn collect(mut self) -> (Capture, Capture) {
        collect_output(std::mem::take(&mut self.pumps)).await;
        self.finish_shown().await;
        (take_capture(&self.stdout), take_capture(&self.stderr))
    }

    /// What the redaction of the shown copy held back (a possible start of
    /// a secret at the end of what was read), shown now that nothing more
    /// comes.
    async fn finish_shown(&self) {
        for pipe in &self.pipes {
            let mut out = pipe.out.lock().await;
            let rest = out.shown.finish();
            out.show(&rest).await;
        }
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
    /// What of it is copied to this process's own stream, and how.
    shown: crate::supervisor::output::Shown,
    tap: Option<Tap>,
    /// What was read last (its capacity is kept; it is never zeroed).
    buf: Vec<u8>,
    /// Nothing more is read: the pipe ended, or was drained.
    over: bool,
}

/// Read the pipe as it becomes readable until its end, or until it was
/// drained.
async fn pump(pipe: Arc<Pipe>) {
    loop {
        if pipe.rx.readable().await.is_err() {
            return;
        }
        let mut out = pipe.out.lock().await;
        if out.over {
            return;
        }
        read_now(&pipe.rx, &mut out).await;
        if out.over {
            return;
        }
    }
}

/// Read what the pipe holds now into `out` (its end marks `out` over).
async fn read_now(rx: &Receiver, out: &mut Out) {
    loop {
        out.buf.clear();
        out.buf.reserve(READ_BYTES);
        match rx.try_read_buf(&mut out.buf) {
            Ok(0) => {
                out.over = true;
                return;
            }
            Ok(_) => {
                out.take().await;
                // A writer that keeps the pipe full does not keep this
                // runtime thread: the task gives way once its turn is
                // used up (the runtime's own reads do the same).
                tokio::task::coop::consume_budget().await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                out.over = true;
                return;
            }
        }
    }
}

/// Read what the pipe holds now into `out`, at most [`DRAIN_BYTES`]: a
/// writer that goes on writing (not the cell's worker, which said `done`)
/// does not hold the drain.
async fn drain_now(raw: &std::fs::File, out: &mut Out) {
    use std::io::Read;
    let mut left = DRAIN_BYTES;
    while left > 0 {
        out.buf.clear();
        out.buf.reserve(READ_BYTES);
        let chunk = READ_BYTES.min(left);
        // Into the buffer's spare room (nothing zeroed), to its end, the
        // chunk, or what the pipe holds.
        let read = raw.take(chunk as u64).read_to_end(&mut out.buf);
        let n = out.buf.len();
        left -= n;
        if n > 0 {
            out.take().await;
            tokio::task::coop::consume_budget().await;
        }
        match read {
            Ok(_) if n == chunk => {}
            Ok(_) => {
                // Its end.
                out.over = true;
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => {
                out.over = true;
                return;
            }
        }
    }
}

impl Out {
    /// Take in what was read last.
    async fn take(&mut self) {
        let chunk = &self.buf[..];
        let cap = &self.cap;
        if let Some(t) = self.tap.as_mut() {
            // Live output is best effort (the result always has it): never
            // wait for a slow consumer, never pass more than the cap.
            let take = chunk.len().min(t.budget);
            if take > 0 {
                let c = crate::supervisor::OutputChunk {
                    stream: t.stream,
                    text: crate::supervisor::output::text_from(&chunk[..take]),
                };
                if t.tx.try_send(c).is_ok() {
                    t.budget -= take;
                }
            }
        }
        let to_head = crate::util::lock(cap).push(chunk);
        let shown = self.shown.pass(chunk, to_head);
        self.show(&shown).await;
    }

    /// Copy `shown` to this process's stdout or stderr. Flushed before the
    /// next read, so that it is out before the result the caller prints
    /// after it.
    async fn show(&self, shown: &[u8]) {
        if shown.is_empty() {
            return;
        }
        if self.forward.1 {
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

    /// Streams of one pipe (as stdout), its pump started.
    fn stdout_of(rd: std::io::PipeReader) -> (Streams, Arc<Pipe>) {
        let rd = OwnedFd::from(rd);
        let raw = std::fs::File::from(rd.try_clone().expect("dup"));
        let rx = Receiver::from_owned_fd(rd).expect("receiver");
        let cap = Arc::new(Mutex::new(Capture::new(1 << 20)));
        let out = Out {
            cap: cap.clone(),
            forward: (Forward::No, true),
            shown: crate::supervisor::output::Shown::new(Forward::No),
            tap: None,
            buf: Vec::new(),
            over: false,
        };
        let pipe = Arc::new(Pipe {
            rx,
            raw,
            out: tokio::sync::Mutex::new(out),
        });
        let streams = Streams {
            stdout: cap,
            stderr: Arc::new(Mutex::new(Capture::new(0))),
            pipes: vec![pipe.clone()],
            pumps: vec![tokio::spawn(pump(pipe.clone()))],
        };
        (streams, pipe)
    }

    /// A worker that said `done` wrote its output before: a drain takes all
    /// of it, in order (more than a pipe holds at once, so some was read by
    /// the pump while it was written), and ends while the pipe is still
    /// open; the pump ends at the pipe's end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_takes_what_was_written_without_waiting_for_the_pipes_end() {
        let (rd, wr) = std::io::pipe().expect("pipe");
        let (streams, pipe) = stdout_of(rd);
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
        let drained = tokio::time::timeout(Duration::from_secs(30), streams.drain()).await;
        let (stdout, _) = drained.expect("the drain waited for the pipe's end");
        let (text, truncated) = stdout.finish();
        assert!(truncated.is_none());
        assert_eq!(text.as_bytes(), &expected[..]);
        let _ = let_go.send(());
        writer.join().expect("writer");
        let t0 = std::time::Instant::now();
        while Arc::strong_count(&pipe) > 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the pump outlived its pipe"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// What was written before the drain is taken even when the runtime
    /// has not yet seen the pipe readable (its pump has not run).
    #[tokio::test(flavor = "current_thread")]
    async fn a_drain_reads_the_pipe_not_the_runtimes_view_of_it() {
        let (rd, mut wr) = std::io::pipe().expect("pipe");
        let (streams, _pipe) = stdout_of(rd);
        wr.write_all(b"said before done\n").expect("write");
        let (stdout, _) = streams.drain().await;
        assert_eq!(stdout.finish().0, "said before done\n");
        drop(wr);
    }
}
