//! `cellbox serve`: an MCP server exposing `execute_code` and session tools,
//! over stdio (the default) or streamable HTTP.
//!
//! - [`config`]: the TOML file and flags, validated into [`Settings`].
//! - [`handler`]: the tools; cancellation kills the call's cell.
//! - [`sessions`]: named sessions with a cap and idle expiry.
//! - [`gate`]: `max_concurrency` running cells, `max_queue` waiting calls.
//! - [`describe`] and [`schema`]: tool descriptions generated from the
//!   settings and the sandbox a probe cell actually got; input and output
//!   schemas.
//! - [`listener`]: the HTTP listener with its bearer-token check.
//! - [`principal`]: who calls (one per token over HTTP); sessions and queue
//!   shares belong to a principal.
//! - [`lines`]: stdin cut into lines; one too long is answered, not lost.
//! - [`fit`]: a cell result held to what clients accept and a model can read
//!   (display items as content blocks of their own).
//! - [`jsonrpc`]: a request that does not parse is answered for its id.
//! - [`ids`]: over stdio, a request id rmcp cannot hold (`1.5`, past `i64`)
//!   is served under a token and put back in the reply.
//!
//! Logging: stderr, filtered by `CELLBOX_LOG`, else [`DEFAULT_LOG`].
//!
//! - [`ops`]: `/healthz`, `/readyz`, and the drain on SIGTERM or SIGINT
//!   (running cells get `--drain-timeout` to finish; new calls are refused).
//!
//! Shutdown (stdin closed, the drain's end, a second signal) cancels every
//! call in flight, which kills their cells, and waits until the workers are
//! reaped before returning.

pub mod config;
pub mod describe;
pub mod fit;
pub mod gate;
pub mod handler;
pub mod ids;
pub mod jsonrpc;
pub mod lines;
pub mod listener;
pub mod ops;
pub mod principal;
pub mod schema;
#[cfg(target_os = "linux")]
pub mod session_files;
pub mod sessions;
pub mod tooldefs;

pub use config::{LogFormat, ServeArgs, ServeConfig, Settings, Transport};

/// What `serve` logs to stderr when `CELLBOX_LOG` does not say: warnings
/// (among them warm workers found dead or stalled and replaced), cells
/// moved off a stalled zygote, and the drain's steps. A warm worker's
/// start and routine retirement are at debug level; each call's line
/// (`cellbox::serve::calls`) at info, shown when `CELLBOX_LOG` asks.
pub const DEFAULT_LOG: &str = "warn,cellbox::pool=info,cellbox::serve::ops=info";
pub use handler::CellboxServer;
pub use principal::Principal;

use crate::exit::Exit;
use crate::{EventSink, Supervisor};
use rmcp::ServiceExt;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

const EXIT_USAGE: u8 = Exit::Usage.code();
const EXIT_INTERNAL: u8 = Exit::Internal.code();

/// How long shutdown waits for calls in flight to let go of their cells.
const DRAIN: Duration = Duration::from_secs(10);

/// Standard input, read on a plain thread and handed over in chunks. A
/// thread blocked in `read` does not hold up runtime shutdown (a read on
/// tokio's blocking pool would, when stdin is a terminal), and it ends with
/// the process. End of input (or a read error) fires `eof`: for stdio, the
/// client going away, which drains the server as a signal does (see
/// [`ops`]). The MCP service is told of the end only once `shutdown` fires
/// (the drain is over), so calls still running can answer.
struct StdinReader {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
    eof: CancellationToken,
    /// Set once the end was seen: the wait for `shutdown`.
    ended: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    shutdown: CancellationToken,
}

impl StdinReader {
    /// Read standard input on its own thread, a line at a time, none held
    /// longer than `limit` bytes (see [`lines`]).
    fn spawn(
        eof: CancellationToken,
        shutdown: CancellationToken,
        limit: usize,
        swap: Arc<ids::IdSwap>,
        calls_read: Arc<std::sync::atomic::AtomicU64>,
    ) -> std::io::Result<StdinReader> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        std::thread::Builder::new()
            .name("cellbox-stdin".into())
            .spawn(move || {
                let mut stdin = std::io::BufReader::with_capacity(64 * 1024, std::io::stdin());
                loop {
                    match lines::next_line(&mut stdin, limit) {
                        Ok(lines::Line::End) => return,
                        Ok(lines::Line::Pass(line)) => {
                            // A request rmcp cannot read is answered for
                            // its id (see `jsonrpc`); one whose only fault
                            // is an id rmcp cannot hold goes on under a
                            // token (see `ids`).
                            let line = match jsonrpc::check(&line) {
                                None => line,
                                Some(u) => match swap.admit(&line) {
                                    Some(swapped) => match jsonrpc::check(&swapped) {
                                        None => swapped,
                                        Some(u) => u.stand_in(),
                                    },
                                    None => u.stand_in(),
                                },
                            };
                            if ops::is_tool_call(&line) {
                                calls_read.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                            }
                            if tx.blocking_send(Ok(line)).is_err() {
                                return;
                            }
                        }
                        Ok(lines::Line::Dropped { bytes }) => tracing::warn!(
                            "dropped a message of {bytes} bytes (over the limit of {limit}) \
                             that has no id to answer"
                        ),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e));
                            return;
                        }
                    }
                }
            })?;
        Ok(StdinReader {
            rx,
            chunk: Vec::new(),
            pos: 0,
            done: false,
            eof,
            ended: None,
            shutdown,
        })
    }
}

impl AsyncRead for StdinReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.pos < self.chunk.len() {
                let n = buf.remaining().min(self.chunk.len() - self.pos);
                let start = self.pos;
                buf.put_slice(&self.chunk[start..start + n]);
                self.pos += n;
                return Poll::Ready(Ok(()));
            }
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if let Some(ended) = self.ended.as_mut() {
                // The end is passed on once the drain is over.
                return match ended.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.done = true;
                        Poll::Ready(Ok(()))
                    }
                    Poll::Pending => Poll::Pending,
                };
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.chunk = chunk;
                    self.pos = 0;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!("standard input failed: {e}");
                    self.eof.cancel();
                    self.ended = Some(Box::pin(self.shutdown.clone().cancelled_owned()));
                }
                Poll::Ready(None) => {
                    self.eof.cancel();
                    self.ended = Some(Box::pin(self.shutdown.clone().cancelled_owned()));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Why the settings could not give a supervisor.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("failed to open the events file {path}: {source}")]
    Events {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Models(#[from] crate::models::ClientError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Tools(#[from] crate::tools::ToolsError),
    #[error(transparent)]
    Supervisor(#[from] crate::Error),
    #[error("policy.allow (--allow): unknown capability {name:?}; known: {known}")]
    UnknownAllowed { name: String, known: String },
}

/// Build the supervisor the settings describe.
pub fn build_supervisor(settings: &Settings) -> Result<Supervisor, BuildError> {
    let mut b = Supervisor::builder()
        .scratch_bytes(settings.scratch_bytes)
        .session_scratch_bytes(settings.session_scratch.bytes)
        .session_scratch_inodes(settings.session_scratch.inodes)
        .cells_memory_bytes(settings.cells_memory_bytes)
        .session_cgroups(settings.session_cgroups)
        .languages(settings.languages.iter().copied());
    if let Some(mode) = settings.subordinate_ids {
        b = b.subordinate_ids(mode);
    }
    for (lang, profile) in &settings.profiles {
        b = b.profile(*lang, profile.clone());
    }
    if let Some(p) = &settings.python {
        b = b.python(p);
    }
    if let Some(path) = &settings.events {
        let sink =
            EventSink::to_file_bounded(path, settings.events_max_bytes).map_err(|source| {
                BuildError::Events {
                    path: path.clone(),
                    source,
                }
            })?;
        b = b.events(sink);
    }
    if !settings.models.is_empty() {
        b = b.models(crate::models::ModelClient::new(&settings.models)?)?;
    }
    #[cfg(target_os = "linux")]
    let slot = crate::tools::SupervisorSlot::default();
    #[cfg(target_os = "linux")]
    for cap in crate::tools::host_and_declared(&settings.files, &settings.tools, &slot)? {
        b = b.capability(cap)?;
    }
    let sup = b.build()?;
    #[cfg(target_os = "linux")]
    let _ = slot.set(sup.downgrade());
    // An upstream server's tools are not listed here: SERVER.TOOL and
    // SERVER.* of a declared one are accepted without starting it.
    if let Some(name) = settings
        .session
        .policy
        .allow
        .iter()
        .find(|name| !sup.knows(name))
    {
        let known: Vec<String> = sup
            .capabilities()
            .map(|c| c.name().to_owned())
            .chain(sup.tool_sources().map(|c| format!("{}.*", c.name())))
            .collect();
        return Err(BuildError::UnknownAllowed {
            name: name.clone(),
            known: known.join(", "),
        });
    }
    Ok(sup)
}

/// Pids of our direct children that still exist (zombies included).
fn children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // pid (comm) state ppid ...; comm may hold spaces.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(me)
        })
        .collect()
}

/// Wait until calls in flight are gone and every child process has exited
/// and been reaped. By then the server has dropped its supervisor, so the
/// supervisor's long-lived helpers (a fork server) exit too, taking any
/// cell of theirs with them; a dropped cell's own worker is killed at once
/// and reaped on a helper thread.
async fn drain(gate: &gate::Gate) {
    let t0 = Instant::now();
    let deadline = t0 + DRAIN;
    while gate.admitted() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::debug!("calls drained after {:?}", t0.elapsed());
    while !children().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::debug!("children gone after {:?}", t0.elapsed());
    let left = gate.admitted();
    if left > 0 {
        tracing::warn!("{left} calls were still in flight at exit");
    }
    let kids = children();
    if !kids.is_empty() {
        tracing::warn!("child processes {kids:?} were still running at exit");
    }
}

/// The malloc arenas a server uses: its tokio workers share them, so that
/// what one frees another reuses instead of a heap each that keeps its peak.
const MALLOC_ARENAS: u8 = 2;

/// How often the server looks whether it went idle, to give back the
/// memory it freed.
const TRIM_EVERY: Duration = Duration::from_secs(2);

/// Once no call is in flight and something happened since the last look
/// (a call, a session opened or closed), hand the heap's free memory back
/// to the system: without it the server keeps its peak after every
/// session closes. Sessions prepared for calls without one beyond those
/// still wanted go too.
fn spawn_trimmer(server: &CellboxServer, shutdown: CancellationToken) {
    let sessions = server.sessions().clone();
    let gate = server.gate().clone();
    let sup = server.supervisor().clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TRIM_EVERY);
        let mut trimmed_at = (0u64, 0usize);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    sup.trim_prepared();
                    let now = (gate.total_admitted(), sessions.len());
                    if gate.admitted() == 0 && now != trimmed_at {
                        trimmed_at = now;
                        crate::sandbox::memory::release_free_memory();
                    }
                }
            }
        }
    });
}

fn spawn_sweeper(server: &CellboxServer, shutdown: CancellationToken) {
    let sessions = server.sessions().clone();
    let every = (sessions.idle_expiry() / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => { sessions.sweep(); }
            }
        }
    });
}

async fn serve_stdio(
    server: CellboxServer,
    max_script_bytes: usize,
    eof: CancellationToken,
    shutdown: CancellationToken,
) -> u8 {
    // rmcp's writer half: non-blocking when stdout is a pipe.
    let (_, writer) = rmcp::transport::stdio_pipes();
    let swap = ids::IdSwap::new();
    let writer = ids::Restoring::new(writer, swap.clone());
    let limit = lines::max_message_bytes(max_script_bytes);
    let calls_read = server.ops().calls_read();
    let reader = match StdinReader::spawn(eof, shutdown.clone(), limit, swap, calls_read) {
        Ok(r) => r,
        Err(e) => {
            crate::report!("cellbox serve: failed to start the stdin reader: {e}");
            return EXIT_INTERNAL;
        }
    };
    // The handshake waits for the client's `initialize`: a signal (or the
    // client leaving) must end that wait too.
    let started = tokio::select! {
        r = server.serve((reader, writer)) => r,
        _ = shutdown.cancelled() => return 0,
    };
    let running = match started {
        Ok(r) => r,
        Err(e) => {
            // Also what happens when the client leaves before initializing.
            tracing::warn!("the MCP session did not start: {e}");
            return if shutdown.is_cancelled() {
                0
            } else {
                EXIT_INTERNAL
            };
        }
    };
    let stop = running.cancellation_token();
    let watcher = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            stop.cancel();
        }
    });
    let code = match running.waiting().await {
        Ok(reason) => {
            tracing::info!(?reason, "MCP session ended");
            0
        }
        Err(e) => {
            tracing::error!("the MCP session failed: {e}");
            EXIT_INTERNAL
        }
    };
    watcher.abort();
    code
}

async fn serve_http(server: CellboxServer, settings: &Settings, shutdown: CancellationToken) -> u8 {
    let Transport::Http {
        addr,
        exposure,
        tokens,
        limits,
    } = settings.transport.clone()
    else {
        return EXIT_INTERNAL;
    };
    let max_body = lines::max_message_bytes(settings.session.limits.max_script_bytes);
    let http = match listener::HttpServer::bind(
        server, addr, exposure, &tokens, limits, max_body, &shutdown,
    )
    .await
    {
        Ok(h) => h,
        Err(e) => {
            crate::report!("cellbox serve: failed to listen on {addr}: {e}");
            return EXIT_USAGE;
        }
    };
    match http.local_addr() {
        // Announce the real address (a port of 0 picks a free one).
        Ok(a) => crate::report!("cellbox serve: MCP over streamable HTTP at http://{a}/"),
        Err(e) => tracing::warn!("failed to read the bound address: {e}"),
    }
    http.serve(shutdown).await;
    0
}

/// `cellbox serve`: run until the client leaves (stdio) or a signal.
pub async fn run(args: ServeArgs) -> ExitCode {
    let settings = match config::resolve(&args) {
        Ok(s) => s,
        Err(e) => {
            crate::report!("cellbox serve: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Few malloc arenas: see `sandbox::memory` (before the supervisor's
    // threads allocate).
    crate::sandbox::memory::cap_arenas(MALLOC_ARENAS);
    let sup = match build_supervisor(&settings) {
        Ok(s) => s,
        Err(e) => {
            crate::report!("cellbox serve: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if settings.session_cgroups {
        if let Some(gap) = sup.missing_separation() {
            crate::report!("cellbox serve: {gap}");
        }
    }
    let shutdown = CancellationToken::new();
    let server = CellboxServer::new(sup, settings.clone(), shutdown.clone());
    // The warm workers (Rhai fork server, Python zygotes) start now, not on
    // the first cell, and the sandbox is probed for the tools' descriptions
    // at the same time (see `CellboxServer::list`). The client's
    // `initialize` is answered meanwhile: `tools/list` waits for both, a
    // cell only for the worker it needs.
    tokio::spawn({
        let server = server.clone();
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                _ = server.list() => {}
                _ = shutdown.cancelled() => {}
            }
        }
    });
    if let Some(addr) = settings.metrics {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                crate::report!("cellbox serve: failed to listen for metrics on {addr}: {e}");
                shutdown.cancel();
                return ExitCode::from(EXIT_USAGE);
            }
        };
        match listener.local_addr() {
            Ok(a) => crate::report!("cellbox serve: Prometheus metrics on http://{a}/metrics"),
            Err(e) => tracing::warn!("failed to read the metrics address: {e}"),
        }
        tokio::spawn(ops::serve_metrics(
            listener,
            server.clone(),
            shutdown.clone(),
        ));
    }
    spawn_sweeper(&server, shutdown.clone());
    spawn_trimmer(&server, shutdown.clone());
    // Over stdio, the end of input drains as a first signal does.
    let eof = CancellationToken::new();
    ops::watch_signals(
        &server,
        settings.drain_timeout,
        eof.clone(),
        shutdown.clone(),
    );
    let code = match settings.transport {
        Transport::Stdio => {
            let max_script = settings.session.limits.max_script_bytes;
            serve_stdio(server.clone(), max_script, eof, shutdown.clone()).await
        }
        Transport::Http { .. } => serve_http(server.clone(), &settings, shutdown.clone()).await,
    };
    tracing::debug!("transport closed; shutting down");
    shutdown.cancel();
    server.sessions().close_all();
    let gate = server.gate().clone();
    // Let go of the supervisor: calls in flight hold the last handles.
    drop(server);
    drain(&gate).await;
    ExitCode::from(code)
}
