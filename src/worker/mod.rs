//! The worker: our own binary re-executed in a hidden mode, one per cell.
//!
//! It reads the `setup` frame, sandboxes itself ([`crate::sandbox::enter`]),
//! reports `ready`, and runs the backend. From the moment the backend starts
//! the process is hostile; the supervisor trusts nothing it says.

mod channel;
mod json;
pub(crate) mod python;
mod rhai;

pub use self::rhai::hardened_engine;
use crate::exit::Exit;
use crate::protocol::{
    read_frame_blocking, write_frame_blocking, Backend, FromWorker, Ready, SandboxFailure,
    ToWorker, DEFAULT_MAX_FRAME_BYTES,
};
use crate::sandbox::Layer;
use channel::Channel;

/// The hidden first argument that selects worker mode.
pub const WORKER_ARG: &str = "__worker";
/// The hidden first argument that selects the Rhai fork server.
pub const FORKSERVER_ARG: &str = "__forkserver";

/// The hidden first argument that selects a Python zygote.
pub const ZYGOTE_ARG: &str = "__zygote";

/// The hidden first argument of a worker `sandbox-exec` starts (see
/// [`crate::macos`]): its protocol socket is stdin, and it applies only
/// what the SBPL policy cannot ([`crate::sandbox::seatbelt`]).
pub const SEATBELT_WORKER_ARG: &str = "__seatbelt_worker";

/// The hidden first argument of the process that thaws a killed
/// supervisor's frozen sessions (see `crate::sandbox::linux::groups`).
pub const GUARD_ARG: &str = "__freezer_guard";

/// The hidden first argument of the process that removes a tree a cell
/// with subordinate ids wrote (see `crate::sandbox::linux::subids`).
#[cfg(target_os = "linux")]
pub const REMOVE_TREE_ARG: &str = crate::sandbox::linux::subids::REMOVE_ARG;
#[cfg(not(target_os = "linux"))]
pub const REMOVE_TREE_ARG: &str = "__remove_tree";

/// Exit codes of the worker process itself (the supervisor maps them).
const EXIT_SANDBOX: i32 = Exit::Sandbox.raw();
const EXIT_PROTOCOL: i32 = Exit::Internal.raw();

/// Which hidden worker mode this process was started in, if any.
pub(crate) fn hidden_mode() -> Option<&'static str> {
    hidden_mode_of(&std::env::args_os().nth(1)?)
}

fn hidden_mode_of(mode: &std::ffi::OsStr) -> Option<&'static str> {
    [
        (WORKER_ARG, "worker"),
        (FORKSERVER_ARG, "fork server"),
        (ZYGOTE_ARG, "zygote"),
        (SEATBELT_WORKER_ARG, "worker"),
        (GUARD_ARG, "freezer guard"),
        (REMOVE_TREE_ARG, "tree removal"),
    ]
    .into_iter()
    .find(|(arg, _)| mode == std::ffi::OsStr::new(arg))
    .map(|(_, name)| name)
}

/// Call first thing in `main`, before any thread or runtime exists: if this
/// process was started as a cellbox worker, run the cell and exit; otherwise
/// return and let `main` go on.
///
/// Workers are this same binary started again with a hidden first
/// argument. A worker sandboxes itself (new namespaces, a dropped identity,
/// Landlock, seccomp), which the kernel allows only to a process with a
/// single thread: so `main` must be a plain `fn main` that calls this before
/// it starts a runtime (build one after it, e.g. with
/// `tokio::runtime::Runtime::new()`), not `#[tokio::main]`, whose threads
/// exist before the body runs. Called too late, the worker refuses to run
/// and the cell's result says why (status `sandbox_error`); a program that
/// cannot change its `main` can point
/// [`crate::SupervisorBuilder::worker_exe`] at the `cellbox-engine` binary
/// instead.
///
/// Too late, under `#[tokio::main]`: the cell says what to do.
///
/// ```
/// use cellbox::{CellRequest, Language, SessionConfig, Status, Supervisor};
///
/// #[tokio::main]
/// async fn main() {
///     cellbox::worker::dispatch(); // the runtime's threads already run
///     let sup = Supervisor::builder().build().unwrap();
///     let cell = CellRequest::new(Language::Rhai, "40 + 2");
///     let r = sup.run(cell, SessionConfig::default()).await;
///     assert_eq!(r.status, Status::SandboxError, "{r:?}");
///     let message = r.error.unwrap().message;
///     assert!(message.contains("call it first thing in a plain `fn main`"), "{message}");
/// }
/// ```
pub fn dispatch() {
    let mut args = std::env::args_os();
    let mode = args.nth(1);
    let late = || too_late(thread_count());
    if mode.as_deref() == Some(std::ffi::OsStr::new(WORKER_ARG)) {
        let code = match crate::sandbox::spawn::take_protocol_channel() {
            Ok(stream) => match late() {
                Some(message) => run_worker_with(stream, move |_| {
                    Err(crate::sandbox::SandboxError::new(Layer::Hygiene, message))
                }),
                None => run_worker(stream),
            },
            Err(e) => {
                crate::report!("cellbox worker: {e}");
                EXIT_PROTOCOL
            }
        };
        std::process::exit(code);
    }
    if mode.as_deref() == Some(std::ffi::OsStr::new(SEATBELT_WORKER_ARG)) {
        let code = match crate::sandbox::seatbelt::take_stdin_channel() {
            Ok(stream) => match late() {
                Some(message) => run_worker_with(stream, move |_| {
                    Err(crate::sandbox::SandboxError::new(Layer::Hygiene, message))
                }),
                None => run_worker_with(stream, crate::sandbox::seatbelt::enter),
            },
            Err(e) => {
                crate::report!("cellbox worker: {e}");
                EXIT_PROTOCOL
            }
        };
        std::process::exit(code);
    }
    #[cfg(target_os = "linux")]
    if mode.as_deref() == Some(std::ffi::OsStr::new(ZYGOTE_ARG)) {
        std::process::exit(run_zygote(late()));
    }
    #[cfg(target_os = "linux")]
    if mode.as_deref() == Some(std::ffi::OsStr::new(REMOVE_TREE_ARG)) {
        std::process::exit(crate::sandbox::linux::subids::remove_main(args.next()));
    }
    #[cfg(target_os = "linux")]
    if mode.as_deref() == Some(std::ffi::OsStr::new(GUARD_ARG)) {
        std::process::exit(crate::sandbox::linux::groups::guard_main(args.next()));
    }
    if mode.as_deref() == Some(std::ffi::OsStr::new(FORKSERVER_ARG)) {
        let code = match crate::sandbox::spawn::take_protocol_channel() {
            Ok(stream) => fork_server_main(stream.into(), late()),
            Err(e) => {
                crate::report!("cellbox fork server: {e}");
                EXIT_PROTOCOL
            }
        };
        std::process::exit(code);
    }
}

/// Threads of this process (1 where they cannot be counted: the sandbox's
/// hygiene layer checks again).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

/// What a worker says when [`dispatch`] ran after threads were started.
fn too_late(threads: usize) -> Option<String> {
    (threads > 1).then(|| {
        format!(
            "cellbox::worker::dispatch() ran in a process that already has {threads} threads, \
             and a worker must be single-threaded to sandbox itself: call it first thing in a \
             plain `fn main` and start the async runtime after it (not `#[tokio::main]`, whose \
             threads start before main's body), or point Supervisor::builder().worker_exe(..) \
             at the cellbox-engine binary"
        )
    })
}

/// The pool layers the fork server applied, inherited by every forked cell.
static POOL_REPORT: std::sync::OnceLock<crate::sandbox::SandboxReport> = std::sync::OnceLock::new();

/// The Rhai fork server: take the pool plan, apply the pool-wide layers
/// once (namespaces included, so no cell pays for them), then fork a cell
/// per request; each cell adds only its own rlimits, a nested Landlock
/// domain and seccomp.
fn fork_server_main(ctl: std::os::fd::OwnedFd, late: Option<String>) -> i32 {
    use crate::sandbox::forkserver::{recv, send, Control};
    use std::os::fd::AsFd;
    let (plan, spares, cloned) = match recv(ctl.as_fd()) {
        Ok(Some((
            Control::Init {
                plan,
                spares,
                cloned,
            },
            _,
        ))) => (plan, spares, cloned),
        _ => return EXIT_PROTOCOL,
    };
    let entered = match late {
        Some(message) => Err(crate::sandbox::SandboxError::new(Layer::Hygiene, message)),
        None => enter_pool(
            &plan,
            crate::sandbox::Entry::ForkServer,
            cloned,
            ctl.as_fd(),
        ),
    };
    let report = match entered {
        Ok(r) => r,
        Err(e) => {
            let _ = send(
                ctl.as_fd(),
                &Control::Failed {
                    layer: e.layer.as_str().to_owned(),
                    message: e.message(),
                },
                &[],
            );
            return EXIT_SANDBOX;
        }
    };
    if send(
        ctl.as_fd(),
        &Control::Ready {
            report: report.clone(),
        },
        &[],
    )
    .is_err()
    {
        return EXIT_PROTOCOL;
    }
    // A failure here is not fatal: each child then builds its own program
    // (and reports that failure as its own).
    let _ = crate::sandbox::prepare_pool_children(&plan);
    let _ = POOL_REPORT.set(report);
    let limits = plan.limits;
    let _ = POOL_PLAN.set(*plan);
    rhai::prewarm();
    crate::sandbox::forkserver::serve(ctl, run_forked_worker, limits, spares)
}

/// Enter the sandbox as a pool process: in the namespaces the supervisor
/// started it in (`cloned`), or cloning itself into the plan's.
fn enter_pool(
    plan: &crate::sandbox::SandboxPlan,
    entry: crate::sandbox::Entry,
    cloned: Option<Vec<String>>,
    ctl: std::os::fd::BorrowedFd<'_>,
) -> Result<crate::sandbox::SandboxReport, crate::sandbox::SandboxError> {
    match cloned {
        #[cfg(target_os = "linux")]
        Some(names) => crate::sandbox::enter_cloned(plan, entry, &names, ctl),
        #[cfg(not(target_os = "linux"))]
        Some(_) => Err(crate::sandbox::SandboxError::new(
            Layer::Namespaces,
            "started in namespaces, which this OS does not have",
        )),
        None => {
            let _ = ctl;
            crate::sandbox::enter(plan, entry)
        }
    }
}

/// The fork server's pool plan; a forked cell's plan is this one with the
/// cell's limits.
static POOL_PLAN: std::sync::OnceLock<crate::sandbox::SandboxPlan> = std::sync::OnceLock::new();

/// A cell forked from the fork server: no `setup` frame (the server holds
/// the plan); it applies the per-cell layers at once, reports `ready`, and
/// waits for `start` like any Rhai worker (one that `waits` warms up
/// meanwhile).
fn run_forked_worker(
    stream: std::os::unix::net::UnixStream,
    limits: &crate::plan::Rlimits,
    waits: bool,
) -> i32 {
    let (Some(pool), Some(plan)) = (POOL_REPORT.get(), POOL_PLAN.get()) else {
        return EXIT_SANDBOX;
    };
    let mut plan = plan.clone();
    plan.limits = *limits;
    let chan = Channel::new(stream, DEFAULT_MAX_FRAME_BYTES);
    run_sandboxed(chan, &plan, Backend::Rhai, waits, |plan| {
        crate::sandbox::enter_pool_child(plan, pool)
    })
}

/// A Rhai cell run in a one-shot cell's own process (see
/// [`crate::sandbox::oneshot::spawn_in_process`]): it is sandboxed already
/// and has its `start` in memory; it speaks the protocol on `stream` from
/// its first call to `done`. Returns its exit code.
#[cfg(target_os = "linux")]
pub(crate) fn run_rhai_in_cell(
    stream: std::os::unix::net::UnixStream,
    start: crate::protocol::Start,
) -> i32 {
    let mut chan = Channel::new(stream, DEFAULT_MAX_FRAME_BYTES);
    chan.set_max_frame(start.max_frame_bytes);
    let _ = nix::sys::prctl::set_name(crate::sandbox::forkserver::CELL_NAME);
    rhai::run_cell(std::rc::Rc::new(std::cell::RefCell::new(chan)), start, None)
}

/// Build what every Rhai cell's engine needs (its standard package), ahead
/// of [`run_rhai_in_cell`].
#[cfg(target_os = "linux")]
pub(crate) fn prewarm_rhai() {
    rhai::prewarm();
}

/// One cell, from the `setup` frame to `done`, on an open protocol channel.
/// Returns the worker's exit code.
fn run_worker(stream: std::os::unix::net::UnixStream) -> i32 {
    run_worker_with(stream, |plan| {
        crate::sandbox::enter(plan, crate::sandbox::Entry::Worker)
    })
}

fn run_worker_with(
    stream: std::os::unix::net::UnixStream,
    enter: impl FnOnce(
        &crate::sandbox::SandboxPlan,
    ) -> Result<crate::sandbox::SandboxReport, crate::sandbox::SandboxError>,
) -> i32 {
    let mut chan = Channel::new(stream, DEFAULT_MAX_FRAME_BYTES);
    let setup = match read_frame_blocking::<ToWorker, _>(chan.stream(), DEFAULT_MAX_FRAME_BYTES) {
        Ok(ToWorker::Setup(s)) => s,
        Ok(_) => {
            crate::report!("cellbox worker: expected a setup frame");
            return EXIT_PROTOCOL;
        }
        Err(e) => {
            crate::report!("cellbox worker: failed to read the setup frame: {e}");
            return EXIT_PROTOCOL;
        }
    };

    run_sandboxed(chan, &setup.plan, setup.backend, false, enter)
}

/// Sandbox this process by `plan`, report `ready`, run the backend. A Rhai
/// worker that `waits` for its cell warms up while no `start` is there.
fn run_sandboxed(
    mut chan: Channel,
    plan: &crate::sandbox::SandboxPlan,
    backend: Backend,
    waits: bool,
    enter: impl FnOnce(
        &crate::sandbox::SandboxPlan,
    ) -> Result<crate::sandbox::SandboxReport, crate::sandbox::SandboxError>,
) -> i32 {
    // The jail, in order (docs/architecture.md §3): hygiene → namespaces → rlimits →
    // privileges → Landlock → seccomp. Nothing untrusted has run yet.
    let report = match enter(plan) {
        Ok(r) => r,
        Err(e) => {
            let _ = chan.send(&FromWorker::SandboxError(SandboxFailure {
                layer: e.layer.as_str().to_owned(),
                message: e.message(),
            }));
            return EXIT_SANDBOX;
        }
    };
    if chan.send(&FromWorker::Ready(Ready { report })).is_err() {
        return EXIT_PROTOCOL;
    }

    // From here on: untrusted code.
    match backend {
        Backend::Rhai => {
            let chan = std::rc::Rc::new(std::cell::RefCell::new(chan));
            if waits && !chan.borrow().readable_now() {
                rhai::warm_up(&chan);
            }
            // A worker started ahead of its session's next cell may get
            // the session's variables first (once), and makes them ready.
            let mut preloaded = None;
            let start = loop {
                let received = chan.borrow_mut().recv();
                match received {
                    Ok(ToWorker::Preload(p)) if preloaded.is_none() => {
                        preloaded = Some(rhai::Preloaded::new(p));
                    }
                    Ok(ToWorker::Start(s)) => break s,
                    _ => return EXIT_PROTOCOL,
                }
            };
            chan.borrow_mut().set_max_frame(start.max_frame_bytes);
            // A spare that waited under another name is a cell now.
            #[cfg(target_os = "linux")]
            let _ = nix::sys::prctl::set_name(crate::sandbox::forkserver::CELL_NAME);
            rhai::run_cell(chan, start, preloaded)
        }
        Backend::Python {
            interpreter,
            precompiled,
        } => {
            let err = python::exec_shim(&interpreter, precompiled.as_deref());
            crate::report!("cellbox worker: failed to start {interpreter}: {err}");
            EXIT_PROTOCOL
        }
        Backend::Exec { argv, env } => {
            let err = python::exec_program(chan, &argv, &env.0);
            crate::report!(
                "cellbox: failed to execute {}: {err}",
                argv.first().map_or("nothing", String::as_str)
            );
            127
        }
    }
}

/// A Python zygote's worker stage: read `setup` from the control channel,
/// apply the pool-wide layers, report `ready` (with the namespace anchors
/// for the cells' Landlock rulesets), then become the interpreter running
/// the shim in zygote mode on the same fd 3.
#[cfg(target_os = "linux")]
fn run_zygote(late: Option<String>) -> i32 {
    use crate::sandbox::zygote::{self, ZygoteMsg};
    use std::os::fd::AsFd;
    let ctl = match zygote::take_control_fd() {
        Ok(fd) => fd,
        Err(e) => {
            crate::report!("cellbox zygote: {e}");
            return EXIT_PROTOCOL;
        }
    };
    let (interpreter, plan, python, cloned, precompiled) =
        match zygote::recv::<ZygoteMsg>(ctl.as_fd(), zygote::MAX_PACKET_BYTES) {
            Ok(Some((
                ZygoteMsg::Setup {
                    interpreter,
                    plan,
                    python,
                    cloned,
                    precompiled,
                },
                _,
            ))) => (interpreter, plan, python, cloned, precompiled),
            Ok(_) => {
                crate::report!("cellbox zygote: expected a setup message");
                return EXIT_PROTOCOL;
            }
            Err(e) => {
                crate::report!("cellbox zygote: failed to read the setup message: {e}");
                return EXIT_PROTOCOL;
            }
        };
    let fail = |layer: Layer, message: String| {
        let _ = zygote::send(
            ctl.as_fd(),
            &ZygoteMsg::SandboxError {
                layer: layer.as_str().to_owned(),
                message,
            },
            &[],
        );
        EXIT_SANDBOX
    };
    if let Some(message) = late {
        return fail(Layer::Hygiene, message);
    }
    let config = match zygote::python_config(&python) {
        Ok(c) => c,
        Err(e) => return fail(Layer::Seccomp, e.to_string()),
    };
    let report = match enter_pool(&plan, crate::sandbox::Entry::Zygote, cloned, ctl.as_fd()) {
        Ok(r) => r,
        Err(e) => return fail(e.layer, e.message()),
    };
    let in_mount_ns = report.namespaces.iter().any(|n| n == "mount");
    let anchors = zygote::open_anchors(in_mount_ns);
    let names = anchors.iter().map(|(n, _)| n.clone()).collect();
    let fds: Vec<_> = anchors.iter().map(|(_, f)| f.as_fd()).collect();
    let ready = ZygoteMsg::Ready {
        report,
        anchors: names,
    };
    if zygote::send(ctl.as_fd(), &ready, &fds).is_err() {
        return EXIT_PROTOCOL;
    }
    drop(fds);
    drop(anchors);
    // fd 3 stays open (and inheritable) for the interpreter.
    let err = python::exec_zygote(&interpreter, &config, precompiled.as_deref());
    drop(ctl);
    crate::report!("cellbox zygote: failed to start {interpreter}: {err}");
    EXIT_PROTOCOL
}

#[doc(hidden)]
pub fn write_frame_for_tests<W: std::io::Write>(w: &mut W, msg: &FromWorker) {
    let _ = write_frame_blocking(w, msg, DEFAULT_MAX_FRAME_BYTES);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn hidden_modes_are_recognised_and_nothing_else() {
        assert_eq!(hidden_mode_of(OsStr::new("__worker")), Some("worker"));
        assert_eq!(
            hidden_mode_of(OsStr::new("__forkserver")),
            Some("fork server")
        );
        assert_eq!(hidden_mode_of(OsStr::new("__zygote")), Some("zygote"));
        assert_eq!(
            hidden_mode_of(OsStr::new("__seatbelt_worker")),
            Some("worker")
        );
        assert_eq!(hidden_mode_of(OsStr::new("run")), None);
        assert_eq!(hidden_mode_of(OsStr::new("__workerx")), None);
        // The message of a worker started too late says what to do.
        assert_eq!(too_late(1), None);
        let msg = too_late(3).unwrap();
        assert!(msg.contains("3 threads"), "{msg}");
        assert!(msg.contains("plain `fn main`"), "{msg}");
        // The test harness itself is no worker: building a supervisor works.
        assert_eq!(hidden_mode(), None);
    }
}
