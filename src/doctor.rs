//! `cellbox doctor`: what this host supports, what a cell would get under
//! each profile, and what the warm workers (the Rhai fork server, the Python
//! zygotes) give a long-lived surface here.
//!
//! The host is probed and each profile assessed in
//! [`crate::sandbox::doctor`]; this module gathers that, the Python
//! interpreter and a trial of the warm workers into one typed
//! [`DoctorReport`], which prints as text ([`std::fmt::Display`]) or as JSON
//! (its `Serialize`).

use crate::cli::{usage, EXIT_INTERNAL};
use crate::profiles::{Profile, BUILTIN_NAMES};
use crate::sandbox::doctor::{self, HostSupport, ProfileAssessment};
use crate::{CellRequest, Language, PoolStatus, PythonInfo, SessionConfig, Supervisor};
use serde::{Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The arguments of `cellbox doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Assess this profile (built-in name or TOML file) instead of the
    /// shipped ones (repeatable).
    #[arg(long)]
    pub profile: Vec<String>,
    /// Python interpreter to check (default: the one cells would use).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Everything `cellbox doctor` reports.
#[derive(Debug, Serialize)]
pub struct DoctorReport {
    pub warm_workers: WarmWorkers,
    pub host: HostSupport,
    /// The interpreter Python cells would use, or why there is none.
    #[serde(serialize_with = "python_or_error")]
    pub python: Result<PythonInfo, crate::Error>,
    pub profiles: Vec<ProfileAssessment>,
    /// Every profile assessed has all its required layers here.
    pub ok: bool,
    /// For each guarantee this host does not give, the setting that would
    /// (see [`doctor::advice`]).
    pub advice: Vec<String>,
}

/// What the warm workers came to when started once.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WarmWorkers {
    /// The supervisor ran a trial cell in each language on the warm path.
    Started {
        cells: TrialCells,
        pools: Box<PoolStatus>,
    },
    /// No supervisor could be built.
    Failed { error: String },
}

/// How each trial cell ended: its status, and its error message if any.
#[derive(Debug, Serialize)]
pub struct TrialCells {
    pub rhai: String,
    pub python: String,
}

fn python_or_error<S: Serializer>(
    python: &Result<PythonInfo, crate::Error>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Failure {
        error: String,
    }
    match python {
        Ok(info) => info.serialize(s),
        Err(e) => Failure {
            error: e.to_string(),
        }
        .serialize(s),
    }
}

impl DoctorReport {
    /// Probe the host, assess `profiles` on it, find the Python interpreter
    /// (`python`, else the one cells would use) and start the warm workers
    /// once.
    pub async fn gather(profiles: &[Profile], python: Option<&Path>) -> DoctorReport {
        let host = doctor::probe();
        let profiles: Vec<ProfileAssessment> = profiles.iter().map(|p| assess(p, &host)).collect();
        let mut b = Supervisor::builder();
        if let Some(p) = python {
            b = b.python(p);
        }
        let python_info = b
            .build()
            .and_then(|sup| sup.python().map_err(crate::Error::from));
        let ok = profiles.iter().all(|a| a.ok);
        let warm_workers = WarmWorkers::start(python).await;
        let session_groups = matches!(&warm_workers, WarmWorkers::Started { pools, .. }
            if pools.session_cgroups);
        let advice = doctor::advice(&host, session_groups);
        DoctorReport {
            warm_workers,
            host,
            python: python_info,
            profiles,
            ok,
            advice,
        }
    }
}

impl WarmWorkers {
    /// Start the warm workers once (a Rhai and a Python cell on the warm
    /// path) and read back the pools: what a long-lived surface would get
    /// here.
    pub async fn start(python: Option<&Path>) -> WarmWorkers {
        // Two cells and gone: nothing to prepare for a next one.
        let mut b = Supervisor::builder().warm(true).prepare_runs(false);
        if let Some(p) = python {
            b = b.python(p);
        }
        let sup = match b.build() {
            Ok(s) => s,
            Err(e) => {
                return WarmWorkers::Failed {
                    error: e.to_string(),
                }
            }
        };
        let trial = |lang: Language| {
            let sup = &sup;
            async move {
                let r = sup
                    .run(CellRequest::new(lang, "1"), SessionConfig::default())
                    .await;
                match &r.error {
                    None => r.status.as_str().to_owned(),
                    Some(e) => format!("{}: {}", r.status, e.message),
                }
            }
        };
        let rhai = trial(Language::Rhai).await;
        let python = trial(Language::Python).await;
        WarmWorkers::Started {
            cells: TrialCells { rhai, python },
            pools: Box::new(sup.pool_status().await),
        }
    }
}

/// What a cell gets under `profile` on `host`: the OS layers on Linux,
/// what sandbox-exec gives on macOS.
fn assess(profile: &Profile, host: &HostSupport) -> ProfileAssessment {
    if host.os == "macos" {
        let present = Path::new(crate::macos::launch::SANDBOX_EXEC).is_file();
        return crate::macos::doctor::assess(profile, present);
    }
    doctor::assess(profile, host)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = &self.host;
        writeln!(
            f,
            "cellbox doctor: {} {} kernel {}, running as {}",
            host.os,
            host.arch,
            host.kernel,
            if host.running_as_root {
                "root"
            } else {
                "an unprivileged user"
            }
        )?;
        writeln!(f, "host support:")?;
        let landlock = match host.landlock_abi {
            Some(abi) => format!(
                "yes (ABI {abi}; cellbox uses up to {})",
                host.landlock_pinned_abi
            ),
            None => "NO".into(),
        };
        writeln!(f, "  {:<16} {landlock}", "landlock")?;
        writeln!(f, "  {:<16} {}", "seccomp", yes(host.seccomp))?;
        writeln!(
            f,
            "  {:<16} {}",
            "user namespaces",
            yes(host.user_namespaces)
        )?;
        writeln!(f, "  {:<16} {}", "namespaces", yes(host.namespaces))?;
        writeln!(f, "  {:<16} {}", "mount_setattr", yes(host.mount_setattr))?;
        // The hierarchy cells' memory cgroups are made in (a host may
        // mount cgroup2 and still keep memory on v1).
        let memory = &host.memory_cgroup;
        let memory_line = match (&memory.kind, &memory.dir) {
            (Some(kind), Some(dir)) => format!("{kind} ({})", dir.display()),
            _ => format!(
                "NO: {}",
                memory.problem.as_deref().unwrap_or("no memory controller")
            ),
        };
        writeln!(f, "  {:<16} {memory_line}", "memory cgroup")?;
        if let Some(c) = &host.container {
            writeln!(f, "  {:<16} {c}", "container")?;
        }
        // Which ids cells of a profile with `identity.subordinate_ids =
        // "auto"` get (the others keep the user's own).
        match &host.subordinate_ids {
            Some(Ok(ids)) => writeln!(
                f,
                "  {:<16} yes: cells of profiles with subordinate_ids = \"auto\" run as {ids}",
                "subordinate ids"
            )?,
            Some(Err(why)) => writeln!(
                f,
                "  {:<16} NO ({why}): every cell runs as the user's own uid",
                "subordinate ids"
            )?,
            None => {}
        }
        writeln!(
            f,
            "  {:<16} {}",
            "cgroup2 mounted",
            if host.cgroup_v2 { "yes" } else { "no" }
        )?;
        match &self.python {
            Ok(info) => writeln!(
                f,
                "  {:<16} {} (read-only: {})",
                "python",
                info.executable.display(),
                info.read_only
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )?,
            Err(e) => writeln!(f, "  {:<16} NO: {e}", "python")?,
        }
        for a in &self.profiles {
            writeln!(f)?;
            writeln!(
                f,
                "profile {} ({}): {}",
                a.profile,
                a.source,
                if a.ok {
                    "ok".to_string()
                } else {
                    format!(
                        "REFUSED, missing required: {}",
                        a.missing_required.join(", ")
                    )
                }
            )?;
            writeln!(
                f,
                "  {:<11} {:<12} {:<10} detail",
                "layer", "mode", "available"
            )?;
            for l in &a.layers {
                writeln!(
                    f,
                    "  {:<11} {:<12} {:<10} {}",
                    l.layer,
                    l.mode.as_str(),
                    yes(l.available),
                    l.detail
                )?;
            }
        }
        write!(f, "{}", self.warm_workers)?;
        if !self.advice.is_empty() {
            writeln!(f, "\nwhat would give what is missing here:")?;
            for a in &self.advice {
                writeln!(f, "  {a}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for WarmWorkers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (cells, pools) = match self {
            WarmWorkers::Started { cells, pools } => (Some(cells), Some(pools.as_ref())),
            WarmWorkers::Failed { .. } => (None, None),
        };
        writeln!(f, "warm workers (fork server, Python zygotes):")?;
        writeln!(
            f,
            "  {:<16} rhai cell {}, python cell {}",
            "trial cells",
            cells.map_or("-", |c| c.rhai.as_str()),
            cells.map_or("-", |c| c.python.as_str())
        )?;
        writeln!(
            f,
            "  {:<16} {}",
            "rhai",
            match pools {
                Some(p) if p.rhai_fork_server => format!(
                    "fork server running (pool layers applied once), {} sandboxed spare(s) waiting",
                    p.rhai_spares
                ),
                _ => "NO fork server (cells spawn a fresh worker)".to_owned(),
            }
        )?;
        let zygotes = pools.map_or(0, |p| p.python.iter().filter(|z| z.alive).count());
        writeln!(f, "  {:<16} {zygotes} live zygote(s)", "python")?;
        writeln!(
            f,
            "  {:<16} {}",
            "scratch",
            match pools.and_then(|p| p.scratch_quota_bytes) {
                Some(q) => format!(
                    "{} MiB in all, shared by every cell (tmpfs), each file up to the profile's limit",
                    q >> 20
                ),
                None => "NOT bounded in total (mounting the scratch tmpfs needs root); \
                         each file up to the profile's limit"
                    .to_owned(),
            }
        )?;
        writeln!(
            f,
            "  {:<16} {}",
            "session scratch",
            match pools.and_then(|p| p.session_scratch_quota) {
                Some(q) => format!(
                    "{} MiB and {} inodes per session, its sub-cells included (a tmpfs of \
                     its own, outside the total above)",
                    q.bytes >> 20,
                    q.inodes
                ),
                None => "NOT bounded per session (mounting a tmpfs per session needs root); \
                         sessions share the scratch above"
                    .to_owned(),
            }
        )?;
        writeln!(
            f,
            "  {:<16} {}",
            "memory",
            match pools.map(|p| (p.cells_memory_bytes, p.cells_memory_cgroup.as_deref())) {
                Some((Some(m), Some(cg))) => format!(
                    "{} MiB for all cells together ({cg}), each process up to the profile's limit",
                    m >> 20
                ),
                _ => "NOT bounded in total (making a memory cgroup needs root and a memory \
                      controller); each process up to the profile's limit"
                    .to_owned(),
            }
        )?;
        writeln!(
            f,
            "  {:<16} {}",
            "sessions",
            if pools.is_some_and(|p| p.session_cgroups) {
                "a cgroup each (memory: its cells' limit plus its scratch; processes: twice a \
                 cell's), and one per cell (its processes; the cell ends with its whole process \
                 tree; its CPU time counted for the tree)"
            } else {
                "NOT apart: sessions share the cells' cgroup (per-session cgroups need write \
                 access to a cgroup with the memory and pids controllers: root on cgroup v1 or \
                 v2); a cell's processes in other sessions or groups of its own may outlive it"
            }
        )
    }
}

/// `cellbox doctor`: the report, as text or JSON; exit 6 when a profile's
/// required layer is missing.
pub async fn cli_main(args: DoctorArgs) -> ExitCode {
    let names: Vec<String> = if args.profile.is_empty() {
        BUILTIN_NAMES.iter().map(|n| n.to_string()).collect()
    } else {
        args.profile
    };
    let mut loaded = Vec::new();
    for name in &names {
        match Profile::load(name) {
            Ok(p) => loaded.push(p),
            Err(e) => return usage(e),
        }
    }
    let report = DoctorReport::gather(&loaded, args.python.as_deref()).await;
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                crate::report!("cellbox: failed to encode the report: {e}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    } else {
        print!("{report}");
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::Exit::Sandbox)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::doctor::MemoryCgroup;

    fn bare_host() -> HostSupport {
        HostSupport {
            os: "linux".into(),
            kernel: "6.1".into(),
            arch: "x86_64".into(),
            running_as_root: false,
            landlock_abi: None,
            landlock_pinned_abi: 6,
            seccomp: true,
            user_namespaces: false,
            namespaces: false,
            mount_setattr: false,
            cgroup_v2: false,
            memory_cgroup: MemoryCgroup::default(),
            python: None,
            container: None,
            subordinate_ids: None,
        }
    }

    #[test]
    fn a_supervisor_that_could_not_start_is_reported_as_no_warm_workers() {
        let report = DoctorReport {
            warm_workers: WarmWorkers::Failed {
                error: "no supervisor".into(),
            },
            host: bare_host(),
            python: Err(crate::Error::Python(crate::PythonError::NotFound)),
            profiles: Vec::new(),
            ok: true,
            advice: Vec::new(),
        };
        let text = report.to_string();
        let expected = "\
cellbox doctor: linux x86_64 kernel 6.1, running as an unprivileged user
host support:
  landlock         NO
  seccomp          yes
  user namespaces  NO
  namespaces       NO
  mount_setattr    NO
  memory cgroup    NO: no memory controller
  cgroup2 mounted  no
  python           NO: no Python interpreter found: install python3 or pass --python PATH
warm workers (fork server, Python zygotes):
  trial cells      rhai cell -, python cell -
  rhai             NO fork server (cells spawn a fresh worker)
  python           0 live zygote(s)
";
        assert!(text.starts_with(expected), "{text}");
        assert!(
            text.contains("\n  scratch          NOT bounded in total"),
            "{text}"
        );
        assert!(
            text.contains("\n  memory           NOT bounded in total"),
            "{text}"
        );
        assert!(text.contains("\n  sessions         NOT apart"), "{text}");
        assert!(text.ends_with("may outlive it\n"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["warm_workers"],
            serde_json::json!({"error": "no supervisor"})
        );
        assert_eq!(
            json["python"],
            serde_json::json!({"error": "no Python interpreter found: install python3 or pass --python PATH"})
        );
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["warm_workers", "host", "python", "profiles", "ok", "advice"]
        );
    }
}
