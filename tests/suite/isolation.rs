//! OS isolation, end to end: `cellbox exec` runs small C probes
//! (tests/probes/probe.c, compiled here with `cc`) inside a cell and each
//! test asserts the exact outcome: the errno of a denied call, the signal of
//! a killed process, the limit a bomb stopped at.
//!
//! `tests/probes/without.c` runs cellbox under a seccomp filter that makes
//! the kernel look like it lacks Landlock or namespaces, to check that a
//! profile requiring a missing layer refuses to run.

use super::common::{self, bin, cellbox, run_once};
use cellbox::profiles::{DenyAction, LayerMode, Profile};
use cellbox::{Language, Status};
use serde_json::Value;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EAGAIN: i32 = 11;
const ENOMEM: i32 = 12;
const EACCES: i32 = 13;
const EROFS: i32 = 30;
const ENOSYS: i32 = 38;
const SIGSYS: i64 = 31;

struct Probes {
    probe: PathBuf,
    without: PathBuf,
    dir: PathBuf,
}

/// Compile the probes once per test process. The directory is world
/// readable so the cell's unprivileged uid can execute them.
fn probes() -> &'static Probes {
    static PROBES: OnceLock<Probes> = OnceLock::new();
    PROBES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("isolation-probes");
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probes");
        let build = |name: &str| {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let status = Command::new("cc")
                .args(["-O1", "-Wall", "-o"])
                .arg(&tmp)
                .arg(src.join(format!("{name}.c")))
                .status()
                .expect("cc must be installed to build the isolation probes");
            assert!(status.success(), "failed to compile {name}.c");
            let out = dir.join(name);
            std::fs::rename(&tmp, &out).unwrap();
            out
        };
        let probes = Probes {
            probe: build("probe"),
            without: build("without"),
            dir: dir.clone(),
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        probes
    })
}

fn probe() -> &'static str {
    probes().probe.to_str().unwrap()
}

/// `cellbox exec --json [extra] -- argv`, parsed.
fn exec_json(extra: &[&str], argv: &[&str]) -> Value {
    common::exec_json(extra, argv).1
}

/// Run the probe under `profile` and return its stdout, asserting that the
/// cell itself ended normally.
fn run_probe(profile: &str, args: &[&str]) -> String {
    let mut argv = vec![probe()];
    argv.extend_from_slice(args);
    let r = exec_json(&["--profile", profile], &argv);
    assert_eq!(r["status"], "ok", "{profile} {args:?}: {r:#}");
    r["stdout"].as_str().unwrap().to_owned()
}

fn errno_of(line: &str) -> i32 {
    line.trim()
        .rsplit("errno=")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no errno in {line:?}"))
}

fn status_field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{key} missing from /proc/self/status"))
}

fn assert_locked_down(status: &str, what: &str) {
    assert_eq!(status_field(status, "Seccomp"), "2", "{what}");
    assert_eq!(status_field(status, "NoNewPrivs"), "1", "{what}");
    let uids: Vec<&str> = status_field(status, "Uid").split_whitespace().collect();
    assert_eq!(uids.len(), 4);
    for u in &uids {
        assert_ne!(*u, "0", "{what}: a uid is root: {uids:?}");
    }
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(status, cap),
            "0000000000000000",
            "{what}: {cap}"
        );
    }
    assert_eq!(
        status_field(status, "Groups"),
        "",
        "{what}: supplementary groups"
    );
}

#[test]
fn proc_status_shows_seccomp_no_new_privs_unprivileged_uid_and_no_caps() {
    let r = exec_json(&[], &["/bin/cat", "/proc/self/status"]);
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_locked_down(r["stdout"].as_str().unwrap(), "shell");

    let r = exec_json(
        &["--profile", "python"],
        &[
            "/usr/bin/python3",
            "-I",
            "-c",
            "print(open('/proc/self/status').read())",
        ],
    );
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_locked_down(r["stdout"].as_str().unwrap(), "python");
}

#[test]
fn every_layer_is_reported_applied() {
    let out = cellbox(&["run", "--json", "--lang", "rhai", "-"], Some("40 + 2"));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "ok", "{r:#}");
    let layers: Vec<(String, bool)> = r["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap().to_owned(), l["applied"] == true))
        .collect();
    let names = [
        "hygiene",
        "namespaces",
        "rlimits",
        "privileges",
        "landlock",
        "seccomp",
        "cgroup",
    ];
    assert_eq!(
        layers,
        names
            .iter()
            .map(|n| (n.to_string(), true))
            .collect::<Vec<_>>()
    );
    assert_eq!(r["sandbox"]["landlock_abi"], 6);
    assert_eq!(
        r["sandbox"]["namespaces"],
        serde_json::json!(["user", "mount", "pid", "net", "ipc", "uts"])
    );
}

#[test]
fn writes_outside_scratch_fail_and_inside_work() {
    for profile in ["shell", "python"] {
        for path in [
            "/usr/cellbox-x",
            "/etc/passwd",
            "/cellbox-x",
            "/proc/sys/kernel/hostname",
            "/dev/cellbox-x",
            "/proc/1/environ",
        ] {
            let out = run_probe(profile, &["write", path]);
            let e = errno_of(&out);
            assert!(
                [EACCES, EPERM, EROFS].contains(&e),
                "{profile}: writing {path} gave errno {e}"
            );
        }
        assert_eq!(run_probe(profile, &["write", "./inside"]), "ok\n");
        assert_eq!(run_probe(profile, &["write", "/tmp/inside"]), "ok\n");
    }
    let r = exec_json(&[], &["/bin/sh", "-c", "echo hi > f && cat f"]);
    assert_eq!(r["stdout"], "hi\n");
}

#[test]
fn programs_written_to_scratch_cannot_be_executed() {
    let r = exec_json(&[], &["/bin/sh", "-c", "cp /bin/true ./t && ./t"]);
    assert_eq!(r["exit"]["code"], 126, "{r:#}");
}

#[test]
fn root_home_and_shadow_are_not_in_the_cell() {
    for profile in ["shell", "python"] {
        assert_eq!(
            errno_of(&run_probe(profile, &["read", "/etc/shadow"])),
            ENOENT
        );
        assert_eq!(errno_of(&run_probe(profile, &["read", "/root"])), ENOENT);
    }
}

#[test]
fn tcp_and_udp_to_a_host_listener_fail_and_the_listener_sees_nothing() {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tport = tcp.local_addr().unwrap().port().to_string();
    let uport = udp.local_addr().unwrap().port().to_string();
    for profile in ["shell", "python"] {
        assert_eq!(run_probe(profile, &["tcp", &tport]), "socket errno=1\n");
        assert_eq!(run_probe(profile, &["udp", &uport]), "socket errno=1\n");
    }
    // Python's own socket module, too.
    let r = exec_json(
        &["--profile", "python"],
        &[
            "/usr/bin/python3",
            "-I",
            "-c",
            &format!(
                "import socket\ntry:\n  socket.create_connection(('127.0.0.1', {tport}), 2)\n  print('connected')\nexcept OSError as e:\n  print(e.errno)"
            ),
        ],
    );
    assert_eq!(r["stdout"], "1\n", "{r:#}");
    assert_eq!(tcp.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    let mut buf = [0u8; 16];
    assert_eq!(
        udp.recv(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
}

#[test]
fn a_host_unix_socket_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    for profile in ["shell", "python"] {
        let out = run_probe(profile, &["unix", path.to_str().unwrap()]);
        assert_eq!(out, "socket errno=1\n", "{profile}");
    }
    assert_eq!(
        listener.accept().unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the listener saw a connection"
    );
}

#[test]
fn killing_a_host_process_fails() {
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = victim.id().to_string();
    for profile in ["shell", "python"] {
        // Not in the cell's PID namespace: no such process.
        assert_eq!(errno_of(&run_probe(profile, &["kill", &pid])), ESRCH);
    }
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process died"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn ptrace_of_the_parent_fails() {
    for profile in ["shell", "python"] {
        assert_eq!(
            errno_of(&run_probe(profile, &["ptrace-parent"])),
            EPERM,
            "{profile}"
        );
    }
}

#[test]
fn unshare_clone_with_namespace_flags_and_mount_fail() {
    for profile in ["shell", "python"] {
        assert_eq!(errno_of(&run_probe(profile, &["unshare-user"])), EPERM);
        assert_eq!(errno_of(&run_probe(profile, &["clone-newuser"])), EPERM);
        assert_eq!(errno_of(&run_probe(profile, &["mount"])), EPERM);
        // clone3 says "not implemented", so libc falls back to clone.
        assert_eq!(errno_of(&run_probe(profile, &["clone3"])), ENOSYS);
    }
}

#[test]
fn tiocsti_fails_also_with_high_bits_set() {
    for profile in ["shell", "python"] {
        assert_eq!(
            run_probe(profile, &["tiocsti"]),
            "plain errno=1\nhigh errno=1\n",
            "{profile}"
        );
    }
}

#[test]
fn a_fork_bomb_is_stopped_at_the_process_limit() {
    let r = exec_json(&[], &[probe(), "forkbomb"]);
    assert_eq!(r["status"], "ok", "{r:#}");
    let out = r["stdout"].as_str().unwrap();
    let forked: u64 = out
        .trim()
        .strip_prefix("forked=")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let limit = Profile::load("shell").unwrap().limits.rlimits.max_processes;
    assert!(forked < limit, "forked {forked} with a limit of {limit}");
    assert_eq!(errno_of(out), EAGAIN);
    // The bomb's processes died with the cell, and the host still forks.
    let probe_path = probes().probe.clone();
    let leftovers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    c.starts_with(probe_path.as_os_str().as_encoded_bytes())
                        && c.ends_with(b"forkbomb\0")
                })
                .unwrap_or(false)
        })
        .count();
    assert_eq!(leftovers, 0, "fork bomb processes survived the cell");
    assert!(Command::new("true").status().unwrap().success());
}

#[test]
fn a_memory_bomb_is_stopped() {
    let limit: u64 = 256 << 20;
    let r = exec_json(&["--memory", &limit.to_string()], &[probe(), "membomb"]);
    assert_eq!(r["status"], "ok", "{r:#}");
    let out = r["stdout"].as_str().unwrap();
    let mib: u64 = out
        .trim()
        .strip_prefix("allocated_mib=")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(mib > 0 && mib < limit >> 20, "allocated {mib} MiB");
    assert_eq!(errno_of(out), ENOMEM);
}

#[test]
fn rlimits_read_back_as_set() {
    let memory = 300_000_000u64;
    let r = exec_json(&["--memory", &memory.to_string()], &[probe(), "rlimits"]);
    assert_eq!(r["status"], "ok", "{r:#}");
    let got: std::collections::HashMap<String, String> = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    // What the sandbox says it set.
    let layer = r["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "rlimits")
        .unwrap_or_else(|| panic!("no rlimits layer: {r:#}"));
    assert_eq!(layer["applied"], true);
    let set: std::collections::HashMap<String, u64> = layer["detail"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect();
    let same = |v: u64| format!("{v}/{v}");
    assert_eq!(got["as"], same(memory));
    assert_eq!(set["memory_bytes"], memory);
    let cpu = set["cpu_seconds"];
    assert_eq!(got["cpu"], format!("{cpu}/{}", cpu + 1));
    assert_eq!(got["fsize"], same(set["max_file_size_bytes"]));
    assert_eq!(got["nofile"], same(set["max_open_files"]));
    assert_eq!(got["nproc"], same(set["max_processes"]));
    assert_eq!(got["stack"], same(set["stack_bytes"]));
    assert_eq!(got["core"], "0/0");
}

fn without(feature: &str, args: &[&str]) -> std::process::Output {
    Command::new(&probes().without)
        .arg(feature)
        .arg("--")
        .arg(bin())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_profile_requiring_a_missing_layer_refuses_to_run() {
    // No Landlock: every shipped profile requires it.
    let marker = format!("ran-{}", std::process::id());
    let out = without("landlock", &["exec", "--", "/bin/echo", &marker]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&marker),
        "the program ran"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("landlock"), "{stderr}");
    let out = without("landlock", &["exec", "--json", "--", "/bin/echo", &marker]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "sandbox_error");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("landlock"),
        "{r:#}"
    );

    // No namespaces: a profile that requires them refuses…
    let mut p = Profile::load("shell").unwrap();
    p.layers.namespaces = LayerMode::Required;
    let path = probes()
        .dir
        .join(format!("ns-required-{}.toml", std::process::id()));
    std::fs::write(&path, toml::to_string(&p).unwrap()).unwrap();
    let out = without(
        "namespaces",
        &[
            "exec",
            "--profile",
            path.to_str().unwrap(),
            "--",
            "/bin/echo",
            &marker,
        ],
    );
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&marker));
    assert!(String::from_utf8_lossy(&out.stderr).contains("namespaces"));
    std::fs::remove_file(&path).unwrap();

    // …while the shipped, best-effort one runs without them, and Landlock
    // and seccomp still hold.
    let out = without(
        "namespaces",
        &["exec", "--json", "--", probe(), "write", "/usr/cellbox-x"],
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["stdout"], format!("errno={EACCES}\n"));
    let ns = r["sandbox"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "namespaces")
        .unwrap()
        .clone();
    assert_eq!(ns["applied"], false);
    assert_eq!(ns["mode"], "best_effort");
    let out = without("namespaces", &["exec", "--", probe(), "tcp", "9"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "socket errno=1\n");
}

#[test]
fn doctor_exits_nonzero_when_a_required_layer_is_missing() {
    let out = cellbox(&["doctor", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["ok"], true);
    assert_eq!(r["profiles"].as_array().unwrap().len(), 3);

    let out = without("landlock", &["doctor"]);
    assert_eq!(out.status.code(), Some(6));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("REFUSED, missing required: landlock"),
        "{text}"
    );
}

/// Every syscall a shipped profile denies on purpose.
fn denied(profile: &Profile) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    for g in &profile.seccomp.deny {
        for s in &g.syscalls {
            if let Some(nr) = cellbox::sandbox::syscalls::number(s) {
                out.push((g.group.clone(), s.clone(), nr));
            }
        }
    }
    out
}

#[test]
fn every_denied_syscall_of_the_shipped_profiles_fails_with_eperm() {
    for name in ["shell", "python"] {
        let p = Profile::load(name).unwrap();
        let calls = denied(&p);
        assert!(
            calls.len() > 50,
            "{name}: only {} denied syscalls",
            calls.len()
        );
        let mut args = vec!["syscalls".to_string()];
        args.extend(calls.iter().map(|(_, _, nr)| nr.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_probe(name, &args);
        for (group, syscall, nr) in &calls {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{nr} errno=")))
                .unwrap_or_else(|| panic!("{name}: {group}/{syscall} did not fail:\n{out}"));
            assert_eq!(errno_of(line), EPERM, "{name}: {group}/{syscall}");
        }
    }
}

/// The same walk with every deny group switched to `kill`: each call must
/// end the probe with SIGSYS, which proves the filter (and not the kernel's
/// own permission checks) stopped it.
#[test]
fn every_denied_syscall_is_caught_by_the_filter() {
    for name in ["shell", "python"] {
        let mut p = Profile::load(name).unwrap();
        for g in &mut p.seccomp.deny {
            // socket is argument-filtered and cannot be killed outright; the
            // network tests cover it.
            g.syscalls.retain(|s| s != "socket");
            g.action = DenyAction::Kill;
        }
        p.seccomp.deny.retain(|g| !g.syscalls.is_empty());
        let path = probes()
            .dir
            .join(format!("{name}-kill-{}.toml", std::process::id()));
        std::fs::write(&path, toml::to_string(&p).unwrap()).unwrap();
        let calls = denied(&p);
        assert!(
            calls.len() > 50,
            "{name}: only {} denied syscalls",
            calls.len()
        );
        let path_str = path.to_str().unwrap().to_owned();
        // A few threads: each call needs its own cell.
        let chunks: Vec<Vec<(String, String, i64)>> = calls
            .chunks(calls.len().div_ceil(4))
            .map(<[_]>::to_vec)
            .collect();
        std::thread::scope(|s| {
            for chunk in chunks {
                let path_str = &path_str;
                s.spawn(move || {
                    for (group, syscall, nr) in chunk {
                        let r = exec_json(
                            &["--profile", path_str],
                            &[probe(), "syscall", &nr.to_string()],
                        );
                        assert_eq!(
                            r["exit"]["signal"], SIGSYS,
                            "{name}: {group}/{syscall} was not killed by the filter: {r:#}"
                        );
                    }
                });
            }
        });
        std::fs::remove_file(&path).unwrap();
    }
}

/// The cell's mount table holds its own mounts and nothing of the host's:
/// no old root, no `/sys`, `/run`, `/dev/pts` or `/boot`, one-shot and
/// through a worker alike.
#[tokio::test]
async fn the_cell_mount_table_holds_only_its_own_mounts() {
    fn check(mountinfo: &str, what: &str) {
        let points: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .collect();
        assert!(points.contains(&"/"), "{what}: {mountinfo}");
        assert!(points.contains(&"/proc"), "{what}: {mountinfo}");
        let allowed = |p: &str| {
            p == "/"
                || p == "/tmp"
                || p == "/proc"
                || p.starts_with("/tmp/cellbox-")
                || [
                    "/usr",
                    "/etc/",
                    "/dev/null",
                    "/dev/zero",
                    "/dev/urandom",
                    "/dev/random",
                ]
                .iter()
                .any(|a| p.starts_with(a))
        };
        for p in &points {
            assert!(allowed(p), "{what}: unexpected mount {p} in {mountinfo}");
        }
        // The flags of each mount: host binds read-only, nothing writable
        // executable, nothing but the device nodes with dev.
        for line in mountinfo.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let (point, opts) = (fields[4], fields[5]);
            let opts: Vec<&str> = opts.split(',').collect();
            let want: &[&str] =
                if point == "/" || point.starts_with("/usr") || point.starts_with("/etc/") {
                    &["ro", "nosuid", "nodev"]
                } else if point.starts_with("/dev/") {
                    &["nosuid", "noexec"]
                } else {
                    &["rw", "nosuid", "nodev", "noexec"]
                };
            for w in want {
                assert!(opts.contains(w), "{what}: {point} is not {w}: {line}");
            }
        }
        assert!(points.len() <= 14, "{what}: {mountinfo}");
    }
    let r = exec_json(&[], &["/bin/cat", "/proc/self/mountinfo"]);
    assert_eq!(r["status"], "ok", "{r:#}");
    check(r["stdout"].as_str().unwrap(), "exec");
    let r = run_once(Language::Shell, "cat /proc/self/mountinfo", &[]).await;
    assert_eq!(r.status, Status::Ok, "{r:?}");
    check(r.stdout.as_str(), "worker");
}
