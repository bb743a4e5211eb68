//! Starting the Python backend (and arbitrary programs for `exec`): the last
//! step of the worker is an `execve`.

use super::channel::Channel;
use std::ffi::CString;
use std::os::fd::AsFd;

/// The runtime shim, shipped inside the binary.
pub const SHIM: &str = include_str!("python/shim.py");

fn cstrings(args: &[&str]) -> Result<Vec<CString>, String> {
    args.iter()
        .map(|a| CString::new(*a).map_err(|_| format!("argument {a:?} contains a NUL byte")))
        .collect()
}

/// Replace this process with the interpreter running the shim. The protocol
/// channel stays open on fd 3 for the shim. Returns only on failure.
pub(crate) fn exec_shim(interpreter: &str) -> String {
    // -I: isolated (no env vars, no user site, no cwd on sys.path);
    // -S: no site module; -B: write no .pyc files.
    let args = match cstrings(&[interpreter, "-I", "-S", "-B", "-c", SHIM]) {
        Ok(a) => a,
        Err(e) => return e,
    };
    match nix::unistd::execv(&args[0], &args) {
        Ok(never) => match never {},
        Err(e) => e.to_string(),
    }
}

/// Replace this process with `argv` (the protocol channel is closed at exec:
/// a program run by `exec` speaks no protocol). Returns only on failure.
pub(crate) fn exec_program(chan: Channel, argv: &[String]) -> String {
    let stream = chan.into_stream();
    if let Err(e) = nix::fcntl::fcntl(
        stream.as_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    ) {
        return format!("failed to close the protocol channel: {e}");
    }
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let args = match cstrings(&refs) {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return "no program given".into(),
        Err(e) => return e,
    };
    // Keep the stream (and so fd 3) alive until exec closes it.
    let result = nix::unistd::execv(&args[0], &args);
    drop(stream);
    match result {
        Ok(never) => match never {},
        Err(e) => e.to_string(),
    }
}
