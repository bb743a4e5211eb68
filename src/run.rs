//! `cellbox run`: one cell from a file or stdin (`-`). A shell cell is run
//! from this process, before any runtime exists, like `cellbox exec`
//! ([`one_shot_shell`]); a Rhai or Python cell goes through a
//! [`Supervisor`](crate::Supervisor) ([`cli_main`]).

use crate::cli::{
    build_supervisor, interruptible, pick_language, print_json, session_config, sigint_stream,
    usage, CellOpts,
};
use crate::render::print_result;
#[cfg(target_os = "linux")]
use crate::{cli::events_sink, Language};
use crate::{CellRequest, Forward};
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

/// The arguments of `cellbox run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub opts: CellOpts,
    /// Print the whole result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Run the cell on the warm path (fork server / pre-started
    /// interpreter) that long-lived surfaces use, instead of spawning a
    /// fresh worker.
    #[arg(long)]
    pub warm: bool,
    /// Run the script as the second cell of a live Python session: a first
    /// cell fills the session's state process with objects, the script runs
    /// in a cell forked from it, and a last cell runs after it (its output
    /// is appended to the script's). The escape suite attacks state
    /// processes this way.
    #[arg(long, hide = true, requires = "warm")]
    pub live_session: bool,
    /// The script file, or `-` for stdin.
    pub file: String,
}

/// A script path that cannot be a script: a directory, or nothing there.
/// Checked before the language is guessed from the extension, so that the
/// message names the real problem.
fn script_path_problem(file: &str) -> Option<String> {
    if file == "-" {
        return None;
    }
    match std::fs::metadata(file) {
        Ok(m) if m.is_dir() => Some(format!(
            "{file} is a directory: give a script file, or - to read the script from stdin"
        )),
        Ok(_) => None,
        Err(e) => Some(format!("cannot open {file}: {e}")),
    }
}

/// Run the cell through a supervisor and print its result.
pub async fn cli_main(args: RunArgs) -> ExitCode {
    let RunArgs {
        opts,
        json,
        warm,
        live_session,
        file,
    } = args;
    let file = file.as_str();
    if let Some(problem) = script_path_problem(file) {
        return usage(problem);
    }
    let path = (file != "-").then(|| Path::new(file));
    let language = match pick_language(&opts, path) {
        Ok(l) => l,
        Err(e) => return usage(e),
    };
    let config = match session_config(&opts) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let code = match read_source(file, config.limits.max_script_bytes) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    if let Some(e) = language.code_error(&code) {
        return usage(format!("{file}: {e}"));
    }
    // One cell: spawning directly beats starting a fork server first.
    let sup = match build_supervisor(&opts, warm, &config) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    // The output streams as the cell writes it (with --json, stdout is the
    // result alone); Ctrl-C kills the cell and its result is still printed.
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut request = CellRequest::new(language, code);
    request.forward = if json { Forward::No } else { Forward::Head };
    request.cancel = Some(cancel.clone());
    let mut sigint = sigint_stream();
    let result = if live_session {
        if language != crate::Language::Python {
            return usage("--live-session runs Python cells only");
        }
        let mut session = match crate::security::staged::Staged::open(&sup, config).await {
            Ok(s) => s,
            Err(e) => return usage(e),
        };
        let result = interruptible(session.run(request), &cancel, sigint.as_mut()).await;
        session.finish(result).await
    } else {
        interruptible(sup.run(request, config), &cancel, sigint.as_mut()).await
    };
    if json {
        if let Err(code) = print_json(&result) {
            return code;
        }
    } else {
        print_result(&result, false, true);
    }
    ExitCode::from(result.status.exit_code())
}

/// `cellbox run` of a shell cell, run from this process like `exec`.
/// `None` when the cell is not a shell cell (or its language is unclear:
/// the library path reports that), or a config file is given.
#[cfg(target_os = "linux")]
pub fn one_shot_shell(args: &RunArgs) -> Option<ExitCode> {
    let (opts, json, file) = (&args.opts, args.json, args.file.as_str());
    // A config file may name secrets (model keys, tool tokens): their
    // redaction of the result and of the output shown as it comes is the
    // library path's (see [`crate::secrets`]), as for Rhai below.
    if opts.config.is_some() {
        return None;
    }
    if let Some(problem) = script_path_problem(file) {
        return Some(usage(problem));
    }
    let path = (file != "-").then(|| Path::new(file));
    if pick_language(opts, path).ok()? != Language::Shell {
        return None;
    }
    let config = match session_config(opts) {
        Ok(c) => c,
        Err(e) => return Some(usage(e)),
    };
    let code = match read_source(file, config.limits.max_script_bytes) {
        Ok(c) => c,
        Err(e) => return Some(usage(e)),
    };
    if let Some(e) = Language::Shell.code_error(&code) {
        return Some(usage(format!("{file}: {e}")));
    }
    let events = match events_sink(opts) {
        Ok(s) => s,
        Err(e) => return Some(usage(e)),
    };
    let forward = if json { Forward::No } else { Forward::Head };
    let cell = crate::supervisor::oneshot::OneShot::shell(&code)
        .forwarding(forward)
        .interruptible();
    let result = crate::supervisor::oneshot::run(cell, config, &events);
    Some(one_shot_exit(&result, json))
}

/// `cellbox run` of a Rhai cell, run from this process: cloned into its
/// namespaces from here, the engine running in the cell itself, its calls
/// answered by a blocking loop (see [`crate::supervisor::oneshot_rhai`]).
/// `None` when the cell is not a Rhai cell, or needs what only the library
/// path has: `--warm`, a config file (models, file and declared tools), a
/// policy that allows `run_cell`; or with `CELLBOX_RUN=supervisor`, which
/// asks for the library path (to compare, or to rule this one out).
#[cfg(target_os = "linux")]
pub fn one_shot_rhai(args: &RunArgs) -> Option<ExitCode> {
    let (opts, json, file) = (&args.opts, args.json, args.file.as_str());
    if args.warm
        || opts.config.is_some()
        || std::env::var_os("CELLBOX_RUN").is_some_and(|v| v == "supervisor")
    {
        return None;
    }
    if let Some(problem) = script_path_problem(file) {
        return Some(usage(problem));
    }
    let path = (file != "-").then(|| Path::new(file));
    if pick_language(opts, path).ok()? != Language::Rhai {
        return None;
    }
    let config = match session_config(opts) {
        Ok(c) => c,
        Err(e) => return Some(usage(e)),
    };
    // Decided before stdin is read: the library path reads it otherwise.
    if !crate::supervisor::oneshot_rhai::eligible(&config) {
        return None;
    }
    let code = match read_source(file, config.limits.max_script_bytes) {
        Ok(c) => c,
        Err(e) => return Some(usage(e)),
    };
    if let Some(e) = Language::Rhai.code_error(&code) {
        return Some(usage(format!("{file}: {e}")));
    }
    let events = match events_sink(opts) {
        Ok(s) => s,
        Err(e) => return Some(usage(e)),
    };
    let forward = if json { Forward::No } else { Forward::Head };
    let how = crate::supervisor::oneshot::OneShot::rhai()
        .forwarding(forward)
        .interruptible();
    let result = crate::supervisor::oneshot_rhai::run(&code, how, config, &events);
    Some(one_shot_exit(&result, json))
}

/// Print a one-shot cell's result (JSON, or as `run` prints it) and give
/// the exit code it stands for.
#[cfg(target_os = "linux")]
fn one_shot_exit(result: &crate::CellResult, json: bool) -> ExitCode {
    if json {
        if let Err(code) = print_json(result) {
            return code;
        }
    } else {
        print_result(result, false, true);
    }
    ExitCode::from(result.status.exit_code())
}

/// `cellbox run ...` read by a parser of `run` alone, when it is a cell
/// this process runs itself ([`one_shot_shell`], [`one_shot_rhai`]);
/// `None` for anything else (the full command line then parses it, and
/// gives the canonical message for what it rejects).
#[cfg(target_os = "linux")]
pub fn early_run() -> Option<ExitCode> {
    #[derive(clap::Parser)]
    #[command(name = "cellbox")]
    struct RunOnly {
        #[command(subcommand)]
        command: RunCommand,
    }
    #[derive(clap::Subcommand)]
    enum RunCommand {
        Run(RunArgs),
    }
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new("run")) {
        return None;
    }
    // Diagnostics are set up by the full command line.
    if std::env::var_os("CELLBOX_LOG").is_some() {
        return None;
    }
    let RunOnly {
        command: RunCommand::Run(args),
    } = <RunOnly as clap::Parser>::try_parse().ok()?;
    one_shot_shell(&args).or_else(|| one_shot_rhai(&args))
}

fn read_source(file: &str, max: usize) -> Result<String, String> {
    let mut bytes = Vec::new();
    let limit = (max as u64).saturating_add(1);
    let res = if file == "-" {
        std::io::stdin().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file)
            .map_err(|e| format!("cannot open {file}: {e}"))?
            .take(limit)
            .read_to_end(&mut bytes)
    };
    res.map_err(|e| format!("cannot read {file}: {e}"))?;
    if bytes.len() > max {
        return Err(format!(
            "{file} is larger than the script limit of {max} bytes (max_script_bytes)"
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{file} is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}
