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
//! A POST's response is often an SSE stream the server ends right after
//! the response to the POST's request. The connection goes back to the
//! pool only once that end is read, so the response is handed on only
//! after it (see [`EndsFirst`]): otherwise the caller, woken by the
//! response, can send its next request while the connection is still
//! busy, and that request opens another.
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
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The most a POST's response may hold (a JSON body, or the events of
/// its SSE stream).
const MAX_RESPONSE: usize = 16 << 20;

/// How long an idle connection is kept.
const IDLE: Duration = Duration::from_secs(30);

/// How long the end of a POST's SSE stream is waited for once the stream
/// carried the response to the POST's request.
const DRAIN: Duration = Duration::from_millis(50);

/// After this many waits for a stream's end that ran out, the server is
/// taken to keep its streams open and responses are handed on at once.
const DRAIN_MISSES: u32 = 3;

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
    /// How many waits for the end of a stream ran out (see [`EndsFirst`]).
    drain_misses: Arc<AtomicU32>,
}

impl PooledClient {
    pub fn new(fallback: reqwest::Client) -> PooledClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(4)
            .build(QuickAckConnector(connector));
        PooledClient {
            http,
            fallback,
            drain_misses: Arc::new(AtomicU32::new(0)),
        }
    }
}

type Events = Pin<Box<dyn futures_core::Stream<Item = Result<Sse, SseError>> + Send>>;

/// A POST's SSE stream that holds the response to the POST's request
/// until the stream has ended (or [`DRAIN`] has passed), so that the
/// connection is back in the pool before whoever waits for the response
/// can send another request. Events after the response are handed on
/// after it, in order; nothing is dropped.
struct EndsFirst {
    /// `None` once the stream has ended.
    inner: Option<Events>,
    /// The id of the POST's request, as JSON.
    id: serde_json::Value,
    /// Events read while waiting for the end.
    held: VecDeque<Result<Sse, SseError>>,
    /// Set while waiting for the end.
    draining: Option<Pin<Box<tokio::time::Sleep>>>,
    misses: Arc<AtomicU32>,
}

impl EndsFirst {
    /// Whether `event` carries the response (or error) to the request.
    fn answers(&self, event: &Sse) -> bool {
        use serde::de::IgnoredAny;
        #[derive(serde::Deserialize)]
        struct Reply {
            id: Option<serde_json::Value>,
            method: Option<IgnoredAny>,
            result: Option<IgnoredAny>,
            error: Option<IgnoredAny>,
        }
        let Some(data) = &event.data else {
            return false;
        };
        match serde_json::from_str::<Reply>(data) {
            Ok(r) => {
                r.method.is_none()
                    && (r.result.is_some() || r.error.is_some())
                    && r.id.as_ref() == Some(&self.id)
            }
            Err(_) => false,
        }
    }
}

/// A message nested deeper than rmcp reads (see
/// [`super::stdio_tap::MAX_DEPTH`]), which it would skip without a word:
/// instead, an error response for its request id, so the call it answers
/// fails at once and says why.
fn too_deep_answer(data: &str) -> Option<String> {
    let costly = super::stdio_tap::too_costly(data.as_bytes())?;
    // The id only (the rest is skipped without recursion).
    #[derive(serde::Deserialize)]
    struct Id {
        #[serde(default)]
        id: Option<serde_json::Value>,
    }
    let id = serde_json::from_str::<Id>(data).ok()?.id?;
    Some(
        serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {
        "code": -32603,
        "message": format!("the upstream MCP server sent {}, the most read", costly.why())}})
        .to_string(),
    )
}

/// The events of a stream with each message nested too deep replaced by
/// [`too_deep_answer`].
struct Shallow(Events);

impl futures_core::Stream for Shallow {
    type Item = Result<Sse, SseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.0.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(mut sse))) => {
                if let Some(answer) = sse.data.as_deref().and_then(too_deep_answer) {
                    sse.data = Some(answer);
                }
                Poll::Ready(Some(Ok(sse)))
            }
            other => other,
        }
    }
}

impl futures_core::Stream for EndsFirst {
    type Item = Result<Sse, SseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.draining.is_none() {
                if let Some(event) = this.held.pop_front() {
                    return Poll::Ready(Some(event));
                }
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match inner.as_mut().poll_next(cx) {
                Poll::Ready(None) => {
                    this.inner = None;
                    this.draining = None;
                }
                Poll::Ready(Some(event)) if this.draining.is_some() => this.held.push_back(event),
                Poll::Ready(Some(event)) => {
                    let answers = matches!(&event, Ok(e) if this.answers(e));
                    if !answers || this.misses.load(Ordering::Relaxed) >= DRAIN_MISSES {
                        return Poll::Ready(Some(event));
                    }
                    this.held.push_back(event);
                    this.draining = Some(Box::pin(tokio::time::sleep(DRAIN)));
                }
                Poll::Pending => {
                    let Some(deadline) = this.draining.as_mut() else {
                        return Poll::Pending;
                    };
                    if deadline.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.misses.fetch_add(1, Ordering::Relaxed);
                    this.draining = None;
                }
            }
        }
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
                let mut events: Events =
                    Box::pin(Shallow(Box::pin(sse_stream::SseStream::new(body))));
                if let ClientJsonRpcMessage::Request(request) = &message {
                    if let Ok(id) = serde_json::to_value(&request.id) {
                        events = Box::pin(EndsFirst {
                            inner: Some(events),
                            id,
                            held: VecDeque::new(),
                            draining: None,
                            misses: self.drain_misses.clone(),
                        });
                    }
                }
                Ok(StreamableHttpPostResponse::Sse(events, session_id))
            }
            Some(ct) if ct.starts_with(JSON_MIME_TYPE) => {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| StreamableHttpError::Client(HttpClientError::Body(e.to_string())))?
                    .to_bytes();
                let answer = std::str::from_utf8(&bytes).ok().and_then(too_deep_answer);
                let bytes = answer.map_or(bytes, bytes::Bytes::from);
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_core::Stream;

    /// Events sent into a channel, as a stream.
    struct Channel(tokio::sync::mpsc::UnboundedReceiver<Result<Sse, SseError>>);

    impl Stream for Channel {
        type Item = Result<Sse, SseError>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }

    fn event(data: &str) -> Result<Sse, SseError> {
        Ok(Sse {
            event: Some("message".into()),
            data: Some(data.into()),
            id: None,
            retry: None,
        })
    }

    const NOTICE: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#;
    const REPLY: &str = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;

    type Sender = tokio::sync::mpsc::UnboundedSender<Result<Sse, SseError>>;

    fn ends_first(misses: u32) -> (Sender, EndsFirst) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = EndsFirst {
            inner: Some(Box::pin(Channel(rx))),
            id: serde_json::json!(7),
            held: VecDeque::new(),
            draining: None,
            misses: Arc::new(AtomicU32::new(misses)),
        };
        (tx, stream)
    }

    /// One poll, with a waker that does nothing.
    fn poll(stream: &mut EndsFirst) -> Poll<Option<Option<String>>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(stream)
            .poll_next(&mut cx)
            .map(|e| e.map(|e| e.ok().and_then(|e| e.data)))
    }

    fn ready(data: &str) -> Poll<Option<Option<String>>> {
        Poll::Ready(Some(Some(data.to_owned())))
    }

    #[tokio::test]
    async fn the_response_is_handed_on_once_the_stream_has_ended_and_nothing_after_it_is_lost() {
        let (tx, mut stream) = ends_first(0);
        tx.send(event(NOTICE)).unwrap();
        tx.send(event(REPLY)).unwrap();
        assert_eq!(poll(&mut stream), ready(NOTICE));
        // The response is read, and held while the stream is open.
        assert_eq!(poll(&mut stream), Poll::Pending);
        assert_eq!(poll(&mut stream), Poll::Pending);
        let late = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#;
        tx.send(event(late)).unwrap();
        assert_eq!(poll(&mut stream), Poll::Pending);
        drop(tx);
        assert_eq!(poll(&mut stream), ready(REPLY));
        assert_eq!(poll(&mut stream), ready(late));
        assert_eq!(poll(&mut stream), Poll::Ready(None));
        assert_eq!(stream.misses.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn other_ids_and_notices_are_not_held() {
        let (tx, mut stream) = ends_first(0);
        let other = r#"{"jsonrpc":"2.0","id":8,"result":{}}"#;
        let named = r#"{"jsonrpc":"2.0","id":"7","result":{}}"#;
        let request = r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage"}"#;
        for data in [other, named, request, "not json"] {
            tx.send(event(data)).unwrap();
            assert_eq!(poll(&mut stream), ready(data));
        }
        // An error to the request is its response.
        tx.send(event(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#,
        ))
        .unwrap();
        assert_eq!(poll(&mut stream), Poll::Pending);
    }

    #[tokio::test]
    async fn a_stream_left_open_hands_the_response_on_after_the_wait_and_then_at_once() {
        use std::future::poll_fn;
        let (tx, mut stream) = ends_first(DRAIN_MISSES - 1);
        tx.send(event(REPLY)).unwrap();
        assert_eq!(poll(&mut stream), Poll::Pending);
        let data = |e: Option<Result<Sse, SseError>>| e.and_then(|e| e.ok()).and_then(|e| e.data);
        let got = poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await;
        assert_eq!(data(got).as_deref(), Some(REPLY));
        assert_eq!(stream.misses.load(Ordering::Relaxed), DRAIN_MISSES);
        // The stream is still open and still carries events.
        tx.send(event(NOTICE)).unwrap();
        assert_eq!(poll(&mut stream), ready(NOTICE));
        // With that many misses a response is no longer held.
        tx.send(event(REPLY)).unwrap();
        assert_eq!(poll(&mut stream), ready(REPLY));
    }
}
