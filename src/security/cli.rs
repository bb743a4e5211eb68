//! `cellbox security-test`: the suite from the command line, against the
//! running binary and its embedded attacks.

use super::{catalog, load_dir, run_suite, Lang, SuiteOptions};
use crate::exit::Exit;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct SecurityTestArgs {
    /// Sandbox profile for every cell (a built-in name or a TOML file);
    /// default: each language's own profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Only attacks in this language: python, rhai or shell.
    #[arg(long = "lang")]
    pub lang: Option<String>,
    /// Also write the full report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the table as Markdown to this file.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Only attacks whose name contains this.
    #[arg(long, value_name = "NAME")]
    pub filter: Option<String>,
    /// Attacks run at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub jobs: usize,
    /// Capabilities the cells may call (comma list).
    #[arg(long, default_value = super::DEFAULT_ALLOW, value_name = "CAPS")]
    pub allow: String,
    /// Read attacks from this `security-tests/` directory instead of the
    /// ones built into the binary.
    #[arg(long = "attacks-dir", value_name = "DIR")]
    pub attacks_dir: Option<PathBuf>,
    /// Print a line per attack as it finishes.
    #[arg(long)]
    pub progress: bool,
    /// Attack the warm path (fork server, pre-started interpreters) that
    /// long-lived surfaces use, instead of a fresh worker per cell.
    #[arg(long)]
    pub warm: bool,
    /// Attack live Python sessions: each Python attack runs as the middle
    /// cell of a live session, in a cell forked from its state process
    /// (implies --warm; only Python attacks run).
    #[arg(long)]
    pub live: bool,
    /// The cellbox binary to attack (default: the `cellbox` front binary
    /// next to this one, else this one).
    #[arg(long, value_name = "PATH")]
    pub cellbox: Option<PathBuf>,
}

const EXIT_FAILED: u8 = Exit::Failed.code();
const EXIT_USAGE: u8 = Exit::Usage.code();

/// Run the suite as the CLI does: table on stdout, exit 1 on any escape or
/// error, 2 on a usage problem.
pub fn cli_main(args: SecurityTestArgs) -> ExitCode {
    // By default the front binary, which users run (it runs `exec` itself).
    let exe = match args
        .cellbox
        .clone()
        .map_or_else(crate::cli::front_binary, Ok)
    {
        Ok(e) => e,
        Err(e) => {
            crate::report!("cellbox security-test: cannot find the running binary: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut opts = SuiteOptions::new(exe);
    opts.profile = args.profile;
    opts.filter = args.filter;
    opts.jobs = args.jobs;
    opts.allow = args.allow;
    opts.progress = args.progress;
    opts.warm = args.warm || args.live;
    opts.live = args.live;
    if let Some(l) = &args.lang {
        match l.parse::<Lang>() {
            Ok(l) => opts.langs.push(l),
            Err(e) => {
                crate::report!("cellbox security-test: --lang: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    if opts.live {
        if opts.langs.iter().any(|l| *l != Lang::Python) {
            crate::report!("cellbox security-test: --live attacks Python sessions; drop --lang or give --lang python");
            return ExitCode::from(EXIT_USAGE);
        }
        opts.langs = vec![Lang::Python];
    }
    let attacks = match &args.attacks_dir {
        Some(d) => load_dir(d),
        None => catalog::load().map_err(|e| e.to_string()),
    };
    let attacks = match attacks {
        Ok(a) => opts.select(a),
        Err(e) => {
            crate::report!("cellbox security-test: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if attacks.is_empty() {
        crate::report!("cellbox security-test: no attack matches the filters");
        return ExitCode::from(EXIT_USAGE);
    }
    let report = match run_suite(attacks, &opts) {
        Ok(r) => r,
        Err(e) => {
            crate::report!("cellbox security-test: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    print!("{}", report.table(110));
    if let Some(path) = &args.json {
        let text = match serde_json::to_string_pretty(&report.to_json()) {
            Ok(t) => t,
            Err(e) => {
                crate::report!("cellbox security-test: failed to encode the report: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        };
        if let Err(e) = std::fs::write(path, text + "\n") {
            crate::report!(
                "cellbox security-test: failed to write {}: {e}",
                path.display()
            );
            return ExitCode::from(EXIT_FAILED);
        }
    }
    if let Some(path) = &args.markdown {
        if let Err(e) = std::fs::write(path, report.markdown()) {
            crate::report!(
                "cellbox security-test: failed to write {}: {e}",
                path.display()
            );
            return ExitCode::from(EXIT_FAILED);
        }
    }
    if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}
