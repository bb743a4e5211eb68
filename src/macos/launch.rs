//! The worker under `sandbox-exec`: `<sandbox-exec> -p <policy> <engine>
//! __seatbelt_worker`, built with `std::process` alone.
//!
//! - the policy is [`super::sbpl::compile`]'s for the cell's plan, with the
//!   paths known only now (scratch directory, engine, interpreter)
//!   canonicalized first, since macOS matches resolved paths;
//! - the environment is cleared and set to the cell's fixed one;
//! - the only descriptors the worker gets are stdin (its end of the
//!   protocol socket, moved to fd 3 by the worker), stdout and stderr
//!   (pipes): std opens everything close-on-exec, and the worker closes
//!   whatever else it finds above fd 3;
//! - it leads a process group of its own, which the supervisor kills at
//!   the cell's end (macOS has no parent-death signal);
//! - rlimits: the worker sets them on itself as its first step
//!   (`crate::sandbox::seatbelt`), as `std::process` has no safe hook
//!   between fork and exec.
//!
//! The launcher's path is a setting
//! ([`crate::SupervisorBuilder::sandbox_exec`]), so that on Linux a test
//! can start cells through a stand-in that records its arguments and runs
//! the worker without a sandbox.

use super::sbpl::{self, SbplError};
use crate::sandbox::SandboxPlan;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where macOS keeps `sandbox-exec`.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// A worker that cannot be started under sandbox-exec.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("failed to resolve {what} {path:?}: {source}")]
    Resolve {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Policy(#[from] SbplError),
}

/// `plan` with the paths known only at launch resolved (symlinks
/// followed), as the policy must name them.
pub fn canonical_plan(plan: &SandboxPlan) -> Result<SandboxPlan, LaunchError> {
    let resolve = |what, p: &Path| {
        std::fs::canonicalize(p).map_err(|source| LaunchError::Resolve {
            what,
            path: p.to_path_buf(),
            source,
        })
    };
    let mut plan = plan.clone();
    plan.scratch = resolve("the scratch directory", &plan.scratch)?;
    plan.read_only = plan
        .read_only
        .iter()
        .map(|p| resolve("a read-only path of the backend", p))
        .collect::<Result<_, _>>()?;
    plan.exec = plan
        .exec
        .iter()
        .map(|p| resolve("a program of the backend", p))
        .collect::<Result<_, _>>()?;
    Ok(plan)
}

/// The command that starts the worker `engine` for `plan` under
/// `launcher` (sandbox-exec or a stand-in), its protocol socket
/// `protocol` as stdin. Returns it with the policy it carries.
pub fn command(
    launcher: &Path,
    engine: &Path,
    plan: &SandboxPlan,
    protocol: OwnedFd,
) -> Result<(Command, String), LaunchError> {
    let engine = std::fs::canonicalize(engine).map_err(|source| LaunchError::Resolve {
        what: "the worker executable",
        path: engine.to_path_buf(),
        source,
    })?;
    let plan = canonical_plan(plan)?;
    let policy = sbpl::compile(&plan, &engine)?;
    let mut cmd = Command::new(launcher);
    cmd.arg("-p")
        .arg(&policy)
        .arg(&engine)
        .arg(crate::worker::SEATBELT_WORKER_ARG)
        .env_clear()
        .envs(crate::sandbox::seatbelt::environment(&plan))
        .current_dir(&plan.scratch)
        .stdin(Stdio::from(protocol))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    Ok((cmd, policy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Profile;

    #[test]
    fn the_command_is_sandbox_exec_with_the_policy_and_a_clean_environment() {
        let dir = tempfile::tempdir().unwrap();
        let profile = Profile::load("rhai").unwrap();
        let plan = SandboxPlan::new(&profile, dir.path().into(), profile.default_limits());
        let engine = std::env::current_exe().unwrap();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (cmd, policy) = command(Path::new(SANDBOX_EXEC), &engine, &plan, a.into()).unwrap();
        assert_eq!(cmd.get_program(), SANDBOX_EXEC);
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let engine = std::fs::canonicalize(engine).unwrap();
        assert_eq!(args.len(), 4);
        assert_eq!(args[0], "-p");
        assert_eq!(args[1], policy.as_str());
        assert_eq!(args[2], engine.as_os_str());
        assert_eq!(args[3], crate::worker::SEATBELT_WORKER_ARG);
        sbpl::tests::well_formed(&policy).unwrap();
        // The scratch directory in the policy is the resolved one.
        let scratch = std::fs::canonicalize(dir.path()).unwrap();
        assert!(policy.contains(&format!("(subpath \"{}\")", scratch.display())));
        let env: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.is_some()))
            .collect();
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]);
        assert_eq!(cmd.get_current_dir(), Some(scratch.as_path()));
    }

    #[test]
    fn a_missing_path_is_an_error_not_a_dropped_rule() {
        let profile = Profile::load("python").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut plan = SandboxPlan::new(&profile, dir.path().into(), profile.default_limits());
        plan.exec.push("/nonexistent/python3".into());
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let engine = std::env::current_exe().unwrap();
        let e = command(Path::new(SANDBOX_EXEC), &engine, &plan, a.into()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/python3"), "{e}");
    }
}
