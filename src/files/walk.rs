//! Walks beneath a root: `list_dir` and `search_files`. Every directory is
//! opened from the root fd by its whole relative path with symlinks refused,
//! `.gitignore` / `.ignore` files are honoured with the `ignore` crate's
//! matcher, hidden entries are skipped, and the search runs ripgrep's
//! `grep-searcher` over the fd already opened beneath the root.

use super::{FileError, Files, Root, MAX_LINE_BYTES, MAX_SEARCH_RESULTS};
use crate::sandbox::beneath::{open_beneath, Symlinks};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{sinks::Lossy, BinaryDetection, Searcher, SearcherBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use serde_json::{json, Value};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads a search uses at most.
pub(crate) const MAX_SEARCH_THREADS: usize = 4;

/// Files a search searches at a time, at first and at most.
const FIRST_SEARCH_CHUNK: usize = 16;
const MAX_SEARCH_CHUNK: usize = 256;

/// What one match kept takes at most (its line cut to `MAX_LINE_BYTES`,
/// its number, the string's header).
const MATCH_BYTES: usize = super::MAX_LINE_BYTES + 3 + 64;
/// Bytes the matches of one chunk of files may take while they are
/// searched (each file keeps at most what the search still has room for).
const SEARCH_CHUNK_HELD: usize = 4 << 20;
/// Bytes of paths `list_dir` returns at most.
pub(crate) const MAX_LIST_BYTES: usize = 1 << 20;

/// Bytes one `search_files` call holds at most while it runs: the
/// threads' line buffers (each at most `max_search_line_bytes`), a chunk's
/// matches, the result.
pub(crate) fn search_held_bytes(max_line: u64) -> u64 {
    (MAX_SEARCH_THREADS as u64)
        .saturating_mul(max_line.saturating_add(64 << 10))
        .saturating_add((SEARCH_CHUNK_HELD + MAX_SEARCH_RESULTS * (MATCH_BYTES + 4096)) as u64)
}

/// Bytes of one `.gitignore` read at most.
const MAX_IGNORE_FILE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }
}

struct Entry {
    rel: PathBuf,
    kind: Kind,
}

/// The ignore files met on the way down, innermost last.
#[derive(Clone, Default)]
struct Ignores(Vec<std::rc::Rc<Gitignore>>);

impl Ignores {
    fn ignored(&self, rel: &Path, is_dir: bool) -> bool {
        let p = Path::new("/").join(rel);
        for gi in self.0.iter().rev() {
            let m = gi.matched(&p, is_dir);
            if m.is_ignore() {
                return true;
            }
            if m.is_whitelist() {
                return false;
            }
        }
        false
    }
}

struct Walk<'a> {
    files: &'a Files,
    root: &'a Root,
    budget: usize,
    truncated: bool,
}

impl Walk<'_> {
    fn read_ignore(&self, dir: &Path, name: &str) -> Option<Gitignore> {
        let rel = dir.join(name);
        let fd = open_beneath(
            self.root.fd.as_fd(),
            &rel,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
            Symlinks::Refuse,
        )
        .ok()?;
        let f = std::fs::File::from(fd);
        if !f.metadata().ok()?.file_type().is_file() {
            return None;
        }
        let mut text = String::new();
        f.take(MAX_IGNORE_FILE_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        let mut b = GitignoreBuilder::new(Path::new("/").join(dir));
        for line in text.lines() {
            let _ = b.add_line(None, line);
        }
        b.build().ok()
    }

    /// The entries of directory `dir` (relative to the root), ignore rules
    /// applied; `None` when it cannot be opened beneath the root as a
    /// directory without following a symlink.
    fn entries(&mut self, dir: &Path, ignores: &mut Ignores) -> Option<Vec<Entry>> {
        let fd = open_beneath(
            self.root.fd.as_fd(),
            dir,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            Symlinks::Refuse,
        )
        .ok()?;
        let mut d = nix::dir::Dir::from_fd(fd).ok()?;
        for name in [".gitignore", ".ignore"] {
            if let Some(gi) = self.read_ignore(dir, name) {
                ignores.0.push(std::rc::Rc::new(gi));
            }
        }
        let mut out = Vec::new();
        for e in d.iter().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue; // hidden, and `.`, `..`, `.git`
            }
            if self.budget == 0 {
                self.truncated = true;
                break;
            }
            self.budget -= 1;
            use nix::dir::Type;
            let kind = match e.file_type() {
                Some(Type::File) => Kind::File,
                Some(Type::Directory) => Kind::Dir,
                Some(Type::Symlink) => Kind::Symlink,
                Some(_) => Kind::Other,
                None => Kind::Other,
            };
            let rel = if dir == Path::new(".") {
                PathBuf::from(&name)
            } else {
                dir.join(&name)
            };
            if ignores.ignored(&rel, kind == Kind::Dir) {
                continue;
            }
            out.push(Entry { rel, kind });
        }
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Some(out)
    }

    /// Depth-first, sorted; calls `visit` for every entry until it says
    /// stop (or the call is cancelled: the walk is then `truncated`).
    fn run(&mut self, start: &Path, visit: &mut dyn FnMut(&Entry) -> bool) {
        let mut stack = vec![(start.to_owned(), self.parent_ignores(start))];
        while let Some((dir, mut ignores)) = stack.pop() {
            if self.files.cancelled() {
                self.truncated = true;
                return;
            }
            let Some(entries) = self.entries(&dir, &mut ignores) else {
                continue;
            };
            let mut subdirs = Vec::new();
            for e in entries {
                if !visit(&e) {
                    return;
                }
                if e.kind == Kind::Dir {
                    subdirs.push(e.rel);
                }
            }
            for d in subdirs.into_iter().rev() {
                stack.push((d, ignores.clone()));
            }
        }
    }

    /// The ignore files of the directories above `start`.
    fn parent_ignores(&self, start: &Path) -> Ignores {
        let mut ig = Ignores::default();
        if start == Path::new(".") {
            return ig;
        }
        let mut dir = PathBuf::from(".");
        for c in start.components() {
            for name in [".gitignore", ".ignore"] {
                if let Some(gi) = self.read_ignore(&dir, name) {
                    ig.0.push(std::rc::Rc::new(gi));
                }
            }
            if let std::path::Component::Normal(n) = c {
                dir = if dir == Path::new(".") {
                    PathBuf::from(n)
                } else {
                    dir.join(n)
                };
            }
        }
        ig
    }
}

fn glob_matcher(glob: Option<&str>) -> Result<Option<globset::GlobMatcher>, FileError> {
    glob.map(|g| {
        globset::Glob::new(g)
            .map(|g| g.compile_matcher())
            .map_err(|e| FileError::Glob {
                glob: g.to_owned(),
                message: e.to_string(),
            })
    })
    .transpose()
}

/// `rel` relative to `base` (both relative to the root).
fn below<'a>(rel: &'a Path, base: &Path) -> &'a Path {
    if base == Path::new(".") {
        rel
    } else {
        rel.strip_prefix(base).unwrap_or(rel)
    }
}

impl Files {
    fn walk<'a>(&'a self, root: &'a Root) -> Walk<'a> {
        Walk {
            files: self,
            root,
            budget: self.cfg.max_walk_entries,
            truncated: false,
        }
    }

    /// The directory `path` must be one beneath its root.
    fn check_dir(&self, root: &Root, rel: &Path, shown: &str) -> Result<(), FileError> {
        let fd = open_beneath(
            root.fd.as_fd(),
            rel,
            libc::O_PATH,
            0,
            Symlinks::FollowBeneath,
        )
        .map_err(|e| FileError::open("open", shown, e))?;
        let meta = std::fs::File::from(fd)
            .metadata()
            .map_err(|e| FileError::open("stat", shown, e))?;
        if !meta.is_dir() {
            return Err(FileError::Args(format!("{shown:?} is not a directory")));
        }
        Ok(())
    }

    /// `list_dir`: the entries of one directory, or with `glob` every entry
    /// beneath it whose path (relative to it) matches.
    pub fn list_dir(&self, path: &str, glob: Option<&str>) -> Result<Value, FileError> {
        let (root, rel) = self.locate(path)?;
        let shown = self.shown(root, &rel);
        self.check_dir(root, &rel, &shown)?;
        // A walk refuses symlinks, so the start is resolved the same way.
        let matcher = glob_matcher(glob)?;
        let mut w = self.walk(root);
        let mut out = Vec::new();
        let limit = MAX_SEARCH_RESULTS * 10;
        let mut more = false;
        // Entries and bytes of paths both bounded: what is returned is
        // held whole until it is sent.
        let mut bytes = 0;
        let mut room = |path: &str| {
            bytes += path.len() + 32;
            bytes <= MAX_LIST_BYTES
        };
        match &matcher {
            None => {
                let mut ig = w.parent_ignores(&rel);
                let entries = w.entries(&rel, &mut ig).ok_or(FileError::Symlink {
                    path: shown.clone(),
                })?;
                for e in entries {
                    let path = w.files.shown(root, &e.rel);
                    if out.len() >= limit || !room(&path) {
                        more = true;
                        break;
                    }
                    out.push(json!({"path": path, "type": e.kind.name()}));
                }
            }
            Some(m) => {
                w.run(&rel, &mut |e| {
                    if m.is_match(below(&e.rel, &rel)) {
                        let path = self.shown(root, &e.rel);
                        if out.len() >= limit || !room(&path) {
                            more = true;
                            return false;
                        }
                        out.push(json!({"path": path, "type": e.kind.name()}));
                    }
                    true
                });
            }
        }
        Ok(json!({"path": shown, "entries": out, "truncated": more || w.truncated}))
    }

    /// `search_files`: lines matching the regex `pattern` in files beneath
    /// `path` (whose path relative to it matches `glob`), at most
    /// `max_results` (capped at [`MAX_SEARCH_RESULTS`]).
    ///
    /// What it holds is bounded whatever the files: a searching thread's
    /// buffer holds a line only up to `max_search_line_bytes` (a file
    /// with a longer line is skipped), each file keeps at most as many
    /// matches as the search still has room for, and the chunk of files
    /// searched at once is small enough that their matches together stay
    /// within [`SEARCH_CHUNK_HELD`]; in all, [`search_held_bytes`].
    pub fn search_files(
        &self,
        pattern: &str,
        path: &str,
        glob: Option<&str>,
        max_results: usize,
    ) -> Result<Value, FileError> {
        let (root, rel) = self.locate(path)?;
        let shown = self.shown(root, &rel);
        self.check_dir(root, &rel, &shown)?;
        let max = max_results.clamp(1, MAX_SEARCH_RESULTS);
        let matcher = RegexMatcherBuilder::new()
            .line_terminator(Some(b'\n'))
            .build(pattern)
            .map_err(|e| FileError::Pattern(e.to_string()))?;
        let globm = glob_matcher(glob)?;
        let max_file = self.cfg.max_search_file_bytes;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_SEARCH_THREADS);
        let mut matches = Vec::new();
        let mut full = false;
        let mut counts = Counts::default();
        // The walk gathers the files in walk order, a chunk at a time; each
        // chunk is searched on `threads` threads and its results are taken
        // in walk order, so the answer is the one a single thread would
        // give, and a search that has its results stops the walk. Chunks
        // grow, so a search that stops early searched few files for
        // nothing, up to what the room left for matches allows.
        let mut chunk = Vec::with_capacity(MAX_SEARCH_CHUNK);
        let mut chunk_len = FIRST_SEARCH_CHUNK;
        let mut take =
            |chunk: &mut Vec<PathBuf>, matches: &mut Vec<Value>| -> bool {
                let room = max - matches.len();
                let searched = self.search_chunk(root, chunk, &matcher, room, max_file, threads);
                for (rel, hits) in chunk.iter().zip(searched) {
                    match hits {
                        Searched::Unreadable => counts.unreadable += 1,
                        Searched::Large => counts.large += 1,
                        Searched::LongLine => counts.long_lines += 1,
                        Searched::Cancelled => full = true,
                        Searched::Lines { found, failed } => {
                            counts.searched += 1;
                            if failed {
                                counts.unreadable += 1;
                            }
                            let room = max - matches.len();
                            full = found.len() >= room;
                            let path = self.shown(root, rel);
                            matches.extend(found.into_iter().take(room).map(
                                |(line, text)| json!({"path": path, "line": line, "text": text}),
                            ));
                        }
                    }
                    if full {
                        break;
                    }
                }
                chunk.clear();
                !full && !self.cancelled()
            };
        let mut w = self.walk(root);
        w.run(&rel, &mut |e| {
            if e.kind != Kind::File {
                return true;
            }
            if let Some(g) = &globm {
                if !g.is_match(below(&e.rel, &rel)) {
                    return true;
                }
            }
            chunk.push(e.rel.clone());
            let room = max - matches.len();
            let fits = (SEARCH_CHUNK_HELD / (room.max(1) * MATCH_BYTES)).max(1);
            if chunk.len() < chunk_len.min(fits) {
                return true;
            }
            chunk_len = (chunk_len * 2).min(MAX_SEARCH_CHUNK);
            take(&mut chunk, &mut matches)
        });
        if !chunk.is_empty() {
            take(&mut chunk, &mut matches);
        }
        if self.cancelled() {
            return Err(FileError::Cancelled);
        }
        Ok(json!({
            "pattern": pattern,
            "path": shown,
            "matches": matches,
            "truncated": full || w.truncated,
            "files_searched": counts.searched,
            "skipped_large": counts.large,
            "skipped_long_lines": counts.long_lines,
            "skipped_unreadable": counts.unreadable,
        }))
    }

    /// Search the files `rels` on up to `threads` threads, each keeping at
    /// most `room` matches; one result per file, in the order given.
    fn search_chunk(
        &self,
        root: &Root,
        rels: &[PathBuf],
        matcher: &RegexMatcher,
        room: usize,
        max_file: u64,
        threads: usize,
    ) -> Vec<Searched> {
        let next = AtomicUsize::new(0);
        let work = || {
            let mut searcher = SearcherBuilder::new()
                .binary_detection(BinaryDetection::quit(0))
                .line_number(true)
                .heap_limit(Some(
                    usize::try_from(self.cfg.max_search_line_bytes).unwrap_or(usize::MAX),
                ))
                .build();
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(rel) = rels.get(i) else { break };
                let hits = if self.cancelled() {
                    Searched::Cancelled
                } else {
                    self.search_one(root, rel, matcher, &mut searcher, room, max_file)
                };
                done.push((i, hits));
            }
            done
        };
        let threads = threads.min(rels.len()).max(1);
        let mut all: Vec<(usize, Searched)> = std::thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut all = work();
            for t in others {
                // A thread that panicked searched nothing more: its files
                // count as unreadable below.
                if let Ok(done) = t.join() {
                    all.extend(done);
                }
            }
            all
        });
        all.sort_by_key(|(i, _)| *i);
        let mut out = Vec::with_capacity(rels.len());
        let mut it = all.into_iter().peekable();
        for i in 0..rels.len() {
            match it.next_if(|(j, _)| *j == i) {
                Some((_, r)) => out.push(r),
                None => out.push(Searched::Unreadable),
            }
        }
        out
    }

    /// Search one file beneath the root: at most `max` matching lines,
    /// each cut to [`MAX_LINE_BYTES`].
    fn search_one(
        &self,
        root: &Root,
        rel: &Path,
        matcher: &RegexMatcher,
        searcher: &mut Searcher,
        max: usize,
        max_file: u64,
    ) -> Searched {
        let shown = self.shown(root, rel);
        let Ok((file, meta)) =
            self.open_regular(root, rel, &shown, libc::O_RDONLY, Symlinks::Refuse)
        else {
            return Searched::Unreadable;
        };
        if meta.len() > max_file {
            return Searched::Large;
        }
        let mut found = Vec::new();
        let sink = Lossy(|lnum, line: &str| {
            let line = line.trim_end_matches(['\n', '\r']);
            let mut end = line.len().min(MAX_LINE_BYTES);
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            let mut text = line[..end].to_owned();
            if end < line.len() {
                text.push_str("...");
            }
            found.push((lnum, text));
            Ok(found.len() < max && !self.cancelled())
        });
        match searcher.search_file(matcher, &file, sink) {
            Ok(()) => Searched::Lines {
                found,
                failed: false,
            },
            // The line buffer would have grown past its limit.
            Err(e) if found.is_empty() && is_heap_limit(&e) => Searched::LongLine,
            Err(_) => Searched::Lines {
                found,
                failed: true,
            },
        }
    }
}

/// Whether a search failed on its line buffer's limit (grep-searcher says
/// so only in its message).
fn is_heap_limit(e: &std::io::Error) -> bool {
    e.to_string().contains("configured allocation limit")
}

/// What a search counted besides its matches.
#[derive(Default)]
struct Counts {
    searched: u64,
    large: u64,
    long_lines: u64,
    unreadable: u64,
}

/// What searching one file gave.
enum Searched {
    /// It could not be opened as a regular file beneath the root.
    Unreadable,
    /// It is over the size limit.
    Large,
    /// A line of it is longer than a search holds.
    LongLine,
    /// The call was cancelled before it was searched.
    Cancelled,
    /// Its matching lines (number, text); `failed` when reading it failed
    /// part way.
    Lines {
        found: Vec<(u64, String)>,
        failed: bool,
    },
}
