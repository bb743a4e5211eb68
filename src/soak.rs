//! `cellbox soak`: `cellbox serve` (stdio) as a child, driven through a
//! real MCP client with a mix of benign cells (each with an exact expected
//! output; some in sessions, whose state is checked across cells) and
//! hostile ones (fork bomb, memory hog, output flood, crash, a double fork
//! that leaves a child, an endless loop), whose status is checked. The
//! server's RSS, descriptors, threads, descendants, cgroups and scratch are
//! sampled throughout; the run fails on any lost or wrong result, or when,
//! once every session is closed, they have not come back to their idle
//! figures (within the stated bounds).

use crate::cli::EXIT_INTERNAL;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::Peer;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The arguments of `cellbox soak`.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Cells in all.
    #[arg(long, default_value_t = 1000)]
    pub cells: usize,
    /// Client tasks sending cells at once over the one connection.
    #[arg(long, default_value_t = 3)]
    pub concurrency: usize,
    /// Percentage of hostile cells.
    #[arg(long = "hostile-percent", default_value_t = 10)]
    pub hostile_percent: u32,
    /// Session cells each session runs before it is closed.
    #[arg(long = "session-cells", default_value_t = 40)]
    pub session_cells: usize,
    /// Seed of the cell mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Descriptors the server may hold above idle at the end.
    #[arg(long = "fd-slack", default_value_t = 8)]
    pub fd_slack: u64,
    /// Megabytes of RSS the server may hold above idle at the end.
    #[arg(long = "rss-slack-mb", default_value_t = 10)]
    pub rss_slack_mb: u64,
    /// Seconds the server gets to settle back after the sessions close.
    #[arg(long = "settle", default_value_t = 20)]
    pub settle: u64,
    /// Write the server's stderr to this file.
    #[arg(long = "serve-log", value_name = "FILE")]
    pub serve_log: Option<PathBuf>,
    /// An extra argument for `serve` (repeatable).
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Multiply every cell's wall-clock limit by this (a slow or emulated
    /// machine: a memory hog must reach its bound before its deadline).
    #[arg(long = "time-scale", default_value_t = 1.0, value_parser = time_scale)]
    pub time_scale: f64,
}

/// A time scale: a finite number from 0.1 to 100.
fn time_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=100.0).contains(&v) => Ok(v),
        Ok(_) => Err(format!("{s} is not between 0.1 and 100")),
        Err(e) => Err(format!("{s} is not a number: {e}")),
    }
}

/// `cellbox soak` against the front binary next to this one: print the
/// report; exit 1 when the run failed.
pub async fn cli_main(args: SoakArgs) -> ExitCode {
    let binary = match crate::cli::front_binary() {
        Ok(b) => b,
        Err(e) => {
            crate::report!("cellbox soak: cannot find this binary: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    let opts = SoakOptions {
        cells: args.cells,
        concurrency: args.concurrency,
        hostile_percent: args.hostile_percent.min(100),
        session_cells: args.session_cells.max(1),
        seed: args.seed,
        binary,
        serve_args: args.serve_args,
        serve_log: args.serve_log,
        fd_slack: args.fd_slack,
        rss_slack: args.rss_slack_mb * 1_000_000,
        settle: Duration::from_secs(args.settle),
        time_scale: args.time_scale,
    };
    match run(opts).await {
        Ok((report, true)) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Ok((report, false)) => {
            print!("{report}");
            ExitCode::FAILURE
        }
        Err(e) => {
            crate::report!("cellbox soak: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

/// What a soak run does and how much growth it tolerates.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Cells in all.
    pub cells: usize,
    /// Client tasks sending cells at once over the one connection.
    pub concurrency: usize,
    /// Percentage of hostile cells.
    pub hostile_percent: u32,
    /// Session cells a session runs before it is closed and another made.
    pub session_cells: usize,
    /// Seed of the cell mix.
    pub seed: u64,
    /// The `cellbox` binary to run `serve` from.
    pub binary: PathBuf,
    /// Extra arguments for `serve`.
    pub serve_args: Vec<String>,
    /// Where the server's stderr goes (else nowhere).
    pub serve_log: Option<PathBuf>,
    /// Descriptors the server may hold above its idle count at the end.
    pub fd_slack: u64,
    /// Bytes of RSS the server may hold above its idle figure at the end.
    pub rss_slack: u64,
    /// How long the server gets to settle back after the sessions close.
    pub settle: Duration,
    /// What every cell's wall-clock limit is multiplied by.
    pub time_scale: f64,
}

impl SoakOptions {
    /// The cell with its wall-clock limit multiplied by the time scale.
    fn scaled(&self, mut cell: Cell) -> Cell {
        cell.timeout = cell.timeout.map(|t| t * self.time_scale);
        cell
    }
}

/// Sessions opened at once during the warm-up: as many as the server keeps
/// emptied session cgroups for (`sandbox::linux::groups`).
const WARM_SESSIONS: usize = 8;

/// How long the server is given to go idle before the figures after the
/// run are taken.
const MIN_SETTLE: Duration = Duration::from_secs(5);

/// Give up on one call after this long: a hang is a lost result.
const CALL_PATIENCE: Duration = Duration::from_secs(120);

/// One sample of the server's use of the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub rss: u64,
    pub fds: u64,
    pub threads: u64,
    pub descendants: u64,
    pub cgroups: u64,
    pub scratch_bytes: u64,
    pub scratch_entries: u64,
}

const METRICS: [&str; 7] = [
    "rss",
    "fds",
    "threads",
    "descendants",
    "cgroups",
    "scratch_bytes",
    "scratch_entries",
];

impl Sample {
    fn values(&self) -> [u64; 7] {
        [
            self.rss,
            self.fds,
            self.threads,
            self.descendants,
            self.cgroups,
            self.scratch_bytes,
            self.scratch_entries,
        ]
    }
}

/// (pid, ppid) of every process.
fn process_table() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rp) = stat.rfind(')') else { continue };
        let ppid = stat
            .get(rp + 2..)
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            out.push((pid, ppid));
        }
    }
    out
}

/// Every process beneath `root`.
fn descendants(root: i32) -> Vec<i32> {
    let table = process_table();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, ppid) in table {
        children.entry(ppid).or_default().push(pid);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(cs) = children.get(&p) {
            for &c in cs {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// `/proc/<pid>/status` field `key` (first number).
fn status_field(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// Directories at or beneath `dir`.
fn count_dirs(dir: &Path) -> u64 {
    let mut n = 1;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n += count_dirs(&e.path());
            }
        }
    }
    n
}

/// The cgroups named for one of `pids` (`cellbox-<pid>-…`), and their
/// children, under the memory, pids and cpuacct hierarchies (or the v2
/// one) of `pid`.
fn cgroups(pid: i32, pids: &HashSet<i32>) -> u64 {
    let Ok(own) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return 0;
    };
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if ctls.is_empty() {
            // cgroup v2: a supervisor moved into its leaf makes its cgroups
            // beside it (`sandbox::linux::cgroup2::LEAF`).
            let rel = rel.strip_suffix("cellbox-supervisor").unwrap_or(rel);
            dirs.push(Path::new("/sys/fs/cgroup").join(rel));
            continue;
        }
        for want in ["memory", "pids", "cpuacct"] {
            if ctls.split(',').any(|c| c == want) {
                dirs.push(Path::new("/sys/fs/cgroup").join(ctls).join(rel));
            }
        }
    }
    dirs.sort();
    dirs.dedup();
    let mut n = 0;
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name
                .strip_prefix("cellbox-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<i32>().ok())
                .is_some_and(|p| pids.contains(&p));
            if ours && e.file_type().is_ok_and(|t| t.is_dir()) {
                n += count_dirs(&e.path());
            }
        }
    }
    n
}

/// Bytes used on the scratch roots of `pids` (their tmpfs, when they
/// are one) and the entries in them.
fn scratch(pids: &HashSet<i32>) -> (u64, u64) {
    let tmp = std::env::temp_dir();
    let Ok(rd) = std::fs::read_dir(&tmp) else {
        return (0, 0);
    };
    let (mut bytes, mut entries) = (0, 0);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = ["cellbox-scratch-", "cellbox-forkserver-"]
            .iter()
            .filter_map(|p| name.strip_prefix(p))
            .filter_map(|r| r.split('-').next())
            .filter_map(|p| p.parse::<i32>().ok())
            .any(|p| pids.contains(&p));
        if !ours {
            continue;
        }
        entries += 1;
        let path = e.path();
        if let Ok(rd) = std::fs::read_dir(&path) {
            entries += rd.count() as u64;
        }
        // Only a tmpfs of its own says what it holds; a plain directory on
        // the system temp dir's filesystem would report the whole disk.
        if let (Ok(v), Ok(parent)) = (
            nix::sys::statvfs::statvfs(&path),
            nix::sys::statvfs::statvfs(&tmp),
        ) {
            if v.filesystem_id() != parent.filesystem_id() {
                let used = v.blocks().saturating_sub(v.blocks_free());
                // fsblkcnt_t is 32 bits on macOS.
                #[allow(clippy::unnecessary_cast)]
                let used = used as u64;
                bytes += used * v.fragment_size();
            }
        }
    }
    (bytes, entries)
}

/// One sample of `pid`.
pub fn sample(pid: i32) -> Sample {
    let desc = descendants(pid);
    let mut pids: HashSet<i32> = desc.iter().copied().collect();
    pids.insert(pid);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let (scratch_bytes, scratch_entries) = scratch(&pids);
    Sample {
        rss: status_field(pid, "VmRSS:") * 1024,
        fds,
        threads: status_field(pid, "Threads:"),
        descendants: desc.len() as u64,
        cgroups: cgroups(pid, &pids),
        scratch_bytes,
        scratch_entries,
    }
}

/// Min, max and last of each metric.
#[derive(Debug, Clone, Default)]
struct Extremes {
    min: [u64; 7],
    max: [u64; 7],
    last: [u64; 7],
    n: u64,
}

impl Extremes {
    fn add(&mut self, s: &Sample) {
        let v = s.values();
        for (i, x) in v.iter().enumerate() {
            if self.n == 0 || *x < self.min[i] {
                self.min[i] = *x;
            }
            if self.n == 0 || *x > self.max[i] {
                self.max[i] = *x;
            }
        }
        self.last = v;
        self.n += 1;
    }
}

/// What a cell must give back.
#[derive(Debug, Clone)]
enum Expect {
    /// Status ok and exactly this on stdout.
    Stdout(String),
    /// Status ok and exactly this value.
    Value(Value),
    /// One of these statuses.
    Status(&'static [&'static str]),
    /// One of these statuses, and exactly this on stdout.
    StatusStdout(&'static [&'static str], String),
}

#[derive(Debug, Clone)]
struct Cell {
    kind: &'static str,
    language: &'static str,
    code: String,
    timeout: Option<f64>,
    expect: Expect,
}

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const OK: &[&str] = &["ok"];

fn hostile(rng: &mut Rng) -> Cell {
    match rng.below(7) {
        0 => Cell {
            kind: "fork_bomb",
            language: "shell",
            code: "b() { b | b & }; b; sleep 30".into(),
            timeout: Some(3.0),
            // Held to its process count, the shell may itself fail to
            // fork `sleep` and exit 2 (`error`, kind ExitStatus) before the
            // deadline.
            expect: Expect::Status(&["timeout", "limit_exceeded", "error"]),
        },
        1 => Cell {
            kind: "memory_hog",
            language: "python",
            code: "xs = []\nwhile True:\n    xs.append(bytearray(16 << 20))".into(),
            timeout: Some(10.0),
            expect: Expect::Status(&["limit_exceeded"]),
        },
        2 => Cell {
            kind: "output_flood",
            language: "python",
            code: "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)".into(),
            timeout: Some(2.0),
            expect: Expect::Status(&["timeout"]),
        },
        3 => Cell {
            kind: "crash",
            language: "python",
            code: "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)".into(),
            timeout: Some(5.0),
            expect: Expect::Status(&["killed"]),
        },
        4 => Cell {
            kind: "double_fork",
            language: "shell",
            code: "( sleep 300 & ) ; echo parent-done".into(),
            timeout: Some(5.0),
            expect: Expect::StatusStdout(OK, "parent-done\n".into()),
        },
        5 => Cell {
            kind: "endless_loop",
            language: "python",
            code: "while True:\n    pass".into(),
            timeout: Some(1.0),
            expect: Expect::Status(&["timeout"]),
        },
        _ => Cell {
            kind: "endless_loop",
            language: "shell",
            code: "while :; do :; done".into(),
            timeout: Some(1.0),
            expect: Expect::Status(&["timeout"]),
        },
    }
}

fn benign(rng: &mut Rng) -> Cell {
    let k = rng.below(100_000) as i64;
    match rng.below(4) {
        0 => Cell {
            kind: "python",
            language: "python",
            code: format!("print(sum(range({k})))"),
            timeout: None,
            expect: Expect::Stdout(format!("{}\n", k * (k - 1) / 2)),
        },
        3 => {
            // A large result (up to serve's default output cap of 32 KiB a
            // stream): buffers the server holds and frees.
            let n = 4_000 + rng.below(28_000) as usize;
            Cell {
                kind: "python_large",
                language: "python",
                code: format!("print('z' * {n})"),
                timeout: None,
                expect: Expect::Stdout(format!("{}\n", "z".repeat(n))),
            }
        }
        1 => Cell {
            kind: "rhai",
            language: "rhai",
            code: format!("let a = {k}; a * 3 + 1"),
            timeout: None,
            expect: Expect::Value(json!(k * 3 + 1)),
        },
        _ => Cell {
            kind: "shell",
            language: "shell",
            code: format!("echo $(( {k} * 2 ))"),
            timeout: None,
            expect: Expect::Stdout(format!("{}\n", k * 2)),
        },
    }
}

/// A variable (or file) set in a session, to be read back later.
#[derive(Debug, Clone)]
struct Stored {
    language: &'static str,
    name: String,
    value: i64,
}

fn set_cell(s: &Stored) -> Cell {
    let (name, v) = (&s.name, s.value);
    let (code, expect) = match s.language {
        "python" => (format!("{name} = {v}"), Expect::Stdout(String::new())),
        "rhai" => (format!("let {name} = {v};"), Expect::Status(OK)),
        _ => (
            format!("echo {v} > {name}.txt"),
            Expect::Stdout(String::new()),
        ),
    };
    Cell {
        kind: "session_set",
        language: s.language,
        code,
        timeout: None,
        expect,
    }
}

fn get_cell(s: &Stored) -> Cell {
    let (name, v) = (&s.name, s.value);
    let (code, expect) = match s.language {
        "python" => (format!("print({name})"), Expect::Stdout(format!("{v}\n"))),
        "rhai" => (format!("{name} + 0"), Expect::Value(json!(v))),
        _ => (format!("cat {name}.txt"), Expect::Stdout(format!("{v}\n"))),
    };
    Cell {
        kind: "session_get",
        language: s.language,
        code,
        timeout: None,
        expect,
    }
}

/// What the client tasks found.
#[derive(Debug, Default)]
struct Tally {
    cells: u64,
    statuses: BTreeMap<String, u64>,
    kinds: BTreeMap<&'static str, BTreeMap<String, u64>>,
    sessions: u64,
    failures: Vec<String>,
    failed: u64,
}

impl Tally {
    fn fail(&mut self, msg: String) {
        self.failed += 1;
        if self.failures.len() < 20 {
            self.failures.push(msg);
        }
    }
}

fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

async fn call(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    args: Value,
) -> Result<rmcp::model::CallToolResult, String> {
    let fut = peer.call_tool(CallToolRequestParams::new(tool).with_arguments(obj(args)));
    match tokio::time::timeout(CALL_PATIENCE, fut).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("{tool}: {e}")),
        Err(_) => Err(format!("{tool}: no answer within {CALL_PATIENCE:?}")),
    }
}

/// Run one cell and check it; an error message when it was lost or wrong.
async fn run_cell(
    peer: &Peer<RoleClient>,
    cell: &Cell,
    session: Option<&str>,
    tally: &Mutex<Tally>,
) -> Result<(), String> {
    let mut args = json!({"language": cell.language, "code": cell.code});
    if let Some(t) = cell.timeout {
        args["timeout_seconds"] = json!(t);
    }
    if let Some(id) = session {
        args["session_id"] = json!(id);
    }
    let r = call(peer, "execute_code", args).await?;
    let s = r
        .structured_content
        .ok_or_else(|| format!("{} cell: no structuredContent", cell.kind))?;
    let status = s["status"].as_str().unwrap_or("(none)").to_owned();
    if let Ok(mut t) = tally.lock() {
        t.cells += 1;
        *t.statuses.entry(status.clone()).or_default() += 1;
        *t.kinds
            .entry(cell.kind)
            .or_default()
            .entry(status.clone())
            .or_default() += 1;
    }
    let stdout = s["stdout"].as_str().unwrap_or_default();
    let wrong = |what: String| {
        let err = s["error"]["message"].as_str().unwrap_or_default();
        format!(
            "{} {} cell {:?}: {what} (status {status}, stdout {:?}, value {}, error {err:?})",
            cell.kind,
            cell.language,
            cell.code,
            truncate(stdout),
            s["value"]
        )
    };
    match &cell.expect {
        Expect::Stdout(want) if status != "ok" || stdout != want => Err(wrong(format!(
            "expected ok and stdout {:?}",
            truncate(want)
        ))),
        Expect::Value(want) if status != "ok" || &s["value"] != want => {
            Err(wrong(format!("expected ok and value {want}")))
        }
        Expect::Status(want) if !want.contains(&status.as_str()) => {
            Err(wrong(format!("expected status in {want:?}")))
        }
        // A hostile cell's `error` is its own program's exit status, never
        // the server failing to run it.
        Expect::Status(_) if status == "error" && s["error"]["type"] != "ExitStatus" => Err(wrong(
            "expected an error of kind ExitStatus (the program's own exit)".into(),
        )),
        Expect::StatusStdout(want, out) if !want.contains(&status.as_str()) || stdout != out => {
            Err(wrong(format!(
                "expected status in {want:?} and stdout {out:?}"
            )))
        }
        _ => Ok(()),
    }
}

fn truncate(s: &str) -> String {
    let mut t: String = s.chars().take(80).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

/// One warm-up cell of each language (in `session` if given), each printing
/// or returning something of `n`: `print(n)`, `n + 1`, `echo n`.
async fn warm_up(
    peer: &Peer<RoleClient>,
    n: u64,
    session: Option<&str>,
    tally: &Mutex<Tally>,
) -> Result<(), String> {
    for (language, code, want) in [
        (
            "python",
            format!("print({n})"),
            Expect::Stdout(format!("{n}\n")),
        ),
        ("rhai", format!("{n} + 1"), Expect::Value(json!(n + 1))),
        (
            "shell",
            format!("echo {n}"),
            Expect::Stdout(format!("{n}\n")),
        ),
    ] {
        let cell = Cell {
            kind: "warmup",
            language,
            code,
            timeout: None,
            expect: want,
        };
        run_cell(peer, &cell, session, tally).await?;
    }
    Ok(())
}

async fn create_session(peer: &Peer<RoleClient>) -> Result<String, String> {
    let r = call(peer, "create_session", json!({})).await?;
    r.structured_content
        .as_ref()
        .and_then(|s| s["session_id"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("create_session gave no session id: {:?}", r.content))
}

async fn close_session(peer: &Peer<RoleClient>, id: &str) -> Result<(), String> {
    let r = call(peer, "close_session", json!({"session_id": id})).await?;
    if r.is_error == Some(true) {
        return Err(format!("close_session {id}: {:?}", r.content));
    }
    Ok(())
}

/// One client task: `n` cells, some in a session of its own (replaced
/// every `opts.session_cells` session cells).
async fn client_task(
    peer: Peer<RoleClient>,
    task: usize,
    n: usize,
    opts: Arc<SoakOptions>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut rng = Rng(opts.seed ^ (task as u64).wrapping_mul(0x1234_5678_9ABC_DEF1));
    let mut session: Option<(String, usize, Vec<Stored>)> = None;
    let mut next_name = 0u64;
    let note = |msg: String| {
        if let Ok(mut t) = tally.lock() {
            t.fail(msg);
        }
    };
    for _ in 0..n {
        let roll = rng.below(100) as u32;
        if roll < opts.hostile_percent {
            let cell = opts.scaled(hostile(&mut rng));
            if let Err(e) = run_cell(&peer, &cell, None, &tally).await {
                note(e);
            }
            continue;
        }
        if rng.below(2) == 0 {
            let cell = opts.scaled(benign(&mut rng));
            if let Err(e) = run_cell(&peer, &cell, None, &tally).await {
                note(e);
            }
            continue;
        }
        // A session cell.
        if session
            .as_ref()
            .is_some_and(|(_, used, _)| *used >= opts.session_cells)
        {
            if let Some((id, _, _)) = session.take() {
                if let Err(e) = close_session(&peer, &id).await {
                    note(e);
                }
            }
        }
        if session.is_none() {
            match create_session(&peer).await {
                Ok(id) => {
                    if let Ok(mut t) = tally.lock() {
                        t.sessions += 1;
                    }
                    session = Some((id, 0, Vec::new()));
                }
                Err(e) => {
                    note(e);
                    continue;
                }
            }
        }
        let Some((id, used, stored)) = session.as_mut() else {
            continue;
        };
        *used += 1;
        let cell = if !stored.is_empty() && rng.below(2) == 0 {
            let i = rng.below(stored.len() as u64) as usize;
            match stored.get(i) {
                Some(s) => get_cell(s),
                None => continue,
            }
        } else {
            let language = ["python", "rhai", "shell"][rng.below(3) as usize];
            let s = Stored {
                language,
                name: format!("v{task}_{next_name}"),
                value: rng.below(1_000_000_000) as i64,
            };
            next_name += 1;
            let c = set_cell(&s);
            stored.push(s);
            c
        };
        let cell = opts.scaled(cell);
        if let Err(e) = run_cell(&peer, &cell, Some(id), &tally).await {
            note(e);
        }
    }
    if let Some((id, _, _)) = session.take() {
        if let Err(e) = close_session(&peer, &id).await {
            note(e);
        }
    }
}

/// Sample `pid` every `every` into `ext` until `stop`.
async fn sampler(
    pid: i32,
    every: Duration,
    ext: Arc<Mutex<Extremes>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let s = tokio::task::spawn_blocking(move || sample(pid)).await.unwrap_or_default();
                if let Ok(mut e) = ext.lock() {
                    e.add(&s);
                }
            }
        }
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

fn show(metric: &str, v: u64) -> String {
    if metric == "rss" || metric == "scratch_bytes" {
        mb(v)
    } else {
        v.to_string()
    }
}

/// Where `now` is beyond `idle` by more than the bounds allow.
fn beyond(idle: &Sample, now: &Sample, opts: &SoakOptions) -> Vec<String> {
    let mut out = Vec::new();
    if now.fds > idle.fds + opts.fd_slack {
        out.push(format!(
            "descriptors {} > idle {} + {}",
            now.fds, idle.fds, opts.fd_slack
        ));
    }
    if now.descendants > idle.descendants {
        out.push(format!(
            "descendant processes {} > idle {}",
            now.descendants, idle.descendants
        ));
    }
    if now.cgroups > idle.cgroups {
        out.push(format!("cgroups {} > idle {}", now.cgroups, idle.cgroups));
    }
    if now.scratch_entries > idle.scratch_entries {
        out.push(format!(
            "scratch entries {} > idle {}",
            now.scratch_entries, idle.scratch_entries
        ));
    }
    if now.scratch_bytes > idle.scratch_bytes + 64 * 1024 {
        out.push(format!(
            "scratch use {} > idle {}",
            mb(now.scratch_bytes),
            mb(idle.scratch_bytes)
        ));
    }
    if now.rss > idle.rss + opts.rss_slack {
        out.push(format!(
            "RSS {} > idle {} + {}",
            mb(now.rss),
            mb(idle.rss),
            mb(opts.rss_slack)
        ));
    }
    out
}

/// Run the soak; the report, and whether it passed.
pub async fn run(opts: SoakOptions) -> Result<(String, bool), String> {
    let mut cmd = tokio::process::Command::new(&opts.binary);
    cmd.arg("serve").args(&opts.serve_args);
    let stderr = match &opts.serve_log {
        Some(p) => std::process::Stdio::from(
            std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
        ),
        None => std::process::Stdio::null(),
    };
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start {} serve: {e}", opts.binary.display()))?;
    let pid = transport
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or("the server has no pid")?;
    let client = tokio::time::timeout(CALL_PATIENCE, ().serve(transport))
        .await
        .map_err(|_| "the server did not answer initialize".to_owned())?
        .map_err(|e| format!("initialize: {e}"))?;
    let peer = client.peer().clone();

    // Warm up: one cell of each language, then the idle figures.
    let tally = Arc::new(Mutex::new(Tally::default()));
    let warm = Tally::default();
    let warm = Mutex::new(warm);
    // Calls without a session, two at once: after calls overlap the server
    // keeps two sessions prepared for such calls (each with a worker
    // started ahead per language), which a run cannot exceed either.
    let (a, b) = tokio::join!(
        warm_up(&peer, 1, None, &warm),
        warm_up(&peer, 1, None, &warm)
    );
    a?;
    b?;
    // Sessions at once, as many as the server keeps emptied session
    // cgroups for reuse (with their descriptors): the idle figures are
    // those of a server whose caches are full, which a run cannot exceed.
    let mut warm_tasks = Vec::new();
    for _ in 0..WARM_SESSIONS {
        let peer = peer.clone();
        warm_tasks.push(tokio::spawn(async move {
            let id = create_session(&peer).await?;
            let warm = Mutex::new(Tally::default());
            warm_up(&peer, 2, Some(&id), &warm).await?;
            Ok::<String, String>(id)
        }));
    }
    let mut ids = Vec::new();
    for t in warm_tasks {
        ids.push(t.await.map_err(|e| format!("warm-up: {e}"))??);
    }
    for id in ids {
        close_session(&peer, &id).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = sample(pid);

    let ext = Arc::new(Mutex::new(Extremes::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let sampling = tokio::spawn(sampler(
        pid,
        Duration::from_millis(250),
        ext.clone(),
        stop.clone(),
    ));
    let opts = Arc::new(opts);
    let started = Instant::now();
    let conc = opts.concurrency.max(1);
    let mut tasks = Vec::new();
    for task in 0..conc {
        let n = opts.cells / conc + usize::from(task < opts.cells % conc);
        tasks.push(tokio::spawn(client_task(
            peer.clone(),
            task,
            n,
            opts.clone(),
            tally.clone(),
        )));
    }
    for t in tasks {
        if let Err(e) = t.await {
            if let Ok(mut t) = tally.lock() {
                t.fail(format!("a client task ended abnormally: {e}"));
            }
        }
    }
    let wall = started.elapsed();

    // Every session is closed: wait for the server to settle back.
    // The server gives back freed memory a moment after it goes idle
    // (`serve`'s trimmer looks every 2 s): the figures are taken after that.
    let settle_start = Instant::now();
    tokio::time::sleep(MIN_SETTLE.min(opts.settle)).await;
    let mut after = sample(pid);
    while !beyond(&idle, &after, &opts).is_empty() && settle_start.elapsed() < opts.settle {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = sample(pid);
    }
    let settled_in = settle_start.elapsed();
    stop.cancel();
    let _ = sampling.await;
    let growth = beyond(&idle, &after, &opts);

    // Close the connection: the server must go, and leave nothing.
    let mut pids: HashSet<i32> = descendants(pid).into_iter().collect();
    pids.insert(pid);
    let _ = client.cancel().await;
    let gone_by = Instant::now() + Duration::from_secs(15);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < gone_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut leftovers = Vec::new();
    if Path::new(&format!("/proc/{pid}")).exists() {
        leftovers.push(format!("the server (pid {pid}) did not exit"));
    }
    // Its workers notice it has gone and follow it, within a grace period.
    let alive = |pids: &HashSet<i32>| -> Vec<i32> {
        pids.iter()
            .copied()
            .filter(|p| *p != pid && Path::new(&format!("/proc/{p}")).exists())
            .collect()
    };
    let grace = Instant::now() + Duration::from_secs(10);
    while !alive(&pids).is_empty() && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let survivors = alive(&pids);
    if !survivors.is_empty() {
        leftovers.push(format!("processes left after exit: {survivors:?}"));
    }
    let cg = cgroups(std::process::id() as i32, &pids);
    if cg > 0 {
        leftovers.push(format!("{cg} cgroup(s) left after exit"));
    }
    let (_, scratch_left) = scratch(&pids);
    if scratch_left > 0 {
        leftovers.push(format!("{scratch_left} scratch entries left after exit"));
    }

    let tally = tally.lock().map_err(|_| "tally poisoned")?;
    let ext = ext.lock().map_err(|_| "samples poisoned")?;
    let lost = (opts.cells as u64).saturating_sub(tally.cells);
    let mut r = String::new();
    let _ = writeln!(
        r,
        "soak: {} cells in {:.1} s ({:.1} cells/s), concurrency {}, {} sessions, {}% hostile",
        tally.cells,
        wall.as_secs_f64(),
        tally.cells as f64 / wall.as_secs_f64().max(1e-9),
        conc,
        tally.sessions,
        opts.hostile_percent
    );
    let statuses: Vec<String> = tally
        .statuses
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(r, "statuses: {}", statuses.join(", "));
    let kinds: Vec<String> = tally
        .kinds
        .iter()
        .map(|(k, by)| {
            let by: Vec<String> = by.iter().map(|(s, n)| format!("{s} {n}")).collect();
            format!("{k} ({})", by.join(", "))
        })
        .collect();
    let _ = writeln!(r, "cells: {}", kinds.join("; "));
    let _ = writeln!(
        r,
        "{:<16}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "server", "idle", "min", "max", "last", "settled"
    );
    let idle_v = idle.values();
    let after_v = after.values();
    for (i, m) in METRICS.iter().enumerate() {
        let _ = writeln!(
            r,
            "{:<16}{:>10}{:>10}{:>10}{:>10}{:>10}",
            m,
            show(m, idle_v[i]),
            show(m, ext.min[i]),
            show(m, ext.max[i]),
            show(m, ext.last[i]),
            show(m, after_v[i])
        );
    }
    let _ = writeln!(
        r,
        "{} samples; settled {:.1} s after the last session closed; bounds: descriptors +{}, \
         RSS +{}, descendants, cgroups and scratch back to idle",
        ext.n,
        settled_in.as_secs_f64(),
        opts.fd_slack,
        mb(opts.rss_slack)
    );
    let mut ok = true;
    if lost > 0 {
        ok = false;
        let _ = writeln!(r, "FAIL: {lost} cell(s) lost (no result)");
    }
    if tally.failed > 0 {
        ok = false;
        let _ = writeln!(r, "FAIL: {} cell(s) lost or wrong:", tally.failed);
        for f in &tally.failures {
            let _ = writeln!(r, "  - {f}");
        }
    }
    for g in growth.iter().chain(leftovers.iter()) {
        ok = false;
        let _ = writeln!(r, "FAIL: {g}");
    }
    if ok {
        let _ = writeln!(r, "PASS");
    }
    Ok((r, ok))
}
