//! A hostile HTTP endpoint that writes its answers byte for byte: any
//! status line and headers (a key reflected in a header, a redirect), a
//! body of any size written as slowly as it likes. Plain threads and
//! sockets, so nothing between it and the supervisor tidies what it sends.

use super::harness::Seen;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the endpoint writes back.
pub enum Reply {
    /// A status line and header lines (no `Content-Length`: it is added),
    /// then the body.
    Whole {
        status: &'static str,
        headers: Vec<String>,
        body: String,
    },
    /// A `200` whose chunked body is `piece` again and again, `total` bytes
    /// at most, `pause` between pieces, until the reader stops reading.
    Flood {
        piece: String,
        total: u64,
        pause: Duration,
    },
}

/// How a [`Wire`] answers a request.
pub type Answer = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A raw HTTP/1.1 endpoint on 127.0.0.1 (one thread per connection), that
/// keeps every request and counts the body bytes it wrote.
pub struct Wire {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    written: Arc<AtomicU64>,
}

fn read_request(stream: &mut BufReader<TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    stream.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        stream.read_line(&mut h).ok()?;
        let h = h.trim_end().to_owned();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
            headers.push(format!("{}: {}", n.to_ascii_lowercase(), v.trim()));
        }
    }
    let mut body = vec![0u8; length.min(16 << 20)];
    stream.read_exact(&mut body).ok()?;
    Some(Seen {
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn serve(stream: TcpStream, answer: Answer, seen: Arc<Mutex<Vec<Seen>>>, written: Arc<AtomicU64>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = BufReader::new(stream);
    while let Some(req) = read_request(&mut input) {
        let reply = answer(&req);
        if let Ok(mut s) = seen.lock() {
            s.push(req);
        }
        match reply {
            Reply::Whole {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status}\r\n");
                for h in headers {
                    head.push_str(&h);
                    head.push_str("\r\n");
                }
                head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
                if out.write_all(head.as_bytes()).is_err()
                    || out.write_all(body.as_bytes()).is_err()
                {
                    return;
                }
                written.fetch_add(body.len() as u64, Ordering::Relaxed);
            }
            Reply::Flood {
                piece,
                total,
                pause,
            } => {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                            Transfer-Encoding: chunked\r\n\r\n";
                if out.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut sent = 0u64;
                while sent < total {
                    let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
                    if out.write_all(chunk.as_bytes()).is_err() {
                        return;
                    }
                    sent += piece.len() as u64;
                    written.fetch_add(piece.len() as u64, Ordering::Relaxed);
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
                let _ = out.write_all(b"0\r\n\r\n");
            }
        }
    }
}

impl Wire {
    pub fn start(answer: Answer) -> Result<Wire, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind an endpoint: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("endpoint address: {e}"))?
            .port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicU64::new(0));
        let (s, w) = (seen.clone(), written.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (answer, s, w) = (answer.clone(), s.clone(), w.clone());
                std::thread::spawn(move || serve(stream, answer, s, w));
            }
        });
        Ok(Wire {
            url: format!("http://127.0.0.1:{port}"),
            seen,
            written,
        })
    }

    /// Every request it received.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Body bytes it wrote (to readers that took them or not).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// The bearer token a request carried.
pub fn bearer(seen: &Seen) -> String {
    seen.header("authorization")
        .unwrap_or_default()
        .trim_start_matches("Bearer ")
        .to_owned()
}

/// Peak resident memory of host process `pid` (`VmHWM`), in bytes.
pub fn peak_rss(pid: i32) -> Result<u64, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("failed to read /proc/{pid}/status: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("no VmHWM in /proc/{pid}/status"))
}
