//! One program run as a one-shot cell without a runtime: the fast path of
//! `cellbox exec` (and of shell cells run once from the CLI).
//!
//! The library path spawns a worker (our binary again), sends it the plan
//! in a `setup` frame and supervises it from tokio. Here the calling
//! process, still single-threaded, builds the same plan, clones the cell
//! itself ([`crate::sandbox::oneshot`]) and supervises it with `poll(2)`:
//! the same wall-clock deadline, output caps and forwarding, the same kill
//! of the whole process group, reap with rusage, and the same
//! [`CellResult`], classified by the same code.

use super::cell::{classify, Outcome};
use super::events::EventSink;
use super::output::Capture;
use super::result::{CellResult, ErrorKind, RunInfo};
use super::session::SessionConfig;
use super::Limits;
use crate::sandbox::linux::cgroup::CgroupError;
use crate::sandbox::oneshot::{self, Cell, Report, SpawnError};
use crate::sandbox::{process, SandboxPlan};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use serde_json::json;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct OneShot {
    /// The program and its arguments (the program is resolved like `exec`
    /// resolves it).
    pub argv: Vec<String>,
    /// Copy the cell's stdout/stderr to ours as it arrives.
    pub forward: super::Forward,
    /// Ctrl-C (SIGINT to this process) kills the cell, which then ends
    /// with status `killed` and a result as usual. SIGINT is blocked in the
    /// calling thread while the cell runs (taken through a signalfd), after
    /// the cell has its own signal mask; for a command line.
    pub interruptible: bool,
}

impl OneShot {
    /// `argv` as `cellbox exec` runs it.
    pub fn exec(argv: Vec<String>, forward_output: bool) -> OneShot {
        OneShot {
            argv,
            forward: if forward_output {
                super::Forward::All
            } else {
                super::Forward::No
            },
            interruptible: false,
        }
    }

    /// A shell script, as a shell cell runs it (`/bin/sh -c code`).
    pub fn shell(code: &str) -> OneShot {
        OneShot {
            argv: vec!["/bin/sh".into(), "-c".into(), code.to_owned()],
            forward: super::Forward::No,
            interruptible: false,
        }
    }

    /// A Rhai cell (run by [`super::oneshot_rhai`]: the cell runs the
    /// engine itself, it executes no program).
    pub fn rhai() -> OneShot {
        OneShot {
            argv: Vec::new(),
            forward: super::Forward::No,
            interruptible: false,
        }
    }

    /// The same, killed by Ctrl-C (see [`OneShot::interruptible`]).
    pub fn interruptible(mut self) -> OneShot {
        self.interruptible = true;
        self
    }

    /// The same, copying its output to ours as it arrives (see
    /// [`super::Forward`]).
    pub fn forwarding(mut self, forward: super::Forward) -> OneShot {
        self.forward = forward;
        self
    }
}

/// Run one shell-language cell in a fresh session, as
/// [`super::Supervisor::exec`] does, but in this process: it must have a
/// single thread (no runtime started yet). The result has the same shape,
/// statuses and messages as the library path's.
pub fn run(cell: OneShot, config: SessionConfig, events: &EventSink) -> CellResult {
    // The scratch directory is made in the cell's new root and goes with
    // it; a cell without a mount namespace gets a host directory from
    // `spawn` instead, removed when it has ended.
    let scratch = std::env::temp_dir().join(format!("cellbox-{:016x}", random_u64()));
    let session_id = super::cell::new_run_id();
    let started = Instant::now();
    let run = RunInfo::root();
    let mut result = CellResult::new("shell", run.clone());
    result.execution_count = 1;
    events.record(
        "cell_start",
        &run,
        json!({"language": "shell", "session_id": session_id}),
    );
    if let Some(problem) = super::session::argv_error(&cell.argv) {
        result.fail_with(ErrorKind::UsageError, problem);
    } else {
        run_planned(&cell, &config, scratch, started, &mut result);
    }
    finish(&mut result, 0, started, events, &run);
    result
}

/// A one-shot cell is over: its wall time and `calls` in its usage, and
/// its `cell_end` event.
pub(crate) fn finish(
    result: &mut CellResult,
    calls: u32,
    started: Instant,
    events: &EventSink,
    run: &RunInfo,
) {
    result.usage.wall_ms = started.elapsed().as_millis() as u64;
    result.usage.calls = calls;
    events.record(
        "cell_end",
        run,
        json!({"status": result.status, "wall_ms": result.usage.wall_ms,
               "error": result.error.as_ref().map(|e| &e.message)}),
    );
}

fn run_planned(
    cell: &OneShot,
    config: &SessionConfig,
    scratch: std::path::PathBuf,
    started: Instant,
    result: &mut CellResult,
) {
    match plan_for(&cell.argv, config, scratch) {
        Ok((plan, argv, limits)) => {
            let limits = &limits;
            let deadline = started + limits.timeout();
            // Held until the cell has ended; dropping it kills what is left.
            let cgroup = match cell_cgroup(plan.layers.cgroup, limits.rlimits.memory_bytes) {
                Ok(c) => c,
                Err(e) => {
                    result.fail_with(
                        ErrorKind::SandboxError,
                        format!("the cgroup layer could not be applied: {e}"),
                    );
                    return;
                }
            };
            let layer =
                crate::sandbox::linux::cgroup::layer_report(cgroup.as_ref(), plan.layers.cgroup);
            match oneshot::spawn(&plan, &argv, cgroup.as_ref().map(|c| c.procs_fd())) {
                Ok(c) => {
                    supervise(c, limits, cell, deadline, result, Control::Report);
                    if let Some(report) = result.sandbox.as_mut() {
                        report.layers.push(layer);
                    }
                }
                Err(SpawnError::Sandbox(e)) => result.fail_with(
                    ErrorKind::SandboxError,
                    format!(
                        "the {} layer could not be applied: {}",
                        e.layer,
                        e.message()
                    ),
                ),
                Err(SpawnError::Spawn(e)) => {
                    result.fail_with(ErrorKind::SpawnError, e);
                }
            }
        }
        Err(e) => result.fail_with(ErrorKind::SandboxError, e),
    }
}

/// A memory cgroup of `bytes` for the cell to start in, so that its
/// processes together stay within the cell's memory limit: each one's
/// RLIMIT_AS does not bound their sum. As root, one of the kept one-shot
/// slots; without root, a group of its own in a cgroup v2 subtree delegated
/// to this user, as sessions' are (it is tried: the kernel says). Where
/// neither can be made, each process is still bounded on its own (an error
/// when the profile requires the layer).
pub(super) fn cell_cgroup(
    mode: crate::profiles::LayerMode,
    bytes: u64,
) -> Result<Option<crate::sandbox::linux::cgroup::CellCgroup>, CgroupError> {
    use crate::profiles::LayerMode;
    use crate::sandbox::linux::cgroup::CellCgroup;
    let made = match mode {
        LayerMode::Off => return Ok(None),
        _ if nix::unistd::geteuid().is_root() => CellCgroup::slot(bytes),
        _ => CellCgroup::create(bytes),
    };
    match (made, mode) {
        (Ok(c), _) => Ok(Some(c)),
        (Err(e), LayerMode::Required) => Err(e),
        (Err(e), _) => {
            // Said in the result's `cgroup` layer.
            tracing::debug!("the cell's processes are not bounded together: {e}");
            Ok(None)
        }
    }
}

/// The plan, the resolved argv and the cell's limits (the session's under
/// the profile's ceiling), as the library path builds them.
fn plan_for(
    argv: &[String],
    config: &SessionConfig,
    scratch: std::path::PathBuf,
) -> Result<(SandboxPlan, Vec<String>, Limits), String> {
    let name = config.profile.as_deref().unwrap_or("shell");
    let profile = crate::profiles::Profile::load(name).map_err(|e| e.to_string())?;
    let limits = config.limits.under_profile(&profile.limits);
    let mut plan = SandboxPlan::new(&profile, scratch, limits.rlimits);
    plan.scratch_in_cell = true;
    let prog = argv.first().ok_or("exec needs a program to run")?;
    let resolved = super::resolve_program(prog)?;
    plan.exec.push(resolved.clone());
    let mut argv = argv.to_vec();
    argv[0] = resolved.to_string_lossy().into_owned();
    Ok((plan, argv, limits))
}

/// A random number for a name no one else picks (not a secret).
pub(super) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// SIGINT taken through a signalfd while a cell runs; unblocked again (a
/// pending one consumed first) when dropped.
struct Interrupt {
    fd: nix::sys::signalfd::SignalFd,
    mask: nix::sys::signal::SigSet,
}

impl Interrupt {
    fn take() -> Option<Interrupt> {
        use nix::sys::signal::{SigSet, Signal};
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGINT);
        // Already blocked by the caller: not ours to take.
        if SigSet::thread_get_mask().ok()?.contains(Signal::SIGINT) {
            return None;
        }
        mask.thread_block().ok()?;
        match SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
            Ok(fd) => Some(Interrupt { fd, mask }),
            Err(_) => {
                let _ = mask.thread_unblock();
                None
            }
        }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        while let Ok(Some(_)) = self.fd.read_signal() {}
        let _ = self.mask.thread_unblock();
    }
}

/// One output stream of the cell: captured (capped) and maybe forwarded.
struct Stream {
    fd: Option<std::fs::File>,
    capture: Capture,
    /// What to copy, and whether to stdout (else stderr).
    forward: (super::Forward, bool),
    /// A person's terminal (`Forward::Head`) is shown control characters.
    escaper: crate::terminal::Escaper,
}

impl Stream {
    fn new(fd: OwnedFd, cap: usize, forward: (super::Forward, bool)) -> Stream {
        let open = set_nonblocking(&fd).is_ok();
        Stream {
            fd: open.then(|| std::fs::File::from(fd)),
            capture: Capture::new(cap),
            forward,
            escaper: crate::terminal::Escaper::default(),
        }
    }

    /// Read what is there; close on EOF or error.
    fn pump(&mut self, buf: &mut [u8]) {
        let Some(f) = self.fd.as_mut() else { return };
        loop {
            match f.read(buf) {
                Ok(0) => {
                    self.fd = None;
                    return;
                }
                Ok(n) => {
                    let chunk = &buf[..n];
                    let to_head = self.capture.push(chunk);
                    let shown = self.forward.0.shown(chunk, to_head);
                    let escaped;
                    let shown = if self.forward.0 == super::Forward::Head {
                        escaped = self.escaper.push(shown);
                        &escaped[..]
                    } else {
                        shown
                    };
                    if !shown.is_empty() {
                        if self.forward.1 {
                            let mut out = std::io::stdout().lock();
                            let _ = out.write_all(shown);
                            let _ = out.flush();
                        } else {
                            let _ = std::io::stderr().lock().write_all(shown);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.fd = None;
                    return;
                }
            }
        }
    }
}

fn set_nonblocking(fd: &impl AsFd) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(|_| ())
}

/// Milliseconds until `until`, rounded up, for poll.
pub(super) fn poll_timeout(until: Instant) -> PollTimeout {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// The largest report the cell may send.
const MAX_REPORT_BYTES: usize = 1 << 20;
/// How long output may keep arriving after the cell is gone (stragglers
/// outside its PID namespace), as on the library path.
const DRAIN_WITHIN: Duration = Duration::from_millis(500);
/// How long a killed cell may take to be gone.
const KILL_WITHIN: Duration = Duration::from_secs(10);

/// What the cell's fd 3 carries.
pub(super) enum Control {
    /// One JSON [`Report`], then EOF when it executes its program.
    Report,
    /// The worker protocol, spoken with a cell that runs its code in its
    /// own process (see [`super::oneshot_rhai`]).
    Protocol(Box<super::oneshot_rhai::Talk>),
}

/// How long a cell that said `done` may take to exit by itself (as on the
/// library path).
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Supervise a started cell to its end and fill in `result`. A cell that
/// speaks the protocol ends with its `done`, if it sent one.
pub(super) fn supervise(
    cell: Cell,
    limits: &Limits,
    how: &OneShot,
    deadline: Instant,
    result: &mut CellResult,
    mut mode: Control,
) -> Option<Box<crate::protocol::Done>> {
    let forward = how.forward;
    // Blocked only now: the cell (cloned before) keeps its own mask.
    let sigint = how.interruptible.then(Interrupt::take).flatten();
    // `_scratch` (if any) is removed when this returns, after the reap.
    let Cell {
        pid,
        pidfd,
        stdout,
        stderr,
        control,
        scratch: _scratch,
    } = cell;
    let cap = limits.max_output_bytes;
    let mut out = Stream::new(stdout, cap, (forward, true));
    let mut err = Stream::new(stderr, cap, (forward, false));
    let mut control = Some(control).filter(|c| c.set_nonblocking(true).is_ok());
    let mut report = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut exited = false;
    let mut timed_out = false;
    let mut interrupted = false;
    // A protocol cell's conversation ended (with its `done`, or badly).
    let mut finished: Option<Outcome> = None;
    while !exited && !interrupted && finished.is_none() {
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        let mut fds = vec![PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let mut which = Vec::new();
        if let Some(f) = &out.fd {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            which.push(0);
        }
        if let Some(f) = &err.fd {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            which.push(1);
        }
        if let Some(c) = &control {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            which.push(2);
        }
        if let Some(s) = &sigint {
            fds.push(PollFd::new(s.fd.as_fd(), PollFlags::POLLIN));
            which.push(3);
        }
        match nix::poll::poll(&mut fds, poll_timeout(deadline)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                // Should not happen; do not spin: treat as the deadline.
                timed_out = true;
                break;
            }
        }
        let ready = |i: usize| fds[i].any().unwrap_or(true);
        exited = ready(0);
        let streams: Vec<usize> = which
            .iter()
            .enumerate()
            .filter(|(i, _)| ready(i + 1))
            .map(|(_, w)| *w)
            .collect();
        drop(fds);
        for w in streams {
            match w {
                0 => out.pump(&mut buf),
                1 => err.pump(&mut buf),
                2 => match &mut mode {
                    Control::Report => read_report(&mut control, &mut report, &mut buf),
                    Control::Protocol(talk) => {
                        if finished.is_none() {
                            finished = talk.pump(&mut control, &mut buf, deadline);
                        }
                    }
                },
                _ => interrupted = true,
            }
        }
    }
    if matches!(finished, Some(Outcome::Done(_))) && !exited {
        // It said `done`: it exits by itself, within a grace.
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let until = Instant::now() + EXIT_GRACE;
        while Instant::now() < until {
            match nix::poll::poll(&mut fds, poll_timeout(until)) {
                Ok(n) if n > 0 => break,
                Err(nix::errno::Errno::EINTR) | Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    if timed_out || interrupted || finished.is_some() {
        let _ = process::kill_group(pid);
        let _ = process::pidfd_kill(pidfd.as_fd());
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let until = Instant::now() + KILL_WITHIN;
        while Instant::now() < until {
            match nix::poll::poll(&mut fds, poll_timeout(until)) {
                Ok(n) if n > 0 => break,
                Err(nix::errno::Errno::EINTR) | Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    // The cell is gone (a zombie until reaped, so its pid and process group
    // id stay ours): take the rest of its report, then anything it left in
    // its group dies too.
    match &mut mode {
        Control::Report => read_report(&mut control, &mut report, &mut buf),
        Control::Protocol(talk) if finished.is_none() && !timed_out && !interrupted => {
            finished = talk.after_exit(&mut control, &mut buf);
        }
        Control::Protocol(_) => {}
    }
    let _ = process::kill_group(pid);
    let reaped = process::reap(pid);
    let until = Instant::now() + DRAIN_WITHIN;
    while out.fd.is_some() || err.fd.is_some() {
        out.pump(&mut buf);
        err.pump(&mut buf);
        let mut fds = Vec::new();
        if let Some(f) = &out.fd {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
        }
        if let Some(f) = &err.fd {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
        }
        if fds.is_empty() || Instant::now() >= until {
            break;
        }
        match nix::poll::poll(&mut fds, poll_timeout(until)) {
            Ok(0) => break,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }

    drop(sigint);
    if let Control::Protocol(talk) = mode {
        let outcome = if interrupted {
            Outcome::interrupted()
        } else if timed_out {
            Outcome::Timeout
        } else {
            finished.unwrap_or(Outcome::Exited)
        };
        let outcome = talk.end(outcome, result);
        result.record_end(out.capture, err.capture, reaped.as_ref().ok());
        return classify(limits, false, result, outcome);
    }
    let outcome = if interrupted {
        Outcome::interrupted()
    } else if timed_out {
        Outcome::Timeout
    } else {
        match parse_report(&report) {
            Ok(Some(Report::Ready(r))) => {
                result.sandbox = Some(r);
                Outcome::Exited
            }
            Ok(Some(Report::SandboxError(f))) => Outcome::sandbox_failure(&f),
            Ok(None) => Outcome::Exited,
            Err(e) => Outcome::Fatal(
                ErrorKind::ProtocolError,
                format!("the cell sent a bad report: {e}"),
            ),
        }
    };
    if timed_out || interrupted {
        // A report that arrived before the end still says what the
        // cell was running under.
        if let Ok(Some(Report::Ready(r))) = parse_report(&report) {
            result.sandbox = Some(r);
        }
    }
    result.record_end(out.capture, err.capture, reaped.as_ref().ok());
    // A program: it says nothing of how it ended but its exit.
    classify(limits, true, result, outcome)
}

/// Read what the control socket has; drop it at EOF.
fn read_report(
    control: &mut Option<std::os::unix::net::UnixStream>,
    report: &mut Vec<u8>,
    buf: &mut [u8],
) {
    let Some(c) = control.as_mut() else { return };
    loop {
        match c.read(buf) {
            Ok(0) => {
                *control = None;
                return;
            }
            Ok(n) => {
                if report.len() + n > MAX_REPORT_BYTES {
                    *control = None;
                    return;
                }
                report.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => {
                *control = None;
                return;
            }
        }
    }
}

fn parse_report(bytes: &[u8]) -> Result<Option<Report>, serde_json::Error> {
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(bytes).map(Some)
}
