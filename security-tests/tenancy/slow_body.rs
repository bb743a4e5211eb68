//! A slow body: an authenticated POST that announces a body and never
//! finishes sending it, holding its connection (and a task) for ever.
//!
//! Control: `--body-timeout` far beyond the wait: the connection is still
//! open after it. Defence: a 2 s body timeout: the server answers 408 and
//! closes the connection.

use super::harness::{Env, Serve};
use super::Outcome;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Send half a body; return whether the server closed the connection within
/// `wait`, and what it sent.
fn attack(serve: &Serve, wait: Duration) -> Result<(bool, String), String> {
    let mut s = TcpStream::connect(serve.addr).map_err(|e| format!("connect: {e}"))?;
    let token = serve.token("x")?;
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 1000\r\n\r\n{{\"jsonrpc\":\"2.0\",",
        serve.addr
    )
    .map_err(|e| format!("write: {e}"))?;
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while t0.elapsed() < wait {
        match s.read(&mut buf) {
            Ok(0) => return Ok((true, String::from_utf8_lossy(&got).into_owned())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Ok((true, String::from_utf8_lossy(&got).into_owned())),
        }
    }
    Ok((false, String::from_utf8_lossy(&got).into_owned()))
}

pub fn run(env: &Env) -> Result<Outcome, String> {
    let wait = Duration::from_secs(8);
    let control = {
        let serve = Serve::start(
            env,
            &["x"],
            &["--language", "rhai", "--body-timeout", "3600"],
        )?;
        let (closed, got) = attack(&serve, wait)?;
        if closed {
            return Err(format!(
                "with a body timeout of an hour the connection was closed anyway ({got:?}); the \
                 attack is broken"
            ));
        }
        format!("with --body-timeout 3600 the half-sent body held its connection for {wait:?}")
    };
    let serve = Serve::start(env, &["x"], &["--language", "rhai", "--body-timeout", "2"])?;
    let (closed, got) = attack(&serve, wait)?;
    let status = got.lines().next().unwrap_or("").to_owned();
    Ok(Outcome {
        control,
        blocked: closed && status.contains(" 408 "),
        evidence: format!(
            "with --body-timeout 2: closed within {wait:?}: {closed}; answer {status:?}"
        ),
    })
}
