//! A local OpenAI-compatible chat-completions server for the tests: it
//! answers from a script (then echoes the last message), records what it
//! received, and counts the requests in flight. It runs on a thread and
//! runtime of its own, so child processes and any test runtime can use it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A completion with this text and usage (input, output tokens).
    Text(String, u64, u64),
    /// This status, body and optional `Retry-After` seconds.
    Status(u16, String, Option<u32>),
    /// 200 with this body as it is.
    Raw(String),
    /// Never answer.
    Hang,
    /// Echo the last message's content as "echo:<content>", usage 10 + 5,
    /// after holding the request this long.
    EchoAfter(Duration),
    /// This reply, after holding the request this long.
    Delayed(Box<Reply>, Duration),
}

/// What one request carried.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authorization: Option<String>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    script: Mutex<VecDeque<Reply>>,
    /// Used when the script is empty (default: echo at once).
    fallback: Mutex<Option<Reply>>,
    seen: Mutex<Vec<Seen>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

pub struct FakeModel {
    pub url: String,
    pub port: u16,
    state: Arc<State>,
}

impl FakeModel {
    pub fn start(script: Vec<Reply>) -> FakeModel {
        let state = Arc::new(State::default());
        *state.script.lock().unwrap() = script.into();
        let (tx, rx) = std::sync::mpsc::channel();
        let st = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap().port()).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let st = st.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| answer(st.clone(), req));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        });
        let port = rx.recv().unwrap();
        FakeModel {
            url: format!("http://127.0.0.1:{port}/v1"),
            port,
            state,
        }
    }

    /// Answer this way once the script is used up.
    pub fn otherwise(&self, reply: Reply) {
        *self.state.fallback.lock().unwrap() = Some(reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }
}

fn completion(text: &str, input: u64, output: u64) -> String {
    json!({"id": "x", "object": "chat.completion",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop"}],
           "usage": {"prompt_tokens": input, "completion_tokens": output,
                     "total_tokens": input + output}})
    .to_string()
}

async fn answer(
    st: Arc<State>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let body: Value = body
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let last = body
        .pointer("/messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    st.seen.lock().unwrap().push(Seen {
        authorization,
        body,
    });
    let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    st.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let reply = st.script.lock().unwrap().pop_front();
    let mut reply = reply
        .or_else(|| st.fallback.lock().unwrap().clone())
        .unwrap_or(Reply::EchoAfter(Duration::ZERO));
    while let Reply::Delayed(r, d) = reply {
        tokio::time::sleep(d).await;
        reply = *r;
    }
    let (status, text, retry) = match reply {
        Reply::Text(t, i, o) => (200, completion(&t, i, o), None),
        Reply::Status(s, b, r) => (s, b, r),
        Reply::Raw(b) => (200, b, None),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            (200, String::new(), None)
        }
        Reply::EchoAfter(d) => {
            tokio::time::sleep(d).await;
            (200, completion(&format!("echo:{last}"), 10, 5), None)
        }
        Reply::Delayed(..) => (500, String::new(), None),
    };
    st.in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut resp = hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(r) = retry {
        resp = resp.header("retry-after", r.to_string());
    }
    Ok(resp.body(Full::new(Bytes::from(text))).unwrap())
}
