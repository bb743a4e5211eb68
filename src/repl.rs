//! `cellbox repl`: an interactive session. Each input is one cell in the
//! current language, run in one [`Session`] that keeps its namespace;
//! `:`-commands (after the `.ragsh` verbs: help, quit, set, get, show
//! vars|status|history, call, lang, reset) look at and change the session.
//! Input continues over several lines while brackets are open, after a
//! Python block header or a trailing `\`; Ctrl-C interrupts the running cell
//! or drops the input typed so far.

use crate::cli::{
    build_supervisor, interruptible, pick_language, session_config, sigint_stream, usage, CellOpts,
};
use crate::render::print_result;
use crate::{CellRequest, Forward, Language, Session, SessionConfig, Status};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

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
                crate::report!("{e}");
            }
        }
        ":get" if !a1.is_empty() => match session.get_var(a1).await {
            Some(v) => println!("{}", crate::terminal::escape_json(&v.to_string())),
            None => crate::report!("no variable {a1:?}"),
        },
        ":show" => match a1 {
            "vars" => {
                for (k, v) in session.vars().await {
                    println!(
                        "{} = {}",
                        crate::terminal::escape(&k),
                        crate::terminal::escape_json(&v.to_string())
                    );
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
                    c.limits.timeout_ms, c.limits.max_output_bytes, c.limits.rlimits.memory_bytes
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
            _ => crate::report!("usage: :show vars|status|history"),
        },
        ":call" if !a1.is_empty() => {
            let args = if a2.is_empty() { "{}" } else { a2 };
            match serde_json::from_str::<serde_json::Value>(args) {
                Ok(serde_json::Value::Object(m)) => {
                    let r = session.call(a1, m).await;
                    print_result(&r, true, false);
                }
                _ => crate::report!("usage: :call CAP {{\"arg\": value, ...}}"),
            }
        }
        ":lang" => match a1.parse() {
            Ok(l) => *language = l,
            Err(e) => crate::report!("{e}"),
        },
        ":reset" => {
            session.reset().await;
            println!("namespace cleared");
        }
        _ => crate::report!("unknown or incomplete command {line:?}; type :help"),
    }
    true
}

/// Run the REPL until Ctrl-D or `:quit`.
pub async fn cli_main(opts: CellOpts) -> ExitCode {
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
    // Each next cell's worker is started while the user types.
    let mut session = match sup.session(SessionConfig {
        prepare_next: true,
        ..config
    }) {
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
