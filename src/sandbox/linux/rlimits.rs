//! The rlimits layer: hard per-process ceilings set inside the worker.
//!
//! Soft and hard limits are equal (the cell cannot raise them back), except
//! CPU time: the soft limit sends SIGXCPU one second before the hard limit's
//! SIGKILL, so a backend may report "CPU limit" before it is killed.
//!
//! RLIMIT_NPROC counts processes per user and user namespace; with a user
//! namespace per cell it limits exactly that cell's process tree.
//!
//! The plan's five limits come with their names and resources from
//! [`crate::plan::Rlimits::each`]; this table adds the ones every cell gets
//! alike (no core dumps, locked memory or message queues) and the profile's
//! stack size.

use crate::sandbox::SandboxPlan;
use rlimit::Resource;

/// One limit to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub resource: Resource,
    pub name: &'static str,
    pub soft: u64,
    pub hard: u64,
}

/// The rlimit table for a plan.
pub fn table(plan: &SandboxPlan) -> Vec<Rlimit> {
    let same = |resource, name, v: u64| Rlimit {
        resource,
        name,
        soft: v,
        hard: v,
    };
    let cell = plan.limits.each().map(|l| Rlimit {
        // RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL a second later.
        hard: if l.resource == Resource::CPU {
            l.value.saturating_add(1)
        } else {
            l.value
        },
        ..same(l.resource, l.name, l.value)
    });
    let every = [
        same(Resource::CORE, "core", 0),
        same(Resource::STACK, "stack_bytes", plan.stack_bytes),
        same(Resource::MEMLOCK, "memlock", 0),
        same(Resource::MSGQUEUE, "msgqueue", 0),
    ];
    cell.into_iter().chain(every).collect()
}

#[derive(Debug, thiserror::Error)]
#[error("failed to set {name} to {soft}/{hard}: {source}")]
pub struct RlimitError {
    pub name: &'static str,
    pub soft: u64,
    pub hard: u64,
    #[source]
    pub source: std::io::Error,
}

/// Set every limit of the table. Lowering is always allowed; a limit above
/// the current hard limit is clamped to it (never raised).
pub fn apply(table: &[Rlimit]) -> Result<String, RlimitError> {
    let mut detail = Vec::new();
    for r in table {
        let (_, cur_hard) = rlimit::getrlimit(r.resource).map_err(|source| RlimitError {
            name: r.name,
            soft: r.soft,
            hard: r.hard,
            source,
        })?;
        let hard = r.hard.min(cur_hard);
        let soft = r.soft.min(hard);
        rlimit::setrlimit(r.resource, soft, hard).map_err(|source| RlimitError {
            name: r.name,
            soft,
            hard,
            source,
        })?;
        detail.push(format!("{}={}", r.name, soft));
    }
    Ok(detail.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Profile;

    fn plan() -> SandboxPlan {
        let p = Profile::load("shell").unwrap();
        SandboxPlan::new(&p, "/tmp".into(), p.default_limits())
    }

    #[test]
    fn table_has_every_limit_and_core_zero() {
        let plan = plan();
        let t = table(&plan);
        let get = |r| t.iter().find(|x| x.resource == r).unwrap();
        assert_eq!(get(Resource::CPU).soft, plan.limits.cpu_seconds);
        assert_eq!(get(Resource::CPU).hard, plan.limits.cpu_seconds + 1);
        assert_eq!(get(Resource::AS).hard, plan.limits.memory_bytes);
        assert_eq!(get(Resource::FSIZE).hard, plan.limits.max_file_size_bytes);
        assert_eq!(get(Resource::NOFILE).hard, plan.limits.max_open_files);
        assert_eq!(get(Resource::NPROC).hard, plan.limits.max_processes);
        assert_eq!(get(Resource::CORE).hard, 0);
        assert_eq!(get(Resource::STACK).hard, plan.stack_bytes);
    }

    #[test]
    fn apply_sets_and_reads_back_in_a_child() {
        let plan = plan();
        let out = crate::sandbox::testing::in_child(move || {
            apply(&table(&plan)).map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            for r in [
                Resource::CPU,
                Resource::AS,
                Resource::NOFILE,
                Resource::NPROC,
                Resource::CORE,
            ] {
                let (s, h) = rlimit::getrlimit(r).map_err(|e| e.to_string())?;
                got.push(format!("{s}/{h}"));
            }
            Ok(got.join(","))
        })
        .unwrap();
        let l = Profile::load("shell").unwrap().limits;
        assert_eq!(
            out,
            format!(
                "{}/{},{m}/{m},{f}/{f},{p}/{p},0/0",
                l.rlimits.cpu_seconds,
                l.rlimits.cpu_seconds + 1,
                m = l.rlimits.memory_bytes,
                f = l.rlimits.max_open_files,
                p = l.rlimits.max_processes
            )
        );
    }
}
