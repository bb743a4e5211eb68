//! A cell's CPU time, as its cgroup counts it, held to its limit.
//!
//! RLIMIT_CPU bounds each process, and each new process starts its count
//! at zero: a chain of children, each forking the next before its limit,
//! would never meet one. The cgroup counts every process the cell has had
//! (`cpuacct.usage` in cgroup v1; `cpu.stat`'s `usage_usec` in v2): the
//! cell's own group, or for a live session's cell its session's, since
//! every process of a live session (its state processes, whatever they
//! started) runs on the account of the cell that thawed it, and none runs
//! between cells (the session is frozen then). The supervisor reads that
//! count while the cell runs and ends the cell once its `cpu_seconds` are
//! used, whatever the parentage of its processes.

use std::time::Duration;

/// How soon after one look the next may come, at least (a cell near its
/// limit is looked at this often).
const MIN_LOOK: Duration = Duration::from_millis(10);

/// How long after one look the next comes, at most (a far limit).
const MAX_LOOK: Duration = Duration::from_secs(60);

/// A cell's CPU time so far, read from a cgroup, and its limit.
pub(crate) struct CpuMeter {
    read: Box<dyn Fn() -> Option<u64> + Send + Sync>,
    start: u64,
    limit_ns: u64,
    /// Processes that may run at once: the count grows at most this many
    /// seconds per second.
    cpus: u64,
    /// Whose processes are counted, for the error.
    whose: &'static str,
}

impl CpuMeter {
    /// A meter of the counter `read` (nanoseconds), from now on, against
    /// `limit_seconds`; `None` when the counter cannot be read, or without
    /// a limit (0: each process's RLIMIT_CPU ends it at once anyway).
    pub(crate) fn new(
        read: Box<dyn Fn() -> Option<u64> + Send + Sync>,
        limit_seconds: u64,
        whose: &'static str,
    ) -> Option<CpuMeter> {
        if limit_seconds == 0 {
            return None;
        }
        let start = read()?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        Some(CpuMeter {
            read,
            start,
            limit_ns: limit_seconds.saturating_mul(1_000_000_000),
            cpus,
            whose,
        })
    }

    /// The CPU time (ns) counted since the meter was made.
    pub(crate) fn used_ns(&self) -> Option<u64> {
        (self.read)().map(|n| n.saturating_sub(self.start))
    }

    /// How long until the limit could be reached at the soonest, with
    /// every CPU busy for the cell (between [`MIN_LOOK`] and
    /// [`MAX_LOOK`]).
    pub(crate) fn next_look(&self) -> Duration {
        let used = self.used_ns().unwrap_or(0);
        let left = self.limit_ns.saturating_sub(used) / self.cpus.max(1);
        Duration::from_nanos(left).clamp(MIN_LOOK, MAX_LOOK)
    }

    /// Why the cell is over its limit, if it is.
    pub(crate) fn over(&self) -> Option<String> {
        let used = self.used_ns()?;
        (used >= self.limit_ns).then(|| {
            format!(
                "{} used {:.2} s of CPU time together, past the cell's limit of {} s (cpu_seconds)",
                self.whose,
                used as f64 / 1e9,
                self.limit_ns / 1_000_000_000
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_meter_counts_from_its_start_and_looks_again_when_the_limit_could_be_reached() {
        let count = Arc::new(AtomicU64::new(5_000_000_000));
        let c = count.clone();
        let m = CpuMeter::new(
            Box::new(move || Some(c.load(Ordering::SeqCst))),
            2,
            "the cell's processes",
        )
        .expect("a meter");
        assert_eq!(m.used_ns(), Some(0));
        assert!(m.over().is_none());
        assert!(m.next_look() >= Duration::from_nanos(2_000_000_000 / m.cpus));
        count.fetch_add(1_999_000_000, Ordering::SeqCst);
        assert!(m.over().is_none());
        assert_eq!(m.next_look(), MIN_LOOK);
        count.fetch_add(2_000_000, Ordering::SeqCst);
        let why = m.over().expect("over");
        assert!(
            why.contains("2.00 s") && why.contains("limit of 2 s"),
            "{why}"
        );
        assert!(CpuMeter::new(Box::new(|| None), 2, "x").is_none());
        assert!(CpuMeter::new(Box::new(|| Some(0)), 0, "x").is_none());
        let far = CpuMeter::new(Box::new(|| Some(0)), u64::MAX, "x").expect("a meter");
        assert_eq!(far.next_look(), MAX_LOOK);
    }
}
