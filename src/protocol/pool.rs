//! The control channels of the two pools: the Rhai fork server
//! (`crate::sandbox::forkserver`) and the Python zygotes
//! (`crate::sandbox::zygote`, `zygote.py`), and a Python session's state
//! process. Each is a `SOCK_SEQPACKET` pair carrying one JSON object per
//! packet (tag `"op"`), with fds attached (`SCM_RIGHTS`); the codec is
//! `crate::sandbox::packet`.
//!
//! The three share one envelope, which one supervisor-side client reads
//! (`crate::supervisor::pool_client`):
//! - supervisor → parent: a request with an `id` (`spawn`, `run`, `clone`);
//! - parent → supervisor: `spawned {id, pid}` with the child's fds (its
//!   pidfd first), or `error {id, message}`;
//! - parent → supervisor: how a child ended, as an [`ExitReport`]: the fork
//!   server reaps in Rust and sends `exited {pid, code, signal, cpu_ms,
//!   max_rss_kb}`; a zygote or state process sends wait4's raw figures,
//!   `ended {pid, status, utime, stime, max_rss_kb}` (written from buffers
//!   it zeroes after each report), which [`ExitReport::from_wait4`] reads.
//!
//! [`PoolReply`] sorts any of these messages into the envelope or "the
//! pool's own" (`spare`, `ready`, ...).

use super::sandbox::{SandboxPlan, SandboxReport};
use crate::plan::Rlimits;
use serde::{Deserialize, Serialize};

/// How a reaped process ended, with its resource usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Exit code when it exited normally.
    pub code: Option<i32>,
    /// Signal number when a signal killed it.
    pub signal: Option<i32>,
    /// User + system CPU time of the process and its reaped descendants.
    pub cpu_ms: u64,
    /// Peak resident set size in KiB.
    pub max_rss_kb: u64,
}

/// How a pool's child ended, whichever pool reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    pub pid: i32,
    pub reaped: Reaped,
}

impl ExitReport {
    /// From wait4's figures as a zygote sends them: the wait status and
    /// `[seconds, microseconds]` of user and system time.
    pub fn from_wait4(
        pid: i32,
        status: i32,
        utime: [i64; 2],
        stime: [i64; 2],
        max_rss_kb: i64,
    ) -> ExitReport {
        ExitReport {
            pid,
            reaped: Reaped {
                code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
                signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
                cpu_ms: cpu_ms(utime, stime),
                max_rss_kb: u64::try_from(max_rss_kb).unwrap_or(0),
            },
        }
    }
}

/// A message from a pool parent, sorted: the shared envelope, or one of the
/// pool's own.
#[derive(Debug, PartialEq)]
pub enum PoolReply<M> {
    /// The answer to request `id`: a child `pid` (its fds come with the
    /// packet, the pidfd first).
    Spawned { id: u64, pid: i32 },
    /// Request `id` failed.
    Error { id: u64, message: String },
    /// A child ended.
    Exited(ExitReport),
    /// Any other message.
    Other(M),
}

/// A message type of a pool control channel.
pub trait PoolMessage: Sized {
    /// Sort it into the shared envelope.
    fn sort(self) -> PoolReply<Self>;
}

/// Messages on the Rhai fork server's control channel (see
/// `crate::sandbox::forkserver`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// First message: the pool-wide sandbox plan and how many sandboxed
    /// children to keep waiting.
    Init {
        plan: Box<SandboxPlan>,
        #[serde(default)]
        spares: usize,
        /// The namespaces the supervisor started it in (see
        /// `crate::sandbox::spawn::start_pool_process`); absent: it clones
        /// itself into the plan's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cloned: Option<Vec<String>>,
    },
    /// The pool layers are in place.
    Ready {
        report: SandboxReport,
    },
    /// The pool layers could not be applied.
    Failed {
        layer: String,
        message: String,
    },
    /// A child with these limits, now; `ahead`: for a cell whose code is
    /// not known yet (it waits under the spares' name until it has it).
    Spawn {
        id: u64,
        limits: Rlimits,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ahead: bool,
    },
    /// A spare was taken; make another.
    Refill,
    /// The answer to `spawn` (fds: pidfd, protocol socket, stdout, stderr).
    Spawned {
        id: u64,
        pid: i32,
    },
    /// A child made ahead of time with these limits (fds as `spawned`).
    Spare {
        pid: i32,
        limits: Rlimits,
    },
    Error {
        id: u64,
        message: String,
    },
    Exited {
        pid: i32,
        code: Option<i32>,
        signal: Option<i32>,
        cpu_ms: u64,
        max_rss_kb: u64,
    },
}

/// Declares the message type of a channel `zygote.py` writes (a zygote's,
/// a state process's): the channel's own messages, then the envelope they
/// all share (`spawned`, `error` by request id, and `ended`, a child's wait4
/// figures), sorted into [`PoolReply`] by one [`PoolMessage`] impl.
macro_rules! zygote_channel {
    ($(#[$meta:meta])* pub enum $msg:ident { $($own:tt)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
        pub enum $msg {
            $($own)*
            Spawned {
                id: u64,
                pid: i32,
            },
            Error {
                id: u64,
                message: String,
            },
            /// How a child ended: its wait status and rusage as wait4 gave
            /// them (`[seconds, microseconds]`), written by the zygote from
            /// buffers it zeroes after each report.
            Ended {
                pid: i32,
                status: i32,
                utime: [i64; 2],
                stime: [i64; 2],
                max_rss_kb: i64,
            },
        }

        impl PoolMessage for $msg {
            fn sort(self) -> PoolReply<Self> {
                match self {
                    $msg::Spawned { id, pid } => PoolReply::Spawned { id, pid },
                    $msg::Error { id, message } => PoolReply::Error { id, message },
                    $msg::Ended {
                        pid,
                        status,
                        utime,
                        stime,
                        max_rss_kb,
                    } => PoolReply::Exited(ExitReport::from_wait4(
                        pid, status, utime, stime, max_rss_kb,
                    )),
                    other => PoolReply::Other(other),
                }
            }
        }
    };
}

zygote_channel! {
    /// Messages on a zygote's control channel.
    pub enum ZygoteMsg {
        Setup {
            interpreter: String,
            plan: Box<SandboxPlan>,
            /// Package paths for `sys.path` and modules to import ahead of time.
            #[serde(default)]
            python: crate::profiles::PythonPackages,
            /// The namespaces the supervisor started it in (as the fork
            /// server's `init`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            cloned: Option<Vec<String>>,
            /// The shim and the zygote precompiled by this interpreter (a
            /// file the sandbox opens read-only, see loader.py); `None` runs
            /// them from source.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            precompiled: Option<String>,
        },
        Ready {
            report: SandboxReport,
            anchors: Vec<String>,
        },
        /// After `ready`, from the interpreter: its profile's modules are
        /// imported and it takes spawns now.
        Serving,
        SandboxError {
            layer: String,
            message: String,
        },
        /// Fork a cell. Its fds: protocol socket, stdout, stderr, Landlock
        /// ruleset, and a pipe holding its [`CellSetup`] (read by the child
        /// only: the zygote never sees a cell's scratch dir or limits).
        Spawn {
            id: u64,
            /// The child is a session's first state process: its process
            /// group outlives it (its successors share it), so the zygote does
            /// not kill that group when it ends.
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            state: bool,
        },
    }
}

/// What a forked zygote child reads from its setup pipe before anything else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellSetup {
    pub scratch: String,
    pub rlimits: Rlimits,
    /// Start a session's state process (see [`StateMsg`]) rather than a
    /// cell.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub state: bool,
    /// The cell's code comes later (a cell prepared ahead): it may warm up
    /// while it waits for its `start` frame.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waits: bool,
}

zygote_channel! {
    /// Messages on a session's **state process** channel (`SOCK_SEQPACKET`, one
    /// JSON object per packet, tag `"op"`, the zygote's framing). A state
    /// process is forked from a zygote like a cell, under the same layers, and
    /// holds a Python session's live namespace; see `zygote.py` for its side.
    ///
    /// - supervisor → state: `run {id, rlimits}` with the cell's protocol
    ///   socket, stdout, stderr and the channel of the next state process;
    ///   `clone {id}` with the channel of a copy (a checkpoint);
    ///   `prefork {id}`: fork the process of the next cell ahead (its
    ///   spare).
    /// - state → supervisor: `spawned {id, pid}` (for `prefork`, with the
    ///   spare's channel, on which the spare says `warm` once it has warmed
    ///   up, and to which the supervisor sends the cell's limits, as
    ///   [`Rlimits`], the whole packet, and the four fds of `run` itself),
    ///   `error {id, message}`, `ended {...}` (as [`ZygoteMsg::Ended`]); and
    ///   first on each new channel, `ready {pid}` from the process that
    ///   serves it. Nothing else, and nothing unasked.
    ///
    /// A state process has run the session's code: pids it names are only
    /// looked up among the session's own processes, and an answer to a
    /// request never made closes its channel.
    pub enum StateMsg {
        Run {
            id: u64,
            rlimits: Rlimits,
        },
        Clone {
            id: u64,
        },
        Prefork {
            id: u64,
        },
        Ready {
            pid: i32,
        },
    }
}

/// CPU milliseconds from `[seconds, microseconds]` pairs (negative parts,
/// which the kernel never reports, count as 0).
pub fn cpu_ms(utime: [i64; 2], stime: [i64; 2]) -> u64 {
    let us = |t: [i64; 2]| {
        u64::try_from(t[0])
            .unwrap_or(0)
            .saturating_mul(1_000_000)
            .saturating_add(u64::try_from(t[1]).unwrap_or(0))
    };
    us(utime).saturating_add(us(stime)) / 1000
}

impl PoolMessage for Control {
    fn sort(self) -> PoolReply<Self> {
        match self {
            Control::Spawned { id, pid } => PoolReply::Spawned { id, pid },
            Control::Error { id, message } => PoolReply::Error { id, message },
            Control::Exited {
                pid,
                code,
                signal,
                cpu_ms,
                max_rss_kb,
            } => PoolReply::Exited(ExitReport {
                pid,
                reaped: Reaped {
                    code,
                    signal,
                    cpu_ms,
                    max_rss_kb,
                },
            }),
            other => PoolReply::Other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope's bytes, as both pools send them.
    #[test]
    fn the_envelope_reads_the_same_from_every_pool() {
        let z: ZygoteMsg = serde_json::from_str(r#"{"op":"spawned","id":3,"pid":40}"#).unwrap();
        assert_eq!(z.sort(), PoolReply::Spawned { id: 3, pid: 40 });
        let c: Control = serde_json::from_str(r#"{"op":"error","id":4,"message":"m"}"#).unwrap();
        assert_eq!(
            c.sort(),
            PoolReply::Error {
                id: 4,
                message: "m".into()
            }
        );
        let ended: ZygoteMsg = serde_json::from_str(
            r#"{"op":"ended","pid":9,"status":256,"utime":[1,500000],"stime":[0,250000],"max_rss_kb":77}"#,
        )
        .unwrap();
        let exited: Control = serde_json::from_str(
            r#"{"op":"exited","pid":9,"code":1,"signal":null,"cpu_ms":1750,"max_rss_kb":77}"#,
        )
        .unwrap();
        assert_eq!(
            ended.sort(),
            PoolReply::Exited(ExitReport {
                pid: 9,
                reaped: Reaped {
                    code: Some(1),
                    signal: None,
                    cpu_ms: 1750,
                    max_rss_kb: 77
                },
            })
        );
        assert!(
            matches!(exited.sort(), PoolReply::Exited(r) if r.reaped.cpu_ms == 1750 && r.reaped.code == Some(1))
        );
        let killed = StateMsg::Ended {
            pid: 2,
            status: libc::SIGKILL,
            utime: [0, 0],
            stime: [0, 0],
            max_rss_kb: -1,
        };
        assert_eq!(
            killed.sort(),
            PoolReply::Exited(ExitReport {
                pid: 2,
                reaped: Reaped {
                    code: None,
                    signal: Some(libc::SIGKILL),
                    cpu_ms: 0,
                    max_rss_kb: 0
                },
            })
        );
        assert!(matches!(
            StateMsg::Ready { pid: 1 }.sort(),
            PoolReply::Other(StateMsg::Ready { pid: 1 })
        ));
        // A spare is asked for, and answered as any request is.
        let asked: StateMsg = serde_json::from_str(r#"{"op":"prefork","id":5}"#).expect("prefork");
        assert_eq!(asked, StateMsg::Prefork { id: 5 });
        assert!(serde_json::from_str::<StateMsg>(r#"{"op": "spare", "pid": 12}"#).is_err());
        // Unknown fields stay refused.
        assert!(
            serde_json::from_str::<ZygoteMsg>(r#"{"op":"spawned","id":3,"pid":40,"x":1}"#).is_err()
        );
    }
}
