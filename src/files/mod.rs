//! File tools: read, list and search files under operator-declared roots,
//! and write or edit files in one workspace.
//!
//! Terms: a **root** is a directory named in `[files] roots` (read-only) or
//! `[files] workspace` (read-write). A tool path is relative to the only root,
//! or `ROOTNAME/...` (the root directory's own name) when there are several.
//!
//! Every file and directory is opened through
//! [`crate::sandbox::beneath::open_beneath`] from the root's directory fd, so
//! the kernel refuses `..`, absolute paths and symlinks that would leave the
//! root, atomically: there is no string check to race. Walks (`list_dir`
//! with a glob, `search_files`) open each directory from the root fd by its
//! whole relative path with symlinks refused, so a directory swapped for a
//! symlink mid-walk is skipped, never followed, and a directory moved out of
//! the root is no longer found. Special files (FIFOs, devices, sockets) are
//! refused after an `O_PATH` open and `fstat`, before anything opens them
//! for reading; the file then opened for reading must be the same inode.
//!
//! Hard links: a hard link is the same inode as its target wherever that
//! lives, so no path resolution can tell a link into `/etc` from an ordinary
//! file. Regular files with more than one link are therefore refused unless
//! `allow_hardlinks = true` (for trees whose owner knows where every link
//! points).
//!
//! Tenants: a call made for a [`Tenant`] with a workspace of its own (a
//! named principal of `serve`) writes and reads `WORKSPACE/NAME` as its
//! workspace root, opened beneath the workspace with symlinks refused, so
//! one principal never reaches another's files; the read-only roots are
//! shared. Each workspace (the shared one and every principal's) holds at
//! most `max_workspace_bytes` in regular files and `max_workspace_files`
//! entries: a write past either is refused before anything is written.

pub mod session;
mod tools;
mod walk;

pub use tools::capabilities;

use crate::supervisor::Tenant;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

use crate::sandbox::beneath::{open_beneath, Symlinks};

/// Bytes `read_file` returns at most by default.
pub const DEFAULT_MAX_READ_BYTES: u64 = 1 << 20;
/// Bytes `write_file` / `edit_file` may write by default.
pub const DEFAULT_MAX_WRITE_BYTES: u64 = 1 << 20;
/// Ceiling of `search_files`'s `max_results`, whatever a caller asks for.
pub const MAX_SEARCH_RESULTS: usize = 1000;
/// Bytes of one matching line kept in a search result.
pub const MAX_LINE_BYTES: usize = 400;
/// Bytes a workspace may hold in regular files, by default.
pub const DEFAULT_MAX_WORKSPACE_BYTES: u64 = 64 << 20;
/// Entries (files, directories, anything) a workspace may hold, by default.
pub const DEFAULT_MAX_WORKSPACE_FILES: u64 = 10_000;

/// `[files]` in the config file. No roots and no workspace (the default)
/// means no file tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Read-only roots.
    pub roots: Vec<PathBuf>,
    /// The one read-write root (`write_file`, `edit_file`).
    pub workspace: Option<PathBuf>,
    /// Bytes `read_file` reads at most; a longer file is returned truncated.
    pub max_read_bytes: u64,
    /// Bytes `write_file` and `edit_file` may write.
    pub max_write_bytes: u64,
    /// Files `search_files` skips when larger (counted in `skipped_large`).
    pub max_search_file_bytes: u64,
    /// Bytes of one line a search thread holds at most: a file with a
    /// longer line is skipped (counted in `skipped_long_lines`).
    pub max_search_line_bytes: u64,
    /// Entries a walk visits at most (`list_dir` with a glob, `search_files`).
    pub max_walk_entries: usize,
    /// Read regular files that have more than one hard link. Off: such a
    /// file may be a link to anywhere on the same filesystem.
    pub dangerously_allow_hardlinks: bool,
    /// Bytes of regular files one workspace may hold (each principal's of
    /// its own, see the module docs).
    pub max_workspace_bytes: u64,
    /// Entries (files and directories) one workspace may hold.
    pub max_workspace_files: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            roots: Vec::new(),
            workspace: None,
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
            max_write_bytes: DEFAULT_MAX_WRITE_BYTES,
            max_search_file_bytes: 64 << 20,
            max_search_line_bytes: 1 << 20,
            max_walk_entries: 200_000,
            dangerously_allow_hardlinks: false,
            max_workspace_bytes: DEFAULT_MAX_WORKSPACE_BYTES,
            max_workspace_files: DEFAULT_MAX_WORKSPACE_FILES,
        }
    }
}

impl FilesConfig {
    /// True when no root and no workspace is declared.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty() && self.workspace.is_none()
    }
}

/// A file tool refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("failed to open the root {path}")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("two roots are named {0:?}: roots are addressed by their directory's name")]
    DuplicateRoot(String),
    #[error("unknown root {name:?} in {path:?}; paths start with one of: {known}")]
    UnknownRoot {
        name: String,
        path: String,
        known: String,
    },
    #[error(
        "{path:?} is outside the root (absolute paths, '..' and symlinks leaving it are refused)"
    )]
    Outside { path: String },
    #[error("{path:?} goes through a symlink, which this tool does not follow")]
    Symlink { path: String },
    #[error("{path:?} not found")]
    NotFound { path: String },
    #[error("{path:?} is a {kind}, not a regular file: refused without reading it")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path:?} has {links} hard links: refused, since a hard link may lead anywhere on its filesystem")]
    Hardlinked { path: String, links: u64 },
    #[error("{path:?} changed while it was being opened")]
    Changed { path: String },
    #[error("{path:?} is not in the workspace: only the workspace is writable")]
    ReadOnly { path: String },
    #[error("{path:?}: {size} bytes is over max_write_bytes ({max})")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{path:?} is binary or not UTF-8: it cannot be edited")]
    Binary { path: String },
    #[error("edit_file {path:?}: the old text occurs {count} times; it must occur exactly once")]
    EditMatch { path: String, count: usize },
    #[error("invalid search pattern: {0}")]
    Pattern(String),
    #[error("invalid glob {glob:?}: {message}")]
    Glob { glob: String, message: String },
    #[error("invalid arguments: {0}")]
    Args(String),
    #[error("[files] {key} must be at least {min}")]
    Config { key: &'static str, min: u64 },
    #[error(
        "{path:?}: the workspace would hold {would} {what}, over its quota of {max} ({key}); \
         it holds {now} now: overwrite files with less, or ask the operator for room"
    )]
    Quota {
        path: String,
        what: &'static str,
        key: &'static str,
        now: u64,
        would: u64,
        max: u64,
    },
    #[error("the principal name {0:?} cannot name a workspace directory")]
    TenantName(String),
    #[error("the call was cancelled")]
    Cancelled,
    #[error("failed to {verb} {path:?}")]
    Io {
        verb: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// The error of a failed open of `path`, named by what the kernel said.
    fn open(verb: &'static str, path: &str, e: io::Error) -> Self {
        let path = path.to_owned();
        match e.raw_os_error() {
            Some(libc::EXDEV) => FileError::Outside { path },
            Some(libc::ELOOP) => FileError::Symlink { path },
            Some(libc::ENOENT) => FileError::NotFound { path },
            _ => FileError::Io {
                verb,
                path,
                source: e,
            },
        }
    }
}

#[derive(Clone)]
pub(crate) struct Root {
    pub(crate) name: String,
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) writable: bool,
}

/// A workspace directory (the configured one, or a tenant's beneath it)
/// and what it holds, counted at its first write and kept up to date by
/// the writes after it (all made here, one at a time).
pub(crate) struct Workspace {
    fd: Arc<OwnedFd>,
    usage: Mutex<Option<Usage>>,
}

/// What a workspace holds.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    bytes: u64,
    files: u64,
}

/// The configured roots, opened. [`Files::scoped`] gives the view one
/// call works with: its tenant's workspace, its cancellation.
pub struct Files {
    pub(crate) roots: Vec<Root>,
    pub(crate) cfg: FilesConfig,
    /// Every workspace in use, by tenant directory ("": the workspace).
    workspaces: Arc<Mutex<HashMap<String, Arc<Workspace>>>>,
    /// The workspace this view writes.
    workspace: Option<Arc<Workspace>>,
    /// Walks and searches stop once it is cancelled.
    cancel: Option<CancellationToken>,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files")
            .field(
                "roots",
                &self.roots.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What kind of file a mode is, in words.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Text or binary: a NUL byte or bytes that are not UTF-8 (a character cut
/// by the read cap at the very end does not count).
fn as_text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s),
        Err(e) if e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

impl Files {
    /// Open the roots of `cfg`. Each root is addressed by its directory's
    /// name, which must be unique.
    pub fn open(cfg: &FilesConfig) -> Result<Self, FileError> {
        if cfg.max_workspace_bytes == 0 {
            return Err(FileError::Config {
                key: "max_workspace_bytes",
                min: 1,
            });
        }
        if cfg.max_workspace_files == 0 {
            return Err(FileError::Config {
                key: "max_workspace_files",
                min: 1,
            });
        }
        if cfg.max_search_line_bytes < 4096 {
            return Err(FileError::Config {
                key: "max_search_line_bytes",
                min: 4096,
            });
        }
        let mut roots: Vec<Root> = Vec::new();
        let all = cfg
            .roots
            .iter()
            .map(|p| (p, false))
            .chain(cfg.workspace.iter().map(|p| (p, true)));
        for (path, writable) in all {
            let fd = File::open(path)
                .and_then(|f| {
                    if f.metadata()?.is_dir() {
                        Ok(OwnedFd::from(f))
                    } else {
                        Err(io::Error::from_raw_os_error(libc::ENOTDIR))
                    }
                })
                .map_err(|source| FileError::OpenRoot {
                    path: path.clone(),
                    source,
                })?;
            let name = std::fs::canonicalize(path)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "root".to_owned());
            if roots.iter().any(|r| r.name == name) {
                return Err(FileError::DuplicateRoot(name));
            }
            roots.push(Root {
                name,
                fd: Arc::new(fd),
                writable,
            });
        }
        let workspace = roots.iter().find(|r| r.writable).map(|r| {
            Arc::new(Workspace {
                fd: r.fd.clone(),
                usage: Mutex::new(None),
            })
        });
        let workspaces = workspace
            .iter()
            .map(|w| (String::new(), w.clone()))
            .collect();
        Ok(Files {
            roots,
            cfg: cfg.clone(),
            workspaces: Arc::new(Mutex::new(workspaces)),
            workspace,
            cancel: None,
        })
    }

    pub fn has_workspace(&self) -> bool {
        self.roots.iter().any(|r| r.writable)
    }

    /// The view of one call made for `tenant` (none: the supervisor's own
    /// caller), stopping early once `cancel` is: the read-only roots, and
    /// as the workspace the tenant's own directory beneath it (made now if
    /// need be) when it has one, else the workspace itself.
    pub fn scoped(
        &self,
        tenant: Option<&Tenant>,
        cancel: Option<CancellationToken>,
    ) -> Result<Files, FileError> {
        let mut view = Files {
            roots: self.roots.clone(),
            cfg: self.cfg.clone(),
            workspaces: self.workspaces.clone(),
            workspace: self.workspace.clone(),
            cancel,
        };
        let (Some(dir), Some(base)) = (tenant.and_then(Tenant::workspace), &self.workspace) else {
            return Ok(view);
        };
        let ws = {
            let mut map = crate::util::lock(&self.workspaces);
            match map.get(dir) {
                Some(w) => w.clone(),
                None => {
                    let w = Arc::new(Workspace {
                        fd: Arc::new(tenant_dir(&base.fd, dir)?),
                        usage: Mutex::new(None),
                    });
                    map.insert(dir.to_owned(), w.clone());
                    w
                }
            }
        };
        for r in view.roots.iter_mut().filter(|r| r.writable) {
            r.fd = ws.fd.clone();
        }
        view.workspace = Some(ws);
        Ok(view)
    }

    /// Whether the call this view is for was cancelled.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.is_cancelled())
    }

    /// The root a tool path names and the path relative to it.
    fn locate<'a>(&'a self, path: &str) -> Result<(&'a Root, PathBuf), FileError> {
        let p = Path::new(path);
        if p.is_absolute() {
            return Err(FileError::Outside {
                path: path.to_owned(),
            });
        }
        if let [only] = self.roots.as_slice() {
            let rel = if path.is_empty() { "." } else { path };
            return Ok((only, PathBuf::from(rel)));
        }
        let mut comps = p.components();
        let first = match comps.next() {
            Some(Component::Normal(n)) => n.to_string_lossy().into_owned(),
            _ => String::new(),
        };
        let Some(root) = self.roots.iter().find(|r| r.name == first) else {
            return Err(FileError::UnknownRoot {
                name: first,
                path: path.to_owned(),
                known: self
                    .roots
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let rest = comps.as_path();
        let rel = if rest.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rest.to_owned()
        };
        Ok((root, rel))
    }

    /// The tool path of `rel` beneath `root`.
    fn shown(&self, root: &Root, rel: &Path) -> String {
        let rel = rel.strip_prefix(".").unwrap_or(rel);
        if self.roots.len() == 1 {
            if rel.as_os_str().is_empty() {
                ".".to_owned()
            } else {
                rel.to_string_lossy().into_owned()
            }
        } else {
            Path::new(&root.name)
                .join(rel)
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Open a regular file beneath `root` for `flags` after checking, on an
    /// `O_PATH` fd, that it is a regular file with one link; the fd opened
    /// then must be that same inode.
    fn open_regular(
        &self,
        root: &Root,
        rel: &Path,
        shown: &str,
        flags: libc::c_int,
        symlinks: Symlinks,
    ) -> Result<(File, std::fs::Metadata), FileError> {
        let probe = open_beneath(root.fd.as_fd(), rel, libc::O_PATH, 0, symlinks)
            .map_err(|e| FileError::open("open", shown, e))?;
        let meta = File::from(probe)
            .metadata()
            .map_err(|e| FileError::open("stat", shown, e))?;
        self.check_regular(&meta, shown)?;
        let fd = open_beneath(
            root.fd.as_fd(),
            rel,
            flags | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
            symlinks,
        )
        .map_err(|e| FileError::open("open", shown, e))?;
        let file = File::from(fd);
        let again = file
            .metadata()
            .map_err(|e| FileError::open("stat", shown, e))?;
        if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) {
            return Err(FileError::Changed {
                path: shown.to_owned(),
            });
        }
        self.check_regular(&again, shown)?;
        Ok((file, again))
    }

    fn check_regular(&self, meta: &std::fs::Metadata, shown: &str) -> Result<(), FileError> {
        if !meta.file_type().is_file() {
            return Err(FileError::NotRegular {
                path: shown.to_owned(),
                kind: kind_of(meta.file_type()),
            });
        }
        if meta.nlink() > 1 && !self.cfg.dangerously_allow_hardlinks {
            return Err(FileError::Hardlinked {
                path: shown.to_owned(),
                links: meta.nlink(),
            });
        }
        Ok(())
    }

    /// `read_file`: the text of a file, or of lines `start..=end` (1-based),
    /// from its first `max_read_bytes`.
    pub fn read_file(
        &self,
        path: &str,
        start_line: Option<u64>,
        end_line: Option<u64>,
    ) -> Result<Value, FileError> {
        let (root, rel) = self.locate(path)?;
        let shown = self.shown(root, &rel);
        let (file, meta) =
            self.open_regular(root, &rel, &shown, libc::O_RDONLY, Symlinks::FollowBeneath)?;
        let cap = self.cfg.max_read_bytes;
        let mut bytes = Vec::new();
        file.take(cap)
            .read_to_end(&mut bytes)
            .map_err(|source| FileError::Io {
                verb: "read",
                path: shown.clone(),
                source,
            })?;
        let truncated = meta.len() > bytes.len() as u64;
        let Some(text) = as_text(&bytes) else {
            return Ok(json!({"path": shown, "binary": true, "size": meta.len()}));
        };
        let start = start_line.unwrap_or(1).max(1);
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let total = lines.len() as u64;
        let end = end_line.unwrap_or(total).min(total);
        let content: String = if start > end {
            String::new()
        } else {
            lines[(start - 1) as usize..end as usize].concat()
        };
        let mut out = Map::new();
        out.insert("path".into(), json!(shown));
        out.insert("start_line".into(), json!(start));
        out.insert("end_line".into(), json!(end.max(start.saturating_sub(1))));
        out.insert("content".into(), json!(content));
        out.insert("size".into(), json!(meta.len()));
        if truncated {
            out.insert("truncated".into(), json!(true));
            out.insert(
                "note".into(),
                json!(format!(
                    "only the first {cap} bytes were read (max_read_bytes)"
                )),
            );
        } else {
            out.insert("total_lines".into(), json!(total));
        }
        Ok(Value::Object(out))
    }

    /// `write_file`: create or replace a file in the workspace (missing
    /// parent directories are created).
    pub fn write_file(&self, path: &str, content: &str) -> Result<Value, FileError> {
        let (root, rel) = self.locate(path)?;
        let shown = self.shown(root, &rel);
        if !root.writable {
            return Err(FileError::ReadOnly { path: shown });
        }
        let size = content.len() as u64;
        if size > self.cfg.max_write_bytes {
            return Err(FileError::TooLarge {
                path: shown,
                size,
                max: self.cfg.max_write_bytes,
            });
        }
        // One write at a time per workspace: its usage is checked and
        // brought up to date under this lock.
        let ws = self.workspace.clone();
        let mut usage = match &ws {
            Some(ws) => Some(self.usage_of(ws)?),
            None => None,
        };
        if let Some((_, now)) = usage.as_mut() {
            let missing = missing_dirs(root, rel.parent().unwrap_or(Path::new(".")));
            let old = match open_beneath(root.fd.as_fd(), &rel, libc::O_PATH, 0, Symlinks::Refuse)
                .and_then(|fd| File::from(fd).metadata())
            {
                Ok(m) if m.is_file() => Some(m.len()),
                _ => None,
            };
            let would = Usage {
                bytes: now.bytes - old.unwrap_or(0).min(now.bytes) + size,
                files: now.files + missing + u64::from(old.is_none()),
            };
            self.check_quota(&shown, *now, would)?;
            *now = would;
        }
        // Whatever fails from here, the usage is counted afresh next time.
        let wrote = self.write_new(root, &rel, &shown, content);
        if let (Some((mut guard, now)), Ok(_)) = (usage, &wrote) {
            *guard = Some(now);
        }
        wrote.map(|()| json!({"path": shown, "bytes": size}))
    }

    /// The usage of `ws`, counted now if not yet known, with its lock held
    /// (given back cleared: the caller puts the new usage back once its
    /// write succeeded).
    fn usage_of<'a>(
        &self,
        ws: &'a Workspace,
    ) -> Result<(std::sync::MutexGuard<'a, Option<Usage>>, Usage), FileError> {
        let mut guard = crate::util::lock(&ws.usage);
        let now = match guard.take() {
            Some(u) => u,
            None => count_usage(&ws.fd, self.cfg.max_walk_entries),
        };
        Ok((guard, now))
    }

    fn check_quota(&self, shown: &str, now: Usage, would: Usage) -> Result<(), FileError> {
        let quota = |what, key, now, would, max| {
            Err(FileError::Quota {
                path: shown.to_owned(),
                what,
                key,
                now,
                would,
                max,
            })
        };
        if would.bytes > self.cfg.max_workspace_bytes && would.bytes > now.bytes {
            return quota(
                "bytes",
                "max_workspace_bytes",
                now.bytes,
                would.bytes,
                self.cfg.max_workspace_bytes,
            );
        }
        if would.files > self.cfg.max_workspace_files && would.files > now.files {
            return quota(
                "files",
                "max_workspace_files",
                now.files,
                would.files,
                self.cfg.max_workspace_files,
            );
        }
        Ok(())
    }

    /// Write `content` as the file `rel` beneath `root`, making its
    /// missing parent directories.
    fn write_new(
        &self,
        root: &Root,
        rel: &Path,
        shown: &str,
        content: &str,
    ) -> Result<(), FileError> {
        let shown = shown.to_owned();
        if let Some(parent) = rel.parent() {
            self.make_dirs(root, parent, &shown)?;
        }
        let existing = match self.open_regular(root, rel, &shown, libc::O_WRONLY, Symlinks::Refuse)
        {
            Ok((f, _)) => Some(f),
            Err(FileError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let mut file = match existing {
            Some(f) => f,
            None => {
                let fd = open_beneath(
                    root.fd.as_fd(),
                    rel,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY,
                    0o644,
                    Symlinks::Refuse,
                )
                .map_err(|e| FileError::open("create", &shown, e))?;
                File::from(fd)
            }
        };
        let io = |source| FileError::Io {
            verb: "write",
            path: shown.clone(),
            source,
        };
        file.set_len(0).map_err(io)?;
        file.write_all(content.as_bytes()).map_err(io)?;
        Ok(())
    }

    fn make_dirs(&self, root: &Root, dir: &Path, shown: &str) -> Result<(), FileError> {
        let fail = |step| match step {
            DirStepError::Outside => FileError::Outside {
                path: shown.to_owned(),
            },
            DirStepError::Open(e) => FileError::open("open", shown, e),
            DirStepError::Create(source) => FileError::Io {
                verb: "create the directory",
                path: shown.to_owned(),
                source,
            },
        };
        make_dirs_beneath(root.fd.as_fd(), dir, fail, |_| Ok(()))
    }

    /// `edit_file`: replace the one occurrence of `old` with `new`.
    pub fn edit_file(&self, path: &str, old: &str, new: &str) -> Result<Value, FileError> {
        let (root, rel) = self.locate(path)?;
        let shown = self.shown(root, &rel);
        if !root.writable {
            return Err(FileError::ReadOnly { path: shown });
        }
        if old.is_empty() {
            return Err(FileError::Args("old_text must not be empty".into()));
        }
        let (mut file, meta) =
            self.open_regular(root, &rel, &shown, libc::O_RDWR, Symlinks::Refuse)?;
        let max = self.cfg.max_write_bytes;
        if meta.len() > max {
            return Err(FileError::TooLarge {
                path: shown,
                size: meta.len(),
                max,
            });
        }
        let io = |verb, source| FileError::Io {
            verb,
            path: shown.clone(),
            source,
        };
        let mut bytes = Vec::new();
        (&mut file)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io("read", e))?;
        let text = match String::from_utf8(bytes) {
            Ok(t) if !t.contains('\0') => t,
            _ => return Err(FileError::Binary { path: shown }),
        };
        let count = text.matches(old).count();
        if count != 1 {
            return Err(FileError::EditMatch { path: shown, count });
        }
        let edited = text.replacen(old, new, 1);
        if edited.len() as u64 > max {
            return Err(FileError::TooLarge {
                path: shown,
                size: edited.len() as u64,
                max,
            });
        }
        let ws = self.workspace.clone();
        let mut usage = match &ws {
            Some(ws) => Some(self.usage_of(ws)?),
            None => None,
        };
        if let Some((_, now)) = usage.as_mut() {
            let would = Usage {
                bytes: now.bytes - meta.len().min(now.bytes) + edited.len() as u64,
                files: now.files,
            };
            self.check_quota(&shown, *now, would)?;
            *now = would;
        }
        file.set_len(0).map_err(|e| io("write", e))?;
        file.rewind().map_err(|e| io("write", e))?;
        file.write_all(edited.as_bytes())
            .map_err(|e| io("write", e))?;
        if let Some((mut guard, now)) = usage {
            *guard = Some(now);
        }
        Ok(json!({"path": shown, "bytes": edited.len()}))
    }
}

/// A step of [`make_dirs_beneath`] that failed.
pub(crate) enum DirStepError {
    /// The path has a component that is not a plain name.
    Outside,
    /// A directory on the way could not be opened (a symlink, not a
    /// directory, gone).
    Open(io::Error),
    /// A missing directory could not be made.
    Create(io::Error),
}

/// Make the missing directories of `dir` (relative to `root`) one by one,
/// mode 0755, never through a symlink. `made` is called with each one made
/// (relative to `root`); `fail` turns a failed step into the caller's error.
pub(crate) fn make_dirs_beneath<E>(
    root: std::os::fd::BorrowedFd<'_>,
    dir: &Path,
    fail: impl Fn(DirStepError) -> E,
    mut made: impl FnMut(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let mut sofar = PathBuf::new();
    for c in dir.components() {
        let name = match c {
            Component::Normal(n) => n,
            Component::CurDir => continue,
            _ => return Err(fail(DirStepError::Outside)),
        };
        let parent = if sofar.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            sofar.clone()
        };
        sofar.push(name);
        let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
        match open_beneath(root, &sofar, dir_flags, 0, Symlinks::Refuse) {
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(fail(DirStepError::Open(e))),
        }
        let pfd = open_beneath(root, &parent, dir_flags, 0, Symlinks::Refuse)
            .map_err(|e| fail(DirStepError::Open(e)))?;
        match nix::sys::stat::mkdirat(&pfd, name, nix::sys::stat::Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(fail(DirStepError::Create(e.into()))),
        }
        made(&sofar)?;
    }
    Ok(())
}

/// The workspace directory `name` of a tenant beneath the workspace
/// `base`, made (mode 0700) if missing; never through a symlink, never
/// `.`, `..` or a path.
fn tenant_dir(base: &OwnedFd, name: &str) -> Result<OwnedFd, FileError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(FileError::TenantName(name.to_owned()));
    }
    let shown = format!("workspace of {name}");
    match nix::sys::stat::mkdirat(base, name, nix::sys::stat::Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => {
            return Err(FileError::Io {
                verb: "create",
                path: shown,
                source: e.into(),
            })
        }
    }
    open_beneath(
        base.as_fd(),
        Path::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        Symlinks::Refuse,
    )
    .map_err(|e| FileError::open("open", &shown, e))
}

/// The directories of `dir` (relative to `root`) that do not exist yet.
fn missing_dirs(root: &Root, dir: &Path) -> u64 {
    let mut sofar = PathBuf::new();
    let mut missing = 0;
    for c in dir.components() {
        let Component::Normal(name) = c else { continue };
        sofar.push(name);
        if missing > 0
            || open_beneath(
                root.fd.as_fd(),
                &sofar,
                libc::O_PATH | libc::O_DIRECTORY,
                0,
                Symlinks::Refuse,
            )
            .is_err()
        {
            missing += 1;
        }
    }
    missing
}

/// What the directory `fd` holds: bytes of its regular files and its
/// entries, every level down (symlinks counted, never followed), at most
/// `max_entries` of them looked at.
fn count_usage(fd: &OwnedFd, max_entries: usize) -> Usage {
    use nix::dir::{Dir, Type};
    use nix::fcntl::{AtFlags, OFlag};
    let mut usage = Usage::default();
    let mut seen = 0usize;
    let Ok(first) = nix::unistd::dup(fd) else {
        return usage;
    };
    let mut stack = vec![first];
    while let Some(dir_fd) = stack.pop() {
        let Ok(at) = nix::unistd::dup(&dir_fd) else {
            continue;
        };
        let Ok(mut dir) = Dir::from_fd(dir_fd) else {
            continue;
        };
        for e in dir.iter().flatten() {
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            seen += 1;
            if seen > max_entries {
                return usage;
            }
            usage.files += 1;
            match e.file_type() {
                Some(Type::Directory) => {
                    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
                    if let Ok(sub) =
                        nix::fcntl::openat(&at, name, flags, nix::sys::stat::Mode::empty())
                    {
                        stack.push(sub);
                    }
                }
                Some(Type::File) | None => {
                    if let Ok(st) = nix::sys::stat::fstatat(&at, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    {
                        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                            usage.bytes += st.st_size.max(0) as u64;
                        }
                    }
                }
                Some(_) => {}
            }
        }
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_strict_and_empty_by_default() {
        assert!(FilesConfig::default().is_empty());
        let e = toml::from_str::<FilesConfig>("rots = [\"/tmp\"]\n").unwrap_err();
        assert!(e.to_string().contains("rots"), "{e}");
        let c: FilesConfig = toml::from_str("workspace = \"/tmp\"\nmax_read_bytes = 10\n").unwrap();
        assert_eq!(c.max_read_bytes, 10);
        assert!(!c.is_empty());
    }

    #[test]
    fn text_or_binary() {
        assert_eq!(as_text(b"abc\n"), Some("abc\n"));
        assert_eq!(as_text(b"a\0b"), None);
        assert_eq!(as_text(&[0xff, 0xfe, b'a']), None);
        // A character cut by the cap at the end is still text.
        assert_eq!(as_text(&"é".as_bytes()[..1]), Some(""));
    }
}
