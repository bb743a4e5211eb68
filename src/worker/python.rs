//! Starting the Python backend (and arbitrary programs for `exec`): the last
//! step of the worker is an `execve`.

use super::channel::Channel;
use std::os::fd::AsFd;

/// The runtime shim, shipped inside the binary.
pub const SHIM: &str = include_str!("python/shim.py");

/// Replace this process with the interpreter running the shim. The protocol
/// channel stays open on fd 3 for the shim. Returns only on failure.
pub(crate) fn exec_shim(interpreter: &str, precompiled: Option<&str>) -> String {
    // -I: isolated (no env vars, no user site, no cwd on sys.path);
    // -S: no site module; -B: write no .pyc files.
    let mut argv: Vec<String> = [interpreter, "-I", "-S", "-B", "-c"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    match precompiled {
        // Compiling the shim is most of its start-up: load it ready-made.
        Some(path) => argv.extend([LOADER.to_owned(), path.to_owned()]),
        None => argv.push(SHIM.to_owned()),
    }
    // Through the sandbox's exec gate: under `seccomp.exec = "once"` no
    // other execve is accepted.
    crate::sandbox::exec(&argv, &[]).to_string()
}

/// Runs the precompiled shim (see loader.py).
pub const LOADER: &str = include_str!("python/loader.py");

/// The zygote loop, run in the shim's globals (see zygote.py).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the Linux-only warm paths
pub const ZYGOTE: &str = include_str!("python/zygote.py");

/// Replace this process with the interpreter running the shim in zygote
/// mode (control channel on fd 3), from the precompiled shim when there is
/// one (see loader.py). Returns only on failure.
#[cfg(target_os = "linux")]
pub(crate) fn exec_zygote(interpreter: &str, config: &str, precompiled: Option<&str>) -> String {
    let mut argv: Vec<String> = [interpreter, "-I", "-S", "-B", "-c"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    match precompiled {
        // Compiling the shim and the zygote took most of a zygote's start.
        Some(path) => argv.extend([LOADER, path, "--zygote", config].map(str::to_owned)),
        None => argv.extend([SHIM, "--zygote", ZYGOTE, config].map(str::to_owned)),
    }
    crate::sandbox::exec(&argv, &[]).to_string()
}

/// Replace this process with `argv` (the protocol channel is closed at exec:
/// a program run by `exec` speaks no protocol). Returns only on failure.
pub(crate) fn exec_program(chan: Channel, argv: &[String], env: &[(String, String)]) -> String {
    let stream = chan.into_stream();
    if let Err(e) = nix::fcntl::fcntl(
        stream.as_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    ) {
        return format!("failed to close the protocol channel: {e}");
    }
    if argv.is_empty() {
        return "no program given".into();
    }
    // Keep the stream (and so fd 3) alive until exec closes it.
    let err = crate::sandbox::exec(argv, env);
    drop(stream);
    err.to_string()
}
