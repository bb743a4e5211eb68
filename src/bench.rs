//! `cellbox bench`: cell latency and throughput beside baselines measured in
//! the same run, reported as ratios (these machines are noisy; absolute
//! numbers from different runs do not compare).

pub mod mcp;
mod models;
#[cfg(target_os = "linux")]
pub mod tools;

use crate::cli::EXIT_INTERNAL;
use crate::{CellRequest, Language, Policy, SessionConfig, Status, Supervisor};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Latency figures of one measurement.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    pub p50: Duration,
    pub p99: Duration,
    pub per_sec: f64,
}

pub(crate) fn figures(mut samples: Vec<Duration>, wall: Duration) -> Figures {
    samples.sort();
    let pick = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).copied().unwrap_or_default()
    };
    Figures {
        p50: pick(0.50),
        p99: pick(0.99),
        per_sec: samples.len() as f64 / wall.as_secs_f64().max(1e-9),
    }
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// One spawn + wait of a program, timed.
pub(crate) fn spawn_once(argv: &[&str]) -> Result<Duration, String> {
    let (prog, args) = argv.split_first().ok_or("empty baseline command")?;
    let t = Instant::now();
    let st = std::process::Command::new(prog)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("failed to run {prog}: {e}"))?;
    if !st.success() {
        return Err(format!("{prog} failed: {st}"));
    }
    Ok(t.elapsed())
}

/// spawn + wait of a program, `n` times, sequentially.
pub fn baseline_spawn(argv: &[&str], n: usize) -> Result<Figures, String> {
    let mut samples = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        samples.push(spawn_once(argv)?);
    }
    Ok(figures(samples, t0.elapsed()))
}

/// Two commands run alternately, `n` times each, so that both see the same
/// machine (a noisy neighbour slows both, not one block of samples).
pub fn baseline_spawn_pair(a: &[&str], b: &[&str], n: usize) -> Result<(Figures, Figures), String> {
    let (mut sa, mut sb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut ta, mut tb) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        let d = spawn_once(a)?;
        ta += d;
        sa.push(d);
        let d = spawn_once(b)?;
        tb += d;
        sb.push(d);
    }
    Ok((figures(sa, ta), figures(sb, tb)))
}

/// One cell through the library, timed; a cell that fails is an error.
async fn timed_cell(
    sup: &Supervisor,
    language: Language,
    code: &str,
    config: &SessionConfig,
) -> Result<Duration, String> {
    let t = Instant::now();
    let r = sup
        .run(CellRequest::new(language, code), config.clone())
        .await;
    if r.status != Status::Ok {
        return Err(format!(
            "a benchmark cell failed: {} {:?}",
            r.status,
            r.error.map(|e| e.message)
        ));
    }
    Ok(t.elapsed())
}

/// A session of `sup` under `policy`, for a bench whose cells all run in
/// one (see [`timed_session_cell`]).
pub(crate) fn bench_session(sup: &Supervisor, policy: Policy) -> Result<crate::Session, String> {
    sup.session(SessionConfig {
        policy,
        ..SessionConfig::default()
    })
    .map_err(|e| e.to_string())
}

/// A session of `sup` denying every capability that starts its next
/// cell's worker once a cell is over (`prepare_next`, as `serve`'s named
/// sessions do).
pub(crate) fn prepared_session(sup: &Supervisor) -> Result<crate::Session, String> {
    sup.session(SessionConfig {
        policy: Policy::deny_all(),
        prepare_next: true,
        ..SessionConfig::default()
    })
    .map_err(|e| e.to_string())
}

/// One Rhai cell in `session` (two minutes at most), timed; a cell that
/// does not end `ok` is an error.
pub(crate) async fn timed_session_cell(
    session: &crate::Session,
    code: String,
) -> Result<Duration, String> {
    let t = Instant::now();
    let r = session
        .run(CellRequest::new(Language::Rhai, code).timeout(Duration::from_secs(120)))
        .await;
    if r.status != Status::Ok {
        return Err(format!(
            "the bench cell ended {}: {:?}",
            r.status,
            r.error.map(|e| e.message)
        ));
    }
    Ok(t.elapsed())
}

/// A measurement's p50 and p99, as the report lines show them.
pub(crate) fn p50_p99(f: &Figures) -> String {
    format!("p50 {}  p99 {}", ms(f.p50), ms(f.p99))
}

/// Two measurements taken in turn, side by side, and the ratio of their
/// p50s: "p50 A vs B  p99 A vs B  (p50 = R".
fn side_by_side(a: &Figures, b: &Figures) -> String {
    format!(
        "p50 {} vs {}  p99 {} vs {}  (p50 = {:.2}x",
        ms(a.p50),
        ms(b.p50),
        ms(a.p99),
        ms(b.p99),
        a.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9)
    )
}

/// `n` samples of `a` and of `b` in turn, each after a [`SETTLE`] pause,
/// so both are measured at the same moments (a noisy neighbour slows both,
/// not one block of samples).
async fn in_turn<A, B, FA, FB>(n: usize, mut a: A, mut b: B) -> Result<(Figures, Figures), String>
where
    A: FnMut() -> FA,
    B: FnMut() -> FB,
    FA: std::future::Future<Output = Result<Duration, String>>,
    FB: std::future::Future<Output = Result<Duration, String>>,
{
    let (mut sa, mut sb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut ta, mut tb) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        tokio::time::sleep(SETTLE).await;
        let d = a().await?;
        ta += d;
        sa.push(d);
        tokio::time::sleep(SETTLE).await;
        let d = b().await?;
        tb += d;
        sb.push(d);
    }
    Ok((figures(sa, ta), figures(sb, tb)))
}

/// `n` trivial cells through the library at `concurrency`.
pub async fn cells(
    sup: &Supervisor,
    language: Language,
    code: &str,
    n: usize,
    concurrency: usize,
) -> Result<Figures, String> {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let per = n.div_ceil(concurrency.max(1));
    for _ in 0..concurrency.max(1) {
        let sup = sup.clone();
        let code = code.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per);
            let config = SessionConfig {
                policy: Policy::deny_all(),
                ..SessionConfig::default()
            };
            for _ in 0..per {
                samples.push(timed_cell(&sup, language, &code, &config).await?);
            }
            Ok::<_, String>(samples)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(figures(all, t0.elapsed()))
}

/// How long the alternating measurement lets the machine settle before
/// each sample: what one sample leaves running (a worker exiting, a spare
/// being made) is not charged to the next, and each starts the way a cell
/// called between an agent's steps does.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);

/// `n` trivial cells, each followed by a spawn + wait of `baseline`, so both
/// are measured on the same machine at the same moments (a noisy neighbour
/// slows both, not one block of samples).
pub async fn cells_alternating(
    sup: &Supervisor,
    language: Language,
    code: &str,
    baseline: &[&str],
    n: usize,
) -> Result<(Figures, Figures), String> {
    let config = SessionConfig {
        policy: Policy::deny_all(),
        ..SessionConfig::default()
    };
    in_turn(
        n,
        || timed_cell(sup, language, code, &config),
        || async { tokio::task::block_in_place(|| spawn_once(baseline)) },
    )
    .await
}

/// `n` trivial cells on `a` and on `b` in turn, so both are measured at
/// the same moments.
pub async fn cells_ab(
    a: &Supervisor,
    b: &Supervisor,
    language: Language,
    code: &str,
    n: usize,
) -> Result<(Figures, Figures), String> {
    let config = SessionConfig {
        policy: Policy::deny_all(),
        ..SessionConfig::default()
    };
    in_turn(
        n,
        || timed_cell(a, language, code, &config),
        || timed_cell(b, language, code, &config),
    )
    .await
}

/// What a cgroup per session and per cell costs a warm cell: the same
/// cells with and without them, in turn.
async fn tenancy_cost(
    n: usize,
    warm: &Supervisor,
    language: Language,
    code: &str,
    lang: &str,
) -> Result<String, String> {
    if !warm.pool_status().await.session_cgroups {
        return Ok(format!(
            "{lang:6} cell, warm, session cgroups: not measured (this supervisor has none)\n"
        ));
    }
    let shared = Supervisor::builder()
        .warm(true)
        .session_cgroups(false)
        .build()
        .map_err(|e| e.to_string())?;
    if language == Language::Python {
        shared.start_pools().await.map_err(|e| e.to_string())?;
    }
    let (on, off) = cells_ab(warm, &shared, language, code, n).await?;
    Ok(format!(
        "{lang:6} cell, warm, session cgroups on vs off (in turn): {})\n",
        side_by_side(&on, &off)
    ))
}

/// The arguments of `cellbox bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Cells per measurement.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// Languages to measure.
    #[arg(long = "lang", default_values_t = vec!["rhai".to_string()])]
    pub langs: Vec<String>,
    /// Measure `cellbox serve` over stdio through an MCP client instead.
    #[arg(long)]
    pub mcp: bool,
    /// With `--mcp`: also drive `serve` through the official MCP Python
    /// SDK, run by this interpreter (one that can `import mcp`, 1.x or
    /// 2.x); repeat to measure several.
    #[arg(long = "mcp-python", value_name = "PYTHON", requires = "mcp")]
    pub mcp_python: Vec<std::path::PathBuf>,
    /// Measure only the tools lines (an upstream MCP tool call, `search_files` against `rg`).
    #[arg(long, conflicts_with = "mcp")]
    pub tools: bool,
}

/// `cellbox bench`: print the report.
pub async fn cli_main(args: BenchArgs) -> ExitCode {
    let report = if args.mcp {
        mcp::run(args.iterations, &args.mcp_python).await
    } else if args.tools {
        tools_lines(args.iterations).await
    } else {
        run(args.iterations, &args.langs).await
    };
    match report {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::report!("cellbox bench: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

/// The whole report.
pub async fn run(n: usize, langs: &[String]) -> Result<String, String> {
    // A fresh worker for each cell, made on its path: nothing prepared.
    let cold = Supervisor::builder()
        .warm(false)
        .prepare_runs(false)
        .build()
        .map_err(|e| e.to_string())?;
    let warm = Supervisor::builder()
        .warm(true)
        .build()
        .map_err(|e| e.to_string())?;
    // Warm, with each cell's session made on its path and torn down after
    // it: what preparing the next cell's session gains, or costs.
    let unprepared = Supervisor::builder()
        .warm(true)
        .prepare_runs(false)
        .build()
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    let base = baseline_spawn(&["/bin/true"], n)?;
    let _ = writeln!(
        out,
        "baseline spawn+wait /bin/true     p50 {}  p99 {}  {:.0}/s",
        ms(base.p50),
        ms(base.p99),
        base.per_sec
    );
    out.push_str(&sandbox_cost(n, &cold).await?);
    for lang in langs {
        let language: Language = lang.parse().map_err(|e: crate::Error| e.to_string())?;
        let code = match language {
            Language::Rhai => "40 + 2",
            Language::Python => "pass",
            Language::Shell | Language::Bash => "true",
        };
        let mut bare_python = None;
        if language == Language::Python {
            if let Ok(py) = cold.python() {
                let exe = py.executable.to_string_lossy().into_owned();
                let b = baseline_spawn(&[&exe, "-I", "-S", "-c", "pass"], n)?;
                let _ = writeln!(
                    out,
                    "baseline python3 -I -S -c pass    p50 {}  p99 {}  {:.0}/s",
                    ms(b.p50),
                    ms(b.p99),
                    b.per_sec
                );
                let b = baseline_spawn(&[&exe, "-c", "pass"], n)?;
                let _ = writeln!(
                    out,
                    "baseline python3 -c pass          p50 {}  p99 {}  {:.0}/s",
                    ms(b.p50),
                    ms(b.p99),
                    b.per_sec
                );
                // One-shot `cellbox run` of a `pass` cell (the CLI's cold
                // path), and bwrap running the same interpreter, as ratios.
                // Through the front binary, as users run it.
                if let (Ok(me), Ok(dir)) = (crate::cli::front_binary(), tempfile::tempdir()) {
                    let script = dir.path().join("pass.py");
                    if std::fs::write(&script, "pass\n").is_ok() {
                        let me = me.to_string_lossy().into_owned();
                        let sp = script.to_string_lossy().into_owned();
                        let c = baseline_spawn(&[&me, "run", &sp], n)?;
                        let _ = writeln!(
                            out,
                            "cellbox run pass.py (one-shot)    p50 {}  p99 {}  (p50 = {:.2}x python3 -c pass)",
                            ms(c.p50),
                            ms(c.p99),
                            c.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9)
                        );
                        let bw = [
                            "bwrap",
                            "--unshare-all",
                            "--die-with-parent",
                            "--ro-bind",
                            "/",
                            "/",
                            &exe,
                            "-c",
                            "pass",
                        ];
                        match baseline_spawn(&bw, n) {
                            Ok(w) => {
                                let _ = writeln!(
                                    out,
                                    "bwrap ... python3 -c pass         p50 {}  p99 {}  (cellbox run p50 = {:.2}x bwrap)",
                                    ms(w.p50),
                                    ms(w.p99),
                                    c.p50.as_secs_f64() / w.p50.as_secs_f64().max(1e-9)
                                );
                            }
                            Err(e) => {
                                let _ = writeln!(
                                    out,
                                    "bwrap ... python3 -c pass         not measured: {e}"
                                );
                            }
                        }
                    }
                }
                bare_python = Some(b);
            }
            // The pool is measured warm, not while it starts.
            warm.start_pools().await.map_err(|e| e.to_string())?;
            unprepared.start_pools().await.map_err(|e| e.to_string())?;
        }
        for (mode, sup) in [
            ("spawn", &cold),
            ("warm ", &warm),
            ("warm, prepare_runs off", &unprepared),
        ] {
            for conc in [1usize, 2] {
                let f = cells(sup, language, code, n, conc).await?;
                let _ = writeln!(
                out,
                "{lang:6} cell, {mode}, concurrency {conc}  p50 {}  p99 {}  {:.0} cells/s  (p50 = {:.2}x /bin/true)",
                ms(f.p50),
                ms(f.p99),
                f.per_sec,
                f.p50.as_secs_f64() / base.p50.as_secs_f64().max(1e-9)
            );
                if let (Some(b), true) = (&bare_python, mode == "warm ") {
                    let _ = writeln!(
                        out,
                        "python cell, warm pool, concurrency {conc}: p50 = {:.2}x bare python3 -c pass (goal <= 0.25x, stretch <= 0.15x); {:.0} cells/s (goal >= 300/s at concurrency 2), p99 {}",
                        f.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9),
                        f.per_sec,
                        ms(f.p99)
                    );
                }
            }
        }
        if language == Language::Rhai {
            let (c, b) = cells_alternating(&warm, language, code, &["/bin/true"], n).await?;
            let _ = writeln!(
                out,
                "rhai   cell, warm, alternating with spawn+wait /bin/true: {} /bin/true; goal <= 1x)",
                side_by_side(&c, &b)
            );
            // The same with each cell's session made on its path and torn
            // down after it, as before sessions were prepared for `run`.
            let (c, b) = cells_alternating(&unprepared, language, code, &["/bin/true"], n).await?;
            let _ = writeln!(
                out,
                "rhai   cell, warm, its session made on its path (prepare_runs off), alternating with spawn+wait /bin/true: {} /bin/true)",
                side_by_side(&c, &b)
            );
            // The same in one session that starts its next cell's worker
            // while the previous sample settles (as between an agent's
            // steps): the cell only sends its code.
            let session = prepared_session(&warm)?;
            for _ in 0..3 {
                timed_session_cell(&session, code.to_owned()).await?;
            }
            let (c, b) = in_turn(
                n,
                || timed_session_cell(&session, code.to_owned()),
                || async { tokio::task::block_in_place(|| spawn_once(&["/bin/true"])) },
            )
            .await?;
            let _ = writeln!(
                out,
                "rhai   cell, warm, in a session with its next worker started ahead (prepare_next), alternating with spawn+wait /bin/true: {} /bin/true)",
                side_by_side(&c, &b)
            );
        }
        if !language.is_shell() {
            out.push_str(&tenancy_cost(n, &warm, language, code, lang).await?);
        }
        if language == Language::Python {
            out.push_str(&idle_memory(&warm).await?);
            out.push_str(&live_sessions(n, &warm, &cold).await?);
        }
    }
    out.push_str(&models::round_trip(n).await?);
    out.push_str(&tools_lines(n).await?);
    Ok(out)
}

/// The tools lines: an upstream MCP tool call and `search_files`.
async fn tools_lines(n: usize) -> Result<String, String> {
    #[cfg(target_os = "linux")]
    return tools::run(n).await;
    #[cfg(not(target_os = "linux"))]
    Ok(format!(
        "tools lines: not measured on this platform ({n} calls)\n"
    ))
}

/// Every process as (pid, ppid, VmRSS in KiB; 0 unless `rss`).
fn process_table(rss: bool) -> Vec<(u32, u32, u64)> {
    let mut procs = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return procs;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0);
        let kb = if rss {
            std::fs::read_to_string(e.path().join("status"))
                .ok()
                .and_then(|st| {
                    st.lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.split_whitespace().next())
                        .and_then(|v| v.parse::<u64>().ok())
                })
                .unwrap_or(0)
        } else {
            0
        };
        procs.push((pid, ppid, kb));
    }
    procs
}

/// Resident set size of a process and all its descendants, in KiB.
pub(crate) fn tree_rss_kb(root: u32) -> u64 {
    let procs = process_table(true);
    let tree = descendants(root, &procs);
    procs
        .iter()
        .filter(|(pid, _, _)| tree.contains(pid))
        .map(|(_, _, rss)| rss)
        .sum()
}

/// `root` and every process beneath it, from (pid, ppid, _) rows.
fn descendants(root: u32, procs: &[(u32, u32, u64)]) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for (pid, ppid, _) in procs {
            if *ppid == parent && !tree.contains(pid) {
                tree.push(*pid);
            }
        }
        i += 1;
    }
    tree
}

/// The pids of `root` and every process beneath it.
pub(crate) fn tree_pids(root: u32) -> Vec<u32> {
    descendants(root, &process_table(false))
}

/// Supervisor + pool memory with 16 idle sessions that each ran one Python
/// cell (RSS of this process and every process it started).
async fn idle_memory(warm: &Supervisor) -> Result<String, String> {
    let mut sessions = Vec::new();
    for _ in 0..16 {
        let s = warm
            .session(SessionConfig::default())
            .map_err(|e| e.to_string())?;
        let r = s.run(CellRequest::new(Language::Python, "x = 1")).await;
        if r.status != Status::Ok {
            return Err(format!("an idle-session cell failed: {}", r.status));
        }
        sessions.push(s);
    }
    let kb = tree_rss_kb(std::process::id());
    let zygotes = warm.pool_status().await.python.len();
    drop(sessions);
    Ok(format!(
        "supervisor + pool memory, 16 idle sessions: {:.1} MiB RSS ({zygotes} Python zygotes, the Rhai fork server and the supervisor)\n",
        kb as f64 / 1024.0
    ))
}

/// The OS layers' own cost: the same trivial cell with and without them, and
/// `cellbox exec -- /bin/true` beside bubblewrap doing the same, in this run.
async fn sandbox_cost(n: usize, with_layers: &Supervisor) -> Result<String, String> {
    use crate::profiles::{LayerMode, Profile};
    let mut out = String::new();
    // Without: every optional layer off. Privileges stay: a cell never runs
    // as root, and hygiene is always applied.
    let mut bare = Profile::load("rhai").map_err(|e| e.to_string())?;
    bare.layers.namespaces = LayerMode::Off;
    bare.layers.rlimits = LayerMode::Off;
    bare.layers.landlock = LayerMode::Off;
    bare.layers.seccomp = LayerMode::Off;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("rhai-no-layers.toml");
    let text = toml::to_string(&bare).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    let without = Supervisor::builder()
        .warm(false)
        .prepare_runs(false)
        .profile(Language::Rhai, path.to_string_lossy().into_owned())
        .build()
        .map_err(|e| e.to_string())?;
    let on = cells(with_layers, Language::Rhai, "40 + 2", n, 1).await?;
    let off = cells(&without, Language::Rhai, "40 + 2", n, 1).await?;
    let _ = writeln!(out, "rhai cell, spawn, OS layers off   {}", p50_p99(&off));
    let _ = writeln!(
        out,
        "rhai cell, spawn, OS layers on    {}  (p50 = {:.2}x layers off)",
        p50_p99(&on),
        on.p50.as_secs_f64() / off.p50.as_secs_f64().max(1e-9)
    );
    // The front binary, as users run it (it runs `exec` itself).
    let exe = crate::cli::front_binary().map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy().into_owned();
    let exec_argv = [exe.as_str(), "exec", "--", "/bin/true"];
    let bwrap = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "/bin/true",
    ];
    // Alternated with bwrap, so the ratio compares like with like.
    versus_bwrap(
        &mut out,
        n,
        (
            &exec_argv,
            "cellbox exec -- /bin/true         ",
            "cellbox exec",
            "",
        ),
        (
            &bwrap,
            "bwrap --unshare-all ... /bin/true ",
            "bwrap baseline",
        ),
    )?;
    // The one-shot Rhai CLI (`run x.rhai`: no server, no pool) beside bwrap
    // with a /dev and a /proc of its own, as the cell has; alternated.
    let script = dir.path().join("x.rhai");
    std::fs::write(&script, "40 + 2\n").map_err(|e| e.to_string())?;
    let script = script.to_string_lossy().into_owned();
    let run_argv = [exe.as_str(), "run", script.as_str()];
    let bwrap_dev_proc = [
        "bwrap",
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "/bin/true",
    ];
    versus_bwrap(
        &mut out,
        n,
        (
            &run_argv,
            "cellbox run x.rhai (one-shot)     ",
            "cellbox run x.rhai",
            "; goal <= 1x",
        ),
        (
            &bwrap_dev_proc,
            "bwrap ... --dev --proc /bin/true  ",
            "bwrap baseline for run x.rhai",
        ),
    )?;
    Ok(out)
}

/// A command of ours (`argv`, its line's label, its name in the ratio,
/// what the ratio should be) beside a bwrap command (`argv`, its line's
/// label, what its absence is called), alternated; without bwrap, ours
/// alone and why.
fn versus_bwrap(
    out: &mut String,
    n: usize,
    (ours, label, name, goal): (&[&str], &str, &str, &str),
    (bwrap, bwrap_label, missing): (&[&str], &str, &str),
) -> Result<(), String> {
    let ours_line = |out: &mut String, f: &Figures| {
        let _ = writeln!(out, "{label}p50 {}  p99 {}", ms(f.p50), ms(f.p99));
    };
    match baseline_spawn_pair(ours, bwrap, n) {
        Ok((f, b)) => {
            ours_line(out, &f);
            let _ = writeln!(
                out,
                "{bwrap_label}p50 {}  p99 {}  ({name} p50 = {:.2}x bwrap{goal})",
                ms(b.p50),
                ms(b.p99),
                f.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9)
            );
        }
        Err(e) => {
            ours_line(out, &baseline_spawn(ours, n)?);
            let _ = writeln!(
                out,
                "{missing} unavailable ({e}); .ci/bench installs bubblewrap"
            );
        }
    }
    Ok(())
}

/// A `pass` cell in a live Python session that has grown: after ten stdlib
/// imports, holding a 100,000-element list, holding about 100 MB of live
/// objects; each sample alternated with a bare `python3 -c pass`, as
/// ratios (goal <= 0.3x, flat as the session grows).
async fn live_sessions(n: usize, warm: &Supervisor, cold: &Supervisor) -> Result<String, String> {
    let exe = match cold.python() {
        Ok(py) => py.executable.to_string_lossy().into_owned(),
        Err(e) => return Ok(format!("live python sessions: not measured: {e}\n")),
    };
    let grown = [
        ("fresh", "pass"),
        (
            "10 stdlib imports",
            "import json, os, time, re, collections, itertools, functools, datetime, decimal, fractions",
        ),
        ("a 100,000-element list", "big = list(range(100_000))"),
        (
            "~100 MB of live objects",
            "blob = [bytes(1 << 20) for _ in range(100)]\nobjs = [{'i': i, 's': str(i)} for i in range(100_000)]",
        ),
    ];
    let mut out = String::new();
    let session = warm
        .session(SessionConfig {
            policy: Policy::deny_all(),
            ..SessionConfig::default()
        })
        .map_err(|e| e.to_string())?;
    for (what, setup) in grown {
        let r = session.run(CellRequest::new(Language::Python, setup)).await;
        if r.status != Status::Ok {
            return Err(format!(
                "a benchmark cell failed: {} {:?}",
                r.status, r.error
            ));
        }
        let (mut cells, mut base) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut tc, mut tb) = (Duration::ZERO, Duration::ZERO);
        let mut kept = true;
        for _ in 0..n {
            tokio::time::sleep(SETTLE).await;
            let t = Instant::now();
            let r = session
                .run(CellRequest::new(Language::Python, "pass"))
                .await;
            let d = t.elapsed();
            if r.status != Status::Ok {
                return Err(format!(
                    "a benchmark cell failed: {} {:?}",
                    r.status, r.error
                ));
            }
            kept &= r.state == Some(crate::StateOutcome::Kept);
            tc += d;
            cells.push(d);
            tokio::time::sleep(SETTLE).await;
            let d = tokio::task::block_in_place(|| spawn_once(&[&exe, "-c", "pass"]))?;
            tb += d;
            base.push(d);
        }
        let (c, b) = (figures(cells, tc), figures(base, tb));
        let _ = writeln!(
            out,
            "python cell in a live session after {what}: p50 {} vs python3 -c pass {}  (p50 = {:.2}x; goal <= 0.3x){}",
            ms(c.p50),
            ms(b.p50),
            c.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9),
            if kept { "" } else { "  NOT LIVE: a cell ran without the live namespace" }
        );
    }
    Ok(out)
}
