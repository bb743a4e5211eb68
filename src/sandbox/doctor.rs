//! What this host supports, and what a cell would get under a profile.
//!
//! [`probe`] asks the kernel directly (Landlock ABI, seccomp filter support,
//! whether namespaces can actually be created, …) rather than guessing from
//! versions. [`assess`] combines that with a profile's layer modes: a
//! `required` layer the host cannot provide makes the profile unusable here,
//! which `cellbox doctor` turns into a non-zero exit.

use crate::profiles::{LayerMode, Profile};
use crate::sandbox::Layer;
use serde::Serialize;
use std::path::PathBuf;

/// Kernel and host facts relevant to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostSupport {
    pub os: String,
    pub kernel: String,
    pub arch: String,
    pub running_as_root: bool,
    /// Landlock ABI of the kernel (`None`: no Landlock).
    pub landlock_abi: Option<u32>,
    /// The newest ABI cellbox uses.
    pub landlock_pinned_abi: u32,
    /// seccomp filters with errno actions.
    pub seccomp: bool,
    /// An unprivileged-style user namespace plus mount/PID/net/IPC/UTS can be
    /// created (tested by creating them).
    pub user_namespaces: bool,
    /// Mount/PID/net/IPC/UTS namespaces can be created (with or without a
    /// user namespace).
    pub namespaces: bool,
    pub mount_setattr: bool,
    /// A cgroup2 hierarchy is mounted (which need not be the one holding
    /// the memory controller: see `memory_cgroup`).
    pub cgroup_v2: bool,
    /// The memory controller cells' cgroups are made under.
    pub memory_cgroup: MemoryCgroup,
    /// A real Python interpreter (not a version-manager shim).
    pub python: Option<PathBuf>,
}

/// Where the memory controller is that bounds cells together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryCgroup {
    /// `"cgroup v1 memory"` or `"cgroup v2 memory"`, the words a cell's
    /// `cgroup` layer report uses; `None` when there is none.
    pub kind: Option<String>,
    /// This process's cgroup in that hierarchy, beneath which cells' are made.
    pub dir: Option<PathBuf>,
    /// Why there is none.
    pub problem: Option<String>,
}

/// One layer under one profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerAssessment {
    pub layer: String,
    pub mode: LayerMode,
    pub available: bool,
    pub detail: String,
}

/// What a cell would get under a profile on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfileAssessment {
    pub profile: String,
    pub source: String,
    pub layers: Vec<LayerAssessment>,
    /// Required layers this host cannot provide.
    pub missing_required: Vec<String>,
    /// Whether a cell can run under this profile here.
    pub ok: bool,
}

impl ProfileAssessment {
    /// The assessment of `profile` from its layers: ok when every required
    /// layer is available.
    pub fn new(profile: &Profile, layers: Vec<LayerAssessment>) -> ProfileAssessment {
        let missing_required: Vec<String> = layers
            .iter()
            .filter(|l| l.mode == LayerMode::Required && !l.available)
            .map(|l| l.layer.clone())
            .collect();
        ProfileAssessment {
            profile: profile.name.clone(),
            source: profile.source.clone(),
            ok: missing_required.is_empty(),
            missing_required,
            layers,
        }
    }
}

/// Python interpreters to look for, in order. Version-manager shims (pyenv)
/// are slow wrappers that exec elsewhere, so only real binaries count.
const PYTHON_CANDIDATES: &[&str] = &[
    "/usr/bin/python3",
    "/usr/local/bin/python3",
    "/usr/bin/python3.12",
    "/usr/bin/python3.11",
];

/// The first real Python interpreter on this host.
pub fn find_python() -> Option<PathBuf> {
    PYTHON_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Probe the host.
pub fn probe() -> HostSupport {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let cgroup_v2 = std::fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
        })
        .unwrap_or(false);
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut host = HostSupport {
        os: std::env::consts::OS.to_owned(),
        kernel,
        arch: std::env::consts::ARCH.to_owned(),
        running_as_root: false,
        landlock_abi: None,
        landlock_pinned_abi: 6,
        seccomp: false,
        user_namespaces: false,
        namespaces: false,
        mount_setattr: false,
        cgroup_v2,
        memory_cgroup: MemoryCgroup {
            problem: Some("no cgroups on this OS".into()),
            ..MemoryCgroup::default()
        },
        python: find_python(),
    };
    #[cfg(target_os = "linux")]
    {
        use super::linux::{landlock, namespaces, sys};
        host.running_as_root = nix::unistd::geteuid().is_root();
        host.landlock_abi = sys::landlock_abi();
        host.landlock_pinned_abi = landlock::PINNED_ABI;
        host.seccomp = probe_seccomp();
        let all: Vec<&str> = namespaces::ALL.iter().map(|(n, _)| *n).collect();
        host.user_namespaces = probe_clone(namespaces::flags(&all));
        host.namespaces = host.user_namespaces
            || (host.running_as_root
                && probe_clone(namespaces::flags(&["mount", "pid", "net", "ipc", "uts"])));
        host.mount_setattr = sys::mount_setattr_available();
        host.memory_cgroup = match super::linux::cgroup::memory_controller() {
            Ok((kind, dir)) => MemoryCgroup {
                kind: Some(kind.to_owned()),
                dir: Some(dir),
                problem: None,
            },
            Err(e) => MemoryCgroup {
                problem: Some(e.to_string()),
                ..MemoryCgroup::default()
            },
        };
    }
    host
}

#[cfg(target_os = "linux")]
fn probe_seccomp() -> bool {
    const SECCOMP_GET_ACTION_AVAIL: libc::c_uint = 2;
    let action: u32 = 0x0005_0000; // SECCOMP_RET_ERRNO
                                   // SAFETY: the kernel only reads the u32 behind the pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    rc == 0
}

/// Create the namespaces in a child that exits at once.
#[cfg(target_os = "linux")]
fn probe_clone(flags: libc::c_int) -> bool {
    match super::linux::sys::clone_fork(flags) {
        Ok(Some(pid)) => {
            let pid = nix::unistd::Pid::from_raw(pid);
            loop {
                match nix::sys::wait::waitpid(pid, None) {
                    Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => return true,
                    Err(nix::errno::Errno::EINTR) => continue,
                    _ => return false,
                }
            }
        }
        Ok(None) => {
            // SAFETY: the child only exits; _exit runs no handlers of the
            // (possibly multi-threaded) parent.
            unsafe { libc::_exit(0) }
        }
        Err(_) => false,
    }
}

/// What a cell gets under `profile` on `host` (Linux and other hosts; on
/// macOS the `doctor` command asks the macOS backend instead).
pub fn assess(profile: &Profile, host: &HostSupport) -> ProfileAssessment {
    let layers = &profile.layers;
    let linux = host.os == "linux";
    let mut out = Vec::new();
    let mut add = |layer: Layer, mode: LayerMode, available: bool, detail: String| {
        out.push(LayerAssessment {
            layer: layer.as_str().to_owned(),
            mode,
            available,
            detail,
        });
    };
    add(
        Layer::Hygiene,
        LayerMode::Required,
        linux,
        "fds 0-3, fixed environment, scratch cwd".into(),
    );
    add(
        Layer::Namespaces,
        layers.namespaces,
        host.namespaces && host.mount_setattr,
        if host.user_namespaces {
            "user, mount, pid, net, ipc, uts".into()
        } else if host.namespaces {
            "mount, pid, net, ipc, uts (no user namespace)".into()
        } else {
            "cannot create namespaces here".into()
        },
    );
    add(Layer::Rlimits, layers.rlimits, linux, {
        // The profile's table is a ceiling; session and call limits
        // only lower it.
        let c = &profile.limits.rlimits;
        let d = crate::plan::Rlimits::default().min(c);
        format!(
            "at most cpu {}s, memory {} bytes, {} processes, {} files, file size {} bytes \
                 (the profile's ceiling); with the default limits a cell gets cpu {}s, \
                 memory {} bytes, {} processes, {} files, file size {} bytes",
            c.cpu_seconds,
            c.memory_bytes,
            c.max_processes,
            c.max_open_files,
            c.max_file_size_bytes,
            d.cpu_seconds,
            d.memory_bytes,
            d.max_processes,
            d.max_open_files,
            d.max_file_size_bytes
        )
    });
    add(
        Layer::Privileges,
        layers.privileges,
        linux,
        if host.running_as_root {
            format!(
                "drop to uid {} gid {}, no capabilities, no_new_privs",
                profile.identity.uid, profile.identity.gid
            )
        } else {
            "own uid, no capabilities, no_new_privs".into()
        },
    );
    add(
        Layer::Landlock,
        layers.landlock,
        host.landlock_abi.is_some(),
        match host.landlock_abi {
            Some(abi) => format!(
                "kernel ABI {abi}, using ABI {}",
                abi.min(host.landlock_pinned_abi)
            ),
            None => "Landlock not available".into(),
        },
    );
    let allowed: usize = profile.seccomp.allow.iter().map(|g| g.syscalls.len()).sum();
    add(
        Layer::Seccomp,
        layers.seccomp,
        host.seccomp,
        format!(
            "allowlist of {allowed} syscalls, exec {:?}",
            profile.seccomp.exec
        ),
    );
    ProfileAssessment::new(profile, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_without(f: impl FnOnce(&mut HostSupport)) -> HostSupport {
        let mut h = HostSupport {
            os: "linux".into(),
            kernel: "6.18".into(),
            arch: "x86_64".into(),
            running_as_root: true,
            landlock_abi: Some(7),
            landlock_pinned_abi: 6,
            seccomp: true,
            user_namespaces: true,
            namespaces: true,
            mount_setattr: true,
            cgroup_v2: true,
            memory_cgroup: MemoryCgroup::default(),
            python: None,
        };
        f(&mut h);
        h
    }

    #[test]
    fn missing_required_layer_is_reported() {
        let p = Profile::load("python").unwrap();
        let a = assess(&p, &host_without(|h| h.landlock_abi = None));
        assert!(!a.ok);
        assert_eq!(a.missing_required, vec!["landlock".to_string()]);
        let a = assess(&p, &host_without(|_| {}));
        assert!(a.ok, "{a:?}");
    }

    #[test]
    fn missing_best_effort_layer_is_fine() {
        let p = Profile::load("rhai").unwrap();
        assert_eq!(p.layers.namespaces, LayerMode::BestEffort);
        let a = assess(
            &p,
            &host_without(|h| {
                h.namespaces = false;
                h.user_namespaces = false
            }),
        );
        assert!(a.ok);
        let ns = a.layers.iter().find(|l| l.layer == "namespaces").unwrap();
        assert!(!ns.available);
    }

    #[test]
    fn this_host_supports_every_layer() {
        let h = probe();
        assert_eq!(h.os, "linux");
        assert!(
            h.landlock_abi.is_some(),
            "this host has no Landlock; every shipped profile requires it"
        );
        assert!(h.seccomp, "this host has no seccomp filters");
        assert!(h.namespaces, "namespaces cannot be created on this host");
        assert!(h.mount_setattr, "mount_setattr is missing");
        for name in crate::profiles::BUILTIN_NAMES {
            let a = assess(&Profile::load(name).unwrap(), &h);
            assert!(a.ok, "{name}: {:?}", a.missing_required);
        }
        let json = serde_json::to_value(&h).unwrap();
        assert!(json.get("landlock_abi").is_some());
    }
}
