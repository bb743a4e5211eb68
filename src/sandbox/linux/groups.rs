//! Groups of processes beneath the cells' cgroup: one per session and one
//! per cell, so that tenants sharing a supervisor are bounded apart and a
//! cell's end is known for its whole process tree.
//!
//! The cells' memory cgroup ([`super::cgroup::CellCgroup`]) bounds all
//! cells together. Beneath it, with cgroup v1 (memory, pids and cpuacct
//! hierarchies):
//!
//! ```text
//! memory/…/cellbox-<pid>-<n>/s<k>          a session: memory bound (its
//!                                          cells, and the tmpfs pages of
//!                                          its files, idle or not)
//! pids/…/cellbox-<pid>-<n>/s<k>            a session: process bound
//! pids/…/cellbox-<pid>-<n>/s<k>/c<m>       a cell: process bound, and the
//!                                          set of its processes whatever
//!                                          they do (setsid, double fork)
//! cpuacct/…/cellbox-<pid>-<n>/s<k>/c<m>    a cell: CPU time of its tree
//! ```
//!
//! The OOM killer then stays inside the session that went past its bound,
//! processes are counted per session and per cell (not per user of a
//! zygote's namespace, which all its cells share), a cell is over when its
//! pids group is empty (not when its first process says so), and its CPU
//! time is read here, never taken from the worker.
//!
//! A cell's processes join by writing to `tasks` (one thread: the forked
//! child that joins is single-threaded; see [`super::cgroup`] on why not
//! `cgroup.procs`), from the child between fork and exec ([`CellGroup::join_fds`])
//! or, for a child forked by a zygote or the fork server, from here by its
//! pid before it is sent any code ([`CellGroup::adopt`]).
//!
//! Session groups are kept for reuse once empty (a sessionless call is a
//! session of one cell, and making a memory cgroup costs as much as a warm
//! cell); cell groups (pids and cpuacct only) are made and removed per cell.
//!
//! cgroup v2 is not handled here yet: a supervisor there keeps the cells'
//! memory cgroup only, and says so.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many emptied session groups are kept for reuse.
const KEEP: usize = 32;

/// The hierarchies of one supervisor's cells.
#[derive(Debug)]
pub struct Groups {
    /// The cells' memory cgroup (made by [`super::cgroup::CellCgroup`]).
    memory: PathBuf,
    /// `cellbox-<pid>-<n>` made here in the pids and cpuacct hierarchies.
    pids: PathBuf,
    cpu: PathBuf,
    next: AtomicU64,
    free: Mutex<Vec<u64>>,
}

/// What [`Groups::new`] needs to know of the pids and cpuacct hierarchies.
fn v1_dir(cgroups: &str, controller: &str) -> Option<PathBuf> {
    let path = cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_id, ctls, path) = (f.next()?, f.next()?, f.next()?);
        ctls.split(',').any(|c| c == controller).then_some(path)
    })?;
    // The usual mount points (named for the controller, or for it with
    // others, as `cpu,cpuacct`).
    let base = Path::new("/sys/fs/cgroup");
    let entries = std::fs::read_dir(base).ok()?;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.split(',').any(|c| c == controller) {
            let dir = e.path().join(path.trim_start_matches('/'));
            if dir.is_dir() {
                return Some(dir);
            }
        }
    }
    None
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| format!("cannot write {value} to {}: {e}", path.display()))
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn open_tasks(dir: &Path) -> Result<OwnedFd, String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("tasks"))
        .map(OwnedFd::from)
        .map_err(|e| format!("cannot open {}/tasks: {e}", dir.display()))
}

fn make_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot make the cgroup {}: {e}", dir.display())),
    }
}

/// The processes listed in a cgroup's `cgroup.procs`.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Remove an empty cgroup directory, retrying while its last processes
/// finish exiting.
fn rmdir(dir: &Path) -> Result<(), String> {
    for attempt in 0..200 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 199 => {
                for pid in procs(dir) {
                    let _ = crate::sandbox::process::kill_pid(pid);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("cannot remove the cgroup {}: {e}", dir.display())),
        }
    }
    Err(format!("cannot remove the cgroup {}", dir.display()))
}

/// Kill every process of the cgroup at `pids_dir` (a pids cgroup) and wait
/// until it has none: its `pids.max` is set to 0 first, so nothing in it
/// can fork while it is being emptied. `Ok` once empty; an error naming
/// what is left past `within`.
pub fn empty(pids_dir: &Path, within: Duration) -> Result<(), String> {
    let first = procs(pids_dir);
    if first.is_empty() {
        return Ok(());
    }
    write(&pids_dir.join("pids.max"), "0")?;
    let end = Instant::now() + within;
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    loop {
        let left = procs(pids_dir);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!(
                "{} process(es) of {} still there after {within:?}",
                left.len(),
                pids_dir.display()
            ));
        }
        for pid in left {
            if pid != me {
                let _ = crate::sandbox::process::kill_pid(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Groups {
    /// Make the pids and cpuacct counterparts of the cells' memory cgroup
    /// at `memory` (v1). An error when either hierarchy is missing.
    pub fn new(memory: &Path) -> Result<Groups, String> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let name = memory
            .file_name()
            .ok_or("the cells' memory cgroup has no name")?;
        let pids = v1_dir(&cgroups, "pids")
            .ok_or("no cgroup v1 pids hierarchy (per-session process bounds need one)")?
            .join(name);
        let cpu = v1_dir(&cgroups, "cpuacct")
            .ok_or("no cgroup v1 cpuacct hierarchy (per-cell CPU time needs one)")?
            .join(name);
        make_dir(&pids)?;
        if let Err(e) = make_dir(&cpu) {
            let _ = rmdir(&pids);
            return Err(e);
        }
        Ok(Groups {
            memory: memory.to_path_buf(),
            pids,
            cpu,
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        })
    }

    fn dirs(&self, k: u64) -> [PathBuf; 3] {
        let s = format!("s{k}");
        [self.memory.join(&s), self.pids.join(&s), self.cpu.join(&s)]
    }

    /// A group for one session: its processes together may hold
    /// `memory_bytes` (files it keeps in a tmpfs count too) and number
    /// `max_processes`.
    pub fn session(
        self: &Arc<Self>,
        memory_bytes: u64,
        max_processes: u64,
    ) -> Result<SessionGroup, String> {
        let reused = match self.free.lock() {
            Ok(mut f) => f.pop(),
            Err(p) => p.into_inner().pop(),
        };
        let k = reused.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed));
        let [memory, pids, cpu] = self.dirs(k);
        let group = SessionGroup {
            groups: self.clone(),
            k,
            memory,
            pids,
            cpu,
            next: AtomicU64::new(0),
        };
        for d in [&group.memory, &group.pids, &group.cpu] {
            make_dir(d)?;
        }
        super::cgroup::set_memory_limit(&group.memory, false, memory_bytes)?;
        write(&group.pids.join("pids.max"), &max_processes.to_string())?;
        Ok(group)
    }

    /// The cells' pids and cpuacct directories (for `doctor` and tests).
    pub fn paths(&self) -> (&Path, &Path) {
        (&self.pids, &self.cpu)
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        let kept = match self.free.lock() {
            Ok(mut f) => std::mem::take(&mut *f),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        for k in kept {
            for d in self.dirs(k) {
                let _ = rmdir(&d);
            }
        }
        // The memory directory is the cells' cgroup's own, removed with it.
        for d in [&self.pids, &self.cpu] {
            if let Err(e) = rmdir(d) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// One session's group (see the module docs).
#[derive(Debug)]
pub struct SessionGroup {
    groups: Arc<Groups>,
    k: u64,
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    next: AtomicU64,
}

impl SessionGroup {
    /// A group for one cell of this session, of at most `max_processes`.
    pub fn cell(self: &Arc<Self>, max_processes: u64) -> Result<CellGroup, String> {
        let m = self.next.fetch_add(1, Ordering::Relaxed);
        let c = format!("c{m}");
        let (pids, cpu) = (self.pids.join(&c), self.cpu.join(&c));
        make_dir(&pids)?;
        if let Err(e) = make_dir(&cpu) {
            let _ = rmdir(&pids);
            return Err(e);
        }
        // From here on the directories go with `cell`.
        let mut cell = CellGroup {
            session: self.clone(),
            pids,
            cpu,
            joins: Vec::new(),
        };
        write(&cell.pids.join("pids.max"), &max_processes.to_string())?;
        // The session's peak is the cell's while it runs (its sub-cells,
        // which run while it waits, count with it).
        let _ = write(&self.memory.join("memory.max_usage_in_bytes"), "0");
        cell.joins = vec![
            open_tasks(&self.memory)?,
            open_tasks(&cell.pids)?,
            open_tasks(&cell.cpu)?,
        ];
        Ok(cell)
    }

    /// The session's memory cgroup directory.
    pub fn memory_path(&self) -> &Path {
        &self.memory
    }

    /// The session's pids cgroup directory.
    pub fn pids_path(&self) -> &Path {
        &self.pids
    }
}

impl Drop for SessionGroup {
    fn drop(&mut self) {
        // Its cells are over (each holds the session); anything left is
        // killed before the group is kept or removed.
        if let Err(e) = empty(&self.pids, Duration::from_secs(10)) {
            tracing::warn!("{e}");
        }
        let usage = read_u64(&self.memory.join("memory.usage_in_bytes")).unwrap_or(u64::MAX);
        let mut free = match self.groups.free.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        // A group that still holds memory (pages of files not yet freed)
        // is not handed to another session.
        if free.len() < KEEP && usage < (1 << 20) {
            free.push(self.k);
            return;
        }
        drop(free);
        for d in [&self.memory, &self.pids, &self.cpu] {
            if let Err(e) = rmdir(d) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// One cell's group (see the module docs); removed when dropped, after
/// killing anything still in it.
#[derive(Debug)]
pub struct CellGroup {
    session: Arc<SessionGroup>,
    pids: PathBuf,
    cpu: PathBuf,
    joins: Vec<OwnedFd>,
}

/// What a cell's group measured of its whole process tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeUsage {
    pub cpu_ms: Option<u64>,
    pub peak_bytes: Option<u64>,
}

impl CellGroup {
    /// The descriptors a single-threaded child writes `0` to between fork
    /// and exec to join (see [`super::cgroup::join_fd`]); they stay open
    /// as long as `self`.
    pub fn join_fds(&self) -> Vec<RawFd> {
        self.joins.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Move the single-threaded process `pid` (in this process's PID
    /// namespace) into the group.
    pub fn adopt(&self, pid: i32) -> Result<(), String> {
        let text = pid.to_string();
        for fd in &self.joins {
            let mut f = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?);
            f.write_all(text.as_bytes())
                .map_err(|e| format!("cannot move process {pid} into its cell's cgroup: {e}"))?;
        }
        Ok(())
    }

    /// Allow the cell `n` processes at once (threads count).
    pub fn set_max_processes(&self, n: u64) -> Result<(), String> {
        write(&self.pids.join("pids.max"), &n.to_string())
    }

    /// Kill whatever of the cell is left and wait until none of it is (at
    /// most `within`).
    pub fn end(&self, within: Duration) -> Result<(), String> {
        empty(&self.pids, within)
    }

    /// Whether no process of the cell is left.
    pub fn is_empty(&self) -> bool {
        procs(&self.pids).is_empty()
    }

    /// CPU time of every process the cell had, and the session's peak
    /// memory while it ran.
    pub fn usage(&self) -> TreeUsage {
        TreeUsage {
            cpu_ms: read_u64(&self.cpu.join("cpuacct.usage")).map(|ns| ns / 1_000_000),
            peak_bytes: read_u64(&self.session.memory.join("memory.max_usage_in_bytes")),
        }
    }

    /// The cell's pids cgroup directory.
    pub fn pids_path(&self) -> &Path {
        &self.pids
    }
}

impl Drop for CellGroup {
    fn drop(&mut self) {
        self.joins.clear();
        if let Err(e) = empty(&self.pids, Duration::from_secs(10)) {
            tracing::warn!("{e}");
        }
        for d in [&self.pids, &self.cpu] {
            if let Err(e) = rmdir(d) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// The pid of the process behind `pidfd` in this process's PID namespace
/// (from `/proc/self/fdinfo`).
pub fn pidfd_pid(pidfd: &impl AsRawFd) -> Result<i32, String> {
    let path = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| format!("{path} names no live process"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Option<(super::super::cgroup::CellCgroup, Arc<Groups>)> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let cells = super::super::cgroup::CellCgroup::create(256 << 20).ok()?;
        let g = Groups::new(cells.path()).ok()?;
        Some((cells, Arc::new(g)))
    }

    #[test]
    fn a_cells_tree_is_bounded_counted_and_emptied() {
        let Some((cells_cgroup, g)) = groups() else {
            panic!("this test needs root and cgroup v1 memory, pids and cpuacct hierarchies");
        };
        let s = Arc::new(g.session(64 << 20, 8).expect("session group"));
        let cell = s.cell(4).expect("cell group");
        // A shell that starts a setsid'd grandchild and exits: the tree
        // lives on in the group after its first process is gone.
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", "setsid sleep 300 & setsid sleep 300 & exit 0"]);
        let fds = cell.join_fds();
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: join_fd is async-signal-safe (one write).
            unsafe {
                cmd.pre_exec(move || {
                    for fd in &fds {
                        super::super::cgroup::join_fd(*fd)?;
                    }
                    Ok(())
                });
            }
        }
        let status = cmd.status().expect("run sh");
        assert!(status.success());
        assert_eq!(procs(cell.pids_path()).len(), 2, "two sleepers left");
        assert!(!cell.is_empty());
        cell.end(Duration::from_secs(5)).expect("emptied");
        assert!(cell.is_empty());
        assert!(cell.usage().cpu_ms.is_some());
        let path = cell.pids_path().to_path_buf();
        drop(cell);
        assert!(!path.exists(), "the cell's group is removed");
        drop(s);
        drop(g);
        drop(cells_cgroup);
    }

    #[test]
    fn pidfd_pid_names_the_process() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("5")
            .spawn()
            .expect("spawn");
        let pid = child.id() as i32;
        let fd = crate::sandbox::process::pidfd_open(pid).expect("pidfd");
        assert_eq!(pidfd_pid(&fd).expect("pid"), pid);
        let _ = child.kill();
        let _ = child.wait();
    }
}
