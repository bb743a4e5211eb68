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

/// A reader of a CPU-time counter (ns), `None` when it cannot be read.
pub(crate) type Counter = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// One limit a meter holds a cell to: a counter, where it started counting
/// for this limit, how much it may count, and what to say when it did.
struct Bound {
    read: Counter,
    start: u64,
    limit_ns: u64,
    /// Whose processes are counted, for the error.
    whose: &'static str,
    /// The limit, for the error: "the cell's limit" and its key.
    what: (&'static str, &'static str),
    /// Whether it is the cell's own limit.
    cell: bool,
}

impl Bound {
    fn used_ns(&self) -> Option<u64> {
        (self.read)().map(|n| n.saturating_sub(self.start))
    }

    fn left_ns(&self) -> u64 {
        self.limit_ns.saturating_sub(self.used_ns().unwrap_or(0))
    }

    fn over(&self) -> Option<String> {
        let used = self.used_ns()?;
        (used >= self.limit_ns).then(|| {
            format!(
                "{} used {:.2} s of CPU time together, past {} of {} s ({})",
                self.whose,
                used as f64 / 1e9,
                self.what.0,
                self.limit_ns / 1_000_000_000,
                self.what.1
            )
        })
    }
}

/// A cell's CPU time so far, read from a cgroup, against its own limit
/// and, in a session with a CPU budget, its session's time against that.
pub(crate) struct CpuMeter {
    /// The cell's own limit first.
    bounds: Vec<Bound>,
    /// Processes that may run at once: a count grows at most this many
    /// seconds per second.
    cpus: u64,
}

impl CpuMeter {
    /// A meter of the counter `read` (nanoseconds), from now on, against
    /// `limit_seconds`; `None` when the counter cannot be read, or without
    /// a limit (0: each process's RLIMIT_CPU ends it at once anyway).
    pub(crate) fn new(read: Counter, limit_seconds: u64, whose: &'static str) -> Option<CpuMeter> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let mut m = CpuMeter {
            bounds: Vec::new(),
            cpus,
        };
        if limit_seconds > 0 {
            let start = read()?;
            m.bounds.push(Bound {
                read,
                start,
                limit_ns: limit_seconds.saturating_mul(1_000_000_000),
                whose,
                what: ("the cell's limit", "cpu_seconds"),
                cell: true,
            });
        }
        (!m.bounds.is_empty()).then_some(m)
    }

    /// `meter` (or a meter of none yet) also holding the session's CPU
    /// time, `used` (ns since the session began), to its budget of
    /// `budget_seconds` (0: none; then `meter` as it was).
    pub(crate) fn with_session(
        meter: Option<CpuMeter>,
        used: Counter,
        budget_seconds: u64,
    ) -> Option<CpuMeter> {
        if budget_seconds == 0 {
            return meter;
        }
        let mut m = meter.unwrap_or_else(|| CpuMeter {
            bounds: Vec::new(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        });
        m.bounds.push(Bound {
            read: used,
            start: 0,
            limit_ns: budget_seconds.saturating_mul(1_000_000_000),
            whose: "the session's processes",
            what: ("the session's budget", "session_cpu_seconds"),
            cell: false,
        });
        Some(m)
    }

    /// The CPU time (ns) counted for the cell's own limit since the meter
    /// was made (`None` when the meter holds only the session's budget).
    pub(crate) fn used_ns(&self) -> Option<u64> {
        self.bounds.iter().find(|b| b.cell).and_then(Bound::used_ns)
    }

    /// How long until a limit could be reached at the soonest, with every
    /// CPU busy for the cell (between [`MIN_LOOK`] and [`MAX_LOOK`]).
    pub(crate) fn next_look(&self) -> Duration {
        let left = self
            .bounds
            .iter()
            .map(Bound::left_ns)
            .min()
            .unwrap_or(u64::MAX)
            / self.cpus.max(1);
        Duration::from_nanos(left).clamp(MIN_LOOK, MAX_LOOK)
    }

    /// Why the cell is over a limit, if it is.
    pub(crate) fn over(&self) -> Option<String> {
        self.bounds.iter().find_map(Bound::over)
    }
}

/// Why a session whose CPU time so far is `used_ns` may start no cell
/// under a budget of `budget_seconds` (0: none), if it may not.
pub(crate) fn session_spent(used_ns: u64, budget_seconds: u64) -> Option<String> {
    (budget_seconds > 0 && used_ns >= budget_seconds.saturating_mul(1_000_000_000)).then(|| {
        format!(
            "the session's processes used {:.2} s of CPU time together, its budget of {} s \
             (session_cpu_seconds) is spent: the session runs no more cells",
            used_ns as f64 / 1e9,
            budget_seconds
        )
    })
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

    #[test]
    fn a_session_budget_is_held_beside_the_cells_limit_and_named() {
        let session = Arc::new(AtomicU64::new(9_000_000_000));
        let cell = Arc::new(AtomicU64::new(0));
        let (s, c) = (session.clone(), cell.clone());
        let m = CpuMeter::with_session(
            CpuMeter::new(
                Box::new(move || Some(c.load(Ordering::SeqCst))),
                5,
                "the cell's processes",
            ),
            Box::new(move || Some(s.load(Ordering::SeqCst))),
            10,
        )
        .expect("a meter");
        assert!(m.over().is_none());
        // The session's second left comes before the cell's five.
        assert!(m.next_look() <= Duration::from_secs(1));
        cell.fetch_add(1_000_000_000, Ordering::SeqCst);
        session.fetch_add(1_000_000_000, Ordering::SeqCst);
        assert_eq!(m.used_ns(), Some(1_000_000_000));
        let why = m.over().expect("over the session's budget");
        assert!(
            why.contains("session's budget of 10 s (session_cpu_seconds)"),
            "{why}"
        );
        // The cell's own limit is named when it is the one passed.
        cell.fetch_add(4_000_000_000, Ordering::SeqCst);
        assert!(m.over().expect("over").contains("(cpu_seconds)"));
        // Without a budget the meter is the cell's; with one only, it
        // counts nothing of the cell's.
        assert!(CpuMeter::with_session(None, Box::new(|| Some(0)), 0).is_none());
        let only = CpuMeter::with_session(None, Box::new(|| Some(0)), 3).expect("a meter");
        assert_eq!(only.used_ns(), None);
        assert!(session_spent(2_999_999_999, 3).is_none());
        assert!(session_spent(3_000_000_000, 3)
            .expect("spent")
            .contains("session_cpu_seconds"));
        assert!(session_spent(u64::MAX, 0).is_none());
    }
}
