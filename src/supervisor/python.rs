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

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map(|()| magic == *b"\x7fELF")
        .unwrap_or(false)
}

fn info_for(exe: &Path) -> Result<PythonInfo, String> {
    let exe = std::fs::canonicalize(exe).map_err(|e| {
        format!(
            "failed to resolve the Python interpreter {}: {e}",
            exe.display()
        )
    })?;
    if !is_elf(&exe) {
        return Err(format!(
            "{} is not an ELF executable (a wrapper script such as a pyenv shim?); pass the real interpreter with --python",
            exe.display()
        ));
    }
    // <prefix>/bin/python3.X → <prefix>
    let prefix = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("cannot tell the prefix of {}", exe.display()))?
        .to_path_buf();
    Ok(PythonInfo {
        executable: exe,
        read_only: vec![prefix],
    })
}

/// Find the interpreter: `explicit` if given, else `$CELLBOX_PYTHON`, else
/// the first ELF `python3` on PATH, else `/usr/bin/python3`. Wrapper scripts
/// on PATH (pyenv shims) are skipped.
pub(crate) fn resolve(explicit: Option<&Path>) -> Result<PythonInfo, String> {
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
    Err("no Python interpreter found: install python3 or pass --python PATH".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_scripts_and_finds_elf() {
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join("python3");
        std::fs::write(&shim, "#!/bin/sh\nexec true\n").unwrap();
        assert!(info_for(&shim).unwrap_err().contains("not an ELF"));
        if Path::new("/usr/bin/python3").exists() {
            let info = info_for(Path::new("/usr/bin/python3")).unwrap();
            assert!(info.executable.starts_with("/usr"));
            assert_eq!(info.read_only, vec![PathBuf::from("/usr")]);
        }
    }
}
