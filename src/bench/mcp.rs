//! `cellbox bench --mcp`: `cellbox serve` over stdio as a child, driven by
//! rmcp's client the way an agent calls it, beside a bare
//! `/usr/bin/python3 -c pass` and the library measured in the same run.

use super::{cells, figures, p50_p99, spawn_once, Figures};
use crate::{Language, Supervisor};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The interpreter of the bare baseline.
const BARE_PYTHON: &str = "/usr/bin/python3";

/// The pause before each sample (as [`super::SETTLE`], longer): a call
/// without a session has its session torn down and the next one prepared
/// in the background from 1 ms after its reply, which is not to be charged
/// to the next sample.
const SETTLE: Duration = Duration::from_millis(5);

/// How long one call may take before the run is given up.
const PATIENCE: Duration = Duration::from_secs(60);

/// Rounds of the throughput comparison (each 100 cells through `serve`,
/// then 100 through the library).
const THROUGHPUT_ROUNDS: usize = 4;

/// Sessions held open for the memory figure.
const IDLE_SESSIONS: usize = 16;

/// A `serve` child and the client connected to it.
pub struct Served {
    client: RunningService<RoleClient, ()>,
    pid: u32,
}

impl Served {
    /// Start `binary serve` with `args` and initialize.
    pub async fn start(binary: &Path, args: &[&str]) -> Result<Served, String> {
        let mut cmd = tokio::process::Command::new(binary);
        cmd.arg("serve").args(args);
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {} serve: {e}", binary.display()))?;
        let pid = transport.id().ok_or("the server has no pid")?;
        let client = tokio::time::timeout(PATIENCE, ().serve(transport))
            .await
            .map_err(|_| "the server did not answer initialize".to_owned())?
            .map_err(|e| format!("initialize: {e}"))?;
        Ok(Served { client, pid })
    }

    pub fn peer(&self) -> Peer<RoleClient> {
        self.client.peer().clone()
    }

    /// Close the connection; the server exits when its stdin closes.
    pub async fn stop(self) {
        let _ = self.client.cancel().await;
    }
}

fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

/// A Rhai cell that prints [`CHATTY_BYTES`] bytes (400 lines), within
/// `serve`'s default cap on a stream, so that all of it is carried.
/// What the grown session holds (see its line).
const GROW: &str = r#"let context = ""; context.pad(1000000, 'x');
let rows = []; for i in 0..10000 { rows.push(#{id: i, name: `row ${i}`}) }
rows.len()"#;

/// The pause before each call of the grown session's line.
const GROWN_PAUSE: Duration = Duration::from_millis(50);

const CHATTY: &str = r#"let line = "0123456789012345678901234567890123456789012345678901234567890123456789012345678";
for i in 0..400 { print(line); }
1"#;
const CHATTY_BYTES: usize = 400 * 80;

/// A chatty cell's call, timed; one whose stdout did not come whole is an
/// error (the line would not measure what it says).
async fn timed_chatty(peer: &Peer<RoleClient>, args: Value) -> Result<Duration, String> {
    let t = Instant::now();
    let r = call(peer, "execute_code", args).await?;
    let d = t.elapsed();
    let got = r
        .structured_content
        .as_ref()
        .and_then(|v| v.get("stdout"))
        .and_then(Value::as_str)
        .map_or(0, str::len);
    if got != CHATTY_BYTES {
        return Err(format!(
            "the chatty cell's stdout came with {got} bytes, not {CHATTY_BYTES}"
        ));
    }
    Ok(d)
}

/// One tool call; a call that fails or reports an error is an error.
pub async fn call(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    args: Value,
) -> Result<CallToolResult, String> {
    let fut = peer.call_tool(CallToolRequestParams::new(tool).with_arguments(obj(args)));
    let r = match tokio::time::timeout(PATIENCE, fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(format!("{tool}: {e}")),
        Err(_) => return Err(format!("{tool}: no answer within {PATIENCE:?}")),
    };
    if r.is_error == Some(true) {
        return Err(format!("{tool} failed: {:?}", r.content));
    }
    Ok(r)
}

async fn timed(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    args: Value,
) -> Result<Duration, String> {
    let t = Instant::now();
    call(peer, tool, args).await?;
    Ok(t.elapsed())
}

/// Samples of one line of the report, with the time they took in all.
#[derive(Default)]
struct Series {
    samples: Vec<Duration>,
    total: Duration,
}

impl Series {
    fn push(&mut self, d: Duration) {
        self.samples.push(d);
        self.total += d;
    }

    fn figures(self) -> Figures {
        figures(self.samples, self.total)
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

/// Create a session; its id.
pub async fn create_session(peer: &Peer<RoleClient>) -> Result<String, String> {
    let r = call(peer, "create_session", json!({})).await?;
    r.structured_content
        .as_ref()
        .and_then(|s| s["session_id"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| "create_session gave no session id".to_owned())
}

/// `n` sessionless Python `pass` cells through `peer` at `concurrency`.
async fn mcp_throughput(
    peer: &Peer<RoleClient>,
    n: usize,
    concurrency: usize,
) -> Result<Figures, String> {
    let t0 = Instant::now();
    let per = n.div_ceil(concurrency.max(1));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let peer = peer.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = Vec::with_capacity(per);
            for _ in 0..per {
                s.push(
                    timed(
                        &peer,
                        "execute_code",
                        json!({"language": "python", "code": "pass"}),
                    )
                    .await?,
                );
            }
            Ok::<_, String>(s)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(figures(all, t0.elapsed()))
}

/// The MCP report: `serve` (this binary) driven over stdio, `n` samples a
/// line, interleaved with the bare baseline.
pub async fn run(n: usize, sdk_pythons: &[PathBuf]) -> Result<String, String> {
    for python in sdk_pythons {
        sdk_importable(python).await?;
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let served = Served::start(&me, &["--python", BARE_PYTHON]).await?;
    let peer = served.peer();
    let mut out = String::new();
    let py = |code: &str| json!({"language": "python", "code": code});
    // Warm-up: the pools are started by `serve`, the first cells of each
    // kind pay for what is made once (the probe, a session's worker).
    let session = create_session(&peer).await?;
    let in_session = json!({"language": "python", "code": "pass", "session_id": session});
    let rhai_in_session = json!({"language": "rhai", "code": "1", "session_id": session});
    let chatty_in_session = json!({"language": "rhai", "code": CHATTY, "session_id": session});
    for _ in 0..5 {
        call(&peer, "list_sessions", json!({})).await?;
        call(&peer, "execute_code", py("pass")).await?;
        call(&peer, "execute_code", in_session.clone()).await?;
        call(&peer, "execute_code", rhai_in_session.clone()).await?;
        timed_chatty(&peer, chatty_in_session.clone()).await?;
        call(
            &peer,
            "execute_code",
            json!({"language": "rhai", "code": "1"}),
        )
        .await?;
    }
    // The library in this process: the same Rhai cell through it, in a
    // session that has its next cell's worker started ahead as `serve`
    // does, is sampled in turn with the calls; the throughput below
    // compares against it too.
    let lib = Supervisor::builder()
        .warm(true)
        .python(BARE_PYTHON)
        .build()
        .map_err(|e| e.to_string())?;
    lib.start_pools().await.map_err(|e| e.to_string())?;
    let lib_session = super::prepared_session(&lib)?;
    for _ in 0..5 {
        super::timed_session_cell(&lib_session, "1".into()).await?;
        super::timed_session_cell(&lib_session, CHATTY.into()).await?;
    }
    let bare = [BARE_PYTHON, "-c", "pass"];
    let (mut chatty, mut lib_chatty) = (Series::default(), Series::default());
    let (mut list, mut base, mut pass, mut sess, mut rhai, mut rhai_sess, mut lib_rhai) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    for _ in 0..n {
        tokio::time::sleep(SETTLE).await;
        list.push(timed(&peer, "list_sessions", json!({})).await?);
        tokio::time::sleep(SETTLE).await;
        base.push(tokio::task::block_in_place(|| spawn_once(&bare))?);
        tokio::time::sleep(SETTLE).await;
        pass.push(timed(&peer, "execute_code", py("pass")).await?);
        tokio::time::sleep(SETTLE).await;
        sess.push(timed(&peer, "execute_code", in_session.clone()).await?);
        tokio::time::sleep(SETTLE).await;
        rhai.push(
            timed(
                &peer,
                "execute_code",
                json!({"language": "rhai", "code": "1"}),
            )
            .await?,
        );
        tokio::time::sleep(SETTLE).await;
        rhai_sess.push(timed(&peer, "execute_code", rhai_in_session.clone()).await?);
        tokio::time::sleep(SETTLE).await;
        lib_rhai.push(super::timed_session_cell(&lib_session, "1".into()).await?);
        tokio::time::sleep(SETTLE).await;
        chatty.push(timed_chatty(&peer, chatty_in_session.clone()).await?);
        tokio::time::sleep(SETTLE).await;
        lib_chatty.push(super::timed_session_cell(&lib_session, CHATTY.into()).await?);
    }
    let (chatty, lib_chatty) = (chatty.figures(), lib_chatty.figures());
    let (list, base, pass, sess, rhai, rhai_sess, lib_rhai) = (
        list.figures(),
        base.figures(),
        pass.figures(),
        sess.figures(),
        rhai.figures(),
        rhai_sess.figures(),
        lib_rhai.figures(),
    );
    let _ = writeln!(
        out,
        "mcp: serve over stdio, rmcp client, {n} of each in turn with spawn+wait {BARE_PYTHON} -c pass"
    );
    let _ = writeln!(
        out,
        "baseline {BARE_PYTHON} -c pass      {}",
        p50_p99(&base)
    );
    let _ = writeln!(out, "mcp list_sessions (round trip)     {}", p50_p99(&list));
    for (what, f) in [("no session", &pass), ("in a session", &sess)] {
        let _ = writeln!(
            out,
            "mcp execute_code python pass, {what:12} {}  (p50 = {:.2}x bare python3 -c pass; goal <= 0.20x)",
            p50_p99(f),
            ratio(f.p50, base.p50)
        );
    }
    let _ = writeln!(
        out,
        "mcp execute_code rhai 1, no session   {}  (p50 = {:.2}x list_sessions; goal <= 1.5x)",
        p50_p99(&rhai),
        ratio(rhai.p50, list.p50)
    );
    let _ = writeln!(
        out,
        "mcp execute_code rhai 1, in a session {}  (p50 = {:.2}x list_sessions)",
        p50_p99(&rhai_sess),
        ratio(rhai_sess.p50, list.p50)
    );
    // What the call costs beyond the round trip and the warm cell itself
    // (whose process is forked, runs, and exits before its result).
    let beyond = rhai.p50.as_secs_f64() - list.p50.as_secs_f64() - lib_rhai.p50.as_secs_f64();
    let _ = writeln!(
        out,
        "library rhai 1, in a session, its worker started ahead {}  (the MCP call's p50 less list_sessions' and this: {:+.2} ms)",
        p50_p99(&lib_rhai),
        beyond * 1e3
    );
    // The same calls through the official Python SDK, which an agent
    // built on it pays for too (its own per-call work, and checking each
    // result against the tool's output schema), against its own
    // list_sessions and the bare baseline of this run.
    for python in sdk_pythons {
        sdk_lines(&mut out, &me, python, n, &base).await?;
    }
    // What carrying a cell's output costs through MCP (the result fitted,
    // serialized, sent and read) beyond what it costs through the library.
    let more = |a: &Figures, b: &Figures| (a.p50.as_secs_f64() - b.p50.as_secs_f64()) * 1e3;
    let _ = writeln!(
        out,
        "mcp execute_code rhai printing {CHATTY_BYTES} bytes, in a session {}  ({:+.2} ms over rhai 1; through the library {}, {:+.2} ms over its rhai 1)",
        p50_p99(&chatty),
        more(&chatty, &rhai_sess),
        p50_p99(&lib_chatty),
        more(&lib_chatty, &lib_rhai)
    );

    // A session that has grown: the same Rhai cell in a session holding a
    // 1 MB string and 10,000 small maps, after a pause long enough for its
    // next worker to be started and sent them (an agent's next step comes
    // after a model's turn, much later).
    let grown = create_session(&peer).await?;
    call(
        &peer,
        "execute_code",
        json!({"language": "rhai", "session_id": grown, "code": GROW}),
    )
    .await?;
    let rhai_grown = json!({"language": "rhai", "code": "1", "session_id": grown});
    let (mut big, mut small) = (Series::default(), Series::default());
    for _ in 0..n {
        tokio::time::sleep(GROWN_PAUSE).await;
        big.push(timed(&peer, "execute_code", rhai_grown.clone()).await?);
        tokio::time::sleep(GROWN_PAUSE).await;
        small.push(timed(&peer, "execute_code", rhai_in_session.clone()).await?);
    }
    let (big, small) = (big.figures(), small.figures());
    let _ = writeln!(
        out,
        "mcp execute_code rhai 1, in a session holding a 1 MB string and 10,000 maps, {} ms apart {}  ({:.2}x rhai 1 in a session holding nothing, in turn with it: {})",
        GROWN_PAUSE.as_millis(),
        p50_p99(&big),
        ratio(big.p50, small.p50),
        p50_p99(&small)
    );
    call(&peer, "close_session", json!({"session_id": grown})).await?;

    // Throughput: through serve and through the library in this process
    // (the same cells, the same concurrency), in alternating rounds, so
    // that a noisy moment of the machine falls on both.
    cells(&lib, Language::Python, "pass", 20, 2).await?;
    let per_round = 100;
    let (mut through_n, mut through_t, mut direct_n, mut direct_t) =
        (0usize, Duration::ZERO, 0usize, Duration::ZERO);
    for _ in 0..THROUGHPUT_ROUNDS {
        let t = Instant::now();
        mcp_throughput(&peer, per_round, 2).await?;
        through_t += t.elapsed();
        through_n += per_round;
        let t = Instant::now();
        cells(&lib, Language::Python, "pass", per_round, 2).await?;
        direct_t += t.elapsed();
        direct_n += per_round;
    }
    drop(lib_session);
    drop(lib);
    let rate = |n: usize, t: Duration| n as f64 / t.as_secs_f64().max(1e-9);
    let (through, direct) = (rate(through_n, through_t), rate(direct_n, direct_t));
    let _ = writeln!(
        out,
        "mcp {through_n} python cells at concurrency 2 ({THROUGHPUT_ROUNDS} rounds, alternating with the library): {through:.0} cells/s vs the library's {direct:.0} cells/s ({:.0}%; goal >= 90%)",
        100.0 * through / direct.max(1e-9)
    );

    // Memory: the server and everything it started, with sessions idle
    // that each ran a Python cell. The session above ran Rhai cells too
    // and keeps its next Rhai worker waiting, a process of its own that is
    // measured on its own below.
    call(&peer, "close_session", json!({"session_id": session})).await?;
    let mut ids = Vec::with_capacity(IDLE_SESSIONS);
    while ids.len() < IDLE_SESSIONS {
        ids.push(create_session(&peer).await?);
    }
    for id in &ids {
        call(
            &peer,
            "execute_code",
            json!({"language": "python", "code": "x = 1", "session_id": id}),
        )
        .await?;
    }
    // The server gives back freed memory once idle (see `serve`).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = tree_memory(served.pid, |_| true);
    // A session's processes (its live state, the state's spare, a cell
    // started ahead for a prepared session) are forked by a Python zygote
    // or by a state process: children of a Python process.
    let pools = tree_memory(served.pid, |pid| {
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|st| {
                let rest = st.get(st.rfind(')')? + 2..)?;
                rest.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        !parent.is_some_and(|p| comm(p).starts_with("python"))
    });
    let mib = |kb: u64| kb as f64 / 1024.0;
    let _ = writeln!(
        out,
        "mcp serve + pools, {IDLE_SESSIONS} idle sessions: {:.1} MiB RSS (goal <= 60 MiB), {:.1} MiB PSS; with the sessions' own processes (live state, spares): {:.1} MiB RSS, {:.1} MiB PSS (PSS counts pages shared between processes, such as the engine binary's, once)",
        mib(pools.0),
        mib(pools.1),
        mib(all.0),
        mib(all.1)
    );
    // What a session whose last cell was Rhai holds besides: the worker
    // started ahead for its next cell (forked by the Rhai fork server).
    call(
        &peer,
        "execute_code",
        json!({"language": "rhai", "code": "1", "session_id": ids[0]}),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_rhai = tree_memory(served.pid, |_| true);
    let _ = writeln!(
        out,
        "mcp a session's next Rhai worker, waiting: {:+.1} MiB RSS, {:+.1} MiB PSS",
        mib(with_rhai.0) - mib(all.0),
        mib(with_rhai.1) - mib(all.1)
    );
    served.stop().await;

    starts(&mut out, &me).await?;
    Ok(out)
}

/// Starts of `serve` timed by [`starts`].
const STARTS: usize = 20;

/// How long a stopped `serve` may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(10);

/// One start of `serve` as a client that spawns it per task sees it: from
/// the spawn to `initialize` answered, to `tools/list` answered, and to a
/// Python `pass` cell's result. The server is stopped and gone after.
async fn one_start(binary: &Path) -> Result<[Duration; 3], String> {
    let t = Instant::now();
    let served = Served::start(binary, &["--python", BARE_PYTHON]).await?;
    let init = t.elapsed();
    let peer = served.peer();
    match tokio::time::timeout(PATIENCE, peer.list_all_tools()).await {
        Ok(Ok(tools)) if tools.iter().any(|t| t.name == "execute_code") => {}
        Ok(Ok(_)) => return Err("tools/list gave no execute_code".to_owned()),
        Ok(Err(e)) => return Err(format!("tools/list: {e}")),
        Err(_) => return Err(format!("tools/list: no answer within {PATIENCE:?}")),
    }
    let listed = t.elapsed();
    call(
        &peer,
        "execute_code",
        json!({"language": "python", "code": "pass"}),
    )
    .await?;
    let first = t.elapsed();
    let pid = served.pid;
    served.stop().await;
    // The next start is not to share the machine with this one's exit.
    let gone = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|st| st.rsplit(')').next().is_some_and(|r| !r.starts_with(" Z")))
    {
        if gone.elapsed() > EXIT_WITHIN {
            return Err(format!("serve ({pid}) did not exit within {EXIT_WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok([init, listed, first])
}

/// What a client that starts `serve` for each task waits for before its
/// first result, in turn with a bare `python3 -c pass`.
async fn starts(out: &mut String, me: &Path) -> Result<(), String> {
    let bare = [BARE_PYTHON, "-c", "pass"];
    let (mut base, mut init, mut listed, mut first) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    one_start(me).await?;
    for _ in 0..STARTS {
        tokio::time::sleep(SETTLE * 10).await;
        base.push(tokio::task::block_in_place(|| spawn_once(&bare))?);
        tokio::time::sleep(SETTLE * 10).await;
        let [i, l, f] = one_start(me).await?;
        init.push(i);
        listed.push(l);
        first.push(f);
    }
    let (base, init, listed, first) = (
        base.figures(),
        init.figures(),
        listed.figures(),
        first.figures(),
    );
    let _ = writeln!(
        out,
        "mcp serve started for one task ({STARTS} starts: spawned, initialize, tools/list, python pass), to the first result {}  ({:.2}x bare python3 -c pass in turn with it: {}); initialize answered p50 {:.1} ms, tools/list p50 {:.1} ms",
        p50_p99(&first),
        ratio(first.p50, base.p50),
        p50_p99(&base),
        init.p50.as_secs_f64() * 1e3,
        listed.p50.as_secs_f64() * 1e3
    );
    Ok(())
}

/// The driver `--mcp-python` runs (see its docstring).
const SDK_DRIVER: &str = include_str!("mcp_sdk.py");

/// What the driver prints: the SDK's version and each line's samples, in
/// seconds.
#[derive(serde::Deserialize)]
struct SdkSamples {
    version: String,
    list: Vec<f64>,
    python: Vec<f64>,
    rhai: Vec<f64>,
    rhai_session: Vec<f64>,
    python_full_schema: Vec<f64>,
}

/// That `python` runs and has the SDK, said before the run rather than
/// after the rest of it.
async fn sdk_importable(python: &Path) -> Result<(), String> {
    let out = tokio::process::Command::new(python)
        .args(["-c", "import mcp"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, out)
        .await
        .map_err(|_| {
            format!(
                "{} -c 'import mcp' took over {PATIENCE:?}",
                python.display()
            )
        })?
        .map_err(|e| format!("--mcp-python {}: cannot run it: {e}", python.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "--mcp-python {}: it cannot import mcp, the official MCP Python SDK ({}); \
         give an interpreter that has it (`pip install mcp` in a venv)",
        python.display(),
        err.lines().last().unwrap_or("no error printed")
    ))
}

/// `cellbox serve` (this binary) driven through the official MCP Python SDK
/// in `python`, `n` rounds; its lines appended to `out`.
async fn sdk_lines(
    out: &mut String,
    me: &Path,
    python: &Path,
    n: usize,
    bare: &Figures,
) -> Result<(), String> {
    let me = me.to_str().ok_or("this binary's path is not UTF-8")?;
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-c")
        .arg(SDK_DRIVER)
        .arg(me)
        .arg(BARE_PYTHON)
        .arg(n.to_string())
        .arg(SETTLE.as_secs_f64().to_string())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // Each round is five calls with a pause before each; a minute more
    // for the server's start, its pools and the warm-up.
    let patience = PATIENCE + (SETTLE + Duration::from_millis(50)) * 5 * n as u32;
    let done = tokio::time::timeout(patience, cmd.output())
        .await
        .map_err(|_| {
            format!(
                "the MCP Python SDK driver ({}) took over {patience:?}",
                python.display()
            )
        })?
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !done.status.success() {
        let err = String::from_utf8_lossy(&done.stderr);
        let last = err.lines().rev().take(5).collect::<Vec<_>>();
        return Err(format!(
            "the MCP Python SDK driver ({}) failed ({}): {}",
            python.display(),
            done.status,
            last.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let stdout = String::from_utf8_lossy(&done.stdout);
    let s: SdkSamples = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("the MCP Python SDK driver printed no samples: {stdout}"))?;
    let series = |v: &[f64]| -> Result<Figures, String> {
        if v.len() != n || v.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(format!(
                "the MCP Python SDK driver gave {} samples, not {n} durations",
                v.len()
            ));
        }
        let d: Vec<Duration> = v.iter().map(|x| Duration::from_secs_f64(*x)).collect();
        let total = d.iter().sum();
        Ok(figures(d, total))
    };
    let (list, py, rhai, rhai_sess, py_full) = (
        series(&s.list)?,
        series(&s.python)?,
        series(&s.rhai)?,
        series(&s.rhai_session)?,
        series(&s.python_full_schema)?,
    );
    let who = format!("mcp (Python SDK {})", s.version);
    let _ = writeln!(
        out,
        "{who}: serve over stdio, the SDK's ClientSession run by {}, {n} of each in turn",
        python.display()
    );
    let _ = writeln!(
        out,
        "{who} list_sessions (round trip)     {}",
        p50_p99(&list)
    );
    let _ = writeln!(
        out,
        "{who} execute_code python pass, no session {}  (p50 = {:.2}x bare python3 -c pass)",
        p50_p99(&py),
        ratio(py.p50, bare.p50)
    );
    let _ = writeln!(
        out,
        "{who} execute_code python pass, no session, serve listing the full output schema \
         (--output-schema full) {}  (p50 = {:.2}x bare python3 -c pass; {:+.2} ms over the compact one's)",
        p50_p99(&py_full),
        ratio(py_full.p50, bare.p50),
        (py_full.p50.as_secs_f64() - py.p50.as_secs_f64()) * 1e3
    );
    for (what, f) in [("no session  ", &rhai), ("in a session", &rhai_sess)] {
        let _ = writeln!(
            out,
            "{who} execute_code rhai 1, {what} {}  (p50 = {:.2}x its list_sessions; {:+.2} ms over it)",
            p50_p99(f),
            ratio(f.p50, list.p50),
            (f.p50.as_secs_f64() - list.p50.as_secs_f64()) * 1e3
        );
    }
    Ok(())
}

/// Resident and proportional set size, in KiB, of a process and those of
/// its descendants `keep` accepts: a page shared by k processes counts
/// once in each one's RSS and 1/k in each one's PSS.
fn tree_memory(root: u32, keep: impl Fn(u32) -> bool) -> (u64, u64) {
    let field = |t: &str, name: &str| {
        t.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    super::tree_pids(root)
        .into_iter()
        .filter(|pid| keep(*pid))
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .fold((0, 0), |(rss, pss), t| {
            (rss + field(&t, "Rss:"), pss + field(&t, "Pss:"))
        })
}
