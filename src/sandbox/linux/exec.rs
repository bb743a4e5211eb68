//! The exec gate: with `seccomp.exec = "once"` the filter allows `execve`
//! only when its pathname argument is the address of a private buffer
//! allocated here before the filter was built. [`exec`] copies the program
//! path into that buffer and execs; code that runs later in the new image
//! does not know the address, so it cannot exec again (Landlock's execute
//! rule applies on top).

use crate::sandbox::{Layer, SandboxError};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

/// Longest program path the gate holds (PATH_MAX).
const GATE_BYTES: usize = 4096;

/// Address of the leaked gate buffer.
static GATE: OnceLock<usize> = OnceLock::new();

/// The gate's address, allocating the buffer on first use.
pub fn gate_address() -> u64 {
    let addr = *GATE.get_or_init(|| {
        let buf: &'static mut [u8; GATE_BYTES] = Box::leak(Box::new([0u8; GATE_BYTES]));
        buf.as_mut_ptr() as usize
    });
    addr as u64
}

fn err(message: String) -> SandboxError {
    SandboxError::new(Layer::Exec, message)
}

/// Exec `argv[0]` (absolute path) with `argv`, the current environment plus
/// `extra_env`. Returns only on failure.
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os() {
        if extra_env
            .iter()
            .any(|(ek, _)| ek.as_bytes() == k.as_bytes())
        {
            continue;
        }
        env.push(env_entry(k.as_bytes(), v.as_bytes()));
    }
    for (k, v) in extra_env {
        env.push(env_entry(k.as_bytes(), v.as_bytes()));
    }
    exec_with(argv, env)
}

/// Exec `argv[0]` (absolute path) with `argv` and exactly the environment
/// `env`, leaving this process's own environment alone. Returns only on
/// failure.
pub fn exec_in(argv: &[String], env: &[(&str, OsString)]) -> SandboxError {
    let env = env
        .iter()
        .map(|(k, v)| env_entry(k.as_bytes(), v.as_bytes()))
        .collect();
    exec_with(argv, env)
}

fn env_entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut kv = Vec::with_capacity(key.len() + value.len() + 1);
    kv.extend_from_slice(key);
    kv.push(b'=');
    kv.extend_from_slice(value);
    kv
}

fn exec_with(argv: &[String], env: Vec<Vec<u8>>) -> SandboxError {
    let Some(program) = argv.first() else {
        return err("empty argv".into());
    };
    if !program.starts_with('/') {
        return err(format!("program path {program:?} is not absolute"));
    }
    let to_c = |s: Vec<u8>| CString::new(s).map_err(|_| err("argument contains NUL".into()));
    let mut args = Vec::with_capacity(argv.len());
    for a in argv {
        match to_c(a.as_bytes().to_vec()) {
            Ok(c) => args.push(c),
            Err(e) => return e,
        }
    }
    let mut envp = Vec::with_capacity(env.len());
    for kv in env {
        match to_c(kv) {
            Ok(c) => envp.push(c),
            Err(e) => return e,
        }
    }
    let env = envp;
    let path = program.as_bytes();
    let source = match GATE.get() {
        Some(&addr) => {
            if path.len() >= GATE_BYTES {
                return err(format!("program path {program:?} is too long"));
            }
            let gate = addr as *mut u8;
            // SAFETY: the gate is a leaked, never-freed buffer of GATE_BYTES
            // bytes; nothing else holds a reference to it, the worker is
            // single-threaded, and the copy plus NUL fits (checked above).
            unsafe {
                std::ptr::copy_nonoverlapping(path.as_ptr(), gate, path.len());
                *gate.add(path.len()) = 0;
                super::sys::execve_raw(gate as *const libc::c_char, &args, &env)
            }
        }
        None => match to_c(path.to_vec()) {
            // SAFETY: the CString lives until execve returns.
            Ok(c) => unsafe { super::sys::execve_raw(c.as_ptr(), &args, &env) },
            Err(e) => return e,
        },
    };
    err(format!("failed to execute {program}: {source}"))
}
