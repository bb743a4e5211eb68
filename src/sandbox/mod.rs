//! Every syscall-level layer of the worker sandbox. This module tree is the
//! only place in cellbox where `unsafe` is allowed.
//!
//! The shape follows "build the policy, then apply it": [`SandboxPlan`] is
//! plain data the supervisor builds from a profile and sends to the worker in
//! the `setup` frame; [`enter`] applies it inside the worker, in order, and
//! returns a [`SandboxReport`] of what was actually enforced.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub mod forkserver;
pub mod process;
pub mod spawn;

/// OS resource limits for one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsLimits {
    pub cpu_seconds: u64,
    pub memory_bytes: u64,
    pub max_processes: u64,
    pub max_open_files: u64,
    pub max_file_size_bytes: u64,
}

/// Everything the worker needs to sandbox itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxPlan {
    /// Profile name, for reports.
    pub profile: String,
    /// The cell's scratch directory: its cwd and the only writable place.
    pub scratch: PathBuf,
    pub limits: OsLimits,
    /// Extra read-only paths the backend needs (e.g. the Python prefix).
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Programs the backend may execute.
    #[serde(default)]
    pub exec: Vec<PathBuf>,
}

impl SandboxPlan {
    pub fn new(profile: &crate::profiles::Profile, scratch: PathBuf, limits: OsLimits) -> Self {
        SandboxPlan {
            profile: profile.name.clone(),
            scratch,
            limits,
            read_only: Vec::new(),
            exec: Vec::new(),
        }
    }
}

/// One layer's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerReport {
    pub name: String,
    pub applied: bool,
    #[serde(default)]
    pub detail: String,
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

/// A layer that could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("failed to apply the {layer} layer: {message}")]
pub struct SandboxError {
    pub layer: &'static str,
    pub message: String,
}

/// Apply the plan to the calling (worker) process, in the order of DESIGN §3:
/// hygiene → namespaces → rlimits → privileges → Landlock → seccomp.
pub fn enter(plan: &SandboxPlan) -> Result<SandboxReport, SandboxError> {
    let mut report = SandboxReport {
        profile: plan.profile.clone(),
        ..SandboxReport::default()
    };
    // 1. hygiene
    std::env::set_current_dir(&plan.scratch).map_err(|e| SandboxError {
        layer: "hygiene",
        message: format!(
            "failed to enter scratch dir {}: {e}",
            plan.scratch.display()
        ),
    })?;
    report.layers.push(LayerReport {
        name: "hygiene".into(),
        applied: true,
        detail: String::new(),
    });
    // 2. namespaces, 3. rlimits, 4. privileges, 5. Landlock, 6. seccomp: see
    // src/sandbox/linux/.
    Ok(report)
}
