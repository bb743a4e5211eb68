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
    /// The container this runs in, as far as it can tell (`docker`,
    /// `podman`, `kubernetes`, or what PID 1's `container=` says).
    pub container: Option<String>,
    /// Without root: the user's subordinate ids that cells of a profile
    /// with `identity.subordinate_ids = "auto"` run as, or why there are
    /// none (those cells then keep the user's own ids). `None` as root.
    pub subordinate_ids: Option<Result<String, String>>,
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

/// The container this process runs in: Kubernetes (its service variables),
/// Podman (`/run/.containerenv`), Docker (`/.dockerenv`), else what PID
/// 1's environment says (`container=lxc`, `systemd-nspawn`, …), else a
/// cgroup path a runtime names.
pub fn detect_container() -> Option<String> {
    let exists = |p: &str| std::path::Path::new(p).exists();
    let pid1_env = std::fs::read("/proc/1/environ").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    container_from(
        std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        exists("/run/.containerenv"),
        exists("/.dockerenv"),
        &pid1_env,
        &cgroup,
    )
}

/// [`detect_container`] on given facts (pure, for the tests).
fn container_from(
    kubernetes: bool,
    containerenv: bool,
    dockerenv: bool,
    pid1_env: &[u8],
    cgroup: &str,
) -> Option<String> {
    if kubernetes || cgroup.contains("kubepods") {
        return Some("kubernetes".into());
    }
    if containerenv {
        return Some("podman".into());
    }
    if dockerenv || cgroup.contains("/docker/") || cgroup.contains("docker-") {
        return Some("docker".into());
    }
    pid1_env
        .split(|b| *b == 0)
        .filter_map(|v| v.strip_prefix(b"container="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .find(|v| !v.is_empty())
}

/// For each guarantee this host does not give, the one setting that would
/// give it, for the kind of host it is (a container's runtime settings,
/// or the host's).
pub fn advice(host: &HostSupport, session_groups: bool) -> Vec<String> {
    let mut out = Vec::new();
    let container = host.container.as_deref();
    let runtime = |docker: &str, kubernetes: &str, host_setting: &str| -> String {
        match container {
            Some("docker") | Some("podman") => docker.to_owned(),
            Some("kubernetes") => kubernetes.to_owned(),
            Some(_) | None => host_setting.to_owned(),
        }
    };
    if host.landlock_abi.is_none() {
        out.push(
            "landlock: Linux 5.13 or later with landlock in the kernel's LSM list (boot with \
             lsm=landlock,...); a container has its host's kernel, so it is the host's to give"
                .into(),
        );
    }
    if !host.seccomp {
        out.push("seccomp: a kernel built with CONFIG_SECCOMP_FILTER".into());
    }
    if !host.user_namespaces {
        out.push(format!(
            "user namespaces: {}",
            runtime(
                "run the container with --security-opt seccomp=container/seccomp.json (the \
                 default profile refuses unshare and clone of namespaces) and --security-opt \
                 apparmor=unconfined (docker-default refuses mount); see docs/containers.md",
                "the pod's securityContext: seccompProfile {type: Localhost, localhostProfile: \
                 cellbox-seccomp.json} and appArmorProfile {type: Unconfined}; see \
                 docs/containers.md",
                "sysctl -w user.max_user_namespaces=15000 (and, on Ubuntu 23.10 or later, \
                 kernel.apparmor_restrict_unprivileged_userns=0)",
            )
        ));
    }
    if !host.namespaces && host.user_namespaces {
        out.push(format!(
            "namespaces: {}",
            runtime(
                "--security-opt systempaths=unconfined (a masked /proc cannot be mounted anew \
                 in a PID namespace)",
                "securityContext.procMount: Unmasked (with hostUsers: false)",
                "a kernel with mount, PID, network, IPC and UTS namespaces",
            )
        ));
    }
    if host.memory_cgroup.kind.is_none() || !session_groups {
        let what = if host.memory_cgroup.kind.is_none() {
            "memory bound for all cells, and sessions apart"
        } else {
            "sessions apart (a cgroup per session and per cell)"
        };
        out.push(format!(
            "{what}: {}",
            cgroup_setting(host.running_as_root, container)
        ));
    }
    out
}

/// The one setting that gives cells' cgroups (a bound for all cells, a
/// group per session and per cell) to a supervisor running as root or not,
/// in a container of kind `container` or on a host.
pub fn cgroup_setting(root: bool, container: Option<&str>) -> String {
    let (docker, kubernetes, host) = if root {
        (
            "run the container with --cgroupns=private and /sys/fs/cgroup writable (cgroup \
             v2; Docker mounts it read-only unless --privileged); see docs/containers.md",
            "a cgroup v2 node whose runtime mounts the pod's /sys/fs/cgroup writable; see \
             docs/containers.md",
            "the memory and pids controllers where this process's cgroup is: cgroup v2 (Linux \
             5.14+), or cgroup v1 with memory, pids and cpuacct hierarchies",
        )
    } else {
        (
            "run cellbox as root inside a user-namespaced container (rootless Podman, or \
             --userns=auto) with --cgroupns=private; see docs/containers.md",
            "run cellbox as root in the pod's own user namespace (hostUsers: false); see \
             docs/containers.md",
            "start it in a delegated cgroup v2 subtree: systemd-run --user --scope -p \
             Delegate=yes cellbox serve ...",
        )
    };
    match container {
        Some("docker") | Some("podman") => docker,
        Some("kubernetes") => kubernetes,
        Some(_) | None => host,
    }
    .to_owned()
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
        container: detect_container(),
        subordinate_ids: None,
    };
    #[cfg(target_os = "linux")]
    {
        use super::linux::{landlock, namespaces, sys};
        host.running_as_root = nix::unistd::geteuid().is_root();
        if !host.running_as_root {
            host.subordinate_ids = Some(super::linux::subids::lookup().map(|m| {
                format!(
                    "uid {} and gid {} (the first of the user's ranges)",
                    m.uid, m.gid
                )
            }));
        }
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
            container: None,
            subordinate_ids: None,
        };
        f(&mut h);
        h
    }

    #[test]
    fn containers_are_told_apart() {
        assert_eq!(
            container_from(true, false, true, b"", "0::/").as_deref(),
            Some("kubernetes")
        );
        assert_eq!(
            container_from(
                false,
                false,
                false,
                b"",
                "4:memory:/kubepods/burstable/pod1/x\n"
            )
            .as_deref(),
            Some("kubernetes")
        );
        assert_eq!(
            container_from(false, true, false, b"container=podman\0", "0::/").as_deref(),
            Some("podman")
        );
        assert_eq!(
            container_from(false, false, true, b"", "0::/").as_deref(),
            Some("docker")
        );
        assert_eq!(
            container_from(false, false, false, b"PATH=/bin\0container=lxc\0", "0::/").as_deref(),
            Some("lxc")
        );
        assert_eq!(
            container_from(false, false, false, b"PATH=/bin\0", "0::/init.scope\n"),
            None
        );
    }

    #[test]
    fn each_missing_guarantee_gets_the_setting_for_its_kind_of_host() {
        let mut host = host_without(|h| {
            h.user_namespaces = false;
            h.memory_cgroup = MemoryCgroup::default();
        });
        host.container = Some("docker".into());
        let a = advice(&host, false);
        assert!(
            a.iter().any(|l| l.starts_with("user namespaces: ")
                && l.contains("seccomp=container/seccomp.json")),
            "{a:?}"
        );
        assert!(a.iter().any(|l| l.contains("memory bound")), "{a:?}");
        host.container = Some("kubernetes".into());
        let a = advice(&host, false);
        assert!(a.iter().any(|l| l.contains("localhostProfile")), "{a:?}");
        host.container = None;
        host.running_as_root = false;
        let a = advice(&host, false);
        assert!(
            a.iter()
                .any(|l| l.contains("systemd-run --user --scope -p Delegate=yes")),
            "{a:?}"
        );
        // Nothing missing, nothing said.
        let full = host_without(|_| {});
        let mut full = full;
        full.memory_cgroup.kind = Some("cgroup v2 memory".into());
        assert!(advice(&full, true).is_empty(), "{:?}", advice(&full, true));
    }

    /// The container's seccomp profile (container/seccomp.json) allows
    /// every syscall this table knows but those it names as never needed
    /// by cellbox (each denied for a reason given in docs/containers.md),
    /// denies what it does not know, and so keeps what cellbox needs:
    /// namespaces, mounts, Landlock and seccomp of its own.
    #[test]
    fn the_container_seccomp_profile_denies_only_what_cellbox_never_needs() {
        const DENIED: &[&str] = &[
            "_sysctl",
            "acct",
            "add_key",
            "adjtimex",
            "afs_syscall",
            "bpf",
            "clock_adjtime",
            "clock_settime",
            "delete_module",
            "fanotify_init",
            "finit_module",
            "getpmsg",
            "init_module",
            "ioperm",
            "iopl",
            "kcmp",
            "kexec_file_load",
            "kexec_load",
            "keyctl",
            "lookup_dcookie",
            "name_to_handle_at",
            "nfsservctl",
            "open_by_handle_at",
            "perf_event_open",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
            "putpmsg",
            "quotactl",
            "quotactl_fd",
            "reboot",
            "request_key",
            "security",
            "settimeofday",
            "swapoff",
            "swapon",
            "sysfs",
            "syslog",
            "tuxcall",
            "uselib",
            "userfaultfd",
            "ustat",
            "vserver",
        ];
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("container/seccomp.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let profile: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        let rules = profile["syscalls"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "one allowlist, no argument rules");
        assert_eq!(rules[0]["action"], "SCMP_ACT_ALLOW");
        let allowed: Vec<&str> = rules[0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for name in crate::plan::syscalls::ALL_NAMES {
            assert!(
                allowed.contains(name) != DENIED.contains(name),
                "{name}: allowed {} denied {}",
                allowed.contains(name),
                DENIED.contains(name)
            );
        }
        for name in &allowed {
            assert!(
                crate::plan::syscalls::is_known(name),
                "{name} is no syscall"
            );
        }
        for needed in [
            "clone",
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "mount_setattr",
            "open_tree",
            "move_mount",
            "landlock_create_ruleset",
            "landlock_add_rule",
            "landlock_restrict_self",
            "seccomp",
            "prlimit64",
            "pidfd_open",
            "pidfd_send_signal",
        ] {
            assert!(allowed.contains(&needed), "{needed} is needed");
        }
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
