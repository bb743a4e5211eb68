//! Shared helpers of the agent-surface section: a `cellbox serve --http`
//! started with a config file and secrets in its environment (its log kept
//! as evidence), an echoing HTTP endpoint (a model, an http tool, anything
//! that answers with what it was sent), the fake upstream MCP server, and
//! checks for a secret in any text.

// Shared by the attacks of the section; each uses some.
#![allow(dead_code)]

use crate::tenancy::harness::{Client, Env, PATIENCE};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use crate::tenancy::harness::{marker, python};

/// Bytes of a secret that, seen together in the operator's records (the
/// log, the events file, the agent's terminal), count as a leak.
pub const RUN: usize = 8;

/// Bits of chance a tenant may be shown of a secret in one run: a run
/// carrying this many (two 64-bit guesses), or 64 while leaving fewer than
/// 64 unseen, is a leak.
pub const TENANT_BITS: usize = 128;

/// A byte of a secret and the first and last characters of a form that
/// hold it.
pub type Held = (usize, usize, usize);

/// The forms a secret takes in an echo (as it is, URL-encoded, hex,
/// base64 of its whole groups at each alignment), each with the
/// characters of the form that hold each byte of the secret: (byte, first,
/// last).
pub fn forms(s: &str) -> Vec<(String, Vec<Held>)> {
    use base64::Engine as _;
    let b = s.as_bytes();
    let mut out = vec![(s.to_owned(), (0..b.len()).map(|i| (i, i, i)).collect())];
    let (mut url, mut url_of) = (String::new(), Vec::new());
    for (i, c) in b.iter().enumerate() {
        let piece = if c.is_ascii_alphanumeric() {
            (*c as char).to_string()
        } else {
            format!("%{c:02X}")
        };
        url_of.push((i, url.len(), url.len() + piece.len() - 1));
        url.push_str(&piece);
    }
    out.push((url, url_of));
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    out.push((hex, (0..b.len()).map(|i| (i, 2 * i, 2 * i + 1)).collect()));
    for j in 0..3.min(b.len()) {
        let whole = (b.len() - j) / 3 * 3;
        let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&b[j..j + whole]);
        // Byte i's bits 8i..8i+8 are in characters 8i/6 ..= (8i+7)/6.
        let of = (0..whole)
            .map(|i| (j + i, 8 * i / 6, (8 * i + 7) / 6))
            .collect();
        out.push((enc, of));
    }
    out
}

/// Bits of chance in each byte of `s`, as the attacks make secrets: 4 in
/// a hex digit (of a marker), none elsewhere (prefixes, separators).
fn chance(s: &str) -> Vec<usize> {
    s.bytes()
        .map(|b| if b.is_ascii_hexdigit() { 4 } else { 0 })
        .collect()
}

/// The longest run of `form` starting at each of its characters found in
/// `text`: (start, end).
fn runs_in(text: &str, form: &str) -> Vec<(usize, usize)> {
    let f = form.as_bytes();
    let mut out = Vec::new();
    for a in 0..f.len() {
        // Monotone: a run found has every shorter prefix found.
        let (mut lo, mut hi) = (a, f.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            let piece = String::from_utf8_lossy(&f[a..mid]);
            if text.contains(piece.as_ref()) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo > a {
            out.push((a, lo));
        }
    }
    out
}

/// Where `text`, shown to a tenant, holds too much of `secret`: a run (in
/// any of its [`forms`]) carrying [`TENANT_BITS`] bits of its chance, or
/// half that while leaving fewer than half unseen.
pub fn tenant_leak(text: &str, secret: &str) -> Option<String> {
    let bits = chance(secret);
    let total: usize = bits.iter().sum();
    for (form, of) in forms(secret) {
        for (a, b) in runs_in(text, &form) {
            let carried: usize = of
                .iter()
                .filter(|(_, first, last)| *first >= a && *last < b)
                .map(|(i, _, _)| bits[*i])
                .sum();
            let half = TENANT_BITS / 2;
            if carried >= TENANT_BITS || carried >= half && total - carried < half {
                return Some(format!(
                    "{:?} ({carried} bits of {total})",
                    &form[a..b.min(a + 48)]
                ));
            }
        }
    }
    None
}

/// The first run of [`RUN`] bytes of any form of any of `secrets` found in
/// `text` (the operator's records).
pub fn record_leak(text: &str, secrets: &[String]) -> Option<String> {
    secrets.iter().flat_map(|s| forms(s)).find_map(|(l, _)| {
        l.as_bytes()
            .windows(RUN.min(l.len()))
            .find(|w| text.as_bytes().windows(w.len()).any(|t| t == *w))
            .map(|w| String::from_utf8_lossy(w).into_owned())
    })
}

/// The log notifications a [`Recorder`] received.
pub type Notes = Arc<Mutex<Vec<serde_json::Value>>>;

/// A client handler that keeps the log notifications.
#[derive(Clone)]
pub struct Recorder {
    logs: Notes,
}

impl rmcp::ClientHandler for Recorder {
    #[allow(deprecated)] // the server streams output as logging notifications
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        if let Ok(mut l) = self.logs.lock() {
            l.push(params.data);
        }
    }
}

pub type RecordingClient = rmcp::service::RunningService<rmcp::RoleClient, Recorder>;

/// A `cellbox serve --http` with a config file and extra environment; its
/// stderr (the log) is kept; killed when dropped.
pub struct AgentServe {
    child: std::process::Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
    pub dir: tempfile::TempDir,
}

impl AgentServe {
    /// Start `serve --http 127.0.0.1:0 --config <config> --events <dir>/events`
    /// with `env` added to this process's environment.
    pub fn start(env: &Env, config: &str, vars: &[(&str, &str)]) -> Result<AgentServe, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let path = dir.path().join("cellbox.toml");
        std::fs::write(&path, config).map_err(|e| format!("config file: {e}"))?;
        let mut child = std::process::Command::new(&env.cellbox)
            .args(["serve", "--http", "127.0.0.1:0", "--config"])
            .arg(&path)
            .arg("--events")
            .arg(dir.path().join("events"))
            .envs(vars.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("failed to start {}: {e}", env.cellbox.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if let Some(rest) = line.split("at http://").nth(1) {
                    if let Some(t) = tx.take() {
                        let _ = t.send(rest.trim_end_matches('/').to_owned());
                    }
                }
                eprintln!("[serve] {line}");
                if let Ok(mut l) = kept.lock() {
                    l.push(line);
                }
            }
        });
        let announced = rx.recv_timeout(PATIENCE).map_err(|_| {
            let log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
            format!("the server did not announce its address: {log}")
        })?;
        Ok(AgentServe {
            child,
            url: format!("http://{announced}/"),
            log,
            dir,
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// An initialized MCP client.
    pub fn client(&self, env: &Env) -> Result<Client, String> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.clone());
        let _in_runtime = env.rt.enter();
        let transport = StreamableHttpClientTransport::from_config(config);
        env.block_on("initialize", ().serve(transport))?
            .map_err(|e| format!("initialize: {e}"))
    }

    /// An initialized MCP client that keeps the log notifications (a
    /// cell's live output) the server sends it.
    pub fn recording_client(&self, env: &Env) -> Result<(RecordingClient, Notes), String> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.clone());
        let _in_runtime = env.rt.enter();
        let transport = StreamableHttpClientTransport::from_config(config);
        let notes = Notes::default();
        let recorder = Recorder {
            logs: notes.clone(),
        };
        let client = env
            .block_on("initialize", recorder.serve(transport))?
            .map_err(|e| format!("initialize: {e}"))?;
        Ok((client, notes))
    }

    /// An initialized MCP client speaking with bearer `token` (a server
    /// whose config names a `token_file`).
    pub fn client_as(&self, env: &Env, token: &str) -> Result<Client, String> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.clone())
            .max_concurrent_requests(16)
            .auth_header(token);
        let _in_runtime = env.rt.enter();
        let transport = StreamableHttpClientTransport::from_config(config);
        env.block_on("initialize", ().serve(transport))?
            .map_err(|e| format!("initialize: {e}"))
    }

    /// [`AgentServe::client_as`], keeping the log notifications it is
    /// sent.
    pub fn recording_client_as(
        &self,
        env: &Env,
        token: &str,
    ) -> Result<(RecordingClient, Notes), String> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.clone())
            .max_concurrent_requests(16)
            .auth_header(token);
        let _in_runtime = env.rt.enter();
        let transport = StreamableHttpClientTransport::from_config(config);
        let notes = Notes::default();
        let recorder = Recorder {
            logs: notes.clone(),
        };
        let client = env
            .block_on("initialize", recorder.serve(transport))?
            .map_err(|e| format!("initialize: {e}"))?;
        Ok((client, notes))
    }

    /// Everything the server wrote to its log so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// The events file so far.
    pub fn events(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("events")).unwrap_or_default()
    }

    /// Where a leak of `secrets` shows: the client's view `answer` (too
    /// much of one for a tenant, see [`tenant_leak`]), the events file and
    /// the log (any run of [`RUN`] bytes, see [`record_leak`]). Empty when
    /// nowhere.
    pub fn leaks(&self, answer: &str, secrets: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for s in secrets {
            if let Some(run) = tenant_leak(answer, s) {
                out.push(format!("the client's result holds {run}"));
            }
        }
        for (place, text) in [
            ("the events file", self.events()),
            ("the server's log", self.log()),
        ] {
            if let Some(run) = record_leak(&text, secrets) {
                out.push(format!("{place} holds {run:?}"));
            }
        }
        out
    }
}

impl Drop for AgentServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment of host process `pid` as the host sees it.
pub fn environ(pid: i32) -> Result<Vec<(String, String)>, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))
        .map_err(|e| format!("failed to read /proc/{pid}/environ: {e}"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let e = String::from_utf8_lossy(e);
            match e.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (e.into_owned(), String::new()),
            }
        })
        .collect())
}

/// What one request to an [`Echo`] carried.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    /// Header lines `name: value`, in order.
    pub headers: Vec<String>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|h| {
            h.split_once(": ")
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        })
    }
}

/// How an [`Echo`] answers a request: status and body.
pub type Answer = Arc<dyn Fn(&Seen) -> (u16, String) + Send + Sync>;

/// An HTTP endpoint on 127.0.0.1 that answers as `answer` says, and keeps
/// each request and what it answered (the evidence that the attack
/// delivered what it meant to).
pub struct Echo {
    pub url: String,
    seen: Arc<Mutex<Vec<(Seen, String)>>>,
}

impl Echo {
    pub fn start(answer: Answer) -> Result<Echo, String> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
                    return;
                };
                let _ = tx.send(listener.local_addr().map(|a| a.port()));
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (answer, kept) = (answer.clone(), kept.clone());
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            respond(answer.clone(), kept.clone(), req)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        });
        let port = rx
            .recv_timeout(PATIENCE)
            .map_err(|_| "the echo endpoint did not start".to_owned())?
            .map_err(|e| format!("the echo endpoint: {e}"))?;
        Ok(Echo {
            url: format!("http://127.0.0.1:{port}"),
            seen,
        })
    }

    /// Every request and the body it was answered with.
    pub fn seen(&self) -> Vec<(Seen, String)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

async fn respond(
    answer: Answer,
    kept: Arc<Mutex<Vec<(Seen, String)>>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_owned();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let seen = Seen {
        path,
        headers,
        body,
    };
    let (status, text) = answer(&seen);
    if let Ok(mut k) = kept.lock() {
        k.push((seen, text.clone()));
    }
    let mut resp = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(text)));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// A chat-completions body whose reply is `text`.
pub fn completion(text: &str) -> String {
    serde_json::json!({"id": "x", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    .to_string()
}

/// The fake upstream MCP server program (examples/fake_mcp_upstream.rs),
/// built beside the cellbox binary when missing or older than its source.
pub fn fake_upstream(cellbox: &Path) -> Result<PathBuf, String> {
    let dir = cellbox
        .parent()
        .ok_or("the cellbox binary has no directory")?;
    let exe = dir.join("examples").join("fake_mcp_upstream");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let newest = [
        "examples/fake_mcp_upstream.rs",
        "tests/suite/common/fake_upstream.rs",
    ]
    .iter()
    .filter_map(|p| modified(&src.join(p)))
    .max();
    if modified(&exe) < newest {
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_owned(),
            Some(name) => name.to_owned(),
            None => return Err(format!("{} names no profile", dir.display())),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = std::process::Command::new(cargo)
            .args([
                "build",
                "--profile",
                &profile,
                "--example",
                "fake_mcp_upstream",
            ])
            .arg("--manifest-path")
            .arg(src.join("Cargo.toml"))
            .status()
            .map_err(|e| format!("failed to run cargo: {e}"))?;
        if !st.success() {
            return Err(format!("building the fake upstream failed: {st}"));
        }
    }
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(format!("{} is missing", exe.display()))
    }
}

#[allow(dead_code)]
#[path = "../../tests/suite/common/fake_upstream.rs"]
mod fake_upstream;

/// The fake upstream MCP server over streamable HTTP on 127.0.0.1 (its
/// `headers` tool answers with the request's headers), keeping the
/// `Authorization` header of every request.
pub struct HttpUpstream {
    pub url: String,
    authorizations: Arc<Mutex<Vec<String>>>,
}

impl HttpUpstream {
    pub fn start() -> Result<HttpUpstream, String> {
        use rmcp::transport::streamable_http_server::{
            session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
        };
        let authorizations = Arc::new(Mutex::new(Vec::new()));
        let kept = authorizations.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
                    return;
                };
                let _ = tx.send(listener.local_addr().map(|a| a.port()));
                let service = StreamableHttpService::new(
                    || Ok(fake_upstream::FakeUpstream),
                    Arc::new(LocalSessionManager::default()),
                    StreamableHttpServerConfig::default(),
                );
                while let Ok((stream, _)) = listener.accept().await {
                    let (service, kept) = (service.clone(), kept.clone());
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(
                            move |req: http::Request<hyper::body::Incoming>| {
                                let (service, kept) = (service.clone(), kept.clone());
                                async move {
                                    use http_body_util::BodyExt;
                                    let (parts, body) = req.into_parts();
                                    if let Some(a) = parts.headers.get("authorization") {
                                        if let Ok(mut k) = kept.lock() {
                                            k.push(
                                                String::from_utf8_lossy(a.as_bytes()).into_owned(),
                                            );
                                        }
                                    }
                                    let bytes = body
                                        .collect()
                                        .await
                                        .map(|b| b.to_bytes())
                                        .unwrap_or_default();
                                    Ok::<_, std::convert::Infallible>(
                                        service
                                            .handle(http::Request::from_parts(
                                                parts,
                                                http_body_util::Full::new(bytes),
                                            ))
                                            .await,
                                    )
                                }
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        });
        let port = rx
            .recv_timeout(PATIENCE)
            .map_err(|_| "the HTTP upstream did not start".to_owned())?
            .map_err(|e| format!("the HTTP upstream: {e}"))?;
        Ok(HttpUpstream {
            url: format!("http://127.0.0.1:{port}/mcp"),
            authorizations,
        })
    }

    /// The `Authorization` headers it received.
    pub fn authorizations(&self) -> Vec<String> {
        self.authorizations
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }
}
