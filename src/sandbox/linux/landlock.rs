//! The Landlock layer: what the cell may do with the paths it can see.
//!
//! Read-only for backend paths, execute only for the plan's `exec` entries
//! (and the dynamic loader the profile lists), read-write only for the
//! scratch directory and the private `/tmp`. TCP bind/connect are handled
//! with no rule, so both are denied (ABI ≥ 4); abstract unix sockets and
//! signals are scoped to the cell (ABI ≥ 6).
//!
//! The ABI is pinned: cellbox asks for at most [`PINNED_ABI`], the version it
//! is tested against, and for exactly what the running kernel supports below
//! that, as a hard requirement. The ruleset must then report
//! `FullyEnforced`; anything less is an error, never a silent downgrade.

use super::view::{FsView, Kind};
use crate::profiles::PathAccess;
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The newest Landlock ABI cellbox is tested against.
pub const PINNED_ABI: u32 = 6;

/// What a rule grants, before it is turned into ABI-specific rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Read files / list directories beneath.
    Read,
    /// Read and execute beneath.
    Exec,
    /// Everything but execute and device creation beneath.
    ReadWrite,
    /// A device node that may be written (`/dev/null`).
    DeviceReadWrite,
    /// List directories beneath, read no file (the cell's own root, which
    /// holds only what the view put there).
    ListDirs,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub kind: Kind,
    pub grant: Grant,
}

/// Every Landlock rule for a view. `in_namespace` says whether the paths are
/// inside the cell's own root (with private `/tmp` and synthetic `/etc`
/// files) or the host's.
pub fn rules(view: &FsView, tmp: bool, in_namespace: bool) -> Vec<Rule> {
    let mut out: Vec<Rule> = view
        .entries
        .iter()
        .map(|e| Rule {
            path: e.path.clone(),
            kind: e.kind,
            grant: match e.access {
                PathAccess::Read => Grant::Read,
                PathAccess::Exec => Grant::Exec,
                PathAccess::ReadWrite => Grant::ReadWrite,
            },
        })
        .collect();
    out.push(Rule {
        path: view.scratch.clone(),
        kind: Kind::Dir,
        grant: Grant::ReadWrite,
    });
    out.push(Rule {
        path: "/proc".into(),
        kind: Kind::Dir,
        grant: Grant::Read,
    });
    for dev in super::mounts::DEVICES {
        out.push(Rule {
            path: (*dev).into(),
            kind: Kind::File,
            grant: if *dev == "/dev/null" {
                Grant::DeviceReadWrite
            } else {
                Grant::Read
            },
        });
    }
    if in_namespace {
        out.push(Rule {
            path: "/".into(),
            kind: Kind::Dir,
            grant: Grant::ListDirs,
        });
        if tmp {
            out.push(Rule {
                path: "/tmp".into(),
                kind: Kind::Dir,
                grant: Grant::ReadWrite,
            });
        }
        for f in ["/etc/passwd", "/etc/group"] {
            out.push(Rule {
                path: f.into(),
                kind: Kind::File,
                grant: Grant::Read,
            });
        }
    }
    // A rule beneath a directory rule that already grants all it would is
    // left out: Landlock grants the union of the rules on a path's
    // ancestors, so it adds nothing, and every rule costs an open and a
    // syscall in every cell.
    let covered: Vec<bool> = out
        .iter()
        .map(|r| {
            out.iter().any(|p| {
                p.kind == Kind::Dir
                    && p.path != r.path
                    && r.path.starts_with(&p.path)
                    && covers(p.grant, r.grant)
            })
        })
        .collect();
    out.into_iter()
        .zip(covered)
        .filter_map(|(r, c)| (!c).then_some(r))
        .collect()
}

/// Whether every right of `inner` is also a right of `outer`, at every ABI.
fn covers(outer: Grant, inner: Grant) -> bool {
    use Grant::*;
    match (outer, inner) {
        (a, b) if a == b => true,
        (_, ListDirs) => outer != DeviceReadWrite,
        (Exec | ReadWrite, Read) => true,
        (ReadWrite, DeviceReadWrite) => true,
        _ => false,
    }
}

/// The rights a rule grants under `abi`.
pub fn access(rule: &Rule, abi: ABI) -> BitFlags<AccessFs> {
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let all = AccessFs::from_all(abi);
    let rights = match rule.grant {
        Grant::Read => read,
        Grant::Exec => read | AccessFs::Execute,
        Grant::ReadWrite => all & !(AccessFs::Execute | AccessFs::MakeChar | AccessFs::MakeBlock),
        Grant::DeviceReadWrite => AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
        Grant::ListDirs => AccessFs::ReadDir.into(),
    };
    let rights = rights & all;
    match rule.kind {
        Kind::Dir => rights,
        Kind::File => rights & AccessFs::from_file(abi),
    }
}

fn abi_of(version: u32) -> ABI {
    ABI::from(i32::try_from(version.min(PINNED_ABI)).unwrap_or(0))
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("Landlock is not available on this kernel")]
    Unavailable,
    #[error("failed to open {path} for a Landlock rule: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: landlock::PathFdError,
    },
    #[error("failed to build the Landlock ruleset: {0}")]
    Ruleset(#[source] landlock::RulesetError),
    #[error("Landlock ruleset was only {0:?} (the filesystem rules must be fully enforced)")]
    NotEnforced(String),
    #[error("failed to duplicate the rule fd for {0}: {1}")]
    Dup(PathBuf, #[source] std::io::Error),
}

/// What was enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforced {
    pub abi: u32,
    pub detail: String,
}

/// A new ruleset, with no rules yet, for the kernel's ABI `abi` used up to
/// version `used` (at most [`PINNED_ABI`]), as a hard requirement: every
/// filesystem right handled, TCP bind/connect handled with no rule, so
/// denied (ABI ≥ 4), abstract unix sockets and signals scoped (ABI ≥ 6).
/// Also what it covers besides the filesystem, for a report.
fn ruleset(abi: ABI, used: u32) -> Result<(RulesetCreated, Vec<String>), LandlockError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(LandlockError::Ruleset)?;
    let mut covers = Vec::new();
    if used >= 4 {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(LandlockError::Ruleset)?;
        covers.push("tcp bind/connect denied".into());
    }
    if used >= 6 {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .map_err(LandlockError::Ruleset)?;
        covers.push("abstract unix sockets and signals scoped".into());
    }
    let created = ruleset.create().map_err(LandlockError::Ruleset)?;
    Ok((created, covers))
}

/// The rule's path opened `O_PATH`, or `None` for a missing optional one
/// (a device node the host lacks was not mounted either).
fn open(rule: &Rule) -> Result<Option<PathFd>, LandlockError> {
    match PathFd::new(&rule.path) {
        Ok(fd) => Ok(Some(fd)),
        Err(_) if is_optional(&rule.path) => Ok(None),
        Err(source) => Err(LandlockError::Open {
            path: rule.path.clone(),
            source,
        }),
    }
}

/// Restrict the calling process with `rules`, against the kernel's ABI
/// `kernel_abi` (from [`super::sys::landlock_abi`]).
pub fn apply(rules: &[Rule], kernel_abi: Option<u32>) -> Result<Enforced, LandlockError> {
    let version = kernel_abi.ok_or(LandlockError::Unavailable)?;
    let abi = abi_of(version);
    let used = version.min(PINNED_ABI);
    let (mut created, covers) = ruleset(abi, used)?;
    let mut detail = vec![format!("fs rules={}", rules.len())];
    detail.extend(covers);
    for rule in rules {
        let Some(fd) = open(rule)? else {
            continue;
        };
        created = created
            .add_rule(PathBeneath::new(fd, access(rule, abi)))
            .map_err(LandlockError::Ruleset)?;
    }
    let status = created.restrict_self().map_err(LandlockError::Ruleset)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(LandlockError::NotEnforced(format!("{:?}", status.ruleset)));
    }
    Ok(Enforced {
        abi: used,
        detail: format!("ABI {used} (kernel {version}): {}", detail.join(", ")),
    })
}

/// A cell's Landlock rules prepared once per zygote: every path opened
/// (`O_PATH`) ahead of time, so each cell's ruleset costs only the syscalls
/// that build it. See [`CellRules::ruleset`].
#[derive(Debug)]
pub struct CellRules {
    fds: Vec<(OwnedFd, BitFlags<AccessFs>)>,
    abi: ABI,
    used: u32,
}

impl CellRules {
    /// `rules` are host paths (bind-mounted at the same path in the zygote,
    /// so the same inodes); `anchors` are fds of paths that exist only in
    /// the zygote's mount namespace, with what each grants. The scratch rule
    /// is added per cell.
    pub fn prepare(
        rules: &[Rule],
        anchors: Vec<(OwnedFd, Kind, Grant)>,
        kernel_abi: Option<u32>,
    ) -> Result<CellRules, LandlockError> {
        let version = kernel_abi.ok_or(LandlockError::Unavailable)?;
        let abi = abi_of(version);
        let mut fds = Vec::new();
        for rule in rules {
            let Some(fd) = open(rule)? else {
                continue;
            };
            let owned = fd
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| LandlockError::Dup(rule.path.clone(), e))?;
            fds.push((owned, access(rule, abi)));
        }
        for (fd, kind, grant) in anchors {
            let rule = Rule {
                path: PathBuf::new(),
                kind,
                grant,
            };
            fds.push((fd, access(&rule, abi)));
        }
        Ok(CellRules {
            fds,
            abi,
            used: version.min(PINNED_ABI),
        })
    }

    /// The ABI the rulesets are built for.
    pub fn abi(&self) -> u32 {
        self.used
    }

    /// A new ruleset (not enforced on anyone yet) granting the prepared
    /// rules plus read-write beneath `scratch`, handling every filesystem
    /// right, TCP bind/connect (ABI ≥ 4) and scoping signals and abstract
    /// unix sockets (ABI ≥ 6). Whoever calls `landlock_restrict_self` with
    /// it gets a domain nested in its current one.
    pub fn ruleset(&self, scratch: &Path) -> Result<OwnedFd, LandlockError> {
        let abi = self.abi;
        let (mut created, _) = ruleset(abi, self.used)?;
        for (fd, rights) in &self.fds {
            created = created
                .add_rule(PathBeneath::new(fd.as_fd(), *rights))
                .map_err(LandlockError::Ruleset)?;
        }
        let scratch_fd = PathFd::new(scratch).map_err(|source| LandlockError::Open {
            path: scratch.to_path_buf(),
            source,
        })?;
        let rw = Rule {
            path: scratch.to_path_buf(),
            kind: Kind::Dir,
            grant: Grant::ReadWrite,
        };
        created = created
            .add_rule(PathBeneath::new(scratch_fd, access(&rw, abi)))
            .map_err(LandlockError::Ruleset)?;
        Option::<OwnedFd>::from(created).ok_or(LandlockError::Unavailable)
    }
}

fn is_optional(path: &Path) -> bool {
    path == Path::new("/dev/random") || path == Path::new("/dev/urandom")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::linux::view::ViewEntry;
    use crate::sandbox::testing::{errno, in_child};

    fn view(dir: &Path) -> FsView {
        FsView {
            entries: vec![
                ViewEntry {
                    path: "/usr".into(),
                    kind: Kind::Dir,
                    access: PathAccess::Read,
                    mount: true,
                },
                ViewEntry {
                    path: "/usr/bin/true".into(),
                    kind: Kind::File,
                    access: PathAccess::Exec,
                    mount: false,
                },
            ],
            symlinks: vec![],
            scratch: dir.to_path_buf(),
            scratch_in_cell: None,
            skipped: vec![],
        }
    }

    #[test]
    fn rules_grant_write_only_to_scratch_and_tmp() {
        let v = view(Path::new("/s"));
        let r = rules(&v, true, true);
        let writable: Vec<_> = r
            .iter()
            .filter(|r| access(r, ABI::V6).contains(AccessFs::WriteFile))
            .map(|r| r.path.clone())
            .collect();
        assert_eq!(
            writable,
            vec![PathBuf::from("/s"), "/dev/null".into(), "/tmp".into()]
        );
        let exec: Vec<_> = r
            .iter()
            .filter(|r| access(r, ABI::V6).contains(AccessFs::Execute))
            .map(|r| r.path.clone())
            .collect();
        assert_eq!(exec, vec![PathBuf::from("/usr/bin/true")]);
        // Inside its namespace the cell may list its own (minimal) root.
        let root = r.iter().find(|r| r.path == Path::new("/")).unwrap();
        assert_eq!(access(root, ABI::V6), BitFlags::from(AccessFs::ReadDir));
        // Outside a namespace neither the host root, nor /tmp is granted.
        let r = rules(&v, true, false);
        assert!(!r.iter().any(|r| r.path == Path::new("/")));
        assert!(!r.iter().any(|r| r.path == Path::new("/tmp")));
        assert!(!r.iter().any(|r| r.path == Path::new("/etc/passwd")));
    }

    #[test]
    fn a_rule_beneath_one_that_grants_as_much_is_left_out() {
        let grants = [
            Grant::Read,
            Grant::Exec,
            Grant::ReadWrite,
            Grant::DeviceReadWrite,
            Grant::ListDirs,
        ];
        // `covers` agrees with the rights themselves, at every ABI.
        for abi in [ABI::V1, ABI::V4, ABI::V6] {
            for outer in grants {
                for inner in grants {
                    let r = |grant| Rule {
                        path: "/d".into(),
                        kind: Kind::Dir,
                        grant,
                    };
                    let (o, i) = (access(&r(outer), abi), access(&r(inner), abi));
                    if covers(outer, inner) {
                        assert!(o.contains(i), "{outer:?} {inner:?} {abi:?}");
                    }
                }
            }
        }
        let mut v = view(Path::new("/tmp/cellbox-x"));
        v.entries.push(ViewEntry {
            path: "/usr/lib".into(),
            kind: Kind::Dir,
            access: PathAccess::Read,
            mount: false,
        });
        v.entries.push(ViewEntry {
            path: "/usr/bin".into(),
            kind: Kind::Dir,
            access: PathAccess::Exec,
            mount: false,
        });
        let r = rules(&v, true, true);
        let paths: Vec<&Path> = r.iter().map(|r| r.path.as_path()).collect();
        // Read beneath read /usr, the scratch beneath read-write /tmp: out.
        assert!(!paths.contains(&Path::new("/usr/lib")), "{paths:?}");
        assert!(!paths.contains(&Path::new("/tmp/cellbox-x")), "{paths:?}");
        // Exec is more than /usr grants: kept; /usr/bin/true beneath it: out.
        assert!(paths.contains(&Path::new("/usr/bin")), "{paths:?}");
        assert!(!paths.contains(&Path::new("/usr/bin/true")), "{paths:?}");
        assert!(paths.contains(&Path::new("/usr")), "{paths:?}");
    }

    #[test]
    fn file_rules_only_carry_file_rights() {
        let rule = Rule {
            path: "/x".into(),
            kind: Kind::File,
            grant: Grant::ReadWrite,
        };
        let a = access(&rule, ABI::V6);
        assert!(!a.contains(AccessFs::ReadDir));
        assert!(!a.contains(AccessFs::MakeReg));
        assert!(a.contains(AccessFs::WriteFile));
    }

    #[test]
    fn abi_is_pinned() {
        assert_eq!(abi_of(9), ABI::V6);
        assert_eq!(abi_of(3), ABI::V3);
    }

    #[test]
    fn enforced_in_a_child() {
        let kernel = super::super::sys::landlock_abi();
        assert!(
            kernel.is_some(),
            "this host has no Landlock: the landlock layer cannot be tested"
        );
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let outside = outside.path().join("f");
        let v = view(&scratch);
        let out = in_child(move || {
            super::super::sys::set_no_new_privs().map_err(|e| e.to_string())?;
            let r = rules(&v, false, false);
            let e = apply(&r, kernel).map_err(|e| e.to_string())?;
            let inside = std::fs::write(scratch.join("ok"), b"1").is_ok();
            let denied = match std::fs::write(&outside, b"1") {
                Err(e) => e.raw_os_error() == Some(libc::EACCES),
                Ok(()) => false,
            };
            let etc = std::fs::read("/etc/hostname").is_err() && errno() != 0;
            let usr = std::fs::read_dir("/usr").is_ok();
            Ok(format!("{} {inside} {denied} {etc} {usr}", e.abi))
        })
        .unwrap();
        let abi = kernel.unwrap().min(PINNED_ABI);
        assert_eq!(out, format!("{abi} true true true true"));
    }
}
