//! The escape-attempt suite as a cargo test (`harness = false`): every attack
//! in this directory runs against the freshly built `cellbox` binary. Zero
//! escapes and zero errors is the bar; anything else fails the build.
//!
//! `cargo test --profile test-release --test security -- NAME` runs only attacks whose
//! name contains NAME.
//!
//! After the script attacks come the multi-tenant section (`tenancy/`):
//! attacks between clients of one `cellbox serve --http`, in Rust; and the
//! agent-surface section (`agent/`): attacks through models, tools, upstream
//! MCP servers and the agent loop, in Rust.
#![allow(clippy::disallowed_macros)] // stderr is for the developer

use cellbox::security::{self, catalog, Category, Lang, SuiteOptions};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

mod agent;
mod tenancy;

/// The embedded table and this directory must list the same attacks, or the
/// CLI would silently run a different suite from CI.
fn check_catalog(dir: &Path) -> Result<Vec<security::Attack>, String> {
    let from_dir = security::load_dir(dir)?;
    let on_disk: BTreeSet<&str> = from_dir.iter().map(|a| a.file.as_str()).collect();
    let embedded: BTreeSet<&str> = catalog::EMBEDDED.iter().map(|(p, _)| *p).collect();
    let mut problems = Vec::new();
    for missing in on_disk.difference(&embedded) {
        problems.push(format!(
            "security-tests/{missing} is not in src/security/catalog.rs; add the line `    \"{missing}\",`"
        ));
    }
    for stale in embedded.difference(&on_disk) {
        problems.push(format!(
            "src/security/catalog.rs lists {stale}, which is not in security-tests/"
        ));
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    // Coverage the suite promises: at least 60 attacks, every language and
    // every category represented.
    if from_dir.len() < 60 {
        return Err(format!(
            "only {} attacks; the suite needs at least 60",
            from_dir.len()
        ));
    }
    for lang in [Lang::Python, Lang::Rhai, Lang::Shell] {
        if !from_dir.iter().any(|a| a.lang == lang) {
            return Err(format!("no {} attack", lang.as_str()));
        }
    }
    for cat in [
        Category::Filesystem,
        Category::Network,
        Category::Process,
        Category::Resource,
        Category::Leak,
        Category::Protocol,
        Category::Rhai,
    ] {
        if !from_dir.iter().any(|a| a.category == cat) {
            return Err(format!("no {} attack", cat.as_str()));
        }
    }
    Ok(from_dir)
}

/// The first free argument, skipping libtest's own options (and the values
/// of those that take one), so `cargo test --profile test-release -- --test-threads 2`
/// does not read "2" as a filter.
fn filter_arg(args: &[String]) -> Option<String> {
    const WITH_VALUE: &[&str] = &[
        "--test-threads",
        "--skip",
        "--format",
        "--color",
        "--logfile",
        "-Z",
        "--shuffle-seed",
    ];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if WITH_VALUE.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') {
            return Some(a.clone());
        }
    }
    None
}

/// Attacks that must be seen escaping when only the privilege drop is on,
/// each through a canary (not only through its own report): proof that the
/// harness's checks work on the sandboxed path, not just in the controls.
const SELF_CHECK: &[(&str, &[&str])] = &[
    (
        "python",
        &[
            "fs_read_secret_file",
            "fs_write_outside",
            "fs_write_host_tmp",
            "fs_supervisor_cmdline",
            "net_tcp_loopback",
            "net_udp_loopback",
            "net_unix_pathname",
            "net_unix_abstract",
            "net_bind_listen",
            "leak_hostname",
            "proc_kill_all",
            "proc_daemon_setsid",
        ],
    ),
    (
        "shell",
        &[
            "sh_read_secret",
            "sh_daemon_setsid",
            "sh_tcp_dev_tcp",
            "sh_write_outside",
        ],
    ),
];

/// A copy of a shipped profile with every layer but the privilege drop off.
fn unconfined_profile(lang: &str, dir: &Path) -> Result<std::path::PathBuf, String> {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sandbox-profiles")
        .join(format!("{lang}.toml"));
    let text = std::fs::read_to_string(&shipped)
        .map_err(|e| format!("failed to read {}: {e}", shipped.display()))?;
    let mut turned_off = 0;
    let out: Vec<String> = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            if ["namespaces", "rlimits", "landlock", "seccomp", "cgroup"].contains(&key)
                && line.contains('"')
            {
                turned_off += 1;
                format!("{key} = \"off\"")
            } else if line.trim_start().starts_with("name =") {
                format!("name = \"unconfined-{lang}\"")
            } else {
                line.to_owned()
            }
        })
        .collect();
    if turned_off != 5 {
        return Err(format!(
            "{} no longer has the five [layers] keys this self-check turns off",
            shipped.display()
        ));
    }
    let path = dir.join(format!("unconfined-{lang}.toml"));
    std::fs::write(&path, out.join("\n") + "\n")
        .map_err(|e| format!("failed to write {}: {e}", path.display()))?;
    Ok(path)
}

fn self_check(attacks: &[security::Attack]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("failed to make a temp dir: {e}"))?;
    let mut missed = Vec::new();
    for (lang, names) in SELF_CHECK {
        let mut opts = SuiteOptions::new(env!("CARGO_BIN_EXE_cellbox"));
        opts.profile = Some(unconfined_profile(lang, dir.path())?.display().to_string());
        let chosen: Vec<security::Attack> = attacks
            .iter()
            .filter(|a| names.contains(&a.name.as_str()))
            .cloned()
            .collect();
        if chosen.len() != names.len() {
            return Err(format!("self-check attacks missing from {names:?}"));
        }
        let report = security::run_suite(chosen, &opts)?;
        for o in &report.outcomes {
            let seen_by_harness = o
                .evidence
                .split("; ")
                .any(|e| !e.starts_with("the script reports"));
            if o.verdict != security::Verdict::Escaped || !seen_by_harness {
                missed.push(format!(
                    "{} -> {} ({})",
                    o.file,
                    o.verdict.as_str(),
                    o.evidence
                ));
            }
        }
    }
    if missed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the harness did not see these escapes under an unconfined profile:\n  {}",
            missed.join("\n  ")
        ))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("security-tests");
    let attacks = match check_catalog(&dir) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("security suite: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.iter().any(|a| a == "--list") {
        for a in &attacks {
            println!("{}: test", a.name);
        }
        for (name, _) in tenancy::ATTACKS {
            println!("tenant_{name}: test");
        }
        for (name, _) in agent::ATTACKS {
            println!("agent_{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filter = filter_arg(&args);
    if filter.is_none() {
        eprintln!(
            "security suite: self-check (escapes under a profile with only the privilege drop)"
        );
        if let Err(e) = self_check(&attacks) {
            eprintln!("security suite: {e}");
            return ExitCode::FAILURE;
        }
        eprintln!("security suite: self-check passed");
    }
    // Every path a cell can take: a fresh worker (one-shot CLI); the warm
    // path (fork server / pre-started interpreters) of long-lived surfaces;
    // a live Python session (each Python attack as the middle cell of one,
    // forked from the session's state process); and a Rhai cell that needs
    // nothing of the supervisor (no `run_cell`), which the CLI runs itself
    // (the engine in a copy of the CLI process, which answers its calls).
    let (mut passed, mut failed) = (0, 0);
    let mut ran = 0;
    let base = || {
        let mut opts = SuiteOptions::new(env!("CARGO_BIN_EXE_cellbox"));
        opts.filter = filter.clone();
        opts.progress = true;
        opts
    };
    let mut paths = Vec::new();
    paths.push(("fresh worker", base()));
    let mut warm = base();
    warm.warm = true;
    paths.push(("warm path", warm));
    let mut live = base();
    live.warm = true;
    live.live = true;
    live.langs = vec![Lang::Python];
    paths.push(("live Python session", live));
    let mut in_cli = base();
    in_cli.allow = "emit,answer".into();
    in_cli.langs = vec![Lang::Rhai];
    paths.push(("rhai in the CLI process", in_cli));
    for (path, opts) in paths {
        let chosen = opts.select(attacks.clone());
        if chosen.is_empty() {
            continue;
        }
        ran += chosen.len();
        eprintln!("security suite: {path}");
        match security::run_suite(chosen, &opts) {
            Ok(report) => {
                println!("== {path}");
                print!("{}", report.table(110));
                passed += report.passed();
                failed += report.failed();
            }
            Err(e) => {
                eprintln!("security suite ({path}): {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    match tenancy::run(Path::new(env!("CARGO_BIN_EXE_cellbox")), filter.as_deref()) {
        Ok((p, f, n)) => {
            passed += p;
            failed += f;
            ran += n;
        }
        Err(e) => {
            eprintln!("security suite (multi-tenant): {e}");
            return ExitCode::FAILURE;
        }
    }
    match agent::run(Path::new(env!("CARGO_BIN_EXE_cellbox")), filter.as_deref()) {
        Ok((p, f, n)) => {
            passed += p;
            failed += f;
            ran += n;
        }
        Err(e) => {
            eprintln!("security suite (agent surface): {e}");
            return ExitCode::FAILURE;
        }
    }
    if ran == 0 {
        // `cargo test NAME` hands NAME to every test binary: like libtest,
        // a filter that matches nothing here runs nothing here.
        println!("security suite: no attack matches {filter:?}");
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
