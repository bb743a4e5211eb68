//! The cellbox command line. Parsing and printing only; the work is in the
//! library.

#[cfg(not(target_os = "linux"))]
use cellbox::cli::exec_exit;
#[cfg(target_os = "linux")]
use cellbox::cli::{cmd_exec, early_exec};
use cellbox::cli::{
    events_sink, print_json, session_config, usage, CellOpts, ExecArgs, EXIT_INTERNAL,
};
use cellbox::{
    CellRequest, CellResult, Forward, Language, Session, SessionConfig, Status, Supervisor,
};
use clap::{Parser, Subcommand};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
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
    Run {
        #[command(flatten)]
        opts: CellOpts,
        /// Print the whole result as one JSON object.
        #[arg(long)]
        json: bool,
        /// Run the cell on the warm path (fork server / pre-started
        /// interpreter) that long-lived surfaces use, instead of spawning a
        /// fresh worker.
        #[arg(long)]
        warm: bool,
        /// The script file, or `-` for stdin.
        file: String,
    },
    /// An interactive session (type :help).
    Repl {
        #[command(flatten)]
        opts: CellOpts,
    },
    /// Run any program under the sandbox (default profile: shell).
    Exec(ExecArgs),
    /// Serve `execute_code` and session tools over MCP (stdio, or --http).
    Serve(Box<cellbox::serve::ServeArgs>),
    /// Which sandbox layers this host supports and what a cell would get
    /// under each profile. Exits 6 when a profile's required layer is missing.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Assess this profile (built-in name or TOML file) instead of the
        /// shipped ones (repeatable).
        #[arg(long)]
        profile: Vec<String>,
        /// Python interpreter to check (default: the one cells would use).
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// Measure cell latency and throughput against a baseline.
    Bench {
        /// Cells per measurement.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Languages to measure.
        #[arg(long = "lang", default_values_t = vec!["rhai".to_string()])]
        langs: Vec<String>,
    },
    /// Drive `cellbox serve` through an MCP client with benign and hostile
    /// cells, checking every result and the server's use of the host.
    Soak {
        /// Cells in all.
        #[arg(long, default_value_t = 1000)]
        cells: usize,
        /// Client tasks sending cells at once over the one connection.
        #[arg(long, default_value_t = 3)]
        concurrency: usize,
        /// Percentage of hostile cells.
        #[arg(long = "hostile-percent", default_value_t = 10)]
        hostile_percent: u32,
        /// Session cells each session runs before it is closed.
        #[arg(long = "session-cells", default_value_t = 40)]
        session_cells: usize,
        /// Seed of the cell mix.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Descriptors the server may hold above idle at the end.
        #[arg(long = "fd-slack", default_value_t = 8)]
        fd_slack: u64,
        /// Megabytes of RSS the server may hold above idle at the end.
        #[arg(long = "rss-slack-mb", default_value_t = 10)]
        rss_slack_mb: u64,
        /// Seconds the server gets to settle back after the sessions close.
        #[arg(long = "settle", default_value_t = 20)]
        settle: u64,
        /// Write the server's stderr to this file.
        #[arg(long = "serve-log", value_name = "FILE")]
        serve_log: Option<PathBuf>,
        /// An extra argument for `serve` (repeatable).
        #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
        serve_args: Vec<String>,
    },
    /// Run the escape-attempt suite against this binary.
    SecurityTest(cellbox::security::SecurityTestArgs),
}

fn main() -> ExitCode {
    // A worker must branch off before any thread or runtime exists.
    cellbox::worker::dispatch();
    #[cfg(target_os = "linux")]
    if let Some(code) = early_exec() {
        return code;
    }
    let cli = Cli::parse();
    // Diagnostics only when asked for (building a filter costs start-up
    // time), except for `serve`: long-lived, its stderr is its log.
    let filter = match tracing_subscriber::EnvFilter::try_from_env("CELLBOX_LOG") {
        Ok(filter) => Some(filter),
        Err(_) if matches!(cli.command, Command::Serve(_)) => Some(
            tracing_subscriber::EnvFilter::new(cellbox::serve::DEFAULT_LOG),
        ),
        Err(_) => None,
    };
    if let Some(filter) = filter {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    }
    // One program in one cell: this process, still single-threaded, runs it
    // itself (no runtime, no worker process).
    #[cfg(target_os = "linux")]
    let command = match cli.command {
        Command::Exec(ExecArgs { opts, json, argv }) => return cmd_exec(opts, json, argv),
        Command::Run {
            opts,
            json,
            warm,
            file,
        } => match one_shot_shell(&opts, json, &file) {
            Some(code) => return code,
            None => Command::Run {
                opts,
                json,
                warm,
                file,
            },
        },
        other => other,
    };
    #[cfg(not(target_os = "linux"))]
    let command = cli.command;
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellbox: failed to start the runtime: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    rt.block_on(async move {
        match command {
            Command::Run {
                opts,
                json,
                warm,
                file,
            } => cmd_run(opts, json, warm, &file).await,
            Command::Repl { opts } => cmd_repl(opts).await,
            #[cfg(not(target_os = "linux"))]
            Command::Exec(ExecArgs { opts, json, argv }) => cmd_exec(opts, json, argv).await,
            #[cfg(target_os = "linux")]
            Command::Exec(_) => ExitCode::from(EXIT_INTERNAL),
            Command::Bench { iterations, langs } => cmd_bench(iterations, langs).await,
            Command::Serve(args) => cellbox::serve::run(*args).await,
            Command::Soak {
                cells,
                concurrency,
                hostile_percent,
                session_cells,
                seed,
                fd_slack,
                rss_slack_mb,
                settle,
                serve_log,
                serve_args,
            } => {
                let binary = match cellbox::cli::front_binary() {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("cellbox soak: cannot find this binary: {e}");
                        return ExitCode::from(EXIT_INTERNAL);
                    }
                };
                let opts = cellbox::soak::SoakOptions {
                    cells,
                    concurrency,
                    hostile_percent: hostile_percent.min(100),
                    session_cells: session_cells.max(1),
                    seed,
                    binary,
                    serve_args,
                    serve_log,
                    fd_slack,
                    rss_slack: rss_slack_mb * 1_000_000,
                    settle: std::time::Duration::from_secs(settle),
                };
                match cellbox::soak::run(opts).await {
                    Ok((report, true)) => {
                        print!("{report}");
                        ExitCode::SUCCESS
                    }
                    Ok((report, false)) => {
                        print!("{report}");
                        ExitCode::FAILURE
                    }
                    Err(e) => {
                        eprintln!("cellbox soak: {e}");
                        ExitCode::from(EXIT_INTERNAL)
                    }
                }
            }
            Command::SecurityTest(args) => {
                tokio::task::block_in_place(|| cellbox::security::cli_main(args))
            }
            Command::Doctor {
                json,
                profile,
                python,
            } => cmd_doctor(json, profile, python).await,
        }
    })
}

/// A supervisor for the cells of one command: they run one at a time, so
/// together (with a warm worker's own share) they are held to one cell's
/// memory limit.
fn build_supervisor(
    opts: &CellOpts,
    warm: bool,
    config: &SessionConfig,
) -> Result<Supervisor, String> {
    let mut b = Supervisor::builder()
        .warm(warm)
        .cells_memory_bytes(config.limits.memory_bytes.saturating_add(64 << 20));
    if let Some(p) = &opts.python {
        b = b.python(p);
    }
    if opts.events.is_some() {
        b = b.events(events_sink(opts)?);
    }
    b.build().map_err(|e| e.to_string())
}

fn pick_language(opts: &CellOpts, file: Option<&Path>) -> Result<Language, String> {
    if let Some(l) = &opts.lang {
        return l.parse().map_err(|e: cellbox::Error| e.to_string());
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

/// Print a result for a person: output, the value (Python's repr for a
/// Python cell), the answer, the error. `in_session`: the cell ran in a
/// session that goes on (the REPL), so values it could not keep are worth
/// a warning; a one-shot run keeps nothing anyway. `streamed`: the cell ran
/// with [`Forward::Head`], so the head of its output is on the terminal
/// already and only the rest (omitted count, tail) is printed.
fn print_result(r: &CellResult, in_session: bool, streamed: bool) {
    let mut out = std::io::stdout().lock();
    let stdout = if streamed {
        unshown(&r.stdout, r.truncated.stdout.as_ref())
    } else {
        &r.stdout
    };
    let _ = out.write_all(stdout.as_bytes());
    if !r.stdout.is_empty() && !r.stdout.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    print_value_and_answer(&mut out, r);
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let stderr = if streamed {
        unshown(&r.stderr, r.truncated.stderr.as_ref())
    } else {
        &r.stderr
    };
    let _ = err.write_all(stderr.as_bytes());
    print_notes(&mut err, r, in_session);
}

/// What of a captured stream was not shown as it came: nothing when all of
/// it was kept; else the omission mark and the tail after the head.
fn unshown<'a>(text: &'a str, truncated: Option<&cellbox::Truncation>) -> &'a str {
    let Some(t) = truncated else { return "" };
    let omitted = t.total_bytes - t.kept_head - t.kept_tail;
    let mark = format!("\n[... {omitted} bytes omitted ...]\n");
    let head = usize::try_from(t.kept_head).unwrap_or(usize::MAX);
    match text.get(head..) {
        Some(rest) if rest.starts_with(&mark) => rest,
        // The head was not valid UTF-8 (its text is longer than its bytes).
        _ => text.find(&mark).map_or("", |i| &text[i..]),
    }
}

/// Await a cell; Ctrl-C (SIGINT) meanwhile cancels it, and the result then
/// (status `killed`) keeps what the cell printed. Without a SIGINT stream
/// (none could be made) the cell runs to its end.
async fn interruptible(
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
fn sigint_stream() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok()
}

/// The value (Python's repr when the cell gave one) and the answer.
fn print_value_and_answer(out: &mut impl Write, r: &CellResult) {
    match &r.value_repr {
        Some(repr) => {
            let _ = writeln!(out, "{repr}");
        }
        None if !r.value.is_null() => {
            let _ = writeln!(out, "{}", r.value);
        }
        None => {}
    }
    if let Some(a) = &r.final_answer {
        let _ = writeln!(out, "answer: {a}");
    }
}

/// Truncation notes, the error and, in a session, dropped variables.
fn print_notes(err: &mut impl Write, r: &CellResult, in_session: bool) {
    if let Some(t) = &r.truncated.stdout {
        let _ = writeln!(
            err,
            "cellbox: stdout truncated: {} bytes in total, kept the first {} and the last {}",
            t.total_bytes, t.kept_head, t.kept_tail
        );
    }
    if let Some(t) = &r.truncated.stderr {
        let _ = writeln!(
            err,
            "cellbox: stderr truncated: {} bytes in total, kept the first {} and the last {}",
            t.total_bytes, t.kept_head, t.kept_tail
        );
    }
    if let Some(e) = &r.error {
        if let Some(tb) = &e.traceback {
            let _ = writeln!(err, "{}", tb.trim_end());
        }
        let pos = match (e.line, e.column) {
            (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
            (Some(l), None) => format!(" (line {l})"),
            _ => String::new(),
        };
        let _ = writeln!(err, "{}: {}{} [{}]", e.kind, e.message, pos, r.status);
    }
    if in_session {
        for d in &r.vars.dropped {
            let _ = writeln!(
                err,
                "cellbox: variable {} ({}) was not kept: {}",
                d.name, d.type_name, d.reason
            );
        }
    }
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

async fn cmd_run(opts: CellOpts, json: bool, warm: bool, file: &str) -> ExitCode {
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
    let result = interruptible(sup.run(request, config), &cancel, sigint.as_mut()).await;
    if json {
        if let Err(code) = print_json(&result) {
            return code;
        }
    } else {
        print_result(&result, false, true);
    }
    ExitCode::from(result.status.exit_code())
}

#[cfg(not(target_os = "linux"))]
async fn cmd_exec(opts: CellOpts, json: bool, argv: Vec<String>) -> ExitCode {
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

/// `cellbox run` of a shell cell, run from this process like `exec`.
/// `None` when the cell is not a shell cell (or its language is unclear:
/// the library path reports that).
#[cfg(target_os = "linux")]
fn one_shot_shell(opts: &CellOpts, json: bool, file: &str) -> Option<ExitCode> {
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
    let cell = cellbox::oneshot::OneShot::shell(&code)
        .forwarding(forward)
        .interruptible();
    let result = cellbox::oneshot::run(cell, config, &events);
    if json {
        if let Err(code) = print_json(&result) {
            return Some(code);
        }
    } else {
        print_result(&result, false, true);
    }
    Some(ExitCode::from(result.status.exit_code()))
}

const REPL_HELP: &str = "\
Type code to run it as a cell in the current language; multi-line input
continues while brackets are open, after a line ending in ':' (Python) or '\\',
until a blank line.
Commands:
  :help                     this text
  :quit                     leave (also Ctrl-D)
  :set NAME VALUE           set a variable (VALUE is JSON, else a string)
  :get NAME                 print a variable
  :show vars|status|history show the namespace, the session, past cells
  :call CAP {json}          call a capability with JSON arguments
  :lang rhai|python|shell   switch the language of the next cells
  :reset                    forget every variable and definition";

fn open_brackets(s: &str) -> i64 {
    let mut depth = 0i64;
    let mut in_str: Option<char> = None;
    let mut escaped = false;
    for c in s.chars() {
        if let Some(q) = in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                in_str = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => in_str = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    depth
}

fn needs_more(buf: &str, language: Language) -> bool {
    let last = buf.lines().last().unwrap_or("");
    if last.ends_with('\\') || open_brackets(buf) > 0 {
        return true;
    }
    if language == Language::Python {
        let block = buf.lines().any(|l| l.trim_end().ends_with(':'));
        // A Python block ends with a blank line.
        return block && !buf.ends_with("\n\n");
    }
    false
}

async fn repl_command(
    line: &str,
    session: &mut Session,
    language: &mut Language,
    last: &Option<Status>,
) -> bool {
    let mut parts = line.trim().splitn(3, char::is_whitespace);
    let cmd = parts.next().unwrap_or("");
    let a1 = parts.next().unwrap_or("").trim();
    let a2 = parts.next().unwrap_or("").trim();
    match cmd {
        ":quit" | ":q" | ":exit" => return false,
        ":help" | ":h" => println!("{REPL_HELP}"),
        ":set" if !a1.is_empty() && !a2.is_empty() => {
            let value = serde_json::from_str(a2)
                .unwrap_or_else(|_| serde_json::Value::String(a2.to_owned()));
            if let Err(e) = session.set_var(a1, value).await {
                eprintln!("{e}");
            }
        }
        ":get" if !a1.is_empty() => match session.get_var(a1).await {
            Some(v) => println!("{v}"),
            None => eprintln!("no variable {a1:?}"),
        },
        ":show" => match a1 {
            "vars" => {
                for (k, v) in session.vars().await {
                    println!("{k} = {v}");
                }
                for (lang, names) in session.definitions().await {
                    println!("{} ({lang} definition)", names.join(", "));
                }
            }
            "status" => {
                let c = session.config();
                println!("session {}", session.id());
                println!("language {language}");
                println!("cells run {}", session.execution_count().await);
                println!(
                    "last status {}",
                    last.map(|s| s.as_str()).unwrap_or("(none)")
                );
                let allow: Vec<&str> = c.policy.allow.iter().map(String::as_str).collect();
                println!(
                    "allowed capabilities {}",
                    if allow.is_empty() {
                        "(none)".to_owned()
                    } else {
                        allow.join(", ")
                    }
                );
                println!(
                    "limits timeout {} ms, output {} bytes, memory {} bytes",
                    c.limits.timeout_ms, c.limits.max_output_bytes, c.limits.memory_bytes
                );
                match session.scratch_dir() {
                    Ok(dir) => println!("scratch {}", dir.display()),
                    Err(e) => println!("scratch: {e}"),
                }
            }
            "history" => {
                for h in session.history().await {
                    let first = h.code.lines().next().unwrap_or("");
                    println!(
                        "[{}] {} {} {}",
                        h.execution_count, h.language, h.status, first
                    );
                }
            }
            _ => eprintln!("usage: :show vars|status|history"),
        },
        ":call" if !a1.is_empty() => {
            let args = if a2.is_empty() { "{}" } else { a2 };
            match serde_json::from_str::<serde_json::Value>(args) {
                Ok(serde_json::Value::Object(m)) => {
                    let r = session.call(a1, m).await;
                    print_result(&r, true, false);
                }
                _ => eprintln!("usage: :call CAP {{\"arg\": value, ...}}"),
            }
        }
        ":lang" => match a1.parse() {
            Ok(l) => *language = l,
            Err(e) => eprintln!("{e}"),
        },
        ":reset" => {
            session.reset().await;
            println!("namespace cleared");
        }
        _ => eprintln!("unknown or incomplete command {line:?}; type :help"),
    }
    true
}

async fn cmd_repl(opts: CellOpts) -> ExitCode {
    let mut language = match pick_language(&opts, None) {
        Ok(l) => l,
        Err(e) => return usage(e),
    };
    let config = match session_config(&opts) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let sup = match build_supervisor(&opts, true, &config) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let mut session = match sup.session(config) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        println!("cellbox repl ({language}); :help for commands, :quit to leave");
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(16);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.blocking_send(line.clone()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut buf = String::new();
    let mut last: Option<Status> = None;
    // Ctrl-C interrupts the running cell, or drops the input typed so far;
    // it does not end the REPL (Ctrl-D or :quit does).
    let mut sigint = sigint_stream();
    loop {
        if interactive {
            print!(
                "{}",
                if buf.is_empty() {
                    format!("{language}> ")
                } else {
                    "... ".into()
                }
            );
            let _ = std::io::stdout().flush();
        }
        let line = match sigint.as_mut() {
            Some(sigint) => tokio::select! {
                line = rx.recv() => line,
                _ = sigint.recv() => {
                    // The terminal dropped the line being typed; drop the
                    // lines before it that wait for more too.
                    buf.clear();
                    if interactive {
                        println!();
                    }
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(line) = line else { break };
        if buf.is_empty() && line.trim_start().starts_with(':') {
            if !repl_command(&line, &mut session, &mut language, &last).await {
                break;
            }
            continue;
        }
        if buf.is_empty() && line.trim().is_empty() {
            continue;
        }
        buf.push_str(&line);
        if needs_more(&buf, language) {
            continue;
        }
        let code = std::mem::take(&mut buf);
        let code = code.trim_end().replace("\\\n", "\n");
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut request = CellRequest::new(language, code);
        request.forward = Forward::Head;
        request.cancel = Some(cancel.clone());
        let r = interruptible(session.run(request), &cancel, sigint.as_mut()).await;
        last = Some(r.status);
        print_result(&r, true, true);
    }
    if !buf.trim().is_empty() {
        let mut request = CellRequest::new(language, buf);
        request.forward = Forward::Head;
        let r = session.run(request).await;
        print_result(&r, true, true);
    }
    ExitCode::SUCCESS
}

async fn cmd_bench(iterations: usize, langs: Vec<String>) -> ExitCode {
    match cellbox::bench::run(iterations, &langs).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cellbox bench: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

/// `cellbox doctor`: host support, per-profile layer table, Python.
/// Start the warm workers once (a Rhai and a Python cell on the warm path)
/// and report the pools: what a long-lived surface would get here.
async fn warm_workers(python: Option<&PathBuf>) -> serde_json::Value {
    let mut b = Supervisor::builder().warm(true);
    if let Some(p) = python {
        b = b.python(p);
    }
    let sup = match b.build() {
        Ok(s) => s,
        Err(e) => return serde_json::json!({"error": e.to_string()}),
    };
    let mut cells = serde_json::Map::new();
    for (lang, code) in [(Language::Rhai, "1"), (Language::Python, "1")] {
        let r = sup
            .run(CellRequest::new(lang, code), SessionConfig::default())
            .await;
        let outcome = match &r.error {
            None => r.status.as_str().to_owned(),
            Some(e) => format!("{}: {}", r.status, e.message),
        };
        cells.insert(lang.as_str().to_owned(), serde_json::json!(outcome));
    }
    serde_json::json!({"cells": cells, "pools": sup.pool_status().await})
}

async fn cmd_doctor(json: bool, profiles: Vec<String>, python: Option<PathBuf>) -> ExitCode {
    use cellbox::profiles::{Profile, BUILTIN_NAMES};
    use cellbox::sandbox::doctor;
    let names: Vec<String> = if profiles.is_empty() {
        BUILTIN_NAMES.iter().map(|n| n.to_string()).collect()
    } else {
        profiles
    };
    let mut loaded = Vec::new();
    for name in &names {
        match Profile::load(name) {
            Ok(p) => loaded.push(p),
            Err(e) => return usage(e),
        }
    }
    let host = doctor::probe();
    let assessments: Vec<doctor::ProfileAssessment> =
        loaded.iter().map(|p| doctor::assess(p, &host)).collect();
    let python_path = python.clone();
    let mut b = Supervisor::builder();
    if let Some(p) = &python {
        b = b.python(p);
    }
    let python = b
        .build()
        .map_err(|e| e.to_string())
        .and_then(|sup| sup.python());
    let ok = assessments.iter().all(|a| a.ok);
    let warm = warm_workers(python_path.as_ref()).await;
    if json {
        let report = serde_json::json!({
            "warm_workers": warm,
            "host": host,
            "python": match &python {
                Ok(info) => serde_json::json!(info),
                Err(e) => serde_json::json!({"error": e}),
            },
            "profiles": assessments,
            "ok": ok,
        });
        println!("{report:#}");
    } else {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        println!(
            "cellbox doctor: {} {} kernel {}, running as {}",
            host.os,
            host.arch,
            host.kernel,
            if host.running_as_root {
                "root"
            } else {
                "an unprivileged user"
            }
        );
        println!("host support:");
        let landlock = match host.landlock_abi {
            Some(abi) => format!(
                "yes (ABI {abi}; cellbox uses up to {})",
                host.landlock_pinned_abi
            ),
            None => "NO".into(),
        };
        println!("  {:<16} {landlock}", "landlock");
        println!("  {:<16} {}", "seccomp", yes(host.seccomp));
        println!("  {:<16} {}", "user namespaces", yes(host.user_namespaces));
        println!("  {:<16} {}", "namespaces", yes(host.namespaces));
        println!("  {:<16} {}", "mount_setattr", yes(host.mount_setattr));
        // The hierarchy cells' memory cgroups are made in (a host may
        // mount cgroup2 and still keep memory on v1).
        let memory = &host.memory_cgroup;
        let memory_line = match (&memory.kind, &memory.dir) {
            (Some(kind), Some(dir)) => format!("{kind} ({})", dir.display()),
            _ => format!(
                "NO: {}",
                memory.problem.as_deref().unwrap_or("no memory controller")
            ),
        };
        println!("  {:<16} {memory_line}", "memory cgroup");
        println!(
            "  {:<16} {}",
            "cgroup2 mounted",
            if host.cgroup_v2 { "yes" } else { "no" }
        );
        match &python {
            Ok(info) => println!(
                "  {:<16} {} (read-only: {})",
                "python",
                info.executable.display(),
                info.read_only
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => println!("  {:<16} NO: {e}", "python"),
        }
        for a in &assessments {
            println!();
            println!(
                "profile {} ({}): {}",
                a.profile,
                a.source,
                if a.ok {
                    "ok".to_string()
                } else {
                    format!(
                        "REFUSED, missing required: {}",
                        a.missing_required.join(", ")
                    )
                }
            );
            println!(
                "  {:<11} {:<12} {:<10} detail",
                "layer", "mode", "available"
            );
            for l in &a.layers {
                println!(
                    "  {:<11} {:<12} {:<10} {}",
                    l.layer,
                    l.mode.as_str(),
                    yes(l.available),
                    l.detail
                );
            }
        }
    }
    if !json {
        println!("warm workers (fork server, Python zygotes):");
        let cells = &warm["cells"];
        println!(
            "  {:<16} rhai cell {}, python cell {}",
            "trial cells",
            cells["rhai"].as_str().unwrap_or("-"),
            cells["python"].as_str().unwrap_or("-")
        );
        let pools = &warm["pools"];
        println!(
            "  {:<16} {}",
            "rhai",
            if pools["rhai_fork_server"] == serde_json::json!(true) {
                format!(
                    "fork server running (pool layers applied once), {} sandboxed spare(s) waiting",
                    pools["rhai_spares"]
                )
            } else {
                "NO fork server (cells spawn a fresh worker)".to_owned()
            }
        );
        let zygotes = pools["python"].as_array().map_or(0, |z| {
            z.iter()
                .filter(|z| z["alive"] == serde_json::json!(true))
                .count()
        });
        println!("  {:<16} {zygotes} live zygote(s)", "python");
        println!(
            "  {:<16} {}",
            "scratch",
            match pools["scratch_quota_bytes"].as_u64() {
                Some(q) => format!(
                    "{} MiB in all, shared by every cell (tmpfs), each file up to the profile's limit",
                    q >> 20
                ),
                None => "NOT bounded in total (mounting the scratch tmpfs needs root); \
                         each file up to the profile's limit"
                    .to_owned(),
            }
        );
        let session = &pools["session_scratch_quota"];
        println!(
            "  {:<16} {}",
            "session scratch",
            match (session["bytes"].as_u64(), session["inodes"].as_u64()) {
                (Some(b), Some(i)) => format!(
                    "{} MiB and {i} inodes per session, its sub-cells included (a tmpfs of \
                     its own, outside the total above)",
                    b >> 20
                ),
                _ => "NOT bounded per session (mounting a tmpfs per session needs root); \
                      sessions share the scratch above"
                    .to_owned(),
            }
        );
        println!(
            "  {:<16} {}",
            "memory",
            match (
                pools["cells_memory_bytes"].as_u64(),
                pools["cells_memory_cgroup"].as_str()
            ) {
                (Some(m), Some(cg)) => format!(
                    "{} MiB for all cells together ({cg}), each process up to the profile's limit",
                    m >> 20
                ),
                _ => "NOT bounded in total (making a memory cgroup needs root and a memory \
                      controller); each process up to the profile's limit"
                    .to_owned(),
            }
        );
        println!(
            "  {:<16} {}",
            "sessions",
            if pools["session_cgroups"] == serde_json::json!(true) {
                "a cgroup each (memory: its cells' limit plus its scratch; processes: twice a \
                 cell's), and one per cell (its processes; the cell ends with its whole process \
                 tree; its CPU time counted for the tree)"
            } else {
                "NOT apart: sessions share the cells' cgroup (per-session cgroups need root and \
                 cgroup v1 memory, pids and cpuacct hierarchies); a cell's processes in other \
                 sessions or groups of its own may outlive it"
            }
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(cellbox::exit::Exit::Sandbox)
    }
}
