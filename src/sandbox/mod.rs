//! Every syscall-level layer of the worker sandbox. This module tree is the
//! only place in cellbox where `unsafe` is allowed.
//!
//! The shape follows "build the policy, then apply it": [`SandboxPlan`] is
//! plain data the supervisor builds from a profile and sends to the worker in
//! the `setup` frame; [`enter`] applies it inside the worker, in order, and
//! returns a [`SandboxReport`] of what was actually enforced. A one-shot CLI
//! run (`cellbox exec`) skips the worker: [`oneshot::spawn`] clones the cell
//! from the still single-threaded CLI, and the cell applies the same layers
//! with the same code.
//!
//! The translation steps (plan → mount list, Landlock rules, rlimit table,
//! seccomp program) are pure functions in `linux/` and are unit-tested
//! without privileges; the `apply_*` functions next to them do the side
//! effects. Tests that change process state run in a forked child
//! (`testing::in_child`), never in the test harness itself.
//!
//! # The environment of a cell
//! [`enter`] clears the environment and sets exactly:
//! `PATH=/usr/local/bin:/usr/bin:/bin`, `HOME=<scratch>`, `LANG=C.UTF-8`,
//! `LC_ALL=C.UTF-8`, and `TMPDIR=/tmp` when the profile gives a private
//! `/tmp` (otherwise `TMPDIR=<scratch>`). Nothing else survives, including
//! whatever the supervisor passed.

use crate::plan::Rlimits;
use crate::profiles::{LayerMode, Layers, PathAccess, PathRule, Profile, SeccompSpec};
pub use jail::Entry;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[cfg(target_os = "linux")]
pub mod beneath;
pub mod compat;
pub mod doctor;
pub mod forkserver;
pub mod jail;
pub mod memory;
#[cfg(target_os = "linux")]
pub mod oneshot;
pub mod packet;
pub mod process;
pub mod seatbelt;
pub mod spawn;
/// The syscall tables live with the plan's data; here for the layers.
pub use crate::plan::syscalls;
#[cfg(unix)]
pub mod tree;
#[cfg(target_os = "linux")]
pub mod zygote;

#[cfg(target_os = "linux")]
pub mod linux;

#[cfg(test)]
#[cfg(target_os = "linux")]
pub(crate) mod testing;

/// The fd on which a sandboxed process finds its channel to the supervisor
/// (the worker's protocol channel, a pool's control channel, a one-shot
/// cell's report socket): hygiene keeps it, the spawn code places it.
pub const PROTOCOL_FD: i32 = 3;

/// A mandatory layer could not be applied: its name and why, as the
/// sandboxed process reports it to its supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxFailure {
    pub layer: String,
    pub message: String,
}

impl From<&LayerError> for SandboxFailure {
    fn from(e: &LayerError) -> SandboxFailure {
        SandboxFailure {
            layer: e.layer.as_str().to_owned(),
            message: e.message(),
        }
    }
}

/// Everything the worker needs to sandbox itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxPlan {
    /// Profile name, for reports.
    pub profile: String,
    /// The cell's scratch directory: its cwd and the only writable place
    /// besides a private `/tmp`. Must exist; the worker makes it owned by the
    /// cell's uid.
    pub scratch: PathBuf,
    /// The scratch directory is not a host directory but one made in the
    /// cell's new root, owned by the cell's ids: a directory of the private
    /// `/tmp` when `scratch` is directly in `/tmp`, else a tmpfs of its own
    /// as large as the private `/tmp` (or, without one, the largest file
    /// the cell may write). For one-shot cells, whose scratch ends with
    /// them. Needs the mount namespace.
    #[serde(default)]
    pub scratch_in_cell: bool,
    pub limits: Rlimits,
    /// Extra read-only paths the backend needs (e.g. the Python prefix).
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Programs (or directories of programs) the backend may execute.
    #[serde(default)]
    pub exec: Vec<PathBuf>,
    /// Which layers are required, best effort or off.
    pub layers: Layers,
    /// uid/gid the cell runs as when the worker starts as root.
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    /// The profile's host paths (system libraries, loader, config files).
    pub paths: Vec<PathRule>,
    /// Size of the private `/tmp` (0: none).
    pub tmp_bytes: u64,
    /// `/proc` shows processes the cell may not ptrace-read (see
    /// [`crate::profiles::Filesystem::show_other_processes`]).
    #[serde(default)]
    pub show_other_processes: bool,
    pub stack_bytes: u64,
    /// Boxed: it is most of the plan's size, and the plan travels inside a
    /// message enum.
    pub seccomp: Box<SeccompSpec>,
}

impl SandboxPlan {
    /// The plan for one cell under `profile`. The supervisor may push more
    /// paths onto `read_only` and `exec` before sending it.
    pub fn new(profile: &Profile, scratch: PathBuf, limits: Rlimits) -> SandboxPlan {
        SandboxPlan {
            profile: profile.name.clone(),
            scratch,
            scratch_in_cell: false,
            limits,
            read_only: Vec::new(),
            exec: Vec::new(),
            layers: profile.layers,
            uid: profile.identity.uid,
            gid: profile.identity.gid,
            hostname: profile.identity.hostname.clone(),
            // Rules for another architecture (its dynamic loader) are left out.
            paths: profile
                .filesystem
                .paths
                .iter()
                .filter(|r| r.applies_here())
                .cloned()
                .collect(),
            tmp_bytes: profile.filesystem.tmp_bytes,
            show_other_processes: profile.filesystem.show_other_processes,
            stack_bytes: profile.limits.stack_bytes,
            seccomp: Box::new(profile.seccomp.clone()),
        }
    }

    /// Size of a scratch directory made in the cell with a tmpfs of its own
    /// (see `scratch_in_cell`).
    pub fn scratch_in_cell_bytes(&self) -> u64 {
        if self.tmp_bytes > 0 {
            self.tmp_bytes
        } else {
            self.limits.max_file_size_bytes
        }
    }

    /// Every host path the cell sees, with its access: the profile's paths,
    /// then `read_only`, then `exec`. The scratch directory, `/tmp`, `/proc`
    /// and the device nodes are handled separately.
    pub fn path_rules(&self) -> Vec<PathRule> {
        let mut rules = self.paths.clone();
        rules.extend(self.read_only.iter().map(|p| PathRule {
            path: p.clone(),
            access: PathAccess::Read,
            optional: false,
            why: "requested by the supervisor for the backend".into(),
            arch: None,
        }));
        rules.extend(self.exec.iter().map(|p| PathRule {
            path: p.clone(),
            access: PathAccess::Exec,
            optional: false,
            why: "program the backend executes".into(),
            arch: None,
        }));
        rules
    }
}

/// One step of the sandbox (DESIGN §3), by the name reports, errors and
/// `doctor` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Closed fds, a clean environment, the parent-death signal.
    Hygiene,
    /// The paths the plan names, resolved before anything is applied.
    Filesystem,
    /// User, mount, PID, network, IPC and UTS namespaces.
    Namespaces,
    /// Resource limits.
    Rlimits,
    /// Dropped ids, capabilities and `no_new_privs`.
    Privileges,
    /// The Landlock filesystem (and network, signal, socket) domain.
    Landlock,
    /// The seccomp filter.
    Seccomp,
    /// The cell's memory cgroup.
    Cgroup,
    /// Replacing the sandboxed process with the program it runs.
    Exec,
    /// The SBPL policy macOS's `sandbox-exec` applied before the worker
    /// started (see [`crate::macos`]).
    SandboxExec,
}

impl Layer {
    /// Every layer, in the order they are applied.
    /// `SandboxExec`, the one layer of another platform, comes last.
    pub const ALL: [Layer; 10] = [
        Layer::Hygiene,
        Layer::Filesystem,
        Layer::Namespaces,
        Layer::Rlimits,
        Layer::Privileges,
        Layer::Landlock,
        Layer::Seccomp,
        Layer::Cgroup,
        Layer::Exec,
        Layer::SandboxExec,
    ];

    /// The stable name (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Hygiene => "hygiene",
            Layer::Filesystem => "filesystem",
            Layer::Namespaces => "namespaces",
            Layer::Rlimits => "rlimits",
            Layer::Privileges => "privileges",
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
            Layer::Cgroup => "cgroup",
            Layer::Exec => "exec",
            Layer::SandboxExec => "sandbox_exec",
        }
    }

    /// The layer with this name.
    pub fn from_name(name: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.as_str() == name)
    }
}

impl AsRef<str> for Layer {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One layer's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerReport {
    pub name: String,
    pub applied: bool,
    /// What the profile asked for (`required`, `best_effort`, `off`).
    #[serde(default = "default_mode")]
    pub mode: LayerMode,
    #[serde(default)]
    pub detail: String,
}

fn default_mode() -> LayerMode {
    LayerMode::Required
}

/// What the worker actually got.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxReport {
    pub profile: String,
    pub layers: Vec<LayerReport>,
    #[serde(default)]
    pub landlock_abi: Option<u32>,
    #[serde(default)]
    pub namespaces: Vec<String>,
}

impl SandboxReport {
    pub(crate) fn push(&mut self, layer: Layer, mode: LayerMode, applied: bool, detail: String) {
        self.layers.push(LayerReport {
            name: layer.as_str().to_owned(),
            applied,
            mode,
            detail,
        });
    }

    /// The report entry for `layer` (a [`Layer`] or its name), if it was
    /// reached.
    pub fn layer(&self, layer: impl AsRef<str>) -> Option<&LayerReport> {
        let name = layer.as_ref();
        self.layers.iter().find(|l| l.name == name)
    }
}

/// Why a layer could not be applied: the leaf error (a system call's, a
/// compiler's) or a message.
pub type LayerCause = Box<dyn std::error::Error + Send + Sync>;

/// A layer that could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("failed to apply the {layer} layer: {cause}")]
pub struct LayerError {
    pub layer: Layer,
    #[source]
    pub cause: LayerCause,
}

/// The error of entering the sandbox: the layer that failed and why.
pub type SandboxError = LayerError;

impl LayerError {
    /// `layer` failed with `cause`: a leaf error, or a message (`&str`,
    /// `String`).
    pub(crate) fn new(layer: Layer, cause: impl Into<LayerCause>) -> LayerError {
        LayerError {
            layer,
            cause: cause.into(),
        }
    }

    /// What went wrong, without the layer's name.
    pub fn message(&self) -> String {
        self.cause.to_string()
    }
}

/// Apply the plan to the calling process as `entry` ([`Entry::Worker`],
/// [`Entry::Zygote`] or [`Entry::ForkServer`]), in the order of DESIGN §3:
/// hygiene → namespaces → rlimits → privileges → Landlock → seccomp, each
/// layer as the table in [`jail`] says for `entry` (the fork server leaves
/// rlimits and seccomp to the cells it forks).
///
/// Call once, single-threaded, before any untrusted code runs. With a PID
/// namespace this forks: it returns only in the process that runs the cell
/// (PID 1 of the new namespace); the original process waits for it and exits
/// the same way, never returning.
#[cfg(target_os = "linux")]
pub fn enter(plan: &SandboxPlan, entry: Entry) -> Result<SandboxReport, SandboxError> {
    linux::enter(plan, entry)
}

/// The per-cell layers in a child forked from a pool process: its rlimits, a
/// nested Landlock domain with no file or network access, seccomp.
#[cfg(target_os = "linux")]
pub fn enter_pool_child(
    plan: &SandboxPlan,
    pool: &SandboxReport,
) -> Result<SandboxReport, SandboxError> {
    linux::enter_pool_child(plan, pool)
}

/// Prepare, in a pool process, what each of its children applies (see
/// [`enter_pool_child`]).
#[cfg(target_os = "linux")]
pub fn prepare_pool_children(plan: &SandboxPlan) -> Result<(), SandboxError> {
    linux::prepare_pool_children(plan)
}

#[cfg(not(target_os = "linux"))]
pub fn prepare_pool_children(_plan: &SandboxPlan) -> Result<(), SandboxError> {
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn enter_pool_child(
    _plan: &SandboxPlan,
    _pool: &SandboxReport,
) -> Result<SandboxReport, SandboxError> {
    Err(SandboxError::new(
        Layer::Hygiene,
        "the OS sandbox is only implemented for Linux",
    ))
}

/// Without Linux there is nothing here to apply the plan with.
#[cfg(not(target_os = "linux"))]
pub fn enter(_plan: &SandboxPlan, _entry: Entry) -> Result<SandboxReport, SandboxError> {
    Err(SandboxError::new(
        Layer::Hygiene,
        "the OS sandbox is only implemented for Linux",
    ))
}

/// Replace the sandboxed worker with `argv[0]` (an absolute path), keeping
/// the environment [`enter`] set plus `extra_env`. Returns only on failure.
///
/// Use this rather than a plain `execve`: under a profile with
/// `seccomp.exec = "once"` the filter accepts only the pathname buffer this
/// function fills in.
#[cfg(target_os = "linux")]
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    linux::exec::exec(argv, extra_env)
}

/// Elsewhere the only sandboxed worker is one `sandbox-exec` started.
#[cfg(not(target_os = "linux"))]
pub fn exec(argv: &[String], extra_env: &[(String, String)]) -> SandboxError {
    seatbelt::exec(argv, extra_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_round_trip() {
        let names = [
            "hygiene",
            "filesystem",
            "namespaces",
            "rlimits",
            "privileges",
            "landlock",
            "seccomp",
            "cgroup",
            "exec",
            "sandbox_exec",
        ];
        assert_eq!(Layer::ALL.len(), names.len());
        for (layer, name) in Layer::ALL.into_iter().zip(names) {
            assert_eq!(layer.as_str(), name);
            assert_eq!(layer.to_string(), name);
            assert_eq!(Layer::from_name(name), Some(layer));
            let v = serde_json::to_value(layer).unwrap();
            assert_eq!(v, serde_json::json!(name));
            assert_eq!(serde_json::from_value::<Layer>(v).unwrap(), layer);
        }
        assert_eq!(Layer::from_name("mounts"), None);
    }

    #[test]
    fn layer_error_renders_as_before_and_keeps_its_source() {
        let e = LayerError::new(Layer::Landlock, "not supported by this kernel");
        assert_eq!(
            e.to_string(),
            "failed to apply the landlock layer: not supported by this kernel"
        );
        assert_eq!(e.message(), "not supported by this kernel");

        let leaf = std::io::Error::from_raw_os_error(libc::EPERM);
        let shown = leaf.to_string();
        let e = LayerError::new(Layer::Namespaces, leaf);
        assert_eq!(
            e.to_string(),
            format!("failed to apply the namespaces layer: {shown}")
        );
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }

    #[test]
    fn plan_carries_the_profile() {
        let p = Profile::load("python").unwrap();
        let mut plan = SandboxPlan::new(&p, "/tmp/s".into(), p.default_limits());
        plan.read_only.push("/opt/py/lib".into());
        plan.exec.push("/opt/py/bin/python3".into());
        assert_eq!(plan.profile, "python");
        assert_eq!(plan.uid, p.identity.uid);
        assert_eq!(plan.layers, p.layers);
        let rules = plan.path_rules();
        let here = p.filesystem.paths.iter().filter(|r| r.applies_here());
        assert_eq!(rules.len(), here.count() + 2);
        // Only this architecture's dynamic loader is in the plan.
        let other_arch = if cfg!(target_arch = "x86_64") {
            "ld-linux-aarch64"
        } else {
            "ld-linux-x86-64"
        };
        assert!(p
            .filesystem
            .paths
            .iter()
            .any(|r| r.path.to_string_lossy().contains(other_arch)));
        assert!(!rules
            .iter()
            .any(|r| r.path.to_string_lossy().contains(other_arch)));
        let last = rules.last().unwrap();
        assert_eq!(last.access, PathAccess::Exec);
        assert_eq!(last.path, PathBuf::from("/opt/py/bin/python3"));
        // The plan travels in a frame: it must round-trip through JSON.
        let json = serde_json::to_string(&plan).unwrap();
        let back: SandboxPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
    }
}
