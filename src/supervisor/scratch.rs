//! Scratch directories made on first use. A warm Rhai cell never needs one
//! (its sandbox grants no file access at all), and making and removing a
//! directory costs more than the rest of such a cell.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A scratch directory beneath `parent`, created the first time its path
/// is asked for and removed with the last handle.
#[derive(Debug)]
pub(crate) struct Scratch {
    parent: PathBuf,
    prefix: &'static str,
    dir: OnceLock<tempfile::TempDir>,
}

impl Scratch {
    pub(crate) fn new(parent: PathBuf, prefix: &'static str) -> Scratch {
        Scratch {
            parent,
            prefix,
            dir: OnceLock::new(),
        }
    }

    /// The directory, made now if it does not exist yet.
    pub(crate) fn path(&self) -> std::io::Result<&Path> {
        if let Some(d) = self.dir.get() {
            return Ok(d.path());
        }
        let made = tempfile::Builder::new()
            .prefix(self.prefix)
            .tempdir_in(&self.parent)?;
        // Two callers racing both make one; the loser's is removed at once.
        Ok(self.dir.get_or_init(|| made).path())
    }

    /// The directory if it was made.
    #[cfg(test)]
    pub(crate) fn made(&self) -> Option<&Path> {
        self.dir.get().map(tempfile::TempDir::path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_on_first_use_and_removed_on_drop() {
        let parent = tempfile::tempdir().unwrap();
        let s = Scratch::new(parent.path().to_path_buf(), "cellbox-");
        assert!(s.made().is_none());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
        let p = s.path().unwrap().to_path_buf();
        assert!(p.is_dir() && p.starts_with(parent.path()));
        assert_eq!(s.path().unwrap(), p, "the same directory every time");
        std::fs::write(p.join("f"), "x").unwrap();
        drop(s);
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_parent_is_an_error_not_a_panic() {
        let s = Scratch::new(PathBuf::from("/nonexistent/cellbox-test"), "cellbox-");
        assert!(s.path().is_err());
    }
}
