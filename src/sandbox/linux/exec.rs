//! The exec gate: with `seccomp.exec = "once"` the filter allows `execve`
//! only when its pathname argument is the address of a private buffer
//! allocated here before the filter was built. [`exec`] copies the program
//! path into that buffer and execs; code that runs later in the new image
//! does not know the address, so it cannot exec again (Landlock's execute
//! rule applies on top).

use crate::sandbox::SandboxError;
use std::ffi::CString;
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
    SandboxError::new("exec", message)
}

/// Exec `argv[0]` (absolute path) with `argv`, the current environment plus
/// `extra_env`. Returns only on failure.
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    let Some(program) = argv.first() else {
        return err("empty argv".into());
    };
    if !program.starts_with('/') {
        return err(format!("program path {program:?} is not absolute"));
    }
    let to_c = |s: &[u8]| CString::new(s).map_err(|_| err("argument contains NUL".into()));
    let mut args = Vec::with_capacity(argv.len());
    for a in argv {
        match to_c(a.as_bytes()) {
            Ok(c) => args.push(c),
            Err(e) => return e,
        }
    }
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os() {
        if extra_env
            .iter()
            .any(|(ek, _)| ek.as_bytes() == k.as_bytes())
        {
            continue;
        }
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        match to_c(&kv) {
            Ok(c) => env.push(c),
            Err(e) => return e,
        }
    }
    for (k, v) in extra_env {
        match to_c(format!("{k}={v}").as_bytes()) {
            Ok(c) => env.push(c),
            Err(e) => return e,
        }
    }
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
        None => match to_c(path) {
            // SAFETY: the CString lives until execve returns.
            Ok(c) => unsafe { super::sys::execve_raw(c.as_ptr(), &args, &env) },
            Err(e) => return e,
        },
    };
    err(format!("failed to execute {program}: {source}"))
}
