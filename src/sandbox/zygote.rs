//! Python zygotes: one sandboxed interpreter that has imported the runtime
//! shim and forks one child per cell.
//!
//! A zygote starts like a worker (`cellbox __zygote`, re-exec'd by the
//! supervisor) with a `SOCK_SEQPACKET` control channel on fd 3. The control
//! channel carries one JSON object per packet (tag `"op"`) and, with some
//! messages, fds (`SCM_RIGHTS`):
//!
//! - supervisor → zygote: `setup {interpreter, plan}` (once): the worker
//!   stage applies the pool-wide layers with [`crate::sandbox::enter`];
//! - zygote → supervisor: `ready {report, anchors}` with one `O_PATH` fd per
//!   name in `anchors` (paths that exist only inside the zygote's mount
//!   namespace: `/proc`, `/etc/passwd`, `/etc/group`), so the
//!   supervisor can name them in each cell's Landlock ruleset; or
//!   `sandbox_error {layer, message}`. Then the worker stage execs Python
//!   running the shim in zygote mode, on the same fd 3;
//! - supervisor → zygote: `spawn {id}` with five fds: the cell's protocol
//!   socket, its stdout and stderr pipe ends, its Landlock ruleset (built by
//!   the supervisor, see [`crate::sandbox::linux::landlock::CellRules`]) and
//!   a pipe holding its [`CellSetup`] (scratch dir, rlimits), which only the
//!   forked child reads: nothing of one cell's request is ever in the
//!   zygote's memory, so none of it is in the memory a later cell (of
//!   another session) is forked with;
//! - zygote → supervisor: `spawned {id, pid}` with a pidfd, `error {id,
//!   message}`, and `ended {pid, status, utime, stime, max_rss_kb}` (wait4's
//!   figures, written from buffers the zygote zeroes after each report, for
//!   the same reason).
//!
//! Each child then tightens before the shim reads its `start` frame: own
//! session, fds 0–3 only, per-cell rlimits, cwd/HOME/TMPDIR = its scratch
//! dir, `landlock_restrict_self` with its own ruleset (a nested domain,
//! scoped for signals and abstract sockets, so it can reach neither the
//! zygote nor a sibling), and a second seccomp filter ([`cell_filter`]) that
//! takes back every syscall the zygote needed and the cell profile denies.

use super::linux::seccomp::{program_for, Action, ArgCheck, Filter, Verdict};
use crate::plan::Rlimits;
use crate::profiles::{ArgAllow, DenyGroup, SeccompSpec, SyscallGroup};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;

pub use super::packet::{recv, send, MAX_PACKET_BYTES};

pub use crate::protocol::pool::{cpu_ms, CellSetup, StateMsg, ZygoteMsg};

/// The paths inside the zygote's namespaces a cell may still read. Unlike
/// a cold cell, a warm cell may not list the root: a grant to list
/// directories beneath `/` would let it list the pool scratch root and its
/// siblings' scratch dirs.
pub const ANCHORS: &[&str] = &["/proc", "/etc/passwd", "/etc/group"];

/// Open the anchors that exist (`O_PATH`), in the calling process's mount
/// namespace. With no mount namespace only `/proc` is offered (the host's
/// root and its `/etc` files are never granted to a cell).
pub fn open_anchors(in_mount_ns: bool) -> Vec<(String, OwnedFd)> {
    let mut out = Vec::new();
    for a in ANCHORS {
        if !in_mount_ns && *a != "/proc" {
            continue;
        }
        if let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(a)
        {
            out.push(((*a).to_owned(), OwnedFd::from(f)));
        }
    }
    out
}

use std::os::unix::fs::OpenOptionsExt;

/// Syscalls the zygote needs beyond the cell profile, and why each is safe
/// to have in the zygote's own filter: every one is taken back by
/// [`cell_filter`] in each child before cell code runs, and none widens what
/// the zygote itself can reach.
pub const ZYGOTE_EXTRAS: &[(&str, &str)] = &[
    (
        "pidfd_open",
        "hand the supervisor a pidfd for each child (signals go through it)",
    ),
    (
        "setsid",
        "each child becomes its own session and process group",
    ),
    (
        "landlock_restrict_self",
        "each child enters its own nested Landlock domain (only ever narrows)",
    ),
    (
        "seccomp",
        "each child stacks the cell filter on top (only ever narrows)",
    ),
];

/// The zygote's seccomp spec: the cell profile's, plus [`ZYGOTE_EXTRAS`] and
/// `prctl(PR_SET_DUMPABLE)` (the zygote makes itself non-dumpable once).
pub fn zygote_seccomp(cell: &SeccompSpec) -> SeccompSpec {
    let mut spec = cell.clone();
    let extra: Vec<&str> = ZYGOTE_EXTRAS.iter().map(|(n, _)| *n).collect();
    spec.deny = spec
        .deny
        .into_iter()
        .map(|g| DenyGroup {
            syscalls: g
                .syscalls
                .into_iter()
                .filter(|s| !extra.contains(&s.as_str()))
                .collect(),
            ..g
        })
        .filter(|g| !g.syscalls.is_empty())
        .collect();
    spec.allow.push(SyscallGroup {
        group: "zygote".into(),
        why: "the zygote forks and tightens each cell; its children drop these again".into(),
        syscalls: extra.iter().map(|s| (*s).to_owned()).collect(),
    });
    let mut prctl = spec.prctl.allow.clone();
    if !prctl.iter().any(|p| p == "PR_SET_DUMPABLE") {
        prctl.push("PR_SET_DUMPABLE".into());
    }
    spec.prctl = ArgAllow {
        why: format!(
            "{}; the zygote clears its dumpable flag",
            spec.prctl.why.clone()
        ),
        allow: prctl,
    };
    spec
}

/// Why the cell filter (or the zygote's config holding it) could not be
/// made.
#[derive(Debug, thiserror::Error)]
pub enum CellFilterError {
    #[error("no syscall number for {0}")]
    NoNumber(String),
    #[error(transparent)]
    Compile(#[from] super::linux::seccomp::SeccompError),
}

/// The filter each zygote child stacks on the zygote's: EPERM for
/// [`ZYGOTE_EXTRAS`] and `setpgid`, and for `prctl(PR_SET_DUMPABLE)`;
/// everything else is allowed here and so decided by the zygote's own
/// filter, whose allowlist is the cell profile's (a call under a foreign
/// architecture included: that filter kills it).
pub fn cell_filter_rules() -> Result<Filter, CellFilterError> {
    let num = |n: &str| -> Result<u32, CellFilterError> {
        super::syscalls::number(n)
            .and_then(|nr| u32::try_from(nr).ok())
            .ok_or_else(|| CellFilterError::NoNumber(n.to_owned()))
    };
    let mut verdicts = BTreeMap::new();
    for n in ZYGOTE_EXTRAS.iter().map(|(n, _)| *n).chain(["setpgid"]) {
        verdicts.insert(num(n)?, Verdict::Ret(Action::EPERM));
    }
    verdicts.insert(
        num("prctl")?,
        Verdict::Allow(ArgCheck::NotOneOf {
            arg: 0,
            values: vec![libc::PR_SET_DUMPABLE as u32],
        }),
    );
    Ok(Filter {
        verdicts,
        default: Action::Allow,
        foreign_arch: Action::Allow,
    })
}

/// [`cell_filter_rules`] compiled, as the kernel's `sock_filter` array
/// bytes (the zygote installs it with `seccomp(2)` from Python).
pub fn cell_filter() -> Result<Vec<u8>, CellFilterError> {
    let prog = program_for(&cell_filter_rules()?)?;
    let mut bytes = Vec::with_capacity(prog.len() * 8);
    for ins in prog {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}

/// What the Python side of a zygote needs besides the shim, as JSON for its
/// command line: the cell filter, the syscall numbers it calls by hand,
/// each per-cell rlimit's name (a key of a cell's [`CellSetup`]) with the
/// name of the resource it sets (`RLIMIT_CPU`, ... as in Python's
/// `resource` module), in the order to set them, and the exit code of a
/// child whose sandbox could not be applied.
pub fn python_config(python: &crate::profiles::PythonPackages) -> Result<String, CellFilterError> {
    let filter = cell_filter()?;
    let hex: String = filter.iter().map(|b| format!("{b:02x}")).collect();
    let num =
        |n: &str| super::syscalls::number(n).ok_or_else(|| CellFilterError::NoNumber(n.to_owned()));
    Ok(serde_json::json!({
        "cell_filter": hex,
        "nr_seccomp": num("seccomp")?,
        "nr_landlock_restrict_self": num("landlock_restrict_self")?,
        "exit_sandbox": crate::exit::Exit::Sandbox.raw(),
        "rlimits": rlimit_names(),
        "python_paths": python.path_strings(),
        "preload": python.preload,
    })
    .to_string())
}

/// `[[name, "RLIMIT_..."], ...]` for [`python_config`].
fn rlimit_names() -> [[&'static str; 2]; 5] {
    Rlimits::names().map(|(name, resource)| [name, resource.as_name()])
}

/// A pipe holding `setup` (written whole, the write end closed): the read
/// end goes to the zygote with the `spawn` message.
pub fn setup_pipe(setup: &CellSetup) -> io::Result<OwnedFd> {
    use std::io::Write;
    let data = serde_json::to_vec(setup).map_err(io::Error::other)?;
    // A pipe holds 64 KiB before a write blocks; a setup is far smaller.
    if data.len() > 1 << 16 {
        return Err(io::Error::other("the cell setup is too large"));
    }
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    std::fs::File::from(w).write_all(&data)?;
    Ok(r)
}

/// Take fd 3 as the zygote's control channel; it must be a socket.
pub fn take_control_fd() -> io::Result<OwnedFd> {
    super::spawn::take_protocol_channel().map(OwnedFd::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Profile;
    use crate::sandbox::linux::seccomp::tests::{run, ALLOW as RET_ALLOW, EPERM as RET_EPERM};
    use crate::sandbox::SandboxPlan;

    fn decode(bytes: &[u8]) -> Vec<seccompiler::sock_filter> {
        bytes
            .chunks(8)
            .map(|c| seccompiler::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect()
    }

    fn nr(n: &str) -> i64 {
        crate::sandbox::syscalls::number(n).unwrap()
    }

    /// The setup a forked cell reads, and the plan's limits: five keys each.
    #[test]
    fn the_cell_setup_and_plan_limits_shapes_stay() {
        let p = Profile::load("rhai").unwrap();
        let limits = concat!(
            r#"{"cpu_seconds":30,"memory_bytes":536870912,"max_processes":1,"#,
            r#""max_open_files":32,"max_file_size_bytes":16777216}"#
        );
        let plan = SandboxPlan::new(&p, "/s".into(), p.default_limits());
        let plan_json = serde_json::to_string(&plan).unwrap();
        assert!(
            plan_json.contains(&format!(r#""limits":{limits},"#)),
            "{plan_json}"
        );
        let setup = CellSetup {
            scratch: "/s".into(),
            rlimits: p.default_limits(),
            state: false,
            waits: false,
        };
        let json = format!(r#"{{"scratch":"/s","rlimits":{limits}}}"#);
        assert_eq!(serde_json::to_string(&setup).unwrap(), json);
        assert_eq!(serde_json::from_str::<CellSetup>(&json).unwrap(), setup);
        let extra = json.replace("}}", r#","core":0}}"#);
        assert!(serde_json::from_str::<CellSetup>(&extra).is_err());
    }

    /// The zygote sets each limit of a cell's setup by the resource name
    /// it is sent with.
    #[test]
    fn the_python_config_names_every_rlimit_of_a_cell_setup() {
        let c: serde_json::Value =
            serde_json::from_str(&python_config(&Default::default()).unwrap()).unwrap();
        assert_eq!(
            c["rlimits"],
            serde_json::json!([
                ["cpu_seconds", "RLIMIT_CPU"],
                ["memory_bytes", "RLIMIT_AS"],
                ["max_file_size_bytes", "RLIMIT_FSIZE"],
                ["max_open_files", "RLIMIT_NOFILE"],
                ["max_processes", "RLIMIT_NPROC"]
            ])
        );
        let setup = CellSetup {
            scratch: "/s".into(),
            rlimits: Profile::load("python").unwrap().default_limits(),
            state: false,
            waits: false,
        };
        let setup = serde_json::to_value(&setup).unwrap();
        let keys = setup["rlimits"].as_object().unwrap();
        assert_eq!(keys.len(), 5);
        for pair in c["rlimits"].as_array().unwrap() {
            assert!(keys.contains_key(pair[0].as_str().unwrap()), "{pair}");
        }
    }

    #[test]
    fn python_config_carries_the_sandbox_exit_code() {
        let config: serde_json::Value =
            serde_json::from_str(&python_config(&Default::default()).unwrap()).unwrap();
        assert_eq!(config["exit_sandbox"], 6);
        assert!(config["cell_filter"].is_string());
    }

    #[test]
    fn cell_filter_takes_back_the_zygote_extras_only() {
        let prog = decode(&cell_filter().unwrap());
        for n in [
            "pidfd_open",
            "setsid",
            "setpgid",
            "landlock_restrict_self",
            "seccomp",
        ] {
            assert_eq!(run(&prog, nr(n), [0; 6]), RET_EPERM, "{n}");
        }
        let prctl = nr("prctl");
        assert_eq!(
            run(&prog, prctl, [libc::PR_SET_DUMPABLE as u64, 1, 0, 0, 0, 0]),
            RET_EPERM
        );
        assert_eq!(
            run(&prog, prctl, [libc::PR_SET_NAME as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        for n in ["read", "write", "clone", "openat", "exit_group"] {
            assert_eq!(run(&prog, nr(n), [0; 6]), RET_ALLOW, "{n}");
        }
        // Numbers it does not name are the zygote filter's to decide.
        for n in [0, 5000, 0x4000_0000] {
            assert_eq!(run(&prog, n, [0; 6]), RET_ALLOW, "{n}");
        }
    }

    #[test]
    fn zygote_spec_is_the_cell_spec_plus_the_extras() {
        let p = Profile::load("python").unwrap();
        let z = zygote_seccomp(&p.seccomp);
        let allowed =
            |s: &SeccompSpec, n: &str| s.allow.iter().any(|g| g.syscalls.iter().any(|x| x == n));
        let denied =
            |s: &SeccompSpec, n: &str| s.deny.iter().any(|g| g.syscalls.iter().any(|x| x == n));
        for (n, _) in ZYGOTE_EXTRAS {
            assert!(!allowed(&p.seccomp, n), "{n} allowed for cells");
            assert!(allowed(&z, n) && !denied(&z, n), "{n}");
        }
        // Nothing else changed: ptrace and friends stay denied.
        for n in [
            "ptrace",
            "process_vm_readv",
            "pidfd_getfd",
            "pidfd_send_signal",
            "landlock_add_rule",
        ] {
            assert!(denied(&z, n), "{n}");
        }
        assert!(z.prctl.allow.iter().any(|o| o == "PR_SET_DUMPABLE"));
        assert!(!p.seccomp.prctl.allow.iter().any(|o| o == "PR_SET_DUMPABLE"));
    }
}
