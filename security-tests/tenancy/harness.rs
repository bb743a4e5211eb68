//! Shared helpers of the multi-tenant section: a `cellbox serve --http`
//! with N named principals, and MCP clients for them.

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bound on anything that should finish; a hang is an error, not a stall.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// What every attack gets: the binary under test and an async runtime.
pub struct Env {
    pub cellbox: PathBuf,
    pub rt: tokio::runtime::Runtime,
}

impl Env {
    pub fn new(cellbox: &Path) -> Result<Env, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("failed to start a runtime: {e}"))?;
        Ok(Env {
            cellbox: cellbox.to_owned(),
            rt,
        })
    }

    /// Run `fut` to its end, at most [`PATIENCE`] (then an error).
    pub fn block_on<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, String> {
        self.rt
            .block_on(async { tokio::time::timeout(PATIENCE, fut).await })
            .map_err(|_| format!("{what}: no answer within {PATIENCE:?}"))
    }
}

/// An MCP client of one principal.
pub type Client = RunningService<RoleClient, ()>;

/// A `cellbox serve --http 127.0.0.1:0` with named principals; killed when
/// dropped.
pub struct Serve {
    child: std::process::Child,
    pub addr: SocketAddr,
    tokens: BTreeMap<String, String>,
    _dir: tempfile::TempDir,
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh random marker (for canaries and never-issued ids).
pub fn marker(prefix: &str) -> String {
    format!("{prefix}{}", random_hex(12))
}

impl Serve {
    /// Start a server whose token file names `principals` (one random token
    /// each), with `extra` flags.
    pub fn start(env: &Env, principals: &[&str], extra: &[&str]) -> Result<Serve, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let mut tokens = BTreeMap::new();
        let mut file = String::new();
        for p in principals {
            let t = format!("tok-{}", random_hex(16));
            file.push_str(&format!("{p} {t}\n"));
            tokens.insert((*p).to_owned(), t);
        }
        let token_file = dir.path().join("tokens");
        std::fs::write(&token_file, file).map_err(|e| format!("token file: {e}"))?;
        let mut child = std::process::Command::new(&env.cellbox)
            .args(["serve", "--http", "127.0.0.1:0", "--token-file"])
            .arg(&token_file)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("failed to start {}: {e}", env.cellbox.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // The server's log goes to our stderr (shown when the suite fails).
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
            }
        });
        let mut serve = Serve {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens,
            _dir: dir,
        };
        let announced = rx
            .recv_timeout(PATIENCE)
            .map_err(|_| "the server did not announce its address".to_owned())?;
        serve.addr = announced
            .parse()
            .map_err(|e| format!("bad address {announced:?}: {e}"))?;
        Ok(serve)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The bearer token of `principal`.
    pub fn token(&self, principal: &str) -> Result<&str, String> {
        self.tokens
            .get(principal)
            .map(String::as_str)
            .ok_or_else(|| format!("no principal {principal:?}"))
    }

    /// An initialized MCP client speaking as `principal`.
    pub fn client(&self, env: &Env, principal: &str) -> Result<Client, String> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url())
            .max_concurrent_requests(16)
            .auth_header(self.token(principal)?);
        // The transport spawns its worker on the runtime.
        let _in_runtime = env.rt.enter();
        let transport = StreamableHttpClientTransport::from_config(config);
        env.block_on("initialize", ().serve(transport))?
            .map_err(|e| format!("initialize as {principal}: {e}"))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a tool call answered, as one comparable value.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    /// `Ok` for a tool result, `Err(message)` for a JSON-RPC error.
    pub rpc: Result<(), String>,
    pub is_error: bool,
    pub text: String,
    pub structured: Option<Value>,
}

impl ToolAnswer {
    /// The answer with `id` written as `<id>` and per-run values (run ids,
    /// timings) dropped, to compare an answer about one id with an answer
    /// about another.
    pub fn normalized(&self, id: &str) -> ToolAnswer {
        let mut a = self.clone();
        a.text = a.text.replace(id, "<id>");
        if let Err(m) = &mut a.rpc {
            *m = m.replace(id, "<id>");
        }
        if let Some(v) = &mut a.structured {
            if let Some(o) = v.as_object_mut() {
                o.remove("run");
                o.remove("usage");
            }
            *v = serde_json::from_str(&v.to_string().replace(id, "<id>")).unwrap_or(Value::Null);
        }
        a
    }

    /// Everything it says, as one string (to search for a canary).
    pub fn all_text(&self) -> String {
        format!(
            "{:?} {} {}",
            self.rpc,
            self.text,
            self.structured
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default()
        )
    }
}

fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

fn answer(r: Result<CallToolResult, rmcp::ServiceError>) -> ToolAnswer {
    match r {
        Ok(r) => ToolAnswer {
            rpc: Ok(()),
            is_error: r.is_error.unwrap_or(false),
            text: r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("\n"),
            structured: r.structured_content,
        },
        Err(e) => ToolAnswer {
            rpc: Err(e.to_string()),
            is_error: true,
            text: String::new(),
            structured: None,
        },
    }
}

/// Call `tool` with `args` (an object) and wait for the answer.
pub async fn call(client: &Client, tool: &'static str, args: Value) -> ToolAnswer {
    let params = CallToolRequestParams::new(tool).with_arguments(obj(args));
    answer(client.call_tool(params).await)
}

/// `execute_code` with these arguments.
pub async fn exec(client: &Client, args: Value) -> ToolAnswer {
    call(client, "execute_code", args).await
}

/// `create_session` for `client`: the new session's id.
pub async fn session(client: &Client) -> Result<String, String> {
    let a = call(client, "create_session", json!({})).await;
    a.structured
        .as_ref()
        .and_then(|v| v["session_id"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("create_session failed: {}", a.all_text()))
}

/// A Python cell (in `sid` if given), with a wall limit of `timeout` s.
pub async fn python(client: &Client, sid: Option<&str>, code: &str, timeout: u64) -> ToolAnswer {
    let timeout = timeout.saturating_mul(time_scale());
    let mut args = json!({"language": "python", "code": code, "timeout_seconds": timeout});
    if let Some(s) = sid {
        args["session_id"] = json!(s);
    }
    exec(client, args).await
}

/// `execute_code` with `args` on its own task, so that other calls can be
/// made while it runs.
pub fn spawn_exec(client: &Client, args: Value) -> tokio::task::JoinHandle<ToolAnswer> {
    let peer = client.peer().clone();
    tokio::spawn(async move {
        let params = CallToolRequestParams::new("execute_code").with_arguments(obj(args));
        answer(peer.call_tool(params).await)
    })
}

/// Await a task of [`spawn_exec`].
pub async fn join(task: tokio::task::JoinHandle<ToolAnswer>) -> Result<ToolAnswer, String> {
    task.await.map_err(|e| format!("a call's task failed: {e}"))
}

impl ToolAnswer {
    /// The result's `status` (empty when there is no structured result).
    pub fn status(&self) -> String {
        self.field("status")
    }

    /// The result's `stdout`.
    pub fn stdout(&self) -> String {
        self.field("stdout")
    }

    fn field(&self, name: &str) -> String {
        self.structured
            .as_ref()
            .and_then(|v| v[name].as_str())
            .unwrap_or_default()
            .to_owned()
    }
}

/// Host processes (by pid) with an open descriptor whose target contains
/// `token`, read from the host's `/proc/*/fd` (the attacker cannot hide
/// from it or fake it).
pub fn holders(token: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|t| t.to_string_lossy().contains(token))
                .unwrap_or(false)
        }) {
            found.push(pid);
        }
    }
    found
}

/// Wait (at most `within`) until some host process holds a file named
/// with `token` open; those processes.
pub async fn wait_holders(token: &str, within: Duration) -> Result<Vec<i32>, String> {
    let t0 = std::time::Instant::now();
    loop {
        let h = holders(token);
        if !h.is_empty() {
            return Ok(h);
        }
        if t0.elapsed() > within {
            return Err(format!(
                "no process opened the file {token} within {within:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One line of `/proc/<pid>/<file>` that starts with `key`, as the host
/// sees it.
pub fn proc_line(pid: i32, file: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(key))
        .map(str::to_owned)
}

/// How many times longer a cell may take than on a host of its own:
/// `CELLBOX_TEST_TIME_SCALE` (1 by default; the cgroup v2 VM, an emulated
/// machine several times slower, sets it; tests/vm.rs).
pub fn time_scale() -> u64 {
    std::env::var_os("CELLBOX_TEST_TIME_SCALE")
        .and_then(|v| v.to_str().and_then(|v| v.parse().ok()))
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}
