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
//! A cell's processes join by writing `0` to `tasks` descriptors (one
//! thread: the forked child that joins is single-threaded; see
//! [`super::cgroup`] on why not `cgroup.procs`), from the child itself
//! before it runs any code ([`CellGroup::join_fds`]): nothing is moved by
//! pid, which takes the kernel's global cgroup lock and waits for an RCU
//! grace period (milliseconds) when it was idle. A live Python session's
//! state processes, and the cells forked from them, live in the session's
//! own group (they are never handed a `tasks` descriptor, having run the
//! session's code); what such a cell leaves is killed by
//! [`SessionGroup::end_others`], sparing the state processes.
//!
//! Session groups are kept for reuse once empty (a sessionless call is a
//! session of one cell, and making a memory cgroup costs as much as a warm
//! cell); cell groups (pids and cpuacct only) are made and removed per cell.
//!
//! With cgroup v2 the same tree is one hierarchy (every directory above
//! is the same), with a leaf for what a cgroup would otherwise hold beside
//! its children (see [`super::cgroup2`]): the files differ (`cgroup.procs`
//! for `tasks`, `memory.peak` for `memory.max_usage_in_bytes`, `cpu.stat`
//! for `cpuacct.usage`), a tree is ended with `cgroup.kill`, and a cell
//! joins one group, not three.
//!
//! # A session as a whole: freeze, kill, CPU
//!
//! A live session's processes (its state processes, its spare, its
//! checkpoints) carry the tenant's code between cells, so between cells
//! the session is **frozen**, and at a cell's end everything in its group
//! but the processes the supervisor knows is killed. [`SessionGroup`]
//! offers these operations whatever the cgroup version; this is how each
//! is done:
//!
//! | operation | cgroup v1 | cgroup v2 |
//! | --- | --- | --- |
//! | freeze, thaw ([`SessionGroup::freeze`], [`SessionGroup::thaw`]) | `freezer/…/s<k>/freezer.state`: `FROZEN` (read back until it says so), `THAWED` | the session's leaf (`s<k>/live`, where its state processes and live cells are): `cgroup.freeze` `1` (until `cgroup.events` says `frozen 1`), `0` |
//! | kill what is not kept ([`SessionGroup::end_others`], [`SessionGroup::settle`]) | `pids.max` 0, SIGKILL each listed pid until none is left | the same (no `cgroup.kill`: some are kept) |
//! | kill one kept process while frozen ([`SessionGroup::kill`]) | SIGKILL, then moved to a freezer group that is never frozen (a frozen v1 task dies only once thawed) | SIGKILL (a fatal signal reaches a frozen v2 task) |
//! | kill all ([`SessionGroup`]'s drop) | as above, then thawed | the same, then `cgroup.kill` |
//! | CPU time ([`SessionGroup::cpu_ns`]) | `cpuacct.usage` | `cpu.stat` `usage_usec` |
//!
//! Under v1 a state process joins the session's freezer group with its
//! other groups ([`SessionGroup::join_fds`]); cells of other sessions need
//! none (nothing of theirs is left between cells). Without a freezer
//! hierarchy (v1) sessions are not frozen, and [`SessionGroup::can_freeze`]
//! says so.

use super::cgroup::CgroupError;
use crate::util::lock;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A cell directory's `pids.max` as not known (a bound is at least 1).
const UNKNOWN: u64 = 0;

/// How many emptied session groups are kept for reuse: enough for the
/// sessionless calls running at once to find one; each holds about nine
/// descriptors (its files and its kept cell's) while it waits.
const KEEP: usize = 8;

/// The hierarchies of one supervisor's cells.
#[derive(Debug)]
pub struct Groups {
    /// The cells' memory cgroup (made by [`super::cgroup::CellCgroup`]).
    memory: PathBuf,
    /// `cellbox-<pid>-<n>` made here in the pids and cpuacct hierarchies.
    pids: PathBuf,
    cpu: PathBuf,
    /// cgroup v2: the three above are one directory.
    v2: bool,
    /// Its counterpart in the freezer hierarchy, where there is one, with
    /// a group beneath that is never frozen (see [`SessionGroup::kill`]).
    freezer: Option<FreezerRoot>,
    next: AtomicU64,
    free: Mutex<Vec<Arc<SessionDir>>>,
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

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(CgroupError::io(format!("write {value} to"), path))
}

/// The file a process writes `0` to to join the group at `dir`.
fn join_file(v2: bool) -> &'static str {
    if v2 {
        "cgroup.procs"
    } else {
        "tasks"
    }
}

fn open_tasks(dir: &Path, v2: bool) -> Result<OwnedFd, CgroupError> {
    let path = dir.join(join_file(v2));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map(OwnedFd::from)
        .map_err(CgroupError::io("open", &path))
}

fn make_dir(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::io("make the cgroup", dir)(e)),
    }
}

/// The processes listed in a cgroup's `cgroup.procs`.
fn procs(dir: &Path) -> Vec<i32> {
    crate::sandbox::process::read_small(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Remove a cgroup directory (v1), killing what is left in it while its
/// last processes exit.
fn rmdir(dir: &Path) -> Result<(), CgroupError> {
    super::cgroup::remove(dir, false)
}

/// Kill every process of the cgroup at `pids_dir` (a pids cgroup) and wait
/// until it has none: its `pids.max` is set to 0 first, so nothing in it
/// can fork while it is being emptied. `Ok` once empty; an error naming
/// what is left past `within`. Under cgroup v2, its whole tree at once
/// through `cgroup.kill`.
pub fn empty(pids_dir: &Path, within: Duration) -> Result<(), CgroupError> {
    if pids_dir.join("cgroup.kill").exists() {
        return super::cgroup2::kill_tree(pids_dir, within);
    }
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
            return Err(CgroupError::Busy(format!(
                "{} process(es) of {} still there after {within:?}",
                left.len(),
                pids_dir.display()
            )));
        }
        for pid in left {
            if pid != me {
                let _ = crate::sandbox::process::kill_pid(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How many times [`stop`] reads a group again for processes it has not
/// signalled yet (each read after a round of kills).
const STOP_ROUNDS: usize = 64;

/// SIGKILL every process of the pids cgroup at `pids_dir` now, without
/// waiting for them to be gone: its `pids.max` (open as `pids_max`) is
/// set to 0 first, so nothing in it can start another process, and the
/// group is read again after each round of kills until a read shows none
/// it has not signalled (a fork that had passed its bound when the bound
/// went to 0 shows up in that read). A process with SIGKILL pending never
/// runs its own code again. How many it signalled.
pub fn stop(pids_dir: &Path, pids_max: &std::fs::File) -> Result<usize, CgroupError> {
    let mut signalled: Vec<i32> = Vec::new();
    let first = procs(pids_dir);
    if first.is_empty() {
        return Ok(0);
    }
    put(pids_max, "0", &pids_dir.join("pids.max"))?;
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut listed = first;
    for _ in 0..STOP_ROUNDS {
        let fresh: Vec<i32> = listed
            .into_iter()
            .filter(|p| *p != me && !signalled.contains(p))
            .collect();
        if fresh.is_empty() {
            return Ok(signalled.len());
        }
        for pid in fresh {
            let _ = crate::sandbox::process::kill_pid(pid);
            signalled.push(pid);
        }
        listed = procs(pids_dir);
    }
    Err(CgroupError::Busy(format!(
        "{} kept showing new processes after {STOP_ROUNDS} rounds of kills",
        pids_dir.display()
    )))
}

impl Groups {
    /// Make the pids and cpuacct counterparts of the cells' memory cgroup
    /// at `memory` (v1), and the freezer's where there is one (with its
    /// guard, the program `exe` started again: see [`FreezerGuard`]). An
    /// error when the pids or cpuacct hierarchy is missing. Under cgroup v2
    /// one hierarchy holds them all (see [`Self::new_v2`]).
    pub fn new(memory: &Path, exe: &Path) -> Result<Groups, CgroupError> {
        if memory.join("cgroup.controllers").exists() {
            return Self::new_v2(memory);
        }
        let cgroups = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(CgroupError::io("read", Path::new("/proc/self/cgroup")))?;
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
        let freezer = match v1_dir(&cgroups, "freezer") {
            Some(root) => match FreezerRoot::make(root.join(name), exe) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!("sessions are not frozen between cells: {e}");
                    None
                }
            },
            None => {
                tracing::info!(
                    "no cgroup v1 freezer hierarchy: sessions are not frozen between cells"
                );
                None
            }
        };
        Ok(Groups {
            memory: memory.to_path_buf(),
            pids,
            cpu,
            v2: false,
            freezer,
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        })
    }

    /// Under cgroup v2: the cells' cgroup at `memory` (made with its pool
    /// leaf and controllers by [`super::cgroup::CellCgroup::create`])
    /// holds the sessions' groups.
    fn new_v2(memory: &Path) -> Result<Groups, CgroupError> {
        if !memory.join("cgroup.kill").exists() {
            return Err(CgroupError::Unavailable(
                "per-session groups on cgroup v2 need cgroup.kill (Linux 5.14 or later)".into(),
            ));
        }
        let on = std::fs::read_to_string(memory.join("cgroup.subtree_control")).map_err(
            CgroupError::io("read", &memory.join("cgroup.subtree_control")),
        )?;
        for c in ["memory", "pids"] {
            if !on.split_whitespace().any(|x| x == c) {
                return Err(CgroupError::Unavailable(format!(
                    "the {c} controller is not enabled beneath {}",
                    memory.display()
                )));
            }
        }
        Ok(Groups {
            memory: memory.to_path_buf(),
            pids: memory.to_path_buf(),
            cpu: memory.to_path_buf(),
            v2: true,
            // A session freezes its own leaf (`cgroup.freeze`).
            freezer: None,
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        })
    }

    /// A group for one session: its processes together may hold
    /// `memory_bytes` (files it keeps in a tmpfs count too) and number
    /// `max_processes`.
    pub fn session(
        self: &Arc<Self>,
        memory_bytes: u64,
        max_processes: u64,
    ) -> Result<SessionGroup, CgroupError> {
        let kept = lock(&self.free).pop();
        let dir = match kept {
            Some(d) => d,
            None => Arc::new(SessionDir::make(
                self,
                self.next.fetch_add(1, Ordering::Relaxed),
            )?),
        };
        dir.bound(memory_bytes, max_processes)?;
        // A kept directory counts its earlier sessions' time too (v2's
        // count cannot be reset): this session's starts here.
        let cpu_base = cpu_ns_of(&dir.cpu_usage, dir.v2).unwrap_or(0);
        Ok(SessionGroup {
            cpu_base,
            saved_max: Mutex::new(None),
            frozen: std::sync::atomic::AtomicBool::new(false),
            groups: self.clone(),
            dir,
        })
    }

    /// The cells' pids and cpuacct directories (for `doctor` and tests).
    pub fn paths(&self) -> (&Path, &Path) {
        (&self.pids, &self.cpu)
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        // Kept session directories go first (each removes its cells').
        lock(&self.free).clear();
        // The memory directory is the cells' cgroup's own, removed with it
        // (under v2, all three are).
        if self.v2 {
            return;
        }
        for d in [&self.pids, &self.cpu] {
            if let Err(e) = rmdir(d) {
                tracing::warn!("{e}");
            }
        }
        if let Some(f) = &self.freezer {
            for d in [&f.dying, &f.dir] {
                if let Err(e) = rmdir(d) {
                    tracing::warn!("{e}");
                }
            }
        }
    }
}

fn open_rw(path: &Path) -> Result<std::fs::File, CgroupError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(CgroupError::io("open", path))
}

fn open_r(path: &Path) -> Result<std::fs::File, CgroupError> {
    std::fs::File::open(path).map_err(CgroupError::io("open", path))
}

/// Write `value` through a kept descriptor of a cgroup file.
fn put(file: &std::fs::File, value: &str, what: &Path) -> Result<(), CgroupError> {
    use std::os::unix::fs::FileExt;
    file.write_at(value.as_bytes(), 0)
        .map(|_| ())
        .map_err(CgroupError::io(format!("write {value} to"), what))
}

/// The text of a small cgroup file through a kept descriptor.
fn read_at0(file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let n = file.read_at(&mut buf, 0).ok()?;
    Some(String::from_utf8_lossy(buf.get(..n)?).into_owned())
}

/// Read a number through a kept descriptor of a cgroup file (each read at
/// offset 0 is a fresh one).
fn get(file: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 64];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
}

/// CPU time (ns) through a kept v1 `cpuacct.usage` or v2 `cpu.stat`.
fn cpu_ns_of(file: &std::fs::File, v2: bool) -> Option<u64> {
    if v2 {
        let text = read_at0(file)?;
        return super::cgroup2::keyed(&text, "usage_usec").map(|us| us.saturating_mul(1000));
    }
    get(file)
}

/// Whether a kept `cgroup.procs` lists no process.
fn none_in(procs: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 16];
    matches!(procs.read_at(&mut buf, 0), Ok(0))
}

/// Whether the cgroup at `dir` lists no process (under v2, neither it
/// nor any beneath it).
fn none_in_dir(dir: &Path) -> bool {
    if dir.join("cgroup.events").exists() {
        return !super::cgroup2::populated(dir);
    }
    procs(dir).is_empty()
}

/// A session's directories, with the files a cell's start and end touch
/// kept open; kept for another session once its own is over.
#[derive(Debug)]
struct SessionDir {
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    /// Where the session's own processes are (a live session's state
    /// processes): its pids directory, or under v2 its leaf.
    own: PathBuf,
    v2: bool,
    /// v1: the memory group's `tasks`; v2: the leaf's `cgroup.procs`.
    memory_tasks: OwnedFd,
    /// Its peak memory (absent under v2 before Linux 5.19).
    max_usage: Option<std::fs::File>,
    usage: std::fs::File,
    pids_max: std::fs::File,
    /// CPU time of every process it has had: v1 `cpuacct.usage` (ns), v2
    /// `cpu.stat` (`usage_usec`).
    cpu_usage: std::fs::File,
    /// Its freezer group (v1, where there is a freezer hierarchy), or its
    /// leaf's `cgroup.freeze` (v2).
    freezer: Option<Freezer>,
    /// The bounds written last (not written again when unchanged).
    bounds: Mutex<Option<(u64, u64)>>,
    /// Emptied cell directories, for its next cells.
    cells: Mutex<Vec<Arc<CellDir>>>,
    next_cell: AtomicU64,
}

impl SessionDir {
    fn make(groups: &Groups, k: u64) -> Result<SessionDir, CgroupError> {
        let s = format!("s{k}");
        let v2 = groups.v2;
        let (memory, pids, cpu) = (
            groups.memory.join(&s),
            groups.pids.join(&s),
            groups.cpu.join(&s),
        );
        let own = if v2 {
            pids.join(super::cgroup2::LIVE)
        } else {
            pids.clone()
        };
        let undo = || {
            for d in [&own, &memory, &pids, &cpu] {
                let _ = rmdir(d);
            }
        };
        for d in [&memory, &pids, &cpu] {
            if let Err(e) = make_dir(d) {
                undo();
                return Err(e);
            }
        }
        let files = (|| {
            if v2 {
                // Its cells' groups get bounds of their own; its own
                // processes a leaf beside them.
                super::cgroup2::enable(&pids)?;
                make_dir(&own)?;
            }
            let (peak, usage) = if v2 {
                ("memory.peak", "memory.current")
            } else {
                ("memory.max_usage_in_bytes", "memory.usage_in_bytes")
            };
            let peak = memory.join(peak);
            Ok::<_, CgroupError>((
                open_tasks(if v2 { &own } else { &memory }, v2)?,
                if !v2 || peak.exists() {
                    Some(open_rw(&peak)?)
                } else {
                    None
                },
                open_r(&memory.join(usage))?,
                open_rw(&pids.join("pids.max"))?,
                if v2 {
                    open_r(&pids.join("cpu.stat"))?
                } else {
                    open_r(&cpu.join("cpuacct.usage"))?
                },
                match &groups.freezer {
                    Some(root) => Some(Freezer::make(root.dir.join(&s))?),
                    // Its leaf, frozen in place (`cgroup.freeze`).
                    None if v2 => Some(Freezer::v2(&own)?),
                    None => None,
                },
            ))
        })();
        let (memory_tasks, max_usage, usage, pids_max, cpu_usage, freezer) = match files {
            Ok(f) => f,
            Err(e) => {
                undo();
                if let Some(root) = &groups.freezer {
                    let _ = rmdir(&root.dir.join(&s));
                }
                return Err(e);
            }
        };
        Ok(SessionDir {
            memory,
            pids,
            cpu,
            own,
            v2,
            memory_tasks,
            max_usage,
            usage,
            pids_max,
            cpu_usage,
            freezer,
            bounds: Mutex::new(None),
            cells: Mutex::new(Vec::new()),
            next_cell: AtomicU64::new(0),
        })
    }

    fn bound(&self, memory_bytes: u64, max_processes: u64) -> Result<(), CgroupError> {
        let mut b = lock(&self.bounds);
        if *b != Some((memory_bytes, max_processes)) {
            *b = None;
            super::cgroup::set_memory_limit(&self.memory, self.v2, memory_bytes)?;
            put(
                &self.pids_max,
                &max_processes.to_string(),
                &self.pids.join("pids.max"),
            )?;
            *b = Some((memory_bytes, max_processes));
        }
        Ok(())
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        // Its cells' directories first: a cgroup with children stays.
        lock(&self.cells).clear();
        // Nothing frozen is left to hold a directory (see `SessionGroup`'s
        // drop); thawed all the same, so a removal that kills finds them
        // able to die.
        if let Some(f) = &self.freezer {
            let _ = f.thaw();
        }
        if self.v2 {
            // One directory, with its leaf.
            for d in [&self.own, &self.pids] {
                if let Err(e) = super::cgroup::remove(d, true) {
                    tracing::warn!("{e}");
                }
            }
            return;
        }
        let freezer = self.freezer.as_ref().map(|f| &f.dir);
        for d in [&self.memory, &self.pids, &self.cpu]
            .into_iter()
            .chain(freezer)
        {
            if let Err(e) = rmdir(d) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// The supervisor's group in the freezer hierarchy, and `dying` beneath
/// it, which is never frozen: a kept process of a frozen session that is
/// killed is moved there to die (a frozen v1 task acts on no signal, a
/// SIGKILL included, until it is thawed; thawing its session would let
/// the session's other processes run). With its [`FreezerGuard`].
#[derive(Debug)]
struct FreezerRoot {
    dir: PathBuf,
    dying: PathBuf,
    dying_procs: std::fs::File,
    _guard: FreezerGuard,
}

impl FreezerRoot {
    fn make(dir: PathBuf, exe: &Path) -> Result<FreezerRoot, CgroupError> {
        make_dir(&dir)?;
        let dying = dir.join("dying");
        let made = make_dir(&dying).and_then(|()| {
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dying.join("cgroup.procs"))
                .map_err(CgroupError::io("open", &dying.join("cgroup.procs")))?;
            let guard = FreezerGuard::start(exe, &dir)
                .map_err(CgroupError::io("start the freezer guard for", &dir))?;
            Ok((procs, guard))
        });
        match made {
            Ok((dying_procs, guard)) => Ok(FreezerRoot {
                dir,
                dying,
                dying_procs,
                _guard: guard,
            }),
            Err(e) => {
                let _ = rmdir(&dying);
                let _ = rmdir(&dir);
                Err(e)
            }
        }
    }
}

/// A process (this program started again with `worker::GUARD_ARG`) that thaws
/// every freezer group beneath the supervisor's once the supervisor is gone,
/// however it went: a v1 task frozen when its supervisor is killed would
/// otherwise stay, its SIGKILL (from its PID namespace's end) never acted
/// on, holding its memory, until another supervisor sweeps. It waits for
/// the end of a pipe whose other end only the supervisor holds.
#[derive(Debug)]
struct FreezerGuard {
    child: std::process::Child,
}

/// How long a freezer guard has to say it is ready.
const GUARD_READY_WITHIN: Duration = Duration::from_secs(10);

impl FreezerGuard {
    /// Start it and wait for its ready byte: a program that is not a
    /// guard (a worker binary of another kind) is reaped and refused, not
    /// left a zombie that guards nothing.
    fn start(exe: &Path, root: &Path) -> std::io::Result<FreezerGuard> {
        let mut child = std::process::Command::new(exe)
            .arg(crate::worker::GUARD_ARG)
            .arg(root)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let ready = match child.stdout.take() {
            Some(mut out) => {
                let (tx, rx) = std::sync::mpsc::channel();
                // A reader of its own, so that waiting has a bound (the
                // read ends when the child is killed below).
                std::thread::spawn(move || {
                    let mut b = [0u8; 1];
                    let _ = tx.send(matches!(std::io::Read::read(&mut out, &mut b), Ok(1)));
                });
                rx.recv_timeout(GUARD_READY_WITHIN).unwrap_or(false)
            }
            None => false,
        };
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "{} did not start as a freezer guard",
                exe.display()
            )));
        }
        Ok(FreezerGuard { child })
    }
}

impl Drop for FreezerGuard {
    fn drop(&mut self) {
        // Its pipe's end: it thaws what is left (nothing, by now) and exits.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A freezer guard's life (see [`FreezerGuard`]): in a session of its own
/// (a terminal's Ctrl-C is not for it), wait for the end of stdin, then
/// thaw every group beneath `root`. Its exit code.
pub fn guard_main(root: Option<std::ffi::OsString>) -> i32 {
    let Some(root) = root else {
        return 2;
    };
    let _ = nix::unistd::setsid();
    // Ready: the supervisor waits for this byte.
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        if out.write_all(b"r").and_then(|()| out.flush()).is_err() {
            return 2;
        }
    }
    let mut buf = [0u8; 64];
    loop {
        match std::io::Read::read(&mut std::io::stdin(), &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    super::cgroup::thaw_tree(Path::new(&root));
    0
}

/// How long a freeze may take to hold every process of a session (a
/// process in the kernel on its way, e.g. reading a big file, is frozen
/// when it comes back).
const FREEZE_WITHIN: Duration = Duration::from_secs(5);

/// One session's freezer: under cgroup v1 its freezer group, with its
/// `tasks` (for a state process to join) and `freezer.state` kept open;
/// under v2 its leaf's `cgroup.freeze` and `cgroup.events`.
#[derive(Debug)]
struct Freezer {
    dir: PathBuf,
    /// v1: the group's `tasks`; v2: none (the leaf is where its state
    /// processes are anyway).
    tasks: Option<OwnedFd>,
    /// v1 `freezer.state`, v2 `cgroup.freeze`.
    state: std::fs::File,
    /// v2: `cgroup.events`, whose `frozen 1` says the freeze holds.
    events: Option<std::fs::File>,
}

impl Freezer {
    fn make(dir: PathBuf) -> Result<Freezer, CgroupError> {
        make_dir(&dir)?;
        let files =
            open_tasks(&dir, false).and_then(|t| Ok((t, open_rw(&dir.join("freezer.state"))?)));
        match files {
            Ok((tasks, state)) => Ok(Freezer {
                dir,
                tasks: Some(tasks),
                state,
                events: None,
            }),
            Err(e) => {
                let _ = rmdir(&dir);
                Err(e)
            }
        }
    }

    /// The freezer of the v2 cgroup at `dir` (made already).
    fn v2(dir: &Path) -> Result<Freezer, CgroupError> {
        Ok(Freezer {
            dir: dir.to_path_buf(),
            tasks: None,
            state: open_rw(&dir.join("cgroup.freeze"))?,
            events: Some(open_r(&dir.join("cgroup.events"))?),
        })
    }

    /// Whether every process of the group is frozen now (v1: reading
    /// `freezer.state` also moves a `FREEZING` group on to `FROZEN` once
    /// every process in it is).
    fn holds(&self) -> Result<bool, CgroupError> {
        match &self.events {
            Some(events) => {
                Ok(read_at0(events).and_then(|t| super::cgroup2::keyed(&t, "frozen")) == Some(1))
            }
            None => Ok(self.read()? == "FROZEN"),
        }
    }

    /// What `freezer.state` says now (reading it also moves a `FREEZING`
    /// group on to `FROZEN` once every process in it is).
    fn read(&self) -> Result<String, CgroupError> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let n = self
            .state
            .read_at(&mut buf, 0)
            .map_err(CgroupError::io("read", &self.dir.join("freezer.state")))?;
        Ok(String::from_utf8_lossy(buf.get(..n).unwrap_or_default())
            .trim()
            .to_owned())
    }

    /// Freeze every process in the group, and wait until each is frozen
    /// (at most `within`; past it the group is thawed again and the error
    /// says so).
    fn freeze(&self, within: Duration) -> Result<(), CgroupError> {
        if self.events.is_some() {
            put(&self.state, "1", &self.dir.join("cgroup.freeze"))?;
        } else {
            put(&self.state, "FROZEN", &self.dir.join("freezer.state"))?;
        }
        let end = Instant::now() + within;
        let mut pause = Duration::from_micros(20);
        loop {
            if self.holds()? {
                return Ok(());
            }
            if Instant::now() >= end {
                let _ = self.thaw();
                return Err(CgroupError::Busy(format!(
                    "{} was not frozen within {within:?}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        if self.events.is_some() {
            return put(&self.state, "0", &self.dir.join("cgroup.freeze"));
        }
        put(&self.state, "THAWED", &self.dir.join("freezer.state"))
    }
}

/// One cell's pids and cpuacct directories, with their files kept open;
/// kept for the session's next cell once emptied.
#[derive(Debug)]
struct CellDir {
    pids: PathBuf,
    cpu: PathBuf,
    v2: bool,
    pids_tasks: OwnedFd,
    /// v1 only: under v2 the pids group is the cpu group.
    cpu_tasks: Option<OwnedFd>,
    procs: std::fs::File,
    pids_max: std::fs::File,
    /// v1 `cpuacct.usage` (ns), v2 `cpu.stat` (`usage_usec`).
    cpu_usage: std::fs::File,
    /// `pids.events`: how often a fork in it failed at a bound.
    pids_events: Option<std::fs::File>,
    /// Where the OOM killer's kills in its session are counted
    /// (`oom_kill`): the session's `memory.events` (v2, its whole tree) or
    /// `memory.oom_control` (v1).
    oom_events: Option<std::fs::File>,
    /// The `pids.max` written last ([`UNKNOWN`]: not known).
    max: AtomicU64,
}

impl CellDir {
    fn make(session: &SessionDir) -> Result<CellDir, CgroupError> {
        let c = format!("c{}", session.next_cell.fetch_add(1, Ordering::Relaxed));
        let v2 = session.v2;
        let (pids, cpu) = (session.pids.join(&c), session.cpu.join(&c));
        make_dir(&pids)?;
        if let Err(e) = make_dir(&cpu) {
            let _ = rmdir(&pids);
            return Err(e);
        }
        let files = (|| {
            Ok::<_, CgroupError>((
                open_tasks(&pids, v2)?,
                if v2 {
                    None
                } else {
                    Some(open_tasks(&cpu, v2)?)
                },
                open_r(&pids.join("cgroup.procs"))?,
                open_rw(&pids.join("pids.max"))?,
                open_r(&cpu.join(if v2 { "cpu.stat" } else { "cpuacct.usage" }))?,
                open_r(&pids.join("pids.events")).ok(),
                // The session's: a live session's cells run in its own
                // leaf, not in their cell's group.
                open_r(&session.memory.join(if v2 {
                    "memory.events"
                } else {
                    "memory.oom_control"
                }))
                .ok(),
            ))
        })();
        match files {
            Ok((pids_tasks, cpu_tasks, procs, pids_max, cpu_usage, pids_events, oom_events)) => {
                Ok(CellDir {
                    pids,
                    cpu,
                    v2,
                    pids_tasks,
                    cpu_tasks,
                    procs,
                    pids_max,
                    cpu_usage,
                    pids_events,
                    oom_events,
                    max: AtomicU64::new(UNKNOWN),
                })
            }
            Err(e) => {
                let _ = rmdir(&pids);
                let _ = rmdir(&cpu);
                Err(e)
            }
        }
    }

    /// See [`stop`]; the `pids.max` it set is forgotten.
    fn stop(&self) -> Result<usize, CgroupError> {
        let r = stop(&self.pids, &self.pids_max);
        self.max.store(UNKNOWN, Ordering::Relaxed);
        r
    }

    /// CPU time of every process it had, in ns.
    fn cpu_ns(&self) -> Option<u64> {
        cpu_ns_of(&self.cpu_usage, self.v2)
    }

    /// How often a fork in it failed at its bound or its session's.
    fn pids_max_hits(&self) -> Option<u64> {
        super::cgroup2::keyed(&read_at0(self.pids_events.as_ref()?)?, "max")
    }

    /// How many of its processes the OOM killer has killed.
    fn oom_kills(&self) -> Option<u64> {
        super::cgroup2::keyed(&read_at0(self.oom_events.as_ref()?)?, "oom_kill")
    }

    /// See [`empty`]; the `pids.max` it may have set is forgotten.
    fn empty(&self, within: Duration) -> Result<(), CgroupError> {
        let r = empty(&self.pids, within);
        self.max.store(UNKNOWN, Ordering::Relaxed);
        r
    }

    /// `n` processes at most; `u64::MAX`: no bound of its own (its
    /// session's holds).
    fn set_max(&self, n: u64) -> Result<(), CgroupError> {
        if self.max.load(Ordering::Relaxed) != n {
            let value = if n == u64::MAX {
                "max".to_owned()
            } else {
                n.to_string()
            };
            put(&self.pids_max, &value, &self.pids.join("pids.max"))?;
            self.max.store(n, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Drop for CellDir {
    fn drop(&mut self) {
        if let Err(e) = self.empty(Duration::from_secs(10)) {
            tracing::warn!("{e}");
        }
        for d in [&self.pids, &self.cpu] {
            if let Err(e) = super::cgroup::remove(d, self.v2) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// One session's group (see the module docs).
#[derive(Debug)]
pub struct SessionGroup {
    groups: Arc<Groups>,
    dir: Arc<SessionDir>,
    /// The session's `pids.max` while a live cell's bound replaces it
    /// ([`Self::bound_live_cell`]).
    saved_max: Mutex<Option<String>>,
    /// Whether its freezer group is frozen now.
    frozen: std::sync::atomic::AtomicBool,
    /// Its CPU-time count (ns) when it was made (see [`Self::cpu_used_ns`]).
    cpu_base: u64,
}

impl SessionGroup {
    /// A group for one cell of this session, of at most `max_processes`.
    pub fn cell(self: &Arc<Self>, max_processes: u64) -> Result<CellGroup, CgroupError> {
        let kept = lock(&self.dir.cells).pop();
        let dir = match kept {
            Some(d) => d,
            None => Arc::new(CellDir::make(&self.dir)?),
        };
        dir.set_max(max_processes)?;
        // The session's peak is the cell's while it runs (its sub-cells,
        // which run while it waits, count with it).
        if let Some(peak) = &self.dir.max_usage {
            // Under v2 a write restarts the peak as read through this
            // descriptor (Linux 6.12; earlier it is the session's peak).
            let _ = put(peak, "0", &self.dir.memory);
        }
        let cpu_start = dir.cpu_ns().unwrap_or(0);
        let pids_hits_start = dir.pids_max_hits().unwrap_or(0);
        let oom_start = dir.oom_kills().unwrap_or(0);
        Ok(CellGroup {
            session: self.clone(),
            dir,
            cpu_start,
            pids_hits_start,
            oom_start,
        })
    }

    /// Descriptors of the session's own `tasks` files (memory, pids, cpu),
    /// for a process that joins the session's group itself by writing `0`
    /// to each (a live Python session's state process; see
    /// [`CellGroup::join_borrowed`] for why a process moves itself).
    pub fn join_fds(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        let memory = self
            .dir
            .memory_tasks
            .try_clone()
            .map_err(CgroupError::io("share", &self.dir.memory))?;
        let mut fds = vec![memory];
        if self.dir.v2 {
            // Its leaf, in the one hierarchy.
            return Ok(fds);
        }
        for dir in [&self.dir.pids, &self.dir.cpu] {
            let tasks = dir.join("tasks");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&tasks)
                .map_err(CgroupError::io("open", &tasks))?;
            fds.push(OwnedFd::from(f));
        }
        if let Some(tasks) = self.dir.freezer.as_ref().and_then(|f| f.tasks.as_ref()) {
            fds.push(
                tasks
                    .try_clone()
                    .map_err(CgroupError::io("share", &self.dir.pids))?,
            );
        }
        Ok(fds)
    }

    /// Whether the session can be frozen (there is a freezer hierarchy).
    pub fn can_freeze(&self) -> bool {
        self.dir.freezer.is_some()
    }

    /// Whether the session is frozen now.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Freeze every process of the session's freezer group (its state
    /// processes and what they started), and wait until each is frozen:
    /// from then on none of them runs until [`Self::thaw`]. Nothing to do
    /// where sessions cannot be frozen.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        let Some(f) = &self.dir.freezer else {
            return Ok(());
        };
        f.freeze(FREEZE_WITHIN)?;
        self.frozen.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Let the session's processes run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        let Some(f) = &self.dir.freezer else {
            return Ok(());
        };
        if self.frozen.swap(false, Ordering::SeqCst) {
            f.thaw()?;
        }
        Ok(())
    }

    /// CPU time (ns) every process of the session has had, its cells'
    /// included.
    pub fn cpu_ns(&self) -> Option<u64> {
        cpu_ns_of(&self.dir.cpu_usage, self.dir.v2)
    }

    /// CPU time (ns) the session's processes have had since it was made:
    /// every cell's, its live state processes', whatever they started.
    pub fn cpu_used_ns(&self) -> Option<u64> {
        self.cpu_ns().map(|n| n.saturating_sub(self.cpu_base))
    }

    /// SIGKILL one process of the session, by a pidfd the caller checked
    /// is the session's (see [`open_member`]), frozen or not: a frozen one
    /// is moved to a freezer group that is never frozen, where it dies
    /// (see the module docs); the session's others stay frozen.
    pub fn kill(&self, pidfd: std::os::fd::BorrowedFd<'_>) {
        let _ = crate::sandbox::process::pidfd_kill(pidfd);
        if !self.is_frozen() {
            return;
        }
        // Frozen, it cannot exit: its pid stays its own until it is moved.
        if let Ok(host) = pidfd_pid(&pidfd) {
            self.release_frozen(host);
        }
    }

    /// Kill `pid`, a process of the session listed in its group (see
    /// [`Self::kill`] for one that is frozen).
    fn kill_listed(&self, pid: i32) {
        let _ = crate::sandbox::process::kill_pid(pid);
        if self.is_frozen() {
            self.release_frozen(pid);
        }
    }

    /// Move `pid` (killed, frozen) to the freezer group that is never
    /// frozen, where it dies.
    fn release_frozen(&self, pid: i32) {
        if let Some(root) = &self.groups.freezer {
            let path = root.dying.join("cgroup.procs");
            if let Err(e) = put(&root.dying_procs, &pid.to_string(), &path) {
                tracing::debug!("a killed frozen process stays until its session thaws: {e}");
            }
        }
    }

    /// Kill every process of the session's group (its own directory and
    /// its cells') except those in `keep` (pids in our namespace), and
    /// wait until only they are left (at most `within`): what a live
    /// Python session's cell left (it runs in the session's group, beside
    /// the state processes in `keep`), whoever its parent is. Nothing in
    /// the session can fork meanwhile: its `pids.max` is 0 until the
    /// others are gone, then the session's own. The pids it killed.
    pub fn end_others(&self, keep: &[i32], within: Duration) -> Result<Vec<i32>, CgroupError> {
        let max_path = self.dir.pids.join("pids.max");
        let saved = lock(&self.saved_max).take();
        let before = match saved {
            Some(v) => v,
            None => std::fs::read_to_string(&max_path)
                .map_err(CgroupError::io("read", &max_path))?
                .trim()
                .to_owned(),
        };
        let killed = self.kill_others(keep, within, false);
        put(&self.dir.pids_max, &before, &max_path)?;
        killed
    }

    /// [`Self::end_others`], then freeze the session (see
    /// [`Self::freeze`]) before its `pids.max` is put back: nothing can
    /// have started between the last look and the freeze. Once a live
    /// session's cell is over and its spare forked: from here on none of
    /// its processes runs until the next cell thaws it.
    pub fn settle(&self, keep: &[i32], within: Duration) -> Result<Vec<i32>, CgroupError> {
        let max_path = self.dir.pids.join("pids.max");
        let before = match lock(&self.saved_max).take() {
            Some(v) => v,
            None => std::fs::read_to_string(&max_path)
                .map_err(CgroupError::io("read", &max_path))?
                .trim()
                .to_owned(),
        };
        let killed = self.kill_others(keep, within, true);
        put(&self.dir.pids_max, &before, &max_path)?;
        killed
    }

    /// The pids of the session's group (its own directory and its
    /// cells') that are neither this process nor in `keep`.
    fn others(&self, keep: &[i32]) -> Vec<i32> {
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        let mut all = procs(&self.dir.pids);
        if let Ok(entries) = std::fs::read_dir(&self.dir.pids) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    all.extend(procs(&e.path()));
                }
            }
        }
        all.retain(|p| *p != me && !keep.contains(p));
        all
    }

    /// Kill the session's processes not in `keep` with its `pids.max` at
    /// 0 (the caller puts it back), until none is left (at most
    /// `within`); with `freeze`, freeze the session then, and look again.
    fn kill_others(
        &self,
        keep: &[i32],
        within: Duration,
        freeze: bool,
    ) -> Result<Vec<i32>, CgroupError> {
        let max_path = self.dir.pids.join("pids.max");
        let mut killed: Vec<i32> = Vec::new();
        if !self.others(keep).is_empty() || freeze {
            put(&self.dir.pids_max, "0", &max_path)?;
        }
        let end = Instant::now() + within;
        let mut frozen = false;
        loop {
            let left = self.others(keep);
            if left.is_empty() {
                if !freeze || frozen {
                    return Ok(killed);
                }
                // Frozen with the bound at 0: whatever is there now stays
                // there, unable to run; one more look finds what a fork
                // under way added.
                self.freeze()?;
                frozen = true;
                continue;
            }
            if Instant::now() >= end {
                return Err(CgroupError::Busy(format!(
                    "{} process(es) of {} still there after {within:?}",
                    left.len(),
                    self.dir.pids.display()
                )));
            }
            for pid in left {
                if !killed.contains(&pid) {
                    killed.push(pid);
                }
                self.kill_listed(pid);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Bound a live cell's processes: it runs in the session's own group,
    /// beside `held` state processes, and may have `max_processes` at once
    /// (itself included) and one more, the state process it leaves; never
    /// more than the session's bound. [`Self::end_others`] puts the
    /// session's bound back.
    pub fn bound_live_cell(&self, held: u64, max_processes: u64) -> Result<(), CgroupError> {
        let max_path = self.dir.pids.join("pids.max");
        let mut saved = lock(&self.saved_max);
        let session = match saved.as_ref() {
            Some(v) => v.clone(),
            None => std::fs::read_to_string(&max_path)
                .map_err(CgroupError::io("read", &max_path))?
                .trim()
                .to_owned(),
        };
        let want = held.saturating_add(max_processes).saturating_add(1);
        let n = session.parse::<u64>().map_or(want, |p| p.min(want));
        put(&self.dir.pids_max, &n.to_string(), &max_path)?;
        *saved = Some(session);
        Ok(())
    }

    /// Bytes of memory the session holds now (its processes and the pages
    /// of its files).
    pub fn memory_bytes(&self) -> Option<u64> {
        get(&self.dir.usage)
    }

    /// The session's memory cgroup directory.
    pub fn memory_path(&self) -> &Path {
        &self.dir.memory
    }

    /// The session's pids cgroup directory.
    pub fn pids_path(&self) -> &Path {
        &self.dir.pids
    }
}

impl Drop for SessionGroup {
    fn drop(&mut self) {
        // Its cells are over (each holds the session); anything left is
        // killed before the group is kept or removed: sent SIGKILL while
        // it may be frozen, then thawed, to die.
        if !none_in_dir(&self.dir.pids) {
            if let Err(e) = stop(&self.dir.pids, &self.dir.pids_max) {
                tracing::warn!("{e}");
            }
            if let Err(e) = self.thaw() {
                tracing::warn!("{e}");
            }
            if let Err(e) = empty(&self.dir.pids, Duration::from_secs(10)) {
                tracing::warn!("{e}");
            }
            // Its pids.max was set to 0 to empty it.
            *lock(&self.dir.bounds) = None;
        } else if let Err(e) = self.thaw() {
            tracing::warn!("{e}");
        }
        // A group that still holds memory (pages of files not yet freed)
        // is not handed to another session.
        let usage = get(&self.dir.usage).unwrap_or(u64::MAX);
        let mut free = lock(&self.groups.free);
        if free.len() < KEEP && usage < (1 << 20) {
            // Handed on with at most one emptied cell directory (a session
            // whose cells overlapped, or that had a worker started ahead
            // beside its cell, kept more): what the kept groups hold stays
            // what one cell needs.
            lock(&self.dir.cells).truncate(1);
            free.push(self.dir.clone());
        }
    }
}

/// One cell's group (see the module docs): emptied when dropped, and kept
/// for the session's next cell.
#[derive(Debug)]
pub struct CellGroup {
    session: Arc<SessionGroup>,
    dir: Arc<CellDir>,
    cpu_start: u64,
    pids_hits_start: u64,
    oom_start: u64,
}

/// What a cell's group measured of its whole process tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeUsage {
    pub cpu_ms: Option<u64>,
    pub peak_bytes: Option<u64>,
    /// How often a fork of the cell failed at its process bound or its
    /// session's (`pids.events`).
    pub pids_max_hits: Option<u64>,
    /// How many processes of its session the OOM killer killed while it
    /// ran (the session past its memory bound).
    pub oom_kills: Option<u64>,
}

impl CellGroup {
    /// The descriptors a single-threaded child writes `0` to between fork
    /// and exec to join (see [`super::cgroup::join_fd`]); they stay open
    /// as long as `self`.
    pub fn join_fds(&self) -> Vec<RawFd> {
        match &self.dir.cpu_tasks {
            Some(cpu) => vec![
                self.session.dir.memory_tasks.as_raw_fd(),
                self.dir.pids_tasks.as_raw_fd(),
                cpu.as_raw_fd(),
            ],
            // cgroup v2: the cell's group is in its session's.
            None => vec![self.dir.pids_tasks.as_raw_fd()],
        }
    }

    /// [`Self::join_fds`], borrowed (to pass to a process that forks the
    /// child, which joins by writing `0` to each).
    pub fn join_borrowed(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match &self.dir.cpu_tasks {
            Some(cpu) => vec![
                self.session.dir.memory_tasks.as_fd(),
                self.dir.pids_tasks.as_fd(),
                cpu.as_fd(),
            ],
            None => vec![self.dir.pids_tasks.as_fd()],
        }
    }

    /// Allow the cell `n` processes at once (threads count); `u64::MAX`:
    /// no bound of its own, its session's holds.
    pub fn set_max_processes(&self, n: u64) -> Result<(), CgroupError> {
        self.dir.set_max(n)
    }

    /// Kill whatever of the cell is left and wait until none of it is (at
    /// most `within`).
    pub fn end(&self, within: Duration) -> Result<(), CgroupError> {
        self.dir.empty(within)
    }

    /// SIGKILL every process of the cell now, without waiting for them to
    /// be gone (see [`stop`]; [`Self::end`] waits): how many were there.
    pub fn stop(&self) -> Result<usize, CgroupError> {
        self.dir.stop()
    }

    /// Whether no process of the cell is left.
    pub fn is_empty(&self) -> bool {
        none_in(&self.dir.procs)
    }

    /// CPU time (ns) of every process the cell group has had, as its
    /// counter reads now.
    pub fn cpu_ns(&self) -> Option<u64> {
        get(&self.dir.cpu_usage)
    }

    /// CPU time of every process the cell had, and the session's peak
    /// memory while it ran.
    pub fn usage(&self) -> TreeUsage {
        TreeUsage {
            cpu_ms: self
                .dir
                .cpu_ns()
                .map(|ns| ns.saturating_sub(self.cpu_start) / 1_000_000),
            peak_bytes: self.session.dir.max_usage.as_ref().and_then(get),
            pids_max_hits: self
                .dir
                .pids_max_hits()
                .map(|n| n.saturating_sub(self.pids_hits_start)),
            oom_kills: self
                .dir
                .oom_kills()
                .map(|n| n.saturating_sub(self.oom_start)),
        }
    }

    /// The cell's pids cgroup directory.
    pub fn pids_path(&self) -> &Path {
        &self.dir.pids
    }
}

impl Drop for CellGroup {
    fn drop(&mut self) {
        if !self.is_empty() {
            if let Err(e) = self.dir.empty(Duration::from_secs(10)) {
                // Not handed to another cell: its directory goes (or is
                // tried again) when the last handle does.
                tracing::warn!("{e}");
                return;
            }
        }
        lock(&self.session.dir.cells).push(self.dir.clone());
    }
}

/// The pid of the process behind `pidfd` in this process's PID namespace
/// (from `/proc/self/fdinfo`).
pub fn pidfd_pid(pidfd: &impl AsRawFd) -> Result<i32, CgroupError> {
    let path = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let text = std::fs::read_to_string(&path).map_err(CgroupError::io("read", Path::new(&path)))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| CgroupError::Busy(format!("{path} names no live process")))
}

/// Whether `pid` is listed in the pids cgroup at `dir` or in one of the
/// groups directly beneath it (a session's cells).
fn listed_in(dir: &Path, pid: i32) -> bool {
    if procs(dir).contains(&pid) {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .any(|e| procs(&e.path()).contains(&pid))
}

/// The pid (in our namespace) of the process behind `pidfd`, checked to be
/// in the pids cgroup at `dir` or a group directly beneath it. The check
/// holds for that process, not for another given its pid: the pid is
/// read from the pidfd, and read again after the cgroup is, and a pid is
/// that process's until it is reaped (the second read says -1 then).
pub fn member_pid(pidfd: &impl AsRawFd, dir: &Path) -> Result<i32, CgroupError> {
    let pid = pidfd_pid(pidfd)?;
    if !listed_in(dir, pid) {
        return Err(CgroupError::Busy(format!(
            "process {pid} is not in {}",
            dir.display()
        )));
    }
    match pidfd_pid(pidfd) {
        Ok(again) if again == pid => Ok(pid),
        _ => Err(CgroupError::Busy(format!(
            "process {pid} ended while it was looked for in {}",
            dir.display()
        ))),
    }
}

/// A pidfd for `host` (a pid in our namespace), opened first and then
/// checked to be of the pids cgroup at `dir` (see [`member_pid`]): a
/// process found there by pid may have ended and its pid been given to
/// another before the pidfd was opened.
pub fn open_member(dir: &Path, host: i32) -> Result<OwnedFd, CgroupError> {
    let pidfd = crate::sandbox::process::pidfd_open(host)
        .map_err(|e| CgroupError::Busy(format!("cannot open process {host}: {e}")))?;
    member_pid(&pidfd, dir)?;
    Ok(pidfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Option<(super::super::cgroup::CellCgroup, Arc<Groups>)> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let cells = super::super::cgroup::CellCgroup::create(256 << 20).ok()?;
        let exe = std::env::current_exe().ok()?;
        let g = Groups::new(cells.path(), &exe).ok()?;
        Some((cells, Arc::new(g)))
    }

    #[test]
    fn a_cells_tree_is_bounded_counted_and_emptied() {
        let _serial = crate::util::lock(&super::super::cgroup::TEST_LOCK);
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
        // Kept, empty, for the session's next cell.
        let again = s.cell(4).expect("cell group");
        assert_eq!(again.pids_path(), path.as_path());
        assert!(again.is_empty());
        let pids_max = std::fs::read_to_string(path.join("pids.max")).expect("pids.max");
        assert_eq!(
            pids_max.trim(),
            "4",
            "emptying it must not leave pids.max at 0"
        );
        drop(again);
        drop(s);
        drop(g);
        assert!(
            !path.exists(),
            "the cell's group is removed with the supervisor's"
        );
        drop(cells_cgroup);
    }

    /// A `sleep` that joined `session`'s own groups (as a state process
    /// does), with a pidfd for it.
    fn sleeper_in(session: &SessionGroup) -> (std::process::Child, OwnedFd) {
        let fds = session.join_fds().expect("join fds");
        let child = crate::sandbox::testing::sleeper_joining(&fds);
        drop(fds);
        let pidfd = crate::sandbox::process::pidfd_open(child.id() as i32).expect("pidfd");
        (child, pidfd)
    }

    /// What `/proc/PID/stat` says of `pid`'s state (`R`, `S`, `D`, `Z`...).
    fn proc_state(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|t| {
                t.rsplit_once(')')
                    .map(|(_, r)| r.trim().chars().take(1).collect())
            })
            .unwrap_or_default()
    }

    /// Settling a session kills every process of its group but those kept,
    /// whoever their parent is, and freezes the rest: they use no CPU and
    /// stay until thawed. One kept process killed while the session is
    /// frozen dies without the session being thawed; dropping the group
    /// kills and thaws what is left.
    #[test]
    fn a_settled_session_keeps_only_what_is_kept_and_is_frozen() {
        let _serial = crate::util::lock(&super::super::cgroup::TEST_LOCK);
        let Some((cells_cgroup, g)) = groups() else {
            panic!("this test needs root and cgroup v1 memory, pids and cpuacct hierarchies");
        };
        let s = Arc::new(g.session(64 << 20, 8).expect("session group"));
        assert!(
            s.can_freeze(),
            "this test needs the cgroup v1 freezer hierarchy, or cgroup v2"
        );
        let (mut kept, kept_fd) = sleeper_in(&s);
        let (mut other, _other_fd) = sleeper_in(&s);
        let (mut second, second_fd) = sleeper_in(&s);
        let keep = [kept.id() as i32, second.id() as i32];
        let killed = s.settle(&keep, Duration::from_secs(5)).expect("settled");
        assert_eq!(killed, vec![other.id() as i32]);
        assert!(other.wait().expect("wait").code().is_none(), "killed");
        assert!(s.is_frozen());
        let freezer = s.dir.freezer.as_ref().expect("a freezer group");
        assert!(freezer.holds().expect("the freeze read back"), "not frozen");
        // A kept one killed while frozen dies; the other stays frozen.
        use std::os::fd::AsFd;
        s.kill(second_fd.as_fd());
        let status = second.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(s.is_frozen());
        assert!(
            matches!(proc_state(kept.id()).as_str(), "D" | "S"),
            "{}",
            proc_state(kept.id())
        );
        // Its pidfd is checked against the group: it is the session's.
        assert_eq!(
            member_pid(&kept_fd, s.pids_path()).expect("a member"),
            kept.id() as i32
        );
        let stranger = std::process::Command::new("/bin/sleep")
            .arg("300")
            .spawn()
            .expect("spawn");
        let mut stranger = stranger;
        assert!(open_member(s.pids_path(), stranger.id() as i32).is_err());
        let _ = stranger.kill();
        let _ = stranger.wait();
        // The session's CPU time is counted while it runs.
        assert!(s.cpu_ns().is_some());
        drop(s);
        let status = kept.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
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
