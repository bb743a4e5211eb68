//! Canaries: what the harness plants before a run and checks after it, so a
//! verdict never rests on what an attacking script says about itself.
//!
//! Suite-wide: a directory outside any scratch dir, a file held open on a
//! descriptor without close-on-exec (every process the harness starts
//! inherits it, the supervisor included), digests of host files and the
//! host's network identity. Per run: a secret file (0644), a world-writable
//! "outside" directory, loopback TCP and UDP listeners, a pathname unix socket
//! (0777, in a 0777 directory) and an abstract one, victims, and for control
//! runs a stand-in for the supervisor that carries the same `API_KEY`.

use super::attack::{Attack, Canary};
use super::cgroup::CgroupRoot;
use super::sha256;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::net::{Ipv6Addr, TcpListener, TcpStream, UdpSocket};
#[cfg(target_os = "linux")]
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
#[cfg(target_os = "linux")]
use std::os::unix::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The supervisor's peak RSS above which a resource attack counts as having
/// made it grow (it must cap what it buffers, not hold a 200 MB flood).
pub(crate) const SUPERVISOR_RSS_LIMIT_KB: u64 = 160 * 1024;
/// Largest `stdout` a capped result may carry.
pub(crate) const CAPPED_STDOUT_BYTES: usize = 8 * 1024 * 1024;

/// World-writable host directories a cell must not be able to write to.
const HOST_TMP_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/lock"];

/// Uid of the unprivileged victim (`nobody`).
const NOBODY: u32 = 65534;

/// Every port a canary listener (TCP or UDP) of this process has had, and
/// every port handed out as `{{BIND_PORT}}`. Runs go on in parallel and one
/// after another; a run never gets a port an earlier run had, so anything
/// an earlier run left behind (a control cell's straggling connection, a
/// bind probe) cannot reach a later run's canary, and a bind probe never
/// connects to a canary.
static OWN_PORTS: Mutex<OwnPorts> = Mutex::new(OwnPorts {
    canary: BTreeSet::new(),
    bind: BTreeSet::new(),
});

struct OwnPorts {
    canary: BTreeSet<u16>,
    bind: BTreeSet<u16>,
}

/// What a port is claimed for.
#[derive(Clone, Copy)]
enum PortUse {
    Canary,
    Bind,
}

/// Record `port` as `into`'s unless a run of this process already had it
/// (for either use); checked and recorded under one lock.
fn claim(port: u16, into: PortUse) -> bool {
    let mut own = crate::util::lock(&OWN_PORTS);
    if own.canary.contains(&port) || own.bind.contains(&port) {
        return false;
    }
    match into {
        PortUse::Canary => own.canary.insert(port),
        PortUse::Bind => own.bind.insert(port),
    }
}

/// Bind with `bind` until the port is one no run of this process has had
/// (the ports met on the way stay bound until then, so the kernel does not
/// offer them again), and record it in `into`.
fn fresh_port<T>(
    what: &str,
    into: PortUse,
    bind: impl Fn() -> std::io::Result<T>,
    port_of: impl Fn(&T) -> std::io::Result<u16>,
) -> Result<(T, u16), String> {
    let mut met = Vec::new();
    for _ in 0..64 {
        let sock = bind().map_err(|e| format!("failed to bind {what}: {e}"))?;
        let port = port_of(&sock).map_err(|e| format!("failed to read {what}'s port: {e}"))?;
        if claim(port, into) {
            return Ok((sock, port));
        }
        met.push(sock);
    }
    Err(format!(
        "failed to bind {what}: 64 ports in a row were ones earlier runs had"
    ))
}

/// The connections the harness's own bind probes made, each as its local
/// port and the port it reached, and when. A canary listener that one of
/// them reached saw the harness, not a cell. Kept for `PROBE_MEMORY`, far
/// longer than any run. Both ports are kept: a cell's connection to a
/// canary may come from a local port that a probe to another port had
/// (the kernel hands ephemeral ports out again), and still counts.
static PROBE_PORTS: Mutex<Vec<(u16, u16, Instant)>> = Mutex::new(Vec::new());
const PROBE_MEMORY: Duration = Duration::from_secs(600);

fn remember_probe(from: u16, to: u16) {
    let mut v = crate::util::lock(&PROBE_PORTS);
    v.retain(|(_, _, at)| at.elapsed() < PROBE_MEMORY);
    v.push((from, to, Instant::now()));
}

/// Whether a connection from local port `from` to port `to` was one of
/// the harness's bind probes.
fn was_probe(from: u16, to: u16) -> bool {
    crate::util::lock(&PROBE_PORTS)
        .iter()
        .any(|(f, t, at)| (*f, *t) == (from, to) && at.elapsed() < PROBE_MEMORY)
}

/// The host's ephemeral port range (`ip_local_port_range`): what `bind` to
/// port 0 and `connect` pick from.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            match (it.next(), it.next()) {
                (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
                _ => None,
            }
        })
        .unwrap_or((32768, 60999))
}

/// A free port for a cell to try to listen on, outside the ephemeral range
/// when there is room: the harness connects to it while the cell runs, and
/// a port from that range could meanwhile be given to another run's canary
/// listener (they bind port 0) or to any host process, which would then be
/// taken for the cell's. Falls back to a port the kernel picks.
fn probe_port() -> Result<u16, String> {
    let (lo, hi) = ephemeral_range();
    let below = (10_000u32, u32::from(lo));
    let above = (u32::from(hi) + 1, 65_536u32);
    let (start, end) = if below.1.saturating_sub(below.0) >= above.1.saturating_sub(above.0) {
        below
    } else {
        above
    };
    if end > start && end - start >= 256 {
        for _ in 0..64 {
            let r = u32::from_str_radix(&random_hex(4), 16).unwrap_or(0);
            let Ok(port) = u16::try_from(start + r % (end - start)) else {
                continue;
            };
            if TcpListener::bind(("0.0.0.0", port)).is_ok() && claim(port, PortUse::Bind) {
                return Ok(port);
            }
        }
    }
    fresh_port(
        "a port for the cell",
        PortUse::Bind,
        || TcpListener::bind("127.0.0.1:0"),
        |l| l.local_addr().map(|a| a.port()),
    )
    .map(|(_, port)| port)
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let filled = File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok();
    if !filled {
        // Never expected on Linux; fall back to time and a counter so tokens
        // still differ between runs.
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mix = t
            ^ (u128::from(N.fetch_add(1, Ordering::Relaxed)) << 64)
            ^ u128::from(std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (mix >> ((i % 16) * 8)) as u8;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

fn chmod(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("failed to chmod {}: {e}", path.display()))
}

fn mkdir(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::create_dir(path).map_err(|e| format!("failed to create {}: {e}", path.display()))?;
    chmod(path, mode)
}

/// A string from the host that must never appear in a cell's output.
#[derive(Debug, Clone)]
struct HostId {
    what: String,
    needle: String,
    /// Whole-line match only (short hostnames like `vm`).
    line_only: bool,
}

/// State shared by every run of the suite.
pub(crate) struct SuiteCanaries {
    pub(crate) base: PathBuf,
    pub(crate) cellbox: PathBuf,
    _inherited: File,
    pub(crate) inherited_token: String,
    host_digests: Vec<(String, String)>,
    host_ids: Vec<HostId>,
    pub(crate) cgroups: Option<CgroupRoot>,
    pub(crate) notes: Vec<String>,
    pub(crate) is_root: bool,
    counter: AtomicU64,
}

impl SuiteCanaries {
    pub(crate) fn new(cellbox: &Path) -> Result<SuiteCanaries, String> {
        let tag = format!("{}-{}", std::process::id(), random_hex(4));
        let parent = if Path::new("/var/tmp").is_dir() {
            PathBuf::from("/var/tmp")
        } else {
            std::env::temp_dir()
        };
        let base = parent.join(format!("cbx-security-{tag}"));
        mkdir(&base, 0o755)?;
        let mut notes = Vec::new();
        let inherited_token = format!("cbx-inherited-{}", random_hex(12));
        let inherited_path = base.join("inherited-fd.txt");
        std::fs::write(&inherited_path, format!("{inherited_token}\n"))
            .map_err(|e| format!("failed to write {}: {e}", inherited_path.display()))?;
        chmod(&inherited_path, 0o600)?;
        let inherited = File::open(&inherited_path)
            .map_err(|e| format!("failed to open {}: {e}", inherited_path.display()))?;
        // Deliberately inheritable: the supervisor gets it, a worker must not.
        nix::fcntl::fcntl(
            &inherited,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| format!("failed to clear FD_CLOEXEC on the inherited canary: {e}"))?;
        let is_root = nix::unistd::geteuid().is_root();
        if !is_root {
            notes.push(
                "not running as root: no unprivileged victim, and host-file digests may be missing"
                    .into(),
            );
        }
        let cgroups = match CgroupRoot::create(&tag) {
            Ok(root) => {
                notes.push(format!(
                    "survivor check: per-run cgroups under {} plus a marker scan of /proc",
                    root.path().display()
                ));
                Some(root)
            }
            Err(e) => {
                notes.push(format!(
                    "survivor check: marker scan of /proc only (no per-run cgroup: {e})"
                ));
                None
            }
        };
        Ok(SuiteCanaries {
            base,
            cellbox: cellbox.to_path_buf(),
            _inherited: inherited,
            inherited_token,
            host_digests: host_digests(),
            host_ids: host_ids(),
            cgroups,
            notes,
            is_root,
            counter: AtomicU64::new(0),
        })
    }

    pub(crate) fn next_index(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for SuiteCanaries {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn host_digests() -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(b) = std::fs::read("/etc/shadow") {
        out.push(("/etc/shadow".into(), sha256::hex_digest(&b)));
    }
    if let Ok(rd) = std::fs::read_dir("/root") {
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        out.push((
            "the /root listing".into(),
            sha256::hex_digest(names.join("\n").as_bytes()),
        ));
    }
    if let Ok(b) = std::fs::read("/proc/1/environ") {
        out.push(("/proc/1/environ".into(), sha256::hex_digest(&b)));
    }
    out
}

fn host_ids() -> Vec<HostId> {
    let mut ids = Vec::new();
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim().to_owned();
        if !h.is_empty() && h != "localhost" {
            ids.push(HostId {
                what: "the host's hostname".into(),
                line_only: h.len() < 6,
                needle: h,
            });
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "lo" {
                continue;
            }
            if let Ok(mac) = std::fs::read_to_string(e.path().join("address")) {
                let mac = mac.trim().to_owned();
                if !mac.is_empty() && mac.chars().any(|c| c != '0' && c != ':') {
                    ids.push(HostId {
                        what: format!("the MAC address of {name}"),
                        needle: mac,
                        line_only: false,
                    });
                }
            }
            ids.push(HostId {
                what: "a host interface name".into(),
                needle: name,
                line_only: false,
            });
        }
    }
    // Local IPv4 addresses: in fib_trie each "/32 host LOCAL" line follows
    // the "|-- a.b.c.d" line of its address.
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        let mut last = "";
        let mut seen = BTreeSet::new();
        for line in trie.lines() {
            let t = line.trim_start_matches([' ', '|', '+', '-', '`']);
            if line.contains("|--") {
                last = t.trim();
            } else if line.contains("/32 host LOCAL") && !last.starts_with("127.") {
                seen.insert(last.to_owned());
            }
        }
        for a in seen {
            ids.push(HostId {
                what: "a host IPv4 address".into(),
                needle: a,
                line_only: false,
            });
        }
    }
    if let Ok(v6) = std::fs::read_to_string("/proc/net/if_inet6") {
        for line in v6.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            let Ok(n) = u128::from_str_radix(hex, 16) else {
                continue;
            };
            let addr = Ipv6Addr::from(n);
            if addr.is_loopback() {
                continue;
            }
            ids.push(HostId {
                what: "a host IPv6 address".into(),
                needle: addr.to_string(),
                line_only: false,
            });
        }
    }
    ids
}

/// `needle` occurs in `hay` with no alphanumeric (or address) character
/// directly around it.
fn contains_token(hay: &str, needle: &str) -> bool {
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '_';
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let start = from + i;
        let end = start + needle.len();
        let before = hay[..start].chars().next_back();
        let after = hay[end..].chars().next();
        // A trailing ':' is allowed after names (`eth0:` in /proc/net/dev).
        let after_ok = match after {
            None => true,
            Some(':') => !needle.contains(':') && !needle.contains('.'),
            Some(c) => !is_part(c),
        };
        if before.is_none_or(|c| !is_part(c)) && after_ok {
            return true;
        }
        from = start + 1;
        while !hay.is_char_boundary(from) {
            from += 1;
        }
    }
    false
}

/// Whether this run is the unsandboxed positive control or the real one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Control,
    Sandboxed,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Control => "control",
            Mode::Sandboxed => "sandboxed",
        }
    }
}

#[derive(Debug, Default)]
struct Hits {
    /// The peer's port and what was seen.
    tcp: Vec<(u16, String)>,
    udp: Vec<String>,
    unix: Vec<String>,
    abstract_: Vec<String>,
    bind: Vec<String>,
}

struct Listeners {
    tcp: TcpListener,
    udp: UdpSocket,
    unix: UnixListener,
    abstract_: UnixListener,
    bind_port: Option<u16>,
}

fn show_bytes(b: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(&b[..b.len().min(48)])
        .chars()
        .map(|c| if c.is_control() { '.' } else { c })
        .collect();
    if s.is_empty() {
        String::new()
    } else {
        format!(" ({s:?})")
    }
}

fn read_some(mut s: impl Read) -> Vec<u8> {
    let mut buf = [0u8; 256];
    // Give the client a moment to send its marker.
    for _ in 0..5 {
        match s.read(&mut buf) {
            Ok(n) => return buf[..n].to_vec(),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(_) => break,
        }
    }
    Vec::new()
}

/// Who made a loopback connection, for the evidence: the client end's row
/// in the harness's own `/proc/net/tcp(6)` (which exists only if the client
/// is in the host's network namespace), its uid, and the process holding it,
/// if it still does. Best effort; `None` when the row is gone.
fn tcp_client_owner(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<String> {
    fn hex_addr(a: std::net::SocketAddr) -> String {
        match a.ip() {
            std::net::IpAddr::V4(ip) => {
                format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
            }
            std::net::IpAddr::V6(ip) => {
                let words: String = ip
                    .octets()
                    .chunks(4)
                    .map(|c| format!("{:08X}", u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect();
                format!("{words}:{:04X}", a.port())
            }
        }
    }
    let table = if peer.is_ipv4() { "tcp" } else { "tcp6" };
    let text = std::fs::read_to_string(format!("/proc/net/{table}")).ok()?;
    let (from, to) = (hex_addr(peer), hex_addr(local));
    let row = text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 9 && f[1] == from && f[2] == to).then(|| (f[7].to_owned(), f[9].to_owned()))
    })?;
    let (uid, inode) = row;
    let link = format!("socket:[{inode}]");
    let holder = (inode != "0")
        .then(|| {
            std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
                let pid = p.file_name().to_string_lossy().parse::<u32>().ok()?;
                let fds = std::fs::read_dir(p.path().join("fd")).ok()?;
                let held = fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .map(|t| t.as_os_str() == link.as_str())
                        .unwrap_or(false)
                });
                held.then(|| {
                    let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                    let me = if pid == std::process::id() {
                        ", the harness"
                    } else {
                        ""
                    };
                    format!("pid {pid} {:?}{me}", comm.trim())
                })
            })
        })
        .flatten()
        .unwrap_or_else(|| "no process holds it now".into());
    Some(format!(" [uid {uid}, {holder}]"))
}

impl Listeners {
    fn poll(&self, hits: &Mutex<Hits>, probe_bind: bool) {
        let mut h = crate::util::lock(hits);
        while let Ok((s, peer)) = self.tcp.accept() {
            let _ = s.set_nonblocking(true);
            let data = read_some(&s);
            let who = self
                .tcp
                .local_addr()
                .ok()
                .and_then(|l| tcp_client_owner(peer, l))
                .unwrap_or_default();
            h.tcp.push((
                peer.port(),
                format!("TCP connection from {peer}{who}{}", show_bytes(&data)),
            ));
        }
        let mut buf = [0u8; 2048];
        while let Ok((n, peer)) = self.udp.recv_from(&mut buf) {
            h.udp.push(format!(
                "UDP datagram of {n} bytes from {peer}{}",
                show_bytes(&buf[..n])
            ));
        }
        while let Ok((s, _)) = self.unix.accept() {
            let _ = s.set_nonblocking(true);
            let data = read_some(&s);
            h.unix
                .push(format!("unix socket connection{}", show_bytes(&data)));
        }
        while let Ok((s, _)) = self.abstract_.accept() {
            let _ = s.set_nonblocking(true);
            let data = read_some(&s);
            h.abstract_
                .push(format!("abstract socket connection{}", show_bytes(&data)));
        }
        if let (Some(port), true) = (self.bind_port, probe_bind) {
            // A port one of this process's own canaries has had is not
            // the cell's (`probe_port` never hands one out; this holds if
            // one is taken for it all the same).
            if !crate::util::lock(&OWN_PORTS).canary.contains(&port) {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
                    if let Ok(local) = s.local_addr() {
                        remember_probe(local.port(), port);
                    }
                    h.bind.push(format!(
                        "the harness connected to the cell's listener on 127.0.0.1:{port}"
                    ));
                }
            }
        }
    }
}

struct Victim {
    what: &'static str,
    child: Child,
    stopped: bool,
}

fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let i = stat.rfind(')')?;
    stat[i + 1..].trim_start().chars().next()
}

fn spawn_sleep(
    uid: Option<u32>,
    arg0: Option<&str>,
    env: &[(&str, &str)],
) -> Result<Child, String> {
    let mut cmd = Command::new("sleep");
    cmd.arg("300")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(a) = arg0 {
        cmd.arg0(a);
    }
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    cmd.spawn()
        .map_err(|e| format!("failed to start a victim `sleep`: {e}"))
}

/// Everything planted for one run.
pub(crate) struct RunCanaries {
    pub(crate) dir: PathBuf,
    pub(crate) scratch: PathBuf,
    pub(crate) secret_path: PathBuf,
    pub(crate) secret_token: String,
    secret_content: String,
    pub(crate) outside_dir: PathBuf,
    pub(crate) unix_path: PathBuf,
    pub(crate) abstract_name: String,
    pub(crate) marker: String,
    pub(crate) forge_token: String,
    pub(crate) api_key: String,
    /// Appears in the supervisor's command line (its argv[0]).
    pub(crate) cmdline_token: String,
    /// The path the supervisor is started through (a symlink to cellbox whose
    /// name carries `cmdline_token`).
    pub(crate) supervisor_exe: PathBuf,
    tcp_port: u16,
    udp_port: u16,
    bind_port: Option<u16>,
    victims: Vec<Victim>,
    standin: Option<Child>,
    hits: Arc<Mutex<Hits>>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
    /// Set once the cell runs: the harness then tries to connect to
    /// `{{BIND_PORT}}`.
    probe_bind: Arc<AtomicBool>,
}

impl RunCanaries {
    pub(crate) fn plant(
        suite: &SuiteCanaries,
        attack: &Attack,
        mode: Mode,
    ) -> Result<RunCanaries, String> {
        let dir = suite.base.join(format!(
            "{:03}-{}-{}",
            suite.next_index(),
            attack.name,
            mode.as_str()
        ));
        mkdir(&dir, 0o755)?;
        let scratch = dir.join("scratch");
        mkdir(&scratch, 0o755)?;
        let secret_token = format!("cbx-secret-{}", random_hex(12));
        let secret_content = format!("cellbox security canary: {secret_token}\n");
        let secret_path = dir.join("secret.txt");
        std::fs::write(&secret_path, &secret_content)
            .map_err(|e| format!("failed to write {}: {e}", secret_path.display()))?;
        chmod(&secret_path, 0o644)?;
        let outside_dir = dir.join("outside");
        mkdir(&outside_dir, 0o777)?;
        let sock_dir = dir.join("sock");
        mkdir(&sock_dir, 0o777)?;
        let unix_path = sock_dir.join("listener.sock");
        let unix = UnixListener::bind(&unix_path)
            .map_err(|e| format!("failed to listen on {}: {e}", unix_path.display()))?;
        chmod(&unix_path, 0o777)?;
        let abstract_name = format!("cbx-security-{}", random_hex(8));
        let abstract_ = listen_abstract(&abstract_name, &sock_dir)
            .map_err(|e| format!("failed to listen on abstract socket {abstract_name}: {e}"))?;
        let (tcp, tcp_port) = fresh_port(
            "the 127.0.0.1 TCP canary",
            PortUse::Canary,
            || TcpListener::bind("127.0.0.1:0"),
            |l| l.local_addr().map(|a| a.port()),
        )?;
        let (udp, udp_port) = fresh_port(
            "the 127.0.0.1 UDP canary",
            PortUse::Canary,
            || UdpSocket::bind("127.0.0.1:0"),
            |u| u.local_addr().map(|a| a.port()),
        )?;
        for r in [
            tcp.set_nonblocking(true),
            udp.set_nonblocking(true),
            unix.set_nonblocking(true),
            abstract_.set_nonblocking(true),
        ] {
            r.map_err(|e| format!("failed to make a canary listener non-blocking: {e}"))?;
        }
        let bind_port = if attack.uses("BIND_PORT") || attack.wants(Canary::Bind) {
            Some(probe_port()?)
        } else {
            None
        };
        let cmdline_token = format!("cbx-cmdline-{}", random_hex(8));
        let supervisor_exe = dir.join(format!("cellbox-sup-{cmdline_token}"));
        std::os::unix::fs::symlink(&suite.cellbox, &supervisor_exe)
            .map_err(|e| format!("failed to link {}: {e}", supervisor_exe.display()))?;
        let api_key = format!("cbx-apikey-{}", random_hex(12));

        let mut victims = Vec::new();
        if attack.wants(Canary::Victim) || attack.uses("VICTIM_PID") {
            victims.push(Victim {
                what: "the running victim (root)",
                child: spawn_sleep(None, None, &[])?,
                stopped: false,
            });
            victims.push(Victim {
                what: "the stopped victim (root)",
                child: spawn_sleep(None, None, &[])?,
                stopped: true,
            });
            if suite.is_root {
                victims.push(Victim {
                    what: "the stopped victim (nobody)",
                    child: spawn_sleep(Some(NOBODY), None, &[])?,
                    stopped: true,
                });
            }
        }
        let standin = if mode == Mode::Control {
            let argv0 = supervisor_exe.to_string_lossy().into_owned();
            Some(spawn_sleep(
                None,
                Some(&argv0),
                &[("API_KEY", api_key.as_str())],
            )?)
        } else {
            None
        };
        let mut rc = RunCanaries {
            dir,
            scratch,
            secret_path,
            secret_token,
            secret_content,
            outside_dir,
            unix_path,
            abstract_name,
            marker: format!("cbx{}", random_hex(6)),
            forge_token: format!("FORGED-{}", random_hex(8)),
            api_key,
            cmdline_token,
            supervisor_exe,
            tcp_port,
            udp_port,
            bind_port,
            victims,
            standin,
            hits: Arc::new(Mutex::new(Hits::default())),
            stop: Arc::new(AtomicBool::new(false)),
            watcher: None,
            probe_bind: Arc::new(AtomicBool::new(false)),
        };
        rc.stop_victims()?;
        let listeners = Listeners {
            tcp,
            udp,
            unix,
            abstract_,
            bind_port,
        };
        let (hits, stop, probe) = (rc.hits.clone(), rc.stop.clone(), rc.probe_bind.clone());
        rc.watcher = Some(std::thread::spawn(move || {
            let mut last_probe = Instant::now();
            loop {
                let done = stop.load(Ordering::Acquire);
                let probe_now = probe.load(Ordering::Acquire)
                    && last_probe.elapsed() >= Duration::from_millis(150);
                if probe_now {
                    last_probe = Instant::now();
                }
                listeners.poll(&hits, probe_now);
                if done {
                    return;
                }
                std::thread::sleep(Duration::from_millis(15));
            }
        }));
        Ok(rc)
    }

    fn stop_victims(&mut self) -> Result<(), String> {
        for v in self.victims.iter().filter(|v| v.stopped) {
            let pid = nix::unistd::Pid::from_raw(v.child.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
                .map_err(|e| format!("failed to stop {}: {e}", v.what))?;
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for v in self.victims.iter().filter(|v| v.stopped) {
            while proc_state(v.child.id()) != Some('T') {
                if Instant::now() > deadline {
                    return Err(format!("{} did not stop", v.what));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    /// Start probing the cell's would-be listener (while the cell runs).
    pub(crate) fn start_probing(&self) {
        self.probe_bind.store(true, Ordering::Release);
    }

    pub(crate) fn victim_pid(&self) -> Option<u32> {
        self.victims.first().map(|v| v.child.id())
    }

    pub(crate) fn standin_pid(&self) -> Option<u32> {
        self.standin.as_ref().map(Child::id)
    }

    /// Fill in the placeholders. Any `{{NAME}}` left over is an error in the
    /// attack, not something to run.
    pub(crate) fn substitute(&self, source: &str, supervisor_pid: u32) -> Result<String, String> {
        let mut out = source.to_owned();
        let victim = self
            .victim_pid()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "0".into());
        let bind = self.bind_port.map(|p| p.to_string()).unwrap_or_default();
        let pairs: [(&str, String); 12] = [
            (
                "SECRET_PATH",
                self.secret_path.to_string_lossy().into_owned(),
            ),
            ("SECRET_TOKEN", self.secret_token.clone()),
            ("TCP_PORT", self.tcp_port.to_string()),
            ("UDP_PORT", self.udp_port.to_string()),
            ("UNIX_PATH", self.unix_path.to_string_lossy().into_owned()),
            ("ABSTRACT_NAME", self.abstract_name.clone()),
            ("VICTIM_PID", victim),
            ("SUPERVISOR_PID", supervisor_pid.to_string()),
            (
                "OUTSIDE_DIR",
                self.outside_dir.to_string_lossy().into_owned(),
            ),
            ("MARKER", self.marker.clone()),
            ("FORGE_TOKEN", self.forge_token.clone()),
            ("BIND_PORT", bind),
        ];
        for (k, v) in pairs {
            out = out.replace(&format!("{{{{{k}}}}}"), &v);
        }
        if let Some(i) = out.find("{{") {
            if let Some(j) = out[i..].find("}}") {
                let name = &out[i + 2..i + j];
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    return Err(format!("unknown placeholder {{{{{name}}}}}"));
                }
            }
        }
        Ok(out)
    }

    /// Stop the listeners and collect the evidence of an escape.
    pub(crate) fn evidence(
        &mut self,
        suite: &SuiteCanaries,
        attack: &Attack,
        obs: &Observation,
    ) -> Vec<String> {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        let mut ev = Vec::new();
        let hits = std::mem::take(&mut *crate::util::lock(&self.hits));
        // The harness's own bind probes are not the cell. They never connect
        // to a canary's port (see `OWN_PORTS`); this holds even if one
        // did.
        let tcp: Vec<String> = hits
            .tcp
            .into_iter()
            .filter(|(peer, _)| !was_probe(*peer, self.tcp_port))
            .map(|(_, seen)| seen)
            .collect();
        // Listeners: a hit is an escape whether or not the attack declared it.
        for (list, what) in [
            (&tcp, "TCP listener"),
            (&hits.udp, "UDP listener"),
            (&hits.unix, "unix socket listener"),
            (&hits.abstract_, "abstract socket listener"),
            (&hits.bind, "bind probe"),
        ] {
            if let Some(first) = list.first() {
                ev.push(format!("{what}: {first} (x{})", list.len()));
            }
        }
        // Leaks, searched in everything the cell could produce.
        let leaks = [
            (self.secret_token.as_str(), "the planted secret"),
            (self.api_key.as_str(), "the supervisor's API_KEY"),
            (self.cmdline_token.as_str(), "the supervisor's command line"),
            (
                suite.inherited_token.as_str(),
                "the supervisor's inherited fd",
            ),
        ];
        for (token, what) in leaks {
            for (label, text) in &obs.texts {
                if text.contains(token) {
                    ev.push(format!("{what} appeared in {label}"));
                    break;
                }
            }
        }
        match std::fs::read_to_string(&self.secret_path) {
            Ok(s) if s == self.secret_content => {}
            Ok(_) => ev.push("the planted secret file was modified".into()),
            Err(e) => ev.push(format!("the planted secret file is gone: {e}")),
        }
        if let Ok(rd) = std::fs::read_dir(&self.outside_dir) {
            let names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if !names.is_empty() {
                let mut names = names;
                names.sort();
                ev.push(format!(
                    "{} new entr{} outside scratch: {}",
                    names.len(),
                    if names.len() == 1 { "y" } else { "ies" },
                    names.iter().take(4).cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        // Files named with the run's marker in the host's shared temp dirs
        // (a cell's private /tmp would keep them out). Removed once seen:
        // the unique marker means they can only be this run's.
        for d in HOST_TMP_DIRS {
            let Ok(rd) = std::fs::read_dir(d) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&self.marker) {
                    ev.push(format!("the cell created {d}/{name} on the host"));
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for v in &mut self.victims {
            match v.child.try_wait() {
                Ok(Some(st)) => ev.push(format!("{} died: {st}", v.what)),
                Ok(None) => {
                    let state = proc_state(v.child.id());
                    if v.stopped && state != Some('T') {
                        ev.push(format!(
                            "{} was continued (state {:?})",
                            v.what,
                            state.unwrap_or('?')
                        ));
                    } else if !v.stopped && state == Some('T') {
                        ev.push(format!("{} was stopped", v.what));
                    }
                }
                Err(e) => ev.push(format!("{} cannot be checked: {e}", v.what)),
            }
        }
        if attack.wants(Canary::HostFiles) {
            for (what, digest) in &suite.host_digests {
                if obs.texts.iter().any(|(_, t)| t.contains(digest.as_str())) {
                    ev.push(format!("a digest of {what} appeared in the output"));
                }
            }
        }
        if attack.wants(Canary::HostId) {
            for id in &suite.host_ids {
                let found = obs.texts.iter().any(|(_, t)| {
                    if id.line_only {
                        t.lines().any(|l| l.trim() == id.needle)
                    } else {
                        contains_token(t, &id.needle)
                    }
                });
                if found {
                    ev.push(format!(
                        "{} ({}) appeared in the output",
                        id.what, id.needle
                    ));
                }
            }
        }
        if let Some(fields) = &obs.forged_fields {
            if fields.contains(&self.forge_token) {
                ev.push("forged protocol content reached the result fields".into());
            }
        }
        if attack.wants(Canary::OutputCap) {
            if let Some(len) = obs.stdout_len {
                if len > CAPPED_STDOUT_BYTES {
                    ev.push(format!(
                        "the result kept {len} bytes of stdout (not capped)"
                    ));
                }
            }
            // The flood finished (its last line made it) yet the result
            // neither holds it nor says it was cut: output silently lost.
            if obs.script_finished
                && obs.stdout_truncated == Some(false)
                && obs.stdout_len.unwrap_or(0) < 1 << 20
            {
                ev.push("200 MB of output but the result says nothing was truncated".into());
            }
        }
        if attack.wants(Canary::SupervisorRss) {
            if let Some(kb) = obs.peak_rss_kb {
                if kb > SUPERVISOR_RSS_LIMIT_KB {
                    ev.push(format!("the supervisor grew to {} MiB resident", kb / 1024));
                }
            }
        }
        ev
    }
}

impl Drop for RunCanaries {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        for v in &mut self.victims {
            let _ = v.child.kill();
            let _ = v.child.wait();
        }
        if let Some(s) = &mut self.standin {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a run produced, as the canary checks need it.
#[derive(Debug, Default)]
pub(crate) struct Observation {
    /// Labelled texts to search for leaked tokens (stdout, stderr, the whole
    /// result JSON...).
    pub(crate) texts: Vec<(&'static str, String)>,
    /// Result fields other than stdout/stderr/error, serialized (sandboxed
    /// runs only).
    pub(crate) forged_fields: Option<String>,
    pub(crate) stdout_len: Option<usize>,
    pub(crate) stdout_truncated: Option<bool>,
    pub(crate) peak_rss_kb: Option<u64>,
    /// The script got as far as printing its ATTACK-RESULT line.
    pub(crate) script_finished: bool,
}

/// A listener on the abstract unix socket `name` (Linux). macOS has no
/// abstract namespace: there a socket file beside the path listener stands
/// in, so the canary holds the same set of listeners (a cell that names
/// the abstract address reaches nothing).
fn listen_abstract(name: &str, dir: &std::path::Path) -> std::io::Result<UnixListener> {
    #[cfg(target_os = "linux")]
    {
        let _ = dir;
        SocketAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixListener::bind_addr(&a))
    }
    #[cfg(not(target_os = "linux"))]
    {
        UnixListener::bind(dir.join(format!("{name}.sock")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listeners(dir: &Path, bind_port: Option<u16>) -> Listeners {
        let tag = random_hex(4);
        let l = Listeners {
            tcp: TcpListener::bind("127.0.0.1:0").expect("tcp"),
            udp: UdpSocket::bind("127.0.0.1:0").expect("udp"),
            unix: UnixListener::bind(dir.join(format!("{tag}.sock"))).expect("unix"),
            abstract_: listen_abstract(&format!("cbx-test-{tag}"), dir).expect("abstract"),
            bind_port,
        };
        l.tcp.set_nonblocking(true).expect("nonblocking");
        l.udp.set_nonblocking(true).expect("nonblocking");
        l.unix.set_nonblocking(true).expect("nonblocking");
        l.abstract_.set_nonblocking(true).expect("nonblocking");
        l
    }

    #[test]
    fn bind_probe_ports_lie_outside_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        assert!(lo > 10_256, "this test needs room below {lo}");
        for _ in 0..20 {
            let p = probe_port().expect("a free port");
            assert!(p < lo || p > hi, "{p} is in {lo}-{hi}");
            TcpListener::bind(("127.0.0.1", p)).expect("the port is free");
        }
    }

    /// No run gets a port an earlier run of the process had, as a canary
    /// or as its bind port, even when the kernel offers it again.
    #[test]
    fn no_port_is_handed_out_twice() {
        let mut seen = BTreeSet::new();
        for _ in 0..40 {
            // Dropped at once: the kernel is free to offer it again.
            let (_, p) = fresh_port(
                "a test listener",
                PortUse::Canary,
                || TcpListener::bind("127.0.0.1:0"),
                |l| l.local_addr().map(|a| a.port()),
            )
            .expect("a port");
            assert!(seen.insert(p), "{p} handed out twice");
            let b = probe_port().expect("a bind port");
            assert!(seen.insert(b), "{b} handed out twice");
        }
        // A port the kernel offers that an earlier run had is passed over.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let offered = l.local_addr().expect("addr").port();
        crate::util::lock(&OWN_PORTS).canary.insert(offered);
        drop(l);
        let (_, p) = fresh_port(
            "a test listener",
            PortUse::Canary,
            || {
                // The port `offered` for as long as it is free, as a
                // kernel offering it again would.
                TcpListener::bind(("127.0.0.1", offered))
                    .or_else(|_| TcpListener::bind("127.0.0.1:0"))
            },
            |l| l.local_addr().map(|a| a.port()),
        )
        .expect("a port");
        assert_ne!(p, offered);
    }

    /// Runs go on in parallel: one run's bind probe reaching another run's
    /// TCP canary is the harness, not a cell, on both sides.
    #[test]
    fn the_harness_own_probe_is_no_escape_on_either_side() {
        let dir = tempfile::tempdir().expect("tempdir");
        let canary = listeners(dir.path(), None);
        let port = canary.tcp.local_addr().expect("addr").port();
        let prober = listeners(dir.path(), Some(port));
        // Registered, the other run's listener is not probed at all.
        crate::util::lock(&OWN_PORTS).canary.insert(port);
        let hits = Mutex::new(Hits::default());
        prober.poll(&hits, true);
        crate::util::lock(&OWN_PORTS).canary.remove(&port);
        assert!(crate::util::lock(&hits).bind.is_empty());
        // Had it been (an ephemeral bind port that another canary was then
        // given), the canary still knows the connection for the harness's.
        prober.poll(&hits, true);
        assert_eq!(crate::util::lock(&hits).bind.len(), 1);
        let seen = Mutex::new(Hits::default());
        canary.poll(&seen, false);
        let tcp = &crate::util::lock(&seen).tcp;
        assert_eq!(tcp.len(), 1, "{tcp:?}");
        assert!(was_probe(tcp[0].0, port), "{tcp:?}");
        // A connection to another port from the probe's local port (given
        // out again by the kernel) is not the probe.
        assert!(!was_probe(tcp[0].0, port.wrapping_add(1)), "{tcp:?}");
        // Anyone else's connection still counts.
        let other = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let other_port = other.local_addr().expect("addr").port();
        let seen = Mutex::new(Hits::default());
        canary.poll(&seen, false);
        let tcp = &crate::util::lock(&seen).tcp;
        assert_eq!(
            tcp.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            [other_port]
        );
        assert!(!was_probe(other_port, port));
        // And says who made it: here, this very process.
        assert!(tcp[0].1.contains(", the harness]"), "{tcp:?}");
    }

    #[test]
    fn token_matching_respects_boundaries() {
        assert!(contains_token("  eth0: 123 0 0", "eth0"));
        assert!(contains_token("['eth0', 'lo']", "eth0"));
        assert!(!contains_token("veth01", "eth0"));
        assert!(contains_token("inet 192.0.2.2/24", "192.0.2.2"));
        assert!(!contains_token("192.0.2.23", "192.0.2.2"));
        assert!(!contains_token("10.192.0.2.2", "192.0.2.2"));
        assert!(contains_token("fd00::2 dev eth0", "fd00::2"));
        assert!(!contains_token("fd00::22", "fd00::2"));
    }
}
