//! The cellbox command line (`cellbox-engine`): parsing and dispatch only.
//! Each command is one function in its own module of the library; what
//! must happen before the async runtime exists (a worker's hidden mode, a
//! one-shot cell run from this single-threaded process) happens first.

use cellbox::cli::{CellOpts, ExecArgs, EXIT_INTERNAL};
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cellbox",
    version,
    about = "Run untrusted code in a sandboxed cell",
    long_about = "Run untrusted Rhai, Python or shell code in a sandboxed worker process.\n\
                  Exit codes: 0 ok, 1 the script raised, 2 usage/config error, 3 timeout,\n\
                  4 limit exceeded or killed, 5 policy denied, 6 sandbox could not be applied,\n\
                  7 internal/protocol error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one cell from a file or stdin (`-`).
    Run(cellbox::run::RunArgs),
    /// An interactive session (type :help).
    Repl {
        #[command(flatten)]
        opts: CellOpts,
    },
    /// Run any program under the sandbox (default profile: shell).
    Exec(ExecArgs),
    /// Run the CodeAct loop: a model writes code, cells run it, until a
    /// cell calls answer(...) or a budget runs out (exit 4).
    Agent(Box<cellbox::agent::AgentArgs>),
    /// Serve `execute_code` and session tools over MCP (stdio, or --http).
    Serve(Box<cellbox::serve::ServeArgs>),
    /// Print the tools a configuration offers, as `serve` lists them, in
    /// the format of MCP's tools/list, OpenAI's or Anthropic's API.
    Tools(Box<cellbox::serve::tooldefs::ToolsArgs>),
    /// Which sandbox layers this host supports and what a cell would get
    /// under each profile. Exits 6 when a profile's required layer is missing.
    Doctor(cellbox::doctor::DoctorArgs),
    /// Measure cell latency and throughput against a baseline.
    Bench(cellbox::bench::BenchArgs),
    /// Drive `cellbox serve` through an MCP client with benign and hostile
    /// cells, checking every result and the server's use of the host.
    Soak(cellbox::soak::SoakArgs),
    /// Run the escape-attempt suite against this binary.
    SecurityTest(cellbox::security::SecurityTestArgs),
}

fn main() -> ExitCode {
    // A worker must branch off before any thread or runtime exists.
    cellbox::worker::dispatch();
    #[cfg(target_os = "linux")]
    if let Some(code) = cellbox::cli::early_exec() {
        return code;
    }
    let cli = Cli::parse();
    init_tracing(&cli.command);
    if let Some(code) = before_runtime(&cli.command) {
        return code;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            cellbox::report!("cellbox: failed to start the runtime: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    rt.block_on(async move {
        match cli.command {
            Command::Run(args) => cellbox::run::cli_main(args).await,
            Command::Repl { opts } => cellbox::repl::cli_main(opts).await,
            #[cfg(not(target_os = "linux"))]
            Command::Exec(ExecArgs { opts, json, argv }) => {
                cellbox::cli::cmd_exec(opts, json, argv).await
            }
            // Run by `before_runtime`.
            #[cfg(target_os = "linux")]
            Command::Exec(_) => ExitCode::from(EXIT_INTERNAL),
            Command::Serve(args) => cellbox::serve::run(*args).await,
            Command::Agent(args) => cellbox::agent::cli_main(*args).await,
            Command::Tools(args) => cellbox::serve::tooldefs::cli_main(*args).await,
            Command::Doctor(args) => cellbox::doctor::cli_main(args).await,
            Command::Bench(args) => cellbox::bench::cli_main(args).await,
            Command::Soak(args) => cellbox::soak::cli_main(args).await,
            Command::SecurityTest(args) => {
                tokio::task::block_in_place(|| cellbox::security::cli_main(args))
            }
        }
    })
}

/// Diagnostics only when asked for (building a filter costs start-up
/// time), except for `serve`: long-lived, its stderr is its log.
fn init_tracing(command: &Command) {
    let filter = match tracing_subscriber::EnvFilter::try_from_env("CELLBOX_LOG") {
        Ok(filter) => Some(filter),
        Err(_) if matches!(command, Command::Serve(_)) => Some(tracing_subscriber::EnvFilter::new(
            cellbox::serve::DEFAULT_LOG,
        )),
        Err(_) => None,
    };
    let Some(filter) = filter else { return };
    if log_format(command) == cellbox::serve::LogFormat::Json {
        // One JSON object a line, with the fields of the spans it is in
        // (a call's request id, principal and session); each redacted.
        let _ = tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_env_filter(filter)
            .with_writer(cellbox::terminal::JsonLogWriter)
            .try_init();
        return;
    }
    // Every line redacted and its control characters escaped (so no
    // colours either): what a log line quotes came from outside.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(cellbox::terminal::LogWriter)
        .with_ansi(false)
        .try_init();
}

/// `serve --log-format`, else `CELLBOX_LOG_FORMAT` (`text` or `json`).
fn log_format(command: &Command) -> cellbox::serve::LogFormat {
    use cellbox::serve::LogFormat;
    if let Command::Serve(args) = command {
        if let Some(f) = args.log_format {
            return f;
        }
    }
    let Some(asked) = std::env::var_os("CELLBOX_LOG_FORMAT") else {
        return LogFormat::Text;
    };
    match asked.to_str() {
        Some("json") => LogFormat::Json,
        Some("text") | Some("") => LogFormat::Text,
        _ => {
            cellbox::report!(
                "cellbox: CELLBOX_LOG_FORMAT={asked:?}: use text or json; logging text"
            );
            LogFormat::Text
        }
    }
}

/// One program in one cell (`exec`, or `run` of a shell cell): this
/// process, still single-threaded, runs it itself (no runtime, no worker
/// process). `None`: the command needs the runtime.
#[cfg(target_os = "linux")]
fn before_runtime(command: &Command) -> Option<ExitCode> {
    match command {
        Command::Exec(ExecArgs { opts, json, argv }) => {
            Some(cellbox::cli::cmd_exec(opts.clone(), *json, argv.clone()))
        }
        Command::Run(args) => {
            cellbox::run::one_shot_shell(args).or_else(|| cellbox::run::one_shot_rhai(args))
        }
        _ => None,
    }
}

#[cfg(not(target_os = "linux"))]
fn before_runtime(_: &Command) -> Option<ExitCode> {
    None
}
