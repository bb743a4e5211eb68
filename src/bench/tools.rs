//! `cellbox bench`: an upstream MCP tool call from a warm cell against the
//! same call made directly by an rmcp client, and `search_files` against
//! `rg` over the same generated tree.

use crate::{Policy, Supervisor};
use bytes::Bytes;
use http_body_util::Full;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Serve `server` over streamable HTTP on 127.0.0.1 (a free port) until the
/// runtime ends; with `token`, a request without `Authorization: Bearer
/// TOKEN` gets 401. Returns the URL.
pub async fn serve_mcp_http<S>(server: S, token: Option<String>) -> Result<String, String>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("failed to bind the MCP server: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let want = token.map(|t| format!("Bearer {t}"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            let want = want.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let service = service.clone();
                    let want = want.clone();
                    async move {
                        let got = req
                            .headers()
                            .get(http::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok());
                        if want.is_some() && got != want.as_deref() {
                            let mut r = http::Response::new(http_body_util::BodyExt::boxed(
                                Full::new(Bytes::new()),
                            ));
                            *r.status_mut() = http::StatusCode::UNAUTHORIZED;
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        let (parts, body) = req.into_parts();
                        let bytes = body_bytes(body).await;
                        Ok(service
                            .handle(http::Request::from_parts(parts, Full::new(bytes)))
                            .await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(format!("http://127.0.0.1:{port}/mcp"))
}

/// A request's body, read whole (empty when it breaks off).
pub async fn body_bytes(body: hyper::body::Incoming) -> Bytes {
    http_body_util::BodyExt::collect(body)
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default()
}

/// An MCP server with one tool, `echo {text}`, answered at once.
#[derive(Clone, Default)]
pub struct EchoServer;

impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("echo", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"]});
        let schema = match schema {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "echo",
            "Echo text.",
            Arc::new(schema),
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The tools lines of the report: an upstream MCP tool call, and
/// `search_files` against `rg`.
pub async fn run(n: usize) -> Result<String, String> {
    let mut out = upstream_round_trip(n).await?;
    out.push_str(&search_vs_rg(5).await?);
    Ok(out)
}

/// Rounds of the upstream line.
const ROUNDS: usize = 5;

/// The report line: per call, directly by an rmcp client and from a warm
/// Rhai cell (a loop of calls less the same loop without them).
pub async fn upstream_round_trip(n: usize) -> Result<String, String> {
    let n = n.max(1);
    let url = serve_mcp_http(EchoServer, None).await?;
    let client = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url.as_str(),
        ))
        .await
        .map_err(|e| format!("the bench client could not connect: {e}"))?;
    let args = json!({"text": "x"})
        .as_object()
        .cloned()
        .unwrap_or_default();
    let call = || client.call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone()));
    call().await.map_err(|e| e.to_string())?;
    // The same rmcp client over the kept-alive connections the supervisor
    // uses, for the ratio that leaves connection reuse out.
    let pooled = crate::tools::upstream_http::PooledClient::new(reqwest::Client::new());
    let kept = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::with_client(
            pooled,
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.as_str(),
            ),
        ))
        .await
        .map_err(|e| format!("the bench client could not connect: {e}"))?;
    let call_kept =
        || kept.call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone()));
    call_kept().await.map_err(|e| e.to_string())?;

    let target = crate::tools::upstream::Target::new("up", Vec::new(), Some(url), None)
        .map_err(|e| e.to_string())?;
    let cap = crate::tools::upstream::capability("up", "", target, 10_000, 1 << 20, true)
        .map_err(|e| e.to_string())?;
    // A host capability that does nothing: what any call from a cell costs.
    let noop = crate::Capability::new("noop", "", json!({"type": "object"}), |_, _| async {
        Ok(Value::Null)
    })
    .map_err(|e| e.to_string())?;
    let sup = Supervisor::builder()
        .warm(true)
        .capability(cap)
        .and_then(|b| b.capability(noop))
        .and_then(|b| b.build())
        .map_err(|e| e.to_string())?;
    let mut policy = Policy::deny_all().allow("up.*").allow("noop");
    // One session runs every bench cell: ROUNDS loops of n calls of each, and one.
    policy.max_tool_calls = u32::try_from(2 * ROUNDS * n + 1).unwrap_or(u32::MAX);
    policy.max_calls = policy.max_tool_calls;
    let session = super::bench_session(&sup, policy)?;
    let run = |code: String| super::timed_session_cell(&session, code);
    // The first call starts the connection; the cells after it are warm.
    run("tool_call(\"up.echo\", #{text: \"x\"})".into()).await?;
    // Rounds in turn: n direct calls, a cell looping n times without the
    // call and one with it, so a noisy neighbour slows both sides alike.
    let (mut direct, mut through, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let mut direct_kept = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..n {
            call().await.map_err(|e| e.to_string())?;
        }
        direct.push(t.elapsed() / n as u32);
        let t = Instant::now();
        for _ in 0..n {
            call_kept().await.map_err(|e| e.to_string())?;
        }
        direct_kept.push(t.elapsed() / n as u32);
        let empty = run(format!("for i in 0..{n} {{ }}")).await?;
        let looped = run(format!(
            "for i in 0..{n} {{ tool_call(\"up.echo\", #{{text: \"x\"}}); }}"
        ))
        .await?;
        through.push(looped.saturating_sub(empty) / n as u32);
        let nooped = run(format!("for i in 0..{n} {{ tool_call(\"noop\", #{{}}); }}")).await?;
        floor.push(nooped.saturating_sub(empty) / n as u32);
    }
    let _ = client.cancel().await;
    let _ = kept.cancel().await;
    let (direct, through, floor) = (median(direct), median(through), median(floor));
    let direct_kept = median(direct_kept);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    Ok(format!(
        "upstream MCP tool call round trip (streamable HTTP on 127.0.0.1, {n} calls, {ROUNDS} rounds)  direct rmcp client {:.3} ms  from a warm Rhai cell {:.3} ms  ({:.2}x; goal <= 1.2x; a call of a host capability that does nothing {:.3} ms; direct over kept-alive connections as the supervisor's {:.3} ms, {:.2}x)\n",
        ms(direct),
        ms(through),
        ratio(through, direct),
        ms(floor),
        ms(direct_kept),
        ratio(through, direct_kept),
    ))
}

/// Write a tree of `dirs` x `files` files of `lines` lines, with a
/// .gitignore'd directory, one line in 1000 holding the needle.
fn generate_tree(
    root: &std::path::Path,
    dirs: usize,
    files: usize,
    lines: usize,
) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::write(root.join(".gitignore"), "ignored/\n")?;
    let mut k = 0usize;
    for d in 0..dirs {
        let dir = root.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..files {
            let mut w =
                std::io::BufWriter::new(std::fs::File::create(dir.join(format!("f{f:03}.txt")))?);
            for l in 0..lines {
                k += 1;
                if k.is_multiple_of(1000) {
                    writeln!(w, "line {l} of file {f}: the needle_{k} is here")?;
                } else {
                    writeln!(w, "line {l} of file {f}: lorem ipsum dolor sit amet {k}")?;
                }
            }
        }
    }
    let ignored = root.join("ignored");
    std::fs::create_dir_all(&ignored)?;
    std::fs::write(ignored.join("x.txt"), "needle_0 ignored\n")?;
    Ok(())
}

/// The report line: `search_files` (all matches) against `rg` over the
/// same generated tree, medians of `runs` alternating runs.
pub async fn search_vs_rg(runs: usize) -> Result<String, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let rg = std::env::split_paths(&path)
        .map(|d| d.join("rg"))
        .find(|p| p.is_file());
    let Some(rg) = rg else {
        return Ok(
            "search_files vs rg: NOT MEASURED: rg (ripgrep) is not on PATH; install it (apt-get install -y ripgrep)\n"
                .into(),
        );
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (dirs, files, lines) = (40, 100, 200);
    generate_tree(dir.path(), dirs, files, lines)
        .map_err(|e| format!("generating the tree: {e}"))?;
    let total = dirs * files * lines;
    let matches = total / 1000;
    let config = crate::files::FilesConfig {
        roots: vec![dir.path().to_path_buf()],
        ..crate::files::FilesConfig::default()
    };
    let f = Arc::new(crate::files::Files::open(&config).map_err(|e| e.to_string())?);
    let caps = crate::files::capabilities(f).map_err(|e| e.to_string())?;
    let search = caps
        .into_iter()
        .find(|c| c.name() == "search_files")
        .ok_or("search_files is not offered")?;
    let args = json!({"pattern": "needle_[0-9]+", "max_results": (matches + 10).min(crate::files::MAX_SEARCH_RESULTS)})
        .as_object()
        .cloned()
        .unwrap_or_default();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut found = 0;
    for _ in 0..runs.max(1) + 1 {
        let t = Instant::now();
        let v = search
            .call_direct(
                args.clone(),
                None,
                tokio_util::sync::CancellationToken::new(),
            )
            .await?;
        ours.push(t.elapsed());
        found = v
            .get("matches")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let t = Instant::now();
        let out = std::process::Command::new(&rg)
            .args(["-n", "--no-heading", "needle_[0-9]+", "."])
            .current_dir(dir.path())
            .stderr(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", rg.display()))?;
        theirs.push(t.elapsed());
        if !out.status.success() {
            return Err(format!("{} failed: {}", rg.display(), out.status));
        }
    }
    // The first run of each warms the page cache.
    ours.remove(0);
    theirs.remove(0);
    let (a, b) = (median(ours), median(theirs));
    Ok(format!(
        "search_files vs rg ({} files, {total} lines, {found} matches)  search_files {:.2} ms  rg {:.2} ms  ({:.2}x; goal <= 1.5x)\n",
        dirs * files,
        a.as_secs_f64() * 1000.0,
        b.as_secs_f64() * 1000.0,
        a.as_secs_f64() / b.as_secs_f64().max(1e-9)
    ))
}
