//! A profile's `[python]` section: extra read-only package directories and
//! the modules a Python zygote imports ahead of time.
//!
//! ```toml
//! [python]
//! paths = ["/usr/lib/python3/dist-packages"]  # read-only, appended to sys.path
//! preload = ["numpy"]                         # imported by the zygote
//! ```
//!
//! Each path is added to the cell's read-only rules (Landlock and the mount
//! view) and to the end of `sys.path`, after the standard library and before
//! the scratch directory. The zygote imports every `preload` module once,
//! before it forks any cell, so a warm cell finds it in `sys.modules`.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `[python]` section of a profile (empty by default: the standard
/// library only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PythonPackages {
    /// Directories of packages (a virtualenv's site-packages, Debian's
    /// `/usr/lib/python3/dist-packages`): read-only, appended to `sys.path`.
    pub paths: Vec<PathBuf>,
    /// Top-level or dotted module names the zygote imports ahead of time.
    pub preload: Vec<String>,
}

/// Most package paths and preloaded modules one profile may name.
const MAX_ENTRIES: usize = 64;

impl PythonPackages {
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.preload.is_empty()
    }

    /// `Err((key, problem))` for the first invalid entry.
    pub(crate) fn problem(&self) -> Option<(String, String)> {
        if self.paths.len() > MAX_ENTRIES || self.preload.len() > MAX_ENTRIES {
            return Some((
                "python".into(),
                format!("at most {MAX_ENTRIES} paths and {MAX_ENTRIES} preloaded modules"),
            ));
        }
        for (i, p) in self.paths.iter().enumerate() {
            if let Err(problem) = super::check_sandbox_path(p) {
                return Some((
                    format!("python.paths[{i}] ({})", p.display()),
                    problem.to_string(),
                ));
            }
            if p.to_str().is_none() {
                return Some((format!("python.paths[{i}]"), "must be valid UTF-8".into()));
            }
        }
        for (i, m) in self.preload.iter().enumerate() {
            if !valid_module_name(m) {
                return Some((
                    format!("python.preload[{i}] ({m:?})"),
                    "must be a module name such as numpy or matplotlib.pyplot".into(),
                ));
            }
        }
        None
    }

    /// The paths as strings, for `sys.path` (validated to be UTF-8).
    pub fn path_strings(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter_map(|p| p.to_str().map(str::to_owned))
            .collect()
    }
}

/// `a`, `a.b`: dot-separated ASCII identifiers.
fn valid_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|part| {
            let mut bytes = part.bytes();
            matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        for ok in ["numpy", "matplotlib.pyplot", "_x1"] {
            assert!(valid_module_name(ok), "{ok}");
        }
        for bad in ["", "1x", "a..b", "os; import sys", "a.", "é"] {
            assert!(!valid_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn problems_name_the_key() {
        let p = PythonPackages {
            paths: vec!["relative/site-packages".into()],
            preload: vec![],
        };
        let (key, problem) = p.problem().unwrap();
        assert!(key.starts_with("python.paths[0]"), "{key}");
        assert!(problem.contains("absolute"), "{problem}");
        let p = PythonPackages {
            paths: vec!["/usr/lib/python3/dist-packages".into()],
            preload: vec!["numpy".into(), "bad name".into()],
        };
        let (key, _) = p.problem().unwrap();
        assert!(key.starts_with("python.preload[1]"), "{key}");
        assert!(PythonPackages::default().problem().is_none());
    }
}
