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

/// Watch SIGTERM and SIGINT: the first starts the drain (see the module
/// documentation), the second fires `shutdown` at once.
pub fn watch_signals(server: &CellboxServer, drain_timeout: Duration, shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
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
        tracing::info!(
            signal = first,
            timeout_s = drain_timeout.as_secs(),
            "draining: no new sessions or calls; running cells may finish"
        );
        server.ops().start_drain();
        let drained = drain(&server, drain_timeout, shutdown.clone());
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
