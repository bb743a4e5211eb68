//! What `cellbox doctor` says on macOS: what a cell gets there (the SBPL
//! policy under sandbox-exec, hygiene, rlimits) and what it does not (no
//! seccomp, no namespaces, no Landlock, no dropped identity, no memory
//! cgroup). Portable, so it is tested everywhere.

use crate::profiles::{LayerMode, Profile};
use crate::sandbox::doctor::{LayerAssessment, ProfileAssessment};
use crate::sandbox::Layer;

/// A profile's layers on macOS; `sandbox_exec` is whether
/// `/usr/bin/sandbox-exec` is there.
pub fn assess(profile: &Profile, sandbox_exec: bool) -> ProfileAssessment {
    let mut out = Vec::new();
    let mut add = |layer: Layer, mode: LayerMode, available: bool, detail: String| {
        out.push(LayerAssessment {
            layer: layer.as_str().to_owned(),
            mode,
            available,
            detail,
        });
    };
    let forks = profile
        .seccomp
        .allow
        .iter()
        .flat_map(|g| &g.syscalls)
        .any(|s| s == "fork" || s == "vfork");
    add(
        Layer::SandboxExec,
        LayerMode::Required,
        sandbox_exec,
        format!(
            "{}: SBPL policy compiled from the profile (deny default; reads beneath its \
             paths, writes only in scratch, exec of the engine and the backend's programs, \
             {}, no network)",
            if sandbox_exec {
                super::launch::SANDBOX_EXEC.to_owned()
            } else {
                format!("{} is missing", super::launch::SANDBOX_EXEC)
            },
            if forks { "fork allowed" } else { "no fork" }
        ),
    );
    add(
        Layer::Hygiene,
        LayerMode::Required,
        true,
        "fds 0-3, fixed environment, scratch cwd; no parent-death signal \
         (the supervisor kills the process group)"
            .into(),
    );
    add(
        Layer::Rlimits,
        profile.layers.rlimits,
        true,
        "set by the worker on itself; macOS does not enforce RLIMIT_AS (memory) and \
         counts RLIMIT_NPROC per user"
            .into(),
    );
    let none = |what: &str| format!("none on macOS: {what}");
    add(
        Layer::Namespaces,
        LayerMode::Off,
        false,
        none("no namespaces (the policy stands in for the mount and network ones)"),
    );
    add(
        Layer::Privileges,
        LayerMode::Off,
        false,
        none("cells keep the supervisor's uid"),
    );
    add(
        Layer::Landlock,
        LayerMode::Off,
        false,
        none("Landlock is Linux's; the policy's file rules stand in"),
    );
    add(
        Layer::Seccomp,
        LayerMode::Off,
        false,
        none("no syscall filter; the policy limits operations, not system calls"),
    );
    add(
        Layer::Cgroup,
        LayerMode::Off,
        false,
        none("no memory cgroup: the memory of all cells together is not bounded"),
    );
    ProfileAssessment::new(profile, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macos_says_what_it_gives_and_what_it_does_not() {
        let p = Profile::load("python").unwrap();
        let a = assess(&p, true);
        assert!(a.ok, "{a:?}");
        let get = |n: &str| a.layers.iter().find(|l| l.layer == n).unwrap();
        assert!(get("sandbox_exec").available);
        assert!(get("sandbox_exec").detail.contains("fork allowed"));
        for off in ["seccomp", "namespaces", "landlock", "cgroup", "privileges"] {
            let l = get(off);
            assert!(!l.available && l.mode == LayerMode::Off, "{l:?}");
            assert!(l.detail.starts_with("none on macOS"), "{l:?}");
        }
        assert!(get("cgroup").detail.contains("no memory cgroup"));
        assert!(get("rlimits").detail.contains("RLIMIT_AS"));
        let rhai = assess(&Profile::load("rhai").unwrap(), true);
        assert!(rhai.layers[0].detail.contains("no fork"));
        // Without sandbox-exec no profile is fit to run.
        let a = assess(&p, false);
        assert!(!a.ok);
        assert_eq!(a.missing_required, ["sandbox_exec"]);
    }
}
