//! A hostile upstream MCP server floods its tool list, to make the
//! supervisor hold (or wait for) what it lists: pages of many tools
//! without end (`count`), tools with descriptions of 1 MiB (`descriptions`)
//! or input schemas of 1 MiB (`schemas`), empty pages without end
//! (`pages`), and one page just under the transport's bound whose single
//! schema is 15 MiB of tiny properties (`wide`: the most memory parsing a
//! page can take). Served over streamable HTTP from this process, which
//! counts the pages and bytes it sent; and the fake stdio server's own
//! floods (`--list many|huge|endless|deep`). A tenant's cell calls a tool
//! of the server, which makes the supervisor connect and list.
//!
//! Evidence (the host's view): the pages and bytes the upstream sent, the
//! supervisor's peak memory growth during the call (`VmHWM` of
//! `/proc/PID/status`, reset before each call through `clear_refs`), how
//! long the call took against its `timeout_ms` of 600 s, and the error the
//! cell got. Defence (`MAX_UPSTREAM_TOOLS`, `MAX_TOOL_LIST_BYTES`,
//! `MAX_TOOL_LIST_PAGES`, the transport's message bounds, the most JSON
//! values one message may hold, checked before it is parsed): the call fails
//! at once naming the bound passed, the upstream is read no further than
//! one page past it, and the supervisor's peak grows by less than a fixed
//! allowance. Control: a list just under the bounds (15 pages, 960 tools,
//! 7.5 MiB) is read whole, its tools are callable, and the supervisor's
//! peak is seen growing with it: a flood read without the bounds would be
//! read until the timeout and show in the same measures.

use super::harness::{fake_upstream, python, AgentServe};
use super::{Env, Outcome};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// What the supervisor's peak may grow by in one flooded listing: the
/// transport's 16 MiB message (read, then scanned before it is parsed),
/// the list's 8 MiB, and room for the cell's call. (Before messages were
/// bounded by their count of values, a page of 13 MiB of tiny schema
/// properties took the peak up by 289 MiB.)
const ALLOWANCE: u64 = 64 * MIB;

/// A tool list that attacks its client (see the module's documentation),
/// counting what it sends.
#[derive(Clone)]
struct Flood {
    mode: &'static str,
    pages: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

/// A schema of `bytes` of small properties.
fn fat_schema(bytes: usize) -> Value {
    let properties: Map<String, Value> = (0..bytes / 16)
        .map(|i| (format!("p{i:07}"), json!({})))
        .collect();
    json!({"type": "object", "properties": properties})
}

impl ServerHandler for Flood {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("flood", "0.0.1"))
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
        let tool = |i: usize, description: String, s: Value| {
            Tool::new(format!("t{page}_{i}"), description, schema(s))
        };
        let plain = || json!({"type": "object"});
        let (tools, last): (Vec<Tool>, bool) = match self.mode {
            "count" => (
                (0..200)
                    .map(|i| tool(i, "a tool".into(), plain()))
                    .collect(),
                false,
            ),
            "descriptions" => (
                (0..4)
                    .map(|i| tool(i, "d".repeat(1 << 20), plain()))
                    .collect(),
                false,
            ),
            "schemas" => (
                (0..4)
                    .map(|i| tool(i, "s".into(), fat_schema(1 << 20)))
                    .collect(),
                false,
            ),
            "wide" => (vec![tool(0, "w".into(), fat_schema(15 << 20))], false),
            "control" => (
                (0..64)
                    .map(|i| tool(i, "c".repeat(8 << 10), plain()))
                    .collect(),
                page == 14,
            ),
            // "pages"
            _ => (Vec::new(), false),
        };
        let mut r = ListToolsResult::with_all_items(tools);
        if !last {
            r.next_cursor = Some((page + 1).to_string());
        }
        self.pages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            serde_json::to_vec(&r).map_or(0, |v| v.len()),
            Ordering::Relaxed,
        );
        Ok(r)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(
            CallToolResult::success(vec![ContentBlock::text(format!("called {}", request.name))])
                .into(),
        )
    }
}

/// A `/proc/PID/status` field, in bytes.
fn status_bytes(pid: i32, key: &str) -> Result<u64, String> {
    let line = crate::tenancy::harness::proc_line(pid, "status", key)
        .ok_or_else(|| format!("no {key} for the server"))?;
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("unreadable {line:?}"))
}

/// Reset the peak memory of process `pid` to what it holds now.
fn reset_peak(pid: i32) -> Result<(), String> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .map_err(|e| format!("failed to reset the peak of {pid}: {e}"))
}

/// What one call through a flooded upstream showed.
struct Seen {
    said: String,
    grew: u64,
    took: Duration,
}

/// A cell of the server's tenant calling tool `tool` of upstream `up`;
/// what it said, the supervisor's peak growth and the time taken.
fn through(env: &Env, serve: &AgentServe, tool: &str) -> Result<Seen, String> {
    let client = serve.client(env)?;
    reset_peak(serve.pid())?;
    let before = status_bytes(serve.pid(), "VmRSS")?;
    let code = format!(
        "try:\n    r = tool_call({tool:?}, {{}})\nexcept Exception as e:\n    r = 'error: ' + str(e)\nr"
    );
    let t0 = Instant::now();
    let a = env
        .rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(150), python(&client, None, &code, 140)).await
        })
        .map_err(|_| "the cell did not answer within 150 s".to_owned())?;
    let took = t0.elapsed();
    let peak = status_bytes(serve.pid(), "VmHWM")?;
    if a.status() != "ok" {
        return Err(format!("the cell failed: {}", a.all_text()));
    }
    let said = a
        .structured
        .as_ref()
        .map(|v| v["value"].to_string())
        .unwrap_or_default();
    Ok(Seen {
        said,
        grew: peak.saturating_sub(before),
        took,
    })
}

fn config(target: &str) -> String {
    format!(
        "[server]\nlanguages = [\"python\"]\n[tools.up]\nkind = \"mcp\"\n{target}\n\
         timeout_ms = 600000\n[policy]\nallow = [\"up.*\"]\n"
    )
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let mut evidence = Vec::new();
    let mut blocked = true;
    // Over HTTP, from this process: what it sent is counted.
    let start = |mode: &'static str| -> Result<(Flood, String), String> {
        let flood = Flood {
            mode,
            pages: Arc::default(),
            bytes: Arc::default(),
        };
        let url = env
            .rt
            .block_on(cellbox::bench::tools::serve_mcp_http(flood.clone(), None))?;
        Ok((flood, url))
    };

    // Control: a list under every bound is read whole and held.
    let (flood, url) = start("control")?;
    let serve = AgentServe::start(env, &config(&format!("url = \"{url}/mcp\"")), &[])?;
    let seen = through(env, &serve, "up.t14_63")?;
    let sent = flood.bytes.load(Ordering::Relaxed) as u64;
    if !seen.said.contains("called t14_63") || flood.pages.load(Ordering::Relaxed) != 15 {
        return Err(format!(
            "the control list was not read whole: {} ({} pages sent)",
            seen.said,
            flood.pages.load(Ordering::Relaxed)
        ));
    }
    if seen.grew < sent / 2 {
        return Err(format!(
            "reading {} MiB of tools grew the supervisor's peak by only {} MiB: the measure \
             cannot see what a listing holds",
            sent / MIB,
            seen.grew / MIB
        ));
    }
    let control = format!(
        "a list of 960 tools in 15 pages ({} MiB sent) is read whole and its last tool called; \
         the supervisor's peak grew by {} MiB with it",
        sent / MIB,
        seen.grew / MIB
    );
    drop(serve);

    // The bound each flood passes first.
    let cases: [(&str, &str); 5] = [
        ("count", "lists more than 1024 tools"),
        ("descriptions", "lists tools of more than 8388608 bytes"),
        ("schemas", "a message of more than 262144 JSON values"),
        ("pages", "lists its tools in more than 64 pages"),
        ("wide", "a message of more than 262144 JSON values"),
    ];
    for (mode, want) in cases {
        let (flood, url) = start(mode)?;
        let serve = AgentServe::start(env, &config(&format!("url = \"{url}/mcp\"")), &[])?;
        let seen = through(env, &serve, "up.t0_0")?;
        let pages = flood.pages.load(Ordering::Relaxed);
        let sent = flood.bytes.load(Ordering::Relaxed) as u64;
        // No further than one page past the bound it passed.
        let read_past = pages > 65 || sent > (8 + 16) * MIB;
        let ok = seen.said.contains(want) && !read_past && seen.grew <= ALLOWANCE;
        blocked &= ok;
        evidence.push(format!(
            "http {mode}: {pages} pages, {} KiB sent; the peak grew {} MiB; {:.1} s of 600; {}",
            sent >> 10,
            seen.grew / MIB,
            seen.took.as_secs_f64(),
            if seen.said.contains(want) {
                format!("refused: {want}")
            } else {
                format!(
                    "answered {}",
                    seen.said.chars().take(160).collect::<String>()
                )
            }
        ));
    }

    // The fake stdio server's floods.
    let program = fake_upstream(&env.cellbox)?;
    for (mode, want) in [
        ("many", "lists more than 1024 tools"),
        ("huge", "lists tools of more than 8388608 bytes"),
        ("endless", "lists its tools in more than 64 pages"),
        ("deep", "nested deeper than 128 levels"),
    ] {
        let target = format!(
            "command = [{:?}, \"--list\", \"{mode}\"]",
            program.display().to_string()
        );
        let serve = AgentServe::start(env, &config(&target), &[])?;
        let seen = through(env, &serve, "up.echo")?;
        let ok = seen.said.contains(want) && seen.grew <= ALLOWANCE;
        blocked &= ok;
        evidence.push(format!(
            "stdio {mode}: the peak grew {} MiB; {:.1} s of 600; {}",
            seen.grew / MIB,
            seen.took.as_secs_f64(),
            if seen.said.contains(want) {
                format!("refused: {want}")
            } else {
                format!(
                    "answered {}",
                    seen.said.chars().take(160).collect::<String>()
                )
            }
        ));
    }
    Ok(Outcome {
        control,
        blocked,
        evidence: evidence.join("; "),
    })
}
