//! Streamable HTTP front end: rmcp's `StreamableHttpService` behind a small
//! hyper server that checks the bearer token first.
//!
//! The service runs stateless (no MCP HTTP sessions: cellbox sessions are
//! named by `session_id` in the tool arguments), so each call's response
//! stream belongs to that call alone and a client that drops it cancels the
//! call, which kills its cell.
//!
//! Each bearer token names a [`Principal`]; the listener puts the caller's
//! principal on the request (rmcp hands the request's `http::request::Parts`
//! to the handler), or [`Principal::local`] when no token is configured.
//!
//! What one client can hold is bounded: `max_connections` open connections
//! in all (more are closed as soon as they are accepted), at most
//! `max_connections_per_peer` of them from one address before they have
//! sent a request the server accepted (a valid token, or any complete
//! request head when no token is configured), a request head must arrive
//! within [`HEADER_READ_TIMEOUT`], and a POST body within the body timeout.
//! A POST body that is a JSON-RPC request with an id that rmcp cannot read
//! is answered here with an error for that id (see [`super::jsonrpc`]).

use super::config::{Exposure, HttpLimits};
use super::handler::CellboxServer;
use super::principal::{NamedToken, Principal, Tokens};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// A connection that has not sent a whole request head within this (from
/// its start, or since its last response) is closed: idle or trickling
/// connections cannot pile up until the server runs out of descriptors.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The loopback names a Host header (and a browser origin) may use besides
/// the address the listener is bound to.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Host names a loopback listener bound to `ip` answers to.
fn loopback_hosts(ip: IpAddr) -> Vec<String> {
    let mut hosts: Vec<String> = LOOPBACK_NAMES.iter().map(|h| (*h).to_owned()).collect();
    let bound = ip.to_string();
    if !hosts.contains(&bound) {
        hosts.push(bound);
    }
    hosts
}

/// Browser origins a loopback listener bound to `ip` accepts: pages served
/// by this machine, on any port and either scheme.
fn loopback_origins(ip: IpAddr) -> Vec<String> {
    let in_url = |host: &str| match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]"),
        _ => host.to_owned(),
    };
    let hosts = loopback_hosts(ip);
    ["http", "https"]
        .iter()
        .flat_map(|scheme| {
            hosts
                .iter()
                .map(move |h| format!("{scheme}://{}:*", in_url(h)))
        })
        .collect()
}

/// The principal whose token the request carries as
/// `Authorization: Bearer <token>`, if any.
fn authorized(req: &http::Request<Incoming>, tokens: &Tokens) -> Option<Principal> {
    let value = req.headers().get(http::header::AUTHORIZATION)?;
    let value = value.to_str().ok()?;
    let (scheme, given) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    tokens.principal(given.trim())
}

fn plain(status: http::StatusCode, text: &'static str) -> Response {
    let mut r = http::Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    r
}

/// A JSON-RPC error for a request rmcp could not read.
fn json_reply(value: &serde_json::Value) -> Response {
    let mut r = http::Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Open connections, and those of each peer address not yet accepted.
#[derive(Default)]
struct Counts {
    total: usize,
    unproven: HashMap<IpAddr, usize>,
}

struct Conns {
    counts: Mutex<Counts>,
    limits: HttpLimits,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        crate::util::lock(&self.counts)
    }

    /// Count a new connection from `peer`, or `None` when it is one too many.
    fn open(self: &Arc<Self>, peer: IpAddr) -> Option<Conn> {
        let mut c = self.lock();
        let mine = c.unproven.get(&peer).copied().unwrap_or(0);
        if c.total >= self.limits.max_connections || mine >= self.limits.max_connections_per_peer {
            return None;
        }
        c.total += 1;
        *c.unproven.entry(peer).or_insert(0) += 1;
        Some(Conn {
            conns: self.clone(),
            peer,
            proven: AtomicBool::new(false),
        })
    }

    fn unprove(&self, c: &mut Counts, peer: IpAddr) {
        if let Some(n) = c.unproven.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.unproven.remove(&peer);
            }
        }
    }
}

/// One counted connection; uncounted when dropped.
struct Conn {
    conns: Arc<Conns>,
    peer: IpAddr,
    proven: AtomicBool,
}

impl Conn {
    /// The connection sent a request the server accepted: it no longer
    /// counts against its peer's unauthenticated share.
    fn prove(&self) {
        if !self.proven.swap(true, Ordering::AcqRel) {
            let mut c = self.conns.lock();
            self.conns.unprove(&mut c, self.peer);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut c = self.conns.lock();
        c.total = c.total.saturating_sub(1);
        if !self.proven.load(Ordering::Acquire) {
            self.conns.unprove(&mut c, self.peer);
        }
    }
}

/// Read a POST body within the time and size limits; a body rmcp cannot
/// read that is a request with an id is answered here.
async fn read_body(
    body: Incoming,
    max_body: usize,
    limits: &HttpLimits,
) -> Result<Bytes, Response> {
    let read = Limited::new(body, max_body).collect();
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => Err(plain(
            http::StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time\n",
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(plain(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is over the limit for one message\n",
        )),
        Ok(Err(_)) => Err(plain(
            http::StatusCode::BAD_REQUEST,
            "failed to read the request body\n",
        )),
        Ok(Ok(collected)) => {
            let bytes = collected.to_bytes();
            match super::jsonrpc::check(&bytes) {
                Some(u) => Err(json_reply(&u.error_reply())),
                None => Ok(bytes),
            }
        }
    }
}

/// The request id a `notifications/cancelled` message names, if `body` is
/// one (a single JSON-RPC message; MCP has no batches since 2025-06-18).
fn cancelled_request_id(body: &[u8]) -> Option<serde_json::Value> {
    #[derive(serde::Deserialize)]
    struct Message {
        method: String,
        #[serde(default)]
        params: Option<serde_json::Value>,
    }
    let m: Message = serde_json::from_slice(body).ok()?;
    if m.method != "notifications/cancelled" {
        return None;
    }
    m.params?.get("requestId").cloned()
}

fn unauthorized() -> Response {
    let body = Full::new(Bytes::from_static(
        b"{\"error\":\"missing or wrong bearer token: send Authorization: Bearer <token>\"}\n",
    ))
    .boxed();
    let mut r = http::Response::new(body);
    *r.status_mut() = http::StatusCode::UNAUTHORIZED;
    r.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"cellbox\""),
    );
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A bound listener, ready to serve.
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    service: StreamableHttpService<CellboxServer, LocalSessionManager>,
    server: CellboxServer,
    /// Empty: no token needed, every request is [`Principal::local`].
    tokens: Tokens,
    limits: HttpLimits,
    max_body: usize,
}

impl HttpServer {
    /// Bind `addr`. Exposure was checked when the settings were validated.
    pub async fn bind(
        server: CellboxServer,
        addr: SocketAddr,
        exposure: Exposure,
        tokens: &[NamedToken],
        limits: HttpLimits,
        max_body: usize,
        shutdown: &CancellationToken,
    ) -> std::io::Result<HttpServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let mut config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_max_request_body_bytes(max_body)
            .with_cancellation_token(shutdown.child_token());
        match exposure {
            // Clients reach a public listener under names we cannot know;
            // the bearer token is the gate (a foreign web page cannot send it).
            Exposure::Public => config = config.disable_allowed_hosts(),
            // A loopback listener answers only to loopback Host names (with
            // the address it is bound to) against DNS rebinding, and refuses a browser request from any
            // page not served by this machine (a site the user visits cannot
            // drive cells through the user's browser). Clients that are not
            // browsers send no Origin and are not affected.
            Exposure::Loopback => {
                config = config
                    .with_allowed_hosts(loopback_hosts(addr.ip()))
                    .with_allowed_origins(loopback_origins(addr.ip()));
            }
        }
        let factory = server.clone();
        let service = StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        Ok(HttpServer {
            listener,
            service,
            server,
            tokens: Tokens::new(tokens),
            limits,
            max_body,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept connections until `shutdown` fires.
    pub async fn serve(self, shutdown: CancellationToken) {
        let HttpServer {
            listener,
            service,
            server,
            tokens,
            limits,
            max_body,
        } = self;
        let conns = Arc::new(Conns {
            counts: Mutex::new(Counts::default()),
            limits,
        });
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("failed to accept an HTTP connection: {e}");
                        // Out of fds and the like: do not spin.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Some(conn) = conns.open(peer.ip()) else {
                // Closed at once: it would hold a descriptor for nothing.
                tracing::debug!(%peer, "refused an HTTP connection over the connection limits");
                drop(stream);
                continue;
            };
            let conn = Arc::new(conn);
            let service = service.clone();
            let server = server.clone();
            let tokens = tokens.clone();
            let conn_shutdown = shutdown.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
                    let service = service.clone();
                    let server = server.clone();
                    let tokens = tokens.clone();
                    let conn = conn.clone();
                    async move {
                        // Health and readiness need no token (see `ops`).
                        if let Some(r) = super::ops::probe_response(&req, &server) {
                            return Ok::<Response, Infallible>(r);
                        }
                        let principal = if tokens.is_empty() {
                            Principal::local()
                        } else {
                            match authorized(&req, &tokens) {
                                Some(p) => p,
                                None => {
                                    tracing::info!(%peer, "rejected an HTTP request without a valid bearer token");
                                    return Ok(unauthorized());
                                }
                            }
                        };
                        conn.prove();
                        req.extensions_mut().insert(principal.clone());
                        if req.method() != http::Method::POST {
                            return Ok(service.handle(req).await);
                        }
                        let (parts, body) = req.into_parts();
                        let bytes = match read_body(body, max_body, &limits).await {
                            Ok(bytes) => bytes,
                            Err(response) => return Ok(response),
                        };
                        // The service runs each POST as a connection of its
                        // own and ignores notifications, so a
                        // `notifications/cancelled` (which clients send as
                        // a POST of its own) is honoured here, for the
                        // calls the same principal has running.
                        if server.ops().is_draining() {
                            if let Some(id) = super::ops::initialize_id(&bytes) {
                                return Ok(super::ops::draining_response(id));
                            }
                        }
                        if let Some(id) = cancelled_request_id(&bytes) {
                            let n = server.cancel_request(&principal, &id);
                            tracing::info!(%peer, %id, "cancellation for {n} running call(s)");
                        }
                        Ok(service
                            .handle(http::Request::from_parts(parts, Full::new(bytes)))
                            .await)
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, "HTTP connection ended: {e}");
                        }
                    }
                    _ = conn_shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn).await;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_include_the_bound_address() {
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(
            loopback_hosts(v4),
            ["localhost", "127.0.0.1", "::1", "127.0.0.2"]
        );
        let origins = loopback_origins(v4);
        assert!(origins.contains(&"http://127.0.0.2:*".to_owned()));
        assert!(origins.contains(&"https://[::1]:*".to_owned()));
        assert_eq!(origins.len(), 8);
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(loopback_hosts(v6), ["localhost", "127.0.0.1", "::1"]);
        assert!(loopback_origins(v6).contains(&"http://[::1]:*".to_owned()));
    }

    #[test]
    fn cancellations_are_recognised() {
        let id = |b: &str| cancelled_request_id(b.as_bytes());
        assert_eq!(
            id(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#
            ),
            Some(serde_json::json!(7))
        );
        assert_eq!(
            id(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#
            ),
            Some(serde_json::json!("a"))
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"requestId":7}}"#),
            None
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#),
            None
        );
        assert_eq!(id("not json"), None);
    }

    #[test]
    fn connections_are_counted_per_peer_until_proven() {
        let conns = Arc::new(Conns {
            counts: Mutex::new(Counts::default()),
            limits: HttpLimits {
                max_connections: 3,
                max_connections_per_peer: 2,
                body_timeout: std::time::Duration::from_secs(1),
            },
        });
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = conns.open(a).unwrap();
        let a2 = conns.open(a).unwrap();
        assert!(conns.open(a).is_none(), "a third unproven connection of a");
        // Once one is proven, a may open another; the total still holds.
        a1.prove();
        a1.prove();
        let a3 = conns.open(a).unwrap();
        assert!(conns.open(b).is_none(), "over the total");
        drop(a2);
        let b1 = conns.open(b).unwrap();
        drop((a1, a3, b1));
        let c = conns.lock();
        assert_eq!(c.total, 0);
        assert!(c.unproven.is_empty());
    }
}
