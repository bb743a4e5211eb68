//! Upstream MCP servers (`[tools.NAME] kind = "mcp"`): their tools become
//! capabilities `NAME.TOOL` with their own input schemas.
//!
//! A server is started (or connected to) on the first call of one of its
//! tools, or when its tools are listed; a server that died is started
//! again on the next call (a call in flight when it dies fails). A stdio
//! server runs in a process group of its own, killed with the supervisor:
//! when the last handle on the [`Upstream`] goes (the supervisor's
//! registry), the group is killed and the server reaped.
//!
//! Each tenant (a principal of `serve`) has a connection of its own: its
//! own process for a stdio server, its own MCP session for an HTTP one, so
//! what one tenant makes a stateful server keep, another cannot read. It
//! is counted on the tenant's account while open (`[principals]
//! max_upstream_connections`), and there is at most one per tenant and
//! server at a time. A server declared `shared = true` (one that keeps no
//! state between calls) has one connection for everyone instead.

use crate::supervisor::{Account, Capability, SourceError, SourceFuture, ToolSource};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How an upstream server is reached.
#[derive(Debug, Clone)]
pub enum Target {
    /// A program spoken to over its stdin and stdout, started with exactly
    /// the environment `env` (nothing of the supervisor's but what the
    /// configuration names).
    Stdio {
        argv: Vec<String>,
        env: super::env::HelperEnv,
    },
    /// Streamable HTTP with the bearer token of `token_env`, read (and
    /// registered with the redaction) when the server is declared.
    Http {
        url: String,
        token_env: Option<String>,
        token: Option<crate::secrets::Secret>,
        /// Root certificates trusted besides the built-in ones (`ca_file`).
        roots: Vec<reqwest::Certificate>,
    },
}

/// An upstream server could not be declared.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(
        "tools.{name}: give either command = [\"prog\", ...] or url = \"http://...\", not {what}"
    )]
    Target { name: String, what: &'static str },
    #[error("tools.{name}.url: only http:// and https:// URLs are supported (got {url:?})")]
    Url { name: String, url: String },
    #[error("tools.{name}: {source}")]
    Capability {
        name: String,
        #[source]
        source: crate::supervisor::CapabilityError,
    },
    #[error(transparent)]
    Env(#[from] super::env::EnvError),
    #[error("tools.{name}: {source}")]
    Secrets {
        name: String,
        #[source]
        source: crate::secrets::SecretsError,
    },
}

impl Target {
    /// This target trusting `roots` (`ca_file`, only with `url`).
    pub fn with_roots(
        self,
        name: &str,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Target, UpstreamError> {
        match self {
            Target::Http {
                url,
                token_env,
                token,
                ..
            } => Ok(Target::Http {
                url,
                token_env,
                token,
                roots,
            }),
            Target::Stdio { .. } => Err(UpstreamError::Target {
                name: name.to_owned(),
                what: "ca_file without url",
            }),
        }
    }

    /// This (stdio) target started with the environment `env` (literals
    /// and secrets of the supervisor's, `{ env = "VAR" }`) and the
    /// supervisor's variables named in `pass_env`, and nothing else.
    pub fn with_env(
        self,
        name: &str,
        env: &std::collections::BTreeMap<String, super::config::EnvValue>,
        pass_env: &[String],
    ) -> Result<Target, UpstreamError> {
        let Target::Stdio { argv, .. } = self else {
            if env.is_empty() && pass_env.is_empty() {
                return Ok(self);
            }
            return Err(UpstreamError::Target {
                name: name.to_owned(),
                what: "env or pass_env without command",
            });
        };
        // A server runs outside the sandbox: none of its variables is the
        // sandbox's.
        let env = super::env::HelperEnv::new(name, env, pass_env, &[])?;
        Ok(Target::Stdio { argv, env })
    }

    /// The target of `[tools.NAME]` from its `command`, `url` and `token_env`.
    pub fn new(
        name: &str,
        command: Vec<String>,
        url: Option<String>,
        token_env: Option<String>,
    ) -> Result<Target, UpstreamError> {
        let bad = |what| UpstreamError::Target {
            name: name.to_owned(),
            what,
        };
        match (command.is_empty(), url) {
            (false, None) if token_env.is_some() => Err(bad("token_env without url")),
            (false, None) => Ok(Target::Stdio {
                argv: command,
                env: super::env::HelperEnv::default(),
            }),
            (true, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(UpstreamError::Url {
                        name: name.to_owned(),
                        url,
                    });
                }
                let token = match &token_env {
                    Some(var) => {
                        crate::secrets::from_env(var).map_err(|source| UpstreamError::Secrets {
                            name: name.to_owned(),
                            source,
                        })?
                    }
                    None => None,
                };
                Ok(Target::Http {
                    url,
                    token_env,
                    token,
                    roots: Vec::new(),
                })
            }
            (true, None) => Err(bad("neither")),
            (false, Some(_)) => Err(bad("both")),
        }
    }
}

/// How one server is called.
#[derive(Debug)]
struct Settings {
    server: String,
    target: Target,
    timeout: Duration,
    max_output: usize,
}

/// A tenant's connection, or the one every tenant shares.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

/// One upstream MCP server, connected when first needed (see the module
/// docs: a connection per tenant unless shared).
pub struct Upstream {
    settings: Arc<Settings>,
    shared: bool,
    /// By tenant (`None`: the supervisor's own, and all when shared).
    conns: Mutex<std::collections::HashMap<Option<Arc<str>>, Slot>>,
}

/// A live connection: the client, the server's tools as capabilities, and
/// (stdio) the server's process.
struct Conn {
    settings: Arc<Settings>,
    service: RunningService<RoleClient, ()>,
    tools: BTreeMap<String, Capability>,
    dead: AtomicBool,
    child: Option<Helper>,
    /// (stdio) What the reader of the server's stdout stopped at.
    fault: Option<super::stdio_tap::Fault>,
    /// Counts it on its tenant's account while it lives.
    _counted: Option<crate::supervisor::ledger::OpenConnection>,
}

/// The process of a stdio server: its group is killed and it is reaped
/// when dropped.
struct Helper {
    child: Mutex<std::process::Child>,
}

impl Helper {
    fn exited(&self) -> bool {
        match self.child.lock() {
            Ok(mut c) => !matches!(c.try_wait(), Ok(None)),
            Err(_) => true,
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let Ok(child) = self.child.get_mut() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // The server started a session of its own: its pid is its group.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        // SIGKILL was sent: the wait is short.
        let _ = child.wait();
    }
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
            || self.service.is_closed()
            || self.child.as_ref().is_some_and(Helper::exited)
    }

    /// What ended the connection, when the server wrote something that is
    /// not JSON-RPC.
    fn fault(&self) -> Option<&String> {
        self.fault.as_ref().and_then(|f| f.get())
    }

    async fn call(&self, tool: &str, args: Map<String, Value>) -> Result<Value, String> {
        let s = &self.settings;
        let name = format!("{}.{tool}", s.server);
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        let reply = tokio::time::timeout(s.timeout, self.service.call_tool(params)).await;
        if !matches!(reply, Ok(Ok(_))) {
            if let Some(fault) = self.fault() {
                self.dead.store(true, Ordering::Relaxed);
                return Err(format!(
                    "{name}: {fault} (the server is started again on the next call)"
                ));
            }
        }
        let reply = match reply {
            Err(_) => {
                return Err(format!(
                    "{name}: the upstream MCP server did not answer within {} ms",
                    s.timeout.as_millis()
                ))
            }
            Ok(Err(e)) => {
                let gone = matches!(
                    e,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) || self.service.is_closed();
                if gone {
                    self.dead.store(true, Ordering::Relaxed);
                    return Err(format!(
                        "{name}: the upstream MCP server went away during the call \
                         (it is started again on the next call): {e}"
                    ));
                }
                return Err(format!("{name}: the upstream MCP server failed: {e}"));
            }
            Ok(Ok(r)) => r,
        };
        let value = result_value(&name, reply)?;
        let size = serde_json::to_vec(&value).map_or(0, |v| v.len());
        if size > s.max_output {
            return Err(format!(
                "{name}: the result is {size} bytes, over the limit of {} bytes",
                s.max_output
            ));
        }
        Ok(value)
    }
}

/// What a cell gets from a tool's result: its structured content when
/// given, else its text (parsed when it is JSON; a list when there are
/// several pieces). An `isError` result is an error with the text.
fn result_value(name: &str, r: CallToolResult) -> Result<Value, String> {
    let pieces: Vec<Value> = r
        .content
        .iter()
        .map(|c| match c.as_text() {
            Some(t) => Value::String(t.text.clone()),
            None => serde_json::to_value(c).unwrap_or(Value::Null),
        })
        .collect();
    if r.is_error == Some(true) {
        let text: Vec<String> = pieces
            .iter()
            .map(|p| match p {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        return Err(format!(
            "{name}: the tool reported an error: {}",
            text.join("\n")
        ));
    }
    if let Some(v) = r.structured_content {
        return Ok(v);
    }
    let parse = |v: Value| match v {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        other => other,
    };
    let mut pieces = pieces;
    Ok(match pieces.len() {
        0 => Value::Null,
        1 => parse(pieces.remove(0)),
        _ => Value::Array(pieces.into_iter().map(parse).collect()),
    })
}

impl Upstream {
    /// A server with a connection per tenant, or one for all when `shared`.
    pub fn new(
        server: &str,
        target: Target,
        timeout_ms: u64,
        max_output: usize,
        shared: bool,
    ) -> Upstream {
        Upstream {
            settings: Arc::new(Settings {
                server: server.to_owned(),
                target,
                timeout: Duration::from_millis(timeout_ms.max(1)),
                max_output,
            }),
            shared,
            conns: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The slot of `account`'s connection.
    fn slot(&self, account: &Account) -> Slot {
        let key = if self.shared {
            None
        } else {
            account.tenant.as_ref().map(|t| Arc::from(t.name()))
        };
        let mut conns = crate::util::lock(&self.conns);
        conns.entry(key).or_default().clone()
    }

    /// `account`'s live connection, made (again) if there is none or it
    /// died.
    async fn connect(&self, account: &Account) -> Result<Arc<Conn>, String> {
        let slot = self.slot(account);
        let mut slot = slot.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        // The old one (and its process) goes first.
        *slot = None;
        // A tenant's own connection is counted on its account; a shared
        // one is the server's.
        let counted = match (self.shared, account.tenant.is_some()) {
            (false, true) => Some(
                account
                    .chain
                    .open_connection(&self.settings.server)
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let fault = super::stdio_tap::Fault::default();
        let started = tokio::time::timeout(
            self.settings.timeout,
            start(self.settings.clone(), fault.clone(), counted),
        )
        .await;
        if !matches!(started, Ok(Ok(_))) {
            if let Some(fault) = fault.get() {
                return Err(format!("{fault} (before the MCP handshake completed)"));
            }
        }
        let c = started.map_err(|_| {
            format!(
                "the upstream MCP server did not start within {} ms",
                self.settings.timeout.as_millis()
            )
        })??;
        *slot = Some(c.clone());
        Ok(c)
    }

    fn failed(&self, tool: &str, e: String) -> SourceError {
        SourceError::Failed(format!("{}.{tool}: {e}", self.settings.server))
    }
}

type Pipes = (tokio::io::DuplexStream, tokio::process::ChildStdin);

/// Start a stdio server in a process group of its own; its stdout is read
/// through [`super::stdio_tap`], which records in `fault` the first line
/// that is not JSON-RPC.
fn spawn(settings: &Settings, fault: &super::stdio_tap::Fault) -> Result<(Helper, Pipes), String> {
    let Target::Stdio { argv, env } = &settings.target else {
        return Err("not a stdio server".into());
    };
    let (prog, args) = argv.split_first().ok_or("the command is empty")?;
    let mut cmd = std::process::Command::new(prog);
    // Nothing of the supervisor's environment (its model keys, the other
    // tools' tokens) but what the configuration names for this server.
    cmd.env_clear();
    cmd.envs(env.resolve()?);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::sandbox::spawn::prepare_helper(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the upstream MCP server {prog:?}: {e}"))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    if let Some(stderr) = child.stderr.take() {
        relay_log(&settings.server, stderr);
    }
    let helper = Helper {
        child: Mutex::new(child),
    };
    let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
        return Err("the upstream MCP server's stdio could not be piped".into());
    };
    let io = |e: std::io::Error| format!("the upstream MCP server's stdio: {e}");
    let stdin = tokio::process::ChildStdin::from_std(stdin).map_err(io)?;
    let stdout = tokio::process::ChildStdout::from_std(stdout).map_err(io)?;
    let cap = super::stdio_tap::line_cap(settings.max_output);
    let stdout = super::stdio_tap::tap(&settings.server, stdout, cap, fault);
    Ok((helper, (stdout, stdin)))
}

/// Bytes of one line of a server's log passed on (the rest of a longer
/// line is left out).
const LOG_LINE_BYTES: usize = 4096;

/// Pass a stdio server's log (its stderr) on to ours, line by line, each
/// redacted and escaped (see [`crate::terminal::for_person`]) and marked
/// with the server's name; it ends with the server.
fn relay_log(server: &str, stderr: std::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let Ok(stderr) = tokio::process::ChildStderr::from_std(stderr) else {
        return;
    };
    let server = server.to_owned();
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            let (take, ended) = {
                let Ok(buf) = reader.fill_buf().await else {
                    return;
                };
                if buf.is_empty() {
                    return;
                }
                let newline = buf.iter().position(|b| *b == b'\n');
                let take = newline.map_or(buf.len(), |i| i + 1);
                // Twice what is shown is kept, so that a secret across the
                // cut is redacted whole before the line is cut.
                let room = (2 * LOG_LINE_BYTES).saturating_sub(line.len());
                line.extend_from_slice(&buf[..take.min(room)]);
                (take, newline.is_some())
            };
            reader.consume(take);
            if ended {
                let read = String::from_utf8_lossy(&line);
                let text = crate::secrets::redact_record(&read);
                let mut text = text.trim_end_matches(['\n', '\r']);
                if text.len() > LOG_LINE_BYTES {
                    let mut end = LOG_LINE_BYTES;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text = &text[..end];
                }
                crate::report!("upstream {server}: {}", crate::terminal::escape(text));
                line.clear();
            }
        }
    });
}

/// Most tools one upstream server may list.
pub const MAX_UPSTREAM_TOOLS: usize = 1024;
/// Most bytes (as JSON) of one upstream server's tool list, all its pages.
pub const MAX_TOOL_LIST_BYTES: usize = 8 << 20;
/// Most pages of one upstream server's tool list.
pub const MAX_TOOL_LIST_PAGES: usize = 64;

/// The server's tools, page after page, bounded by count, bytes and pages
/// (a server that pages forever, or lists huge tools, is refused with the
/// bound it passed, not waited for until it is out of time).
async fn list_tools(
    service: &RunningService<RoleClient, ()>,
    server: &str,
) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    for _ in 0..MAX_TOOL_LIST_PAGES {
        let page = service
            .list_tools(Some(
                rmcp::model::PaginatedRequestParams::default().with_cursor(cursor),
            ))
            .await
            .map_err(|e| format!("listing the upstream MCP server's tools failed: {e}"))?;
        for t in page.tools {
            bytes = bytes.saturating_add(serde_json::to_vec(&t).map_or(0, |v| v.len()));
            if bytes > MAX_TOOL_LIST_BYTES {
                return Err(format!(
                    "the upstream MCP server {server} lists tools of more than \
                     {MAX_TOOL_LIST_BYTES} bytes, the most read from one server"
                ));
            }
            if tools.len() == MAX_UPSTREAM_TOOLS {
                return Err(format!(
                    "the upstream MCP server {server} lists more than {MAX_UPSTREAM_TOOLS} \
                     tools, the most read from one server"
                ));
            }
            tools.push(t);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    Err(format!(
        "the upstream MCP server {server} lists its tools in more than {MAX_TOOL_LIST_PAGES} \
         pages, the most read from one server"
    ))
}

/// Connect to the server and learn its tools.
async fn start(
    settings: Arc<Settings>,
    fault: super::stdio_tap::Fault,
    counted: Option<crate::supervisor::ledger::OpenConnection>,
) -> Result<Arc<Conn>, String> {
    let (service, child) = match &settings.target {
        Target::Stdio { argv, .. } => {
            let (helper, transport) = spawn(&settings, &fault)?;
            let service = ().serve(transport).await.map_err(|e| {
                format!(
                    "the upstream MCP server {:?} did not complete the MCP handshake: {e}",
                    argv[0]
                )
            })?;
            (service, Some((helper, fault)))
        }
        Target::Http {
            url,
            token_env,
            token,
            roots,
        } => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(var) = token_env {
                let token = token.as_ref().ok_or_else(|| {
                    format!("the environment variable {var} (token_env) is not set")
                })?;
                config = config.auth_header(token.expose());
            }
            // For TLS, and the GET and DELETE of plain HTTP: no idle
            // connections kept (one reused without TCP_QUICKACK can stall
            // ~40 ms on a delayed ACK), and no redirects followed.
            let builder = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .redirect(reqwest::redirect::Policy::none());
            let client = super::declared::client_with_roots(builder, roots.clone())
                .build()
                .map_err(|e| format!("failed to build the HTTP client: {e}"))?;
            // Plain HTTP: tool calls over kept-alive connections (see
            // upstream_http); TLS: a new connection per request.
            let served = if url.starts_with("http://") {
                let pooled = super::upstream_http::PooledClient::new(client.clone());
                ().serve(StreamableHttpClientTransport::with_client(pooled, config))
                    .await
                    .map_err(|e| super::declared::error_chain(&e))
            } else {
                ().serve(StreamableHttpClientTransport::with_client(
                    client.clone(),
                    config,
                ))
                .await
                .map_err(|e| super::declared::error_chain(&e))
            };
            let service = match served {
                Ok(s) => s,
                Err(e) => {
                    // rmcp's error does not keep the request's cause (a
                    // refused certificate): one plain request shows it.
                    let cause = match client.get(url.as_str()).send().await {
                        Err(e) => format!(" ({})", super::declared::error_chain(&e)),
                        Ok(_) => String::new(),
                    };
                    return Err(format!(
                        "cannot connect to the upstream MCP server at {url}: {e}{cause}"
                    ));
                }
            };
            (service, None)
        }
    };
    let (child, fault) = child.unzip();
    // rmcp keeps list replies a server asks it to cache (up to 512 of
    // them): nothing an upstream sends is kept beyond what is asked.
    service
        .peer()
        .set_response_cache_config(rmcp::service::ClientCacheConfig::disabled())
        .await;
    let listed = list_tools(&service, &settings.server).await?;
    let conn = Arc::new_cyclic(|weak: &Weak<Conn>| {
        let mut tools = BTreeMap::new();
        for t in listed {
            let tool = t.name.to_string();
            // What the upstream says of its tools reaches cells and
            // clients (in errors, in descriptions): redacted here, once,
            // like anything else it sends. A tool whose very name holds a
            // secret is left out.
            if crate::secrets::redact(&tool) != tool {
                tracing::warn!(
                    "upstream MCP server {}: tool {} skipped: its name holds a secret",
                    settings.server,
                    crate::secrets::redact(&tool)
                );
                continue;
            }
            let name = format!("{}.{tool}", settings.server);
            let mut schema = Value::Object((*t.input_schema).clone());
            crate::secrets::redact_value(&mut schema);
            let description = crate::secrets::redact(t.description.as_deref().unwrap_or(""));
            let weak = weak.clone();
            let handler_tool = tool.clone();
            let cap = Capability::new(&name, &description, schema, move |_ctx, args| {
                let weak = weak.clone();
                let tool = handler_tool.clone();
                async move {
                    match weak.upgrade() {
                        Some(conn) => conn.call(&tool, args).await,
                        None => Err(format!("{tool}: the upstream MCP server was shut down")),
                    }
                }
            });
            match cap {
                Ok(cap) => {
                    tools.insert(tool, cap);
                }
                Err(e) => {
                    tracing::warn!("upstream MCP server {}: tool skipped: {e}", settings.server)
                }
            }
        }
        Conn {
            settings: settings.clone(),
            service,
            tools,
            dead: AtomicBool::new(false),
            child,
            fault,
            _counted: counted,
        }
    });
    Ok(conn)
}

impl ToolSource for Upstream {
    fn tool<'a>(&'a self, account: &'a Account, tool: &'a str) -> SourceFuture<'a, Capability> {
        Box::pin(async move {
            let conn = self
                .connect(account)
                .await
                .map_err(|e| self.failed(tool, e))?;
            match conn.tools.get(tool) {
                Some(cap) => Ok(cap.clone()),
                None => Err(SourceError::Unknown(format!(
                    "unknown capability \"{}.{tool}\": the upstream MCP server {} has no tool \
                     {tool:?} (its tools: {})",
                    self.settings.server,
                    self.settings.server,
                    conn.tools.keys().cloned().collect::<Vec<_>>().join(", ")
                ))),
            }
        })
    }

    fn list<'a>(&'a self, account: &'a Account) -> SourceFuture<'a, Vec<Capability>> {
        Box::pin(async move {
            let conn = self
                .connect(account)
                .await
                .map_err(|e| SourceError::Failed(format!("{}: {e}", self.settings.server)))?;
            Ok(conn.tools.values().cloned().collect())
        })
    }
}

/// The capability standing for the upstream server `name` (its tools are
/// looked up through it); `shared`: one connection for every tenant.
pub fn capability(
    name: &str,
    description: &str,
    target: Target,
    timeout_ms: u64,
    max_output: usize,
    shared: bool,
) -> Result<Capability, UpstreamError> {
    let up = Arc::new(Upstream::new(name, target, timeout_ms, max_output, shared));
    let description = if description.is_empty() {
        format!("the tools of the upstream MCP server {name}")
    } else {
        description.to_owned()
    };
    Capability::source(name, &description, up).map_err(|source| UpstreamError::Capability {
        name: name.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked() {
        assert!(matches!(
            Target::new("g", vec!["x".into()], None, None),
            Ok(Target::Stdio { .. })
        ));
        assert!(matches!(
            Target::new("g", vec![], Some("https://h/mcp".into()), Some("T".into())),
            Ok(Target::Http { .. })
        ));
        let e = Target::new("g", vec![], None, None)
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("tools.g")));
        assert!(Target::new("g", vec!["x".into()], Some("http://h".into()), None).is_err());
        assert!(Target::new("g", vec![], Some("ftp://h".into()), None).is_err());
        assert!(Target::new("g", vec!["x".into()], None, Some("T".into())).is_err());
    }

    #[test]
    fn results_become_values() {
        let ok = CallToolResult::success(vec![rmcp::model::ContentBlock::text("{\"n\": 3}")]);
        assert_eq!(
            result_value("s.t", ok).ok(),
            Some(serde_json::json!({"n": 3}))
        );
        let text = CallToolResult::success(vec![rmcp::model::ContentBlock::text("plain")]);
        assert_eq!(
            result_value("s.t", text).ok(),
            Some(Value::String("plain".into()))
        );
        let err = CallToolResult::error(vec![rmcp::model::ContentBlock::text("boom")]);
        let e = result_value("s.t", err).err().unwrap_or_default();
        assert!(e.contains("s.t") && e.contains("boom"), "{e}");
    }
}
