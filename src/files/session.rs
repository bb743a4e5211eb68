//! Files in and out of a session's scratch directory, for `serve`'s
//! `upload_file`, `download_file` and `list_files`.
//!
//! Paths are relative to the scratch directory. `..`, absolute paths and
//! symlinks anywhere in the path are refused: every open goes through
//! [`open_beneath`] from the directory's fd with symlinks refused, so the
//! kernel holds the line even when a cell swaps a directory for a symlink
//! while a call runs. Only regular files are read; sizes are capped both
//! ways. Files and directories made by an upload belong to the scratch
//! directory's owner (the cells' uid), so the next cell can change them.

use super::{make_dirs_beneath, DirStepError};
use crate::sandbox::beneath::{open_beneath, Symlinks};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Bytes one upload may write by default.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 << 20;
/// Bytes one download may return by default: as base64 it stays well
/// within the 1 MiB response the strictest official MCP client accepts.
pub const DEFAULT_MAX_DOWNLOAD_BYTES: u64 = 512 << 10;
/// Entries `list_files` returns at most.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// An upload, download or listing refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionFileError {
    #[error("{path:?}: an absolute path; paths are relative to the session's working directory")]
    Absolute { path: String },
    #[error("{path:?}: '..' is not allowed; paths stay inside the session's working directory")]
    Parent { path: String },
    #[error("the path is empty: name a file in the session's working directory")]
    Empty,
    #[error("{path:?} goes through a symlink, which is never followed")]
    Symlink { path: String },
    #[error("{path:?} leaves the session's working directory")]
    Outside { path: String },
    #[error("{path:?} not found in the session's working directory")]
    NotFound { path: String },
    #[error("{path:?} is a {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path:?} is not a directory")]
    NotDirectory { path: String },
    #[error("{path:?}: {size} bytes is over the {what} limit of {max} bytes")]
    TooLarge {
        path: String,
        size: u64,
        max: u64,
        what: &'static str,
    },
    #[error("invalid base64 content: {0}")]
    Base64(String),
    #[error("unknown encoding {0:?}: use \"utf-8\" or \"base64\"")]
    Encoding(String),
    #[error(
        "{path:?}: the session's scratch space is full (its quota); remove files first \
         (the file is left empty)"
    )]
    Full { path: String },
    #[error("failed to {verb} {path:?}: {source}")]
    Io {
        verb: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl SessionFileError {
    fn open(verb: &'static str, path: &str, e: io::Error) -> Self {
        let path = path.to_owned();
        match e.raw_os_error() {
            Some(libc::ELOOP) => SessionFileError::Symlink { path },
            Some(libc::EXDEV) => SessionFileError::Outside { path },
            Some(libc::ENOENT) => SessionFileError::NotFound { path },
            Some(libc::ENOTDIR) => SessionFileError::NotDirectory { path },
            _ => SessionFileError::Io {
                verb,
                path,
                source: e,
            },
        }
    }
}

/// How the content of an upload or download is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Utf8,
    Base64,
}

impl Encoding {
    pub fn parse(name: &str) -> Result<Encoding, SessionFileError> {
        match name {
            "utf-8" | "utf8" => Ok(Encoding::Utf8),
            "base64" => Ok(Encoding::Base64),
            other => Err(SessionFileError::Encoding(other.to_owned())),
        }
    }
}

/// The size limits of the session file tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionFileLimits {
    pub max_upload_bytes: u64,
    pub max_download_bytes: u64,
}

impl Default for SessionFileLimits {
    fn default() -> Self {
        SessionFileLimits {
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_download_bytes: DEFAULT_MAX_DOWNLOAD_BYTES,
        }
    }
}

/// A relative path with no `..` and no root, as a `PathBuf` (`.` for the
/// directory itself when `dir_ok`).
fn relative(path: &str, dir_ok: bool) -> Result<PathBuf, SessionFileError> {
    let p = Path::new(path);
    if path.is_empty() || (!dir_ok && matches!(path, "." | "./")) {
        return if dir_ok {
            Ok(PathBuf::from("."))
        } else {
            Err(SessionFileError::Empty)
        };
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(SessionFileError::Parent {
                    path: path.to_owned(),
                })
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(SessionFileError::Absolute {
                    path: path.to_owned(),
                })
            }
        }
    }
    if out.as_os_str().is_empty() {
        if dir_ok {
            return Ok(PathBuf::from("."));
        }
        return Err(SessionFileError::Empty);
    }
    Ok(out)
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// One session's working directory, opened.
pub struct SessionDir {
    fd: OwnedFd,
    owner: (u32, u32),
    limits: SessionFileLimits,
}

impl SessionDir {
    pub fn open(dir: &Path, limits: SessionFileLimits) -> Result<SessionDir, SessionFileError> {
        let io = |source| SessionFileError::Io {
            verb: "open the session's working directory",
            path: String::new(),
            source,
        };
        let f = File::open(dir).map_err(io)?;
        let meta = f.metadata().map_err(io)?;
        Ok(SessionDir {
            fd: OwnedFd::from(f),
            owner: (meta.uid(), meta.gid()),
            limits,
        })
    }

    fn give(&self, fd: impl AsFd, shown: &str) -> Result<(), SessionFileError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(());
        }
        let (uid, gid) = self.owner;
        nix::unistd::fchown(
            fd,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(|e| SessionFileError::Io {
            verb: "hand over",
            path: shown.to_owned(),
            source: e.into(),
        })
    }

    /// Missing parent directories of `rel`, made one by one (never through
    /// a symlink).
    fn make_parents(&self, rel: &Path, shown: &str) -> Result<(), SessionFileError> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        let fail = |step| match step {
            DirStepError::Outside => SessionFileError::Outside {
                path: shown.to_owned(),
            },
            DirStepError::Open(e) => SessionFileError::open("open", shown, e),
            DirStepError::Create(source) => SessionFileError::Io {
                verb: "create the directory",
                path: shown.to_owned(),
                source,
            },
        };
        make_dirs_beneath(self.fd.as_fd(), parent, fail, |made| {
            let fd = self.open_rel(made, libc::O_DIRECTORY | libc::O_RDONLY, 0, "open", shown)?;
            self.give(&fd, shown)
        })
    }

    /// `rel` opened beneath the directory, symlinks refused; an error names
    /// `shown` and says what failed (`verb`).
    fn open_rel(
        &self,
        rel: &Path,
        flags: libc::c_int,
        mode: libc::mode_t,
        verb: &'static str,
        shown: &str,
    ) -> Result<OwnedFd, SessionFileError> {
        open_beneath(self.fd.as_fd(), rel, flags, mode, Symlinks::Refuse)
            .map_err(|e| SessionFileError::open(verb, shown, e))
    }

    /// `upload_file`: create or replace `path` with `content`.
    pub fn upload(
        &self,
        path: &str,
        content: &str,
        encoding: Encoding,
    ) -> Result<Value, SessionFileError> {
        let rel = relative(path, false)?;
        let shown = rel.to_string_lossy().into_owned();
        let max = self.limits.max_upload_bytes;
        let bytes = match encoding {
            Encoding::Utf8 => content.as_bytes().to_vec(),
            Encoding::Base64 => {
                // Checked before decoding: base64 is 4/3 of the bytes.
                if content.len() as u64 / 4 * 3 > max + 3 {
                    return Err(SessionFileError::TooLarge {
                        path: shown,
                        size: content.len() as u64 / 4 * 3,
                        max,
                        what: "max_upload_bytes",
                    });
                }
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(content.trim())
                    .map_err(|e| SessionFileError::Base64(e.to_string()))?
            }
        };
        if bytes.len() as u64 > max {
            return Err(SessionFileError::TooLarge {
                path: shown,
                size: bytes.len() as u64,
                max,
                what: "max_upload_bytes",
            });
        }
        self.make_parents(&rel, &shown)?;
        // An existing entry must be a regular file (not a symlink, FIFO or
        // directory) before it is opened for writing.
        match open_beneath(self.fd.as_fd(), &rel, libc::O_PATH, 0, Symlinks::Refuse) {
            Ok(probe) => {
                let meta = File::from(probe)
                    .metadata()
                    .map_err(|e| SessionFileError::open("stat", &shown, e))?;
                if !meta.file_type().is_file() {
                    return Err(SessionFileError::NotRegular {
                        path: shown,
                        kind: kind_of(meta.file_type()),
                    });
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(SessionFileError::open("open", &shown, e)),
        }
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = self.open_rel(&rel, flags, 0o644, "create", &shown)?;
        let mut file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| SessionFileError::open("stat", &shown, e))?;
        if !meta.file_type().is_file() {
            return Err(SessionFileError::NotRegular {
                path: shown,
                kind: kind_of(meta.file_type()),
            });
        }
        self.give(&file, &shown)?;
        let io = |source| SessionFileError::Io {
            verb: "write",
            path: shown.clone(),
            source,
        };
        file.set_len(0).map_err(io)?;
        if let Err(e) = file.write_all(&bytes) {
            // What was written of it is given back (through the descriptor:
            // never a path, which a cell could have swapped meanwhile).
            let _ = file.set_len(0);
            return Err(match e.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => SessionFileError::Full { path: shown },
                _ => io(e),
            });
        }
        Ok(json!({"path": shown, "bytes": bytes.len()}))
    }

    /// `download_file`: a regular file's bytes (at most
    /// `max_download_bytes`) and its size.
    pub fn download(&self, path: &str) -> Result<(String, Vec<u8>), SessionFileError> {
        let rel = relative(path, false)?;
        let shown = rel.to_string_lossy().into_owned();
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = self.open_rel(&rel, flags, 0, "open", &shown)?;
        let file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| SessionFileError::open("stat", &shown, e))?;
        if !meta.file_type().is_file() {
            return Err(SessionFileError::NotRegular {
                path: shown,
                kind: kind_of(meta.file_type()),
            });
        }
        let max = self.limits.max_download_bytes;
        if meta.len() > max {
            return Err(SessionFileError::TooLarge {
                path: shown,
                size: meta.len(),
                max,
                what: "max_download_bytes",
            });
        }
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| SessionFileError::Io {
                verb: "read",
                path: shown.clone(),
                source,
            })?;
        if bytes.len() as u64 > max {
            return Err(SessionFileError::TooLarge {
                path: shown,
                size: bytes.len() as u64,
                max,
                what: "max_download_bytes",
            });
        }
        Ok((shown, bytes))
    }

    /// `list_files`: the entries of a directory (not recursive), sorted by
    /// name, with their kind and size.
    pub fn list(&self, path: &str) -> Result<Value, SessionFileError> {
        let rel = relative(path, true)?;
        let shown = rel.to_string_lossy().into_owned();
        let fd = self.open_rel(&rel, libc::O_RDONLY | libc::O_DIRECTORY, 0, "open", &shown)?;
        let stat_fd = fd.try_clone().map_err(|source| SessionFileError::Io {
            verb: "list",
            path: shown.clone(),
            source,
        })?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| SessionFileError::Io {
            verb: "list",
            path: shown.clone(),
            source: e.into(),
        })?;
        let mut entries = Vec::new();
        let mut total = 0usize;
        for entry in dir.iter() {
            let entry = entry.map_err(|e| SessionFileError::Io {
                verb: "list",
                path: shown.clone(),
                source: e.into(),
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            total += 1;
            if entries.len() >= MAX_LIST_ENTRIES {
                continue;
            }
            let st = nix::sys::stat::fstatat(
                &stat_fd,
                entry.file_name(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            let (kind, size) = match st {
                Ok(st) => {
                    let fmt = st.st_mode & libc::S_IFMT;
                    let kind = match fmt {
                        libc::S_IFREG => "file",
                        libc::S_IFDIR => "directory",
                        libc::S_IFLNK => "symlink",
                        _ => "other",
                    };
                    (kind, (fmt == libc::S_IFREG).then_some(st.st_size as u64))
                }
                Err(_) => ("unknown", None),
            };
            entries.push(json!({"name": name, "type": kind, "size": size}));
        }
        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        let mut out = json!({"path": shown, "entries": entries});
        if total > MAX_LIST_ENTRIES {
            out["truncated"] = json!({"total": total, "kept": MAX_LIST_ENTRIES});
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, SessionDir) {
        let t = tempfile::tempdir().unwrap();
        let d = SessionDir::open(
            t.path(),
            SessionFileLimits {
                max_upload_bytes: 10,
                max_download_bytes: 10,
            },
        )
        .unwrap();
        (t, d)
    }

    #[test]
    fn paths_are_relative_and_stay_beneath() {
        assert_eq!(relative("a/./b", false).unwrap(), PathBuf::from("a/b"));
        assert_eq!(relative("", true).unwrap(), PathBuf::from("."));
        assert!(matches!(relative("", false), Err(SessionFileError::Empty)));
        assert!(matches!(
            relative("/etc/passwd", false),
            Err(SessionFileError::Absolute { .. })
        ));
        assert!(matches!(
            relative("a/../../x", false),
            Err(SessionFileError::Parent { .. })
        ));
    }

    #[test]
    fn upload_download_list_and_refusals() {
        let (t, d) = dir();
        d.upload("sub/a.txt", "hello", Encoding::Utf8).unwrap();
        d.upload("b.bin", "AAEC", Encoding::Base64).unwrap();
        assert_eq!(std::fs::read(t.path().join("sub/a.txt")).unwrap(), b"hello");
        assert_eq!(d.download("b.bin").unwrap().1, vec![0, 1, 2]);
        let l = d.list(".").unwrap();
        let names: Vec<_> = l["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].clone())
            .collect();
        assert_eq!(names, [json!("b.bin"), json!("sub")]);
        let e = d.upload("big", "01234567890", Encoding::Utf8).unwrap_err();
        assert!(e.to_string().contains("max_upload_bytes"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("link")).unwrap();
        for e in [
            d.download("link").unwrap_err(),
            d.upload("link", "x", Encoding::Utf8).unwrap_err(),
        ] {
            assert!(matches!(e, SessionFileError::Symlink { .. }), "{e:?}");
        }
        std::os::unix::fs::symlink("/tmp", t.path().join("dirlink")).unwrap();
        let e = d.upload("dirlink/x", "x", Encoding::Utf8).unwrap_err();
        assert!(matches!(e, SessionFileError::Symlink { .. }), "{e:?}");
        let e = d.download("sub").unwrap_err();
        assert!(matches!(e, SessionFileError::NotRegular { .. }), "{e:?}");
        std::fs::write(t.path().join("large"), [0u8; 11]).unwrap();
        let e = d.download("large").unwrap_err();
        assert!(e.to_string().contains("max_download_bytes"), "{e}");
    }
}
