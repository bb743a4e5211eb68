//! `cellbox serve` through a real MCP client (rmcp): over stdio with the
//! server as a child process, and over streamable HTTP.

use super::common::procs::process_stats;
use super::common::serve::{http_serve, json_lines, send_line, PATIENCE};
use super::common::{self, bin, forged_done, holders_of, is_spare};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, JsonObject, ProgressNotificationParam,
    Request, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {PATIENCE:?}"),
    }
}

/// An MCP client that records the progress notifications it receives.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Arc<Mutex<Vec<Value>>>,
}

impl ClientHandler for Recorder {
    #[allow(deprecated)] // the server streams output as logging notifications
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params.data);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }
}

type Client = RunningService<RoleClient, Recorder>;

/// A `cellbox serve` over stdio, spawned by rmcp's child-process transport.
struct StdioServer {
    client: Client,
    pid: i32,
    recorder: Recorder,
}

async fn stdio_server(args: &[&str]) -> StdioServer {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("serve").args(args);
    let transport = TokioChildProcess::new(cmd).unwrap();
    let pid = transport.id().unwrap() as i32;
    let recorder = Recorder::default();
    let client = within("initialize", recorder.clone().serve(transport))
        .await
        .unwrap();
    StdioServer {
        client,
        pid,
        recorder,
    }
}

fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    within(
        tool,
        client.call_tool(CallToolRequestParams::new(tool).with_arguments(obj(args))),
    )
    .await
    .unwrap()
}

/// Run `code` through execute_code; returns (structuredContent, isError, text).
async fn exec(client: &Client, args: Value) -> (Value, bool, String) {
    let r = call(client, "execute_code", args).await;
    let text = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    let structured = r.structured_content.clone().expect("structuredContent");
    (structured, r.is_error.expect("isError is set"), text)
}

async fn tools(client: &Client) -> Vec<Tool> {
    within("tools/list", client.list_all_tools()).await.unwrap()
}

fn tool<'a>(tools: &'a [Tool], name: &str) -> &'a Tool {
    tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// A validator for the output schema `execute_code` declares.
/// A validator of `execute_code`'s listed output schema, or of the compact
/// one when the listing names none (the default, short listing).
fn output_validator(tools: &[Tool]) -> jsonschema::Validator {
    let schema = tool(tools, "execute_code")
        .output_schema
        .as_deref()
        .cloned()
        .unwrap_or_else(cellbox::serve::schema::cell_result_compact);
    jsonschema::validator_for(&Value::Object(schema)).unwrap()
}

/// `result` matches the output schema listed (`v`) and the full one too
/// (every nested part typed; see `--output-schema`).
fn assert_conforms(v: &jsonschema::Validator, result: &Value) {
    let errors: Vec<String> = v.iter_errors(result).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "result does not match outputSchema: {errors:?}\n{result:#}"
    );
    // Compiled once for the whole suite.
    static FULL: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| {
        jsonschema::validator_for(&Value::Object(cellbox::serve::schema::cell_result())).unwrap()
    });
    let errors: Vec<String> = FULL.iter_errors(result).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "result does not match the full output schema: {errors:?}\n{result:#}"
    );
}

/// Every process below `root` (zombies included), except fork-server spares
/// waiting for a cell.
fn descendants(root: i32) -> Vec<i32> {
    let mut found = common::descendants(root);
    found.retain(|p| !is_spare(*p));
    found
}

/// The server's own children (its Python zygotes and Rhai fork server).
fn helpers(server_pid: i32) -> Vec<i32> {
    process_stats()
        .into_iter()
        .filter(|p| p.ppid == server_pid)
        .map(|p| p.pid)
        .collect()
}

/// User and system CPU time of `pid`, in clock ticks (0 once it is gone).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    // After the name: state is the 1st field, utime the 12th, stime the 13th.
    after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

/// Stat line and command line of each pid, for failure messages.
fn show(pids: &[i32]) -> String {
    pids.iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            format!("{p}: {} | {cmd}", stat.trim())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Wait for the server to have processes beyond `baseline` (its idle
/// helpers, such as a fork server), and return those: the cell's worker.
async fn wait_for_workers(server_pid: i32, baseline: &[i32]) -> Vec<i32> {
    wait_for_descendants(server_pid, baseline, "a worker", |_| true).await
}

/// Wait for Rhai cells (fork-server children given a cell, named
/// `cellbox-cell`) below the server beyond `baseline`, and return them.
async fn wait_for_rhai_cells(server_pid: i32, baseline: &[i32]) -> Vec<i32> {
    let is_cell = |p| common::procs::comm(p) == "cellbox-cell";
    wait_for_descendants(server_pid, baseline, "a Rhai cell", is_cell).await
}

/// Wait for processes below the server, beyond `baseline`, that `keep`
/// accepts (`what` names them), and return them.
async fn wait_for_descendants(
    server_pid: i32,
    baseline: &[i32],
    what: &str,
    keep: impl Fn(i32) -> bool,
) -> Vec<i32> {
    let t0 = Instant::now();
    loop {
        let d: Vec<i32> = descendants(server_pid)
            .into_iter()
            .filter(|p| !baseline.contains(p) && keep(*p))
            .collect();
        if !d.is_empty() {
            return d;
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "the server {server_pid} never started {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What server `pid` made on the host: its scratch root and the sessions
/// in it, its cgroups.
fn server_leftovers(pid: i32) -> Vec<std::path::PathBuf> {
    let mine = |dir: &str, prefix: String| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut v = mine(
        &std::env::temp_dir().to_string_lossy(),
        format!("cellbox-scratch-{pid}-"),
    );
    for c in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpuacct"] {
        v.extend(mine(c, format!("cellbox-{pid}-")));
    }
    v
}

/// Processes below the server that are not among its idle helpers.
fn extra(server_pid: i32, baseline: &[i32]) -> Vec<i32> {
    descendants(server_pid)
        .into_iter()
        .filter(|p| !baseline.contains(p))
        .collect()
}

/// Wait until none of `pids` exists any more (killed and reaped).
async fn wait_gone(pids: &[i32], what: &str) {
    let t0 = Instant::now();
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| exists(*p)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "{what}: processes {left:?} are still there: {:?}\n{}",
            process_stats()
                .into_iter()
                .filter(|p| left.contains(&p.pid))
                .map(|p| (p.pid, p.ppid, p.state))
                .collect::<Vec<_>>(),
            show(&left)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- stdio --

#[tokio::test]
async fn tools_are_listed_with_generated_descriptions_and_schemas() {
    let s = stdio_server(&[
        "--timeout",
        "7",
        "--max-output",
        "2048",
        "--max-sessions",
        "5",
        "--session-idle-expiry",
        "90",
        "--allow",
        "emit",
        "--max-concurrency",
        "3",
    ])
    .await;
    let tools = tools(&s.client).await;
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "aggregate_context",
            "checkpoint_session",
            "close_session",
            "create_session",
            "download_file",
            "execute_code",
            "list_files",
            "list_sessions",
            "reset_session",
            "restore_session",
            "upload_file"
        ]
    );
    // The short listing names no output schema (results still carry
    // structuredContent); `--output-schema` lists one: below.
    for t in &tools {
        assert!(
            t.output_schema.is_none(),
            "{} lists an outputSchema",
            t.name
        );
        jsonschema::validator_for(&Value::Object((*t.input_schema).clone())).unwrap();
    }
    let exec_tool = tool(&tools, "execute_code");
    let d = exec_tool.description.as_deref().unwrap();
    for needle in [
        "wall clock 7 s",
        "2 KiB of stdout",
        "after 90 s",
        "at most 5 sessions",
        "emit(event)",
        "At most 3 cells run at once",
        "What persists",
        "profile \"python\":",
        "layers applied on this host:",
        "network:",
    ] {
        assert!(d.contains(needle), "missing {needle:?} in:\n{d}");
    }
    // Only what the policy allows is described.
    assert!(!d.contains("answer("), "{d}");
    // An allowed capability may reach out, so the world is not closed.
    let hints = exec_tool.annotations.as_ref().unwrap();
    assert_eq!(hints.open_world_hint, Some(true));
    assert_eq!(hints.read_only_hint, Some(false));
    let langs = &exec_tool.input_schema["properties"]["language"]["enum"];
    assert_eq!(langs, &json!(["bash", "python", "rhai", "shell"]));
    let required = &exec_tool.input_schema["required"];
    assert_eq!(required, &json!(["language", "code"]));

    let s2 = stdio_server(&["--language", "rhai", "--output-schema", "full"]).await;
    let tools = self::tools(&s2.client).await;
    for t in &tools {
        let output = t
            .output_schema
            .as_ref()
            .unwrap_or_else(|| panic!("{} declares no outputSchema", t.name));
        // A dialect named, so that a client checking each result with a
        // one-shot validator checks the schema against draft-07's
        // metaschema, not 2020-12's (see `schema::DIALECT`).
        assert_eq!(
            output.get("$schema"),
            Some(&json!(cellbox::serve::schema::DIALECT)),
            "{}'s outputSchema names no dialect",
            t.name
        );
        jsonschema::validator_for(&Value::Object((**output).clone())).unwrap();
    }
    let exec_tool = tool(&tools, "execute_code");
    assert_eq!(
        exec_tool.output_schema.as_deref(),
        Some(&cellbox::serve::schema::cell_result())
    );
    assert_eq!(
        exec_tool.input_schema["properties"]["language"]["enum"],
        json!(["rhai"])
    );
    let d = exec_tool.description.as_deref().unwrap();
    assert!(d.contains("none are allowed"), "{d}");
    assert!(!d.contains("python:"), "{d}");
    // A disabled language is refused as invalid arguments.
    let err = s2
        .client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "python", "code": "1"}))),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not available here"), "{err}");
    s.client.cancel().await.unwrap();
    s2.client.cancel().await.unwrap();
}

/// Bytes of a `tools/list` result as it goes over the wire.
fn listing_bytes(tools: &[Tool]) -> usize {
    serde_json::to_vec(&json!({ "tools": tools }))
        .unwrap()
        .len()
}

/// Every model connected reads `tools/list` on each request: by default it
/// says what a model needs to call each tool in at most 6 KB, for a server
/// as it comes and for one configured as a deployment typically is
/// (capabilities and a model allowed, its own limits and sessions). The
/// long form (`tool_descriptions = "long"`) keeps every detail and the
/// compact output schema.
#[tokio::test]
async fn the_default_tool_list_is_short_and_the_long_form_keeps_the_details() {
    const MAX: usize = 6000;
    let t = tempfile::tempdir().unwrap();
    let conf = t.path().join("serve.toml");
    std::fs::write(
        &conf,
        "[server]\npython = \"/usr/bin/python3\"\nmax_concurrency = 8\n\
         [sessions]\nmax_sessions = 32\nidle_expiry_seconds = 600\n\
         [limits]\ntimeout_ms = 60000\n\
         [policy]\nallow = [\"model_query\", \"model_query_batched\", \"run_cell\", \"emit\", \"answer\"]\n\
         max_model_calls = 50\n\
         [models.local]\nendpoint = \"http://127.0.0.1:9/v1\"\nmodel = \"m-1\"\n",
    )
    .unwrap();
    let conf = conf.to_str().unwrap();
    let plain = stdio_server(&[]).await;
    let typical = stdio_server(&["--config", conf]).await;
    let long = stdio_server(&["--config", conf, "--tool-descriptions", "long"]).await;
    let mut sizes = Vec::new();
    for (what, s) in [("default", &plain), ("typical", &typical)] {
        let listed = tools(&s.client).await;
        assert!(listed.len() >= 11, "{what}: {} tools", listed.len());
        let n = listing_bytes(&listed);
        assert!(
            n <= MAX,
            "{what}: tools/list is {n} bytes:\n{:#}",
            json!({ "tools": listed })
        );
        sizes.push((what, n));
    }
    let short = tools(&typical.client).await;
    let d = tool(&short, "execute_code").description.as_deref().unwrap();
    for needle in [
        "wall clock 60 s",
        "at most 32 sessions",
        "after 600 s",
        "At most 8 cells run at once",
        "run_cell(",
        "model_query(",
        "Models (the server makes the request; no key is visible to the code): local.",
        "at most 50 model queries",
        "network:",
        "standard library only",
    ] {
        assert!(d.contains(needle), "short: missing {needle:?} in:\n{d}");
    }
    let full = tools(&long.client).await;
    let n = listing_bytes(&full);
    assert!(n > MAX, "the long form is {n} bytes");
    let exec_tool = tool(&full, "execute_code");
    assert_eq!(
        exec_tool.output_schema.as_deref(),
        Some(&cellbox::serve::schema::cell_result_compact())
    );
    for t in &full {
        assert!(
            t.output_schema.is_some(),
            "{} lists no outputSchema",
            t.name
        );
    }
    let d = exec_tool.description.as_deref().unwrap();
    for needle in [
        "What persists: without session_id nothing does",
        "Python keeps every object alive between calls",
        "files: only the working directory (read-write); read-only:",
        "the cell is killed after it; status timeout",
        "ClientQueueFull",
        "the only way out of the sandbox",
        "llm_query_batched",
    ] {
        assert!(d.contains(needle), "long: missing {needle:?} in:\n{d}");
    }
    let checkpoint = tool(&full, "checkpoint_session");
    assert!(
        checkpoint
            .description
            .as_deref()
            .unwrap()
            .contains("lost if the server restarts"),
        "{checkpoint:?}"
    );
    println!("tools/list bytes: {sizes:?}, long form {n}");
    for s in [plain, typical, long] {
        s.client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn rhai_cell_result_matches_the_output_schema() {
    let s = stdio_server(&[]).await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);
    let (r, is_error, text) = exec(
        &s.client,
        json!({"language": "rhai", "code": "print(\"hello\"); 6 * 7"}),
    )
    .await;
    assert!(!is_error, "{r:#}");
    assert_eq!(r["status"], "ok");
    assert_eq!(r["value"], 42);
    assert_eq!(r["stdout"], "hello\n");
    assert!(text.contains("hello") && text.contains("=> 42"), "{text}");
    assert_conforms(&v, &r);

    // Truncation notes reach the text, and max_output_bytes only tightens.
    let (r, is_error, text) = exec(
        &s.client,
        json!({"language": "rhai",
               "code": "for i in 0..200 { print(\"line \" + i); }",
               "max_output_bytes": 64}),
    )
    .await;
    assert!(!is_error);
    assert!(r["truncated"]["stdout"].is_object(), "{r:#}");
    assert!(text.contains("stdout truncated"), "{text}");
    assert_conforms(&v, &r);
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn python_cell_result_matches_the_output_schema() {
    let s = stdio_server(&[]).await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);
    let (r, is_error, text) = exec(
        &s.client,
        json!({"language": "python", "code": "import math\nprint('hi')\nmath.factorial(5)"}),
    )
    .await;
    assert!(!is_error, "{r:#}");
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["value"], 120);
    assert_eq!(r["stdout"], "hi\n");
    assert!(text.contains("=> 120"), "{text}");
    assert_conforms(&v, &r);
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn sessions_keep_variables_between_calls() {
    let s = stdio_server(&["--max-sessions", "2"]).await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);
    let created = call(&s.client, "create_session", json!({})).await;
    assert_eq!(created.is_error, Some(false));
    let created = created.structured_content.unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();
    assert_eq!(created["max_sessions"], 2);

    // Rhai: a variable set in one call is there in the next.
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "rhai", "code": "let x = 41;", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["vars"]["changed"], json!(["x"]));
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "rhai", "code": "x + 1", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], 42);
    assert_eq!(r["execution_count"], 2);
    assert_conforms(&v, &r);

    // Python in the same session sees it too, and keeps its own.
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "python", "code": "y = x * 2\ndef f(a):\n    return a + y", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "python", "code": "f(1)", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], 83);

    // Without a session nothing carries over.
    let (r, e, _) = exec(&s.client, json!({"language": "rhai", "code": "x"})).await;
    assert!(e);
    assert_eq!(r["status"], "error");

    let listed = call(&s.client, "list_sessions", json!({}))
        .await
        .structured_content
        .unwrap();
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["session_id"], id.as_str());
    assert!(sessions[0]["variables"]
        .as_array()
        .unwrap()
        .contains(&json!("x")));
    // Nothing about the host: the warm workers (pids, scratch and cgroup
    // paths) are for `cellbox doctor` and the logs.
    assert_eq!(listed.get("pools"), None, "{listed}");
    for internal in ["/run/", "/tmp/", "cgroup", "pid"] {
        assert!(
            !listed.to_string().contains(internal),
            "{internal}: {listed}"
        );
    }

    // The cap on sessions.
    let second = call(&s.client, "create_session", json!({})).await;
    assert_eq!(second.is_error, Some(false));
    let third = call(&s.client, "create_session", json!({})).await;
    assert_eq!(third.is_error, Some(true));
    let msg = third.content[0].as_text().unwrap().text.clone();
    assert!(msg.contains("session limit of 2"), "{msg}");

    // reset forgets the namespace but keeps the session.
    let reset = call(&s.client, "reset_session", json!({"session_id": id})).await;
    assert_eq!(reset.is_error, Some(false));
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "rhai", "code": "x", "session_id": id}),
    )
    .await;
    assert!(e, "{r:#}");

    // close ends it.
    let closed = call(&s.client, "close_session", json!({"session_id": id})).await;
    assert_eq!(closed.is_error, Some(false));
    let (r, e, text) = exec(
        &s.client,
        json!({"language": "rhai", "code": "1", "session_id": id}),
    )
    .await;
    assert!(e);
    assert_eq!(r["error"]["type"], "UnknownSession");
    assert!(text.contains("create_session"), "{text}");
    assert_conforms(&v, &r);
    let again = call(&s.client, "close_session", json!({"session_id": id})).await;
    assert_eq!(again.is_error, Some(true));
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn closing_a_session_kills_its_running_cell() {
    let s = stdio_server(&["--max-operations", "0"]).await;
    tools(&s.client).await;
    let baseline = descendants(s.pid);
    let created = call(&s.client, "create_session", json!({}))
        .await
        .structured_content
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();
    let peer = s.client.peer().clone();
    let sid = id.clone();
    let pending = tokio::spawn(async move {
        peer.call_tool(CallToolRequestParams::new("execute_code").with_arguments(obj(
            json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600, "session_id": sid}),
        )))
        .await
    });
    let workers = wait_for_workers(s.pid, &baseline).await;
    let listed = call(&s.client, "list_sessions", json!({}))
        .await
        .structured_content
        .unwrap();
    assert_eq!(listed["sessions"][0]["busy"], true, "{listed:#}");
    let closed = call(&s.client, "close_session", json!({"session_id": id})).await;
    assert_eq!(closed.is_error, Some(false));
    let r = within("the running call", pending).await.unwrap().unwrap();
    assert_eq!(r.is_error, Some(true));
    let r = r.structured_content.unwrap();
    assert_eq!(r["status"], "killed", "{r:#}");
    wait_gone(&workers, "after close_session").await;
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn sessions_expire_when_idle() {
    let s = stdio_server(&["--session-idle-expiry", "1"]).await;
    let created = call(&s.client, "create_session", json!({}))
        .await
        .structured_content
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    loop {
        let listed = call(&s.client, "list_sessions", json!({}))
            .await
            .structured_content
            .unwrap();
        if listed["sessions"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(t0.elapsed() < PATIENCE, "session never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "rhai", "code": "1", "session_id": id}),
    )
    .await;
    assert!(e);
    assert_eq!(r["error"]["type"], "UnknownSession");
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn exceptions_and_timeouts_are_errors() {
    let s = stdio_server(&["--max-operations", "0"]).await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);

    let (r, e, text) = exec(
        &s.client,
        json!({"language": "rhai", "code": "let a = 1;\nthrow \"boom\";"}),
    )
    .await;
    assert!(e, "{r:#}");
    assert_eq!(r["status"], "error");
    assert!(
        text.contains("boom") && text.contains("[status: error]"),
        "{text}"
    );
    assert_conforms(&v, &r);

    let (r, e, text) = exec(
        &s.client,
        json!({"language": "python", "code": "def f():\n    raise ValueError('boom')\nf()"}),
    )
    .await;
    assert!(e, "{r:#}");
    assert_eq!(r["status"], "error");
    assert_eq!(r["error"]["type"], "ValueError");
    assert!(text.contains("Traceback"), "{text}");
    assert_eq!(text.matches("ValueError: boom").count(), 1, "{text}");
    assert_conforms(&v, &r);

    let (r, e, text) = exec(
        &s.client,
        json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 0.5}),
    )
    .await;
    assert!(e, "{r:#}");
    assert_eq!(r["status"], "timeout");
    assert!(text.contains("[status: timeout]"), "{text}");
    assert_conforms(&v, &r);

    let (r, e, _) = exec(
        &s.client,
        json!({"language": "python", "code": "while True:\n    pass", "timeout_seconds": 0.5}),
    )
    .await;
    assert!(e, "{r:#}");
    assert_eq!(r["status"], "timeout");

    // A per-call timeout above the configured one is lowered, not honoured
    // (were it honoured, this call would outlast `within`'s patience).
    let s2 = stdio_server(&["--timeout", "0.5", "--max-operations", "0"]).await;
    let (r, e, _) = exec(
        &s2.client,
        json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 3600}),
    )
    .await;
    assert!(e);
    assert_eq!(r["status"], "timeout");
    s.client.cancel().await.unwrap();
    s2.client.cancel().await.unwrap();
}

/// Start a never-ending cell, cancel the request, and see the worker gone.
async fn cancel_kills(language: &str, code: &str) {
    let s = stdio_server(&["--max-operations", "0"]).await;
    // tools/list waits for the startup probe, so its cells are gone; what
    // is left are the supervisor's idle helpers (its own children) and the
    // session prepared for the first call without one, whose worker is the
    // cell's.
    tools(&s.client).await;
    let baseline = helpers(s.pid);
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(
        json!({"language": language, "code": code, "timeout_seconds": 600}),
    ));
    let handle = within(
        "send",
        s.client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        ),
    )
    .await
    .unwrap();
    // Once the cell runs (its worker may have been waiting before the
    // call), every process beyond the helpers is the cell's session's.
    let running = |p: i32| match language {
        "rhai" => common::procs::comm(p) == "cellbox-cell",
        "shell" => common::procs::comm(p) == "sleep",
        // The endless loop: more CPU time than a worker waiting for its
        // cell ever takes.
        _ => cpu_ticks(p) >= 20,
    };
    wait_for_descendants(s.pid, &baseline, "the cell", running).await;
    let workers = extra(s.pid, &baseline);
    handle.cancel(Some("test".into())).await.unwrap();
    wait_gone(&workers, "after notifications/cancelled").await;
    let left = extra(s.pid, &baseline);
    assert!(left.is_empty(), "{}", show(&left));
    // The server goes on serving.
    let (r, e, _) = exec(&s.client, json!({"language": "rhai", "code": "1 + 1"})).await;
    assert!(!e);
    assert_eq!(r["value"], 2);
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn cancelled_rhai_cell_is_killed_and_reaped() {
    cancel_kills("rhai", "loop {}").await;
}

#[tokio::test]
async fn cancelled_python_cell_is_killed_and_reaped() {
    cancel_kills("python", "while True:\n    pass").await;
}

#[tokio::test]
async fn cancelled_shell_cell_leaves_no_process() {
    cancel_kills("shell", "sleep 600 & sleep 600; wait").await;
}

/// A server (no operation limit) running an endless Rhai cell whose call
/// is pending on a task of its own: the server, its idle helpers, the call
/// and the cell's worker. A signal's drain gives the cell one second.
async fn an_endless_cell() -> (
    StdioServer,
    Vec<i32>,
    tokio::task::JoinHandle<Result<CallToolResult, rmcp::ServiceError>>,
    Vec<i32>,
) {
    let s = stdio_server(&["--max-operations", "0", "--drain-timeout", "1"]).await;
    tools(&s.client).await;
    let baseline = descendants(s.pid);
    let peer = s.client.peer().clone();
    let pending = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("execute_code").with_arguments(obj(
                json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600}),
            )),
        )
        .await
    });
    let workers = wait_for_workers(s.pid, &baseline).await;
    (s, baseline, pending, workers)
}

#[tokio::test]
async fn client_disconnect_kills_the_cell_and_the_server_exits() {
    let (s, baseline, pending, workers) = an_endless_cell().await;
    // Closing the client closes the server's stdin.
    within("close", s.client.cancel()).await.unwrap();
    wait_gone(&workers, "after the client went away").await;
    // The server and its helpers are gone too.
    wait_gone(&baseline, "the server's helpers after its client went away").await;
    wait_gone(&[s.pid], "the server after its client went away").await;
    assert!(within("pending call", pending).await.unwrap().is_err());
}

#[tokio::test]
async fn sigterm_kills_running_cells_and_exits() {
    let (s, baseline, pending, workers) = an_endless_cell().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // The drain lets the cell run for its timeout, then kills it and
    // answers the call: killed, as the drain's.
    let r = within("the pending call", pending).await.unwrap().unwrap();
    let v = r.structured_content.expect("structuredContent");
    assert_eq!(v["status"], "killed", "{v}");
    assert_eq!(v["error"]["type"], "Draining", "{v}");
    wait_gone(&workers, "after SIGTERM").await;
    wait_gone(&baseline, "the server's helpers after SIGTERM").await;
    drop(s.client);
    wait_gone(&[s.pid], "the server after SIGTERM").await;
}

#[test]
fn a_client_that_leaves_before_initializing_ends_the_server() {
    let t0 = Instant::now();
    let mut child = std::process::Command::new(bin())
        .arg("serve")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(t0.elapsed() < PATIENCE, "the server outlived its stdin");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A message too long to read is answered with an error for its id (the
/// transport alone would drop it and leave the client waiting forever); one
/// with no id is dropped; the calls after them are served.
#[test]
fn a_message_too_long_is_answered_not_lost() {
    let (mut child, mut stdin, rx) = raw_stdio_serve(&["serve"]);
    let next = |what: &str| -> Value {
        rx.recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("no answer to {what}: {e}"))
    };
    let mut send = |v: Value| send_line(&mut stdin, &v);
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(next("initialize")["id"], 0);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let huge = "x".repeat(20 << 20);
    // The id after the big value, as a client may order its keys.
    send(json!({"jsonrpc": "2.0", "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"language": "python", "code": huge}},
        "id": "big-1"}));
    send(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"x": huge}}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"language": "rhai", "code": "40 + 2"}}}));
    let first = next("the oversized call");
    assert_eq!(first["id"], "big-1", "{first}");
    assert_eq!(first["error"]["code"], -32600, "{first}");
    let msg = first["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("the tools/call request was 2097") && msg.contains("over the limit of"),
        "{msg}"
    );
    let second = next("the call after it");
    assert_eq!(second["id"], 2, "{second}");
    assert_eq!(
        second["result"]["structuredContent"]["value"], 42,
        "{second}"
    );
    drop(stdin);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < PATIENCE, "the server outlived its stdin");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn twenty_calls_run_concurrently() {
    let s = stdio_server(&["--max-concurrency", "4"]).await;
    let tools = tools(&s.client).await;
    let v = Arc::new(output_validator(&tools));
    let client = Arc::new(s.client);
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let client = client.clone();
        let v = v.clone();
        tasks.push(tokio::spawn(async move {
            let (lang, code) = if i % 2 == 0 {
                ("rhai", format!("let n = {i}; n * 10"))
            } else {
                ("python", format!("n = {i}\nn * 10"))
            };
            let (r, e, _) = exec(&client, json!({"language": lang, "code": code})).await;
            assert!(!e, "call {i}: {r:#}");
            assert_eq!(r["value"], i * 10, "call {i}");
            assert_conforms(&v, &r);
        }));
    }
    for t in tasks {
        within("a concurrent call", t).await.unwrap();
    }
    match Arc::try_unwrap(client) {
        Ok(c) => {
            c.cancel().await.unwrap();
        }
        Err(_) => panic!("client still shared"),
    }
}

#[tokio::test]
async fn calls_past_the_queue_limit_are_refused() {
    let s = stdio_server(&[
        "--max-concurrency",
        "1",
        "--max-queue",
        "1",
        "--max-operations",
        "0",
    ])
    .await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);
    let baseline = descendants(s.pid);
    let send_loop = || {
        let params = CallToolRequestParams::new("execute_code").with_arguments(obj(
            json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600}),
        ));
        within(
            "send",
            s.client.send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            ),
        )
    };
    // One runs...
    let running = send_loop().await.unwrap();
    let workers = wait_for_workers(s.pid, &baseline).await;
    // ...one waits (its progress says so: it was let in)...
    let waiting = send_loop().await.unwrap();
    let token = waiting.progress_token.clone();
    let t0 = Instant::now();
    loop {
        let seen = s.recorder.progress.lock().unwrap().iter().any(|p| {
            p.progress_token == token
                && p.message
                    .as_deref()
                    .is_some_and(|m| m.contains("waiting for a free slot"))
        });
        if seen {
            break;
        }
        assert!(t0.elapsed() < PATIENCE, "the second call never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handles = [running, waiting];
    // ...and the third is refused.
    let (r, e, text) = exec(&s.client, json!({"language": "rhai", "code": "1"})).await;
    assert!(e, "{r:#}");
    assert_eq!(r["status"], "limit_exceeded");
    assert_eq!(r["error"]["type"], "ServerBusy");
    assert!(text.contains("max_queue 1"), "{text}");
    assert_conforms(&v, &r);
    for h in handles {
        h.cancel(None).await.unwrap();
    }
    wait_gone(&workers, "cancelled cells").await;
    // Room again.
    let t0 = Instant::now();
    loop {
        let (r, e, _) = exec(&s.client, json!({"language": "rhai", "code": "1"})).await;
        if !e {
            assert_eq!(r["value"], 1);
            break;
        }
        assert_eq!(r["error"]["type"], "ServerBusy");
        assert!(t0.elapsed() < PATIENCE, "the queue never emptied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn long_cells_report_progress() {
    let s = stdio_server(&["--max-operations", "0"]).await;
    tools(&s.client).await;
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(json!({
        "language": "rhai",
        "code": "let t = timestamp(); while t.elapsed < 2.5 {} \"done\""
    })));
    let handle = within(
        "send",
        s.client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        ),
    )
    .await
    .unwrap();
    let token = handle.progress_token.clone();
    let resp = within("the cell", handle.await_response()).await.unwrap();
    let rmcp::model::ServerResult::CallToolResult(r) = resp else {
        panic!("unexpected response {resp:?}")
    };
    assert_eq!(r.is_error, Some(false));
    assert_eq!(r.structured_content.unwrap()["value"], "done");
    let progress = s.recorder.progress.lock().unwrap().clone();
    let mine: Vec<_> = progress
        .iter()
        .filter(|p| p.progress_token == token)
        .collect();
    assert!(!mine.is_empty(), "no progress notifications: {progress:?}");
    assert!(
        mine.windows(2).all(|w| w[1].progress > w[0].progress),
        "progress must increase: {mine:?}"
    );
    assert!(mine[0]
        .message
        .as_deref()
        .unwrap_or("")
        .contains("rhai cell running"));
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn output_is_streamed_live_to_a_client_that_asked_for_progress() {
    let s = stdio_server(&[]).await;
    tools(&s.client).await;
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(json!({
        "language": "python",
        "code": "import sys, time\nprint('first line', flush=True)\ntime.sleep(1.5)\nprint('to stderr', file=sys.stderr)\n'end'"
    })));
    let handle = within(
        "send",
        s.client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        ),
    )
    .await
    .unwrap();
    let resp = within("the cell", handle.await_response()).await.unwrap();
    let rmcp::model::ServerResult::CallToolResult(r) = resp else {
        panic!("unexpected response {resp:?}")
    };
    assert_eq!(r.is_error, Some(false));
    let result = r.structured_content.unwrap();
    assert_eq!(result["stdout"], "first line\n");
    // Notifications may trail the response by a moment.
    let mut logs = Vec::new();
    for _ in 0..50 {
        logs = s.recorder.logs.lock().unwrap().clone();
        if logs.iter().any(|l| l["stream"] == "stderr") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = |stream: &str| -> String {
        logs.iter()
            .filter(|l| l["stream"] == stream)
            .filter_map(|l| l["text"].as_str())
            .collect()
    };
    assert_eq!(text("stdout"), "first line\n", "{logs:?}");
    assert!(text("stderr").contains("to stderr"), "{logs:?}");
    s.client.cancel().await.unwrap();
}

#[test]
fn bad_settings_are_usage_errors_that_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cellbox.toml");
    std::fs::write(&cfg, "[server]\nmax_concurency = 2\n").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .arg("serve")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("max_concurency"), "{err}");

    let (code, err) = run(&["--max-concurrency", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("server.max_concurrency (--max-concurrency)"),
        "{err}"
    );

    let (code, err) = run(&["--allow", "launch_missiles"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("unknown capability \"launch_missiles\""),
        "{err}"
    );

    let (code, err) = run(&["--http", "0.0.0.0:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a loopback address"), "{err}");

    let (code, err) = run(&["--http", "0.0.0.0:0", "--listen-public"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--token-file"), "{err}");

    // The shipped example is a valid config.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cellbox.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let c: cellbox::serve::ServeConfig = toml::from_str(&text).unwrap();
    c.validate().unwrap();
}

// ----------------------------------------------------------------- http --

/// A `cellbox serve --http` child process; killed (SIGTERM) on drop.
struct HttpServer {
    child: std::process::Child,
    addr: SocketAddr,
}

impl HttpServer {
    fn start(extra: &[&str]) -> HttpServer {
        HttpServer::start_on("127.0.0.1:0", extra)
    }

    fn start_on(listen: &str, extra: &[&str]) -> HttpServer {
        let (child, announced) = http_serve(
            std::process::Command::new(bin())
                .args(["serve", "--http", listen])
                .args(extra),
        );
        let addr = announced.trim_end_matches('/').parse().unwrap();
        HttpServer { child, addr }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    async fn client(
        &self,
        token: Option<&str>,
    ) -> Result<Client, rmcp::service::ClientInitializeError> {
        let mut config =
            StreamableHttpClientTransportConfig::with_uri(self.url()).max_concurrent_requests(64);
        if let Some(t) = token {
            config = config.auth_header(t);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        within("initialize over HTTP", Recorder::default().serve(transport)).await
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Status line of a bare POST (no JSON-RPC body needed to be refused).
    fn raw_status(&self, authorization: Option<&str>) -> String {
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        self.raw_post(&format!("Host: {}\r\n{auth}", self.addr), "")
    }

    /// Status line of a POST with these header lines (each ending in CRLF;
    /// they must include Host) and this body.
    fn raw_post(&self, headers: &str, body: &str) -> String {
        let mut s = std::net::TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "POST / HTTP/1.1\r\n{headers}Content-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        buf.lines().next().unwrap_or("").to_owned()
    }

    fn stop(mut self) -> Option<i32> {
        use nix::sys::signal::{kill, Signal};
        let _ = kill(nix::unistd::Pid::from_raw(self.pid()), Signal::SIGTERM);
        let status = self.child.wait().unwrap();
        status.code()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn http_serves_cells_sessions_and_concurrent_calls() {
    let server = HttpServer::start(&["--max-operations", "0"]);
    let client = server.client(None).await.unwrap();
    let tools = tools(&client).await;
    let v = Arc::new(output_validator(&tools));

    let (r, e, _) = exec(&client, json!({"language": "rhai", "code": "40 + 2"})).await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], 42);
    assert_conforms(&v, &r);

    let (r, e, _) = exec(
        &client,
        json!({"language": "python", "code": "import sys\nsys.version_info[0]"}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], 3);
    assert_conforms(&v, &r);

    let created = call(&client, "create_session", json!({}))
        .await
        .structured_content
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();
    let (_, e, _) = exec(
        &client,
        json!({"language": "python", "code": "total = 5", "session_id": id}),
    )
    .await;
    assert!(!e);
    let (r, e, _) = exec(
        &client,
        json!({"language": "python", "code": "total * 2", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], 10);

    let (r, e, _) = exec(
        &client,
        json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 0.3}),
    )
    .await;
    assert!(e);
    assert_eq!(r["status"], "timeout");

    let client = Arc::new(client);
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let client = client.clone();
        let v = v.clone();
        tasks.push(tokio::spawn(async move {
            let (r, e, _) = exec(
                &client,
                json!({"language": "rhai", "code": format!("{i} * 3")}),
            )
            .await;
            assert!(!e, "call {i}: {r:#}");
            assert_eq!(r["value"], i * 3);
            assert_conforms(&v, &r);
        }));
    }
    for t in tasks {
        within("a concurrent HTTP call", t).await.unwrap();
    }

    // Cancel a running cell over HTTP.
    tools_then_cancel(&client, server.pid()).await;
    drop(client);
    assert_eq!(server.stop(), Some(0));
}

async fn tools_then_cancel(client: &Client, server_pid: i32) {
    tools(client).await;
    let baseline = descendants(server_pid);
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(
        json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600}),
    ));
    let handle = within(
        "send",
        client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        ),
    )
    .await
    .unwrap();
    let workers = wait_for_workers(server_pid, &baseline).await;
    handle.cancel(Some("test".into())).await.unwrap();
    wait_gone(&workers, "after notifications/cancelled over HTTP").await;
    let left = extra(server_pid, &baseline);
    assert!(left.is_empty(), "{}", show(&left));
}

#[tokio::test]
async fn http_client_that_goes_away_gets_its_cell_killed() {
    let server = HttpServer::start(&["--max-operations", "0"]);
    let client = server.client(None).await.unwrap();
    tools(&client).await;
    // Another client's session, with state, and a cell of it running while
    // the first client goes away.
    let other = server.client(None).await.unwrap();
    let created = call(&other, "create_session", json!({})).await;
    let sid = created.structured_content.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, e, _) = exec(
        &other,
        json!({"language": "python", "code": "x = 41", "session_id": sid}),
    )
    .await;
    assert!(!e);
    let baseline = descendants(server.pid());
    let other_peer = other.peer().clone();
    let other_sid = sid.clone();
    let other_running = tokio::spawn(async move {
        other_peer
            .call_tool(
                CallToolRequestParams::new("execute_code").with_arguments(obj(json!({
                    "language": "python",
                    "code": "import time\ntime.sleep(2)\nx + 1",
                    "session_id": other_sid,
                }))),
            )
            .await
    });
    let peer = client.peer().clone();
    let pending = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("execute_code").with_arguments(obj(
                json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600}),
            )),
        )
        .await
    });
    // The Rhai cell's worker: not the other session's Python cell (which
    // may go on as its session's state) nor a worker started ahead.
    let workers = wait_for_rhai_cells(server.pid(), &baseline).await;
    // Drop the whole client: its connections close mid-call.
    pending.abort();
    within("close", client.cancel()).await.unwrap();
    wait_gone(&workers, "after the HTTP client went away").await;
    // The other client's cell ran on, and its session kept its state.
    let r = within("the other client's cell", other_running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert_eq!(r.structured_content.unwrap()["value"], 42);
    let (r, e, _) = exec(
        &other,
        json!({"language": "python", "code": "x", "session_id": sid}),
    )
    .await;
    assert!(!e);
    assert_eq!(r["value"], 41);
    // The server is still up for new clients.
    let third = server.client(None).await.unwrap();
    let (r, e, _) = exec(&third, json!({"language": "rhai", "code": "7"})).await;
    assert!(!e);
    assert_eq!(r["value"], 7);
    third.cancel().await.unwrap();
    other.cancel().await.unwrap();
    let pid = server.pid();
    assert_eq!(server.stop(), Some(0));
    // Nothing of it is left on the host.
    let left = super::faults::left_by(pid as u32);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn http_with_a_token_rejects_requests_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let token = "t0ken-for-the-test-0123456789";
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let server = HttpServer::start(&["--token-file", file.to_str().unwrap()]);

    // Without a token, or with a wrong one: 401 with a Bearer challenge.
    assert!(
        server.raw_status(None).contains(" 401 "),
        "{}",
        server.raw_status(None)
    );
    assert!(server
        .raw_status(Some("Bearer wrong-token-0123456789"))
        .contains(" 401 "));
    let err = server.client(None).await.err().expect("must be refused");
    assert!(
        err.auth_challenge()
            .is_some_and(|c| c.starts_with("Bearer")),
        "{err:?}"
    );
    let err = server
        .client(Some("wrong-token-0123456789"))
        .await
        .err()
        .expect("must be refused");
    assert!(err.is_authorization_required(), "{err:?}");

    // With it, everything works.
    let client = server.client(Some(token)).await.unwrap();
    let tools = tools(&client).await;
    let v = output_validator(&tools);
    let (r, e, _) = exec(&client, json!({"language": "rhai", "code": "\"ok\""})).await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], "ok");
    assert_conforms(&v, &r);
    let (r, e, _) = exec(&client, json!({"language": "python", "code": "'ok'"})).await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], "ok");
    client.cancel().await.unwrap();
    assert_eq!(server.stop(), Some(0));
}

#[tokio::test]
async fn http_on_loopback_refuses_foreign_hosts_and_browser_origins() {
    let server = HttpServer::start(&[]);
    let port = server.addr.port();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let post = |headers: String| server.raw_post(&headers, init);

    // The loopback names, with and without a page on this machine as the
    // origin: served.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let line = post(format!("Host: {host}\r\n"));
        assert!(line.contains(" 200 "), "Host {host}: {line}");
    }
    for origin in [
        format!("http://localhost:{port}"),
        "http://127.0.0.1:6274".to_owned(),
        "https://[::1]".to_owned(),
    ] {
        let line = post(format!("Host: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n"));
        assert!(line.contains(" 200 "), "Origin {origin}: {line}");
    }

    // A name that resolves here only through DNS rebinding: refused.
    for host in [format!("evil.example:{port}"), "evil.example".to_owned()] {
        let line = post(format!("Host: {host}\r\n"));
        assert!(line.contains(" 403 "), "Host {host}: {line}");
    }
    // Nor does the bound address let other loopback names in than these.
    for host in [format!("127.0.0.2:{port}"), format!("[::2]:{port}")] {
        let line = post(format!("Host: {host}\r\n"));
        assert!(line.contains(" 403 "), "Host {host}: {line}");
    }
    // A page from elsewhere driving the user's browser, a sandboxed frame or
    // file (`null`), a look-alike and garbage: refused.
    for origin in [
        "http://evil.example",
        &format!("http://evil.example:{port}"),
        "null",
        "http://localhost.evil.example",
        "http://127.0.0.1.evil.example:80",
        "not an origin",
    ] {
        let line = post(format!("Host: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n"));
        assert!(line.contains(" 403 "), "Origin {origin}: {line}");
    }
    assert_eq!(server.stop(), Some(0));

    // Bound to another loopback address, it answers to that address too.
    let server = HttpServer::start_on("127.0.0.2:0", &[]);
    let port = server.addr.port();
    let init_line = |headers: String| server.raw_post(&headers, init);
    for headers in [
        format!("Host: 127.0.0.2:{port}\r\n"),
        format!("Host: 127.0.0.2:{port}\r\nOrigin: http://127.0.0.2:{port}\r\n"),
        format!("Host: localhost:{port}\r\n"),
    ] {
        let line = init_line(headers.clone());
        assert!(line.contains(" 200 "), "{headers:?}: {line}");
    }
    let line = init_line(format!(
        "Host: 127.0.0.2:{port}\r\nOrigin: http://evil.example\r\n"
    ));
    assert!(line.contains(" 403 "), "{line}");
    assert_eq!(server.stop(), Some(0));
}

#[tokio::test]
async fn http_closes_connections_that_send_no_request_but_not_long_calls() {
    let server = HttpServer::start(&["--timeout", "60"]);
    // One connection that never sends anything and one that trickles half a
    // request head: each would hold a descriptor for ever.
    let idle = std::net::TcpStream::connect(server.addr).unwrap();
    let mut trickle = std::net::TcpStream::connect(server.addr).unwrap();
    write!(trickle, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
    let started = Instant::now();
    let closed = |mut s: std::net::TcpStream| {
        std::thread::spawn(move || {
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            let mut buf = [0u8; 512];
            // EOF (or a reset) once the server gives up on the head; a 408
            // response before it is fine too.
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return Instant::now(),
                    Ok(_) => continue,
                }
            }
        })
    };
    let (idle, trickle) = (closed(idle), closed(trickle));

    // Meanwhile a call that outlasts that timeout is answered in full.
    let client = server.client(None).await.unwrap();
    let (r, e, _) = exec(
        &client,
        json!({"language": "python", "code": "import time\ntime.sleep(32)\n'slept'"}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], "slept");

    for (what, t) in [("idle", idle), ("trickling", trickle)] {
        let at = t.join().unwrap() - started;
        assert!(
            at >= Duration::from_secs(29) && at < Duration::from_secs(59),
            "the {what} connection was closed after {at:?}, not the header timeout (30 s)"
        );
    }
    client.cancel().await.unwrap();
    assert_eq!(server.stop(), Some(0));
}

/// Send one POST on its own connection and read the whole response.
fn http_exchange(addr: SocketAddr, auth: Option<&str>, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf
}

/// The largest result a cell can make: every part a worker reports flooded
/// (its own `done` frame: a long value and repr, 20,000 variables, 5,000
/// dropped ones, 30,070 display items, 1,000 dropped-display reasons, and a
/// long error), real stdout and stderr past a raised output limit, and
/// nearly as many call records as a run may make. What the server writes on the wire (the
/// bytes of the JSON-RPC message in its event, measured as received over
/// HTTP) stays within the documented 960 KiB, under the 1 MiB event the
/// Python SDK 2.x reads, with every item count capped. The control is the
/// cell's own report: the frame it sent is several times that size.
#[tokio::test]
async fn the_largest_result_on_the_wire_fits_the_documented_maximum() {
    const MAX_RESULT_BYTES: usize = cellbox::serve::fit::MAX_RESULT_BYTES;
    let server = HttpServer::start(&[
        "--language",
        "python",
        "--max-output",
        "4194304",
        "--max-operations",
        "0",
    ]);
    for status in ["ok", "error"] {
        let code = format!(
            r#"import json, os, struct, sys
c = "\x01"
for i in range(999):
    try:
        capabilities.answer(i)
    except PermissionError:
        pass
frame = {{"t": "done", "status": "{status}", "value": [c * 40] * 4000, "repr": c * 150000,
    "vars": {{"v%d" % i: 0 for i in range(20000)}},
    "dropped": [{{"name": "d%d" % i, "type": c * 10, "reason": c * 40}} for i in range(5000)],
    "display": [{{"mime": "text/html", "data": c * 1000}}] * 70
        + [{{"mime": "text/markdown", "data": ""}}] * 30000,
    "display_dropped": [{{"mime": "text/html", "bytes": 1, "reason": "r" * 300}}] * 1000}}
if "{status}" == "error":
    frame["error"] = {{"type": "E" * 1000, "message": c * 100000, "traceback": c * 100000,
                      "line": 1}}
data = json.dumps(frame, separators=(",", ":")).encode()
print("FRAME", len(data), flush=True)
sys.stdout.write(c * 2000000)
sys.stdout.flush()
sys.stderr.write(c * 2000000)
sys.stderr.flush()
data = struct.pack(">I", len(data)) + data
while data:
    data = data[os.write(3, data):]
os._exit(0)
"#
        );
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "execute_code",
            "arguments": {"language": "python", "code": code, "timeout_seconds": 120}}})
        .to_string();
        let addr = server.addr;
        let raw = tokio::task::spawn_blocking(move || http_exchange_bytes(addr, &body))
            .await
            .unwrap();
        // The one message answering the call, as its bytes came: an SSE
        // event's data (its lines joined), or the body itself.
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP response");
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let rest = &raw[split + 4..];
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(rest)
        } else {
            rest.to_vec()
        };
        let body = String::from_utf8(body).expect("a UTF-8 body");
        let mut answers: Vec<String> = Vec::new();
        for event in body.split("\n\n") {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            let data = if data.is_empty() && event.trim_start().starts_with('{') {
                event.trim().to_owned()
            } else {
                data.join("\n")
            };
            // Every event fits what a client reads, the live output's
            // too.
            assert!(
                data.len() <= MAX_RESULT_BYTES + 64,
                "{status}: an event of {} bytes: {}",
                data.len(),
                &data[..data.len().min(300)]
            );
            if data.contains("\"result\"") && data.contains("\"id\":7") {
                answers.push(data);
            }
        }
        assert_eq!(
            answers.len(),
            1,
            "{status}: {}",
            &body[..body.len().min(2000)]
        );
        let wire = answers[0].len();
        assert!(
            wire <= MAX_RESULT_BYTES + 64,
            "{status}: the result took {wire} bytes on the wire"
        );
        let msg: Value = serde_json::from_str(&answers[0]).unwrap();
        let r = &msg["result"];
        let s = &r["structuredContent"];
        // The control: the cell ran as meant and sent far more.
        let stdout = s["stdout"].as_str().unwrap_or_default();
        let sent: usize = stdout
            .split_once("FRAME ")
            .and_then(|(_, n)| n.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| {
                let shown = s.to_string();
                panic!("{status}: no report: {}", &shown[..shown.len().min(3000)])
            });
        assert!(
            sent > 5 * MAX_RESULT_BYTES,
            "{status}: the frame took {sent} bytes"
        );
        assert_eq!(s["status"], status, "{status}: {}", s["error"]);
        // Item counts capped, and what went said.
        let blocks = r["content"].as_array().map_or(0, Vec::len);
        assert!(
            (2..=65).contains(&blocks),
            "{status}: {blocks} content blocks"
        );
        let listed = |k: &str| s[k].as_array().map_or(0, Vec::len);
        assert!(listed("display") <= 64, "{status}");
        assert!(listed("display_dropped") <= 33, "{status}");
        assert!(listed("calls") <= 1000, "{status}");
        assert!(
            listed("notes") >= 1,
            "{status}: nothing said of what was cut"
        );
        eprintln!(
            "{status}: the cell sent a {sent}-byte frame; the result took {wire} bytes on the \
             wire, {blocks} content blocks, {} calls listed",
            listed("calls")
        );
    }
    assert_eq!(server.stop(), Some(0));
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..eol]);
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let tail = &rest[eol + 2..];
        if n == 0 || tail.len() < n {
            break;
        }
        out.extend_from_slice(&tail[..n]);
        rest = tail[n..].strip_prefix(b"\r\n").unwrap_or(&tail[n..]);
    }
    out
}

/// [`http_exchange`], without a token, the response's bytes as they came.
fn http_exchange_bytes(addr: SocketAddr, body: &str) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf
}

/// The official SDKs send `notifications/cancelled` as a POST of its own,
/// not on the connection of the call. It kills the call of the same client
/// with that id, and no other.
#[tokio::test]
async fn http_cancellation_in_its_own_post_kills_the_cell() {
    let dir = tempfile::tempdir().unwrap();
    let token = "t0ken-for-the-cancel-test-0123";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let server = HttpServer::start(&[
        "--max-operations",
        "0",
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let client = server.client(Some(token)).await.unwrap();
    tools(&client).await;
    let baseline = descendants(server.pid());
    let addr = server.addr;
    let call = std::thread::spawn(move || {
        http_exchange(
            addr,
            Some(token),
            &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "execute_code",
                "arguments": {"language": "rhai", "code": "loop {}", "timeout_seconds": 600}}})
            .to_string(),
        )
    });
    let workers = wait_for_workers(server.pid(), &baseline).await;
    let cancel = |id: Value| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": id, "reason": "test"}})
        .to_string()
    };
    // Another id, and the same id as a string, cancel nothing.
    for other in [json!(8), json!("7")] {
        let r = http_exchange(addr, Some(token), &cancel(other));
        assert!(r.starts_with("HTTP/1.1 202"), "{r}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        workers.iter().all(|p| exists(*p)),
        "a cancellation for another request killed the cell"
    );
    let r = http_exchange(addr, Some(token), &cancel(json!(7)));
    assert!(r.starts_with("HTTP/1.1 202"), "{r}");
    wait_gone(&workers, "after notifications/cancelled in its own POST").await;
    let answer = tokio::task::spawn_blocking(move || call.join().unwrap())
        .await
        .unwrap();
    assert!(answer.contains("cancelled"), "{answer}");
    let left = extra(server.pid(), &baseline);
    assert!(left.is_empty(), "{}", show(&left));
    client.cancel().await.unwrap();
    assert_eq!(server.stop(), Some(0));
}

/// `cellbox serve` over raw stdio JSON-RPC: the child, its stdin, and every
/// JSON line it writes, read on a thread of its own.
fn raw_stdio_serve(
    args: &[&str],
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<Value>,
) {
    json_lines(
        std::process::Command::new(bin())
            .args(args)
            .stderr(std::process::Stdio::null()),
    )
}

/// Every method the server advertises in `initialize` answers as the
/// protocol says, over raw stdio JSON-RPC; `logging/setLevel` filters the
/// live output sent as log notifications.
#[test]
fn every_advertised_method_answers_and_set_level_filters_logs() {
    let (mut child, mut stdin, rx) = raw_stdio_serve(&["serve", "--language", "python,rhai"]);
    let mut send = |v: Value| send_line(&mut stdin, &v);
    // The answer to request `id`, and the notifications sent before it.
    let answer = |id: i64| -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let v = rx
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|e| panic!("no answer to request {id}: {e}"));
            if v["id"] == id {
                return (v, before);
            }
            before.push(v);
        }
    };
    let request = |id: i64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    send(request(
        0,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}}),
    ));
    let (init, _) = answer(0);
    let caps = init["result"]["capabilities"].as_object().unwrap().clone();
    let advertised: Vec<&str> = caps.keys().map(String::as_str).collect();
    assert!(
        advertised.contains(&"tools") && advertised.contains(&"logging"),
        "{init}"
    );
    for cap in &advertised {
        assert!(
            ["tools", "logging"].contains(cap),
            "capability {cap} is advertised but not checked here: {init}"
        );
    }
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    send(request(1, "ping", json!({})));
    assert_eq!(answer(1).0["result"], json!({}));
    send(request(2, "tools/list", json!({})));
    let (list, _) = answer(2);
    // The seven session tools, the three session file tools and
    // aggregate_context (no files or models configured).
    assert_eq!(
        list["result"]["tools"].as_array().unwrap().len(),
        11,
        "{list}"
    );

    // logging: a bad level is invalid params; above info, no live output.
    send(request(3, "logging/setLevel", json!({"level": "loud"})));
    assert_eq!(answer(3).0["error"]["code"], -32602);
    let printing = |id: i64| {
        request(
            id,
            "tools/call",
            json!({"name": "execute_code", "_meta": {"progressToken": id},
                   "arguments": {"language": "python", "code": "print('live')\n7"}}),
        )
    };
    let logged = |notes: &[Value]| {
        notes
            .iter()
            .filter(|n| n["method"] == "notifications/message")
            .count()
    };
    send(request(4, "logging/setLevel", json!({"level": "warning"})));
    assert_eq!(answer(4).0["result"], json!({}));
    send(printing(5));
    let (r, notes) = answer(5);
    assert_eq!(r["result"]["structuredContent"]["value"], 7, "{r}");
    assert_eq!(logged(&notes), 0, "{notes:?}");
    // The positive control: at info the same call's output is logged.
    send(request(6, "logging/setLevel", json!({"level": "info"})));
    assert_eq!(answer(6).0["result"], json!({}));
    send(printing(7));
    let (r, notes) = answer(7);
    assert_eq!(r["result"]["structuredContent"]["value"], 7, "{r}");
    assert!(logged(&notes) > 0, "{notes:?}");

    // A method of a capability not advertised is "method not found".
    send(request(8, "prompts/get", json!({"name": "any"})));
    assert_eq!(answer(8).0["error"]["code"], -32601);

    drop(stdin);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < PATIENCE, "the server outlived its stdin");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Requests with an id whose params (or envelope) do not parse, each with
/// the code and a piece of the message its error reply must carry.
fn unreadable_requests() -> Vec<(Value, i64, &'static str)> {
    vec![
        (
            json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": 5}}),
            -32602,
            "tools/call: invalid params",
        ),
        (
            json!({"jsonrpc": "2.0", "id": "s-12", "method": "tools/call",
                   "params": {"name": "list_sessions", "arguments": "x"}}),
            -32602,
            "tools/call: invalid params",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call"}),
            -32602,
            "tools/call: invalid params",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 14, "method": "tools/list", "params": 7}),
            -32602,
            "tools/list: invalid params",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 15, "method": "foo/bar", "params": 7}),
            -32600,
            "foo/bar",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 16, "method": "tools/call",
                   "params": {"name": "execute_code", "arguments": {"language": 5, "code": "1"}}}),
            -32602,
            "execute_code: invalid arguments",
        ),
    ]
}

fn assert_error_reply(reply: &Value, id: &Value, code: i64, needle: &str) {
    assert_eq!(&reply["id"], id, "{reply}");
    assert_eq!(reply["error"]["code"], code, "{reply}");
    let msg = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(needle), "{needle:?} not in {reply}");
}

/// Every request with an id is answered over stdio, even when its params
/// do not parse (rmcp alone answers some with a null id and others with
/// "method not found").
#[test]
fn stdio_answers_every_request_that_has_an_id() {
    let (mut child, mut stdin, rx) = raw_stdio_serve(&["serve", "--language", "rhai"]);
    let mut send = |v: &Value| send_line(&mut stdin, v);
    send(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    let init = rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!(init["id"], 0, "{init}");
    send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let cases = unreadable_requests();
    for (req, _, _) in &cases {
        send(req);
    }
    // And a good call after them is served.
    send(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"language": "rhai", "code": "40 + 2"}}}));
    let mut replies = std::collections::HashMap::new();
    while replies.len() < cases.len() + 1 {
        let v = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("missing replies; have {replies:?}"));
        assert!(
            v.get("id").is_some_and(|id| !id.is_null()),
            "a reply without an id: {v}"
        );
        replies.insert(v["id"].to_string(), v);
    }
    for (req, code, needle) in &cases {
        assert_error_reply(&replies[&req["id"].to_string()], &req["id"], *code, needle);
    }
    assert_eq!(
        replies["99"]["result"]["structuredContent"]["value"], 42,
        "{}",
        replies["99"]
    );
    drop(stdin);
    let _ = child.wait();
}

/// JSON-RPC ids rmcp cannot hold (a fraction, an integer past `i64`) are
/// served over stdio like any other, and each reply carries the id exactly
/// as the client wrote it.
#[test]
fn stdio_serves_requests_whose_ids_rmcp_cannot_hold() {
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--language", "rhai"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    writeln!(stdin, "{init}").unwrap();
    assert!(rx.recv_timeout(PATIENCE).unwrap().contains(r#""id":0"#));
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    let ids = [
        "1.5",
        "18446744073709551615",
        "123456789012345678901234567890",
        "-0.25",
    ];
    // A ping, a call, and a request that is wrong besides its id.
    let requests = [
        r#"{"jsonrpc":"2.0","id":ID,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"execute_code","arguments":{"language":"rhai","code":"40 + 2"}}}"#,
        r#"{"jsonrpc":"2.0","id":ID,"method":"tools/list","params":7}"#,
    ];
    let mut sent = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let req = requests[i % requests.len()];
        writeln!(stdin, "{}", req.replace("ID", id)).unwrap();
        sent.push((id.to_string(), i % requests.len()));
    }
    stdin.flush().unwrap();
    let mut replies = Vec::new();
    while replies.len() < ids.len() {
        let line = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("missing replies; have {replies:?}"));
        if line.contains(r#""id":"#) {
            replies.push(line);
        }
    }
    for (id, kind) in sent {
        let needle = format!(r#""id":{id},"#);
        let reply = replies
            .iter()
            .find(|r| r.contains(&needle))
            .unwrap_or_else(|| panic!("no reply with {needle}: {replies:?}"));
        let v: Value = serde_json::from_str(reply).unwrap();
        match kind {
            0 => assert_eq!(v["result"], json!({}), "{reply}"),
            1 => assert_eq!(v["result"]["structuredContent"]["value"], 42, "{reply}"),
            _ => assert_eq!(v["error"]["code"], -32602, "{reply}"),
        }
    }
    drop(stdin);
    let _ = child.wait();
}

/// The same over streamable HTTP: each POST gets a JSON-RPC error for its
/// id (rmcp alone answers some with a bare 415).
#[tokio::test]
async fn http_answers_every_request_that_has_an_id() {
    let server = HttpServer::start(&["--language", "rhai"]);
    let client = server.client(None).await.unwrap();
    tools(&client).await;
    for (req, code, needle) in unreadable_requests() {
        let body = req.to_string();
        let mut s = std::net::TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "POST / HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            server.addr,
            body.len()
        )
        .unwrap();
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        // The reply is the body, plain JSON or one SSE `data:` line.
        let reply: Value = buf
            .lines()
            .filter_map(|l| {
                serde_json::from_str::<Value>(l.trim_start_matches("data:").trim()).ok()
            })
            .find(|v| v.get("jsonrpc").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC reply to {req}:\n{buf}"));
        assert_error_reply(&reply, &req["id"], code, needle);
    }
    client.cancel().await.unwrap();
    assert_eq!(server.stop(), Some(0));
}

/// `[files]` in the config file: serve offers the file tools as MCP tools
/// of their own (no cell), refusing what leaves the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_are_offered_directly_when_files_are_configured() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("proj");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), "alpha\nbeta\n").unwrap();
    std::fs::write(t.path().join("secret"), "no").unwrap();
    let conf = t.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!("[files]\nroots = [{:?}]\n", root.to_str().unwrap()),
    )
    .unwrap();
    let s = stdio_server(&["--config", conf.to_str().unwrap()]).await;
    let names: Vec<String> = tools(&s.client)
        .await
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    for n in ["read_file", "list_dir", "search_files", "aggregate_context"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    assert!(!names.iter().any(|x| x == "write_file"), "{names:?}");
    let r = call(
        &s.client,
        "read_file",
        json!({"path": "a.txt", "start_line": 2}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert_eq!(r.structured_content.unwrap()["content"], "beta\n");
    let r = call(&s.client, "read_file", json!({"path": "../secret"})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(format!("{r:?}").contains("outside the root"), "{r:?}");
    let r = call(&s.client, "search_files", json!({"pattern": "alp"})).await;
    assert_eq!(r.structured_content.unwrap()["matches"][0]["path"], "a.txt");
}

/// The file tools and `aggregate_context` are calls like `execute_code`:
/// while the only slot is taken by a cell and no call may wait, they are
/// refused as `ServerBusy`; once it is free, they run (the control).
///
/// The cell is seen holding its slot from the host (its process is there;
/// it took the slot before it started), never by a tool call: a call made
/// to find out takes the one slot itself for a moment, and a cell arriving
/// then is refused instead. The cell runs until it is cancelled (no
/// operation limit, a long timeout), so both refusals come while it holds
/// the slot, however slow the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_tools_take_a_slot_like_cells() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), "alpha\n").unwrap();
    let conf = t.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!("[files]\nroots = [{:?}]\n", root.to_str().unwrap()),
    )
    .unwrap();
    let s = stdio_server(&[
        "--language",
        "rhai",
        "--config",
        conf.to_str().unwrap(),
        "--max-concurrency",
        "1",
        "--max-queue",
        "0",
        "--max-operations",
        "0",
    ])
    .await;
    tools(&s.client).await;
    let baseline = descendants(s.pid);
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(
        json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 600}),
    ));
    let busy = within(
        "send",
        s.client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        ),
    )
    .await
    .unwrap();
    let cells = wait_for_rhai_cells(s.pid, &baseline).await;
    let r = call(&s.client, "read_file", json!({"path": "a.txt"})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(format!("{r:?}").contains("ServerBusy"), "{r:?}");
    assert_eq!(r.structured_content.unwrap()["status"], "limit_exceeded");
    let r = call(
        &s.client,
        "aggregate_context",
        json!({"results": ["a"], "query": "a", "budget_tokens": 10}),
    )
    .await;
    assert!(format!("{r:?}").contains("ServerBusy"), "{r:?}");
    busy.cancel(None).await.unwrap();
    wait_gone(&cells, "the cancelled cell").await;
    // Once the cell's slot is free (given back once its worker is gone,
    // just after), the tool runs.
    let t0 = Instant::now();
    let r = loop {
        let r = call(&s.client, "read_file", json!({"path": "a.txt"})).await;
        if r.is_error == Some(false) {
            break r;
        }
        assert!(format!("{r:?}").contains("ServerBusy"), "{r:?}");
        assert!(t0.elapsed() < PATIENCE, "the slot was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.structured_content.unwrap()["content"], "alpha\n");
}

/// A host tool called directly and refused as `ServerBusy` did nothing,
/// so it is no tool call of its principal: with `max_tool_calls = 1`, five
/// refused calls leave the one call, which runs once the slot is free;
/// the next is refused by the budget (the control: the budget counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tool_refused_as_busy_is_not_charged() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), "alpha\n").unwrap();
    let conf = t.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "[files]\nroots = [{:?}]\n[principals]\nmax_tool_calls = 1\n",
            root.to_str().unwrap()
        ),
    )
    .unwrap();
    let s = stdio_server(&[
        "--language",
        "rhai",
        "--config",
        conf.to_str().unwrap(),
        "--max-concurrency",
        "1",
        "--max-queue",
        "0",
        // The looping cell runs until its timeout, not its operation limit,
        // so it holds the slot while the probe and the five calls come.
        "--max-operations",
        "0",
    ])
    .await;
    // The looping cell; runs until its timeout, long enough for the probe
    // and the five calls on a loaded host.
    let start_busy = || {
        let peer = s.client.peer().clone();
        tokio::spawn(async move {
            let args = json!({"language": "rhai", "code": "loop {}", "timeout_seconds": 15});
            peer.call_tool(CallToolRequestParams::new("execute_code").with_arguments(obj(args)))
                .await
        })
    };
    let mut busy = start_busy();
    // Refused for want of a slot: ServerBusy, or ClientQueueFull when the
    // principal's share of the queue (none here) is what refuses it.
    let refused_busy = |r: &str| r.contains("ServerBusy") || r.contains("ClientQueueFull");
    // Until the cell holds the slot (a cell is no tool call: probing with
    // one charges nothing). A probe that took the slot first made the
    // looping cell's call be refused: it is made again.
    let t0 = std::time::Instant::now();
    loop {
        let r = call(
            &s.client,
            "execute_code",
            json!({"language": "rhai", "code": "1"}),
        )
        .await;
        if refused_busy(&format!("{r:?}")) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never refused");
        if busy.is_finished() {
            busy = start_busy();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..5 {
        let r = call(&s.client, "read_file", json!({"path": "a.txt"})).await;
        assert!(
            refused_busy(&format!("{r:?}")),
            "{r:?}; the looping cell had ended: {}",
            busy.is_finished()
        );
    }
    let _ = busy.await;
    let t0 = std::time::Instant::now();
    let r = loop {
        let r = call(&s.client, "read_file", json!({"path": "a.txt"})).await;
        if !refused_busy(&format!("{r:?}")) || t0.elapsed() > Duration::from_secs(20) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert_eq!(r.structured_content.unwrap()["content"], "alpha\n");
    let r = call(&s.client, "read_file", json!({"path": "a.txt"})).await;
    let text = format!("{r:?}");
    assert!(text.contains("max_tool_calls"), "{text}");
}

/// `[models.NAME]` in serve's config and `model_query` allowed by its
/// policy: a cell sent over MCP asks the model through the supervisor (the
/// key from serve's environment, never the cell's), and the tool
/// description says which models there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_offers_configured_models_to_cells() {
    use super::common::fake_model::{FakeModel, Reply};
    let fake = FakeModel::start(vec![Reply::Text("forty-two".into(), 7, 3)]);
    let t = tempfile::tempdir().unwrap();
    let conf = t.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "[server]\npython = \"/usr/bin/python3\"\n\
             [policy]\nallow = [\"model_query\"]\n\
             [models.local]\nendpoint = \"{}\"\nmodel = \"m-1\"\napi_key_env = \"CELLBOX_MCP_TEST_KEY\"\n",
            fake.url
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("serve")
        .args(["--config", conf.to_str().unwrap()])
        .env("CELLBOX_MCP_TEST_KEY", "sk-mcp-test-9876");
    let transport = TokioChildProcess::new(cmd).unwrap();
    let client = within("initialize", Recorder::default().serve(transport))
        .await
        .unwrap();
    let listed = tools(&client).await;
    let exec = listed
        .iter()
        .find(|t| t.name == "execute_code")
        .expect("execute_code is listed");
    let description = exec.description.as_deref().unwrap_or_default();
    assert!(
        description.contains("Models (the server makes the request"),
        "{description}"
    );
    assert!(description.contains(": local."), "{description}");
    let r = call(
        &client,
        "execute_code",
        json!({"language": "python",
               "code": "import os\nr = llm_query('what is six times seven?')\nprint(r, r.usage)\nprint(sorted(k for k in os.environ if 'KEY' in k))"}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let s = r.structured_content.unwrap();
    let stdout = s["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("forty-two "), "{s}");
    assert!(
        stdout.contains("[]"),
        "a key variable reached the cell: {s}"
    );
    assert!(!s.to_string().contains("sk-mcp-test-9876"), "{s}");
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some("Bearer sk-mcp-test-9876")
    );
    assert_eq!(seen[0].body["model"], "m-1");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn live_python_sessions_keep_objects_roll_back_and_checkpoint_over_mcp() {
    let s = stdio_server(&[]).await;
    let tools = tools(&s.client).await;
    let v = output_validator(&tools);
    for t in ["checkpoint_session", "restore_session"] {
        assert!(tool(&tools, t).description.is_some());
    }
    let created = call(&s.client, "create_session", json!({})).await;
    let id = created.structured_content.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let py = |code: &str| json!({"language": "python", "code": code, "session_id": id});
    let (r, e, _) = exec(
        &s.client,
        py("import re\nrx = re.compile('a+')\nitems = [1]"),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["state"], "kept", "{r:#}");
    assert_conforms(&v, &r);
    let cp = call(
        &s.client,
        "checkpoint_session",
        json!({"session_id": id, "name": "start"}),
    )
    .await;
    assert_eq!(cp.is_error, Some(false), "{cp:?}");
    assert_eq!(cp.structured_content.unwrap()["done"], "checkpointed");
    let (r, e, _) = exec(&s.client, py("items.append(2)\nitems.append(1/0)")).await;
    assert!(e, "{r:#}");
    assert_eq!(r["state"], "rolled_back", "{r:#}");
    assert_conforms(&v, &r);
    let (r, _, _) = exec(
        &s.client,
        py("items.append(3)\n[rx.match('aa').group(), items]"),
    )
    .await;
    assert_eq!(r["value"], json!(["aa", [1, 3]]), "{r:#}");
    let list = call(&s.client, "list_sessions", json!({})).await;
    let list = list.structured_content.unwrap();
    let me = &list["sessions"][0];
    assert_eq!(me["live"], true, "{list:#}");
    assert_eq!(me["checkpoints"], json!(["start"]), "{list:#}");
    assert!(me["memory_bytes"].as_u64().unwrap() > 0, "{list:#}");
    let back = call(
        &s.client,
        "restore_session",
        json!({"session_id": id, "name": "start"}),
    )
    .await;
    assert_eq!(back.is_error, Some(false), "{back:?}");
    let (r, _, _) = exec(&s.client, py("items")).await;
    assert_eq!(r["value"], json!([1]), "{r:#}");
    let missing = call(
        &s.client,
        "restore_session",
        json!({"session_id": id, "name": "other"}),
    )
    .await;
    assert_eq!(missing.is_error, Some(true));
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn calls_without_a_session_never_see_each_others_files() {
    let s = stdio_server(&[]).await;
    let mut seen_dirs = Vec::new();
    for n in 0..5 {
        // A Rhai call between Python ones uses (and throws away) a session
        // prepared ahead as well.
        if n == 2 {
            let (r, is_error, _) = exec(&s.client, json!({"language": "rhai", "code": "1"})).await;
            assert!(!is_error, "{r:#}");
        }
        let code = format!(
            "import os\nopen('mark-{n}', 'w').write('x')\n[os.getcwd(), sorted(os.listdir('.'))]"
        );
        let (r, is_error, _) = exec(&s.client, json!({"language": "python", "code": code})).await;
        assert!(!is_error, "{r:#}");
        let dir = r["value"][0].as_str().expect("cwd").to_owned();
        let marks: Vec<String> = r["value"][1]
            .as_array()
            .expect("listing")
            .iter()
            .filter_map(Value::as_str)
            .filter(|f| f.starts_with("mark-"))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            marks,
            vec![format!("mark-{n}")],
            "call {n} sees another call's files: {r:#}"
        );
        assert!(
            !seen_dirs.contains(&dir),
            "call {n} runs in an earlier call's directory {dir}"
        );
        seen_dirs.push(dir);
    }
    // Whatever the server made for them (its scratch root with the session
    // prepared for the next call, its cgroups) is gone once it exits.
    let left = || server_leftovers(s.pid);
    assert!(
        left().len() >= 3,
        "the server's scratch root and cgroups are not where this test looks: {:?}",
        left()
    );
    within("close", s.client.cancel()).await.unwrap();
    wait_gone(&[s.pid], "the server after its client went away").await;
    assert!(
        left().is_empty(),
        "left after the server exited: {:?}",
        left()
    );
}

/// Rhai workers below `server` started ahead for a prepared session's
/// call: fork-server children waiting for a cell they have not been given
/// (they rename themselves once they have it), or cold workers.
fn waiting_rhai_workers(server: i32) -> Vec<i32> {
    // A fork-server child waiting for its cell, or, when the fork server
    // was not there to ask (restarted after a stall under load), a cold
    // worker started for it.
    common::descendants(server)
        .into_iter()
        .filter(|p| common::comm(*p) == "cellbox-spare" || common::cmdline(*p).contains("__worker"))
        .collect()
}

/// Whether a Python process shares the session cgroup of `pid` (without
/// session cgroups, any Python process in its group, a zygote included).
fn has_python_sibling(pid: i32) -> bool {
    let session = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/cgroup"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains(":pids:"))
            .and_then(|l| l.rsplit_once('/').map(|(dir, _)| dir.to_owned()))
    };
    let Some(mine) = session(pid) else {
        return false;
    };
    process_stats().iter().any(|p| {
        p.pid != pid
            && common::comm(p.pid).starts_with("python")
            && session(p.pid).as_deref() == Some(mine.as_str())
    })
}

/// Each call without a session runs in a session made for it alone, with
/// a worker started ahead that no other call runs in: a Python call in a
/// new, empty scratch directory; a Rhai call in a worker that is gone once
/// the call is over, together with the Python worker prepared beside it and
/// never used. Once the server exits, nothing it prepared is left: no
/// process, no scratch directory, no cgroup.
#[tokio::test]
async fn calls_without_a_session_each_run_in_a_fresh_prepared_session_and_leave_nothing() {
    let s = stdio_server(&[]).await;
    let mut dirs: Vec<String> = Vec::new();
    let mut ran_rhai: Vec<i32> = Vec::new();
    for n in 0..4 {
        let code = "import os\n[os.getcwd(), sorted(os.listdir('.'))]";
        let (r, is_error, _) = exec(&s.client, json!({"language": "python", "code": code})).await;
        assert!(!is_error, "{r:#}");
        let dir = r["value"][0].as_str().expect("cwd").to_owned();
        assert_eq!(r["value"][1], json!([]), "call {n} found files: {r:#}");
        assert!(!dirs.contains(&dir), "call {n} runs in {dir} again");
        dirs.push(dir);
        // The workers waiting before the last Rhai call went with its
        // session (or, had they been started for the session prepared
        // while it ran, with this call's).
        wait_gone(&ran_rhai, "the workers of a used session").await;
        if n == 3 {
            break;
        }
        // After a first Rhai call, the session prepared for the next call
        // has a Rhai worker waiting too.
        let before = if n == 0 {
            Vec::new()
        } else {
            // Its session is ready once both its workers wait (the Python
            // one is started after the Rhai one, and may take a moment to
            // be ready): a call that comes sooner makes its own.
            let t0 = Instant::now();
            loop {
                let w = waiting_rhai_workers(s.pid);
                if !w.is_empty() && w.iter().all(|p| has_python_sibling(*p)) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break w;
                }
                assert!(
                    t0.elapsed() < PATIENCE,
                    "no Rhai worker was started ahead for the call after call {n}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        assert!(
            before.iter().all(|p| !ran_rhai.contains(p)),
            "a worker that ran a Rhai call waits for another: {before:?}"
        );
        let (r, is_error, _) = exec(&s.client, json!({"language": "rhai", "code": "40 + 2"})).await;
        assert!(!is_error, "{r:#}");
        assert_eq!(r["value"], json!(42), "{r:#}");
        ran_rhai.extend(before);
    }
    let left = || server_leftovers(s.pid);
    assert!(
        left().len() >= 3,
        "the server's scratch root and cgroups are not where this test looks: {:?}",
        left()
    );
    // The next call's session is prepared, with a worker of each language.
    let t0 = Instant::now();
    while waiting_rhai_workers(s.pid).is_empty() {
        assert!(t0.elapsed() < PATIENCE, "no worker was started ahead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut all = common::descendants(s.pid);
    all.push(s.pid);
    within("close", s.client.cancel()).await.unwrap();
    wait_gone(
        &all,
        "the server and what it started, after its client went away",
    )
    .await;
    assert!(
        left().is_empty(),
        "left after the server exited: {:?}",
        left()
    );
}

/// A worker started ahead for a call without a session runs a cell of its
/// own while it waits (its warm-up): the call's cell sees nothing of it,
/// neither its variables and definitions nor its module, and the warm-up
/// printed nothing into the call's output.
#[tokio::test]
async fn a_worker_that_warmed_up_ahead_gives_the_call_a_clean_cell() {
    let s = stdio_server(&[]).await;
    let py = "import sys\n[k in globals() for k in ('x', 'v', 'a', 'f')] + [sys.modules['__main__'].__dict__ is globals()]";
    let rhai = r#"[is_def_var("a"), is_def_var("m"), is_def_var("n"), is_def_fn("f", 1)]"#;
    for round in 0..3 {
        // Calls of both languages, so that the next session is prepared
        // with a worker of each; then the time for them to warm up.
        let t0 = Instant::now();
        while round > 0 && waiting_rhai_workers(s.pid).is_empty() {
            assert!(t0.elapsed() < PATIENCE, "no Rhai worker was started ahead");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (r, is_error, _) = exec(&s.client, json!({"language": "python", "code": py})).await;
        assert!(!is_error, "{r:#}");
        assert_eq!(
            r["value"],
            json!([false, false, false, false, true]),
            "{r:#}"
        );
        assert_eq!(r["stdout"], json!(""), "{r:#}");
        assert_eq!(r["stderr"], json!(""), "{r:#}");
        assert_eq!(r["vars"]["changed"], json!([]), "{r:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (r, is_error, _) = exec(&s.client, json!({"language": "rhai", "code": rhai})).await;
        assert!(!is_error, "{r:#}");
        assert_eq!(r["value"], json!([false, false, false, false]), "{r:#}");
        assert_eq!(r["stdout"], json!(""), "{r:#}");
        assert_eq!(r["stderr"], json!(""), "{r:#}");
        assert_eq!(r["calls"], json!([]), "{r:#}");
    }
    within("close", s.client.cancel()).await.unwrap();
}

/// Two sessions are kept prepared for calls without one for a while after
/// two such calls overlapped; once that is over and the server is idle,
/// the second is given back, with the worker started ahead for it.
#[tokio::test]
async fn a_second_prepared_session_is_given_back_once_calls_stop_overlapping() {
    let s = stdio_server(&[]).await;
    // Two Rhai calls at once, each long enough for the other to start.
    let slow = json!({"language": "rhai", "code": "let x = 0; for i in 0..400000 { x += i; } x"});
    let (a, b) = tokio::join!(exec(&s.client, slow.clone()), exec(&s.client, slow));
    assert!(!a.1 && !b.1, "{:#} {:#}", a.0, b.0);
    let t0 = Instant::now();
    while waiting_rhai_workers(s.pid).len() < 2 {
        assert!(
            t0.elapsed() < PATIENCE,
            "two sessions were not prepared after two calls overlapped: {:?}",
            waiting_rhai_workers(s.pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two are wanted for 5 s after the overlap; the server looks every 2 s.
    let t0 = Instant::now();
    loop {
        let n = waiting_rhai_workers(s.pid).len();
        if n == 1 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{n} prepared Rhai workers are still waiting on an idle server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The one left is used by the next call.
    let (r, is_error, _) = exec(&s.client, json!({"language": "rhai", "code": "1"})).await;
    assert!(!is_error, "{r:#}");
    within("close", s.client.cancel()).await.unwrap();
}

/// A named session's next cell has its worker started once the last cell
/// is over, in that cell's language and with its limits: the next Rhai
/// cell runs in it (with the session's values), one is waiting again after
/// each (a call with other limits replaces it), and the one waiting when
/// the session is closed goes with it.
#[tokio::test]
async fn a_named_sessions_next_cell_runs_in_a_worker_started_ahead() {
    let s = stdio_server(&[]).await;
    let created = call(&s.client, "create_session", json!({})).await;
    assert_eq!(created.is_error, Some(false));
    let id = created.structured_content.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The tool list waits for the server's probe cells, whose workers
    // are then gone (none is left waiting: only named sessions prepare).
    tools(&s.client).await;
    let others = waiting_rhai_workers(s.pid);
    let ahead = |used: &[i32]| {
        let mut w = waiting_rhai_workers(s.pid);
        w.retain(|p| !others.contains(p) && !used.contains(p));
        w
    };
    let (r, e, _) = exec(
        &s.client,
        json!({"language": "rhai", "code": "let a = 40; a", "session_id": id}),
    )
    .await;
    assert!(!e, "{r:#}");
    assert_eq!(r["value"], json!(40), "{r:#}");
    let mut used: Vec<i32> = Vec::new();
    for n in 0..4 {
        let t0 = Instant::now();
        let waiting = loop {
            let w = ahead(&used);
            if !w.is_empty() {
                break w;
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "no worker was started ahead for the session's cell {}",
                n + 2
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        if n == 4 {
            // Closing the session ends the worker waiting for it.
            let closed = call(&s.client, "close_session", json!({"session_id": id})).await;
            assert_eq!(closed.is_error, Some(false));
            wait_gone(&waiting, "the worker a closed session had waiting").await;
            break;
        }
        // From the third call on, with a limit of its own: the worker
        // waiting for the session's limits is ended after that call (it
        // ran in one forked for it), and one for the call's limits waits.
        let mut args = json!({"language": "rhai", "code": "a += 1; a", "session_id": id});
        if n >= 2 {
            args["timeout_seconds"] = json!(7);
        }
        let (r, e, _) = exec(&s.client, args).await;
        assert!(!e, "{r:#}");
        assert_eq!(r["value"], json!(41 + n), "{r:#}");
        // It ran the cell, or (n = 2) was replaced: one left waiting
        // would still be there.
        wait_gone(&waiting, "the worker started ahead, after the cell").await;
        used.extend(waiting);
    }
    within("close", s.client.cancel()).await.unwrap();
}

/// A call whose cell is answered at its worker's `done` is answered only
/// once nothing of the cell can run, and keeps its concurrency slot until
/// the cell's whole tree is gone. A forged `done` (the cell writes it
/// itself and lives on, with a child holding a file open) is answered at
/// once, its worker and child sent SIGKILL first; with one slot, the next
/// call (in a session of its own) runs only once both are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_answered_at_done_is_stopped_first_and_keeps_its_slot_until_its_tree_is_gone() {
    let s = stdio_server(&["--max-concurrency", "1"]).await;
    let token = format!("slot-held-{}", std::process::id());
    let forger = forged_done(&token);
    let (r, is_error, text) = exec(&s.client, json!({"language": "python", "code": forger})).await;
    let alive = common::running_holders_of(&token);
    assert!(!is_error, "{text}");
    assert_eq!(r["value"], json!("forged"), "{r}");
    assert!(
        alive.is_empty(),
        "processes of the call's cell could still run once it was answered: {alive:?}"
    );
    let (r, is_error, text) = exec(&s.client, json!({"language": "rhai", "code": "1"})).await;
    assert!(!is_error, "{text}");
    assert_eq!(r["value"], json!(1), "{r}");
    let left = holders_of(&token);
    assert!(
        left.is_empty(),
        "the next call ran while the previous call's processes lived: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_without_a_session_finds_its_session_made_at_start() {
    // By the time the tool list is answered, the session of the first
    // call that names none is made, its workers waiting: that call only
    // sends its code.
    let s = stdio_server(&[]).await;
    let _ = tools(&s.client).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = common::now_s();
    let (r, is_err, _) = exec(
        &s.client,
        json!({"language": "python", "code": "import os\n[os.stat('.').st_mtime, os.listdir('.')]"}),
    )
    .await;
    assert!(!is_err, "{r}");
    let made = r["value"][0].as_f64().unwrap();
    assert!(
        made < asked - 1.0,
        "its scratch was made at {made}, the call made at {asked}: {r}"
    );
    assert_eq!(r["value"][1], json!([]), "{r}");
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn calls_made_right_after_initialize_run_while_the_warm_workers_start() {
    // `initialize` is answered while the warm workers start and the sandbox
    // is probed: calls made at once wait only for the worker they need,
    // and the tool list asked for after them is whole.
    let s = stdio_server(&[]).await;
    let ((py, py_err, _), (rhai, rhai_err, _), (sh, sh_err, _)) = tokio::join!(
        exec(
            &s.client,
            json!({"language": "python", "code": "import os\n[6 * 7, os.getpid()]", "verbose": true})
        ),
        exec(&s.client, json!({"language": "rhai", "code": "6 * 7"})),
        exec(&s.client, json!({"language": "shell", "code": "echo 42"})),
    );
    assert!(!py_err && !rhai_err && !sh_err, "{py} {rhai} {sh}");
    assert_eq!(py["value"][0], 42, "{py}");
    // Forked from a zygote (a cold cell is PID 1 of its namespace).
    assert!(py["value"][1].as_i64().unwrap() > 1, "{py}");
    let hygiene = py["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "hygiene")
        .unwrap_or_else(|| panic!("no hygiene layer: {py}"));
    assert!(
        hygiene["detail"]
            .as_str()
            .unwrap()
            .contains("Python zygote"),
        "{py}"
    );
    assert_eq!(rhai["value"], 42, "{rhai}");
    assert_eq!(sh["stdout"], "42\n", "{sh}");
    let listed = tools(&s.client).await;
    let exec_tool = tool(&listed, "execute_code");
    let description = exec_tool.description.as_deref().unwrap_or("");
    for language in ["rhai", "python", "shell"] {
        assert!(description.contains(language), "{description}");
    }
    assert!(
        !description.contains("WARNING") && !description.contains("test cell"),
        "a probe failed: {description}"
    );
    s.client.cancel().await.unwrap();
}
