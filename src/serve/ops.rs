//! Running `serve` as a service: health and readiness, and the drain on
//! SIGTERM or SIGINT (see docs/service.md).
//!
//! - `GET /healthz` answers 200 while the process serves HTTP.
//! - `GET /readyz` answers 200 once the warm pools are up, the probe cells
//!   of every language got the sandbox their profile requires, the scratch
//!   root takes files and the server is not draining; 503 with a short JSON
//!   reason otherwise. Neither needs a token and neither names a pid, a path
//!   or a tenant.
//!
//! The drain: the first signal turns `/readyz` to 503 and refuses new
//! sessions and calls ("server is draining"; a new MCP connection gets HTTP
//! 503 with `Retry-After`) while the cells already admitted run on. Once
//! none is left, or the drain timeout passes (the cells still running are
//! then killed: status `killed`, error type `Draining`), the server shuts
//! down as it does at the end of input: sessions closed, workers reaped,
//! scratch and cgroups removed. A second signal shuts down at once.
//!
//! `--metrics ADDR` serves `GET /metrics` (see [`crate::metrics`]) with
//! `/healthz` and `/readyz` on a listener of its own, over stdio too.

use super::handler::CellboxServer;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use std::convert::Infallible;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// What a refused client is told to wait before trying again (seconds):
/// by then a replacement should be ready.
pub const RETRY_AFTER_SECS: u64 = 5;

/// The message of every call refused while draining.
pub const DRAINING: &str = "server is draining";

/// How long a drain waits, after killing what ran past the timeout, for
/// those calls to answer their clients before the server closes.
const ANSWER_GRACE: Duration = Duration::from_secs(3);

/// The server's operating state: draining, and past the drain timeout.
#[derive(Debug, Default)]
pub struct Ops {
    draining: CancellationToken,
    expired: CancellationToken,
    /// `tools/call` requests read from standard input (stdio), and calls
    /// that reached the handler: at the end of input, the calls read
    /// before it are waited for before the drain refuses anything.
    calls_read: std::sync::Arc<std::sync::atomic::AtomicU64>,
    calls_begun: std::sync::atomic::AtomicU64,
}

impl Ops {
    /// The server stopped taking new sessions and calls.
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Fires when the drain's time is up: cells still running are killed.
    pub fn expired(&self) -> &CancellationToken {
        &self.expired
    }

    fn start_drain(&self) {
        self.draining.cancel();
    }

    /// The count of `tools/call` requests read, for the stdin reader.
    pub fn calls_read(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.calls_read.clone()
    }

    /// A call reached the handler.
    pub fn call_begun(&self) {
        self.calls_begun
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Every call read has reached the handler.
    fn caught_up(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.calls_begun.load(Ordering::Acquire) >= self.calls_read.load(Ordering::Acquire)
    }
}

/// Whether `line` is a `tools/call` request.
pub fn is_tool_call(line: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Message>(line)
        .ok()
        .and_then(|m| m.method)
        .is_some_and(|m| m == "tools/call")
}

/// Why the server is not ready, if it is not.
pub fn not_ready(server: &CellboxServer) -> Option<&'static str> {
    if server.ops().is_draining() {
        return Some("draining");
    }
    let Some(observed) = server.warmed() else {
        return Some("starting");
    };
    if observed.values().any(|o| o.failure.is_some()) {
        return Some("sandbox");
    }
    if !server.supervisor().scratch_writable() {
        return Some("scratch");
    }
    None
}

fn json(status: http::StatusCode, body: String) -> Response {
    let mut r = http::Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    r
}

/// The answer to `GET /healthz` or `GET /readyz`, or `None` for any other
/// request.
pub fn probe_response<B>(req: &http::Request<B>, server: &CellboxServer) -> Option<Response> {
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return None;
    }
    match req.uri().path() {
        "/healthz" => Some(json(http::StatusCode::OK, "{\"status\":\"ok\"}\n".into())),
        "/readyz" => Some(match not_ready(server) {
            None => json(http::StatusCode::OK, "{\"status\":\"ready\"}\n".into()),
            Some(reason) => {
                let mut r = json(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "status": "not_ready", "reason": reason }).to_string()
                        + "\n",
                );
                if reason == "draining" {
                    retry_after(&mut r);
                }
                r
            }
        }),
        _ => None,
    }
}

/// The answer to `GET /metrics`: the gauges read now, then every metric
/// in the Prometheus text format (see [`crate::metrics`]).
pub async fn metrics_response(server: &CellboxServer) -> Response {
    let m = crate::metrics::get();
    let sup = server.supervisor();
    m.set_load(sup.cells_running(), server.gate().waiting());
    m.set_sessions_open(server.sessions().open_by_principal());
    let pools = sup.pool_status().await;
    m.set_pools(crate::metrics::PoolSizes {
        rhai_fork_servers: usize::from(pools.rhai_fork_server),
        rhai_spares: pools.rhai_spares,
        python_zygotes: pools.python.iter().filter(|z| z.alive).count(),
        prepared_sessions: pools.prepared_runs,
    });
    m.set_process(sup.cells_memory_in_use());
    let mut r = http::Response::new(Full::new(Bytes::from(m.encode())).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    r
}

/// Connections the metrics listener serves at once; more are closed when
/// they are accepted.
const METRICS_CONNECTIONS: usize = 16;

/// A request head must arrive on the metrics listener within this.
const METRICS_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `GET /metrics`, `/healthz` and `/readyz` on `listener` until
/// `shutdown` (no token: nothing there is secret; anything else is 404).
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    server: CellboxServer,
    shutdown: CancellationToken,
) {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("failed to accept a metrics connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let server = server.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let server = server.clone();
                    async move {
                        if let Some(r) = probe_response(&req, &server) {
                            return Ok::<Response, Infallible>(r);
                        }
                        if req.method() == http::Method::GET && req.uri().path() == "/metrics" {
                            return Ok(metrics_response(&server).await);
                        }
                        let mut r = http::Response::new(
                            Full::new(Bytes::from_static(b"not found\n")).boxed(),
                        );
                        *r.status_mut() = http::StatusCode::NOT_FOUND;
                        Ok(r)
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(METRICS_HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("metrics connection ended: {e}");
                    }
                }
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
                }
            }
        });
    }
}

fn retry_after(r: &mut Response) {
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, RETRY_AFTER_SECS.into());
}

/// HTTP 503 with `Retry-After` for a request that would start something
/// new while draining: the body is a JSON-RPC error for `id` (null when the
/// request had none).
pub fn draining_response(id: serde_json::Value) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": DRAINING_CODE, "message": DRAINING },
    });
    let mut r = json(http::StatusCode::SERVICE_UNAVAILABLE, body.to_string());
    retry_after(&mut r);
    r
}

/// The JSON-RPC error code of a call refused while draining (in the range
/// JSON-RPC leaves to servers).
pub const DRAINING_CODE: i32 = -32003;

/// The id of `body` if it is an `initialize` request: a new MCP
/// connection, refused while draining.
pub fn initialize_id(body: &[u8]) -> Option<serde_json::Value> {
    #[derive(serde::Deserialize)]
    struct Message {
        method: String,
        #[serde(default)]
        id: serde_json::Value,
    }
    let m: Message = serde_json::from_slice(body).ok()?;
    (m.method == "initialize").then_some(m.id)
}

/// Watch SIGTERM and SIGINT, and `eof` (the end of a stdio server's
/// input): the first starts the drain (see the module documentation), a
/// second signal fires `shutdown` at once.
pub fn watch_signals(
    server: &CellboxServer,
    drain_timeout: Duration,
    eof: CancellationToken,
    shutdown: CancellationToken,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    tokio::spawn({
        let tx = tx.clone();
        async move {
            eof.cancelled().await;
            let _ = tx.send("end of input");
        }
    });
    for (kind, name) in [
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::interrupt(), "SIGINT"),
    ] {
        match signal(kind) {
            Ok(mut s) => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while s.recv().await.is_some() {
                        if tx.send(name).is_err() {
                            return;
                        }
                    }
                });
            }
            Err(e) => tracing::warn!("failed to watch a signal: {e}"),
        }
    }
    let server = server.clone();
    tokio::spawn(async move {
        let Some(first) = rx.recv().await else { return };
        // With nothing running (a stdio client that simply left) the drain
        // is over at once and says nothing at INFO.
        if server.gate().admitted() == 0 {
            tracing::debug!(signal = first, "stopping: nothing is running");
        } else {
            tracing::info!(
                signal = first,
                timeout_s = drain_timeout.as_secs(),
                "draining: no new sessions or calls; running cells may finish"
            );
        }
        let drained = async {
            if first == "end of input" {
                // The calls read before the end are let in first: no new
                // one can come after it.
                let t0 = Instant::now();
                while !server.ops().caught_up() && t0.elapsed() < drain_timeout {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            server.ops().start_drain();
            drain(&server, drain_timeout, shutdown.clone()).await
        };
        tokio::select! {
            () = drained => {}
            second = rx.recv() => {
                if let Some(name) = second {
                    tracing::info!(signal = name, "second signal: shutting down at once");
                }
            }
        }
        shutdown.cancel();
    });
}

/// Wait for the calls in flight to end, or the timeout; then kill what is
/// left and give those calls a moment to answer.
async fn drain(server: &CellboxServer, timeout: Duration, shutdown: CancellationToken) {
    let gate = server.gate().clone();
    let t0 = Instant::now();
    let idle = async {
        while gate.admitted() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = idle => {
            tracing::info!(after_ms = t0.elapsed().as_millis() as u64, "drained");
            return;
        }
        () = tokio::time::sleep(timeout) => {}
        () = shutdown.cancelled() => return,
    }
    let left = gate.admitted();
    tracing::warn!(
        calls = left,
        "drain timeout: killing the cells still running"
    );
    server.ops().expired().cancel();
    let deadline = Instant::now() + ANSWER_GRACE;
    while gate.admitted() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_initialize_requests_are_new_connections() {
        assert_eq!(
            initialize_id(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#),
            Some(serde_json::json!(1))
        );
        assert_eq!(
            initialize_id(br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{}}"#),
            None
        );
        assert_eq!(initialize_id(b"not json"), None);
    }

    #[test]
    fn a_draining_refusal_says_when_to_retry() {
        let r = draining_response(serde_json::json!(7));
        assert_eq!(r.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.headers()[http::header::RETRY_AFTER],
            RETRY_AFTER_SECS.to_string().as_str()
        );
    }
}
