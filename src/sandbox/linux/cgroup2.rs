//! What cgroup v2 asks of the cells' groups beyond v1's.
//!
//! One hierarchy holds every controller, and a cgroup that hands
//! controllers to children holds no processes itself (the "no internal
//! processes" rule; the root cgroup alone is spared). So, beneath the
//! cgroup the supervisor was started in (`/proc/self/cgroup`: a service's
//! `…/cellbox.service`, a container's `/`, a user's delegated subtree):
//!
//! ```text
//! <own>/cellbox-supervisor     the processes that were in <own> (the
//!                              supervisor among them), moved here once
//!                              so that <own> can enable controllers
//! <own>/cellbox-<pid>-<n>      the cells: memory.max for all together
//!   pool                       the warm pools (fork server, zygotes)
//!   s<k>                       a session: memory.max, pids.max
//!     live                     a live session's state processes
//!     c<m>                     a cell: pids.max, cpu.stat, memory.peak,
//!                              its whole process tree
//! ```
//!
//! A tree is ended with `cgroup.kill` (Linux 5.14), which kills every
//! process beneath at once, those forking meanwhile included, and it is
//! empty when `cgroup.events` says `populated 0`. A cgroup namespace root
//! mounted with `nsdelegate` (a container's `/`) takes no limits from
//! inside; none are written to `<own>`, only beneath it.

use super::cgroup::CgroupError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The leaf the processes of the supervisor's own cgroup are moved into.
pub const LEAF: &str = "cellbox-supervisor";
/// Beneath the cells' cgroup: the warm pools' processes.
pub const POOL: &str = "pool";
/// Beneath a session's cgroup: its own processes (a live session's
/// state processes and what their cells fork).
pub const LIVE: &str = "live";

/// The controllers the cells' groups need, and one they use if offered.
const NEEDED: &[&str] = &["memory", "pids"];
const WANTED: &[&str] = &["cpu"];

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(CgroupError::io("read", path))
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(CgroupError::io(format!("write {value} to"), path))
}

fn has(list: &str, name: &str) -> bool {
    list.split_whitespace().any(|c| c == name)
}

/// Hand `dir`'s children the controllers cells need (memory, pids) and
/// cpu where `dir` has it. Fails with the kernel's EBUSY while `dir`
/// holds processes (see [`base`]).
pub fn enable(dir: &Path) -> Result<(), CgroupError> {
    let offered = read(&dir.join("cgroup.controllers"))?;
    let on = read(&dir.join("cgroup.subtree_control"))?;
    for c in NEEDED {
        if !has(&offered, c) {
            return Err(CgroupError::Unavailable(format!(
                "cgroup v2 at {} does not offer the {c} controller (its parent does not \
                 delegate it)",
                dir.display()
            )));
        }
    }
    let add: Vec<String> = NEEDED
        .iter()
        .chain(WANTED)
        .filter(|c| has(&offered, c) && !has(&on, c))
        .map(|c| format!("+{c}"))
        .collect();
    if add.is_empty() {
        return Ok(());
    }
    write(&dir.join("cgroup.subtree_control"), &add.join(" "))
}

/// The cgroup beneath which this process makes the cells' cgroups, given
/// its own cgroup `own`: `own` itself, made able to hand controllers to
/// children. Where `own` holds processes, they are all moved into
/// `own/cellbox-supervisor` first (what a delegated service's manager is
/// expected to do); a process already in that leaf uses its parent.
pub fn base(own: &Path) -> Result<PathBuf, CgroupError> {
    let base = match (own.file_name(), own.parent()) {
        (Some(n), Some(parent)) if n == LEAF => parent.to_path_buf(),
        _ => own.to_path_buf(),
    };
    match enable(&base) {
        Ok(()) => return Ok(base),
        Err(CgroupError::Io { ref source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => return Err(e),
    }
    let leaf = base.join(LEAF);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CgroupError::io("make the cgroup", &leaf)(e)),
    }
    let into = leaf.join("cgroup.procs");
    // A process forked meanwhile lands in `base` too: a few rounds.
    for _ in 0..20 {
        let left = procs(&base);
        if left.is_empty() {
            break;
        }
        for pid in left {
            if let Err(e) = write(&into, &pid.to_string()) {
                // Gone meanwhile.
                if matches!(&e, CgroupError::Io { source, .. }
                    if source.raw_os_error() == Some(libc::ESRCH))
                {
                    continue;
                }
                return Err(CgroupError::Unavailable(format!(
                    "cannot move the processes of {} into {}: {e} (start cellbox in a \
                     cgroup of its own)",
                    base.display(),
                    leaf.display()
                )));
            }
        }
    }
    enable(&base)?;
    Ok(base)
}

/// The processes listed in the cgroup's `cgroup.procs` at `dir`.
pub fn procs(dir: &Path) -> Vec<i32> {
    crate::sandbox::process::read_small(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether any process is left in the cgroup at `dir` or beneath it.
pub fn populated(dir: &Path) -> bool {
    crate::sandbox::process::read_small(dir.join("cgroup.events"))
        .map(|t| keyed(&t, "populated") != Some(0))
        .unwrap_or(false)
}

/// The value of `key` in a flat keyed file (`cpu.stat`, `memory.events`,
/// `pids.events`, `cgroup.events`: lines of "key value").
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Kill every process in the cgroup at `dir` and beneath it
/// (`cgroup.kill`), and wait until none is left, at most `within`.
pub fn kill_tree(dir: &Path, within: Duration) -> Result<(), CgroupError> {
    if !populated(dir) {
        return Ok(());
    }
    let kill = dir.join("cgroup.kill");
    let end = Instant::now() + within;
    let mut pause = Duration::from_micros(200);
    loop {
        write(&kill, "1")?;
        std::thread::sleep(pause);
        if !populated(dir) {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(CgroupError::Busy(format!(
                "processes of {} still there after {within:?}",
                dir.display()
            )));
        }
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_are_read_by_key() {
        let stat = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
        assert_eq!(keyed(stat, "usage_usec"), Some(1234));
        assert_eq!(keyed(stat, "system_usec"), Some(234));
        assert_eq!(keyed(stat, "nr_periods"), None);
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom"), Some(1));
        assert_eq!(keyed(events, "oom_kill"), Some(2));
        assert_eq!(keyed("populated 0\nfrozen 0\n", "populated"), Some(0));
    }
}
