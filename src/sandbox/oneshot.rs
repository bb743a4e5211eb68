//! A one-shot cell: the calling process (the CLI, still single-threaded,
//! before any runtime exists) clones the cell straight into its namespaces
//! and stays on the host side as its supervisor. No worker binary is
//! executed and no setup frame is sent: the child has the plan in memory.
//!
//! ```text
//!  caller (host)             ──clone(CLONE_NEW* | CLONE_VM | CLONE_VFORK)──▶  cell (PID 1)
//!   suspended until the cell                        writes its own uid/gid maps,
//!   executes its program                            hygiene, new root, rlimits,
//!   reads the report from fd 3 (EOF at exec)        ids, Landlock, seccomp;
//!   pumps stdout/stderr, deadline on a pidfd        report on fd 3;
//!   kills the group, reaps with rusage              execve the program
//! ```
//!
//! The cell shares the caller's memory until it executes its program (as
//! after `vfork`, on a stack of its own): nothing of the caller's address
//! space is copied, and no copy is torn down at exec. It maps its own ids
//! into its user namespace (as root the caller clones with the cell's ids as
//! effective ids, so they are the namespace creator's), so it waits for
//! nothing. Where that is refused (a user namespace made by an unprivileged
//! id may be forbidden, or left without capabilities), or with
//! `CELLBOX_CLONE=parent-maps`, the caller clones the usual way: a
//! copy-on-write child that waits for "go" on fd 3 while the caller writes
//! its maps.
//!
//! The cell applies exactly the layers of [`crate::sandbox::enter`], in the
//! same order and with the same code; the only difference is who clones:
//! here the caller is the host-side parent, so there is no intermediate
//! worker process mirroring the cell's exit. It does not rewrite its
//! environment (that memory is the caller's): the program is executed with
//! the cell's fixed environment instead.
//!
//! The child's fds: 0 is `/dev/null`, 1 and 2 are the output pipes, 3 is
//! its end of a socket pair (close-on-exec): it may receive "go" there, and
//! it sends one [`Report`] before it executes the program.

use super::linux::jail::{self, Jail, Start};
use super::linux::{self, namespaces};
use super::SandboxFailure;
use super::{Layer, SandboxError, SandboxPlan, SandboxReport};
use crate::exit::Exit;
use crate::profiles::LayerMode;
use crate::protocol::{encode_frame, FromWorker, Ready, DEFAULT_MAX_FRAME_BYTES};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Exit code of a cell whose sandbox could not be applied (as a worker's).
const EXIT_SANDBOX: i32 = Exit::Sandbox.raw();
/// Exit code when the program could not be executed (as a worker's).
const EXIT_EXEC: i32 = Exit::NotExecutable.raw();
/// Exit code of a self-mapped child that could not write its maps; seen
/// only by the parent, which then clones the other way.
const EXIT_NO_MAPS: i32 = Exit::NoMaps.raw();

/// A started one-shot cell, seen from the caller. The caller must reap
/// `pid` (it is our child) whatever happens.
#[derive(Debug)]
pub struct Cell {
    pub pid: i32,
    /// Readable once the cell has exited.
    pub pidfd: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Our end of the cell's fd 3: its report, then EOF when it executes
    /// the program (or exits).
    pub control: UnixStream,
    /// A host scratch directory made for a plan whose scratch was to be
    /// made in the cell, when the cell runs without namespaces; removed when dropped,
    /// so keep it until the cell is reaped.
    pub scratch: Option<super::tree::OwnedTree>,
}

/// The one message a cell sends on fd 3 before it executes its program
/// (JSON, externally tagged: `{"ready": {...}}`, `{"sandbox_error": {...}}`).
/// Not the worker protocol's `ready`/`sandbox_error`: this channel is
/// private to one binary, and its plain shape is cheaper to read.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Report {
    /// Every layer is in place; the program is executed next.
    Ready(SandboxReport),
    /// A layer could not be applied; the cell exits.
    SandboxError(SandboxFailure),
}

/// Why no cell was started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// A layer that is decided before the clone failed (the filesystem view,
    /// required namespaces).
    #[error(transparent)]
    Sandbox(SandboxError),
    /// Pipes, sockets or the process itself.
    #[error("{0}")]
    Spawn(String),
}

/// The parent's decision about namespaces, carried into the child.
enum Namespaces {
    /// Cloned into them sharing the parent's memory; the child writes its
    /// own maps ([`namespaces::clone_vfork_mapped`]), or with `refused`
    /// acts as if the kernel had refused them.
    SelfMapped {
        names: Vec<&'static str>,
        refused: bool,
    },
    /// Cloned into them; the child must wait for "go".
    Cloned(Vec<&'static str>),
    /// Not used: the report line to push (mode, why).
    Without(LayerMode, String),
}

/// What a one-shot cell runs once its sandbox is in place.
enum Program<'a> {
    /// Execute this program (its path listed in `plan.exec`); the report is
    /// one JSON [`Report`] on fd 3, then EOF at exec.
    Exec(&'a [String]),
    /// Run this function in the cell itself, handing it fd 3; the report is
    /// a protocol frame (`ready` or `sandbox_error`) on fd 3, which the
    /// function then goes on speaking the worker protocol on. Its return is
    /// the cell's exit code.
    InProcess {
        run: &'a mut dyn FnMut(UnixStream) -> i32,
        /// Called first in the cell, while the parent writes its id maps.
        prepare: Option<fn()>,
    },
}

/// Start `argv` (its program an absolute path listed in `plan.exec`) as a
/// one-shot cell under `plan`. Call only while the process has one thread.
///
/// With `cgroup` (an open `cgroup.procs`, see [`linux::cgroup`]), the cell
/// joins that cgroup before anything else, so all its processes start there.
pub fn spawn(
    plan: &SandboxPlan,
    argv: &[String],
    cgroup: Option<RawFd>,
) -> Result<Cell, SpawnError> {
    spawn_program(plan, Program::Exec(argv), cgroup)
}

/// Start a one-shot cell under `plan` that runs `run` in its own process
/// (a copy of this one, made by a plain clone into the namespaces, not
/// sharing our memory) once every layer is in place, instead of executing a
/// program. The cell reports on fd 3 in protocol frames (`ready`, or
/// `sandbox_error` and exit), then `run` gets fd 3 and its return is the
/// cell's exit code (stdout and stderr are flushed first). `prepare`, if
/// any, is called in the cell first, while this process writes its id maps
/// (trusted work that `run` would otherwise do first, e.g. building an
/// interpreter). Call only while the process has one thread.
pub fn spawn_in_process(
    plan: &SandboxPlan,
    cgroup: Option<RawFd>,
    prepare: Option<fn()>,
    run: &mut dyn FnMut(UnixStream) -> i32,
) -> Result<Cell, SpawnError> {
    spawn_program(plan, Program::InProcess { run, prepare }, cgroup)
}

fn spawn_program(
    plan: &SandboxPlan,
    mut program: Program<'_>,
    cgroup: Option<RawFd>,
) -> Result<Cell, SpawnError> {
    let threads = linux::sys::thread_count()
        .map_err(|e| SpawnError::Spawn(format!("failed to count threads: {e}")))?;
    if threads != 1 {
        return Err(SpawnError::Spawn(format!(
            "a one-shot cell must be started by a single-threaded process, this one has {threads} threads"
        )));
    }
    let ids = linux::host_ids(plan);
    let view = linux::resolve_view(plan).map_err(SpawnError::Sandbox)?;
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| SpawnError::Spawn(format!("failed to create an output pipe: {e}")))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| SpawnError::Spawn(format!("failed to open /dev/null: {e}")))?;
    let plain_pair = || {
        UnixStream::pair()
            .map_err(|e| SpawnError::Spawn(format!("failed to create the control socket: {e}")))
    };

    // Namespaces, the fast way: a child sharing our memory that maps itself.
    let way = clone_way();
    // A cell that runs in its own copy of this process cannot share our
    // memory: it takes the usual way.
    let shares_memory = matches!(program, Program::Exec(_));
    // Subordinate ids are mapped only by the setuid helpers, which this
    // process runs: the child cannot map itself.
    if plan.layers.namespaces != LayerMode::Off
        && way != CloneWay::ParentMaps
        && shares_memory
        && ids.sub.is_none()
    {
        if ids.root && !plan.scratch_in_cell {
            // The child is not root on the host and cannot hand the scratch
            // directory over itself.
            linux::hygiene::hand_over(&plan.scratch, ids.uid, ids.gid)
                .map_err(|e| SpawnError::Sandbox(SandboxError::new(Layer::Hygiene, e)))?;
        }
        let (parent_end, child_end) = plain_pair()?;
        let fds = [
            null.as_fd(),
            out_w.as_fd(),
            err_w.as_fd(),
            child_end.as_fd(),
        ];
        let cloned = namespaces::clone_vfork_mapped(ids, &mut |names| {
            let ns = Namespaces::SelfMapped {
                names,
                refused: way == CloneWay::SelfMapsRefused,
            };
            cell_main(plan, ids, &view, ns, fds, &mut program, cgroup)
        });
        drop(child_end);
        match cloned {
            Ok(pid) => {
                if !gave_up_mapping(pid, &parent_end) {
                    drop((out_w, err_w, null));
                    return watch(pid, out_r, err_r, parent_end, None);
                }
            }
            // No child was made: go on the usual way.
            Err(e) if e.before_clone() => {}
            Err(e) => {
                return Err(SpawnError::Sandbox(SandboxError::new(
                    Layer::Namespaces,
                    e.to_string(),
                )))
            }
        }
        // Here the usual way is one that also works where a user namespace
        // made by an unprivileged id is refused or left without
        // capabilities (as root: the parent writes the maps).
    }

    // Namespaces: cloned here, so that this process is the cell's parent.
    let without = if plan.layers.namespaces == LayerMode::Off {
        Namespaces::Without(LayerMode::Off, "off in this profile".into())
    } else {
        match namespaces::clone_split(ids) {
            Ok(namespaces::Cloned::Parent { pid, sync, user_ns }) => {
                // A failure here reaches the child as an error message on
                // the sync socket; it reports it and exits.
                let _ = namespaces::release(pid, &sync, user_ns, ids);
                drop((out_w, err_w, null));
                return watch(pid, out_r, err_r, sync, None);
            }
            Ok(namespaces::Cloned::Child { names, sync }) => cell_main(
                plan,
                ids,
                &view,
                Namespaces::Cloned(names),
                [null.as_fd(), out_w.as_fd(), err_w.as_fd(), sync.as_fd()],
                &mut program,
                cgroup,
            ),
            Err(e) if e.before_clone() && plan.layers.namespaces == LayerMode::BestEffort => {
                Namespaces::Without(LayerMode::BestEffort, e.to_string())
            }
            Err(e) => {
                return Err(SpawnError::Sandbox(SandboxError::new(
                    Layer::Namespaces,
                    e.to_string(),
                )))
            }
        }
    };

    // Without namespaces a scratch directory cannot be made in the cell: it
    // gets a host one for its lifetime.
    let (host_plan, host_dir) = if plan.scratch_in_cell {
        let dir = tempfile::Builder::new()
            .prefix("cellbox-")
            .tempdir_in(std::env::temp_dir())
            .map(super::tree::OwnedTree::new)
            .map_err(|e| {
                SpawnError::Spawn(format!("failed to create the scratch directory: {e}"))
            })?;
        let mut p = plan.clone();
        p.scratch = dir.path().to_path_buf();
        p.scratch_in_cell = false;
        (Some(p), Some(dir))
    } else {
        (None, None)
    };
    let (plan, view) = match &host_plan {
        Some(p) => (p, linux::resolve_view(p).map_err(SpawnError::Sandbox)?),
        None => (plan, view),
    };
    let (parent, child) = plain_pair()?;
    match fork()? {
        Some(pid) => {
            drop((out_w, err_w, null, child));
            watch(pid, out_r, err_r, parent, host_dir)
        }
        None => cell_main(
            plan,
            ids,
            &view,
            without,
            [null.as_fd(), out_w.as_fd(), err_w.as_fd(), child.as_fd()],
            &mut program,
            cgroup,
        ),
    }
}

/// The caller's side of a started cell.
fn watch(
    pid: libc::pid_t,
    stdout: OwnedFd,
    stderr: OwnedFd,
    control: UnixStream,
    scratch: Option<super::tree::OwnedTree>,
) -> Result<Cell, SpawnError> {
    let pidfd = match super::process::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = super::process::kill_pid(pid);
            let _ = super::process::reap(pid);
            return Err(SpawnError::Spawn(format!(
                "failed to watch the cell process: {e}"
            )));
        }
    };
    Ok(Cell {
        pid,
        pidfd,
        stdout,
        stderr,
        control,
        scratch,
    })
}

/// How a one-shot cell is cloned into its namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloneWay {
    /// The fast way ([`namespaces::clone_vfork_mapped`]): the child maps
    /// itself, and where the kernel refuses that, the other way follows.
    SelfMaps,
    /// `CELLBOX_CLONE=parent-maps`: this process writes the child's maps
    /// (what happens anyway when the fast way is refused), to compare or to
    /// rule the fast way out.
    ParentMaps,
    /// `CELLBOX_CLONE=self-maps-refused`: the fast way, with the child acting
    /// as if the kernel had refused its maps, so that the fall-back can be
    /// exercised on a kernel that does not refuse them.
    SelfMapsRefused,
}

/// The way `CELLBOX_CLONE` asks for (read in the parent: the child shares
/// its memory and must take no lock).
fn clone_way() -> CloneWay {
    match std::env::var_os("CELLBOX_CLONE") {
        Some(v) if v == "parent-maps" => CloneWay::ParentMaps,
        Some(v) if v == "self-maps-refused" => CloneWay::SelfMapsRefused,
        _ => CloneWay::SelfMaps,
    }
}

/// After a self-mapped clone returned: whether the child ended because it
/// could not map itself (it then exits with [`EXIT_NO_MAPS`] before sending
/// anything; it is reaped here). Any other child has sent its report or
/// error, or exited without one, which the caller's supervision reports.
fn gave_up_mapping(pid: libc::pid_t, control: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    // The child has executed its program or exited by now (CLONE_VFORK), so
    // its end is closed: this returns at once, with its first byte or EOF.
    let peeked = loop {
        match nix::sys::socket::recv(
            control.as_raw_fd(),
            &mut byte,
            nix::sys::socket::MsgFlags::MSG_PEEK,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    if peeked != Ok(0) {
        return false;
    }
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    // Look without reaping: any other end is the caller's to supervise.
    let pid = nix::unistd::Pid::from_raw(pid);
    let ended = waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
    if ended != Ok(WaitStatus::Exited(pid, EXIT_NO_MAPS)) {
        return false;
    }
    let _ = nix::sys::wait::waitpid(pid, None);
    true
}

/// A plain fork (no namespaces).
fn fork() -> Result<Option<libc::pid_t>, SpawnError> {
    linux::sys::clone_fork(0)
        .map_err(|e| SpawnError::Spawn(format!("failed to fork the cell: {e}")))
}

/// Leave the child without running anything of the caller's (no atexit
/// handlers, no destructors, no buffered output of the parent's).
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; it has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Put copies of `fds` (stdin, stdout, stderr, control) on 0..=3. The
/// control fd is close-on-exec; the originals and the rest of the inherited
/// fds are closed by hygiene.
fn place_fds(fds: [BorrowedFd<'_>; 4]) -> std::io::Result<()> {
    // First move every source above the targets, so that a source that
    // already sits on 0..=3 cannot be overwritten before it is copied.
    let mut high = Vec::with_capacity(4);
    for fd in &fds {
        // SAFETY: F_DUPFD_CLOEXEC on an fd we own returns a new fd or -1.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        high.push(unsafe { OwnedFd::from_raw_fd(rc) });
    }
    for (target, fd) in high.iter().enumerate() {
        let target = target as libc::c_int;
        // SAFETY: dup2 onto a small fd number; whatever was there is ours to
        // replace (this child owns its whole fd table).
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: fcntl on fd 3, just placed.
    if unsafe { libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The cell: sandbox itself, report, execute the program. Never returns,
/// not even by a panic: this process is a copy of the caller, and
/// unwinding would run the caller's code and destructors in it, among
/// them those of the objects that own fds the hygiene layer closed with
/// `close_range` (a second close, which debug builds abort on).
fn cell_main(
    plan: &SandboxPlan,
    ids: namespaces::HostIds,
    view: &linux::view::FsView,
    ns: Namespaces,
    fds: [BorrowedFd<'_>; 4],
    program: &mut Program<'_>,
    cgroup: Option<RawFd>,
) -> ! {
    let body =
        std::panic::AssertUnwindSafe(|| cell_body(plan, ids, view, ns, fds, program, cgroup));
    // `cell_body` never returns: only a panic gets past this.
    let _ = std::panic::catch_unwind(body);
    exit_now(EXIT_SANDBOX)
}

fn cell_body(
    plan: &SandboxPlan,
    ids: namespaces::HostIds,
    view: &linux::view::FsView,
    ns: Namespaces,
    fds: [BorrowedFd<'_>; 4],
    program: &mut Program<'_>,
    cgroup: Option<RawFd>,
) -> ! {
    // Before the fds move: placing them may reuse the cgroup's number.
    let joined = cgroup.and_then(|cg| linux::cgroup::join_fd(cg).err());
    if place_fds(fds).is_err() {
        // Without its fds the cell cannot even report; the parent sees an
        // exit without a report.
        exit_now(EXIT_SANDBOX);
    }
    // SAFETY: fd 3 was just placed and belongs to nothing else in this
    // process.
    let control = unsafe { UnixStream::from_raw_fd(3) };
    let framed = matches!(program, Program::InProcess { .. });
    let send = |msg: &Report| {
        let bytes = if framed {
            let frame = match msg {
                Report::Ready(report) => FromWorker::Ready(Ready {
                    report: report.clone(),
                }),
                Report::SandboxError(f) => FromWorker::SandboxError(f.clone()),
            };
            encode_frame(&frame, DEFAULT_MAX_FRAME_BYTES).ok()
        } else {
            serde_json::to_vec(msg).ok()
        };
        if let Some(bytes) = bytes {
            let _ = (&control).write_all(&bytes);
        }
    };
    let fail = |e: SandboxError| -> ! {
        send(&Report::SandboxError(SandboxFailure {
            layer: e.layer.as_str().to_owned(),
            message: e.message(),
        }));
        exit_now(EXIT_SANDBOX)
    };
    if let Some(e) = joined {
        fail(SandboxError::new(
            Layer::Cgroup,
            format!("failed to join the cell's memory cgroup: {e}"),
        ));
    }
    let owner = ids.root.then_some((ids.uid, ids.gid));
    let (start, owner, ids) = match ns {
        Namespaces::SelfMapped { names, refused } => {
            if let Err(e) = linux::sys::set_parent_death_signal(libc::SIGKILL) {
                fail(SandboxError::new(
                    Layer::Namespaces,
                    format!("failed to set the parent-death signal: {e}"),
                ));
            }
            if refused || namespaces::map_self(ids).is_err() {
                // The parent falls back to writing the maps itself.
                exit_now(EXIT_NO_MAPS);
            }
            // The parent handed the scratch directory over before the clone.
            let start = Start::Cloned {
                names,
                setgroups: false,
                control: control.as_fd(),
            };
            (start, None, ids)
        }
        Namespaces::Cloned(names) => {
            // While the parent writes the maps: what the code run in this
            // process builds before anything else (its own, trusted work,
            // on the other CPU meanwhile).
            if let Program::InProcess {
                prepare: Some(prepare),
                ..
            } = program
            {
                prepare();
            }
            // The maps must exist before hygiene: it hands the scratch
            // directory to the cell's ids.
            if let Err(e) = namespaces::wait_for_parent(&control) {
                fail(SandboxError::new(Layer::Namespaces, e));
            }
            let start = Start::Cloned {
                names,
                setgroups: ids.switches_ids(),
                control: control.as_fd(),
            };
            // With subordinate ids the maps exist now, and this process
            // is root of a namespace that maps the cell's ids.
            let owner = ids.switches_ids().then_some((ids.uid, ids.gid));
            (start, owner, ids)
        }
        Namespaces::Without(mode, why) => {
            // No user namespace: the cell keeps the user's own ids.
            let ids = if ids.sub.is_some() {
                linux::own_ids()
            } else {
                ids
            };
            (Start::Without(mode, why), owner, ids)
        }
    };
    // The rest is the jail sequence, as a one-shot cell: hygiene, the
    // namespaces' contents, rlimits, privileges, Landlock, seccomp.
    let report = match jail::sequence(Jail::one_shot(plan, ids, view, owner, start)) {
        Ok(r) => r,
        Err(e) => fail(e),
    };
    send(&Report::Ready(report));
    let argv = match program {
        Program::Exec(argv) => *argv,
        Program::InProcess { run, .. } => {
            // This process is a copy of the caller's (never shared memory):
            // its environment is its own to replace, as a worker's is, and
            // what the caller's held is wiped from its memory.
            linux::hygiene::replace_inherited_environment(&linux::cell_environment(plan));
            let code = run(control);
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            exit_now(code)
        }
    };
    let err = linux::exec::exec_in(argv, &linux::cell_environment(plan));
    crate::report!(
        "cellbox: failed to execute {}: {err}",
        argv.first().map_or("nothing", String::as_str)
    );
    exit_now(EXIT_EXEC)
}
