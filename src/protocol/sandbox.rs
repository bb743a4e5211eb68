//! The sandbox's plan and report as they travel: the plan the supervisor
//! builds from a profile and sends in the `setup` frame (or a pool's control
//! message), the report of what the sandboxed process got back in `ready`,
//! a mandatory layer's failure, and the fd the channel is found on. Plain
//! data: `crate::sandbox` applies the plan and fills in the report.

use crate::plan::Rlimits;
use crate::profiles::{LayerMode, Layers, PathAccess, PathRule, Profile, SeccompSpec};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// uid/gid the cell runs as when the worker starts as root (and, with
    /// subordinate ids, inside the cell's user namespace).
    pub uid: u32,
    pub gid: u32,
    /// Without root: whether the cell runs as a subordinate id.
    #[serde(default)]
    pub subordinate_ids: crate::profiles::SubordinateIds,
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
            subordinate_ids: profile.identity.subordinate_ids,
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

/// One step of the sandbox (docs/architecture.md §3), by the name reports, errors and
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
