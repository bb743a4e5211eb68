//! Finding the real Python interpreter (never a shim such as pyenv's).

use std::path::{Path, PathBuf};

/// The interpreter cells run, and the paths it needs read-only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PythonInfo {
    /// Canonical path of the ELF interpreter.
    pub executable: PathBuf,
    /// Its installation prefix(es), opened read-only in the sandbox.
    pub read_only: Vec<PathBuf>,
}

/// Why the interpreter could not be found or prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PythonError {
    #[error("failed to resolve the Python interpreter {}: {message}", path.display())]
    Resolve { path: PathBuf, message: String },
    #[error(
        "{} is not an ELF executable (a wrapper script such as a pyenv shim?); pass the real interpreter with --python",
        .0.display()
    )]
    NotElf(PathBuf),
    #[error("cannot tell the prefix of {}", .0.display())]
    NoPrefix(PathBuf),
    #[error("no Python interpreter found: install python3 or pass --python PATH")]
    NotFound,
    /// The shim could not be precompiled or cached (cells then run it from
    /// source).
    #[error("{0}")]
    Shim(String),
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map(|()| magic == *b"\x7fELF")
        .unwrap_or(false)
}

fn info_for(exe: &Path) -> Result<PythonInfo, PythonError> {
    let exe = std::fs::canonicalize(exe).map_err(|e| PythonError::Resolve {
        path: exe.to_path_buf(),
        message: e.to_string(),
    })?;
    if !is_elf(&exe) {
        return Err(PythonError::NotElf(exe));
    }
    // <prefix>/bin/python3.X → <prefix>
    let prefix = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| PythonError::NoPrefix(exe.clone()))?
        .to_path_buf();
    Ok(PythonInfo {
        executable: exe,
        read_only: vec![prefix],
    })
}

/// Find the interpreter: `explicit` if given, else `$CELLBOX_PYTHON`, else
/// the first ELF `python3` on PATH, else `/usr/bin/python3`. Wrapper scripts
/// on PATH (pyenv shims) are skipped.
pub(crate) fn resolve(explicit: Option<&Path>) -> Result<PythonInfo, PythonError> {
    if let Some(p) = explicit {
        return info_for(p);
    }
    if let Some(p) = std::env::var_os("CELLBOX_PYTHON") {
        return info_for(Path::new(&p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let cand = dir.join("python3");
            if cand.is_file() {
                if let Ok(real) = std::fs::canonicalize(&cand) {
                    if is_elf(&real) {
                        return info_for(&real);
                    }
                }
            }
        }
    }
    let fallback = Path::new("/usr/bin/python3");
    if fallback.is_file() {
        return info_for(fallback);
    }
    Err(PythonError::NotFound)
}

/// The shim precompiled by `info`'s interpreter, cached in a directory only
/// the supervisor's user can write (`$TMPDIR/cellbox-shim-<euid>/`), keyed by
/// the interpreter (path, size, mtime) and the shim's source. Compiling the
/// shim is most of a fresh interpreter's extra start-up; a cell loads the
/// ready-made code object instead (the file is opened read-only in the
/// sandbox).
///
/// The file is held with a shared lock for as long as the returned value
/// lives. Making or finding it sweeps the directory of the files no living
/// holder has locked (those of other interpreters, of older shims), so the
/// cache does not grow with every upgrade.
pub(crate) fn precompiled_shim(info: &PythonInfo) -> Result<HeldShim, PythonError> {
    shim_file(info).map_err(PythonError::Shim)
}

/// A precompiled shim in use: its path, and a shared `flock` on it that no
/// sweep breaks, released when this is dropped.
pub(crate) struct HeldShim {
    path: PathBuf,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl HeldShim {
    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }
}

impl std::fmt::Debug for HeldShim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldShim")
            .field("path", &self.path)
            .finish()
    }
}

/// [`precompiled_shim`], made once per supervisor and held while it lives:
/// `None` (said once) when it cannot be, and cells and zygotes run the shim
/// from source.
pub(crate) fn precompiled_once<'a>(
    slot: &'a std::sync::OnceLock<Option<HeldShim>>,
    info: &PythonInfo,
) -> Option<&'a PathBuf> {
    slot.get_or_init(|| match precompiled_shim(info) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("running the Python shim from source: {e}");
            None
        }
    })
    .as_ref()
    .map(HeldShim::path)
}

/// The cache's file names end so. Files ending in `.shim` alone were
/// written by supervisors that did not lock theirs, and are never swept.
const SHIM_SUFFIX: &str = ".pyshim";

/// A temporary file left in the cache by a supervisor that died while
/// writing it is removed once it is this old (a write takes milliseconds).
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);

fn shim_file(info: &PythonInfo) -> Result<HeldShim, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let euid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("cellbox-shim-{euid}"));
    match std::fs::create_dir(&dir) {
        Ok(()) => {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("failed to set up {}: {e}", dir.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("failed to create {}: {e}", dir.display())),
    }
    // Trust the directory only if it is ours and nobody else can write it
    // (a planted file would run inside every cell).
    if !trusted(&dir) {
        return Err(format!(
            "{} is not owned by uid {euid} or is writable by others",
            dir.display()
        ));
    }
    let meta = std::fs::metadata(&info.executable)
        .map_err(|e| format!("failed to stat {}: {e}", info.executable.display()))?;
    let mut h = Sha256::new();
    h.update(info.executable.as_os_str().as_encoded_bytes());
    h.update(meta.len().to_le_bytes());
    h.update(meta.mtime().to_le_bytes());
    h.update(crate::worker::python::SHIM.as_bytes());
    h.update(crate::worker::python::LOADER.as_bytes());
    h.update(crate::worker::python::ZYGOTE.as_bytes());
    let name: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    cached(&dir, &name, || {
        let out = std::process::Command::new(&info.executable)
            .args([
                "-I",
                "-S",
                "-B",
                "-c",
                crate::worker::python::SHIM,
                "--precompile",
                crate::worker::python::ZYGOTE,
            ])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("failed to run {}: {e}", info.executable.display()))?;
        if !out.status.success() || out.stdout.is_empty() {
            return Err(format!(
                "precompiling the shim failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(out.stdout)
    })
}

/// Owned by this process's user, not a symlink, and writable by nobody
/// else.
fn trusted(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    std::fs::symlink_metadata(p)
        .map(|m| !m.file_type().is_symlink() && m.uid() == euid && m.mode() & 0o022 == 0)
        .unwrap_or(false)
}

/// The cache file `name` in `dir` (a trusted directory), held: the one
/// there if there is one, else one written with what `make` gives. The
/// directory is swept of what nobody holds either way.
fn cached(
    dir: &Path,
    name: &str,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<HeldShim, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{name}{SHIM_SUFFIX}"));
    let found = |path: PathBuf| -> Result<HeldShim, String> {
        let lock = hold(&path)
            .filter(|_| trusted(&path))
            .ok_or_else(|| format!("{} is being replaced", path.display()))?;
        sweep(dir, &path);
        Ok(HeldShim { path, _lock: lock })
    };
    if trusted(&path) {
        if let Ok(held) = found(path.clone()) {
            return Ok(held);
        }
    } else if std::fs::symlink_metadata(&path).is_ok() {
        // Not as this user writes them: made again.
        std::fs::remove_file(&path)
            .map_err(|e| format!("failed to remove {}: {e}", path.display()))?;
    }
    let bytes = make()?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| format!("failed to write in {}: {e}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, &bytes)
        .and_then(|()| std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| format!("failed to write the precompiled shim: {e}"))?;
    // Locked before it has its name, so no sweep can take it between.
    let lock = tmp
        .as_file()
        .try_clone()
        .map_err(|e| format!("failed to hold the precompiled shim: {e}"))
        .and_then(|f| {
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock)
                .map_err(|(_, e)| format!("failed to lock the precompiled shim: {e}"))
        })?;
    // Never over another supervisor's file of the same name, made at the
    // same time: that one holds its file, not one put in its place.
    match tmp.persist_noclobber(&path) {
        Ok(_) => {
            sweep(dir, &path);
            Ok(HeldShim { path, _lock: lock })
        }
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => found(path),
        Err(e) => Err(format!("failed to store the precompiled shim: {e}")),
    }
}

/// The file at `path`, opened and share-locked, if it is still the file at
/// `path` once locked (a sweep may have removed it between the open and the
/// lock; it then holds an exclusive lock, and this gets none).
fn hold(path: &Path) -> Option<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::File::open(path).ok()?;
    let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).ok()?;
    same_file(&lock, path).then_some(lock)
}

/// Whether `file` is the file that `path` names now (not a symlink).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => !b.file_type().is_symlink() && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Remove from the cache directory every precompiled shim but `keep` that
/// no supervisor holds (an exclusive lock is had without waiting only when
/// no shared one is held), and temporary files left by a supervisor that
/// died writing one. Best effort: what cannot be removed stays.
fn sweep(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == keep {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(SHIM_SUFFIX) {
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let Ok(lock) =
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            else {
                continue; // in use
            };
            if same_file(&lock, &path) {
                match std::fs::remove_file(&path) {
                    Ok(()) => tracing::debug!("removed the unused {}", path.display()),
                    Err(e) => tracing::debug!("could not remove {}: {e}", path.display()),
                }
            }
        } else if name.starts_with(".tmp") {
            let old = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TEMPORARY);
            if old {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_scripts_and_finds_elf() {
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join("python3");
        std::fs::write(&shim, "#!/bin/sh\nexec true\n").unwrap();
        let e = info_for(&shim).unwrap_err();
        assert!(matches!(e, PythonError::NotElf(_)), "{e:?}");
        assert!(e.to_string().contains("not an ELF"), "{e}");
        if Path::new("/usr/bin/python3").exists() {
            let info = info_for(Path::new("/usr/bin/python3")).unwrap();
            assert!(info.executable.starts_with("/usr"));
            assert_eq!(info.read_only, vec![PathBuf::from("/usr")]);
        }
    }

    #[test]
    fn the_precompiled_shim_is_cached_and_private() {
        use std::os::unix::fs::MetadataExt;
        let Ok(info) = info_for(Path::new("/usr/bin/python3")) else {
            panic!("this test needs /usr/bin/python3");
        };
        let a = precompiled_shim(&info).unwrap();
        let b = precompiled_shim(&info).unwrap();
        assert_eq!(a.path(), b.path());
        assert!(a.path().to_string_lossy().ends_with(SHIM_SUFFIX));
        // Held: no sweep could take it while either lives.
        let file = std::fs::File::open(a.path()).unwrap();
        let Err((file, _)) =
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            panic!("a held shim must not be lockable for removal");
        };
        drop((a, b, file));
        let m = std::fs::metadata(precompiled_shim(&info).unwrap().path()).unwrap();
        assert_eq!(
            m.mode() & 0o022,
            0,
            "the cache file must not be writable by others"
        );
        assert!(m.len() > 1000);
    }

    #[test]
    fn the_sweep_takes_only_what_nobody_holds() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let at = |n: &str| dir.path().join(n);
        for n in [
            "keep.pyshim",
            "held.pyshim",
            "unused.pyshim",
            "legacy.shim",
            ".tmpOld",
            ".tmpNew",
        ] {
            std::fs::write(at(n), b"code").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - STALE_TEMPORARY * 2;
        std::fs::File::options()
            .write(true)
            .open(at(".tmpOld"))
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        // Another supervisor holding its shim, the way `hold` does.
        let held = hold(&at("held.pyshim")).expect("an unlocked file can be held");
        // A symlink named like a shim is not followed to its target.
        std::os::unix::fs::symlink(at("keep.pyshim"), at("link.pyshim")).unwrap();
        sweep(dir.path(), &at("keep.pyshim"));
        let left = |n: &str| at(n).exists() || at(n).symlink_metadata().is_ok();
        assert!(left("keep.pyshim"), "the caller's own shim is kept");
        assert!(left("held.pyshim"), "a shim another holder locks is kept");
        assert!(!left("unused.pyshim"), "a shim nobody holds is removed");
        assert!(
            left("legacy.shim"),
            "files of unlocking supervisors are kept"
        );
        assert!(!left(".tmpOld"), "a stale temporary file is removed");
        assert!(left(".tmpNew"), "a temporary file being written is kept");
        assert!(
            std::fs::read(at("keep.pyshim")).is_ok(),
            "the symlink's target is untouched"
        );
        drop(held);
        sweep(dir.path(), &at("keep.pyshim"));
        assert!(!left("held.pyshim"), "let go, it is removed");
        assert!(left("keep.pyshim"));
        // A file being swept cannot be held: the sweep's exclusive lock
        // refuses the shared one, and `hold` says so rather than use it.
        let file = std::fs::File::open(at("keep.pyshim")).unwrap();
        let sweeping = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
        assert!(hold(&at("keep.pyshim")).is_none());
        drop(sweeping);
        // And a file replaced under its name is not the one held.
        let file = std::fs::File::open(at("keep.pyshim")).unwrap();
        std::fs::remove_file(at("keep.pyshim")).unwrap();
        std::fs::write(at("keep.pyshim"), b"other").unwrap();
        assert!(!same_file(&file, &at("keep.pyshim")));
    }

    #[test]
    fn a_cached_shim_is_found_made_or_taken_from_a_concurrent_maker() {
        use nix::fcntl::{Flock, FlockArg};
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let at = |n: &str| dir.path().join(n);
        let locked_for_removal = |p: &Path| {
            let f = std::fs::File::open(p).unwrap();
            Flock::lock(f, FlockArg::LockExclusiveNonblock).is_ok()
        };
        std::fs::write(at("stale.pyshim"), b"old").unwrap();
        // Made when missing, held, and the directory swept.
        let made = cached(dir.path(), "a", || Ok(b"ours".to_vec())).unwrap();
        assert_eq!(made.path(), &at("a.pyshim"));
        assert_eq!(std::fs::read(made.path()).unwrap(), b"ours");
        assert!(!locked_for_removal(made.path()), "made and held");
        assert!(!at("stale.pyshim").exists(), "swept");
        // Found when there: `make` is not run.
        let found = cached(dir.path(), "a", || panic!("must not be made again")).unwrap();
        assert_eq!(found.path(), made.path());
        drop((made, found));
        assert!(
            locked_for_removal(&at("a.pyshim")),
            "let go with its holders"
        );
        // Another maker stores the same name first: its file is the one
        // held, never replaced under it.
        let theirs = cached(dir.path(), "b", || {
            std::fs::write(at("b.pyshim"), b"theirs").unwrap();
            std::fs::set_permissions(at("b.pyshim"), std::fs::Permissions::from_mode(0o644))
                .unwrap();
            Ok(b"ours".to_vec())
        })
        .unwrap();
        assert_eq!(std::fs::read(theirs.path()).unwrap(), b"theirs");
        assert!(!locked_for_removal(theirs.path()));
        // A file others may write is not used: it is made again.
        std::fs::write(at("c.pyshim"), b"planted").unwrap();
        std::fs::set_permissions(at("c.pyshim"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let remade = cached(dir.path(), "c", || Ok(b"ours".to_vec())).unwrap();
        assert_eq!(std::fs::read(remade.path()).unwrap(), b"ours");
        let mode = std::fs::metadata(remade.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o022, 0);
        // What `make` cannot give is said.
        let e = cached(dir.path(), "d", || Err("no interpreter".into())).unwrap_err();
        assert!(e.contains("no interpreter"), "{e}");
    }
}
