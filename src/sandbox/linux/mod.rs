//! The Linux layers, applied in order by [`jail::sequence`]:
//! hygiene → namespaces → rlimits → privileges → Landlock → seccomp.
//! Which of them each process applies, inherits or leaves to its children
//! is the table in [`crate::sandbox::jail`].

pub mod cgroup;
pub mod cgroup2;
pub mod exec;
pub mod groups;
pub mod hygiene;
pub(crate) mod jail;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod privileges;
pub mod rlimits;
pub mod seccomp;
pub mod subids;
pub mod sys;
pub mod view;

use crate::profiles::{ExecMode, LayerMode};
use crate::sandbox::jail::Entry;
use crate::sandbox::{Layer, LayerCause, SandboxError, SandboxPlan, SandboxReport};

/// Exit code of a worker whose cell process vanished without a status.
pub const EXIT_WORKER_LOST: i32 = crate::exit::Exit::Internal.raw();

/// Run one optional layer: `Off` skips it, a failure of a `Required` layer is
/// an error, a failure of a `BestEffort` layer is reported and skipped.
/// `f` gives the layer's value and the detail its report line shows, or the
/// error it failed with (a leaf error or a message).
fn layer<T, E>(
    report: &mut SandboxReport,
    name: Layer,
    mode: LayerMode,
    f: impl FnOnce() -> Result<(T, String), E>,
) -> Result<Option<T>, SandboxError>
where
    E: std::fmt::Display + Into<LayerCause>,
{
    if mode == LayerMode::Off {
        report.push(name, mode, false, "off in this profile".into());
        return Ok(None);
    }
    match f() {
        Ok((value, detail)) => {
            report.push(name, mode, true, detail);
            Ok(Some(value))
        }
        Err(e) if mode == LayerMode::BestEffort => {
            report.push(name, mode, false, e.to_string());
            Ok(None)
        }
        Err(e) => Err(SandboxError::new(name, e)),
    }
}

/// Enter the sandbox from outside as `entry` (a worker, the fork server
/// or a zygote): the whole sequence of [`jail`], each layer as the table
/// in [`crate::sandbox::jail`] says for `entry`. With a PID namespace this
/// forks and returns in the clone.
pub fn enter(plan: &SandboxPlan, entry: Entry) -> Result<SandboxReport, SandboxError> {
    jail::sequence(jail::Jail::new(plan, entry))
}

/// Enter the sandbox as `entry` (the fork server, a zygote) in a process
/// the supervisor cloned into the namespaces `names` and executed
/// ([`namespaces::clone_exec_mapped`]): the same sequence as [`enter`],
/// except that the namespaces step only builds their contents. `control`
/// is the channel to the supervisor (its hangup means the supervisor died).
pub fn enter_cloned(
    plan: &SandboxPlan,
    entry: Entry,
    names: &[String],
    control: std::os::fd::BorrowedFd<'_>,
) -> Result<SandboxReport, SandboxError> {
    let names = names
        .iter()
        .map(|n| {
            namespaces::ALL
                .iter()
                .find(|(known, _)| known == n)
                .map(|(known, _)| *known)
                .ok_or_else(|| {
                    SandboxError::new(
                        Layer::Namespaces,
                        format!("the supervisor named an unknown namespace {n:?}"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    jail::sequence(jail::Jail::cloned(plan, entry, names, control))
}

/// The per-cell layers in a child forked from a process that went through
/// the sequence as [`Entry::ForkServer`] (with the report `pool`): what the
/// pool applied is inherited; the cell's own rlimits (CPU time counts from
/// zero in a new process), a nested Landlock domain with no filesystem or
/// network access at all and scoped signals and abstract sockets (so the
/// cell cannot touch its fork server or its siblings), then seccomp.
pub fn enter_pool_child(
    plan: &SandboxPlan,
    pool: &SandboxReport,
) -> Result<SandboxReport, SandboxError> {
    jail::sequence(jail::Jail::child_of(plan, pool))
}

/// The seccomp program of a pool's cells (the same for every child), built
/// once in the pool process before it forks them, with the spec it is for.
static POOL_CHILD_SECCOMP: std::sync::OnceLock<(
    crate::profiles::SeccompSpec,
    seccompiler::BpfProgram,
)> = std::sync::OnceLock::new();

/// Build the seccomp program the children of this pool process will apply
/// (see [`enter_pool_child`]), so that each child only installs it.
pub fn prepare_pool_children(plan: &SandboxPlan) -> Result<(), SandboxError> {
    let program = seccomp::build_program(&plan.seccomp, seccomp_gate(plan))
        .map_err(|e| SandboxError::new(Layer::Seccomp, e))?;
    let _ = POOL_CHILD_SECCOMP.set(((*plan.seccomp).clone(), program));
    Ok(())
}

fn seccomp_gate(plan: &SandboxPlan) -> Option<u64> {
    (plan.seccomp.exec == ExecMode::Once).then(exec::gate_address)
}

fn apply_seccomp(plan: &SandboxPlan, report: &mut SandboxReport) -> Result<(), SandboxError> {
    layer(
        report,
        Layer::Seccomp,
        plan.layers.seccomp,
        || -> Result<_, LayerCause> {
            let prepared = POOL_CHILD_SECCOMP
                .get()
                .filter(|(spec, _)| *spec == *plan.seccomp)
                .map(|(_, p)| std::borrow::Cow::Borrowed(p));
            let program = match prepared {
                Some(p) => p,
                None => std::borrow::Cow::Owned(seccomp::build_program(
                    &plan.seccomp,
                    seccomp_gate(plan),
                )?),
            };
            seccomp::apply(&program)?;
            let groups: usize = plan.seccomp.allow.iter().map(|g| g.syscalls.len()).sum();
            Ok((
                (),
                format!(
                    "allowlist of {groups} syscalls, default EPERM, exec {:?}, {} instructions",
                    plan.seccomp.exec,
                    program.len()
                ),
            ))
        },
    )?;
    Ok(())
}

/// Who the cell is on the host: the profile's ids when running as root,
/// our own otherwise, or with the plan's `subordinate_ids` and the user's
/// ranges, the profile's ids inside mapped to the user's first
/// subordinate ids ([`subids`]).
pub(crate) fn host_ids(plan: &SandboxPlan) -> namespaces::HostIds {
    let root = nix::unistd::geteuid().is_root();
    if root {
        return namespaces::HostIds {
            root,
            uid: plan.uid,
            gid: plan.gid,
            sub: None,
        };
    }
    if plan.subordinate_ids == crate::profiles::SubordinateIds::Auto
        && plan.layers.namespaces != LayerMode::Off
        && plan.uid != 0
        && plan.gid != 0
    {
        match subids::lookup() {
            Ok(map) => {
                return namespaces::HostIds {
                    root,
                    uid: plan.uid,
                    gid: plan.gid,
                    sub: Some(map),
                }
            }
            Err(e) => tracing::debug!("cells keep the user's own ids: {e}"),
        }
    }
    own_ids()
}

/// This unprivileged process's own ids, mapped to themselves.
pub(crate) fn own_ids() -> namespaces::HostIds {
    namespaces::HostIds {
        root: false,
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        sub: None,
    }
}

/// The environment a cell's program starts with.
pub(crate) fn cell_environment(plan: &SandboxPlan) -> Vec<(&'static str, std::ffi::OsString)> {
    hygiene::environment(&plan.scratch, plan.tmp_bytes > 0)
}

/// What the cell will see, resolved on the host while nothing is hidden.
pub(crate) fn resolve_view(plan: &SandboxPlan) -> Result<view::FsView, SandboxError> {
    view::resolve(plan).map_err(|e| SandboxError::new(Layer::Filesystem, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Profile;
    use crate::sandbox::testing::{in_worker_child, Outcome};
    use std::path::Path;

    fn plan(profile: &str, scratch: &Path) -> SandboxPlan {
        let p = Profile::load(profile).unwrap();
        SandboxPlan::new(&p, scratch.to_path_buf(), p.default_limits())
    }

    fn status_field(status: &str, key: &str) -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    }

    #[test]
    fn shell_profile_in_process() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().canonicalize().unwrap();
        let plan = plan("shell", &scratch);
        let s2 = scratch.clone();
        let (out, how) = in_worker_child(move || {
            let report = enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
            let mut lines = vec![
                format!("pid={}", std::process::id()),
                format!("uid={}", status_field(&status, "Uid")),
                format!("seccomp={}", status_field(&status, "Seccomp")),
                format!("nnp={}", status_field(&status, "NoNewPrivs")),
                format!("capeff={}", status_field(&status, "CapEff")),
                format!("capbnd={}", status_field(&status, "CapBnd")),
                format!("groups={}", status_field(&status, "Groups")),
                format!("cwd={}", std::env::current_dir().unwrap().display()),
                format!(
                    "scratch_write={}",
                    std::fs::write(s2.join("f"), b"x").is_ok()
                ),
                format!(
                    "usr_write={:?}",
                    std::fs::write("/usr/x", b"x").map_err(|e| e.raw_os_error())
                ),
                format!(
                    "etc_shadow={:?}",
                    std::fs::read("/etc/shadow").map_err(|e| e.raw_os_error())
                ),
                format!(
                    "root_dir={:?}",
                    std::fs::read_dir("/root")
                        .map(|_| ())
                        .map_err(|e| e.raw_os_error())
                ),
                format!("tmp_write={}", std::fs::write("/tmp/t", b"x").is_ok()),
                format!(
                    "socket={:?}",
                    std::net::TcpStream::connect("127.0.0.1:9")
                        .map(|_| ())
                        .map_err(|e| e.raw_os_error())
                ),
                format!("namespaces={}", report.namespaces.join(",")),
                format!("landlock={:?}", report.landlock_abi),
                format!(
                    "hostname={}",
                    nix::unistd::gethostname().unwrap().to_string_lossy()
                ),
                format!("env={}", {
                    let mut keys: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                    keys.sort();
                    keys.join(",")
                }),
            ];
            lines.push(format!(
                "layers={}",
                report
                    .layers
                    .iter()
                    .map(|l| format!("{}:{}", l.name, l.applied))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            Ok(lines.join("\n"))
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        let out = out.strip_prefix('O').unwrap_or_else(|| panic!("{out}"));
        let get = |k: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} missing in {out}"))
                .to_owned()
        };
        assert_eq!(get("pid"), "1");
        let uid = if nix::unistd::geteuid().is_root() {
            65534
        } else {
            nix::unistd::geteuid().as_raw()
        };
        assert_eq!(get("uid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
        assert_eq!(get("seccomp"), "2");
        assert_eq!(get("nnp"), "1");
        assert_eq!(get("capeff"), "0000000000000000");
        assert_eq!(get("capbnd"), "0000000000000000");
        assert_eq!(get("groups"), "");
        assert_eq!(get("cwd"), scratch.display().to_string());
        assert_eq!(get("scratch_write"), "true");
        assert!(
            ["Err(Some(30))", "Err(Some(13))"].contains(&get("usr_write").as_str()),
            "{}",
            get("usr_write")
        );
        assert_eq!(
            get("etc_shadow"),
            "Err(Some(2))",
            "no /etc/shadow in the cell"
        );
        assert_eq!(get("root_dir"), "Err(Some(2))", "no /root in the cell");
        assert_eq!(get("tmp_write"), "true");
        assert_eq!(
            get("socket"),
            "Err(Some(1))",
            "socket() must fail with EPERM"
        );
        assert_eq!(get("namespaces"), "user,mount,pid,net,ipc,uts");
        assert_eq!(get("landlock"), "Some(6)");
        assert_eq!(get("hostname"), "cellbox");
        assert_eq!(get("env"), "HOME,LANG,LC_ALL,PATH,TMPDIR");
        assert_eq!(
            get("layers"),
            "hygiene:true,namespaces:true,rlimits:true,privileges:true,landlock:true,seccomp:true"
        );
        // The sandbox's writes happened in the host's scratch dir.
        assert_eq!(std::fs::read(scratch.join("f")).unwrap(), b"x");
    }

    #[test]
    fn rhai_profile_allows_only_protocol_io() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan("rhai", dir.path());
        let (out, how) = in_worker_child(move || {
            enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let open = std::fs::File::open("/proc/self/status")
                .map(|_| ())
                .map_err(|e| e.raw_os_error());
            Ok(format!("open={open:?}"))
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        assert_eq!(out, "Oopen=Err(Some(1))");
    }

    #[test]
    fn exit_status_and_signals_are_mirrored() {
        let dir = tempfile::tempdir().unwrap();
        let plan1 = plan("shell", dir.path());
        let (_, how) = in_worker_child(move || {
            enter(&plan1, Entry::Worker).map_err(|e| e.to_string())?;
            std::process::exit(42)
        });
        assert_eq!(how, Outcome::Exited(42));
        let plan2 = plan("shell", dir.path());
        let (_, how) = in_worker_child(move || {
            enter(&plan2, Entry::Worker).map_err(|e| e.to_string())?;
            // A fault the kernel forces even on PID 1.
            // SAFETY: deliberately crashing the sandboxed test child.
            unsafe { std::ptr::null_mut::<u8>().write_volatile(1) };
            Ok(String::new())
        });
        assert_eq!(how, Outcome::Signaled(libc::SIGSEGV));
    }

    #[test]
    fn exec_under_shell_profile() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan("shell", dir.path());
        let (out, how) = in_worker_child(move || {
            enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let argv = vec![
                "/bin/sh".to_string(),
                "-c".into(),
                "echo -n $(id -u):$(cat /proc/self/status | grep ^Seccomp: | tr -d '\\t ') >&3; exit 3".into(),
            ];
            Err(exec::exec(&argv, &[]).to_string())
        });
        let uid = if nix::unistd::geteuid().is_root() {
            65534
        } else {
            nix::unistd::geteuid().as_raw()
        };
        assert_eq!(out, format!("{uid}:Seccomp:2"));
        assert_eq!(how, Outcome::Exited(3));
    }

    #[test]
    fn exec_gate_allows_one_exec_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = plan("python", dir.path());
        plan.exec.push("/usr/bin/dash".into());
        let (out, how) = in_worker_child(move || {
            enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            // The gated exec works; the shell's own exec of `true` must not.
            let argv = vec![
                "/usr/bin/dash".to_string(),
                "-c".into(),
                "/usr/bin/dash -c 'echo inner >&3' 2>/dev/null; echo -n rc=$? >&3".into(),
            ];
            Err(exec::exec(&argv, &[]).to_string())
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        assert_eq!(out, "rc=126", "the second exec must be refused");
    }

    fn denied(plan: &SandboxPlan) -> Vec<(String, i64)> {
        plan.seccomp
            .deny
            .iter()
            .flat_map(|g| g.syscalls.iter())
            .filter_map(|s| crate::sandbox::syscalls::number(s).map(|nr| (s.clone(), nr)))
            .collect()
    }

    /// Rhai cells cannot exec a probe, so the Rhai profile's denials are
    /// walked in-process, after the real `enter`.
    #[test]
    fn rhai_denied_syscalls_fail_with_eperm() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan("rhai", dir.path());
        let calls = denied(&plan);
        assert!(calls.len() > 60, "only {} denied syscalls", calls.len());
        let walk = calls.clone();
        let (out, how) = in_worker_child(move || {
            enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let mut lines = Vec::new();
            for (name, nr) in walk {
                // SAFETY: every call here is denied by the filter before
                // the kernel looks at the (zero) arguments.
                let rc = unsafe { libc::syscall(nr, 0, 0, 0, 0, 0, 0) };
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                lines.push(format!("{name} {rc} {errno}"));
            }
            Ok(lines.join("\n"))
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        let out = out.strip_prefix('O').unwrap_or_else(|| panic!("{out}"));
        assert_eq!(out.lines().count(), calls.len());
        for line in out.lines() {
            assert!(line.ends_with(" -1 1"), "not denied with EPERM: {line}");
        }
    }

    /// With every deny group set to `kill`, each call ends the cell with
    /// SIGSYS: the filter, not the kernel's own checks, stopped it.
    #[test]
    fn rhai_denied_syscalls_are_caught_by_the_filter() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = plan("rhai", dir.path());
        for g in &mut plan.seccomp.deny {
            g.syscalls.retain(|s| s != "socket");
            g.action = crate::profiles::DenyAction::Kill;
        }
        for (name, nr) in denied(&plan) {
            let plan = plan.clone();
            let (out, how) = in_worker_child(move || {
                enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
                // SAFETY: as above; the filter kills before the kernel runs it.
                let rc = unsafe { libc::syscall(nr, 0, 0, 0, 0, 0, 0) };
                Ok(format!("survived with {rc}"))
            });
            assert_eq!(how, Outcome::Signaled(libc::SIGSYS), "{name}: {out}");
        }
    }

    /// cellbox run by an unprivileged user: the cell keeps that uid, mapped
    /// to itself in a user namespace, and still gets every layer.
    #[test]
    fn unprivileged_caller_gets_every_layer() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test starts as root to become an unprivileged user"
        );
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().canonicalize().unwrap();
        std::os::unix::fs::chown(&scratch, Some(1000), Some(1000)).unwrap();
        let plan = plan("shell", &scratch);
        let (out, how) = in_worker_child(move || {
            let id = nix::unistd::Uid::from_raw(1000);
            let gid = nix::unistd::Gid::from_raw(1000);
            nix::unistd::setgroups(&[]).map_err(|e| e.to_string())?;
            nix::unistd::setresgid(gid, gid, gid).map_err(|e| e.to_string())?;
            nix::unistd::setresuid(id, id, id).map_err(|e| e.to_string())?;
            let report = enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
            let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
            Ok(format!(
                "uid={} seccomp={} capeff={} ns={} layers={} cell_in_passwd={}",
                status_field(&status, "Uid"),
                status_field(&status, "Seccomp"),
                status_field(&status, "CapEff"),
                report.namespaces.join(","),
                report.layers.iter().filter(|l| l.applied).count(),
                passwd.contains("cell:x:1000:1000:")
            ))
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        assert_eq!(
            out,
            "Ouid=1000\t1000\t1000\t1000 seccomp=2 capeff=0000000000000000 \
             ns=user,mount,pid,net,ipc,uts layers=6 cell_in_passwd=true"
        );
    }

    /// The user the subordinate-id tests become, in a private view of
    /// `/etc` ([`crate::sandbox::testing::become_user_with_etc`]).
    const SUB_USER: u32 = 59999;

    /// Run a shell-profile worker cell with `subordinate_ids = "auto"` as
    /// [`SUB_USER`], whose `/etc/subuid` and `/etc/subgid` are `ranges`;
    /// the cell writes a read-only tree in its scratch. Returns what the
    /// cell saw and the scratch directory, left for the caller to inspect
    /// (in `dir`, which it removes).
    fn run_with_ranges(dir: &Path, ranges: &str) -> (String, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test starts as root to become an unprivileged user with its own /etc view"
        );
        for tool in ["newuidmap", "newgidmap"] {
            if let Err(e) = subids::tool(tool) {
                panic!("{e}: the subordinate-id tests need it");
            }
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let scratch = dir.join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        std::os::unix::fs::chown(&scratch, Some(SUB_USER), Some(SUB_USER)).unwrap();
        let mut passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        passwd.push_str(&format!(
            "cellbox-subids:x:{SUB_USER}:{SUB_USER}::/nonexistent:/usr/sbin/nologin\n"
        ));
        let files = [
            ("passwd", passwd),
            ("subuid", ranges.to_owned()),
            ("subgid", ranges.to_owned()),
        ];
        let base = dir.join("etc");
        let mut plan = plan("shell", &scratch);
        plan.subordinate_ids = crate::profiles::SubordinateIds::Auto;
        let (out, how) = in_worker_child(move || {
            crate::sandbox::testing::become_user_with_etc(&base, &files, SUB_USER, SUB_USER)?;
            let report = enter(&plan, Entry::Worker).map_err(|e| e.to_string())?;
            let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
            let map = std::fs::read_to_string("/proc/self/uid_map").map_err(|e| e.to_string())?;
            let map: Vec<String> = map
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            // A tree its user may not change: read-only directories.
            std::fs::create_dir_all("ro/deep").map_err(|e| e.to_string())?;
            std::fs::write("ro/deep/f", "x").map_err(|e| e.to_string())?;
            for (p, mode) in [("ro/deep/f", 0o400), ("ro/deep", 0o500), ("ro", 0o500)] {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| e.to_string())?;
            }
            let ns = report
                .layers
                .iter()
                .find(|l| l.name == "namespaces")
                .map(|l| l.detail.clone())
                .unwrap_or_default();
            Ok(format!(
                "uid={} gid={} groups={} map={} ns={ns}",
                status_field(&status, "Uid"),
                status_field(&status, "Gid"),
                status_field(&status, "Groups"),
                map.join(","),
            ))
        });
        assert_eq!(how, Outcome::Exited(0), "{out}");
        (out, scratch)
    }

    fn owner(path: &Path) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).unwrap();
        (m.uid(), m.gid())
    }

    /// With subordinate ids the cell is the profile's uid and gid inside
    /// (with no groups), which are the user's first subordinate ids on the
    /// host: its scratch directory and everything it wrote there belong to
    /// them, not to the user; the user maps only as the namespace's root.
    #[test]
    fn subordinate_ids_make_the_cell_another_host_user() {
        let dir = tempfile::tempdir().unwrap();
        let (out, scratch) = run_with_ranges(dir.path(), "cellbox-subids:200000:65536\n");
        assert_eq!(
            out,
            format!(
                "Ouid=65534\t65534\t65534\t65534 gid=65534\t65534\t65534\t65534 groups= \
                 map=0 {SUB_USER} 1,65534 200000 1 ns=user,mount,pid,net,ipc,uts; new read-only \
                 root; subordinate ids: the cell's 65534:65534 are 200000:200000 on the host"
            )
        );
        for p in ["", "ro", "ro/deep", "ro/deep/f"] {
            assert_eq!(owner(&scratch.join(p)), (200000, 200000), "{p}");
        }
    }

    /// Without ranges for the user, `auto` falls back to the user's own
    /// ids mapped to themselves, as without the switch.
    #[test]
    fn without_ranges_the_cell_keeps_the_users_own_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (out, scratch) = run_with_ranges(dir.path(), "someone-else:200000:65536\n");
        let u = SUB_USER;
        assert_eq!(
            out,
            format!(
                "Ouid={u}\t{u}\t{u}\t{u} gid={u}\t{u}\t{u}\t{u} groups= map={u} {u} 1 \
                 ns=user,mount,pid,net,ipc,uts; new read-only root"
            )
        );
        for p in ["", "ro/deep/f"] {
            assert_eq!(owner(&scratch.join(p)), (u, u), "{p}");
        }
    }

    /// Killing the worker (what the supervisor does on timeout) kills the
    /// cell: it runs in another PID namespace as the worker's child, and its
    /// parent-death signal takes it down, which closes its protocol fd.
    #[test]
    fn the_cell_dies_with_the_worker() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let plan = plan("rhai", dir.path());
        let (rd, wr) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only runs enter() and then sleeps or _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                drop(rd);
                // SAFETY: dup2 onto the protocol fd number, then exit paths
                // that never return into the harness.
                unsafe {
                    libc::dup2(wr.as_raw_fd(), 3);
                }
                drop(wr);
                if enter(&plan, Entry::Worker).is_ok() {
                    // SAFETY: write to fd 3, allowed by the Rhai filter.
                    unsafe { libc::write(3, b"up".as_ptr().cast(), 2) };
                    // Bounded, so a regression fails the test instead of
                    // leaving an orphan that holds the harness's output.
                    std::thread::sleep(std::time::Duration::from_secs(10));
                }
                // SAFETY: leave without running harness code.
                unsafe { libc::_exit(1) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(wr);
                let mut file = std::fs::File::from(rd);
                let mut up = [0u8; 2];
                file.read_exact(&mut up).unwrap();
                assert_eq!(&up, b"up");
                let worker = child.as_raw();
                let kids =
                    std::fs::read_to_string(format!("/proc/{worker}/task/{worker}/children"))
                        .unwrap();
                assert_eq!(kids.split_whitespace().count(), 1, "one cell process");
                nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                // EOF on the pipe: the cell, its only other holder, is gone.
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let mut rest = Vec::new();
                    let _ = tx.send(file.read_to_end(&mut rest).map(|_| rest));
                });
                let rest = rx
                    .recv_timeout(std::time::Duration::from_secs(5))
                    .expect("the cell outlived its worker");
                assert_eq!(rest.unwrap(), b"");
            }
        }
    }
}
