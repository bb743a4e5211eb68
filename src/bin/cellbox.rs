//! `cellbox`, the front binary: small, so that it starts fast. It runs
//! `cellbox exec` itself (the one-shot sandboxed program: no async runtime,
//! no interpreter) and hands every other command, unchanged, to
//! `cellbox-engine`, the full command line, installed next to it.

use std::process::ExitCode;

fn main() -> ExitCode {
    #[cfg(target_os = "linux")]
    if let Some(code) = cellbox::cli::early_exec() {
        return code;
    }
    // `run` of a Rhai or shell cell, run from this process. Only beside
    // its engine: a front binary alone runs `exec` and says what is
    // missing for anything else.
    #[cfg(target_os = "linux")]
    if cellbox::cli::find_engine().is_ok() {
        if let Some(code) = cellbox::run::early_run() {
            return code;
        }
    }
    cellbox::cli::hand_to_engine()
}
