//! The escape-attempt suite as a cargo test (`harness = false`): every attack
//! in this directory runs against the freshly built `cellbox` binary. Zero
//! escapes and zero errors is the bar; anything else fails the build.
//!
//! `cargo test --release --test security -- NAME` runs only attacks whose
//! name contains NAME.

use cellbox::security::{self, catalog, Category, Lang, SuiteOptions};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

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
/// of those that take one), so `cargo test --release -- --test-threads 2`
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
        return ExitCode::SUCCESS;
    }
    let mut opts = SuiteOptions::new(env!("CARGO_BIN_EXE_cellbox"));
    opts.filter = filter_arg(&args);
    opts.progress = true;
    let attacks = opts.select(attacks);
    if attacks.is_empty() {
        // `cargo test NAME` hands NAME to every test binary: like libtest,
        // a filter that matches nothing here runs nothing here.
        println!("security suite: no attack matches {:?}", opts.filter);
        println!("0 passed, 0 failed");
        return ExitCode::SUCCESS;
    }
    match security::run_suite(attacks, &opts) {
        Ok(report) => {
            print!("{}", report.table(110));
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("security suite: {e}");
            ExitCode::FAILURE
        }
    }
}
