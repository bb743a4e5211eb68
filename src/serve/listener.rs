//! Streamable HTTP front end: rmcp's `StreamableHttpService` behind a small
//! hyper server that checks the bearer token first.
//!
//! The service runs stateless (no MCP HTTP sessions: cellbox sessions are
//! named by `session_id` in the tool arguments), so each call's response
//! stream belongs to that call alone and a client that drops it cancels the
//! call, which kills its cell.

use super::config::Exposure;
use super::handler::CellboxServer;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
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

/// Compare in time independent of where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Does the request carry `Authorization: Bearer <token>`?
fn authorized(req: &http::Request<Incoming>, token: &str) -> bool {
    let Some(value) = req.headers().get(http::header::AUTHORIZATION) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && constant_time_eq(given.trim().as_bytes(), token.as_bytes())
}

/// Who sent an HTTP request, put in its extensions for the handler (see
/// `handler::client_of`): with a bearer token required, the token it
/// presented (checked before this is made); without one, one name shared
/// by every client (a header a client makes up names nobody).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientName(pub Arc<str>);

impl ClientName {
    fn of(headers: &http::HeaderMap, token_required: bool) -> ClientName {
        let presented = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        match presented {
            Some(t) if token_required => ClientName(format!("token:{t}").into()),
            _ => ClientName("anonymous".into()),
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

fn too_large(limit: usize) -> Response {
    let body = Full::new(Bytes::from(format!(
        "{{\"error\":\"the request body is over the limit of {limit} bytes\"}}\n"
    )))
    .boxed();
    let mut r = http::Response::new(body);
    *r.status_mut() = http::StatusCode::PAYLOAD_TOO_LARGE;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
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
    token: Option<Arc<str>>,
    max_body: usize,
}

impl HttpServer {
    /// Bind `addr`. Exposure was checked when the settings were validated.
    pub async fn bind(
        server: CellboxServer,
        addr: SocketAddr,
        exposure: Exposure,
        token: Option<String>,
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
            token: token.map(Arc::from),
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
            token,
            max_body,
        } = self;
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
            let service = service.clone();
            let server = server.clone();
            let token = token.clone();
            let conn_shutdown = shutdown.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let service = service.clone();
                    let server = server.clone();
                    let token = token.clone();
                    async move {
                        if let Some(t) = &token {
                            if !authorized(&req, t) {
                                tracing::info!(%peer, "rejected an HTTP request without a valid bearer token");
                                return Ok::<Response, Infallible>(unauthorized());
                            }
                        }
                        let name = ClientName::of(req.headers(), token.is_some());
                        let mut req = req;
                        req.extensions_mut().insert(name.clone());
                        if req.method() != http::Method::POST {
                            return Ok(service.handle(req).await);
                        }
                        // The service runs each POST as a connection of its
                        // own and ignores notifications, so a
                        // `notifications/cancelled` (which clients send as
                        // a POST of its own) is honoured here, for the
                        // calls the same client has running.
                        let (parts, body) = req.into_parts();
                        let bytes =
                            match http_body_util::Limited::new(body, max_body).collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(e) => {
                                    tracing::debug!(%peer, "request body not read: {e}");
                                    return Ok(too_large(max_body));
                                }
                            };
                        if let Some(id) = cancelled_request_id(&bytes) {
                            let n = server.cancel_request(&name.0, &id);
                            tracing::info!(%peer, %id, "cancellation for {n} running call(s)");
                        }
                        let req = http::Request::from_parts(parts, Full::new(bytes));
                        Ok(service.handle(req).await)
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
        let mut h = http::HeaderMap::new();
        let name = |h: &http::HeaderMap, required| ClientName::of(h, required).0.to_string();
        assert_eq!(name(&h, true), "anonymous");
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(name(&h, true), "token:abc");
        // Without a required token, made-up tokens name nobody.
        assert_eq!(name(&h, false), "anonymous");
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
