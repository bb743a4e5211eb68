//! A fake upstream MCP server (rmcp's server side), served over stdio by
//! `examples/fake_mcp_upstream.rs` and over streamable HTTP by the tests.
//!
//! Tools: `echo {text}` (JSON text), `add {a, b}` (structured), `count
//! {items}` (plain text), `fail` (an `isError` result), `crash` (the server
//! exits mid-call), `hang` (never answers), `garbage` (writes a line that is
//! not JSON to stdout and never answers), `json_not_rpc` (writes a JSON
//! line that is not a JSON-RPC message and never answers), `huge` (writes
//! a 6 MiB line and never answers), `pid` (the server's pid), `spawn_child` (a `sleep
//! 1000` in the server's process group, which outlives the server unless
//! the group is killed), `env` (the server's whole environment), `headers`
//! (over HTTP: the headers of the request that called it), `log {text}`
//! (writes text on stderr), `store {text}` and `read` (a stateful pair:
//! what was stored on this connection, kept per process for stdio and per
//! MCP session over HTTP). In the `text` of `garbage` (default: "this is
//! not JSON at all") and `log`, `${NAME}` stands for the server's
//! environment variable NAME. With `FAKE_LISTED` in its environment, it
//! also lists `listed`, whose description, (required) parameter name and
//! the one value its parameter takes are that variable's text, expanded
//! so.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct FakeUpstream;

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "echo",
            "Echo text back as JSON.",
            schema(
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}),
            ),
        ),
        Tool::new(
            "add",
            "Add two numbers.",
            schema(
                json!({"type": "object", "properties": {"a": {"type": "number"},
                          "b": {"type": "number"}}, "required": ["a", "b"]}),
            ),
        ),
        Tool::new(
            "count",
            "Count items.",
            schema(
                json!({"type": "object", "properties": {"items": {"type": "array"}},
                          "required": ["items"]}),
            ),
        ),
        Tool::new("fail", "Fail.", schema(json!({"type": "object"}))),
        Tool::new("crash", "Exit mid-call.", schema(json!({"type": "object"}))),
        Tool::new("hang", "Never answer.", schema(json!({"type": "object"}))),
        Tool::new(
            "garbage",
            "Write something that is not JSON.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "json_not_rpc",
            "Write JSON that is not JSON-RPC.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "huge",
            "Write a line of 6 MiB.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "pid",
            "The server's pid.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "store",
            "Keep a text on this connection.",
            schema(
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}),
            ),
        ),
        Tool::new(
            "read",
            "What was stored on this connection.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "spawn_child",
            "Start `sleep 1000` in the server's process group; its pid.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "env",
            "The server's environment.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "headers",
            "The headers of the HTTP request that called this tool.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "log",
            "Write text on stderr.",
            schema(
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}),
            ),
        ),
    ]
}

/// `text` with each `${NAME}` replaced by the environment variable NAME.
fn expand(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        match rest[i + 2..].find('}') {
            Some(j) => {
                let name = &rest[i + 2..i + 2 + j];
                out.push_str(&std::env::var_os(name).unwrap_or_default().to_string_lossy());
                rest = &rest[i + 3 + j..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// What `store` kept, by connection: the MCP session id over HTTP, "" for
/// the one connection of a stdio process.
static STORED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn connection_of(ctx: &RequestContext<RoleServer>) -> String {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Write `bytes` on stdout beside rmcp's messages, and never answer.
async fn raw_and_hang(bytes: Vec<u8>) -> CallToolResult {
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&bytes);
        let _ = out.flush();
    }
    std::future::pending().await
}

impl ServerHandler for FakeUpstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("fake-upstream", "0.0.1"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut all = tools();
        if let Some(text) = std::env::var_os("FAKE_LISTED") {
            let text = expand(&text.to_string_lossy());
            let mut properties = Map::new();
            properties.insert(text.clone(), json!({"type": "string", "enum": [text]}));
            all.push(Tool::new(
                "listed",
                text.clone(),
                schema(json!({"type": "object", "properties": properties, "required": [text]})),
            ));
        }
        Ok(ListToolsResult::with_all_items(all))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let conn = connection_of(&context);
        let r = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(
                json!({"echo": args.get("text")}).to_string(),
            )]),
            "add" => {
                let n = |k: &str| args.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                CallToolResult::structured(json!({"sum": n("a") + n("b")}))
            }
            "count" => {
                let n = args
                    .get("items")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                CallToolResult::success(vec![ContentBlock::text(format!("{n} items"))])
            }
            "fail" => CallToolResult::error(vec![ContentBlock::text("it failed on purpose")]),
            "crash" => std::process::exit(3),
            "hang" => std::future::pending().await,
            "garbage" => {
                let text = args
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("this is not JSON at all");
                raw_and_hang(format!("{}\n", expand(text)).into_bytes()).await
            }
            "json_not_rpc" => raw_and_hang(b"{\"hello\": \"world\"}\n".to_vec()).await,
            "huge" => {
                let mut line = vec![b'x'; 6 << 20];
                line.push(b'\n');
                raw_and_hang(line).await
            }
            "pid" => CallToolResult::structured(json!({"pid": std::process::id()})),
            "store" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                if let Ok(mut s) = STORED.lock() {
                    s.push((conn, text.to_owned()));
                }
                CallToolResult::structured(json!({"stored": text}))
            }
            "read" => {
                let mine: Vec<String> = STORED
                    .lock()
                    .map(|s| {
                        s.iter()
                            .filter(|(c, _)| *c == conn)
                            .map(|(_, t)| t.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                CallToolResult::structured(json!({"stored": mine}))
            }
            "spawn_child" => match std::process::Command::new("sleep")
                .arg("1000")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
            {
                Ok(c) => CallToolResult::structured(json!({"pid": c.id()})),
                Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
            },
            "env" => CallToolResult::structured(json!({
                "env": std::env::vars_os()
                    .map(|(k, v)| (k.to_string_lossy().into_owned(),
                                   Value::String(v.to_string_lossy().into_owned())))
                    .collect::<Map<String, Value>>()
            })),
            "headers" => {
                let headers: Map<String, Value> = context
                    .extensions
                    .get::<http::request::Parts>()
                    .map(|p| {
                        p.headers
                            .iter()
                            .map(|(k, v)| {
                                (
                                    k.to_string(),
                                    Value::String(
                                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                    ),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                CallToolResult::structured(json!({ "headers": headers }))
            }
            "log" => {
                eprintln!(
                    "{}",
                    expand(args.get("text").and_then(Value::as_str).unwrap_or(""))
                );
                CallToolResult::structured(json!({"logged": true}))
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(r.into())
    }
}

/// A fake upstream whose tool list attacks the client: `many` (pages of
/// 100 tools, without end), `huge` (pages of three tools of 1 MiB each,
/// without end), `endless` (empty pages, each naming a next one) or `deep`
/// (a tool whose schema nests 200 levels). Its tools answer as
/// [`FakeUpstream`]'s.
#[derive(Clone)]
pub struct OddList(pub &'static str);

/// A schema nesting `depth` objects.
fn nested(depth: usize) -> Value {
    let mut v = json!({"type": "string"});
    for _ in 0..depth {
        v = json!({"type": "object", "properties": {"a": v}});
    }
    v
}

impl ServerHandler for OddList {
    fn get_info(&self) -> ServerConfig {
        FakeUpstream.get_info()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let page: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let tool = |i: usize, description: String| {
            Tool::new(
                format!("t{page}_{i}"),
                description,
                schema(json!({"type": "object"})),
            )
        };
        let tools = match self.0 {
            "many" => (0..100).map(|i| tool(i, "a tool".into())).collect(),
            "huge" => (0..3).map(|i| tool(i, "x".repeat(1 << 20))).collect(),
            "deep" => {
                let mut t = tools();
                t.push(Tool::new("deep", "Nested.", schema(nested(200))));
                return Ok(ListToolsResult::with_all_items(t));
            }
            _ => Vec::new(),
        };
        let mut r = ListToolsResult::with_all_items(tools);
        r.next_cursor = Some((page + 1).to_string());
        // Asks the client to keep each page for an hour.
        r.ttl_ms = Some(3_600_000);
        Ok(r)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        FakeUpstream.call_tool(request, context).await
    }
}
