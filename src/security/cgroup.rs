//! Per-run cgroups (v2) for the survivor check.
//!
//! Every process the harness starts for a run joins a fresh cgroup before it
//! execs anything (a tiny `sh` wrapper writes its own pid to `cgroup.procs`
//! and then execs the real program), so every descendant — including a daemon
//! that double-forked and called `setsid` — stays in it unless it can write
//! to cgroupfs. After the run, a non-empty `cgroup.procs` is a survivor that
//! can be named exactly, and `cgroup.kill` removes it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The suite's own cgroup, parent of the per-run ones.
#[derive(Debug)]
pub(crate) struct CgroupRoot {
    path: PathBuf,
}

/// One run's cgroup; killed and removed on drop.
#[derive(Debug)]
pub(crate) struct RunCgroup {
    path: PathBuf,
}

fn cgroup2_dir_of_self() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("failed to read /proc/self/mountinfo: {e}"))?;
    let (root, mount_point) = mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let f: Vec<&str> = left.split_whitespace().collect();
            Some((f.get(3)?.to_string(), f.get(4)?.to_string()))
        })
        .ok_or("no cgroup2 filesystem is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("failed to read /proc/self/cgroup: {e}"))?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process has no cgroup v2 membership")?;
    let rel = if root == "/" {
        rel
    } else {
        rel.strip_prefix(root.as_str())
            .ok_or_else(|| format!("own cgroup {rel} is outside the mounted root {root}"))?
    };
    Ok(Path::new(&mount_point).join(rel.trim_start_matches('/')))
}

impl CgroupRoot {
    /// Create `cbx-security-<tag>` below the harness's own cgroup.
    pub(crate) fn create(tag: &str) -> Result<CgroupRoot, String> {
        let parent = cgroup2_dir_of_self()?;
        let path = parent.join(format!("cbx-security-{tag}"));
        std::fs::create_dir(&path)
            .map_err(|e| format!("failed to create cgroup {}: {e}", path.display()))?;
        let root = CgroupRoot { path };
        if !root.path.join("cgroup.kill").exists() {
            return Err("cgroup.kill is missing (kernel older than 5.14)".into());
        }
        Ok(root)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn child(&self, name: &str) -> Result<RunCgroup, String> {
        let path = self.path.join(name);
        std::fs::create_dir(&path)
            .map_err(|e| format!("failed to create cgroup {}: {e}", path.display()))?;
        Ok(RunCgroup { path })
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        remove_when_empty(&self.path);
    }
}

fn remove_when_empty(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if std::fs::remove_dir(path).is_ok() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl RunCgroup {
    pub(crate) fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The pids currently in the cgroup.
    pub(crate) fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs_file())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Wait up to `grace` for the cgroup to empty by itself; return who is
    /// still there.
    pub(crate) fn wait_empty(&self, grace: Duration) -> Vec<i32> {
        let deadline = Instant::now() + grace;
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() >= deadline {
                return pids;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL everything in the cgroup and wait for it to empty.
    pub(crate) fn kill_all(&self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let _ = self.wait_empty(Duration::from_secs(2));
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.pids().is_empty() {
            self.kill_all();
        }
        remove_when_empty(&self.path);
    }
}
