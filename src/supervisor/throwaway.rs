//! Sessions for cells run without one ([`Supervisor::run`], and `serve`'s
//! calls that name none). Each such cell runs in a session of its own that
//! no other cell sees; making one (its scratch tmpfs mounted, its cgroup
//! taken, its cell's worker started) and tearing it down (unmounted, its
//! cgroup emptied and given back) is done off the cell's path: sessions
//! are prepared ahead (see [`Session::prepare`]), each with a worker
//! waiting for its cell's code in the languages of the latest cells (see
//! [`Session::prepare_cell`]), and a cell's session is dropped on a
//! blocking thread once the cell is over, while the next is prepared.
//!
//! A prepared session has run nothing: its scratch is a new, empty tmpfs
//! and its workers have only been sandboxed and joined its groups, so one
//! cell's files, processes and groups are never seen by the next. A worker
//! of the language the cell did not use goes with its session. Sessions
//! are prepared with the configuration of the latest cell; a cell with
//! another one makes its session on the spot, and the prepared ones go.
//!
//! Nothing is prepared before the first such cell (unless the caller
//! expects some: see [`Throwaway::expect`], which `serve` calls as it
//! starts), nor after [`Throwaway::release`] until the next.

use super::{Inner, PythonState, Session, SessionConfig};
use crate::util::lock;
use crate::{CellRequest, CellResult, ErrorKind, Language, RunInfo};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A prepared session starts workers for the languages among this many
/// latest cells (a supervisor used for one language stops starting the
/// other's, which would only be ended unused).
const RECENT_CALLS: usize = 8;

/// Two sessions are kept prepared for this long after two cells ran at
/// once (else one): the second of two cells at once then finds one too.
const OVERLAP_KEEP: Duration = Duration::from_secs(5);

/// How long after a cell's result is handed back its session is torn down
/// and the next one prepared, when cells come one at a time: both take CPU
/// time (unmounting and mounting a scratch tmpfs, ending and forking
/// workers), which would otherwise compete with handing the result on. A
/// result is out well within this.
const AFTER_REPLY: Duration = Duration::from_millis(1);

/// The sessions prepared for cells run without one.
#[derive(Default)]
pub(crate) struct Throwaway {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What the prepared sessions are made with: the latest cell's.
    config: Option<SessionConfig>,
    /// Bumped whenever the prepared sessions are let go (another
    /// configuration, a release): a session still being prepared then is
    /// not kept.
    generation: u64,
    /// Prepared sessions, oldest first.
    ready: VecDeque<Session>,
    /// Sessions being prepared now, or to be prepared by a task already
    /// on its way (see [`Reserved`]).
    preparing: usize,
    /// Sessions let go (used, stale or beyond those wanted) and being
    /// torn down now (see [`Throwaway::tear_down`]).
    ending: usize,
    /// Cells running now.
    running: usize,
    /// When a cell last started while another ran.
    overlapped: Option<Instant>,
    /// The languages of the latest cells, newest last.
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

    /// The languages of `offered` to start workers for, the latest cell's
    /// first; every one offered before the first cell (see
    /// [`Throwaway::expect`]).
    fn to_prepare(&self, offered: &[Language]) -> Vec<Language> {
        if self.recent.is_empty() {
            return offered.to_vec();
        }
        let mut out = Vec::new();
        for l in self.recent.iter().rev() {
            if offered.contains(l) && !out.contains(l) {
                out.push(*l);
            }
        }
        out
    }

    /// Let the prepared sessions go (to be dropped off the runtime).
    fn let_go(&mut self) -> Vec<Session> {
        self.generation += 1;
        self.ready.drain(..).collect()
    }
}

/// What a session made for one cell is made with: one cell has no next one
/// to keep a live namespace or a next worker for.
pub(crate) fn for_one_cell(config: SessionConfig) -> SessionConfig {
    SessionConfig {
        python_state: PythonState::Replay,
        prepare_next: false,
        ..config
    }
}

/// Sessions being torn down, counted in [`State::ending`] until they are
/// gone.
struct Ending {
    of: Arc<Throwaway>,
    sessions: Vec<Session>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        // Each is the last handle of its session (its cell is over, or it
        // never ran one): its workers started ahead are ended here, on
        // this thread, rather than on another blocking thread of their
        // own, so that the session is wholly gone (its scratch and groups
        // given back) before the count drops.
        for s in self.sessions.drain(..) {
            s.end_prepared_here();
        }
        let mut st = lock(&self.of.state);
        st.ending = st.ending.saturating_sub(1);
    }
}

impl Throwaway {
    /// Tear `sessions` down on a blocking thread (it may wait for their
    /// workers to go), counted as ending until they are gone: see
    /// [`Throwaway::release`].
    fn tear_down(self: &Arc<Self>, sessions: Vec<Session>) {
        if !sessions.is_empty() {
            let ending = self.ending(sessions);
            tokio::task::spawn_blocking(move || drop(ending));
        }
    }

    /// `sessions`, counted as ending from now until the value is dropped
    /// (which tears them down).
    fn ending(self: &Arc<Self>, sessions: Vec<Session>) -> Ending {
        lock(&self.state).ending += 1;
        Ending {
            of: self.clone(),
            sessions,
        }
    }

    /// Run one cell in a session of its own, a prepared one when one fits,
    /// and prepare the next once it is over; the end of the cell when it
    /// was answered before its worker was gone (see [`Session::settled`]).
    /// With `reply_pending`, the caller has yet to hand the result on: when
    /// cells come one at a time, the next session is prepared a little
    /// later, so as not to compete with that.
    pub(crate) async fn run(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        request: CellRequest,
        config: SessionConfig,
        reply_pending: bool,
    ) -> (CellResult, Option<super::Tail>) {
        let mut config = for_one_cell(config);
        // Sessions are prepared for any caller: the account is the cell's,
        // given to the session it gets.
        let account = std::mem::take(&mut config.account);
        self.trim();
        {
            let mut st = lock(&self.state);
            st.running += 1;
            if st.running > 1 {
                st.overlapped = Some(Instant::now());
            }
            st.recent.push_back(request.language);
            while st.recent.len() > RECENT_CALLS {
                st.recent.pop_front();
            }
        }
        // Counts the cell as running until it returns (or is dropped).
        let _running = Running(self.clone());
        let ready = self.take(&config);
        let session = match ready {
            Some(s) => s,
            None => match Session::new(inner.clone(), config) {
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
        if !session.bind_account(account) {
            let refused = CellResult::refused_with(
                request.language.as_str(),
                RunInfo::root(),
                ErrorKind::SandboxError,
                "failed to give the cell's session its account: it has one".into(),
            );
            return (refused, None);
        }
        let result = session.run(request).await;
        let tail = session.tail();
        // The handle is dropped off this task: the last one tears the
        // session down (waiting for a cell's leftover processes, and an
        // unused worker, to go). The next is prepared meanwhile. Both wait
        // until the result is out when cells come one at a time (none
        // other runs, none overlapped lately); else the next cell may need
        // the next session at once.
        //
        // The next session is counted as being prepared from now on, so
        // that cells ending meanwhile do not prepare more than wanted.
        let (busy, reserved) = {
            let mut st = lock(&self.state);
            let busy = st.running > 1 || st.wanted() > 1;
            let reserve = st.config.is_some() && st.ready.len() + st.preparing < st.wanted();
            if reserve {
                st.preparing += 1;
            }
            (busy, reserve.then(|| Reserved(Some(self.clone()))))
        };
        let me = self.clone();
        let inner = inner.clone();
        let cell_end = tail.clone();
        // Counted as ending from now: a release waits for it.
        let ending = self.ending(vec![session]);
        tokio::spawn(async move {
            if reply_pending && !busy {
                tokio::time::sleep(AFTER_REPLY).await;
            }
            // Its cell is wholly over before it is torn down.
            if let Some(t) = cell_end {
                t.wait().await;
            }
            tokio::task::spawn_blocking(move || drop(ending));
            me.refill(inner, reserved).await;
        });
        (result, tail)
    }

    /// A prepared session made with `config`, if one is ready. Sessions
    /// prepared with another configuration are let go, and the next ones
    /// are prepared with this one. A cell does not wait for one being
    /// prepared: when cells come back to back, making its own at once
    /// while that one is finished for the next cell keeps both cores busy.
    fn take(self: &Arc<Self>, config: &SessionConfig) -> Option<Session> {
        let mut st = lock(&self.state);
        if st.config.as_ref() != Some(config) {
            let stale = st.let_go();
            st.config = Some(config.clone());
            drop(st);
            self.tear_down(stale);
            return None;
        }
        st.ready.pop_front()
    }

    /// Prepare a session for cells with `config` before the first comes,
    /// with a worker waiting in each language (the first cell's then only
    /// sends its code). Returns once it is ready, or at once when one is
    /// ready or being made, or when cells with another configuration
    /// came first (theirs is what is prepared). Given up on (dropped), the
    /// preparation goes on.
    pub(crate) async fn expect(self: &Arc<Self>, inner: Arc<Inner>, config: SessionConfig) {
        let config = SessionConfig {
            account: Default::default(),
            ..for_one_cell(config)
        };
        {
            let mut st = lock(&self.state);
            match &st.config {
                None => st.config = Some(config),
                Some(c) if *c == config => {}
                Some(_) => return,
            }
        }
        // On a task of its own: a caller that stops waiting does not stop
        // the preparation halfway (which would leave it counted as under
        // way, and nothing prepared again).
        let _ = tokio::spawn(self.clone().refill(inner, None)).await;
    }

    /// How many sessions are prepared now.
    pub(crate) fn prepared(&self) -> usize {
        lock(&self.state).ready.len()
    }

    /// Give back the prepared sessions beyond those wanted (two are wanted
    /// only for a while after cells overlapped) while no cell runs: they
    /// are torn down on a blocking thread.
    pub(crate) fn trim(self: &Arc<Self>) {
        let extra: Vec<Session> = {
            let mut st = lock(&self.state);
            let keep = st.wanted();
            if st.running > 0 || st.ready.len() <= keep {
                return;
            }
            let n = st.ready.len() - keep;
            st.ready.drain(..n).collect()
        };
        self.tear_down(extra);
    }

    /// Give back every prepared session, and any being prepared once it
    /// is made; none is prepared again before the next cell. Returns once
    /// none is being prepared and every session let go is torn down:
    /// those prepared, and those of the cells over by then (a cell's
    /// session goes once its worker is gone, after its result).
    pub(crate) async fn release(self: &Arc<Self>) {
        let sessions = {
            let mut st = lock(&self.state);
            // Nothing to prepare with until the next cell.
            st.config = None;
            st.let_go()
        };
        self.tear_down(sessions);
        // A preparation under way (or about to begin) sees the new
        // generation (or no configuration) and lets go of what it made
        // itself; a cell over just now hands its session on to be torn
        // down once its worker is gone.
        loop {
            {
                let st = lock(&self.state);
                if st.preparing == 0 && st.ending == 0 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Prepare sessions until as many as wanted are ready (or being made),
    /// the first in the place `reserved` holds.
    async fn refill(self: Arc<Self>, inner: Arc<Inner>, reserved: Option<Reserved>) {
        let offered: Vec<Language> = inner
            .languages
            .iter()
            .copied()
            .filter(|l| matches!(l, Language::Rhai | Language::Python))
            .collect();
        let mut reserved = reserved;
        loop {
            let (config, generation, languages) = {
                let mut st = lock(&self.state);
                match reserved.take() {
                    // Its count is this preparation's from here on.
                    Some(r) => r.hand_over(),
                    None if st.ready.len() + st.preparing >= st.wanted() => return,
                    None => st.preparing += 1,
                }
                let Some(config) = st.config.clone() else {
                    st.preparing -= 1;
                    return;
                };
                (config, st.generation, st.to_prepare(&offered))
            };
            let making = inner.clone();
            // Mounting its scratch may wait: off the runtime.
            let made = tokio::task::spawn_blocking(move || {
                let s = Session::new(making, config).ok()?;
                s.prepare();
                Some(s)
            })
            .await
            .ok()
            .flatten();
            if let Some(s) = &made {
                let mut languages = languages;
                let mut done: Vec<Language> = Vec::new();
                // Cells that came while it was made may have been of another
                // language: it gets a worker for theirs too before it is
                // ready.
                while !languages.is_empty() {
                    for l in languages {
                        s.prepare_cell(l).await;
                        done.push(l);
                    }
                    languages = lock(&self.state)
                        .to_prepare(&offered)
                        .into_iter()
                        .filter(|l| !done.contains(l))
                        .collect();
                }
            }
            let mut st = lock(&self.state);
            st.preparing -= 1;
            let go_on = match made {
                Some(s) if st.generation == generation => {
                    st.ready.push_back(s);
                    true
                }
                // Let go while it was made: it goes too.
                Some(s) => {
                    drop(st);
                    self.tear_down(vec![s]);
                    false
                }
                // The next cell makes its session and says why it failed.
                None => false,
            };
            if !go_on {
                return;
            }
        }
    }
}

/// A session counted as being prepared before the task that prepares it
/// has begun; dropped unused (the task never ran), the count is taken back.
struct Reserved(Option<Arc<Throwaway>>);

impl Reserved {
    /// The preparation has begun: its count is the preparation's now.
    fn hand_over(mut self) {
        self.0 = None;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            lock(&t.state).preparing -= 1;
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
        // The prepared sessions go now, each holding the supervisor until
        // it is torn down: their cgroups are given back before the
        // supervisor's own groups are removed.
        let ready = std::mem::take(&mut lock(&self.state).ready);
        drop(ready);
    }
}
