//! Upstream MCP servers as tools (`kind = "mcp"`): a fake rmcp server over
//! stdio (examples/fake_mcp_upstream.rs) and over streamable HTTP on
//! 127.0.0.1, called from Python and Rhai cells under the policy and the
//! tool-call budget; its failures (missing, isError, crash mid-call, hang,
//! not JSON) caught in the cell; restarted after it died; gone with the
//! supervisor.

use super::common::fake_upstream::FakeUpstream;
use super::common::{assert_tool_budget_ends_the_cell, bin, config, supervisor_with};
use cellbox::tools::{SupervisorSlot, ToolsConfig};
use cellbox::{CellRequest, Language, Status, Supervisor};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The fake upstream program, built beside the cellbox binary (built here
/// when a filtered `cargo test` did not build the examples).
fn fake_program() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = bin().parent().unwrap().to_path_buf();
            let exe = dir.join("examples").join("fake_mcp_upstream");
            let modified =
                |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            let newest_source = [
                "examples/fake_mcp_upstream.rs",
                "tests/suite/common/fake_upstream.rs",
            ]
            .iter()
            .filter_map(|p| modified(&src.join(p)))
            .max();
            if modified(&exe) < newest_source {
                // The profile this test was built with names its directory
                // (`dev`'s is `debug`).
                let profile = match dir.file_name().and_then(|n| n.to_str()) {
                    Some("debug") => "dev".to_string(),
                    Some(name) => name.to_string(),
                    None => panic!("{} names no profile", dir.display()),
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
                    .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
                    .status()
                    .unwrap();
                assert!(st.success(), "building the fake upstream failed: {st}");
            }
            assert!(exe.is_file(), "{} is missing", exe.display());
            exe
        })
        .clone()
}

fn stdio_supervisor(extra: &str) -> Supervisor {
    supervisor_with(&format!(
        "[tools.fake]\nkind = \"mcp\"\ncommand = [{:?}]\ntimeout_ms = 3000\n{extra}",
        fake_program().to_string_lossy()
    ))
}

async fn py(sup: &Supervisor, code: &str, allow: &[&str]) -> cellbox::CellResult {
    sup.run(CellRequest::new(Language::Python, code), config(allow))
        .await
}

const ERR: &str = r#"
def err(f):
    try:
        f()
        return None
    except Exception as e:
        return [type(e).__name__, str(e)]
"#;

fn outcomes(r: &cellbox::CellResult) -> Vec<(String, String)> {
    r.calls
        .iter()
        .map(|c| (c.cap.clone(), c.outcome.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_python_cell_calls_three_tools_in_a_loop() {
    let sup = stdio_supervisor("");
    let code = r#"
summary = []
for i in range(3):
    e = tools.fake.echo(text="n%d" % i)
    s = tool_call("fake.add", {"a": i, "b": 10})
    c = tools.fake.count(items=list(range(i)))
    summary.append([e["echo"], s["sum"], c])
batch = tool_call_batched([("fake.add", {"a": 1, "b": 2}), ("fake.add", {"a": "x", "b": 2})])
{"summary": summary, "batch": batch}
"#;
    let r = py(&sup, code, &["fake.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(
        r.value["summary"],
        json!([
            ["n0", 10.0, "0 items"],
            ["n1", 11.0, "1 items"],
            ["n2", 12.0, "2 items"]
        ])
    );
    assert_eq!(r.value["batch"][0], json!({"sum": 3.0}));
    assert_eq!(r.value["batch"][1]["type"], "ValueError", "{r:?}");
    let o = outcomes(&r);
    for tool in ["fake.echo", "fake.add", "fake.count"] {
        assert!(
            o.iter().filter(|(c, out)| c == tool && out == "ok").count() >= 3,
            "{o:?}"
        );
    }
    assert!(
        o.contains(&("fake.add".into(), "invalid_args".into())),
        "{o:?}"
    );
    // Each call that reached the upstream counts against max_tool_calls.
    let models = r.models.expect("tool use is reported");
    assert_eq!(models.cell.tool_calls, 10, "{models:?}");

    // The budget ends the cell when spent.
    assert_tool_budget_ends_the_cell(&sup, "fake.*", "tools.fake.echo(text='x')").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_policy_denies_a_tool_and_names_are_known_without_starting() {
    // A server that cannot start: a denied call must not try to.
    let sup = stdio_supervisor(
        "[tools.missing]\nkind = \"mcp\"\ncommand = [\"/nonexistent/cellbox-upstream\"]\n",
    );
    assert!(sup.knows("fake.*"));
    assert!(sup.knows("fake.echo"));
    assert!(sup.knows("missing.anything"));
    assert!(!sup.knows("other.*"));
    assert!(!sup.knows("fake"));
    let code = format!(
        "{ERR}\n{{'echo': tools.fake.echo(text='ok'), 'add': err(lambda: tools.fake.add(a=1, b=2)), \
         'missing': err(lambda: tools.missing.x()), 'count': err(lambda: tool_call('fake.count', {{'items': []}}))}}"
    );
    let r = py(&sup, &code, &["fake.echo"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    assert_eq!(v["echo"], json!({"echo": "ok"}));
    for k in ["add", "missing", "count"] {
        assert_eq!(v[k][0], "PermissionError", "{k}: {v}");
        assert!(
            v[k][1].as_str().unwrap().contains("not allowed"),
            "{k}: {v}"
        );
    }
    let o = outcomes(&r);
    assert!(o.contains(&("fake.add".into(), "denied".into())), "{o:?}");
    assert!(o.contains(&("missing.x".into(), "denied".into())), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_are_catchable_and_name_the_server_and_tool() {
    let sup = stdio_supervisor(
        "[tools.missing]\nkind = \"mcp\"\ncommand = [\"/nonexistent/cellbox-upstream\"]\n",
    );
    let code = format!(
        r#"{ERR}
before = tools.fake.pid()["pid"]
out = {{
 "fail": err(lambda: tools.fake.fail()),
 "hang": err(lambda: tools.fake.hang()),
 "garbage": err(lambda: tools.fake.garbage()),
 "unknown": err(lambda: tools.fake.no_such_tool()),
 "schema": err(lambda: tools.fake.echo(text=3)),
 "missing": err(lambda: tools.missing.anything(q=1)),
 "crash": err(lambda: tools.fake.crash()),
}}
after = tools.fake.pid()["pid"]
out["restarted"] = before != after
out["echo"] = tools.fake.echo(text="again")
out
"#
    );
    let r = py(&sup, &code, &["fake.*", "missing.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    let says = |k: &str, kind: &str, words: &[&str]| {
        assert_eq!(v[k][0], kind, "{k}: {v}");
        let m = v[k][1].as_str().unwrap();
        for w in words {
            assert!(m.contains(w), "{k}: {m:?} lacks {w:?}");
        }
    };
    says(
        "fail",
        "RuntimeError",
        &["fake.fail", "it failed on purpose"],
    );
    says(
        "hang",
        "RuntimeError",
        &["fake.hang", "did not answer within 3000 ms"],
    );
    says(
        "garbage",
        "RuntimeError",
        &[
            "fake.garbage",
            "upstream fake wrote output that is not JSON-RPC: \"this is not JSON at all\"",
            "(not JSON: ",
        ],
    );
    assert!(
        !v["garbage"][1].as_str().unwrap().contains("did not answer"),
        "{v}"
    );
    says(
        "unknown",
        "PermissionError",
        &["fake.no_such_tool", "has no tool"],
    );
    says("schema", "ValueError", &["fake.echo", "text"]);
    says(
        "missing",
        "RuntimeError",
        &[
            "missing.anything",
            "cannot start",
            "/nonexistent/cellbox-upstream",
        ],
    );
    says(
        "crash",
        "RuntimeError",
        &["fake.crash", "went away during the call"],
    );
    assert_eq!(v["restarted"], true, "{v}");
    assert_eq!(v["echo"], json!({"echo": "again"}));
}

fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie is dead: only its exit status is left.
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_no_orphan_after_the_supervisor_is_dropped() {
    let sup = stdio_supervisor("");
    let r = py(
        &sup,
        "[tools.fake.pid()['pid'], tools.fake.spawn_child()['pid']]",
        &["fake.*"],
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let pid = r.value[0].as_i64().unwrap();
    // Its child does not end when the server's stdin closes: only the kill
    // of the server's process group ends it.
    let child = r.value[1].as_i64().unwrap();
    assert!(alive(pid) && alive(child), "the upstream is not running");
    drop(sup);
    // Dropping the supervisor kills and reaps the upstream; a cell's
    // worker may still be finishing on a helper thread, so wait a while.
    let mut gone = false;
    for _ in 0..200 {
        if !alive(pid) && !alive(child) {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        gone,
        "the upstream {pid} or its child {child} outlived the supervisor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_over_streamable_http_with_a_bearer_token() {
    let url = cellbox::bench::tools::serve_mcp_http(FakeUpstream, Some("up-s3cret".into()))
        .await
        .unwrap();
    std::env::set_var("CELLBOX_TEST_UPSTREAM_TOKEN", "up-s3cret");
    let sup = supervisor_with(&format!(
        r#"
[tools.remote]
kind = "mcp"
url = "{url}"
token_env = "CELLBOX_TEST_UPSTREAM_TOKEN"
timeout_ms = 3000
[tools.nokey]
kind = "mcp"
url = "{url}"
token_env = "CELLBOX_TEST_UPSTREAM_TOKEN_UNSET"
"#
    ));
    let code = format!(
        "{ERR}\nimport os\n{{'add': tools.remote.add(a=2, b=3), 'echo': tool_call('remote.echo', {{'text': 'hi'}}), \
         'fail': err(lambda: tools.remote.fail()), 'nokey': err(lambda: tools.nokey.echo(text='x')), \
         'env': os.environ.get('CELLBOX_TEST_UPSTREAM_TOKEN')}}"
    );
    let r = py(&sup, &code, &["remote.*", "nokey.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    assert_eq!(v["add"], json!({"sum": 5.0}));
    assert_eq!(v["echo"], json!({"echo": "hi"}));
    assert_eq!(v["fail"][0], "RuntimeError");
    assert!(
        v["fail"][1].as_str().unwrap().contains("remote.fail"),
        "{v}"
    );
    assert_eq!(v["nokey"][0], "RuntimeError");
    assert!(
        v["nokey"][1]
            .as_str()
            .unwrap()
            .contains("CELLBOX_TEST_UPSTREAM_TOKEN_UNSET"),
        "{v}"
    );
    assert_eq!(v["env"], Value::Null, "the token reached the cell");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_rhai_per_tool_functions() {
    let sup = stdio_supervisor("");
    let code = r#"
let e = tools::fake::echo(#{text: "rhai"});
let s = tools::fake::add(#{a: 1, b: 2});
let p = tools::fake::pid();
let denied = "";
try { tools::fake::fail(); } catch (err) { denied = err.message; }
#{echo: e.echo, sum: s.sum, pid: type_of(p.pid), fail: denied}
"#;
    let r = sup
        .run(CellRequest::new(Language::Rhai, code), config(&["fake.*"]))
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value["echo"], "rhai");
    assert_eq!(r.value["sum"], 3.0);
    assert_eq!(r.value["pid"], "i64");
    assert!(
        r.value["fail"].as_str().unwrap().contains("fake.fail"),
        "{r:?}"
    );
    let o = outcomes(&r);
    assert!(o.contains(&("fake.echo".into(), "ok".into())), "{o:?}");
}

#[test]
fn upstream_serve_accepts_server_names_in_policy_allow_without_starting_them() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |allow: &str| {
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            format!(
                "[tools.fake]\nkind = \"mcp\"\ncommand = [\"/nonexistent/cellbox-upstream\"]\n\
                 [policy]\nallow = [{allow}]\n"
            ),
        )
        .unwrap();
        // stdin at EOF: serve starts, finds no MCP session, and exits.
        std::process::Command::new(bin())
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let ok = serve("\"fake.*\", \"fake.echo\"");
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{err}");
    assert!(!err.contains("policy.allow"), "{err}");
    let bad = serve("\"fake.*\", \"other.*\"");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{err}");
    assert!(err.contains("unknown capability \"other.*\""), "{err}");
    assert!(err.contains("fake.*"), "{err}");
}

/// A server that writes on stdout a line that is not JSON-RPC ends its
/// connection at once: the call in flight (or the handshake, for a banner)
/// fails with the line quoted, not after the timeout; a line over the cap
/// is not buffered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_output_that_is_not_json_rpc_fails_the_call_at_once() {
    // A timeout no test waits for: a call that waited would fail the test
    // by its message ("did not answer"), not by the clock.
    let sup = supervisor_with(&format!(
        "[tools.fake]\nkind = \"mcp\"\ncommand = [{prog:?}]\ntimeout_ms = 120000\n\
         [tools.banner]\nkind = \"mcp\"\ncommand = [{prog:?}, \"--banner\"]\ntimeout_ms = 120000\n",
        prog = fake_program().to_string_lossy()
    ));
    let code = format!(
        r#"{ERR}
out = {{
 "json": err(lambda: tools.fake.json_not_rpc()),
 "huge": err(lambda: tools.fake.huge()),
 "garbage": err(lambda: tools.fake.garbage()),
 "banner": err(lambda: tools.banner.echo(text="x")),
 "banner_again": err(lambda: tools.banner.echo(text="x")),
}}
out["echo"] = tools.fake.echo(text="after")
out
"#
    );
    let r = py(&sup, &code, &["fake.*", "banner.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    let says = |k: &str, words: &[&str]| {
        assert_eq!(v[k][0], "RuntimeError", "{k}: {v}");
        let m = v[k][1].as_str().unwrap();
        for w in words {
            assert!(m.contains(w), "{k}: {m:?} lacks {w:?}");
        }
        assert!(!m.contains("did not answer"), "{k}: {m:?}");
    };
    says(
        "json",
        &[
            "fake.json_not_rpc: upstream fake wrote output that is not JSON-RPC",
            r#""{\"hello\": \"world\"}""#,
            "JSON, but not a JSON-RPC 2.0 message",
        ],
    );
    says(
        "huge",
        &[
            "fake.huge: upstream fake wrote a line of more than 4194304 bytes on stdout",
            "\"xxxxxxxx",
        ],
    );
    assert!(v["huge"][1].as_str().unwrap().len() < 1000, "{v}");
    says(
        "garbage",
        &["fake.garbage: upstream fake wrote output that is not JSON-RPC"],
    );
    for k in ["banner", "banner_again"] {
        says(
            k,
            &[
                "banner.echo: upstream banner wrote output that is not JSON-RPC",
                r#""fake upstream 0.0.1 starting""#,
                "before the MCP handshake completed",
            ],
        );
    }
    // The server was started again after each fault.
    assert_eq!(v["echo"], json!({"echo": "after"}));
    let o = outcomes(&r);
    assert!(o.contains(&("fake.huge".into(), "failed".into())), "{o:?}");
}

/// A TLS front on 127.0.0.1 for the plain server at `backend` (host:port),
/// with a certificate for 127.0.0.1 signed by itself: its port and the
/// certificate's PEM.
async fn tls_front(backend: String) -> (u16, String) {
    use tokio_rustls::rustls;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let pem = cert.pem();
    let key_der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der.into())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends here.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, pem)
}

/// https for `kind = "http"` and for `kind = "mcp"` with a url: trusted
/// with `ca_file`; without it the call fails with a certificate error
/// naming the tool; a missing or non-PEM `ca_file` is refused at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_https_with_ca_file() {
    let mcp = cellbox::bench::tools::serve_mcp_http(FakeUpstream, None)
        .await
        .unwrap();
    let mcp_backend = mcp
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let http_backend = super::tools::fake_server()
        .trim_start_matches("http://")
        .to_owned();
    let (mcp_port, pem) = tls_front(mcp_backend).await;
    let (http_port, http_pem) = tls_front(http_backend).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, format!("{pem}{http_pem}")).unwrap();
    let sup = supervisor_with(&format!(
        r#"
[tools.remote]
kind = "mcp"
url = "https://127.0.0.1:{mcp_port}/mcp"
ca_file = {ca:?}
timeout_ms = 120000
[tools.untrusted]
kind = "mcp"
url = "https://127.0.0.1:{mcp_port}/mcp"
timeout_ms = 120000
[tools.post]
kind = "http"
description = "post"
url = "https://127.0.0.1:{http_port}/x"
ca_file = {ca:?}
timeout_ms = 120000
[tools.post_untrusted]
kind = "http"
description = "post"
url = "https://127.0.0.1:{http_port}/x"
timeout_ms = 120000
"#
    ));
    let code = format!(
        "{ERR}\n{{'add': tools.remote.add(a=2, b=3), 'post': tool_call('post', {{'q': 1}}), \
         'untrusted': err(lambda: tools.untrusted.echo(text='x')), \
         'post_untrusted': err(lambda: tool_call('post_untrusted', {{'q': 1}}))}}"
    );
    let r = py(
        &sup,
        &code,
        &["remote.*", "untrusted.*", "post", "post_untrusted"],
    )
    .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v = &r.value;
    assert_eq!(v["add"], json!({"sum": 5.0}));
    assert_eq!(v["post"]["got"], json!({"q": 1}), "{v}");
    for (k, tool) in [
        ("untrusted", "untrusted.echo"),
        ("post_untrusted", "post_untrusted"),
    ] {
        assert_eq!(v[k][0], "RuntimeError", "{k}: {v}");
        let m = v[k][1].as_str().unwrap();
        assert!(m.contains(tool), "{k}: {m}");
        assert!(m.to_lowercase().contains("certificate"), "{k}: {m}");
    }

    // A missing or non-PEM ca_file is refused at startup, naming the key.
    #[derive(serde::Deserialize)]
    struct F {
        tools: ToolsConfig,
    }
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for (path, words) in [
        (dir.path().join("missing.pem"), "failed to read"),
        (not_pem, "holds no PEM certificate"),
    ] {
        for kind in ["kind = \"mcp\"", "kind = \"http\"\ndescription = \"\""] {
            let f: F = toml::from_str(&format!(
                "[tools.t]\n{kind}\nurl = \"https://127.0.0.1:9/x\"\nca_file = {path:?}\n"
            ))
            .unwrap();
            let e = cellbox::tools::host_and_declared(
                &Default::default(),
                &f.tools,
                &SupervisorSlot::default(),
            )
            .err()
            .unwrap()
            .to_string();
            assert!(e.contains("tools.t.ca_file"), "{e}");
            assert!(e.contains(words), "{e}");
            assert!(e.contains(&path.display().to_string()), "{e}");
        }
    }
}

/// The fake upstream over streamable HTTP on `listener`, counting the
/// connections that carried a tool call; a connection whose request
/// calls the tool `hang` is closed by the server at once. Aborting the
/// returned task (and its connections, in `conns`) stops the server.
fn serve_counted(
    listener: tokio::net::TcpListener,
    calls_on: Arc<std::sync::atomic::AtomicUsize>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) -> tokio::task::JoinHandle<()> {
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    let service = StreamableHttpService::new(
        || Ok(FakeUpstream),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let all = conns.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            let calls_on = calls_on.clone();
            let cut = Arc::new(tokio::sync::Notify::new());
            let counted = Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(async move {
                let cut2 = cut.clone();
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let service = service.clone();
                    let calls_on = calls_on.clone();
                    let counted = counted.clone();
                    let cut = cut2.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = cellbox::bench::tools::body_bytes(body).await;
                        let text = String::from_utf8_lossy(&bytes);
                        if text.contains("tools/call") && !counted.swap(true, Ordering::Relaxed) {
                            calls_on.fetch_add(1, Ordering::Relaxed);
                        }
                        if text.contains("\"hang\"") {
                            // The connection ends before any of the
                            // response (not even its headers) is written.
                            cut.notify_one();
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, std::convert::Infallible>(
                            service
                                .handle(http::Request::from_parts(
                                    parts,
                                    http_body_util::Full::new(bytes),
                                ))
                                .await,
                        )
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = cut.notified() => {}
                }
            });
            all.lock().unwrap().push(task);
        }
    })
}

/// The counting fake upstream (see [`serve_counted`]) on a free port, and
/// a supervisor whose tools server `remote` it is.
struct Counted {
    addr: std::net::SocketAddr,
    calls_on: Arc<std::sync::atomic::AtomicUsize>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    server: tokio::task::JoinHandle<()>,
    sup: Supervisor,
}

async fn counted_upstream() -> Counted {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls_on = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
    let server = serve_counted(listener, calls_on.clone(), conns.clone());
    let sup = supervisor_with(&format!(
        "[tools.remote]\nkind = \"mcp\"\nurl = \"http://{addr}/mcp\"\ntimeout_ms = 20000\n"
    ));
    Counted {
        addr,
        calls_on,
        conns,
        server,
        sup,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_http_many_calls_share_one_kept_alive_connection() {
    let up = counted_upstream().await;
    let code = "[tools.remote.add(a=i, b=1)['sum'] for i in range(60)]";
    let r = py(&up.sup, code, &["remote.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let want: Vec<Value> = (0..60).map(|i| json!(f64::from(i + 1))).collect();
    assert_eq!(r.value, Value::Array(want));
    // Kept alive, not one per call: one. A response is handed on only once
    // its SSE stream has ended, so the connection is back in the pool
    // before the cell can make its next call (this was 11 in a loaded CI
    // run when the response was handed on first). The one call allowed on
    // a second connection is for the pool's own task, which puts the
    // connection back, being run after that whole round trip.
    let conns = up.calls_on.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=2).contains(&conns),
        "60 tool calls were made over {conns} connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_http_server_restarted_between_calls_is_reconnected() {
    let Counted {
        addr,
        calls_on,
        conns,
        server,
        sup,
    } = counted_upstream().await;
    let r = py(&sup, "tools.remote.add(a=1, b=1)", &["remote.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!({"sum": 2.0}));
    // The server goes, with its connections and sessions, and comes back
    // on the same port.
    server.abort();
    for c in conns.lock().unwrap().drain(..) {
        c.abort();
    }
    let _ = server.await;
    // The port can stay taken for a moment: a process another test starts
    // meanwhile holds a copy of the old listener from its fork until it
    // closes what it inherited. Not for long.
    let mut tries = 0;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 200 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            Err(e) => panic!("the port {addr} could not be taken again: {e}"),
        }
    };
    let _server = serve_counted(listener, calls_on.clone(), conns);
    let code = "[tools.remote.add(a=2, b=2), tools.remote.add(a=3, b=3)]";
    let r = py(&sup, code, &["remote.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value, json!([{"sum": 4.0}, {"sum": 6.0}]), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_http_connection_closed_mid_call_is_a_clear_error() {
    // (The server runs on when its handle is dropped.)
    let Counted { sup, .. } = counted_upstream().await;
    let code = format!(
        "{ERR}\n[tools.remote.add(a=1, b=2), err(lambda: tools.remote.hang()), tools.remote.add(a=2, b=2)]"
    );
    let r = py(&sup, &code, &["remote.*"]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.value[0], json!({"sum": 3.0}));
    assert_eq!(r.value[1][0], "RuntimeError", "{r:?}");
    let msg = r.value[1][1].as_str().unwrap();
    assert!(msg.contains("remote.hang"), "{msg}");
    assert!(
        !msg.contains("did not answer within"),
        "the call hung: {msg}"
    );
    assert_eq!(r.value[2], json!({"sum": 4.0}), "{r:?}");
}

/// Python that stores `text` in the upstream `up` (when given) and prints
/// what `up` kept for this connection.
async fn store_and_read(sup: &Supervisor, tenant: &str, store: Option<&str>) -> (Status, String) {
    let mut code = String::new();
    if let Some(t) = store {
        code.push_str(&format!("tools.up.store(text={t:?})\n"));
    }
    code.push_str("print(tools.up.read()['stored'])");
    let mut c = config(&["up.*"]);
    c.account = cellbox::Account {
        chain: Default::default(),
        tenant: Some(cellbox::Tenant::new(tenant, false, 1 << 30)),
    };
    let r = sup.run(CellRequest::new(Language::Python, code), c).await;
    (r.status, r.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_has_its_own_upstream_connection_unless_shared() {
    let url = cellbox::bench::tools::serve_mcp_http(FakeUpstream, None)
        .await
        .unwrap();
    for (target, what) in [
        (format!("url = \"{url}\""), "an MCP session"),
        (
            format!("command = [{:?}]", fake_program().to_string_lossy()),
            "a process",
        ),
    ] {
        // Each tenant its own: B reads nothing of what A stored.
        let sup = supervisor_with(&format!("[tools.up]\nkind = \"mcp\"\n{target}\n"));
        let (st, a) = store_and_read(&sup, "a", Some("a-secret")).await;
        assert_eq!((st, a.as_str()), (Status::Ok, "['a-secret']\n"), "{what}");
        let (st, b) = store_and_read(&sup, "b", None).await;
        assert_eq!((st, b.as_str()), (Status::Ok, "[]\n"), "{what}");
        // A's connection is kept: A reads its own back.
        let (_, a) = store_and_read(&sup, "a", None).await;
        assert_eq!(a, "['a-secret']\n", "{what}");
        // Control: shared = true, one connection for all: B reads it.
        let sup = supervisor_with(&format!(
            "[tools.up]\nkind = \"mcp\"\n{target}\nshared = true\n"
        ));
        store_and_read(&sup, "a", Some("a-shared")).await;
        let (_, b) = store_and_read(&sup, "b", None).await;
        assert_eq!(b, "['a-shared']\n", "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_upstream_connections_are_counted_and_capped() {
    let prog = fake_program().to_string_lossy().into_owned();
    let sup = supervisor_with(&format!(
        "[tools.one]\nkind = \"mcp\"\ncommand = [{prog:?}]\n\
         [tools.two]\nkind = \"mcp\"\ncommand = [{prog:?}]\n"
    ));
    let ledger = std::sync::Arc::new(cellbox::Ledger::new(
        cellbox::Owner::Principal("t".into()),
        cellbox::Caps {
            connections: Some(1),
            ..Default::default()
        },
        None,
    ));
    let mut c = config(&["one.*", "two.*"]);
    c.account = cellbox::Account {
        chain: cellbox::Chain::new(vec![ledger]),
        tenant: Some(cellbox::Tenant::new("t", false, 1 << 30)),
    };
    let code = "print(tools.one.add(a=1, b=2)['sum'])\n\
                try:\n    tools.two.add(a=1, b=2)\nexcept RuntimeError as e:\n    print(e)";
    let r = sup
        .run(CellRequest::new(Language::Python, code), c.clone())
        .await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert!(r.stdout.starts_with("3.0\n"), "{r:?}");
    assert!(
        r.stdout.contains("max_upstream_connections")
            && r.stdout.contains("1 upstream connections are open, of 1"),
        "{r:?}"
    );
    // Control: another tenant without a cap gets both.
    c.account.chain = Default::default();
    c.account.tenant = Some(cellbox::Tenant::new("u", false, 1 << 30));
    let r = sup
        .run(
            CellRequest::new(
                Language::Python,
                "print(tools.one.add(a=1, b=2)['sum'], tools.two.add(a=1, b=2)['sum'])",
            ),
            c,
        )
        .await;
    assert_eq!(r.stdout, "3.0 3.0\n", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_list_without_end_or_nested_too_deep_fails_at_once_naming_its_bound() {
    use super::common::fake_upstream::OddList;
    let cases = [
        ("many", "lists more than 1024 tools"),
        ("huge", "lists tools of more than 8388608 bytes"),
        ("endless", "lists its tools in more than 64 pages"),
        ("deep", "nested deeper than 128 levels"),
    ];
    for (mode, want) in cases {
        let http = cellbox::bench::tools::serve_mcp_http(OddList(mode), None)
            .await
            .unwrap();
        for target in [
            format!("url = \"{http}\""),
            format!(
                "command = [{:?}, \"--list\", \"{mode}\"]",
                fake_program().to_string_lossy()
            ),
        ] {
            // A long timeout: the call must not wait it out.
            let sup = supervisor_with(&format!(
                "[tools.odd]\nkind = \"mcp\"\n{target}\ntimeout_ms = 120000\n"
            ));
            let t0 = std::time::Instant::now();
            let r = py(
                &sup,
                "try:\n    tools.odd.echo(text='x')\nexcept Exception as e:\n    print(e)",
                &["odd.*"],
            )
            .await;
            assert_eq!(r.status, Status::Ok, "{mode} {target}: {r:?}");
            assert!(r.stdout.contains(want), "{mode} {target}: {}", r.stdout);
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "{mode} {target}: it waited {:?}",
                t0.elapsed()
            );
        }
    }
    // Control: the same server with a list that is none of these answers.
    let sup = supervisor_with(&format!(
        "[tools.odd]\nkind = \"mcp\"\ncommand = [{:?}]\n",
        fake_program().to_string_lossy()
    ));
    let r = py(&sup, "print(tools.odd.echo(text='x'))", &["odd.*"]).await;
    assert_eq!(r.stdout, "{'echo': 'x'}\n", "{r:?}");
}
