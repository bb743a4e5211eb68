//! Sandbox profiles: operator-editable descriptions of what a cell may do.
//!
//! A profile is commented TOML data (see `sandbox-profiles/*.toml`). It names
//! which OS layers are mandatory, the identity a cell runs as, its resource
//! limits, the host paths it can see and how, and the seccomp allowlist with a
//! reason for every group. The built-in profiles `rhai`, `python` and `shell`
//! are compiled in; any other argument to [`Profile::load`] is read as a path.
//!
//! Parsing is strict: unknown keys are errors, and [`Profile::from_toml`]
//! validates the whole document (absolute paths, known syscall and ioctl
//! names, non-empty reasons, no syscall both allowed and denied, …). Every
//! error names the source, the key and the problem.

mod python;

pub use python::PythonPackages;

use crate::plan::Rlimits;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// Names of the profiles compiled into the binary.
pub const BUILTIN_NAMES: &[&str] = &["rhai", "python", "shell"];

// The TOML sources (the tests compare them with the compiled-in form).
#[cfg(test)]
const BUILTIN_RHAI: &str = include_str!("../../sandbox-profiles/rhai.toml");
#[cfg(test)]
const BUILTIN_PYTHON: &str = include_str!("../../sandbox-profiles/python.toml");
#[cfg(test)]
const BUILTIN_SHELL: &str = include_str!("../../sandbox-profiles/shell.toml");

// The same documents as JSON, made by build.rs: they load several times
// faster, and `cellbox exec` loads one on every run.
const BUILTIN_RHAI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/rhai.json"));
const BUILTIN_PYTHON_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/python.json"));
const BUILTIN_SHELL_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/shell.json"));

/// Largest profile file we agree to read.
const MAX_PROFILE_BYTES: u64 = 1024 * 1024;

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("failed to read sandbox profile {source_name}: {error}")]
    Read {
        source_name: String,
        #[source]
        error: std::io::Error,
    },
    #[error("sandbox profile {source_name} is larger than {max} bytes")]
    TooLarge { source_name: String, max: u64 },
    #[error("failed to parse sandbox profile {source_name}: {error}")]
    Parse {
        source_name: String,
        #[source]
        error: toml::de::Error,
    },
    #[error("failed to load sandbox profile {source_name}: {error}")]
    Builtin {
        source_name: String,
        #[source]
        error: serde_json::Error,
    },
    #[error("invalid sandbox profile {source_name}: key `{key}`: {problem}")]
    Invalid {
        source_name: String,
        key: String,
        problem: String,
    },
}

/// How much a layer matters for a profile. Ordered from weakest to strongest,
/// so combining two requirements with `max` keeps the stricter one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerMode {
    /// Not applied at all.
    Off,
    /// Applied when the host allows it; reported when it is not.
    BestEffort,
    /// The cell does not run unless the layer is applied.
    Required,
}

impl LayerMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerMode::Off => "off",
            LayerMode::BestEffort => "best_effort",
            LayerMode::Required => "required",
        }
    }
}

/// Which layers a profile wants. Process hygiene (fds, environment, cwd) is
/// not listed: it is always applied and always required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layers {
    pub namespaces: LayerMode,
    pub rlimits: LayerMode,
    pub privileges: LayerMode,
    pub landlock: LayerMode,
    pub seccomp: LayerMode,
    /// The memory cgroup the supervisor puts the cell's processes in (they
    /// start in it; see the sandbox's `linux/cgroup.rs`). Not applied by
    /// the cell itself, so not in [`Layers::iter`]. Absent means
    /// best-effort.
    #[serde(default = "best_effort")]
    pub cgroup: LayerMode,
}

fn best_effort() -> LayerMode {
    LayerMode::BestEffort
}

impl Layers {
    /// `(name, mode)` pairs in the order the layers are applied.
    pub fn iter(&self) -> [(&'static str, LayerMode); 5] {
        [
            ("namespaces", self.namespaces),
            ("rlimits", self.rlimits),
            ("privileges", self.privileges),
            ("landlock", self.landlock),
            ("seccomp", self.seccomp),
        ]
    }
}

/// Who the cell runs as when cellbox itself runs as root. An unprivileged
/// cellbox keeps its own uid (mapped to itself in a user namespace), or
/// with `subordinate_ids` runs the cell as `uid`/`gid` mapped to the
/// user's first subordinate ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Host name inside the cell's UTS namespace.
    pub hostname: String,
    /// Without root: whether cells run as a subordinate id of the user.
    #[serde(default)]
    pub subordinate_ids: SubordinateIds,
}

/// Whether an unprivileged cellbox runs its cells as a subordinate id of
/// its user (`/etc/subuid`, `/etc/subgid`, `newuidmap`), see
/// `crate::sandbox::linux::subids`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubordinateIds {
    /// The cell keeps the user's own uid and gid.
    #[default]
    Off,
    /// The user's first subordinate uid and gid where the user has ranges
    /// and the map helpers are installed, else the user's own ids (the
    /// sandbox report says which).
    Auto,
}

/// Resource limits as written in a profile: one flat table, every key
/// required. The rlimits are a ceiling: a cell gets its session's (or
/// call's) limits, each lowered to this value where it is higher (see
/// [`crate::Limits::under_profile`]). `stack_bytes` is the cell's stack
/// limit as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    #[serde(flatten)]
    pub rlimits: Rlimits,
    pub stack_bytes: u64,
}

/// What a cell may do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathAccess {
    /// Read files and list directories.
    Read,
    /// Read, and execute files beneath (programs, the dynamic loader).
    Exec,
    /// Read, create, write, rename and delete beneath.
    ReadWrite,
}

/// One host path the cell can see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathRule {
    pub path: PathBuf,
    pub access: PathAccess,
    /// A missing optional path is skipped; a missing mandatory one is an error.
    #[serde(default)]
    pub optional: bool,
    pub why: String,
    /// Only on this architecture (`x86_64`, `aarch64`, ... as in
    /// `std::env::consts::ARCH`): a rule for another one is left out of the
    /// cell's plan, so its report does not list it as an absent path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
}

impl PathRule {
    /// Whether the rule applies on the architecture this binary runs on.
    pub fn applies_here(&self) -> bool {
        self.arch
            .as_deref()
            .is_none_or(|a| a == std::env::consts::ARCH)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Size of the private, writable `/tmp`; 0 means the cell gets no `/tmp`.
    pub tmp_bytes: u64,
    #[serde(default, rename = "path")]
    pub paths: Vec<PathRule>,
    /// Mount the cell's `/proc` without `hidepid=invisible`, so that a
    /// warm cell sees every process of its pool (other sessions' cells
    /// included) in `/proc`. Off by default; for diagnosis only.
    #[serde(default)]
    pub show_other_processes: bool,
}

/// Network access. Only `none` exists today: no interface but a down
/// loopback in a network namespace, TCP denied by Landlock, sockets denied by
/// seccomp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub mode: NetworkMode,
}

/// Whether and how often a cell may call `execve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Never (the backend runs in the worker process).
    None,
    /// Only the worker's own exec of the backend program: the filter accepts
    /// `execve` only with the worker's private pathname buffer.
    Once,
    /// Any program Landlock lets it execute.
    Any,
}

/// What a denied syscall does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyAction {
    /// Fail with EPERM (the default for everything not allowed).
    Errno,
    /// Kill the whole process with SIGSYS.
    Kill,
}

/// A group of syscalls with one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallGroup {
    pub group: String,
    pub why: String,
    pub syscalls: Vec<String>,
}

/// A group of syscalls denied on purpose. Everything not allowed is denied
/// anyway; listing a group documents it, lets tests walk it, and may choose a
/// harsher action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenyGroup {
    pub group: String,
    pub why: String,
    #[serde(default = "default_deny_action")]
    pub action: DenyAction,
    pub syscalls: Vec<String>,
}

fn default_deny_action() -> DenyAction {
    DenyAction::Errno
}

/// Allowed values of one filtered argument (ioctl requests, socket families,
/// prctl options), with a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgAllow {
    pub why: String,
    pub allow: Vec<String>,
}

/// The seccomp allowlist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeccompSpec {
    pub exec: ExecMode,
    /// `ioctl` requests allowed (compared on their low 32 bits).
    pub ioctl: ArgAllow,
    /// Address families `socket` may create.
    pub socket: ArgAllow,
    /// Address families `socketpair` may create.
    pub socketpair: ArgAllow,
    /// `prctl` options allowed.
    pub prctl: ArgAllow,
    #[serde(default)]
    pub allow: Vec<SyscallGroup>,
    #[serde(default)]
    pub deny: Vec<DenyGroup>,
}

/// A validated profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub layers: Layers,
    pub identity: Identity,
    pub limits: LimitsSpec,
    pub filesystem: Filesystem,
    pub network: Network,
    pub seccomp: SeccompSpec,
    /// Python package directories and preloaded modules (see
    /// [`PythonPackages`]); empty: the standard library only.
    #[serde(default, skip_serializing_if = "PythonPackages::is_empty")]
    pub python: PythonPackages,
    /// Where the profile came from (`built-in rhai` or a file path).
    #[serde(skip)]
    pub source: String,
}

/// Syscalls a profile may not list in an allow group because they are
/// allowed only through a dedicated key with argument filtering.
const ARG_FILTERED: &[(&str, &str)] = &[
    ("execve", "seccomp.exec"),
    ("ioctl", "seccomp.ioctl"),
    ("socket", "seccomp.socket"),
    ("socketpair", "seccomp.socketpair"),
    ("prctl", "seccomp.prctl"),
];

/// Syscalls no profile may allow: they would undo the sandbox.
const NEVER_ALLOWED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "personality",
    "execveat",
    "clone3",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
];

impl Profile {
    /// Load a built-in profile by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        if let Some(json) = builtin_json(name_or_path) {
            let source_name = format!("built-in {name_or_path}");
            let mut profile: Profile =
                serde_json::from_str(json).map_err(|error| ProfileError::Builtin {
                    source_name: source_name.clone(),
                    error,
                })?;
            profile.source = source_name;
            // Compiled in from the TOML source, which the unit tests
            // validate (`builtins_are_valid`): not validated again on every
            // start (it is a noticeable part of a one-shot `cellbox exec`).
            return Ok(profile);
        }
        let path = Path::new(name_or_path);
        let source_name = path.display().to_string();
        let read_err = |error| ProfileError::Read {
            source_name: source_name.clone(),
            error,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if meta.len() > MAX_PROFILE_BYTES {
            return Err(ProfileError::TooLarge {
                source_name,
                max: MAX_PROFILE_BYTES,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Profile::from_toml(&text, &source_name)
    }

    /// Parse and validate a profile document. `source_name` is used in errors.
    pub fn from_toml(text: &str, source_name: &str) -> Result<Profile, ProfileError> {
        let mut profile: Profile = toml::from_str(text).map_err(|error| ProfileError::Parse {
            source_name: source_name.to_owned(),
            error,
        })?;
        profile.source = source_name.to_owned();
        profile.validate()?;
        Ok(profile)
    }

    /// The profile's own rlimits, its ceiling. A cell gets its session's
    /// limits under them (see [`crate::Limits::under_profile`]); these are
    /// for a plan made from the profile alone (tests, tools).
    pub fn default_limits(&self) -> Rlimits {
        self.limits.rlimits
    }

    fn invalid(&self, key: impl Into<String>, problem: impl Into<String>) -> ProfileError {
        ProfileError::Invalid {
            source_name: self.source.clone(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    fn validate(&self) -> Result<(), ProfileError> {
        if self.name.trim().is_empty() {
            return Err(self.invalid("name", "must not be empty"));
        }
        let host = &self.identity.hostname;
        if host.is_empty()
            || host.len() > 64
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(self.invalid(
                "identity.hostname",
                "must be 1-64 characters of letters, digits, '-' and '.'",
            ));
        }
        if self.identity.uid == 0 || self.identity.gid == 0 {
            return Err(self.invalid(
                "identity",
                "uid and gid must not be 0: a cell never runs as root",
            ));
        }
        self.validate_limits()?;
        self.validate_paths()?;
        if let Some((key, problem)) = self.python.problem() {
            return Err(self.invalid(key, problem));
        }
        self.validate_seccomp()
    }

    fn validate_limits(&self) -> Result<(), ProfileError> {
        let l = &self.limits;
        let checks: [(&str, u64, u64); 6] = [
            ("limits.cpu_seconds", l.rlimits.cpu_seconds, 1),
            ("limits.memory_bytes", l.rlimits.memory_bytes, 16 << 20),
            ("limits.max_processes", l.rlimits.max_processes, 1),
            ("limits.max_open_files", l.rlimits.max_open_files, 8),
            (
                "limits.max_file_size_bytes",
                l.rlimits.max_file_size_bytes,
                0,
            ),
            ("limits.stack_bytes", l.stack_bytes, 128 << 10),
        ];
        for (key, value, min) in checks {
            if value < min {
                return Err(self.invalid(key, format!("{value} is below the minimum of {min}")));
            }
        }
        if l.stack_bytes >= l.rlimits.memory_bytes {
            return Err(self.invalid(
                "limits.stack_bytes",
                "must be smaller than limits.memory_bytes",
            ));
        }
        Ok(())
    }

    fn validate_paths(&self) -> Result<(), ProfileError> {
        for (i, rule) in self.filesystem.paths.iter().enumerate() {
            let key = format!("filesystem.path[{i}] ({})", rule.path.display());
            check_sandbox_path(&rule.path).map_err(|p| self.invalid(&key, p.to_string()))?;
            if rule.why.trim().is_empty() {
                return Err(self.invalid(format!("{key}.why"), "must say why the path is needed"));
            }
            if let Some(arch) = &rule.arch {
                if arch.is_empty() || !arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(self.invalid(
                        format!("{key}.arch"),
                        "must be an architecture name such as x86_64 or aarch64",
                    ));
                }
            }
            if rule.access == PathAccess::ReadWrite {
                return Err(self.invalid(
                    format!("{key}.access"),
                    "read_write host paths are not allowed: only the cell's scratch directory \
                     and private /tmp are writable",
                ));
            }
        }
        Ok(())
    }

    fn validate_seccomp(&self) -> Result<(), ProfileError> {
        let s = &self.seccomp;
        let mut allowed: BTreeMap<&str, &str> = BTreeMap::new();
        for (i, group) in s.allow.iter().enumerate() {
            let key = format!("seccomp.allow[{i}] ({})", group.group);
            if group.why.trim().is_empty() {
                return Err(self.invalid(format!("{key}.why"), "must say why the group is allowed"));
            }
            if group.syscalls.is_empty() {
                return Err(self.invalid(format!("{key}.syscalls"), "must not be empty"));
            }
            for name in &group.syscalls {
                self.check_syscall_name(&key, name)?;
                if let Some((_, via)) = ARG_FILTERED.iter().find(|(n, _)| n == name) {
                    return Err(self.invalid(
                        format!("{key}.syscalls"),
                        format!("`{name}` is allowed only through `{via}`"),
                    ));
                }
                if NEVER_ALLOWED.contains(&name.as_str()) {
                    return Err(self.invalid(
                        format!("{key}.syscalls"),
                        format!("`{name}` can never be allowed: it would undo the sandbox"),
                    ));
                }
                if let Some(other) = allowed.insert(name, &group.group) {
                    return Err(self.invalid(
                        format!("{key}.syscalls"),
                        format!("`{name}` is already allowed by group `{other}`"),
                    ));
                }
            }
        }
        for (i, group) in s.deny.iter().enumerate() {
            let key = format!("seccomp.deny[{i}] ({})", group.group);
            if group.why.trim().is_empty() {
                return Err(self.invalid(format!("{key}.why"), "must say why the group is denied"));
            }
            if group.syscalls.is_empty() {
                return Err(self.invalid(format!("{key}.syscalls"), "must not be empty"));
            }
            for name in &group.syscalls {
                self.check_syscall_name(&key, name)?;
                if let Some(other) = allowed.get(name.as_str()) {
                    return Err(self.invalid(
                        format!("{key}.syscalls"),
                        format!("`{name}` is denied here but allowed by group `{other}`"),
                    ));
                }
                if ARG_FILTERED.iter().any(|(n, _)| n == name) && group.action == DenyAction::Kill {
                    return Err(self.invalid(
                        format!("{key}.action"),
                        format!("`{name}` is argument-filtered and cannot be killed outright"),
                    ));
                }
            }
        }
        let arg_keys: [ArgCheck; 4] = [
            ("seccomp.ioctl", &s.ioctl, |n| ioctl_request(n).is_some()),
            ("seccomp.socket", &s.socket, |n| address_family(n).is_some()),
            ("seccomp.socketpair", &s.socketpair, |n| {
                address_family(n).is_some()
            }),
            ("seccomp.prctl", &s.prctl, |n| prctl_option(n).is_some()),
        ];
        for (key, spec, known) in arg_keys {
            if spec.why.trim().is_empty() {
                return Err(self.invalid(format!("{key}.why"), "must say why"));
            }
            for name in &spec.allow {
                if !known(name) {
                    return Err(
                        self.invalid(format!("{key}.allow"), format!("unknown name `{name}`"))
                    );
                }
            }
        }
        if s.ioctl.allow.iter().any(|n| n == "TIOCSTI") {
            return Err(self.invalid(
                "seccomp.ioctl.allow",
                "TIOCSTI injects input into a terminal and can never be allowed",
            ));
        }
        Ok(())
    }

    fn check_syscall_name(&self, key: &str, name: &str) -> Result<(), ProfileError> {
        if crate::plan::syscalls::is_known(name) {
            Ok(())
        } else {
            Err(self.invalid(
                format!("{key}.syscalls"),
                format!("unknown syscall `{name}`"),
            ))
        }
    }
}

/// A filtered-argument key, its value and the check for its names.
type ArgCheck<'a> = (&'static str, &'a ArgAllow, fn(&str) -> bool);

/// The TOML source of a built-in profile.
#[cfg(test)]
fn builtin_text(name: &str) -> Option<&'static str> {
    match name {
        "rhai" => Some(BUILTIN_RHAI),
        "python" => Some(BUILTIN_PYTHON),
        "shell" => Some(BUILTIN_SHELL),
        _ => None,
    }
}

/// A built-in profile as JSON (its TOML source converted at build time).
fn builtin_json(name: &str) -> Option<&'static str> {
    match name {
        "rhai" => Some(BUILTIN_RHAI_JSON),
        "python" => Some(BUILTIN_PYTHON_JSON),
        "shell" => Some(BUILTIN_SHELL_JSON),
        _ => None,
    }
}

/// What is wrong with a path the sandbox was to mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    #[error("must be an absolute path")]
    Relative,
    #[error("must not be `/`")]
    Root,
    #[error("must not contain `.` or `..`")]
    Dots,
    #[error("must not contain NUL")]
    Nul,
}

/// A path the sandbox will mount and hand to Landlock must be absolute,
/// normalized (no `.`/`..`), and not the root itself.
pub fn check_sandbox_path(path: &Path) -> Result<(), PathProblem> {
    if !path.is_absolute() {
        return Err(PathProblem::Relative);
    }
    if path.components().count() < 2 {
        return Err(PathProblem::Root);
    }
    if path
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(PathProblem::Dots);
    }
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(PathProblem::Nul);
    }
    Ok(())
}

/// ioctl requests a profile may name, as their 32-bit request numbers.
pub fn ioctl_request(name: &str) -> Option<u32> {
    // Values from <asm-generic/ioctls.h> (x86_64 and aarch64 share them).
    let v: u32 = match name {
        "TCGETS" => 0x5401,
        "TCSETS" => 0x5402,
        "TIOCGWINSZ" => 0x5413,
        "TIOCGPGRP" => 0x540F,
        "TIOCSTI" => 0x5412,
        "FIONREAD" => 0x541B,
        "FIONBIO" => 0x5421,
        "FIOCLEX" => 0x5451,
        "FIONCLEX" => 0x5450,
        "FIOASYNC" => 0x5452,
        _ => return None,
    };
    Some(v)
}

/// Socket address families a profile may name, as Linux numbers them
/// (the seccomp filter's arguments; the same on every host, so a profile
/// validates alike everywhere).
pub fn address_family(name: &str) -> Option<u32> {
    let v = match name {
        "unix" => 1,
        "inet" => 2,
        "inet6" => 10,
        "netlink" => 16,
        "packet" => 17,
        _ => return None,
    };
    Some(v)
}

/// prctl options a profile may name, as Linux numbers them (from
/// <linux/prctl.h>).
pub fn prctl_option(name: &str) -> Option<u32> {
    let v = match name {
        "PR_SET_PDEATHSIG" => 1,
        "PR_GET_PDEATHSIG" => 2,
        "PR_GET_DUMPABLE" => 3,
        "PR_SET_DUMPABLE" => 4,
        "PR_GET_KEEPCAPS" => 7,
        "PR_SET_NAME" => 15,
        "PR_GET_NAME" => 16,
        "PR_GET_SECCOMP" => 21,
        "PR_CAPBSET_READ" => 23,
        "PR_GET_TIMERSLACK" => 30,
        "PR_SET_NO_NEW_PRIVS" => 38,
        "PR_GET_NO_NEW_PRIVS" => 39,
        "PR_SET_VMA" => 0x5356_4d41,
        _ => return None,
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Linux numbers written out above are libc's.
    #[cfg(target_os = "linux")]
    #[test]
    fn linux_numbers_are_libcs() {
        let af = [
            ("unix", libc::AF_UNIX),
            ("inet", libc::AF_INET),
            ("inet6", libc::AF_INET6),
            ("netlink", libc::AF_NETLINK),
            ("packet", libc::AF_PACKET),
        ];
        for (n, v) in af {
            assert_eq!(address_family(n), u32::try_from(v).ok(), "{n}");
        }
        let pr = [
            ("PR_SET_NAME", libc::PR_SET_NAME),
            ("PR_GET_NAME", libc::PR_GET_NAME),
            ("PR_GET_DUMPABLE", libc::PR_GET_DUMPABLE),
            ("PR_SET_DUMPABLE", libc::PR_SET_DUMPABLE),
            ("PR_GET_NO_NEW_PRIVS", libc::PR_GET_NO_NEW_PRIVS),
            ("PR_SET_NO_NEW_PRIVS", libc::PR_SET_NO_NEW_PRIVS),
            ("PR_GET_SECCOMP", libc::PR_GET_SECCOMP),
            ("PR_CAPBSET_READ", libc::PR_CAPBSET_READ),
            ("PR_GET_KEEPCAPS", libc::PR_GET_KEEPCAPS),
            ("PR_GET_PDEATHSIG", libc::PR_GET_PDEATHSIG),
            ("PR_SET_PDEATHSIG", libc::PR_SET_PDEATHSIG),
            ("PR_GET_TIMERSLACK", libc::PR_GET_TIMERSLACK),
        ];
        for (n, v) in pr {
            assert_eq!(prctl_option(n), u32::try_from(v).ok(), "{n}");
        }
    }

    #[test]
    fn builtin_json_is_the_toml_source() {
        for name in BUILTIN_NAMES {
            let compiled = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let text = builtin_text(name).unwrap_or_else(|| panic!("{name}: no source"));
            let source = Profile::from_toml(text, &format!("built-in {name}"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(compiled, source, "{name}");
        }
    }

    #[test]
    fn builtins_are_valid() {
        for name in BUILTIN_NAMES {
            let p = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn builtins_load_and_validate() {
        for name in BUILTIN_NAMES {
            let p = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&p.name, name);
            assert_eq!(p.source, format!("built-in {name}"));
            assert_eq!(p.layers.seccomp, LayerMode::Required);
            assert_eq!(p.layers.landlock, LayerMode::Required);
            assert_eq!(p.network.mode, NetworkMode::None);
        }
    }

    #[test]
    fn builtin_exec_modes() {
        assert_eq!(Profile::load("rhai").unwrap().seccomp.exec, ExecMode::None);
        assert_eq!(
            Profile::load("python").unwrap().seccomp.exec,
            ExecMode::Once
        );
        assert_eq!(Profile::load("shell").unwrap().seccomp.exec, ExecMode::Any);
    }

    #[test]
    fn default_limits_come_from_the_profile() {
        let p = Profile::load("python").unwrap();
        let l = p.default_limits();
        assert_eq!(l.cpu_seconds, p.limits.rlimits.cpu_seconds);
        assert_eq!(l.memory_bytes, p.limits.rlimits.memory_bytes);
        assert_eq!(l.max_processes, p.limits.rlimits.max_processes);
        assert_eq!(l.max_open_files, p.limits.rlimits.max_open_files);
        assert_eq!(l.max_file_size_bytes, p.limits.rlimits.max_file_size_bytes);
    }

    /// A profile's `[limits]`, in TOML and JSON (the compiled built-ins):
    /// six keys, all required, no others.
    #[test]
    fn the_limits_table_shape_stays() {
        let l = Profile::load("rhai").unwrap().limits;
        let text = "cpu_seconds = 30\nmemory_bytes = 536870912\nmax_processes = 1\n\
                    max_open_files = 32\nmax_file_size_bytes = 16777216\nstack_bytes = 8388608\n";
        assert_eq!(toml::to_string(&l).unwrap(), text);
        assert_eq!(toml::from_str::<LimitsSpec>(text).unwrap(), l);
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            concat!(
                r#"{"cpu_seconds":30,"memory_bytes":536870912,"max_processes":1,"#,
                r#""max_open_files":32,"max_file_size_bytes":16777216,"stack_bytes":8388608}"#
            )
        );
        for (i, key) in text.lines().enumerate() {
            let key = key.split(' ').next().unwrap();
            let without: String = text
                .lines()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            let e = toml::from_str::<LimitsSpec>(&without).unwrap_err();
            assert!(
                e.to_string().contains(&format!("missing field `{key}`")),
                "{e}"
            );
        }
        let e = toml::from_str::<LimitsSpec>(&format!("{text}max_thread = 1\n")).unwrap_err();
        assert!(e.to_string().contains("unknown field `max_thread`"), "{e}");
    }

    fn rhai_text() -> String {
        BUILTIN_RHAI.to_owned()
    }

    fn invalid_key(text: &str) -> (String, String) {
        match Profile::from_toml(text, "test.toml") {
            Err(ProfileError::Invalid {
                source_name,
                key,
                problem,
            }) => {
                assert_eq!(source_name, "test.toml");
                (key, problem)
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn unknown_key_is_a_parse_error_naming_the_file_and_key() {
        let text = rhai_text().replace("[identity]", "[identity]\nshell = \"/bin/sh\"");
        let err = Profile::from_toml(&text, "test.toml").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProfileError::Parse { .. }), "{msg}");
        assert!(msg.contains("test.toml"), "{msg}");
        assert!(msg.contains("shell"), "{msg}");
    }

    #[test]
    fn the_cgroup_layer_is_best_effort_unless_said() {
        for name in BUILTIN_NAMES {
            let p = Profile::load(name).unwrap();
            assert_eq!(p.layers.cgroup, LayerMode::BestEffort, "{name}");
        }
        let without = rhai_text().replace("cgroup = \"best_effort\"", "");
        assert!(!without.contains("cgroup ="));
        let p = Profile::from_toml(&without, "test.toml").unwrap();
        assert_eq!(p.layers.cgroup, LayerMode::BestEffort);
        let off = rhai_text().replace("cgroup = \"best_effort\"", "cgroup = \"off\"");
        let p = Profile::from_toml(&off, "test.toml").unwrap();
        assert_eq!(p.layers.cgroup, LayerMode::Off);
    }

    #[test]
    fn unknown_layer_mode_is_rejected() {
        let text = rhai_text().replace("seccomp = \"required\"", "seccomp = \"sometimes\"");
        let err = Profile::from_toml(&text, "test.toml").unwrap_err();
        assert!(matches!(err, ProfileError::Parse { .. }), "{err}");
    }

    #[test]
    fn unknown_syscall_is_rejected() {
        let text = rhai_text().replace("\"exit_group\"", "\"exit_grup\"");
        let (key, problem) = invalid_key(&text);
        assert!(key.starts_with("seccomp.allow["), "{key}");
        assert!(problem.contains("exit_grup"), "{problem}");
    }

    #[test]
    fn arg_filtered_syscall_in_allow_group_is_rejected() {
        let text = rhai_text().replace("\"exit_group\"", "\"exit_group\", \"ioctl\"");
        let (_, problem) = invalid_key(&text);
        assert!(problem.contains("seccomp.ioctl"), "{problem}");
    }

    #[test]
    fn dangerous_syscall_in_allow_group_is_rejected() {
        let text = rhai_text().replace("\"exit_group\"", "\"exit_group\", \"ptrace\"");
        let (_, problem) = invalid_key(&text);
        assert!(problem.contains("ptrace"), "{problem}");
    }

    #[test]
    fn duplicate_allow_is_rejected() {
        let text = rhai_text().replace("\"exit_group\"", "\"exit_group\", \"exit_group\"");
        let (_, problem) = invalid_key(&text);
        assert!(problem.contains("already allowed"), "{problem}");
    }

    #[test]
    fn tiocsti_can_never_be_allowed() {
        let p = Profile::load("python").unwrap();
        let mut text = toml::to_string(&p).unwrap();
        text = text.replace("\"TCGETS\"", "\"TCGETS\", \"TIOCSTI\"");
        let (key, _) = invalid_key(&text);
        assert_eq!(key, "seccomp.ioctl.allow");
    }

    #[test]
    fn relative_path_is_rejected() {
        let p = Profile::load("python").unwrap();
        let text = toml::to_string(&p)
            .unwrap()
            .replace("path = \"/usr\"", "path = \"usr\"");
        let (key, problem) = invalid_key(&text);
        assert!(key.starts_with("filesystem.path["), "{key}");
        assert!(problem.contains("absolute"), "{problem}");
    }

    #[test]
    fn a_path_for_another_architecture_is_left_out_of_the_plan() {
        let p = Profile::load("python").unwrap();
        let here = std::env::consts::ARCH;
        let text = toml::to_string(&p).unwrap();
        // Every dynamic loader rule names its architecture.
        let loaders: Vec<_> = p
            .filesystem
            .paths
            .iter()
            .filter(|r| r.path.to_string_lossy().contains("ld-linux"))
            .collect();
        assert!(loaders.len() >= 2, "{loaders:?}");
        assert!(loaders.iter().all(|r| r.arch.is_some()), "{loaders:?}");
        // What applies here (the plan keeps exactly these; the sandbox's
        // plan test checks that).
        let applies: Vec<_> = p
            .filesystem
            .paths
            .iter()
            .filter(|r| r.applies_here())
            .collect();
        assert!(applies
            .iter()
            .all(|r| r.arch.is_none() || r.arch.as_deref() == Some(here)));
        assert!(applies.len() < p.filesystem.paths.len());
        // A rule without `arch` applies everywhere; a bad name is refused.
        let bad = text.replacen("arch = \"aarch64\"", "arch = \"arm/64\"", 1);
        let (key, _) = invalid_key(&bad);
        assert!(key.ends_with(".arch"), "{key}");
    }

    #[test]
    fn writable_host_path_is_rejected() {
        let p = Profile::load("python").unwrap();
        let text = toml::to_string(&p).unwrap().replacen(
            "access = \"read\"",
            "access = \"read_write\"",
            1,
        );
        let (key, _) = invalid_key(&text);
        assert!(key.ends_with(".access"), "{key}");
    }

    #[test]
    fn root_uid_is_rejected() {
        let text = rhai_text().replace("uid = 65534", "uid = 0");
        let (key, _) = invalid_key(&text);
        assert_eq!(key, "identity");
    }

    #[test]
    fn missing_why_is_rejected() {
        let p = Profile::load("rhai").unwrap();
        let mut p2 = p.clone();
        p2.seccomp.allow[0].why = " ".into();
        let text = toml::to_string(&p2).unwrap();
        let (key, _) = invalid_key(&text);
        assert!(key.ends_with(".why"), "{key}");
    }

    #[test]
    fn missing_file_names_the_file() {
        let err = Profile::load("/nonexistent/profile.toml").unwrap_err();
        assert!(matches!(err, ProfileError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/profile.toml"));
    }

    #[test]
    fn profile_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.toml");
        std::fs::write(&path, BUILTIN_SHELL).unwrap();
        let p = Profile::load(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, "shell");
        assert_eq!(p.source, path.display().to_string());
    }

    #[test]
    fn layer_modes_order_strictest_last() {
        assert!(LayerMode::Required > LayerMode::BestEffort);
        assert!(LayerMode::BestEffort > LayerMode::Off);
        assert_eq!(
            LayerMode::BestEffort.max(LayerMode::Required),
            LayerMode::Required
        );
    }
}
