//! The parts of the command line that both binaries share: the options of
//! a cell and the whole of `cellbox exec`, which the small `cellbox` front
//! binary runs itself (see `src/bin/cellbox.rs`) and `cellbox-engine`
//! runs the same way; and what the engine's cell-running commands
//! (`run`, `repl`) share: the supervisor, the language, Ctrl-C.

use crate::exit::Exit;
use crate::{CellResult, EventSink, Language, Policy, SessionConfig, Status, Supervisor};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code of a usage or configuration error.
pub const EXIT_USAGE: u8 = Exit::Usage.code();
/// Exit code of an internal or protocol error.
pub const EXIT_INTERNAL: u8 = Exit::Internal.code();

/// Options every cell-running command takes.
#[derive(Args, Clone, Debug, Default)]
pub struct CellOpts {
    /// Language of the code: rhai, python or shell. Default: from the
    /// file's extension (.rhai, .py, .sh; any other is an error that asks
    /// for --lang); rhai for stdin (`-`) and the REPL.
    #[arg(long = "lang", short = 'l')]
    pub lang: Option<String>,
    /// Sandbox profile: a built-in name (rhai, python, shell) or a TOML file.
    #[arg(long)]
    pub profile: Option<String>,
    /// Read the policy, limits and `[models.NAME]` tables from this TOML
    /// file (the format `cellbox serve --config` reads); flags add to it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub cell: CellArgs,
}

/// The config file `--config` names, if any.
pub fn config_file(opts: &CellOpts) -> Result<Option<crate::serve::ServeConfig>, String> {
    let Some(path) = &opts.config else {
        return Ok(None);
    };
    let c = crate::serve::ServeConfig::load(path).map_err(|e| e.to_string())?;
    crate::models::config::validate(&c.models).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(c))
}

/// A cell's capabilities, limits, interpreter and events file: the flags
/// the cell-running commands ([`CellOpts`]) and `cellbox serve`
/// ([`crate::serve::ServeArgs`], which words their help for a server) both
/// take. None has a default here: an absent flag leaves the command's own
/// (`serve` keeps less output, for instance), resolved where the flags are
/// read ([`session_config`], `ServeConfig::apply_args`).
#[derive(Args, Clone, Debug, Default)]
pub struct CellArgs {
    /// Allow a capability by name (repeatable); everything else is denied.
    #[arg(long = "allow", value_name = "CAP")]
    pub allow: Vec<String>,
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Bytes of stdout (and of stderr) kept; the rest is cut from the middle.
    #[arg(long = "max-output", value_name = "BYTES")]
    pub max_output: Option<usize>,
    /// Rhai: operations before the engine stops the script (0 = no limit).
    #[arg(long = "max-operations", value_name = "N")]
    pub max_operations: Option<u64>,
    /// Memory limit in bytes.
    #[arg(long = "memory", value_name = "BYTES")]
    pub memory: Option<u64>,
    /// Append run events (JSON lines) to this file.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Python interpreter to use (default: the real python3 found on PATH).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// Report a usage error and return its exit code.
pub fn usage(msg: impl std::fmt::Display) -> ExitCode {
    crate::report!("cellbox: {}", crate::terminal::for_person(&msg.to_string()));
    ExitCode::from(EXIT_USAGE)
}

/// The session configuration the options ask for.
pub fn session_config(opts: &CellOpts) -> Result<SessionConfig, String> {
    let file = config_file(opts)?;
    let mut policy = file
        .as_ref()
        .map_or_else(Policy::deny_all, |f| f.policy.clone());
    for a in &opts.cell.allow {
        for name in a.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !crate::supervisor::is_allow_name(name) {
                return Err(format!("--allow {name:?}: not a capability name"));
            }
            policy.allow.insert(name.to_owned());
        }
    }
    let mut config = SessionConfig {
        policy,
        ..SessionConfig::default()
    };
    if let Some(f) = &file {
        config.limits = f.limits.clone();
    }
    if let Some(t) = opts.cell.timeout {
        if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
            return Err(format!("--timeout {t}: give seconds between 0 and 86400"));
        }
        config.limits.timeout_ms = (t * 1000.0).ceil() as u64;
    }
    if let Some(m) = opts.cell.max_output {
        config.limits.max_output_bytes = m;
    }
    if let Some(n) = opts.cell.max_operations {
        config.limits.max_operations = n;
    }
    if let Some(m) = opts.cell.memory {
        config.limits.rlimits.memory_bytes = m;
    }
    config.profile = opts.profile.clone();
    Ok(config)
}

/// Print a result as one JSON line (the characters a terminal would act
/// on written as JSON escapes, see [`crate::terminal::escape_json`]).
pub fn print_json(r: &CellResult) -> Result<(), ExitCode> {
    match serde_json::to_string(r) {
        Ok(s) => {
            println!("{}", crate::terminal::escape_json(&s));
            Ok(())
        }
        Err(e) => {
            crate::report!("cellbox: failed to encode the result: {e}");
            Err(ExitCode::from(EXIT_INTERNAL))
        }
    }
}

/// `cellbox exec` alone, so that a one-shot run does not build the whole
/// command tree. The same options as the full command line's `exec`;
/// anything this parser rejects (including `--help`) goes to the full
/// parser, which gives the canonical message.
#[derive(Parser)]
#[command(name = "cellbox")]
struct ExecOnly {
    #[command(subcommand)]
    command: ExecCommand,
}

#[derive(Subcommand)]
enum ExecCommand {
    Exec(ExecArgs),
}

/// The arguments of `cellbox exec` (both parsers).
#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub opts: CellOpts,
    /// Print the result as JSON instead of passing output through.
    #[arg(long)]
    pub json: bool,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub argv: Vec<String>,
}

/// Run `cellbox exec ...` if that is what was asked for and it parses.
#[cfg(target_os = "linux")]
pub fn early_exec() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(std::ffi::OsStr::new("exec")) {
        return None;
    }
    if std::env::var_os("CELLBOX_LOG").is_some() {
        return None;
    }
    let rest: Vec<std::ffi::OsString> = args.collect();
    let ExecArgs { opts, json, argv } = match plain_exec(&rest) {
        Some(a) => a,
        None => match ExecOnly::try_parse() {
            Ok(ExecOnly {
                command: ExecCommand::Exec(a),
            }) => a,
            Err(_) => return None,
        },
    };
    Some(cmd_exec(opts, json, argv))
}

/// `exec [--json] -- PROGRAM [ARGS...]`, the common form, read without
/// building a parser: exactly what the parser makes of it. Anything else
/// (another option, no `--`, arguments that are not UTF-8) is `None`, for
/// the parser.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the Linux-only warm paths
fn plain_exec(rest: &[std::ffi::OsString]) -> Option<ExecArgs> {
    let (json, rest) = match rest.split_first() {
        Some((first, tail)) if first == "--json" => (true, tail),
        _ => (false, rest),
    };
    let (dashes, argv) = rest.split_first()?;
    if dashes != "--" || argv.is_empty() {
        return None;
    }
    let argv = argv
        .iter()
        .map(|a| a.to_str().map(str::to_owned))
        .collect::<Option<Vec<String>>>()?;
    Some(ExecArgs {
        opts: CellOpts::default(),
        json,
        argv,
    })
}

/// The exit code and output of `cellbox exec` for its result.
pub fn exec_exit(result: &CellResult, json: bool) -> ExitCode {
    if json {
        if let Err(code) = print_json(result) {
            return code;
        }
    } else {
        if let Some(e) = &result.error {
            if result.status != Status::Error {
                crate::report!(
                    "cellbox: {}: {} [{}]",
                    crate::terminal::escape(&e.kind),
                    crate::terminal::escape(&e.message),
                    result.status
                );
            }
        }
        // Mirror the program's own exit status when it ran to the end.
        if result.status == Status::Error {
            if let Some(code) = result.exit.code {
                return ExitCode::from(u8::try_from(code).unwrap_or(Exit::Failed.code()));
            }
        }
    }
    ExitCode::from(result.status.exit_code())
}

/// The events sink `--events` asks for.
pub fn events_sink(opts: &CellOpts) -> Result<EventSink, String> {
    match &opts.cell.events {
        Some(path) => EventSink::to_file(path)
            .map_err(|e| format!("failed to open the events file {}: {e}", path.display())),
        None => Ok(EventSink::default()),
    }
}

/// `cellbox exec`: one program, one cell, run from this process.
#[cfg(target_os = "linux")]
pub fn cmd_exec(opts: CellOpts, json: bool, argv: Vec<String>) -> ExitCode {
    let config = match session_config(&opts) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let events = match events_sink(&opts) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let cell = crate::supervisor::oneshot::OneShot::exec(argv, !json);
    let result = crate::supervisor::oneshot::run(cell, config, &events);
    exec_exit(&result, json)
}

/// `cellbox exec` where cells cannot be run from this process: through a
/// supervisor.
#[cfg(not(target_os = "linux"))]
pub async fn cmd_exec(opts: CellOpts, json: bool, argv: Vec<String>) -> ExitCode {
    let config = match session_config(&opts) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let sup = match build_supervisor(&opts, false, &config) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let result = sup.exec(argv, config, !json).await;
    exec_exit(&result, json)
}

/// A supervisor for the cells of one command: they run one at a time, so
/// together (with a warm worker's own share) they are held to one cell's
/// memory limit, and none is prepared for a next one.
pub fn build_supervisor(
    opts: &CellOpts,
    warm: bool,
    config: &SessionConfig,
) -> Result<Supervisor, String> {
    let mut b = Supervisor::builder()
        .warm(warm)
        .prepare_runs(false)
        .cells_memory_bytes(config.limits.rlimits.memory_bytes.saturating_add(64 << 20));
    if let Some(p) = &opts.cell.python {
        b = b.python(p);
    }
    if opts.cell.events.is_some() {
        b = b.events(events_sink(opts)?);
    }
    // Command tools run cells through the supervisor that holds them: it
    // is handed to them once built.
    #[cfg(target_os = "linux")]
    let slot = crate::tools::SupervisorSlot::default();
    if let Some(f) = config_file(opts)? {
        if !f.models.is_empty() {
            let client = crate::models::ModelClient::new(&f.models).map_err(|e| e.to_string())?;
            b = b.models(client).map_err(|e| e.to_string())?;
        }
        // The file tools and declared tools of `[files]` and `[tools.*]`,
        // as `serve` offers them (still denied unless the policy allows).
        #[cfg(target_os = "linux")]
        for cap in
            crate::tools::host_and_declared(&f.files, &f.tools, &slot).map_err(|e| e.to_string())?
        {
            b = b.capability(cap).map_err(|e| e.to_string())?;
        }
    }
    let sup = b.build().map_err(|e| e.to_string())?;
    #[cfg(target_os = "linux")]
    let _ = slot.set(sup.downgrade());
    Ok(sup)
}

/// The language of a cell: `--lang`, else the file's extension, else Rhai
/// (stdin, the REPL).
pub fn pick_language(opts: &CellOpts, file: Option<&Path>) -> Result<Language, String> {
    if let Some(l) = &opts.lang {
        return l.parse().map_err(|e: crate::Error| e.to_string());
    }
    match file {
        Some(f) => Language::from_path(f).ok_or_else(|| {
            format!(
                "cannot tell the language of {} from its extension; pass --lang rhai|python|shell",
                f.display()
            )
        }),
        None => Ok(Language::Rhai),
    }
}

/// Await a cell; Ctrl-C (SIGINT) meanwhile cancels it, and the result then
/// (status `killed`) keeps what the cell printed. Without a SIGINT stream
/// (none could be made) the cell runs to its end.
pub async fn interruptible(
    run: impl std::future::Future<Output = CellResult>,
    cancel: &tokio_util::sync::CancellationToken,
    sigint: Option<&mut tokio::signal::unix::Signal>,
) -> CellResult {
    tokio::pin!(run);
    let Some(sigint) = sigint else {
        return run.await;
    };
    tokio::select! {
        r = &mut run => r,
        _ = sigint.recv() => {
            cancel.cancel();
            run.await
        }
    }
}

/// SIGINT as a stream: from here on Ctrl-C no longer ends this process.
pub fn sigint_stream() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok()
}

/// File name of the full command line, installed next to `cellbox`.
pub const ENGINE: &str = "cellbox-engine";
/// File name of the front binary.
pub const FRONT: &str = "cellbox";

/// Where the engine is: next to this binary (the real file, symlinks
/// followed: a symlink on PATH to a build directory works), else the first
/// `cellbox-engine` on PATH (a copy of the front binary alone on PATH).
pub fn find_engine() -> Result<PathBuf, String> {
    let me = std::env::current_exe()
        .map_err(|e| format!("cannot find this binary's directory to run {ENGINE}: {e}"))?;
    let beside = me.with_file_name(ENGINE);
    if beside.is_file() {
        return Ok(beside);
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(ENGINE))
            .find(|p| p.is_file())
    });
    on_path.ok_or_else(|| {
        format!(
            "cannot find {ENGINE}: it is not next to {} nor on PATH; it is built and \
             installed with cellbox (`cargo build --release`, `cargo install --locked --path .`) \
             and belongs next to it",
            me.display()
        )
    })
}

/// Replace this process with `cellbox-engine` ([`find_engine`]), same
/// arguments, environment and file descriptors. Returns only on failure.
pub fn hand_to_engine() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let engine = match find_engine() {
        Ok(p) => p,
        Err(e) => {
            crate::report!("cellbox: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| FRONT.into());
    let err = std::process::Command::new(&engine)
        .arg0(arg0)
        .args(args)
        .exec();
    crate::report!(
        "cellbox: cannot run {} ({err}); it is built and installed with cellbox (`cargo build --release`)",
        engine.display()
    );
    ExitCode::from(EXIT_INTERNAL)
}

/// The front binary next to the running one (the one users run as
/// `cellbox`), or the running one if there is none.
pub fn front_binary() -> std::io::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let front = me.with_file_name(FRONT);
    Ok(if front.is_file() { front } else { me })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_exec_form_is_read_as_the_parser_reads_it() {
        let cases: &[&[&str]] = &[
            &["--", "/bin/true"],
            &["--json", "--", "/bin/sh", "-c", "echo hi"],
            &["--", "ls", "--json", "--", "-l"],
            &["--", "--json"],
        ];
        for case in cases {
            let rest: Vec<std::ffi::OsString> = case.iter().map(Into::into).collect();
            let fast = plain_exec(&rest).unwrap_or_else(|| panic!("{case:?}: not read"));
            let full = ["cellbox", "exec"].iter().chain(case.iter());
            let ExecOnly {
                command: ExecCommand::Exec(parsed),
            } = ExecOnly::try_parse_from(full).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            assert_eq!(format!("{fast:?}"), format!("{parsed:?}"), "{case:?}");
        }
        // Left to the parser: options, a missing program or `--`.
        let others: &[&[&str]] = &[
            &["--"],
            &["--json", "--"],
            &["/bin/true"],
            &["--profile", "shell", "--", "/bin/true"],
            &["--json", "--timeout", "1", "--", "/bin/true"],
            &[],
        ];
        for case in others {
            let rest: Vec<std::ffi::OsString> = case.iter().map(Into::into).collect();
            assert!(plain_exec(&rest).is_none(), "{case:?}");
        }
    }
}
