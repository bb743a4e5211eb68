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
pub(crate) fn precompiled_shim(info: &PythonInfo) -> Result<PathBuf, PythonError> {
    shim_file(info).map_err(PythonError::Shim)
}

/// [`precompiled_shim`], made once per supervisor: `None` (said once) when
/// it cannot be, and cells and zygotes run the shim from source.
pub(crate) fn precompiled_once<'a>(
    slot: &'a std::sync::OnceLock<Option<PathBuf>>,
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
}

fn shim_file(info: &PythonInfo) -> Result<PathBuf, String> {
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
    let trusted = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| !m.file_type().is_symlink() && m.uid() == euid && m.mode() & 0o022 == 0)
            .unwrap_or(false)
    };
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
    let path = dir.join(format!("{name}.shim"));
    if path.is_file() && trusted(&path) {
        return Ok(path);
    }
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
    let tmp = tempfile::NamedTempFile::new_in(&dir)
        .map_err(|e| format!("failed to write in {}: {e}", dir.display()))?;
    std::fs::write(tmp.path(), &out.stdout)
        .and_then(|()| std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| format!("failed to write the precompiled shim: {e}"))?;
    tmp.persist(&path)
        .map_err(|e| format!("failed to store the precompiled shim: {e}"))?;
    Ok(path)
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
        assert_eq!(a, b);
        let m = std::fs::metadata(&a).unwrap();
        assert_eq!(
            m.mode() & 0o022,
            0,
            "the cache file must not be writable by others"
        );
        assert!(m.len() > 1000);
    }
}
