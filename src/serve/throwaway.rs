//! Sessions for calls that name none. Each such call runs in a session of
//! its own that no other call sees; making one (its scratch tmpfs mounted,
//! its cgroup taken, its cell's worker started) and tearing it down
//! (unmounted, its cgroup emptied and given back) is done off the call's
//! path: sessions are prepared ahead (see [`Session::prepare`]), each with
//! a worker waiting for its cell's code in the languages of the latest
//! calls (see [`Session::prepare_cell`]), and a call's session is dropped
//! on a blocking thread after its result is handed back, while the next is
//! prepared.
//!
//! A prepared session has run nothing: its scratch is a new, empty tmpfs
//! and its workers have only been sandboxed and joined its groups, so one
//! call's files, processes and groups are never seen by the next. A worker
//! of the language the call did not use goes with its session.

use crate::supervisor::{PythonState, Session, SessionConfig};
use crate::util::lock;
use crate::{CellRequest, CellResult, ErrorKind, Language, RunInfo, Supervisor};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A prepared session starts workers for the languages among this many
/// latest calls (a server used for one language stops starting the
/// other's, which would only be ended unused).
const RECENT_CALLS: usize = 8;

/// Two sessions are kept prepared for this long after two calls ran at
/// once (else one): the second of two calls at once then finds one too.
const OVERLAP_KEEP: Duration = Duration::from_secs(5);

/// How long after a call's result is handed back its session is torn down
/// and the next one prepared, when calls come one at a time: both take CPU
/// time (unmounting and mounting a scratch tmpfs, ending and forking
/// workers), which would otherwise compete with writing the reply and with
/// the client reading it. A reply is out well within this.
const AFTER_REPLY: Duration = Duration::from_millis(1);

/// The prepared sessions and what new ones are made from.
pub(crate) struct Throwaway {
    sup: Supervisor,
    config: SessionConfig,
    /// The languages whose workers may be started ahead.
    languages: Vec<Language>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Prepared sessions, oldest first.
    ready: VecDeque<Session>,
    /// Sessions being prepared now.
    preparing: usize,
    /// Calls running now.
    running: usize,
    /// When a call last started while another ran.
    overlapped: Option<Instant>,
    /// The languages of the latest calls, newest last.
    recent: VecDeque<Language>,
}

impl State {
    /// How many sessions to keep prepared.
    fn wanted(&self) -> usize {
        match self.overlapped {
            Some(t) if t.elapsed() < OVERLAP_KEEP => 2,
            _ => 1,
        }
    }

    /// The languages of `offered` to start workers for, the latest call's
    /// first.
    fn to_prepare(&self, offered: &[Language]) -> Vec<Language> {
        let mut out = Vec::new();
        for l in self.recent.iter().rev() {
            if offered.contains(l) && !out.contains(l) {
                out.push(*l);
            }
        }
        out
    }
}

impl Throwaway {
    pub(crate) fn new(
        sup: Supervisor,
        config: SessionConfig,
        languages: &[Language],
    ) -> Arc<Throwaway> {
        Arc::new(Throwaway {
            sup,
            // One cell has no next one to keep a live namespace for.
            config: SessionConfig {
                python_state: PythonState::Replay,
                ..config
            },
            languages: languages
                .iter()
                .copied()
                .filter(|l| matches!(l, Language::Rhai | Language::Python))
                .collect(),
            state: Mutex::new(State::default()),
        })
    }

    /// Run one cell in a session of its own; the end of the cell when it
    /// was answered before its worker was gone (see [`Session::settled`]).
    pub(crate) async fn run(
        self: &Arc<Self>,
        request: CellRequest,
    ) -> (CellResult, Option<crate::supervisor::Tail>) {
        let ready = {
            let mut st = lock(&self.state);
            st.running += 1;
            if st.running > 1 {
                st.overlapped = Some(Instant::now());
            }
            st.recent.push_back(request.language);
            while st.recent.len() > RECENT_CALLS {
                st.recent.pop_front();
            }
            st.ready.pop_front()
        };
        // Counts the call as running until it returns (or is dropped).
        let _running = Running(self.clone());
        let session = match ready {
            Some(s) => s,
            None => match self.sup.session(self.config.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let refused = CellResult::refused_with(
                        request.language.as_str(),
                        RunInfo::root(),
                        ErrorKind::SandboxError,
                        e.to_string(),
                    );
                    return (refused, None);
                }
            },
        };
        let result = session.run(request).await;
        let tail = session.tail();
        // The handle is dropped off this task: the last one tears the
        // session down (waiting for a cell's leftover processes, and an
        // unused worker, to go). The next is prepared meanwhile. Both wait
        // until the reply is out when calls come one at a time (none other
        // runs, none overlapped lately); else the next call may need the
        // next session at once.
        let busy = {
            let st = lock(&self.state);
            st.running > 1 || st.wanted() > 1
        };
        let me = self.clone();
        let ending = tail.clone();
        tokio::spawn(async move {
            if !busy {
                tokio::time::sleep(AFTER_REPLY).await;
            }
            // Its cell is wholly over before it is torn down.
            if let Some(t) = ending {
                t.wait().await;
            }
            tokio::task::spawn_blocking(move || drop(session));
            me.refill().await;
        });
        (result, tail)
    }

    /// Give back the prepared sessions beyond those wanted (two are wanted
    /// only for a while after calls overlapped) while no call runs: they
    /// are torn down on a blocking thread.
    pub(crate) fn trim(&self) {
        let extra: Vec<Session> = {
            let mut st = lock(&self.state);
            let keep = st.wanted();
            if st.running > 0 || st.ready.len() <= keep {
                return;
            }
            let n = st.ready.len() - keep;
            st.ready.drain(..n).collect()
        };
        tokio::task::spawn_blocking(move || drop(extra));
    }

    /// Prepare sessions until as many as wanted are ready (or being made).
    pub(crate) async fn refill(self: Arc<Self>) {
        loop {
            let languages = {
                let mut st = lock(&self.state);
                if st.ready.len() + st.preparing >= st.wanted() {
                    return;
                }
                st.preparing += 1;
                st.to_prepare(&self.languages)
            };
            let me = self.clone();
            // Mounting its scratch may wait: off the runtime.
            let made = tokio::task::spawn_blocking(move || {
                let s = me.sup.session(me.config.clone()).ok()?;
                s.prepare();
                Some(s)
            })
            .await
            .ok()
            .flatten();
            if let Some(s) = &made {
                for l in languages {
                    s.prepare_cell(l).await;
                }
            }
            let mut st = lock(&self.state);
            st.preparing -= 1;
            match made {
                Some(s) => st.ready.push_back(s),
                // Its cell makes the next session and says why it failed.
                None => return,
            }
        }
    }
}

/// A call of [`Throwaway::run`] in progress.
struct Running(Arc<Throwaway>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.running = st.running.saturating_sub(1);
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        // The prepared sessions go while `self.sup` still holds the
        // supervisor: their cgroups must be given back before the
        // supervisor's own groups are removed.
        let ready = std::mem::take(&mut lock(&self.state).ready);
        drop(ready);
    }
}
