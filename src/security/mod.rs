//! The escape-attempt suite: run every attack in `security-tests/` against a
//! built `cellbox` binary and judge each one from what the harness observes.
//!
//! For each attack the harness plants canaries (the `canary` module), optionally runs
//! the attack once unsandboxed as a positive control (it must escape, or the
//! attack is broken), then runs it through `cellbox run --json` with a fake
//! `API_KEY` in the supervisor's environment, and checks the canaries, the
//! result and the process table afterwards ([`verdict`]). Verdicts:
//! `blocked` (with the denial seen), `escaped` (with the evidence), `error`
//! (the attempt itself is broken or the run could not be judged).
//!
//! Used by both `cellbox security-test` and the `security` cargo test.

pub mod attack;
mod canary;
pub mod catalog;
mod cgroup;
mod cli;
mod report;
mod runner;
mod sha256;
pub mod staged;
pub mod verdict;

pub use attack::{Attack, AttackError, Canary, Category, Lang};
pub use cli::{cli_main, SecurityTestArgs};
pub use report::{AttackOutcome, SuiteReport};
pub use verdict::Verdict;

use canary::{Mode, Observation, RunCanaries, SuiteCanaries};
use serde_json::Value;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verdict::{ControlObs, RunObs, SelfReport};

/// Capabilities every attack runs with: a realistic agent policy (events,
/// answers, sub-cells); everything else stays denied.
pub const DEFAULT_ALLOW: &str = "emit,answer,run_cell";

/// Attacks whose claim does not hold on the live-session path by design,
/// and why: they are left out of a `live` run, with a note in the report.
pub const NOT_ON_THE_LIVE_PATH: &[(&str, &str)] = &[(
    "proc_signal_parent",
    "a live cell's parent is its own session's state process, which shares the cell's \
     Landlock domain and uid (a layer per cell would reach Landlock's 16-layer limit); a cell \
     may end its own session's state, never another session's, a zygote or the supervisor \
     (tests/suite/live.rs)",
)];

/// The interpreter used for unsandboxed Python controls (never a shim).
const CONTROL_PYTHON: &str = "/usr/bin/python3";

/// Extra time the harness gives the supervisor beyond the cell's own timeout
/// before it counts the supervisor as hung.
const SUPERVISOR_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// The `cellbox` binary under test.
    pub cellbox: PathBuf,
    /// `--profile` for every run; `None` leaves each language's default.
    pub profile: Option<String>,
    /// Only attacks in these languages (empty: all).
    pub langs: Vec<Lang>,
    /// Only attacks whose name contains this.
    pub filter: Option<String>,
    /// Attacks run at once.
    pub jobs: usize,
    /// `--allow` list for every run.
    pub allow: String,
    /// Print one line per finished attack on stderr.
    pub progress: bool,
    /// Run cells on the warm path (`cellbox run --warm`: the Rhai fork
    /// server, pre-started Python interpreters) instead of a fresh worker.
    pub warm: bool,
    /// Run each (Python) attack as the middle cell of a live session
    /// (`cellbox run --warm --live-session`): in a cell forked from a
    /// session's state process, with a cell after it.
    pub live: bool,
}

impl SuiteOptions {
    pub fn new(cellbox: impl Into<PathBuf>) -> SuiteOptions {
        SuiteOptions {
            cellbox: cellbox.into(),
            profile: None,
            langs: Vec::new(),
            filter: None,
            jobs: 4,
            allow: DEFAULT_ALLOW.to_owned(),
            warm: false,
            live: false,
            progress: false,
        }
    }

    /// The attacks these options select, in file order.
    pub fn select(&self, attacks: Vec<Attack>) -> Vec<Attack> {
        attacks
            .into_iter()
            .filter(|a| !self.live || !NOT_ON_THE_LIVE_PATH.iter().any(|(n, _)| *n == a.name))
            .filter(|a| self.langs.is_empty() || self.langs.contains(&a.lang))
            .filter(|a| {
                self.filter
                    .as_deref()
                    .is_none_or(|f| a.name.contains(f) || a.file.contains(f))
            })
            .collect()
    }
}

/// Read every attack under a `security-tests/` directory.
pub fn load_dir(dir: &Path) -> Result<Vec<Attack>, String> {
    let mut out = Vec::new();
    for lang in [Lang::Python, Lang::Rhai, Lang::Shell] {
        let (sub, ext) = lang.dir_and_ext();
        let d = dir.join(sub);
        let rd =
            std::fs::read_dir(&d).map_err(|e| format!("failed to read {}: {e}", d.display()))?;
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(&format!(".{ext}")))
            .collect();
        names.sort();
        for n in names {
            let rel = format!("{sub}/{n}");
            let path = d.join(&n);
            let src = std::fs::read_to_string(&path)
                .map_err(|e| format!("failed to read {}: {e}", path.display()))?;
            out.push(Attack::parse(&rel, &src).map_err(|e| e.to_string())?);
        }
    }
    Ok(out)
}

fn clip(s: &str, n: usize) -> String {
    let s = s.trim().replace('\n', " | ");
    if s.chars().count() <= n {
        s
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

fn cgroup_for(
    suite: &SuiteCanaries,
    rc: &RunCanaries,
) -> Result<Option<cgroup::RunCgroup>, String> {
    match &suite.cgroups {
        None => Ok(None),
        Some(root) => {
            let name = rc
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| canary::random_hex(6));
            root.child(&name).map(Some)
        }
    }
}

/// The unsandboxed positive control.
fn run_control(suite: &SuiteCanaries, attack: &Attack) -> ControlObs {
    let mut rc = match RunCanaries::plant(suite, attack, Mode::Control) {
        Ok(rc) => rc,
        Err(e) => return ControlObs::Failed(format!("could not plant canaries: {e}")),
    };
    let standin = rc.standin_pid().unwrap_or(0);
    let src = match rc.substitute(&attack.source, standin) {
        Ok(s) => s,
        Err(e) => return ControlObs::Failed(e),
    };
    let (program, args) = match attack.lang {
        Lang::Python => {
            let file = rc.dir.join("attack.py");
            if let Err(e) = std::fs::write(&file, &src) {
                return ControlObs::Failed(format!("failed to write {}: {e}", file.display()));
            }
            (
                PathBuf::from(CONTROL_PYTHON),
                vec![file.to_string_lossy().into_owned()],
            )
        }
        Lang::Shell => (PathBuf::from("/bin/sh"), vec!["-c".to_owned(), src]),
        Lang::Rhai => return ControlObs::Failed("Rhai has no unsandboxed form".into()),
    };
    let cg = match cgroup_for(suite, &rc) {
        Ok(c) => c,
        Err(e) => return ControlObs::Failed(e),
    };
    let launch = runner::Launch {
        program,
        args,
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("HOME".into(), rc.scratch.to_string_lossy().into_owned()),
            ("API_KEY".into(), rc.api_key.clone()),
        ],
        clear_env: true,
        cwd: Some(rc.scratch.clone()),
        deadline: attack.timeout + Duration::from_secs(10),
        stdout_cap: 8 << 20,
        stderr_cap: 1 << 20,
        watch_rss: false,
    };
    let out = match runner::run(
        &launch,
        cg.as_ref(),
        &rc.marker,
        |_| Ok(Vec::new()),
        || rc.start_probing(),
    ) {
        Ok(o) => o,
        Err(e) => return ControlObs::Failed(e),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let obs = Observation {
        texts: vec![("stdout", stdout.clone()), ("stderr", stderr.clone())],
        ..Observation::default()
    };
    let evidence = rc.evidence(suite, attack, &obs);
    let report = verdict::self_report(&[&stdout, &stderr]);
    if let Some(first) = evidence.first() {
        return ControlObs::Escaped(first.clone());
    }
    // An attack that names canaries must trip one when it works, or the
    // harness would not see the same escape under the sandbox either.
    let observable = attack.canaries.iter().any(|c| {
        !matches!(
            c,
            Canary::Forged | Canary::OutputCap | Canary::SupervisorRss
        )
    });
    if let Some(SelfReport::Escaped(d)) = &report {
        if !observable {
            return ControlObs::Escaped(clip(d, 100));
        }
        return ControlObs::Failed(format!(
            "it reports escaped ({}) but none of its canaries fired",
            clip(d, 100)
        ));
    }
    let status = match out.status {
        Some(s) => s.to_string(),
        None => "no exit status".into(),
    };
    ControlObs::Failed(match report {
        Some(SelfReport::Blocked(d)) => format!("it reports blocked: {} ({status})", clip(&d, 100)),
        Some(SelfReport::Attempted(d)) => {
            format!("no canary fired: {} ({status})", clip(&d, 100))
        }
        _ => format!(
            "no ATTACK-RESULT line ({status}{}) {}",
            if out.deadline_hit {
                ", killed at the deadline"
            } else {
                ""
            },
            clip(&stderr, 160)
        ),
    })
}

/// The real run, through `cellbox run --json`.
fn run_sandboxed(
    suite: &SuiteCanaries,
    attack: &Attack,
    opts: &SuiteOptions,
) -> (RunObs, Option<String>) {
    let fail = |e: String| {
        (
            RunObs {
                evidence: vec![],
                result: Err(e),
            },
            None,
        )
    };
    let mut rc = match RunCanaries::plant(suite, attack, Mode::Sandboxed) {
        Ok(rc) => rc,
        Err(e) => return fail(format!("could not plant canaries: {e}")),
    };
    let cg = match cgroup_for(suite, &rc) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let mut args = vec![
        "run".to_owned(),
        "--json".into(),
        "--lang".into(),
        attack.lang.as_str().into(),
        "--timeout".into(),
        format!("{}", attack.timeout.as_secs_f64()),
    ];
    if !opts.allow.is_empty() {
        args.push("--allow".into());
        args.push(opts.allow.clone());
    }
    if let Some(p) = &opts.profile {
        args.push("--profile".into());
        args.push(p.clone());
    }
    push_path_flags(&mut args, opts);
    args.push("-".into());
    let launch = runner::Launch {
        program: rc.supervisor_exe.clone(),
        args,
        env: vec![("API_KEY".into(), rc.api_key.clone())],
        clear_env: false,
        cwd: None,
        deadline: attack.timeout + SUPERVISOR_GRACE,
        stdout_cap: 64 << 20,
        stderr_cap: 1 << 20,
        watch_rss: true,
    };
    let source = attack.source.clone();
    let out = {
        let rc_ref = &rc;
        runner::run(
            &launch,
            cg.as_ref(),
            &rc.marker,
            |pid| rc_ref.substitute(&source, pid).map(String::into_bytes),
            || rc_ref.start_probing(),
        )
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let parsed: Result<Value, String> = serde_json::from_str::<Value>(raw.trim())
        .map_err(|e| {
            let status = out
                .status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "no exit status".into());
            format!(
                "cellbox {status}{}; stdout ({} bytes) is not a JSON result ({e}); stderr: {}",
                if out.deadline_hit {
                    ", killed by the harness"
                } else {
                    ""
                },
                out.stdout_total,
                clip(&stderr, 200)
            )
        })
        .and_then(|v| {
            if v.get("status").and_then(Value::as_str).is_some() {
                Ok(v)
            } else {
                Err("the JSON result has no status".into())
            }
        });
    // Decoded stdout/stderr for line-based checks, and the raw result for
    // tokens wherever they ended up (value, error, vars, ...).
    let field = |k: &str| {
        parsed
            .as_ref()
            .ok()
            .and_then(|r| r.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let mut obs = Observation {
        texts: vec![
            ("stdout", field("stdout")),
            ("stderr", field("stderr")),
            ("the result", raw),
        ],
        peak_rss_kb: out.peak_rss_kb,
        ..Observation::default()
    };
    if let Ok(r) = &parsed {
        let mut fields = r.clone();
        if let Some(m) = fields.as_object_mut() {
            m.remove("stdout");
            m.remove("stderr");
            m.remove("error");
        }
        obs.forged_fields = Some(fields.to_string());
        obs.stdout_len = r.get("stdout").and_then(Value::as_str).map(str::len);
        obs.script_finished = ["stdout", "stderr"].iter().any(|k| {
            r.get(*k)
                .and_then(Value::as_str)
                .is_some_and(|t| t.contains("ATTACK-RESULT:"))
        });
        obs.stdout_truncated = r
            .get("truncated")
            .and_then(|t| t.get("stdout"))
            .map(|s| !s.is_null());
    }
    let mut evidence = rc.evidence(suite, attack, &obs);
    for s in &out.survivors {
        evidence.push(format!("survived the cell: {s}"));
    }
    if out.deadline_hit {
        evidence.push(format!(
            "the supervisor was still running {} s after the cell's {} s timeout (killed by the harness)",
            SUPERVISOR_GRACE.as_secs(),
            attack.timeout.as_secs_f64()
        ));
    }
    if attack.wants(Canary::OutputCap) && out.stdout_total > 2 * canary::CAPPED_STDOUT_BYTES as u64
    {
        evidence.push(format!(
            "the supervisor printed a {} MiB result: output not capped",
            out.stdout_total >> 20
        ));
    }
    let status = parsed
        .as_ref()
        .ok()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    (
        RunObs {
            evidence,
            result: parsed,
        },
        status,
    )
}

/// The flags that pick the path a cell takes: the warm pools, and a live
/// session's state process on top of them.
fn push_path_flags(args: &mut Vec<String>, opts: &SuiteOptions) {
    if opts.warm || opts.live {
        args.push("--warm".into());
    }
    if opts.live {
        args.push("--live-session".into());
    }
}

/// A trivial cell per language, run the same way as the attacks. A backend
/// that cannot run it would make every attack in that language look
/// "blocked", so its attacks become errors instead.
fn preflight(cellbox: &Path, lang: Lang, opts: &SuiteOptions) -> Result<(), String> {
    let code = match lang {
        Lang::Python => "print('cbx-preflight-' + str(6 * 7))\n",
        Lang::Rhai => "print(\"cbx-preflight-\" + (6 * 7));\n",
        Lang::Shell => "echo \"cbx-preflight-$((6 * 7))\"\n",
    };
    let mut args = vec![
        "run".to_owned(),
        "--json".into(),
        "--lang".into(),
        lang.as_str().into(),
        "--timeout".into(),
        "20".into(),
        "--allow".into(),
        opts.allow.clone(),
    ];
    if opts.allow.is_empty() {
        args.truncate(6);
    }
    if let Some(p) = &opts.profile {
        args.push("--profile".into());
        args.push(p.clone());
    }
    if lang == Lang::Python {
        push_path_flags(&mut args, opts);
    }
    args.push("-".into());
    let launch = runner::Launch {
        program: cellbox.to_path_buf(),
        args,
        env: vec![],
        clear_env: false,
        cwd: None,
        deadline: Duration::from_secs(40),
        stdout_cap: 4 << 20,
        stderr_cap: 1 << 20,
        watch_rss: false,
    };
    let marker = format!("cbx{}", canary::random_hex(6));
    let out = runner::run(
        &launch,
        None,
        &marker,
        |_| Ok(code.as_bytes().to_vec()),
        || {},
    )?;
    let raw = String::from_utf8_lossy(&out.stdout);
    let r: Value = serde_json::from_str(raw.trim()).map_err(|e| {
        format!(
            "no JSON result ({e}); stderr: {}",
            clip(&String::from_utf8_lossy(&out.stderr), 200)
        )
    })?;
    let status = r.get("status").and_then(Value::as_str).unwrap_or("");
    let stdout = r.get("stdout").and_then(Value::as_str).unwrap_or("");
    if status == "ok" && stdout.contains("cbx-preflight-42") {
        return Ok(());
    }
    let err = r
        .get("error")
        .map(|e| {
            format!(
                "{}: {}",
                e.get("type").and_then(Value::as_str).unwrap_or(""),
                e.get("message").and_then(Value::as_str).unwrap_or("")
            )
        })
        .unwrap_or_default();
    Err(format!("status {status}, {}", clip(&err, 200)))
}

fn run_one(
    suite: &SuiteCanaries,
    attack: &Attack,
    opts: &SuiteOptions,
    preflight: Option<&String>,
) -> AttackOutcome {
    let t0 = Instant::now();
    let control = if attack.control {
        run_control(suite, attack)
    } else {
        ControlObs::NotRun
    };
    // A broken control makes a "blocked" moot, but the sandboxed run still
    // happens: an escape must be reported as one.
    let (run, status) = run_sandboxed(suite, attack, opts);
    let (mut verdict, mut detail) = verdict::judge(attack, &control, &run);
    if let (Some(why), false) = (preflight, verdict == Verdict::Escaped) {
        verdict = Verdict::Error;
        detail = format!(
            "the {} backend cannot run a trivial cell ({why}); this attack proves nothing",
            attack.lang.as_str()
        );
    }
    AttackOutcome {
        name: attack.name.clone(),
        file: attack.file.clone(),
        lang: attack.lang,
        category: attack.category,
        verdict,
        evidence: detail,
        status,
        control: match &control {
            ControlObs::NotRun => "not run".into(),
            ControlObs::Escaped(d) => format!("escaped: {d}"),
            ControlObs::Failed(d) => format!("failed: {d}"),
        },
        time: t0.elapsed(),
    }
}

/// Run `attacks` and judge them.
pub fn run_suite(attacks: Vec<Attack>, opts: &SuiteOptions) -> Result<SuiteReport, String> {
    if !opts.cellbox.is_file() {
        return Err(format!(
            "the cellbox binary {} does not exist",
            opts.cellbox.display()
        ));
    }
    let cellbox = std::fs::canonicalize(&opts.cellbox)
        .map_err(|e| format!("failed to resolve {}: {e}", opts.cellbox.display()))?;
    let suite = SuiteCanaries::new(&cellbox)?;
    let t0 = Instant::now();
    let mut broken: Vec<(Lang, String)> = Vec::new();
    let mut notes = Vec::new();
    for lang in [Lang::Python, Lang::Rhai, Lang::Shell] {
        if !attacks.iter().any(|a| a.lang == lang) {
            continue;
        }
        if let Err(e) = preflight(&cellbox, lang, opts) {
            notes.push(format!(
                "preflight: a trivial {} cell fails ({e})",
                lang.as_str()
            ));
            broken.push((lang, e));
        }
    }
    if opts.live {
        for (name, why) in NOT_ON_THE_LIVE_PATH {
            notes.push(format!("not run on the live-session path: {name}: {why}"));
        }
    }
    let total = attacks.len();
    // Longest first, so the slow ones overlap the rest.
    let mut order: Vec<usize> = (0..total).collect();
    order.sort_by(|&a, &b| attacks[b].timeout.cmp(&attacks[a].timeout));
    let queue = Mutex::new(order.into_iter().collect::<VecDeque<usize>>());
    let results: Mutex<Vec<Option<AttackOutcome>>> = Mutex::new(vec![None; total]);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.clamp(1, 16) {
            s.spawn(|| loop {
                let next = crate::util::lock(&queue).pop_front();
                let Some(i) = next else { return };
                let why = broken
                    .iter()
                    .find(|(l, _)| *l == attacks[i].lang)
                    .map(|(_, e)| e);
                let outcome = run_one(&suite, &attacks[i], opts, why);
                if opts.progress {
                    let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    crate::report!(
                        "[{n:>3}/{total}] {:<8} {:<40} {:>6.1}s",
                        outcome.verdict.as_str(),
                        outcome.file,
                        outcome.time.as_secs_f64()
                    );
                }
                crate::util::lock(&results)[i] = Some(outcome);
            });
        }
    });
    let outcomes: Vec<AttackOutcome> = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .flatten()
        .collect();
    Ok(SuiteReport {
        outcomes,
        notes: suite.notes.iter().cloned().chain(notes).collect(),
        profile: opts.profile.clone(),
        wall: t0.elapsed(),
    })
}
