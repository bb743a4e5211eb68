//! The HTTP client of an `http://` upstream MCP server: its POSTs (every
//! tool call) go over a kept-alive connection instead of a new one each.
//!
//! A kept-alive connection can stall: a server that writes one response in
//! several small segments without `TCP_NODELAY` waits (Nagle) for the ACK
//! of the first, which Linux delays up to ~40 ms on a connection that
//! looks interactive. So every read from the connection is followed by
//! `TCP_QUICKACK`, which sends a pending ACK at once; and `TCP_NODELAY` is
//! set for what this side writes.
//!
//! The pool (hyper-util's) drops connections the server closed, and sends
//! a request again on a new connection only when it was not written to
//! the old one; a request cut off after it was sent fails with the error.
//! The SSE stream a client opens with GET, and the DELETE of a session, go
//! through a reqwest client as rmcp's own transport does.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::Sse;
use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The most a POST's response may hold (a JSON body, or the events of
/// its SSE stream).
const MAX_RESPONSE: usize = 16 << 20;

/// How long an idle connection is kept.
const IDLE: Duration = Duration::from_secs(30);

/// A request or its response failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    #[error("{}", super::declared::error_chain(.0))]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error("reading the response: {0}")]
    Body(String),
    #[error("building the request: {0}")]
    Build(#[from] http::Error),
    #[error("{}", super::declared::error_chain(.0))]
    Reqwest(#[from] reqwest::Error),
}

type Error = StreamableHttpError<HttpClientError>;

/// POSTs over a pool of kept-alive connections; GET and DELETE through
/// `fallback`.
#[derive(Clone)]
pub struct PooledClient {
    http: Client<QuickAckConnector, Full<Bytes>>,
    fallback: reqwest::Client,
}

impl PooledClient {
    pub fn new(fallback: reqwest::Client) -> PooledClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(4)
            .build(QuickAckConnector(connector));
        PooledClient { http, fallback }
    }
}

/// Makes TCP connections whose every read is followed by `TCP_QUICKACK`.
#[derive(Clone)]
pub struct QuickAckConnector(HttpConnector);

impl tower_service::Service<http::Uri> for QuickAckConnector {
    type Response = QuickAck;
    type Error = <HttpConnector as tower_service::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<QuickAck, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move { connecting.await.map(QuickAck) })
    }
}

/// A TCP connection that acknowledges what it read at once.
pub struct QuickAck(TokioIo<tokio::net::TcpStream>);

impl hyper::rt::Read for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let read = Pin::new(&mut self.0).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            // Linux clears the flag by itself: it is set after each read.
            // A failure only costs the delayed ACK it would have saved.
            let _ = socket2::SockRef::from(self.0.inner()).set_tcp_quickack(true);
        }
        read
    }
}

impl hyper::rt::Write for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        self.0.inner().connected()
    }
}

/// The same error for the reqwest client's.
fn from_reqwest(e: StreamableHttpError<reqwest::Error>) -> Error {
    match e {
        StreamableHttpError::Client(e) => StreamableHttpError::Client(e.into()),
        StreamableHttpError::Sse(e) => StreamableHttpError::Sse(e),
        StreamableHttpError::Io(e) => StreamableHttpError::Io(e),
        StreamableHttpError::UnexpectedEndOfStream => StreamableHttpError::UnexpectedEndOfStream,
        StreamableHttpError::UnexpectedServerResponse(s) => {
            StreamableHttpError::UnexpectedServerResponse(s)
        }
        StreamableHttpError::UnexpectedContentType(s) => {
            StreamableHttpError::UnexpectedContentType(s)
        }
        StreamableHttpError::ServerDoesNotSupportSse => {
            StreamableHttpError::ServerDoesNotSupportSse
        }
        StreamableHttpError::ServerDoesNotSupportDeleteSession => {
            StreamableHttpError::ServerDoesNotSupportDeleteSession
        }
        StreamableHttpError::SessionExpired => StreamableHttpError::SessionExpired,
        StreamableHttpError::AuthRequired(e) => StreamableHttpError::AuthRequired(e),
        StreamableHttpError::InsufficientScope(e) => StreamableHttpError::InsufficientScope(e),
        StreamableHttpError::Deserialize(e) => StreamableHttpError::Deserialize(e),
        other => StreamableHttpError::UnexpectedServerResponse(Cow::Owned(other.to_string())),
    }
}

fn is_notice(message: &ClientJsonRpcMessage) -> bool {
    matches!(
        message,
        ClientJsonRpcMessage::Notification(_)
            | ClientJsonRpcMessage::Response(_)
            | ClientJsonRpcMessage::Error(_)
    )
}

impl StreamableHttpClient for PooledClient {
    type Error = HttpClientError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let body = serde_json::to_vec(&message)?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri.as_ref())
            .header(http::header::CONTENT_TYPE, JSON_MIME_TYPE)
            .header(
                http::header::ACCEPT,
                format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"),
            );
        if let Some(auth) = auth_header {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {auth}"));
        }
        for (name, value) in custom_headers {
            let reserved = [
                http::header::ACCEPT.as_str(),
                http::header::CONTENT_TYPE.as_str(),
                http::header::AUTHORIZATION.as_str(),
                HEADER_SESSION_ID,
            ];
            if reserved
                .iter()
                .any(|r| name.as_str().eq_ignore_ascii_case(r))
            {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            request = request.header(name, value);
        }
        let session_was_attached = session_id.is_some();
        if let Some(sid) = session_id {
            request = request.header(HEADER_SESSION_ID, sid.as_ref());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        let response = self
            .http
            .request(request)
            .await
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_was_attached {
            return Err(StreamableHttpError::SessionExpired);
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header(http::header::CONTENT_TYPE.as_str());
        let session_id = header(HEADER_SESSION_ID);
        let empty = header(http::header::CONTENT_LENGTH.as_str()).as_deref() == Some("0");
        let body = Limited::new(response.into_body(), MAX_RESPONSE);
        if !status.is_success() {
            let text = match body.collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(_) => "<failed to read response body>".to_owned(),
            };
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {text}"),
            )));
        }
        if empty && is_notice(&message) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        match content_type.as_deref() {
            Some(ct) if ct.starts_with(EVENT_STREAM_MIME_TYPE) => {
                let body = body.map_err(std::io::Error::other);
                let events: Pin<
                    Box<dyn futures_core::Stream<Item = Result<Sse, SseError>> + Send>,
                > = Box::pin(sse_stream::SseStream::new(body));
                Ok(StreamableHttpPostResponse::Sse(events, session_id))
            }
            Some(ct) if ct.starts_with(JSON_MIME_TYPE) => {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| StreamableHttpError::Client(HttpClientError::Body(e.to_string())))?
                    .to_bytes();
                match serde_json::from_slice::<ServerJsonRpcMessage>(&bytes) {
                    Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, session_id)),
                    Err(_) if is_notice(&message) => Ok(StreamableHttpPostResponse::Accepted),
                    Err(e) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                        format!("the response is not JSON-RPC: {e}"),
                    ))),
                }
            }
            _ => Err(StreamableHttpError::UnexpectedContentType(content_type)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        self.fallback
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
            .map_err(from_reqwest)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Pin<Box<dyn futures_core::Stream<Item = Result<Sse, SseError>> + Send>>, Error>
    {
        self.fallback
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
            .map_err(from_reqwest)
    }
}
