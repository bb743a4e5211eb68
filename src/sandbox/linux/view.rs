//! The cell's view of the host filesystem, resolved before any namespace
//! exists: which host paths it sees, how, and which symlinks must be
//! recreated so that the usual names (`/bin`, `/lib64/ld-linux…`) resolve.
//!
//! Both the mount namespace (what exists) and Landlock (what may be done with
//! it) are built from the same [`FsView`], so they cannot disagree. Paths are
//! canonicalized here, on the host, so the later steps never follow a
//! symlink: an entry is mounted at its canonical path inside the new root,
//! and Landlock rules are added for that same path.

use crate::profiles::{check_sandbox_path, PathAccess};
use crate::sandbox::SandboxPlan;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What kind of object an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A regular file (or a device node, bound like a file).
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    /// Canonical host path; also the path inside the cell.
    pub path: PathBuf,
    pub kind: Kind,
    pub access: PathAccess,
    /// Whether the entry needs its own bind mount (false when an ancestor
    /// entry's bind already shows it).
    pub mount: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symlink {
    /// Where the link lives (canonical parent + name).
    pub link: PathBuf,
    /// Its target, as read from the host.
    pub target: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsView {
    pub entries: Vec<ViewEntry>,
    pub symlinks: Vec<Symlink>,
    /// Canonical scratch directory.
    pub scratch: PathBuf,
    /// The scratch directory is made in the new root, not a host directory
    /// (the size of its own tmpfs, if it gets one: see [`SandboxPlan`]).
    pub scratch_in_cell: Option<u64>,
    /// Optional paths that do not exist on this host.
    pub skipped: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("path {path} ({why}) is not usable: {problem}")]
    BadPath {
        path: PathBuf,
        why: String,
        problem: String,
    },
    #[error("failed to resolve {path} ({why}): {source}")]
    Resolve {
        path: PathBuf,
        why: String,
        #[source]
        source: std::io::Error,
    },
    #[error("symlinks nest too deeply at {0}")]
    TooDeep(PathBuf),
}

/// The plan's scratch directory on the host, canonical.
fn host_scratch(plan: &SandboxPlan, scratch_why: &str) -> Result<PathBuf, ViewError> {
    let scratch = plan
        .scratch
        .canonicalize()
        .map_err(|source| ViewError::Resolve {
            path: plan.scratch.clone(),
            why: scratch_why.to_owned(),
            source,
        })?;
    if !scratch.is_dir() {
        return Err(ViewError::BadPath {
            path: plan.scratch.clone(),
            why: scratch_why.to_owned(),
            problem: "not a directory".into(),
        });
    }
    Ok(scratch)
}

/// The canonical form of `path`'s parent, from `cache` or resolved (and
/// kept there).
fn canonical_parent(
    cache: &mut HashMap<PathBuf, PathBuf>,
    path: &Path,
) -> std::io::Result<PathBuf> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    if let Some(c) = cache.get(parent) {
        return Ok(c.clone());
    }
    let c = parent.canonicalize()?;
    cache.insert(parent.to_path_buf(), c.clone());
    Ok(c)
}

/// Resolve the plan's paths on the host.
pub fn resolve(plan: &SandboxPlan) -> Result<FsView, ViewError> {
    let mut view = FsView::default();
    let scratch_why = "scratch directory".to_string();
    check_sandbox_path(&plan.scratch).map_err(|problem| ViewError::BadPath {
        path: plan.scratch.clone(),
        why: scratch_why.clone(),
        problem: problem.to_string(),
    })?;
    if plan.scratch_in_cell {
        view.scratch = plan.scratch.clone();
        view.scratch_in_cell = Some(plan.scratch_in_cell_bytes());
    } else {
        view.scratch = host_scratch(plan, &scratch_why)?;
    }

    // (path, access, optional, why, depth)
    let mut work: Vec<(PathBuf, PathAccess, bool, String, u32)> = plan
        .path_rules()
        .into_iter()
        .map(|r| (r.path, r.access, r.optional, r.why, 0))
        .collect();
    let mut entries: Vec<ViewEntry> = Vec::new();
    // Canonical parents, each resolved once: most paths share a few.
    let mut parents: HashMap<PathBuf, PathBuf> = HashMap::new();
    while let Some((path, access, optional, why, depth)) = work.pop() {
        if depth > 8 {
            return Err(ViewError::TooDeep(path));
        }
        check_sandbox_path(&path).map_err(|problem| ViewError::BadPath {
            path: path.clone(),
            why: why.clone(),
            problem: problem.to_string(),
        })?;
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && optional => {
                view.skipped.push(path);
                continue;
            }
            Err(source) => return Err(ViewError::Resolve { path, why, source }),
        };
        let resolve_err = |source| ViewError::Resolve {
            path: path.clone(),
            why: why.clone(),
            source,
        };
        if meta.file_type().is_symlink() {
            let canon_parent = canonical_parent(&mut parents, &path).map_err(resolve_err)?;
            let target = std::fs::read_link(&path).map_err(resolve_err)?;
            let resolved = match path.canonicalize() {
                Ok(p) => p,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && optional => {
                    view.skipped.push(path);
                    continue;
                }
                Err(e) => return Err(resolve_err(e)),
            };
            if let Some(name) = path.file_name() {
                let link = canon_parent.join(name);
                if !view.symlinks.iter().any(|s| s.link == link) {
                    view.symlinks.push(Symlink { link, target });
                }
            }
            work.push((resolved, access, optional, why, depth + 1));
            continue;
        }
        // Not a symlink itself: its canonical path is its parent's and its
        // own name (`.` and `..` were refused above).
        let canonical = match path.file_name() {
            Some(name) => canonical_parent(&mut parents, &path)
                .map_err(resolve_err)?
                .join(name),
            None => path.canonicalize().map_err(resolve_err)?,
        };
        let kind = if meta.is_dir() { Kind::Dir } else { Kind::File };
        match entries.iter_mut().find(|e| e.path == canonical) {
            Some(e) => e.access = e.access.max(access),
            None => entries.push(ViewEntry {
                path: canonical,
                kind,
                access,
                mount: true,
            }),
        }
    }

    // Parents before children, so an ancestor's bind covers its descendants.
    entries.sort_by(|a, b| {
        (a.path.components().count(), &a.path).cmp(&(b.path.components().count(), &b.path))
    });
    let mut mounted: Vec<PathBuf> = Vec::new();
    for e in &mut entries {
        if mounted.iter().any(|m| e.path.starts_with(m)) {
            e.mount = false;
        } else {
            mounted.push(e.path.clone());
        }
    }
    // A link inside a bound directory already exists there.
    view.symlinks
        .retain(|s| !mounted.iter().any(|m| s.link.starts_with(m)));
    view.symlinks.sort_by(|a, b| a.link.cmp(&b.link));
    view.entries = entries;
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::{PathRule, Profile};
    use std::os::unix::fs::symlink;

    fn plan_with(paths: Vec<PathRule>, scratch: &Path) -> SandboxPlan {
        let p = Profile::load("rhai").unwrap();
        let mut plan = SandboxPlan::new(&p, scratch.to_path_buf(), p.default_limits());
        plan.paths = paths;
        plan
    }

    fn rule(path: &Path, access: PathAccess, optional: bool) -> PathRule {
        PathRule {
            path: path.to_path_buf(),
            access,
            optional,
            why: "test".into(),
            arch: None,
        }
    }

    #[test]
    fn symlinks_are_recreated_and_targets_mounted_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/tool"), b"x").unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        symlink("tool", root.join("usr/bin/alias")).unwrap();
        let scratch = root.join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        let plan = plan_with(
            vec![
                rule(&root.join("usr"), PathAccess::Read, false),
                rule(&root.join("bin"), PathAccess::Exec, false),
                rule(&root.join("usr/bin/alias"), PathAccess::Exec, false),
                rule(&root.join("missing"), PathAccess::Read, true),
                // Beneath a symlinked directory: resolved through it.
                rule(&root.join("bin/tool"), PathAccess::Read, false),
            ],
            &scratch,
        );
        let view = resolve(&plan).unwrap();
        assert_eq!(view.scratch, scratch);
        assert_eq!(view.skipped, vec![root.join("missing")]);
        // /bin → usr/bin is recreated; the alias inside /usr is not (the bind
        // of /usr shows it).
        assert_eq!(
            view.symlinks,
            vec![Symlink {
                link: root.join("bin"),
                target: "usr/bin".into()
            }]
        );
        let usr = view
            .entries
            .iter()
            .find(|e| e.path == root.join("usr"))
            .unwrap();
        assert!(usr.mount);
        assert_eq!(usr.access, PathAccess::Read);
        let bin = view
            .entries
            .iter()
            .find(|e| e.path == root.join("usr/bin"))
            .unwrap();
        assert!(!bin.mount, "covered by the bind of usr");
        assert_eq!(bin.access, PathAccess::Exec);
        assert_eq!(bin.kind, Kind::Dir);
        let tool = view
            .entries
            .iter()
            .find(|e| e.path == root.join("usr/bin/tool"))
            .unwrap();
        assert_eq!(tool.kind, Kind::File);
        assert_eq!(tool.access, PathAccess::Exec);
        // bin/tool is usr/bin/tool, not a path of its own.
        assert!(!view.entries.iter().any(|e| e.path == root.join("bin/tool")));
        assert_eq!(
            view.entries
                .iter()
                .filter(|e| e.path == root.join("usr/bin/tool"))
                .count(),
            1
        );
    }

    #[test]
    fn missing_mandatory_path_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_with(
            vec![rule(&dir.path().join("nope"), PathAccess::Read, false)],
            dir.path(),
        );
        let err = resolve(&plan).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn relative_and_dotdot_paths_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["usr", "/usr/../etc"] {
            let plan = plan_with(
                vec![rule(Path::new(bad), PathAccess::Read, false)],
                dir.path(),
            );
            assert!(
                matches!(resolve(&plan), Err(ViewError::BadPath { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn builtin_profiles_resolve_on_this_host() {
        let dir = tempfile::tempdir().unwrap();
        for name in crate::profiles::BUILTIN_NAMES {
            let p = Profile::load(name).unwrap();
            let plan = SandboxPlan::new(&p, dir.path().to_path_buf(), p.default_limits());
            let view = resolve(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
            if *name == "rhai" {
                // The engine is already loaded: a Rhai cell sees no host path.
                assert!(view.entries.is_empty(), "{:?}", view.entries);
            } else {
                assert!(view
                    .entries
                    .iter()
                    .any(|e| e.path == Path::new("/usr") && e.mount));
            }
        }
    }
}
