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
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

type Response = http::Response<BoxBody<Bytes, Infallible>>;

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
    token: Option<Arc<str>>,
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
        if exposure == Exposure::Public {
            // Clients reach a public listener under names we cannot know;
            // the bearer token is the gate. A loopback listener keeps rmcp's
            // loopback-only Host check against DNS rebinding.
            config = config.disable_allowed_hosts();
        }
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        Ok(HttpServer {
            listener,
            service,
            token: token.map(Arc::from),
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
            token,
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
            let token = token.clone();
            let conn_shutdown = shutdown.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let service = service.clone();
                    let token = token.clone();
                    async move {
                        if let Some(t) = &token {
                            if !authorized(&req, t) {
                                tracing::info!(%peer, "rejected an HTTP request without a valid bearer token");
                                return Ok::<Response, Infallible>(unauthorized());
                            }
                        }
                        Ok(service.handle(req).await)
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
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
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
