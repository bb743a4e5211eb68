//! A memory cgroup around cells.
//!
//! RLIMIT_AS bounds each process, but a cell may start up to
//! `max_processes` of them: 4 children touching 800 MiB each held 3.2 GB of
//! the host under a "1 GiB" limit, and 60 would exhaust it. A memory cgroup
//! bounds what every process beneath it holds together; past the bound the
//! kernel reclaims, then kills the largest process inside (a cell's, not the
//! supervisor's, which stays outside).
//!
//! The controller is found where this process's own memory cgroup is:
//! cgroup v1 (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes`
//! where swap is accounted) or v2 (`memory.max`, `memory.swap.max = 0`),
//! and a child is made beneath it, named `cellbox-<pid>-<n>`. Making one
//! needs write access to that cgroup (root, or a delegated subtree); under
//! v2, a cgroup that holds processes cannot hand controllers to children,
//! so its processes are moved into a leaf first, and the cells' own
//! processes join a leaf beneath theirs (see [`super::cgroup2`]).
//!
//! A process joins by writing `0` through a descriptor opened here (v1
//! `tasks`, v2 `cgroup.procs`) while it has a single thread: [`join_fd`] is
//! async-signal-safe, for use between fork and exec.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the memory controller is mounted and which version it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Controller {
    v2: bool,
    /// This process's memory cgroup, as a directory.
    own: PathBuf,
}

/// A memory cgroup made for cells; its processes are killed and it is
/// removed when dropped.
#[derive(Debug)]
pub struct CellCgroup {
    dir: PathBuf,
    procs: OwnedFd,
    limit: u64,
    v2: bool,
    /// For a reused slot ([`CellCgroup::slot`]): the lock that holds it; the
    /// cgroup is emptied, not removed, on drop.
    slot_lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file or directory could not be used.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The host does not offer what is needed (a hierarchy, a controller).
    #[error("{0}")]
    Unavailable(String),
    /// A group still held processes when it had to be empty or gone.
    #[error("{0}")]
    Busy(String),
}

impl CgroupError {
    /// `map_err` for an I/O error of `action` (e.g. "open") on `path`.
    pub(crate) fn io(
        action: impl Into<String>,
        path: &Path,
    ) -> impl FnOnce(std::io::Error) -> CgroupError {
        let (action, path) = (action.into(), path.to_path_buf());
        move |source| CgroupError::Io {
            action,
            path,
            source,
        }
    }
}

impl From<&str> for CgroupError {
    fn from(what: &str) -> CgroupError {
        CgroupError::Unavailable(what.to_owned())
    }
}

/// How many one-shot cgroups may be in use at once (concurrent `cellbox
/// exec` runs); past that a run has none.
const SLOTS: usize = 64;

impl CellCgroup {
    /// Make a cgroup beneath this process's memory cgroup whose processes
    /// may hold `bytes` of memory together (no swap).
    pub fn create(bytes: u64) -> Result<CellCgroup, CgroupError> {
        let ctl = find_controller()?;
        sweep_stale(&ctl.own, ctl.v2);
        let name = format!(
            "cellbox-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = ctl.own.join(name);
        std::fs::create_dir(&dir).map_err(CgroupError::io("make the cgroup", &dir))?;
        if ctl.v2 {
            // Its sessions' groups need controllers of their own, so its
            // own processes (the warm pools) live in a leaf beneath it.
            let pool = (|| {
                super::cgroup2::enable(&dir)?;
                let pool = dir.join(super::cgroup2::POOL);
                std::fs::create_dir(&pool).map_err(CgroupError::io("make the cgroup", &pool))?;
                Ok(pool)
            })();
            return match pool {
                Ok(pool) => Self::open(dir, Some(pool), ctl.v2, bytes, None),
                Err(e) => {
                    let _ = remove_tree(&dir, true);
                    Err(e)
                }
            };
        }
        Self::open(dir, None, ctl.v2, bytes, None)
    }

    /// Like [`CellCgroup::create`], for a process that supervises one cell
    /// and then exits (`cellbox exec`): instead of a new cgroup each time
    /// (making and removing a memory cgroup costs about as much as the rest
    /// of the cell's setup), one of a few kept ones, `cellbox-oneshot-<n>`,
    /// claimed with a lock file under `/run/cellbox` and emptied, not
    /// removed, when dropped. Root only.
    pub fn slot(bytes: u64) -> Result<CellCgroup, CgroupError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let ctl = find_controller()?;
        let locks = Path::new("/run/cellbox");
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(locks) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(CgroupError::io("make", locks)(e));
            }
        }
        for n in 0..SLOTS {
            let path = locks.join(format!("oneshot-cgroup-{n}.lock"));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(CgroupError::io("open", &path))?;
            let lock =
                match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                    Ok(l) => l,
                    Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                    Err((_, e)) => return Err(CgroupError::io("lock", &path)(e.into())),
                };
            let dir = ctl.own.join(format!("cellbox-oneshot-{n}"));
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                // Kept from an earlier run: empty it of anything a run that
                // was killed may have left.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    kill_all(&dir, ctl.v2);
                }
                Err(e) => return Err(CgroupError::io("make the cgroup", &dir)(e)),
            }
            return Self::open(dir, None, ctl.v2, bytes, Some(lock));
        }
        Err(CgroupError::Busy(format!(
            "all {SLOTS} one-shot cgroup slots are in use"
        )))
    }

    /// `procs_in`: the leaf its processes join, where not `dir` itself.
    fn open(
        dir: PathBuf,
        procs_in: Option<PathBuf>,
        v2: bool,
        bytes: u64,
        slot_lock: Option<nix::fcntl::Flock<std::fs::File>>,
    ) -> Result<CellCgroup, CgroupError> {
        // Under v1 a process joins through `tasks`: it moves only the
        // writing thread (the whole process, for the single-threaded child
        // that joins between fork and exec), which the kernel does without
        // taking its global threadgroup lock; through `cgroup.procs` every
        // join could wait for an RCU grace period (10-20 ms, one run in ten
        // here). v2 has no such file for domain cgroups.
        let join_file = if v2 { "cgroup.procs" } else { "tasks" };
        let join = procs_in.as_ref().unwrap_or(&dir).join(join_file);
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(&join)
            .map(OwnedFd::from);
        let procs = match procs {
            Ok(fd) => fd,
            Err(e) => {
                if slot_lock.is_none() {
                    let _ = remove_tree(&dir, v2);
                }
                return Err(CgroupError::io("open", &join)(e));
            }
        };
        // From here on the directory goes (or is emptied) with `made`.
        let made = CellCgroup {
            dir,
            procs,
            limit: bytes,
            v2,
            slot_lock,
        };
        made.set_limit(bytes)?;
        Ok(made)
    }

    fn set_limit(&self, bytes: u64) -> Result<(), CgroupError> {
        set_memory_limit(&self.dir, self.v2, bytes)
    }

    /// The bytes its processes may hold together.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Bytes of memory the group's processes hold now.
    pub fn in_use(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `"cgroup v1 memory"` or `"cgroup v2 memory"`.
    pub fn kind(&self) -> &'static str {
        if self.v2 {
            "cgroup v2 memory"
        } else {
            "cgroup v1 memory"
        }
    }

    /// The descriptor a child writes to join (see [`join_fd`]).
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// Bound what the processes of the memory cgroup at `dir` hold together
/// to `bytes`, swap included.
pub fn set_memory_limit(dir: &Path, v2: bool, bytes: u64) -> Result<(), CgroupError> {
    let write = |file: &str, value: &str| {
        let path = dir.join(file);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .map_err(CgroupError::io(format!("write {value} to"), &path))
    };
    let n = bytes.to_string();
    if v2 {
        write("memory.max", &n)?;
        // Absent when the kernel has no swap support.
        if dir.join("memory.swap.max").exists() {
            write("memory.swap.max", "0")?;
        }
    } else {
        // Present only where swap is accounted; memory + swap = memory.
        // It may never be below the memory limit, so it is lifted first
        // (a kept cgroup may hold a lower one from its last use).
        let memsw = dir.join("memory.memsw.limit_in_bytes").exists();
        if memsw {
            write("memory.memsw.limit_in_bytes", "-1")?;
        }
        write("memory.limit_in_bytes", &n)?;
        if memsw {
            write("memory.memsw.limit_in_bytes", &n)?;
        }
    }
    Ok(())
}

/// The `cgroup` entry of a cell's sandbox report: the cgroup its processes
/// started in (if any) under a profile whose cgroup layer is `mode`.
pub fn layer_report(
    cgroup: Option<&CellCgroup>,
    mode: crate::profiles::LayerMode,
) -> crate::sandbox::LayerReport {
    crate::sandbox::LayerReport {
        name: crate::sandbox::Layer::Cgroup.as_str().to_owned(),
        applied: cgroup.is_some(),
        mode,
        detail: match cgroup {
            Some(c) if nix::unistd::geteuid().is_root() => {
                format!("{}, {} MiB in all", c.kind(), c.limit() >> 20)
            }
            // Without root: a subtree delegated to this user.
            Some(c) => format!(
                "{} in a subtree delegated to uid {}, {} MiB in all",
                c.kind(),
                nix::unistd::geteuid(),
                c.limit() >> 20
            ),
            None if mode == crate::profiles::LayerMode::Off => "off in this profile".into(),
            None => {
                "none: making a memory cgroup needs root or a delegated cgroup v2 subtree, and a \
                 usable memory controller"
                    .into()
            }
        },
    }
}

/// The memory controller cells' cgroups would be made under: its kind (as
/// [`CellCgroup::kind`] names it) and this process's cgroup in it.
pub fn memory_controller() -> Result<(&'static str, PathBuf), CgroupError> {
    let c = find_controller()?;
    let kind = if c.v2 {
        "cgroup v2 memory"
    } else {
        "cgroup v1 memory"
    };
    Ok((kind, c.own))
}

/// Join the cgroup whose `tasks` or `cgroup.procs` is open on `fd`; the
/// caller must have a single thread. Async-signal-safe: one `write`, no
/// allocation.
pub fn join_fd(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: writes one byte from a static buffer to a descriptor the
    // caller keeps open.
    let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Drop for CellCgroup {
    fn drop(&mut self) {
        if self.slot_lock.is_some() {
            // Emptied now; the lock goes with the rest of `self`.
            kill_all(&self.dir, self.v2);
        } else if let Err(e) = remove_tree(&self.dir, self.v2) {
            tracing::warn!("{e}");
        }
    }
}

/// Kill what is left in the cgroup at `dir` and remove it.
pub(crate) fn remove(dir: &Path, v2: bool) -> Result<(), CgroupError> {
    for attempt in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 99 => {}
            Err(e) => return Err(CgroupError::io("remove the cgroup", dir)(e)),
        }
        kill_all(dir, v2);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(CgroupError::Busy(format!(
        "cannot remove the cgroup {}: its processes would not go",
        dir.display()
    )))
}

/// SIGKILL every process in the cgroup at `dir` (not this one).
fn kill_all(dir: &Path, v2: bool) {
    if v2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let me = std::process::id();
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            if pid != me {
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = crate::sandbox::process::kill_pid(pid);
                }
            }
        }
    }
}

/// Remove the cgroups of supervisors that are gone (killed) beneath `own`:
/// ours by name (`cellbox-<pid>-…` for a pid that no longer runs), with
/// every cgroup beneath them (per-session ones included), after killing
/// what is left in them.
fn sweep_stale(own: &Path, v2: bool) {
    let Ok(entries) = std::fs::read_dir(own) else {
        return;
    };
    for entry in entries.flatten() {
        // Kept one-shot slots (`cellbox-oneshot-<n>`) are not named for a
        // pid and stay.
        if !crate::sandbox::process::named_for_a_gone_process(&entry.file_name(), "cellbox-") {
            continue;
        }
        // A cgroup file system holds directories and files only; anything
        // else is not ours.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match remove_tree(&entry.path(), v2) {
            Ok(()) => tracing::info!(
                "removed the cgroup of a gone supervisor: {}",
                entry.path().display()
            ),
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// Kill what is in the cgroup at `dir` and beneath it, and remove them
/// all, deepest first (retried while the killed processes exit).
fn remove_tree(dir: &Path, v2: bool) -> Result<(), CgroupError> {
    fn below(dir: &Path, out: &mut Vec<PathBuf>) {
        out.push(dir.to_path_buf());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    below(&e.path(), out);
                }
            }
        }
    }
    let mut dirs = Vec::new();
    below(dir, &mut dirs);
    for d in dirs.iter().rev() {
        remove(d, v2)?;
    }
    Ok(())
}

/// Sweep what gone supervisors left in every cgroup hierarchy this process
/// is in (v1 memory, pids and the rest, and v2): see [`sweep_stale`]. Their
/// freezer groups are thawed first, in every hierarchy: a frozen v1 task
/// dies of its SIGKILL only once thawed, and until then holds its place in
/// the other hierarchies' groups too.
pub fn sweep_gone() {
    let (Ok(cgroups), Ok(mountinfo)) = (
        std::fs::read_to_string("/proc/self/cgroup"),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return;
    };
    let dirs = hierarchy_dirs(&cgroups, &mountinfo);
    for (dir, _) in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let gone =
                crate::sandbox::process::named_for_a_gone_process(&entry.file_name(), "cellbox-");
            if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
                thaw_tree(&entry.path());
            }
        }
    }
    for (dir, v2) in dirs {
        sweep_stale(&dir, v2);
    }
}

/// Thaw the v1 freezer group at `dir` and every group beneath it (where
/// there is no `freezer.state`, nothing is done).
pub(crate) fn thaw_tree(dir: &Path) {
    let state = dir.join("freezer.state");
    if state.exists() {
        let _ = std::fs::write(&state, "THAWED");
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                thaw_tree(&e.path());
            }
        }
    }
}

/// This process's cgroup directory in every mounted hierarchy, with
/// whether it is v2 (pure, for the tests).
fn hierarchy_dirs(cgroups: &str, mountinfo: &str) -> Vec<(PathBuf, bool)> {
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split_whitespace();
        let (Some(fstype), Some(_source), Some(opts)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        let f: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(mount_point)) = (f.get(3), f.get(4)) else {
            continue;
        };
        let opts: Vec<&str> = opts.split(',').collect();
        let path = cgroups.lines().find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_id, ctls, path) = (p.next()?, p.next()?, p.next()?);
            let matches = match fstype {
                "cgroup2" => ctls.is_empty(),
                "cgroup" => !ctls.is_empty() && ctls.split(',').all(|c| opts.contains(&c)),
                _ => false,
            };
            matches.then_some(path)
        });
        let Some(path) = path else { continue };
        let rel = path
            .strip_prefix(root.trim_end_matches('/'))
            .unwrap_or(path);
        let dir = Path::new(mount_point).join(rel.trim_start_matches('/'));
        let entry = (dir, fstype == "cgroup2");
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}

/// This process's memory cgroup directory: v1 if the memory controller is
/// mounted there, else v2 if its cgroup offers `memory` (then the cgroup
/// cells' cgroups are made beneath, see [`super::cgroup2::base`]).
fn find_controller() -> Result<Controller, CgroupError> {
    let found = find_own()?;
    if found.v2 {
        return Ok(Controller {
            v2: true,
            own: super::cgroup2::base(&found.own)?,
        });
    }
    Ok(found)
}

fn find_own() -> Result<Controller, CgroupError> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(CgroupError::io("read", Path::new("/proc/self/cgroup")))?;
    // The usual place first (reading mountinfo costs as much as the rest):
    // wherever the memory cgroup made beneath it is, it bounds the cell.
    if let Some(path) = v1_memory_path(&cgroups) {
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        if dir.join("memory.limit_in_bytes").exists() {
            return Ok(Controller {
                v2: false,
                own: dir,
            });
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(CgroupError::io("read", Path::new("/proc/self/mountinfo")))?;
    controller_in(
        &cgroups,
        &mountinfo,
        |p| p.exists(),
        |p| std::fs::read_to_string(p).unwrap_or_default(),
    )
}

/// The path of this process's v1 memory cgroup: the hierarchy line of
/// `/proc/self/cgroup` that names the memory controller.
fn v1_memory_path(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_id, ctls, path) = (f.next()?, f.next()?, f.next()?);
        ctls.split(',').any(|c| c == "memory").then_some(path)
    })
}

/// [`find_controller`] on given texts (pure, for the tests).
fn controller_in(
    cgroups: &str,
    mountinfo: &str,
    exists: impl Fn(&Path) -> bool,
    read: impl Fn(&Path) -> String,
) -> Result<Controller, CgroupError> {
    // (root within the hierarchy, mount point) of the first mount of
    // `fstype` whose super options satisfy `want`.
    let mount = |fstype: &str, want: &dyn Fn(&str) -> bool| {
        mountinfo.lines().find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut r = right.split_whitespace();
            if r.next()? != fstype {
                return None;
            }
            let _source = r.next()?;
            if !want(r.next()?) {
                return None;
            }
            let f: Vec<&str> = left.split_whitespace().collect();
            Some((f.get(3)?.to_string(), f.get(4)?.to_string()))
        })
    };
    let within = |root: &str, mount_point: &str, path: &str| -> Option<PathBuf> {
        let rel = path
            .strip_prefix(root.trim_end_matches('/'))
            .unwrap_or(path);
        let dir = Path::new(mount_point).join(rel.trim_start_matches('/'));
        exists(&dir).then_some(dir)
    };
    if let Some(path) = v1_memory_path(cgroups) {
        let (root, mp) = mount("cgroup", &|opts| opts.split(',').any(|o| o == "memory"))
            .ok_or("the memory controller (cgroup v1) is not mounted")?;
        let own = within(&root, &mp, path).ok_or_else(|| {
            CgroupError::Unavailable(format!(
                "this process's memory cgroup {path} is not under {mp}"
            ))
        })?;
        return Ok(Controller { v2: false, own });
    }
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no memory cgroup: neither a v1 memory hierarchy nor cgroup v2")?;
    let (root, mp) =
        mount("cgroup2", &|_| true).ok_or("cgroup v2 is not mounted and v1 has no memory")?;
    let own = within(&root, &mp, path).ok_or_else(|| {
        CgroupError::Unavailable(format!("this process's cgroup {path} is not under {mp}"))
    })?;
    let controllers = read(&own.join("cgroup.controllers"));
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(CgroupError::Unavailable(format!(
            "cgroup v2 at {} does not offer the memory controller",
            own.display()
        )));
    }
    Ok(Controller { v2: true, own })
}

/// Held by the tests that make or sweep cgroups of this process: making
/// one sweeps what looks stale, which would take another test's fixtures.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        crate::util::lock(&TEST_LOCK)
    }

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n4:memory:/jobs/abc\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 25 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn every_hierarchy_is_swept_where_this_process_is() {
        let dirs = hierarchy_dirs(
            "9:name=systemd:/\n8:pids:/jobs/abc\n4:memory:/jobs/abc\n1:cpu:/\n0::/u\n",
            "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
             33 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
             34 25 0:30 /jobs /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
             35 25 0:31 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n\
             36 25 0:32 / /tmp rw - tmpfs tmpfs rw\n\
             40 25 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
        );
        let want: Vec<(PathBuf, bool)> = [
            ("/sys/fs/cgroup/cpu", false),
            ("/sys/fs/cgroup/memory/jobs/abc", false),
            ("/sys/fs/cgroup/pids/abc", false),
            ("/sys/fs/cgroup/systemd", false),
            ("/sys/fs/cgroup/unified/u", true),
        ]
        .iter()
        .map(|(p, v2)| (PathBuf::from(p), *v2))
        .collect();
        assert_eq!(dirs, want);
    }

    /// What a killed supervisor left beneath its cells' cgroup (a cgroup
    /// per session beneath, a process in it) is killed and removed; a live
    /// supervisor's cgroup and one not named for a pid stay.
    #[test]
    fn cgroups_of_gone_supervisors_are_killed_and_removed() {
        let _serial = serial();
        if !nix::unistd::geteuid().is_root() {
            panic!("making cgroups needs root; run the suite as root");
        }
        let ctl = find_controller().unwrap();
        // Above the kernel's largest pid: never runs.
        let gone = ctl.own.join("cellbox-4194307-0");
        let live = ctl
            .own
            .join(format!("cellbox-{}-sweeptest", std::process::id()));
        let kept = ctl.own.join("cellbox-oneshot-sweeptest");
        for d in [&gone, &live, &kept] {
            let _ = std::fs::create_dir(d);
        }
        let nested = gone.join("session-1");
        std::fs::create_dir(&nested).unwrap();
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let procs = if ctl.v2 { "cgroup.procs" } else { "tasks" };
        std::fs::write(nested.join(procs), child.id().to_string()).unwrap();
        sweep_stale(&ctl.own, ctl.v2);
        let status = child.wait().unwrap();
        assert!(!gone.exists(), "{}", gone.display());
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(live.exists() && kept.exists());
        for d in [&live, &kept] {
            std::fs::remove_dir(d).unwrap();
        }
    }

    #[test]
    fn v1_memory_is_found_where_this_process_is() {
        let c = controller_in(HYBRID_CGROUP, HYBRID_MOUNTS, |_| true, |_| String::new()).unwrap();
        assert_eq!(
            c,
            Controller {
                v2: false,
                own: PathBuf::from("/sys/fs/cgroup/memory/jobs/abc")
            }
        );
    }

    #[test]
    fn v2_needs_the_memory_controller_offered() {
        let cg = "0::/svc/box\n";
        let mounts = "40 25 0:36 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let offered = |p: &Path| {
            if p.ends_with("cgroup.controllers") {
                "cpu io memory pids".to_owned()
            } else {
                "memory pids".to_owned()
            }
        };
        let c = controller_in(cg, mounts, |_| true, offered).unwrap();
        assert_eq!(
            c,
            Controller {
                v2: true,
                own: PathBuf::from("/sys/fs/cgroup/svc/box")
            }
        );
        let e = controller_in(cg, mounts, |_| true, |_| "cpu pids".to_owned()).unwrap_err();
        assert!(matches!(e, CgroupError::Unavailable(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("does not offer the memory controller"),
            "{e}"
        );
        let e = controller_in("", mounts, |_| true, offered).unwrap_err();
        assert!(matches!(e, CgroupError::Unavailable(_)), "{e:?}");
        assert!(e.to_string().contains("no memory cgroup"), "{e}");
    }

    #[test]
    fn one_shot_slots_are_exclusive_kept_and_emptied() {
        let _serial = serial();
        if !nix::unistd::geteuid().is_root() {
            panic!("making a memory cgroup needs root; run the tests as root");
        }
        let a = CellCgroup::slot(64 << 20).unwrap();
        let b = CellCgroup::slot(64 << 20).unwrap();
        assert_ne!(a.path(), b.path());
        assert!(a
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("cellbox-oneshot-"));
        // A process left in a slot is killed when the slot is let go.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(a.path().join("cgroup.procs"), child.id().to_string()).unwrap();
        let dir = a.path().to_path_buf();
        drop(a);
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(dir.exists(), "a slot is kept for the next run");
        drop(b);
    }

    /// The bound holds for a process and its children together, and the
    /// cgroup is gone after the drop. Root only: making cgroups needs it.
    #[test]
    fn processes_beneath_are_held_to_the_limit_together() {
        let _serial = serial();
        if !nix::unistd::geteuid().is_root() {
            panic!("making a memory cgroup needs root; run the tests as root");
        }
        let cg = CellCgroup::create(256 << 20).unwrap();
        let dir = cg.path().to_path_buf();
        let fd = cg.procs_fd();
        // Four children of 100 MiB each, touched: past 256 MiB together,
        // the kernel kills one.
        let out = crate::sandbox::testing::in_child(move || {
            join_fd(fd).map_err(|e| e.to_string())?;
            let mut kids = Vec::new();
            for _ in 0..4 {
                // SAFETY: the child only touches memory and exits.
                match unsafe { nix::unistd::fork() }.map_err(|e| e.to_string())? {
                    nix::unistd::ForkResult::Child => {
                        let v = vec![1u8; 100 << 20];
                        std::thread::sleep(std::time::Duration::from_millis(500));
                        // SAFETY: _exit has no preconditions.
                        unsafe { libc::_exit(i32::from(v[v.len() - 1])) }
                    }
                    nix::unistd::ForkResult::Parent { child } => kids.push(child),
                }
            }
            let mut killed = 0;
            for k in kids {
                if let Ok(nix::sys::wait::WaitStatus::Signaled(..)) =
                    nix::sys::wait::waitpid(k, None)
                {
                    killed += 1;
                }
            }
            Ok(killed.to_string())
        });
        let killed: usize = out.unwrap().parse().unwrap();
        assert!(killed >= 1, "no child was killed past the limit");
        drop(cg);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
