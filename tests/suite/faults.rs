//! Faults: `kill -9` of a `cellbox serve` holding data (sessions with
//! files, warm pools, running cells), then of the pieces beneath a live one
//! (a cell, a zygote, the fork server). Judged from the host: mounts,
//! directories, cgroups and processes.

use super::common::serve::{json_lines, send_line, PATIENCE};
use super::common::{bin, eventually, procs};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `cellbox serve` over stdio, spoken to line by line (JSON-RPC).
struct Serve {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<Value>,
    next: u64,
}

impl Serve {
    fn start() -> Serve {
        Serve::start_with_env(&[])
    }

    fn start_with_env(env: &[(&str, &str)]) -> Serve {
        let (child, stdin, lines) = json_lines(
            std::process::Command::new(bin())
                .arg("serve")
                .envs(env.iter().copied())
                .stderr(std::process::Stdio::null()),
        );
        let mut s = Serve {
            child,
            stdin: Some(stdin),
            lines,
            next: 1,
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "faults", "version": "0"}}),
        );
        assert!(init.get("result").is_some(), "{init}");
        s.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, v: Value) {
        send_line(self.stdin.as_mut().unwrap(), &v);
    }

    /// Send a request; its id.
    fn post(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn wait(&mut self, id: u64) -> Value {
        let end = Instant::now() + PATIENCE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer to request {id}: {e}"));
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.post(method, params);
        self.wait(id)
    }

    /// A tool's structuredContent.
    fn tool(&mut self, name: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": name, "arguments": args}));
        r["result"]["structuredContent"].clone()
    }

    fn session(&mut self) -> String {
        let v = self.tool("create_session", json!({}));
        v["session_id"].as_str().unwrap().to_owned()
    }

    fn exec(&mut self, session: &str, language: &str, code: &str) -> Value {
        self.tool(
            "execute_code",
            json!({"language": language, "code": code, "session_id": session}),
        )
    }

    fn exec_later(&mut self, session: &str, language: &str, code: &str) -> u64 {
        self.post(
            "tools/call",
            json!({"name": "execute_code", "arguments":
                   {"language": language, "code": code, "session_id": session}}),
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(pid, start time)` of every live process whose ancestors include
/// `root` (not `root` itself).
fn descendants(root: u32) -> Vec<(i32, u64)> {
    procs::descendants_in(&procs::process_stats(), root as i32)
        .into_iter()
        .filter(|p| p.state != 'Z')
        .map(|p| (p.pid, p.start))
        .collect()
}

/// Those of `procs` still running (the same pid, started at the same time,
/// not a zombie).
fn still_running(procs: &[(i32, u64)]) -> Vec<(i32, u64)> {
    procs
        .iter()
        .filter(|(pid, start)| {
            procs::stat(*pid).is_some_and(|s| s.state != 'Z' && s.start == *start)
        })
        .copied()
        .collect()
}

/// Entries of `dir` whose name starts with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// This process's directory in every cgroup hierarchy.
fn cgroup_dirs() -> Vec<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut out = Vec::new();
    for l in cgroups.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctls, path) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let base = if ctls.is_empty() {
            "/sys/fs/cgroup/unified".to_owned()
        } else {
            format!("/sys/fs/cgroup/{}", ctls.trim_start_matches("name="))
        };
        out.push(Path::new(&base).join(path.trim_start_matches('/')));
    }
    out
}

/// Everything on the host named for supervisor `pid`: scratch roots, fork
/// server directories, mounts, cgroups.
pub(crate) fn left_by(pid: u32) -> Vec<String> {
    let tmp = std::env::temp_dir();
    let mut out: Vec<String> = Vec::new();
    for prefix in ["cellbox-scratch-", "cellbox-forkserver-"] {
        for p in named(&tmp, &format!("{prefix}{pid}-")) {
            out.push(format!("dir {}", p.display()));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for l in mounts.lines() {
        if l.contains(&format!("/cellbox-scratch-{pid}-")) {
            out.push(format!("mount {l}"));
        }
    }
    for d in cgroup_dirs() {
        for p in named(&d, &format!("cellbox-{pid}-")) {
            out.push(format!("cgroup {}", p.display()));
        }
    }
    out
}

/// The file `name` somewhere beneath `root` (two levels at most).
fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        if p.join(name).is_file() {
            return Some(p.join(name));
        }
        if p.is_dir() {
            for e2 in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                if e2.path().join(name).is_file() {
                    return Some(e2.path().join(name));
                }
            }
        }
    }
    None
}

#[test]
fn a_killed_serve_leaves_nothing_once_the_next_one_starts() {
    if !nix::unistd::geteuid().is_root() {
        panic!("the scratch tmpfs and the cgroups need root; run the suite as root");
    }
    let mut a = Serve::start();
    let pid = a.pid();
    let s1 = a.session();
    let s2 = a.session();
    // Files in both sessions, warm pools for Python and Rhai.
    for s in [&s1, &s2] {
        let r = a.exec(
            s,
            "python",
            "open('data.bin', 'wb').write(b'x' * (4 << 20))\nx = 1\n2",
        );
        assert_eq!(r["status"], "ok", "{r}");
    }
    let r = a.exec(&s1, "rhai", "let y = 40; y + 2");
    assert_eq!(r["status"], "ok", "{r}");
    // Running cells: one sleeping with a child of its own, one busy.
    a.exec_later(
        &s1,
        "python",
        "import os, time\nif os.fork() == 0:\n    time.sleep(120)\n    os._exit(0)\nopen('fault-running-1', 'w').write('x')\ntime.sleep(120)",
    );
    a.exec_later(
        &s2,
        "python",
        "open('fault-running-2', 'w').write('x')\nwhile True:\n    pass",
    );
    let roots = named(&std::env::temp_dir(), &format!("cellbox-scratch-{pid}-"));
    assert_eq!(roots.len(), 1, "{roots:?}");
    let root = roots[0].clone();
    assert!(
        eventually(30, || find_file(&root, "fault-running-1").is_some()
            && find_file(&root, "fault-running-2").is_some()),
        "the running cells never started"
    );
    let procs = descendants(pid);
    assert!(procs.len() >= 4, "zygote, fork server, cells: {procs:?}");
    let before = left_by(pid);
    assert!(
        before.iter().any(|l| l.starts_with("mount "))
            && before.iter().any(|l| l.starts_with("dir "))
            && before.iter().any(|l| l.starts_with("cgroup ")),
        "{before:#?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    a.child.wait().unwrap();
    // Nothing has cleaned up yet: the mount and directories are still
    // there (what the next supervisor must sweep).
    let after_kill = left_by(pid);
    assert!(
        after_kill.iter().any(|l| l.starts_with("mount ")) && root.exists(),
        "{after_kill:#?}"
    );
    // The processes die with their supervisor (parent-death signals, PID
    // namespaces), whoever sweeps.
    assert!(
        eventually(10, || still_running(&procs).is_empty()),
        "outlived a killed serve: {:?}",
        still_running(&procs)
    );

    let mut b = Serve::start();
    let left = left_by(pid);
    assert!(left.is_empty(), "left by the killed serve: {left:#?}");
    assert!(!root.exists());
    // The new serve works.
    let s = b.session();
    let r = b.exec(&s, "python", "open('f', 'w').write('y')\n6 * 7");
    assert_eq!(r["value"], 42, "{r}");
    drop(b);
}

/// `kill -9` of a cell, of a zygote and of the fork server beneath a live
/// serve: the other session's cells, files and variables are unharmed, the
/// killed cell's session goes on, and nothing is left once the serve ends.
#[test]
fn killing_a_cell_a_zygote_or_the_fork_server_spares_the_other_session() {
    if !nix::unistd::geteuid().is_root() {
        panic!("the scratch tmpfs and the cgroups need root; run the suite as root");
    }
    let mut a = Serve::start();
    let pid = a.pid();
    let victim = a.session();
    let other = a.session();
    let r = a.exec(
        &other,
        "python",
        "open('kept', 'w').write('k')\nkept = 7\n1",
    );
    assert_eq!(r["status"], "ok", "{r}");
    let r = a.exec(&other, "rhai", "let z = 5; z");
    assert_eq!(r["status"], "ok", "{r}");
    let root = named(&std::env::temp_dir(), &format!("cellbox-scratch-{pid}-"))[0].clone();
    let cmdline = |p: i32| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default()
    };
    let check_other = |a: &mut Serve| {
        let r = a.exec(
            &other,
            "python",
            "[open('kept').read(), kept, __import__('os').path.exists('data.bin')]",
        );
        assert_eq!(r["value"], json!(["k", 7, false]), "{r}");
        let r = a.exec(&other, "rhai", "z + 1");
        assert_eq!(r["value"], 6, "{r}");
    };

    // 1. A running cell: its host pid is the process in the pool's PID
    //    namespace with the pid it wrote.
    let id = a.exec_later(
        &victim,
        "python",
        "import os, time\nopen('cell-ns', 'w').write('%s %d' % (os.readlink('/proc/self/ns/pid'), os.getpid()))\ntime.sleep(120)",
    );
    assert!(eventually(30, || find_file(&root, "cell-ns").is_some()));
    let text = std::fs::read_to_string(find_file(&root, "cell-ns").unwrap()).unwrap();
    let (ns, inner) = text.split_once(' ').unwrap();
    let cell = descendants(pid)
        .into_iter()
        .map(|p| p.0)
        .find(|p| {
            let link = std::fs::read_link(format!("/proc/{p}/ns/pid")).unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            link.to_string_lossy() == ns
                && status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last())
                    == Some(inner)
        })
        .expect("the running cell's host pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cell),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = a.wait(id);
    let st = &r["result"]["structuredContent"];
    assert_eq!(st["status"], "killed", "{r}");
    check_other(&mut a);
    let r = a.exec(&victim, "python", "6 * 7");
    assert_eq!(r["value"], 42, "{r}");

    // 2. The zygote (mid-cell), then 3. the fork server (mid-cell).
    for (what, language, code) in [
        ("--zygote", "python", "import time\ntime.sleep(120)"),
        ("__forkserver", "rhai", "loop { }"),
    ] {
        let id = a.exec_later(&victim, language, code);
        let mut target = None;
        assert!(
            eventually(30, || {
                // The pool process (the server's child, PID 1 of its
                // namespaces) with a running child (the cell).
                let all = descendants(pid);
                target = all.iter().map(|p| p.0).find(|&p| {
                    cmdline(p).contains(what)
                        && procs::stat(p).is_some_and(|s| s.ppid as u32 == pid)
                        && all.iter().any(|c| {
                            procs::stat(c.0).is_some_and(|s| s.state != 'Z' && s.ppid == p)
                                && std::fs::read_to_string(format!("/proc/{}/comm", c.0))
                                    .is_ok_and(|c| c.trim() != "cellbox-spare")
                        })
                });
                target.is_some()
            }),
            "no {what} with a running cell"
        );
        std::thread::sleep(Duration::from_millis(300));
        let target = target.unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(target),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let r = a.wait(id);
        let st = &r["result"]["structuredContent"];
        assert_ne!(st["status"], "ok", "{what}: {r}");
        check_other(&mut a);
        let r = a.exec(&victim, language, "6 * 7");
        assert_eq!(r["value"], 42, "after killing {what}: {r}");
    }

    // A serve that ends leaves nothing either.
    let procs = descendants(pid);
    drop(a.stdin.take());
    let status = a.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(eventually(10, || still_running(&procs).is_empty()));
    assert!(
        eventually(10, || left_by(pid).is_empty()),
        "{:#?}",
        left_by(pid)
    );
}

/// Where the supervisor may not clone its pool processes into their
/// namespaces (`CELLBOX_POOL_CLONE=refused` acts as if the kernel refused),
/// each starts on the host and clones itself, as a worker does: cells run
/// warm all the same, and a killed serve leaves nothing.
#[test]
fn pool_processes_started_on_the_host_clone_themselves_and_die_with_serve() {
    let mut a = Serve::start_with_env(&[("CELLBOX_POOL_CLONE", "refused")]);
    let pid = a.pid();
    let s = a.session();
    let r = a.exec(&s, "python", "import os\n[os.getpid() > 1, 6 * 7]");
    assert_eq!(r["value"], json!([true, 42]), "{r}");
    let r = a.exec(&s, "rhai", "6 * 7");
    assert_eq!(r["value"], 42, "{r}");
    // The serve's pool children are on the host, each with its clone (PID
    // 1 of the pool's namespaces) as its child.
    let nspid = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("NSpid:")
                    .map(|v| v.split_whitespace().count())
            })
    };
    let all = descendants(pid);
    let pool: Vec<i32> = all
        .iter()
        .map(|p| p.0)
        .filter(|&p| {
            procs::stat(p).is_some_and(|st| st.ppid as u32 == pid)
                && (procs::cmdline(p).contains("__forkserver")
                    || procs::cmdline(p).contains("__zygote"))
        })
        .collect();
    assert!(pool.len() >= 2, "{pool:?}");
    for p in pool {
        assert_eq!(nspid(p), Some(1), "{p} is on the host");
        let inner: Vec<i32> = all
            .iter()
            .map(|c| c.0)
            .filter(|&c| procs::stat(c).is_some_and(|st| st.ppid == p))
            .collect();
        assert_eq!(inner.len(), 1, "{p}: {inner:?}");
        assert_eq!(
            nspid(inner[0]),
            Some(2),
            "{} is in a PID namespace",
            inner[0]
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(10, || still_running(&all).is_empty()),
        "outlived a killed serve: {:?}",
        still_running(&all)
    );
}

/// A serve killed while a live session of it is frozen between cells
/// leaves nothing of the session: a frozen (cgroup v1) process acts on no
/// signal until it is thawed, so its SIGKILL (its PID namespace ended with
/// the zygote) would wait for the next supervisor's sweep; the freezer
/// guard, which outlives the serve, thaws the serve's groups at once.
#[test]
fn a_serve_killed_with_a_frozen_session_leaves_nothing_of_it() {
    let mut a = Serve::start();
    let s = a.session();
    let token = format!("frozen-{}", std::process::id());
    let r = a.exec(
        &s,
        "python",
        &format!("f = open({token:?}, 'w')\nopen('/proc/self/cgroup').read()"),
    );
    let cgroup = r["value"].as_str().unwrap_or_else(|| panic!("{r}"));
    let freezer = cgroup
        .lines()
        .find_map(|l| l.split_once(":freezer:").map(|(_, p)| p.to_owned()))
        .unwrap_or_else(|| panic!("no freezer group: {cgroup}"));
    let state = format!("/sys/fs/cgroup/freezer{freezer}/freezer.state");
    assert!(
        eventually(10, || std::fs::read_to_string(&state)
            .is_ok_and(|s| s.trim() == "FROZEN")),
        "the idle session was not frozen"
    );
    let holders = super::common::holders_of(&token);
    assert!(!holders.is_empty(), "the state process holds no file");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = a.child.wait();
    assert!(
        eventually(10, || super::common::holders_of(&token).is_empty()),
        "the frozen session outlived its killed serve: {:?}",
        super::common::holders_of(&token)
    );
}
