//! A cell's plan: the sandbox plan and backend its worker gets, and the
//! report of the cgroup layer (which the worker does not apply: it starts
//! in it).

use super::launch::LaunchError;
use super::{profile_name, CellSpec};
use crate::protocol::Backend;
use crate::sandbox::SandboxPlan;
use crate::supervisor::{Inner, Language, ProgramError};

pub(super) fn backend_for(
    sup: &Inner,
    spec: &CellSpec,
) -> Result<(Backend, SandboxPlan), LaunchError> {
    let limits = spec.limits.rlimits;
    let profile = sup.profile(&profile_name(sup, spec))?;
    let scratch = spec
        .scratch
        .path()
        .map_err(LaunchError::io("create the scratch directory"))?;
    let mut plan = SandboxPlan::new(&profile, scratch.to_path_buf(), limits);
    sup.cgroup_for(plan.layers.cgroup)?;
    let backend = match spec.language {
        Language::Rhai => Backend::Rhai,
        Language::Python => {
            let py = sup.python()?;
            plan.read_only.extend(py.read_only.iter().cloned());
            plan.read_only.extend(profile.python.paths.iter().cloned());
            plan.exec.push(py.executable.clone());
            let precompiled = sup.precompiled_shim().map(|p| {
                plan.read_only.push(p.clone());
                p.to_string_lossy().into_owned()
            });
            Backend::Python {
                interpreter: py.executable.to_string_lossy().into_owned(),
                precompiled,
            }
        }
        Language::Shell | Language::Bash => {
            let argv = match &spec.argv {
                Some(a) => a.clone(),
                None => {
                    let sh = spec.language.shell_program().unwrap_or("/bin/sh");
                    vec![sh.into(), "-c".into(), spec.code.clone()]
                }
            };
            let prog = argv.first().ok_or(ProgramError::Empty)?;
            let resolved = crate::supervisor::resolve_program(prog)?;
            plan.exec.push(resolved.clone());
            let mut argv = argv;
            argv[0] = resolved.to_string_lossy().into_owned();
            Backend::Exec {
                argv,
                env: spec.env.clone(),
            }
        }
    };
    Ok((backend, plan))
}

/// The report of the cells' memory cgroup for a cell of `spec` (the worker
/// does not apply it: it starts in it).
pub(super) fn cgroup_layer(sup: &Inner, spec: &CellSpec) -> crate::sandbox::LayerReport {
    use crate::profiles::LayerMode;
    let mode = sup
        .profile(&profile_name(sup, spec))
        .map_or(LayerMode::BestEffort, |p| p.layers.cgroup);
    #[cfg(target_os = "linux")]
    {
        let mut report = crate::sandbox::linux::cgroup::layer_report(
            sup.cells_cgroup
                .as_deref()
                .filter(|_| mode != LayerMode::Off),
            mode,
        );
        if report.applied && sup.groups.is_some() {
            let asked = spec.asked.as_ref().unwrap_or(&spec.limits);
            let (memory, processes) = crate::supervisor::tenancy::session_bounds(sup, asked);
            report.detail.push_str(&format!(
                "; its session: {} MiB (its files too), {processes} processes; \
                 the cell: {} processes, its whole process tree ended with it",
                memory >> 20,
                crate::supervisor::tenancy::cell_processes(&spec.limits)
            ));
        } else if report.applied {
            report.detail.push_str(
                "; sessions share it (per-session cgroups need the memory and pids \
                 controllers: cgroup v1 with a cpuacct hierarchy, or cgroup v2 on Linux 5.14+)",
            );
        }
        report
    }
    #[cfg(not(target_os = "linux"))]
    crate::sandbox::LayerReport {
        name: "cgroup".into(),
        applied: false,
        mode,
        detail: "none: memory cgroups are Linux only".into(),
    }
}
