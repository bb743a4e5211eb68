//! Sessions: a namespace (JSON variables + replayable definitions), a
//! history, and a scratch directory that persist across cells.

use super::cell::{self, CellSpec, SessionView};
use super::result::{CellResult, ErrorKind, RunInfo, Status};
use super::{valid_var_name, CellRequest, Error, Inner, Language, Limits, Namespace, Policy};
use crate::protocol::{Definition, Done};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// How a session is configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    pub policy: Policy,
    pub limits: Limits,
    /// Sandbox profile name or path for every cell of this session
    /// (defaults to the supervisor's profile for the cell's language).
    pub profile: Option<String>,
    /// How Python cells keep the namespace (see [`PythonState`]).
    pub python_state: PythonState,
    /// Checkpoints a live Python session may keep at once.
    pub max_checkpoints: usize,
    /// Once a cell is over, start the worker of the session's next cell,
    /// in the language of that one (see [`Session::prepare_cell`]): the
    /// next cell then only sends its code. For sessions that run many
    /// cells, such as a server's named sessions; the worker waits, one of
    /// the session's processes, until a cell uses it or the session ends.
    /// A cell that comes while it is being started waits for it (up to 2 s).
    #[serde(skip)]
    pub prepare_next: bool,
    /// The budgets its calls draw from besides its own policy's (a
    /// principal's), and the tenant it is for: whose upstream connections
    /// and workspace its tool calls use, whose budget of held bytes it
    /// draws from. Not part of the configuration a file gives.
    #[serde(skip)]
    pub account: super::ledger::Account,
    /// Bytes the session may make the supervisor hold (see
    /// [`super::tenant`]): the JSON mirror of its namespace, its
    /// definitions, history and checkpoints' copies of them.
    pub max_held_bytes: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            policy: Policy::default(),
            limits: Limits::default(),
            profile: None,
            python_state: PythonState::default(),
            max_checkpoints: DEFAULT_MAX_CHECKPOINTS,
            prepare_next: false,
            account: Default::default(),
            max_held_bytes: super::DEFAULT_MAX_HELD_BYTES,
        }
    }
}

/// Checkpoints a live Python session keeps at most, by default.
pub const DEFAULT_MAX_CHECKPOINTS: usize = 4;

/// How a session's Python cells keep their namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PythonState {
    /// Every object stays alive in the session's sandboxed state process
    /// (forked per cell; a failed cell is rolled back whole). Where there
    /// are no warm zygotes or cgroups, cells fall back to `replay`. The
    /// supervisor restarting loses live objects (JSON variables and
    /// definitions are kept and replayed).
    #[default]
    Live,
    /// JSON variables are carried and definitions replayed in a fresh
    /// process per cell; other objects are dropped (and reported).
    Replay,
}

/// A checkpoint: an idle copy of the session's state process, and the
/// JSON mirror of its namespace at the time.
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct Checkpoint {
    state: Arc<super::live::StateProc>,
    vars: Arc<Namespace>,
    definitions: Vec<(Language, Definition)>,
    sizes: std::collections::BTreeMap<String, u64>,
    /// What it holds in the supervisor (its mirror and definitions,
    /// counted whole: the session's own copy parts from it at its next
    /// change).
    bytes: u64,
}

/// Entries a session's history keeps (the oldest go first).
pub const MAX_HISTORY: usize = 1000;
/// Bytes of a cell's code its history entry keeps.
pub const MAX_HISTORY_CODE_BYTES: usize = 1024;

/// One past cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub execution_count: u64,
    pub language: String,
    pub code: String,
    pub status: Status,
    pub run_id: String,
}

#[derive(Debug)]
struct State {
    /// The JSON namespace (a live session's mirror), shared with the cell
    /// that runs and the checkpoints until it changes: a session holding a
    /// large value does not copy it per cell.
    vars: Arc<Namespace>,
    /// Bytes each variable of `vars` takes in the supervisor.
    sizes: std::collections::BTreeMap<String, u64>,
    /// What the session holds in the supervisor (the namespace, its
    /// definitions, history, checkpoints' copies), charged to its budget
    /// and its tenant's; attached by [`Session::state`] (a session made
    /// ahead learns its tenant when it is handed to its cell).
    held: Option<super::tenant::Held>,
    definitions: Vec<(Language, Definition)>,
    history: Vec<HistoryEntry>,
    execution_count: u64,
    /// A live Python session's state process (see `super::live`), and the
    /// variables set from outside since its last cell.
    #[cfg(target_os = "linux")]
    live: Option<Arc<super::live::StateProc>>,
    #[cfg(target_os = "linux")]
    pending_vars: Namespace,
    #[cfg(target_os = "linux")]
    checkpoints: std::collections::BTreeMap<String, Checkpoint>,
    /// The state process the last cell's successor replaced, until it is
    /// ended (see `super::live::Retired`).
    #[cfg(target_os = "linux")]
    retired: super::live::Retired,
}

impl State {
    fn new(held: Option<super::tenant::Held>) -> State {
        State {
            vars: Arc::default(),
            sizes: Default::default(),
            held,
            definitions: Vec::new(),
            history: Vec::new(),
            execution_count: 0,
            #[cfg(target_os = "linux")]
            live: None,
            #[cfg(target_os = "linux")]
            pending_vars: Namespace::new(),
            #[cfg(target_os = "linux")]
            checkpoints: Default::default(),
            #[cfg(target_os = "linux")]
            retired: Default::default(),
        }
    }

    /// Bytes of the namespace's variables.
    fn vars_bytes(&self) -> u64 {
        self.sizes.values().sum()
    }

    /// Bytes of its definitions.
    fn definitions_bytes(&self) -> u64 {
        definitions_bytes(&self.definitions)
    }

    /// Bytes the session's state holds in the supervisor now.
    fn held_bytes(&self) -> u64 {
        let history: u64 = self.history.iter().map(history_bytes).sum();
        #[cfg(target_os = "linux")]
        let live = self.checkpoints.values().map(|c| c.bytes).sum::<u64>()
            + self
                .pending_vars
                .iter()
                .map(|(k, v)| super::tenant::var_bytes(k, v))
                .sum::<u64>();
        #[cfg(not(target_os = "linux"))]
        let live = 0;
        self.vars_bytes() + self.definitions_bytes() + history + live
    }

    /// Bring `sizes` up to date with `vars`: the `touched` names counted
    /// again, names gone dropped, names not counted yet counted.
    fn resize(&mut self, touched: &[String]) {
        let vars = &self.vars;
        self.sizes.retain(|k, _| vars.contains_key(k));
        for k in touched {
            if let Some(v) = vars.get(k) {
                self.sizes.insert(k.clone(), super::tenant::var_bytes(k, v));
            }
        }
        if self.sizes.len() != vars.len() {
            for (k, v) in vars.iter() {
                if !self.sizes.contains_key(k) {
                    self.sizes.insert(k.clone(), super::tenant::var_bytes(k, v));
                }
            }
        }
    }

    /// Charge what the state holds now, whatever the budget (it is held
    /// already; what comes next is checked against it).
    fn recharge(&mut self) {
        let bytes = self.held_bytes();
        if let Some(h) = self.held.as_mut() {
            h.force(bytes);
        }
    }

    /// Hold `total` bytes in all from now, or the error naming the budget
    /// it would pass (the charge then stays as it was).
    fn charge(&mut self, total: u64, what: &dyn Fn() -> String) -> Result<(), super::HeldError> {
        match self.held.as_mut() {
            Some(h) => h.set(total, what),
            None => Ok(()),
        }
    }
}

/// Bytes definitions take in the supervisor.
fn definitions_bytes(defs: &[(Language, Definition)]) -> u64 {
    defs.iter()
        .map(|(_, d)| {
            64 + d.source.len() as u64 + d.names.iter().map(|n| 24 + n.len() as u64).sum::<u64>()
        })
        .sum()
}

/// Bytes a history entry takes in the supervisor.
fn history_bytes(h: &HistoryEntry) -> u64 {
    (std::mem::size_of::<HistoryEntry>() + h.code.len() + h.language.len() + h.run_id.len()) as u64
}

/// At most a history entry's bytes (see [`MAX_HISTORY_CODE_BYTES`]).
const HISTORY_ENTRY_BYTES: u64 =
    (std::mem::size_of::<HistoryEntry>() + MAX_HISTORY_CODE_BYTES + 64 + 16) as u64;

struct SessionInner {
    /// Workers started ahead for its next cells (see
    /// [`Session::prepare_cell`]). First: fields drop in order, and they
    /// are ended before its scratch and groups are given back.
    prepared: std::sync::Mutex<Vec<cell::Prepared>>,
    /// The next cell to start a worker for (see [`Session::prepare_next`]).
    next: std::sync::Mutex<NextCell>,
    /// Told each time the task of [`Session::prepare_next`] has started a
    /// worker (or given up), and when it stops.
    next_done: tokio::sync::Notify,
    id: String,
    config: SessionConfig,
    scratch: Arc<super::scratch::Scratch>,
    /// Its cgroups (made at its first cell) and its budgets' ledger.
    share: Arc<super::tenancy::Share>,
    /// The ledgers its calls also draw from, and its tenant (see
    /// [`SessionConfig::account`]); set once, at its making or when a
    /// session prepared ahead is handed to its cell.
    account: std::sync::OnceLock<super::ledger::Account>,
    /// `emit` events of all the session's cells so far.
    emits: Arc<super::policy::EmitTally>,
    /// For a sub-agent's session: the run its cells hang beneath.
    parent: Option<RunInfo>,
    state: tokio::sync::Mutex<State>,
    /// The end of its last cell, when that cell was answered before its
    /// worker was gone (see [`Session::settled`]).
    tail: std::sync::Mutex<Option<cell::Tail>>,
    /// A live session's settling after its last cell (see
    /// `super::live::settle`), while it runs.
    #[cfg(target_os = "linux")]
    settling: std::sync::Mutex<Option<Settling>>,
    /// What a settling found, for the session's next result.
    #[cfg(target_os = "linux")]
    settled_notes: Arc<std::sync::Mutex<Vec<String>>>,
    /// Last: fields drop in order, and a session that holds the last
    /// reference to its supervisor gives its scratch and cgroups back
    /// before the supervisor removes the directories that hold them.
    sup: Arc<Inner>,
}

/// A live session's settling (see `super::live::settle`) under way: cancel
/// it with `cancel`; `over` is cancelled once it has stopped.
#[cfg(target_os = "linux")]
struct Settling {
    cancel: tokio_util::sync::CancellationToken,
    over: tokio_util::sync::CancellationToken,
}

/// What [`Session::prepare_next`] was last asked for, and whether a task
/// is on it (one at a time, so cells in quick succession leave one worker
/// waiting, for the latest).
#[derive(Default)]
struct NextCell {
    wanted: Option<(Language, Limits)>,
    /// What the task is starting a worker for now.
    doing: Option<(Language, Limits)>,
    busy: bool,
}

impl NextCell {
    /// Whether a worker for a `language` cell with `limits` is asked for
    /// or being started.
    fn coming(&self, language: Language, limits: &Limits) -> bool {
        self.busy
            && [&self.wanted, &self.doing]
                .into_iter()
                .flatten()
                .any(|(l, lim)| *l == language && lim == limits)
    }
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        let prepared = std::mem::take(&mut *crate::util::lock(&self.prepared));
        if prepared.is_empty() {
            return;
        }
        // Ending a worker started ahead may wait for it to be gone: on a
        // runtime, that is done on a blocking thread. The session's scratch
        // and groups are held until then, and given back after (in their
        // order as fields), so no other session gets them while it lives.
        let after = (self.scratch.clone(), self.share.clone(), self.sup.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || {
                    drop(prepared);
                    drop(after);
                });
            }
            Err(_) => drop(prepared),
        }
    }
}

/// How long after a cell's result the next cell's worker is started (see
/// [`SessionConfig::prepare_next`]): its fork and sandboxing would
/// otherwise compete with handing the result on.
const PREPARE_AFTER: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a cell waits for a worker being started ahead for it (see
/// `Session::worker_coming`) before it starts its own.
const WAIT_FOR_COMING: std::time::Duration = std::time::Duration::from_secs(2);

/// A sequence of cells sharing a namespace. Cells of one session run one
/// at a time; clone the handle freely.
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(sup: Arc<Inner>, config: SessionConfig) -> Result<Session, Error> {
        Self::beneath(sup, config, None)
    }

    /// A session whose cells are children of `parent` in the run tree (a
    /// sub-agent's), at its depth.
    pub(crate) fn beneath(
        sup: Arc<Inner>,
        mut config: SessionConfig,
        parent: Option<RunInfo>,
    ) -> Result<Session, Error> {
        let account = std::sync::OnceLock::new();
        let given = std::mem::take(&mut config.account);
        if given != super::ledger::Account::default() {
            let _ = account.set(given);
        }
        let share = Arc::new(super::tenancy::Share::new(&config.policy));
        // Made when a cell first needs it.
        let scratch = Arc::new(super::scratch::Scratch::new(
            super::scratch::Parent::Supervisor(sup.clone()),
            "cellbox-",
        ));
        Ok(Session {
            inner: Arc::new(SessionInner {
                prepared: std::sync::Mutex::new(Vec::new()),
                next: Default::default(),
                next_done: tokio::sync::Notify::new(),
                id: cell::new_run_id(),
                sup,
                config,
                scratch,
                share,
                account,
                emits: Default::default(),
                parent,
                state: tokio::sync::Mutex::new(State::new(None)),
                tail: std::sync::Mutex::new(None),
                #[cfg(target_os = "linux")]
                settling: std::sync::Mutex::new(None),
                #[cfg(target_os = "linux")]
                settled_notes: Default::default(),
            }),
        })
    }

    /// Model queries, sub-agents, tool calls, tokens and cost of the
    /// session's cells so far (its agent loop's own queries included).
    pub fn model_usage(&self) -> super::ModelUsage {
        self.inner.share.models.used()
    }

    /// The ledgers a query made on the session's behalf outside its cells
    /// (an agent loop's own turns) is charged to: its account's and its
    /// own, so that its cells' budgets are what is left after them.
    pub(crate) fn chain(&self) -> super::ledger::Chain {
        self.account().chain.then([self.inner.share.models.clone()])
    }

    /// The session's account (see [`SessionConfig::account`]).
    pub(crate) fn account(&self) -> &super::ledger::Account {
        self.inner
            .account
            .get()
            .unwrap_or(&super::ledger::NO_ACCOUNT)
    }

    /// Give a session that has none its account (a session prepared ahead,
    /// handed to the cell of a principal); false when it has one already.
    pub(crate) fn bind_account(&self, account: super::ledger::Account) -> bool {
        if account == super::ledger::Account::default() {
            return self.inner.account.get().is_none();
        }
        self.inner.account.set(account).is_ok()
    }

    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub fn config(&self) -> &SessionConfig {
        &self.inner.config
    }

    /// The session's persistent scratch directory (host path), made now if
    /// no cell has needed it yet.
    pub fn scratch_dir(&self) -> Result<&std::path::Path, Error> {
        self.inner.scratch.path().map_err(|source| Error::Io {
            what: "create the session's scratch directory".into(),
            source,
        })
    }

    /// Run one cell. A cell that does not end `ok` changes nothing in the
    /// namespace.
    pub async fn run(&self, request: CellRequest) -> CellResult {
        let language = request.language;
        let limits = self.inner.config.limits.tighten(&request.limits);
        let next = self.inner.config.prepare_next.then(|| limits.clone());
        self.worker_coming(language, &limits).await;
        let result = self.run_one(request, limits).await;
        if let Some(limits) = next {
            self.prepare_next(language, limits);
        }
        result
    }

    /// Start the worker of the session's next `language` cell, with the
    /// `limits` of this one, in the background, shortly after this one's
    /// result (see [`SessionConfig::prepare_next`]). One task at a time
    /// does it, for the latest cell asked; a session let go meanwhile gets
    /// none.
    fn prepare_next(&self, language: Language, limits: Limits) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut next = crate::util::lock(&self.inner.next);
            next.wanted = Some((language, limits));
            if next.busy {
                return;
            }
            next.busy = true;
        }
        let session = Arc::downgrade(&self.inner);
        rt.spawn(async move {
            tokio::time::sleep(PREPARE_AFTER).await;
            while let Some(inner) = session.upgrade() {
                let wanted = {
                    let mut next = crate::util::lock(&inner.next);
                    let wanted = next.wanted.take();
                    next.busy = wanted.is_some();
                    next.doing.clone_from(&wanted);
                    wanted
                };
                let Some((language, limits)) = wanted else {
                    inner.next_done.notify_waiters();
                    return;
                };
                let session = Session { inner };
                session.prepare_cell_with(language, limits).await;
                crate::util::lock(&session.inner.next).doing = None;
                session.inner.next_done.notify_waiters();
            }
        });
    }

    /// Wait (up to [`WAIT_FOR_COMING`]) while a worker that fits a
    /// `language` cell with `limits` is being started ahead: a cell that
    /// comes in quick succession after the one before then uses it, with
    /// the session's variables it was sent, rather than starting another
    /// beside it. That other would send a session that holds large values
    /// whole with its code, competing for the CPU with the one started
    /// ahead, and leave it waiting with variables no longer the session's.
    async fn worker_coming(&self, language: Language, limits: &Limits) {
        let done = self.inner.next_done.notified();
        tokio::pin!(done);
        // Told from here on, even before this is awaited.
        done.as_mut().enable();
        if crate::util::lock(&self.inner.next).coming(language, limits) {
            let _ = tokio::time::timeout(WAIT_FOR_COMING, done).await;
        }
    }

    /// Resolves once the session's last cell is wholly over. A cell is
    /// answered as soon as its worker has said `done` (and what it used
    /// has been read from it); its worker's exit, its reaping and the end
    /// of its process tree follow. The session's next cell waits for them
    /// before it starts; wait here to see them done before anything else
    /// (e.g. to count what is left of the session's processes).
    pub async fn settled(&self) {
        if let Some(t) = self.tail() {
            t.wait().await;
        }
        // A live session's settling after its cell (its spare forked, it
        // frozen), without cutting it short.
        #[cfg(target_os = "linux")]
        {
            let over = crate::util::lock(&self.inner.settling)
                .as_ref()
                .map(|s| s.over.clone());
            if let Some(over) = over {
                over.cancelled().await;
            }
        }
    }

    /// Stop a live session's settling, if it runs (what it has not done
    /// yet is left undone: the spare not asked for, the session not
    /// frozen), and with `thaw`, let the session's processes run again,
    /// for a cell or a request to its state process.
    #[cfg(target_os = "linux")]
    async fn wake(&self, thaw: bool) {
        let settling = crate::util::lock(&self.inner.settling).take();
        if let Some(s) = settling {
            s.cancel.cancel();
            s.over.cancelled().await;
        }
        if !thaw {
            return;
        }
        if let Some(g) = self.made_group() {
            if let Err(e) = g.thaw() {
                tracing::warn!("a session could not be thawed: {e}");
            }
        }
    }

    /// The session's group (made now if no cell has made it yet; none
    /// where the supervisor has no groups).
    #[cfg(target_os = "linux")]
    fn made_group(&self) -> Option<Arc<crate::sandbox::linux::groups::SessionGroup>> {
        self.inner
            .share
            .session(&self.inner.sup, &self.inner.config.limits)
    }

    /// Settle the live session after a cell or a change of its state
    /// processes (see `super::live::settle`): on a task of its own when
    /// `background` (the next cell cancels what is left of it), else
    /// here. What it found goes in the next result's notes and the events.
    #[cfg(target_os = "linux")]
    async fn settle(&self, state: &State, run: &RunInfo, background: bool) {
        let Some(group) = self.made_group() else {
            return;
        };
        let keep: Vec<i32> = state
            .checkpoints
            .values()
            .map(|c| c.state.host_pid())
            .collect();
        let cancel = tokio_util::sync::CancellationToken::new();
        let over = tokio_util::sync::CancellationToken::new();
        let work = {
            let (current, retired) = (state.live.clone(), state.retired.clone());
            let (cancel, over) = (cancel.clone(), over.clone());
            let notes = self.inner.settled_notes.clone();
            let sup = self.inner.sup.clone();
            let (run, session_id) = (run.clone(), self.inner.id.clone());
            async move {
                let _over = over.drop_guard();
                let s = super::live::settle(group, current, keep, retired, cancel).await;
                let mut notes = crate::util::lock(&notes);
                if s.killed > 0 {
                    notes.push(format!(
                        "{} process(es) of the session that were neither its state process \
                         nor its spare were killed after the previous cell",
                        s.killed
                    ));
                    sup.events.record(
                        "session_processes_killed",
                        &run,
                        serde_json::json!({"session_id": session_id, "killed": s.killed,
                                           "when": "between_cells"}),
                    );
                }
                if let Some(e) = s.error {
                    tracing::warn!("a live session could not be settled between cells: {e}");
                    notes.push(format!(
                        "the session could not be frozen after the previous cell: {e}"
                    ));
                }
                if let Some(why) = s.no_spare {
                    tracing::debug!("a live session has no spare for its next cell: {why}");
                }
            }
        };
        if background {
            *crate::util::lock(&self.inner.settling) = Some(Settling { cancel, over });
            tokio::spawn(work);
        } else {
            work.await;
        }
    }

    /// Let go of this handle, ending the workers started ahead for the
    /// session's next cells here, on this thread, rather than on a
    /// blocking thread of their own as a dropped session does: when this
    /// is the last handle, the session is wholly gone (its scratch and
    /// groups given back) once this returns. For a blocking thread, as
    /// it may wait for those workers to go.
    pub(crate) fn end_prepared_here(self) {
        let prepared = std::mem::take(&mut *crate::util::lock(&self.inner.prepared));
        drop(prepared);
    }

    /// The end of the session's last cell, while it is not over.
    pub(crate) fn tail(&self) -> Option<cell::Tail> {
        let mut tail = crate::util::lock(&self.inner.tail);
        if tail.as_ref().is_some_and(cell::Tail::is_over) {
            *tail = None;
        }
        tail.clone()
    }

    /// [`Session::run`] with the session's limits tightened by the call's.
    async fn run_one(&self, request: CellRequest, limits: Limits) -> CellResult {
        let mut state = self.state().await;
        self.settled().await;
        state.execution_count += 1;
        let count = state.execution_count;
        let mut run = match &self.inner.parent {
            Some(p) => RunInfo {
                run_id: cell::new_run_id(),
                parent_run_id: Some(p.run_id.clone()),
                root_run_id: p.root_run_id.clone(),
                depth: p.depth,
                request_id: p.request_id.clone(),
            },
            None => RunInfo::root(),
        };
        if request.request_id.is_some() {
            run.request_id = request.request_id.clone();
        }
        if let Some(problem) = code_problem(request.language, &request.code, &limits) {
            let mut r = CellResult::refused_with(
                request.language.as_str(),
                run,
                ErrorKind::UsageError,
                problem,
            );
            r.execution_count = count;
            self.push_history(&mut state, &request, &r);
            return r;
        }
        let definitions = state
            .definitions
            .iter()
            .filter(|(l, _)| *l == request.language)
            .map(|(_, d)| d.clone())
            .collect();
        // (None for a live Python cell: none is prepared in a live session.)
        let prepared = self.take_prepared(request.language, &limits);
        let spec = CellSpec::new(
            self.view(),
            run.clone(),
            request.language,
            request.code.clone(),
        )
        .vars(state.vars.clone())
        .definitions(definitions)
        .limits(limits)
        .forward(request.forward)
        .cancel(request.cancel.clone())
        .output(request.output.clone())
        .execution_count(count);
        #[cfg(target_os = "linux")]
        let live = self.live_cell(&mut state, request.language, &run);
        #[cfg(target_os = "linux")]
        if live.is_some() {
            // Its processes run again for the cell (frozen since the last).
            self.wake(true).await;
            state.retired.now();
        }
        #[cfg(target_os = "linux")]
        let spec = spec.live(live.clone());
        let (mut result, done, tail) = cell::run_with(self.inner.sup.clone(), spec, prepared).await;
        if tail.is_some() {
            *crate::util::lock(&self.inner.tail) = tail;
        }
        #[cfg(target_os = "linux")]
        result
            .notes
            .extend(crate::util::lock(&self.inner.settled_notes).drain(..));
        #[cfg(target_os = "linux")]
        if let Some(live) = live {
            self.after_live(&mut state, &live, done.as_deref(), &mut result)
                .await;
            self.settle(&state, &result.run, true).await;
            self.push_history(&mut state, &request, &result);
            return result;
        }
        if result.status == Status::Ok && !request.language.is_shell() {
            if let Some(done) = done.filter(|d| admit_carried(&mut state, d, &mut result)) {
                apply(&mut state, request.language, &done, &mut result);
                // Variables are shared across languages: a live Python
                // namespace gets another language's new values next.
                #[cfg(target_os = "linux")]
                if state.live.is_some() {
                    for k in &result.vars.changed {
                        if let Some(v) = state.vars.get(k).cloned() {
                            state.pending_vars.insert(k.clone(), v);
                        }
                    }
                }
            }
        }
        self.push_history(&mut state, &request, &result);
        result
    }

    /// What a Python cell of a live session takes to its launch.
    #[cfg(target_os = "linux")]
    fn live_cell(
        &self,
        state: &mut State,
        language: Language,
        run: &RunInfo,
    ) -> Option<Arc<super::live::LiveCell>> {
        let sup = &self.inner.sup;
        let usable = language == Language::Python
            && self.inner.config.python_state == PythonState::Live
            && sup.pools.is_some()
            && sup.groups.is_some()
            && sup.sandbox_exec.is_none();
        if !usable {
            return None;
        }
        let mut lost = None;
        if let Some(dead) = state.live.as_ref().filter(|s| s.is_dead()) {
            // Lost (its zygote or its first state process gone, or it broke
            // its protocol and was killed): the next state process is
            // seeded from the JSON mirror.
            lost = Some(dead.violation());
            state.live = None;
        }
        let checkpoints = state
            .checkpoints
            .values()
            .map(|c| c.state.host_pid())
            .collect();
        let cell = super::live::LiveCell {
            pending_vars: std::mem::take(&mut state.pending_vars),
            checkpoints,
            ..Default::default()
        };
        match lost {
            Some(Some(why)) => {
                cell.note(format!(
                    "the session's state process broke its protocol ({why}) and was killed: \
                     its live objects are lost; its JSON variables and definitions were restored"
                ));
                self.record_violation(run, &why);
            }
            Some(None) => cell.note(
                "the session's live namespace was lost (its state process ended): \
                 its JSON variables and definitions were restored, other objects are gone",
            ),
            None => {}
        }
        *crate::util::lock(&cell.state) = state.live.clone();
        Some(Arc::new(cell))
    }

    /// Fold a live cell into the session: its state process kept or rolled
    /// back, the JSON mirror of its namespace, its checkpoint or restore.
    #[cfg(target_os = "linux")]
    async fn after_live(
        &self,
        state: &mut State,
        live: &super::live::LiveCell,
        done: Option<&Done>,
        result: &mut CellResult,
    ) {
        use super::result::StateOutcome;
        use crate::util::lock;
        use std::sync::atomic::Ordering::SeqCst;
        let ran_live = live.running.load(SeqCst);
        let kept = lock(&live.kept).take();
        result.notes.extend(lock(&live.notes).drain(..));
        let previous = lock(&live.state).take();
        if !ran_live {
            // It ran in a process of its own: the carried namespace is the
            // truth now, and a state process (if any) is out of date.
            state.live = None;
            if result.status == Status::Ok {
                if let Some(done) = done.filter(|d| admit_carried(state, d, result)) {
                    apply(state, Language::Python, done, result);
                }
            }
            return;
        }
        let live_done = done.and_then(|d| d.live.as_ref().map(|l| (d, l)));
        // A cell can kill its session's state processes (they share its
        // uid and Landlock domain): what it left is ended by now, so a
        // successor that is not gone yet is not going (see `gone`).
        let killed = kept.as_ref().is_some_and(|k| k.gone());
        let kept_violation = kept.as_ref().and_then(|k| k.violation());
        let previous_gone = previous.as_ref().is_some_and(|p| p.gone());
        let kept = kept.filter(|_| !killed);
        // What the mirror can take of the namespace the cell left; a cell
        // whose definitions alone pass the budget is not kept.
        let mut left_out = Vec::new();
        if let (true, Some(_), Some((done, report))) =
            (result.status == Status::Ok, &kept, live_done)
        {
            match admit_live(state, done, report) {
                Ok(names) => left_out = names,
                Err(e) => result.fail_with(
                    ErrorKind::LimitExceeded,
                    format!("{e}; the cell's namespace was not kept"),
                ),
            }
        }
        match (result.status == Status::Ok, kept, live_done) {
            (true, Some(next), Some((done, report))) => {
                state.live = Some(next);
                // Ended after the result is handed back (unless a
                // checkpoint holds it).
                if let Some(p) = previous {
                    state.retired.later(p);
                }
                result.state = Some(StateOutcome::Kept);
                if previous_gone {
                    result.notes.push(
                        "the state process this cell was forked from was killed while it ran \
                         (its exit status is not known); the namespace the cell left is kept"
                            .to_owned(),
                    );
                }
                apply_live(state, done, report, result, &left_out);
                if !left_out.is_empty() {
                    result.notes.push(format!(
                        "not kept in the server's copy of the namespace (it would hold more than \
                         the session's max_held_bytes): {}; they live on in the session's state \
                         process, but cells of other languages do not see them and they are lost \
                         if that process is",
                        left_out.join(", ")
                    ));
                }
                if report.threads > 0 {
                    result.notes.push(format!(
                        "{} thread(s) still ran when the cell ended: they do not survive into the next cell",
                        report.threads
                    ));
                }
                if let Some(name) = &report.checkpoint {
                    if let Err(e) = self.checkpoint_in(state, name).await {
                        result
                            .notes
                            .push(format!("checkpoint {name:?} was not made: {e}"));
                    }
                }
                if let Some(name) = &report.restore {
                    match self.restore_in(state, name).await {
                        Ok(()) => result.state = Some(StateOutcome::Restored),
                        Err(e) => result.notes.push(format!("{e}")),
                    }
                }
            }
            _ => {
                result.state = Some(StateOutcome::RolledBack);
                if previous_gone {
                    result.notes.push(
                        "the session's state process was killed while the cell ran \
                         (by the cell or what it started): its live objects are lost; \
                         the next cell is seeded from the JSON variables and definitions \
                         from before this cell"
                            .to_owned(),
                    );
                    state.live = None;
                    return;
                }
                let broke = kept_violation.filter(|_| killed);
                if let Some(why) = &broke {
                    result.notes.push(format!(
                        "the cell's namespace could not be kept: the state process it left \
                         broke its protocol ({why}) and was killed; the session's state is the \
                         one before it"
                    ));
                    self.record_violation(&result.run, why);
                } else if killed {
                    result.notes.push(
                        "the cell's namespace could not be kept (the state process it \
                         left was killed); the session's state is the one before it"
                            .to_owned(),
                    );
                }
                if live.fresh.load(SeqCst) {
                    // The new state process never got the namespace the
                    // cell's start frame seeded: the next cell seeds one.
                    state.live = None;
                } else {
                    state.live = previous;
                }
            }
        }
    }

    /// Record in the events that one of the session's state processes
    /// broke its protocol (and was killed for it).
    #[cfg(target_os = "linux")]
    fn record_violation(&self, run: &RunInfo, why: &str) {
        self.inner.sup.events.record(
            "state_protocol_error",
            run,
            serde_json::json!({"session_id": self.inner.id, "error": why}),
        );
    }

    /// Keep a checkpoint of the live namespace as it is now.
    #[cfg(target_os = "linux")]
    async fn checkpoint_in(&self, state: &mut State, name: &str) -> Result<(), Error> {
        valid_checkpoint_name(name)?;
        let Some(current) = state.live.clone().filter(|s| !s.is_dead()) else {
            return Err(Error::Checkpoint(
                "the session has no live Python namespace yet (run a Python cell first)".into(),
            ));
        };
        let max = self.inner.config.max_checkpoints;
        if !state.checkpoints.contains_key(name) && state.checkpoints.len() >= max {
            return Err(Error::Checkpoint(format!(
                "the session already keeps {max} checkpoints (max_checkpoints): restore or drop one first"
            )));
        }
        // Its copy of the mirror and definitions is charged before it is
        // made (one it replaces is given back).
        let bytes = state.vars_bytes() + state.definitions_bytes();
        let replaced = state.checkpoints.get(name).map_or(0, |c| c.bytes);
        let total = state.held_bytes() - replaced + bytes;
        state.charge(total, &|| format!("checkpoint {name:?}"))?;
        let copy = match current.copy().await {
            Ok(c) => c,
            Err(e) => {
                state.recharge();
                return Err(Error::Checkpoint(e));
            }
        };
        state.checkpoints.insert(
            name.to_owned(),
            Checkpoint {
                state: copy,
                vars: state.vars.clone(),
                definitions: state.definitions.clone(),
                sizes: state.sizes.clone(),
                bytes,
            },
        );
        state.recharge();
        Ok(())
    }

    /// Make a copy of checkpoint `name` the session's live namespace.
    #[cfg(target_os = "linux")]
    async fn restore_in(&self, state: &mut State, name: &str) -> Result<(), Error> {
        let Some(cp) = state.checkpoints.get(name) else {
            let known: Vec<&str> = state.checkpoints.keys().map(String::as_str).collect();
            return Err(Error::Checkpoint(format!(
                "no checkpoint named {name:?} (the session has {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        };
        if cp.state.gone() {
            state.checkpoints.remove(name);
            return Err(Error::Checkpoint(format!(
                "checkpoint {name:?} is gone: its process was killed (by a cell of the session) \
                 and it has been dropped; the session's state is unchanged"
            )));
        }
        let copy = cp.state.copy().await.map_err(|e| {
            Error::Checkpoint(format!("checkpoint {name:?} could not be restored: {e}"))
        })?;
        state.vars = cp.vars.clone();
        state.definitions = cp.definitions.clone();
        state.sizes = cp.sizes.clone();
        state.pending_vars.clear();
        state.live = Some(copy);
        state.recharge();
        Ok(())
    }

    /// Make now what the session's first cell would otherwise make: its
    /// scratch directory (its tmpfs mounted) and its cgroup, so that a
    /// session made ahead of its first cell does not make them on that
    /// cell's path. Whatever cannot be made now is made (or reported) by
    /// the cell that needs it.
    pub fn prepare(&self) {
        if let Err(e) = self.scratch_dir() {
            tracing::debug!("a session prepared ahead has no scratch yet: {e}");
        }
        #[cfg(target_os = "linux")]
        let _ = self
            .inner
            .share
            .session(&self.inner.sup, &self.inner.config.limits);
    }

    /// Start the worker of the session's next `language` cell now (see
    /// `cell::prepared`), unless one is waiting already: that cell then
    /// only sends its code. It fits a cell with the session's own limits
    /// (none tightened by the call). Nothing is prepared for a live Python
    /// session (its cells are forked from its state process) or for
    /// programs; a worker that cannot be started now is started by the
    /// cell. Whether one is waiting now.
    ///
    /// A worker prepared and never used is ended with the session (on a
    /// blocking thread when the session is let go on a runtime).
    pub async fn prepare_cell(&self, language: Language) -> bool {
        self.prepare_cell_with(language, self.inner.config.limits.clone())
            .await
    }

    /// [`Session::prepare_cell`] for a cell with `limits` (the session's,
    /// tightened by a call's). A worker of that language waiting for other
    /// limits, sent variables the session no longer holds, or gone is ended
    /// first, so that a session whose calls ask for other limits each time
    /// keeps one at most.
    async fn prepare_cell_with(&self, language: Language, limits: Limits) -> bool {
        let live_python =
            language == Language::Python && self.inner.config.python_state == PythonState::Live;
        if live_python || language.is_shell() {
            return false;
        }
        // Its variables as they are now go with it (a Rhai worker gets them
        // ahead); none while a cell of the session runs, which may change
        // them.
        let vars = match self.inner.state.try_lock() {
            Ok(state) if language == Language::Rhai => Some(state.vars.clone()),
            Ok(_) => Some(Arc::default()),
            Err(_) => None,
        };
        let stale: Vec<cell::Prepared> = {
            let mut ready = crate::util::lock(&self.inner.prepared);
            // One waiting with variables the session no longer has (sent
            // before `set_var`, or before a cell that did not use it) is
            // ended and started again with these.
            let current = |p: &cell::Prepared| vars.as_ref().is_none_or(|v| !p.holds_other(v));
            if ready
                .iter()
                .any(|p| p.fits(language, &limits) && p.waiting() && current(p))
            {
                return true;
            }
            let (stale, keep) = std::mem::take(&mut *ready)
                .into_iter()
                .partition(|p| p.language() == language);
            *ready = keep;
            stale
        };
        if !stale.is_empty() {
            // Ending them may wait for them to be gone.
            let _ = tokio::task::spawn_blocking(move || drop(stale)).await;
        }
        let spec = CellSpec::new(self.view(), RunInfo::root(), language, String::new())
            .limits(limits)
            .vars(vars.unwrap_or_default());
        let Some(p) = cell::prepare(self.inner.sup.clone(), spec).await else {
            return false;
        };
        crate::util::lock(&self.inner.prepared).push(p);
        true
    }

    /// Whether a worker waiting for the session's next `language` cell
    /// holds the session's variables as they are now (a Rhai worker gets
    /// them ahead: that cell then sends only its code).
    pub async fn next_cell_has_vars(&self, language: Language) -> bool {
        let vars = self.inner.state.lock().await.vars.clone();
        crate::util::lock(&self.inner.prepared)
            .iter()
            .any(|p| p.language() == language && p.waiting() && p.holds(&vars))
    }

    /// A prepared worker for a `language` cell with `limits`, if one is
    /// waiting (one that ended meanwhile stays, to be dropped with the
    /// session: dropping it may wait).
    fn take_prepared(&self, language: Language, limits: &Limits) -> Option<cell::Prepared> {
        let mut ready = crate::util::lock(&self.inner.prepared);
        let i = ready
            .iter()
            .position(|p| p.fits(language, limits) && p.waiting())?;
        Some(ready.swap_remove(i))
    }

    /// Keep a checkpoint named `name` of the session's live Python
    /// namespace (a copy of its state process, bounded by
    /// `max_checkpoints`; the same name replaces the older one).
    pub async fn checkpoint(&self, name: &str) -> Result<(), Error> {
        #[cfg(target_os = "linux")]
        {
            let mut state = self.state().await;
            self.settled().await;
            self.wake(true).await;
            let made = self.checkpoint_in(&mut state, name).await;
            self.settle(&state, &RunInfo::root(), false).await;
            made
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Err(Error::Checkpoint("checkpoints need Linux".into()))
        }
    }

    /// Return the session's live Python namespace to checkpoint `name` (the
    /// checkpoint stays, for another restore).
    pub async fn restore(&self, name: &str) -> Result<(), Error> {
        #[cfg(target_os = "linux")]
        {
            let mut state = self.state().await;
            self.settled().await;
            self.wake(true).await;
            let restored = self.restore_in(&mut state, name).await;
            self.settle(&state, &RunInfo::root(), false).await;
            restored
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Err(Error::Checkpoint("checkpoints need Linux".into()))
        }
    }

    /// The names of the session's checkpoints.
    pub async fn checkpoints(&self) -> Vec<String> {
        #[cfg(target_os = "linux")]
        {
            self.inner
                .state
                .lock()
                .await
                .checkpoints
                .keys()
                .cloned()
                .collect()
        }
        #[cfg(not(target_os = "linux"))]
        Vec::new()
    }

    /// Whether the session's Python namespace is alive in a state process.
    pub async fn is_live(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.inner
                .state
                .lock()
                .await
                .live
                .as_ref()
                .is_some_and(|s| !s.is_dead())
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Memory the session holds now (its processes, live namespaces and
    /// checkpoints, and its files' pages), where it has a cgroup.
    pub fn memory_bytes(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            self.inner.share.memory_bytes()
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Call one capability directly (the REPL's `:call`), through the same
    /// policy, schema and budget checks as a script's call: it runs as a tiny
    /// Rhai cell that leaves the namespace untouched.
    pub async fn call(&self, cap: &str, args: serde_json::Map<String, Value>) -> CellResult {
        if !crate::supervisor::is_capability_name(cap) {
            return CellResult::refused_with(
                "rhai",
                RunInfo::root(),
                ErrorKind::UsageError,
                format!("{cap:?} is not a capability name"),
            );
        }
        let _state = self.inner.state.lock().await;
        self.settled().await;
        let mut vars = Namespace::new();
        vars.insert("__call_args".into(), Value::Object(args));
        let code = format!("invoke({cap:?}, __call_args)");
        let spec = CellSpec::new(self.view(), RunInfo::root(), Language::Rhai, code).vars(vars);
        cell::run(self.inner.sup.clone(), spec).await.0
    }

    /// Run a program under the sandbox (no namespace).
    pub(crate) async fn exec(
        &self,
        argv: Vec<String>,
        env: crate::protocol::ExecEnv,
        forward_output: super::Forward,
    ) -> CellResult {
        let mut state = self.inner.state.lock().await;
        self.settled().await;
        state.execution_count += 1;
        if let Some(problem) = argv_error(&argv) {
            let mut r =
                CellResult::refused_with("shell", RunInfo::root(), ErrorKind::UsageError, problem);
            r.execution_count = state.execution_count;
            return r;
        }
        let code = argv.join(" ");
        let spec = CellSpec::new(self.view(), RunInfo::root(), Language::Shell, code)
            .argv(argv)
            .env(env)
            .forward(forward_output)
            .execution_count(state.execution_count);
        cell::run(self.inner.sup.clone(), spec).await.0
    }

    /// What its cells have of it.
    fn view(&self) -> SessionView<'_> {
        let inner = &self.inner;
        SessionView {
            id: &inner.id,
            limits: &inner.config.limits,
            policy: &inner.config.policy,
            profile: inner.config.profile.as_deref(),
            emits: &inner.emits,
            scratch: &inner.scratch,
            share: &inner.share,
            account: self.account(),
        }
    }

    /// Keep a cell in the history: its code's first
    /// [`MAX_HISTORY_CODE_BYTES`], the last [`MAX_HISTORY`] cells. Then
    /// charge what the state holds.
    fn push_history(&self, state: &mut State, request: &CellRequest, result: &CellResult) {
        let mut end = request.code.len().min(MAX_HISTORY_CODE_BYTES);
        while !request.code.is_char_boundary(end) {
            end -= 1;
        }
        let mut code = request.code[..end].to_owned();
        if end < request.code.len() {
            code.push_str("\n[...]");
        }
        if state.history.len() >= MAX_HISTORY {
            let over = state.history.len() + 1 - MAX_HISTORY;
            state.history.drain(..over);
        }
        state.history.push(HistoryEntry {
            execution_count: result.execution_count,
            language: request.language.as_str().to_owned(),
            code,
            status: result.status,
            run_id: result.run.run_id.clone(),
        });
        state.recharge();
    }

    /// The names of the namespace's variables (without copying values).
    pub async fn var_names(&self) -> Vec<String> {
        self.inner.state.lock().await.vars.keys().cloned().collect()
    }

    /// The current namespace variables.
    pub async fn vars(&self) -> Namespace {
        Namespace::clone(&self.inner.state.lock().await.vars)
    }

    /// Names defined by carried definitions (functions, classes, imports).
    pub async fn definitions(&self) -> Vec<(String, Vec<String>)> {
        self.inner
            .state
            .lock()
            .await
            .definitions
            .iter()
            .map(|(l, d)| (l.as_str().to_owned(), d.names.clone()))
            .collect()
    }

    /// Set one variable.
    pub async fn set_var(&self, name: &str, value: Value) -> Result<(), Error> {
        if !valid_var_name(name) {
            return Err(Error::BadVarName(name.to_owned()));
        }
        let mut state = self.state().await;
        let bytes = super::tenant::var_bytes(name, &value);
        #[cfg(target_os = "linux")]
        let twice = if state.live.is_some() { bytes } else { 0 };
        #[cfg(not(target_os = "linux"))]
        let twice = 0;
        let old = state.sizes.get(name).copied().unwrap_or(0);
        let total = state.held_bytes() - old + bytes + twice;
        state.charge(total, &|| format!("the variable {name}"))?;
        remove_definition_names(&mut state, &[name.to_owned()]);
        #[cfg(target_os = "linux")]
        if state.live.is_some() {
            state.pending_vars.insert(name.to_owned(), value.clone());
        }
        Arc::make_mut(&mut state.vars).insert(name.to_owned(), value);
        state.resize(&[name.to_owned()]);
        state.recharge();
        Ok(())
    }

    pub async fn get_var(&self, name: &str) -> Option<Value> {
        self.inner.state.lock().await.vars.get(name).cloned()
    }

    pub async fn history(&self) -> Vec<HistoryEntry> {
        self.inner.state.lock().await.history.clone()
    }

    pub async fn execution_count(&self) -> u64 {
        self.inner.state.lock().await.execution_count
    }

    /// Forget every variable and definition (the history and scratch
    /// directory's files stay).
    pub async fn reset(&self) {
        let mut state = self.state().await;
        state.vars = Arc::default();
        state.sizes.clear();
        state.definitions.clear();
        #[cfg(target_os = "linux")]
        {
            // Its state processes are killed (frozen or not); it stays
            // frozen, with its checkpoints.
            self.wake(false).await;
            state.retired.now();
            state.live = None;
            state.pending_vars.clear();
        }
        state.recharge();
    }

    /// Bytes the session holds in the supervisor now (see
    /// [`super::tenant`]), and its budget.
    pub async fn held_bytes(&self) -> (u64, u64) {
        let state = self.state().await;
        let held = state.held.as_ref();
        (
            held.map_or(0, |h| h.bytes()),
            held.map_or(self.inner.config.max_held_bytes, |h| h.ledger().max()),
        )
    }

    /// The session's state, locked, with its budget of held bytes
    /// attached (within its tenant's, known by now).
    async fn state(&self) -> tokio::sync::MutexGuard<'_, State> {
        let mut state = self.inner.state.lock().await;
        if state.held.is_none() {
            let ledger = super::tenant::Ledger::within(
                self.account().tenant.as_ref().map(|t| t.ledger().clone()),
                "the session",
                "max_held_bytes",
                self.inner.config.max_held_bytes,
            );
            state.held = Some(super::tenant::Held::empty(ledger));
        }
        state
    }
}

/// Why `code` cannot run as a `language` cell under `limits`, if it cannot.
pub(crate) fn code_problem(language: Language, code: &str, limits: &Limits) -> Option<String> {
    if code.len() > limits.max_script_bytes {
        return Some(format!(
            "the script is {} bytes, over the limit of {} bytes (max_script_bytes)",
            code.len(),
            limits.max_script_bytes
        ));
    }
    language.code_error(code)
}

/// Why `argv` cannot be executed, if it cannot: its arguments are C strings.
pub(crate) fn argv_error(argv: &[String]) -> Option<String> {
    argv.iter().enumerate().find_map(|(n, a)| {
        a.find('\0').map(|at| {
            format!(
                "argument {n} of the program contains a NUL byte (at byte {at}): \
                 program arguments are C strings"
            )
        })
    })
}

fn remove_definition_names(state: &mut State, names: &[String]) {
    for (_, d) in state.definitions.iter_mut() {
        d.names.retain(|n| !names.contains(n));
    }
    state.definitions.retain(|(_, d)| !d.names.is_empty());
}

/// Fold a successful cell into the namespace and fill `result.vars`.
fn apply(state: &mut State, language: Language, done: &Done, result: &mut CellResult) {
    let mut changed = Vec::new();
    for (k, v) in &done.vars {
        if state.vars.get(k) != Some(v) {
            changed.push(k.clone());
        }
    }
    // A name the worker says it kept is carried over only if the session
    // has it and the cell did not send a value for it too.
    let kept: HashSet<&str> = done
        .kept
        .iter()
        .filter(|k| state.vars.contains_key(*k) && !done.vars.contains_key(*k))
        .map(String::as_str)
        .collect();
    let deleted: Vec<String> = state
        .vars
        .keys()
        .filter(|k| !done.vars.contains_key(*k) && !kept.contains(k.as_str()))
        .cloned()
        .collect();
    // A name is either a variable or a definition: the newest wins.
    // Names rebound to a value, deleted or rebound to something that cannot
    // be carried no longer refer to an older definition.
    let mut shadowed: Vec<String> = changed.clone();
    shadowed.extend(deleted.iter().cloned());
    shadowed.extend(done.dropped.iter().map(|d| d.name.clone()));
    remove_definition_names(state, &shadowed);
    for d in &done.definitions {
        remove_definition_names(state, &d.names);
    }
    for d in &done.definitions {
        if !d.names.is_empty() {
            state.definitions.push((language, d.clone()));
        }
    }
    // Names keep their places; new ones follow. The kept values move from
    // the old namespace (copied only while it is shared, with a checkpoint
    // or a running cell's frame).
    let old = Arc::try_unwrap(std::mem::take(&mut state.vars)).unwrap_or_else(|shared| {
        shared
            .iter()
            .map(|(k, v)| {
                let v = if kept.contains(k.as_str()) {
                    v.clone()
                } else {
                    Value::Null
                };
                (k.clone(), v)
            })
            .collect()
    });
    let mut vars = Namespace::new();
    for (k, v) in old {
        if kept.contains(k.as_str()) {
            vars.insert(k, v);
        } else if let Some(v) = done.vars.get(&k).filter(|_| valid_var_name(&k)) {
            vars.insert(k, v.clone());
        }
    }
    for (k, v) in &done.vars {
        if valid_var_name(k) && !vars.contains_key(k) {
            vars.insert(k.clone(), v.clone());
        }
    }
    for d in &done.definitions {
        for n in &d.names {
            vars.remove(n);
        }
    }
    state.vars = Arc::new(vars);
    state.resize(&changed);
    result.vars.changed = changed;
    result.vars.deleted = deleted;
}

/// What the result of a fresh session's first cell, ended `ok` with
/// `done`, says of the variables (a cell run once without a session).
#[cfg(target_os = "linux")]
pub(crate) fn apply_first(language: Language, done: &Done, result: &mut CellResult) {
    apply(&mut State::new(None), language, done, result);
}

/// A checkpoint's name: 1 to 64 letters, digits, `_`, `-` or `.`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // live sessions are Linux-only
fn valid_checkpoint_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Checkpoint(format!(
            "{name:?} is not a checkpoint name (1 to 64 letters, digits, '_', '-' or '.')"
        )))
    }
}

/// Fold a live cell that kept its namespace into the session's JSON mirror
/// (replayed if the state process is ever lost) and fill `result.vars`.
#[cfg(target_os = "linux")]
fn apply_live(
    state: &mut State,
    done: &Done,
    report: &crate::protocol::LiveDone,
    result: &mut CellResult,
    left_out: &[String],
) {
    let mut gone: Vec<String> = report.changed.clone();
    gone.extend(report.deleted.iter().cloned());
    remove_definition_names(state, &gone);
    for d in &done.definitions {
        remove_definition_names(state, &d.names);
    }
    for name in &report.changed {
        match done.vars.get(name).filter(|_| !left_out.contains(name)) {
            Some(v) if valid_var_name(name) => {
                Arc::make_mut(&mut state.vars).insert(name.clone(), v.clone());
            }
            _ => {
                Arc::make_mut(&mut state.vars).remove(name);
            }
        }
    }
    for name in &report.deleted {
        Arc::make_mut(&mut state.vars).remove(name);
    }
    for d in &done.definitions {
        if !d.names.is_empty() {
            state.definitions.push((Language::Python, d.clone()));
            for n in &d.names {
                Arc::make_mut(&mut state.vars).remove(n);
            }
        }
    }
    result.vars.changed = report.changed.clone();
    result.vars.deleted = report.deleted.clone();
    let touched: Vec<String> = report.changed.clone();
    state.resize(&touched);
}

/// Charge what the session will hold once `done` (a carried namespace's
/// cell) is applied; when that passes a budget, end the cell
/// `limit_exceeded` and say so (the namespace then stays as it was).
fn admit_carried(state: &mut State, done: &Done, result: &mut CellResult) -> bool {
    let kept: u64 = done
        .kept
        .iter()
        .filter(|k| !done.vars.contains_key(*k))
        .filter_map(|k| state.sizes.get(k))
        .sum();
    let sent: u64 = done
        .vars
        .iter()
        .filter(|(k, _)| valid_var_name(k))
        .map(|(k, v)| super::tenant::var_bytes(k, v))
        .sum();
    // A live session's state process gets another language's new values
    // next: they are held twice until then.
    #[cfg(target_os = "linux")]
    let pending = if state.live.is_some() { sent } else { 0 };
    #[cfg(not(target_os = "linux"))]
    let pending = 0;
    let defs: u64 = done
        .definitions
        .iter()
        .map(|d| {
            64 + d.source.len() as u64 + d.names.iter().map(|n| 24 + n.len() as u64).sum::<u64>()
        })
        .sum();
    let total = state.held_bytes() - state.vars_bytes()
        + kept
        + sent
        + pending
        + defs
        + HISTORY_ENTRY_BYTES;
    match state.charge(total, &|| "the session's namespace after this cell".into()) {
        Ok(()) => true,
        Err(e) => {
            result.fail_with(
                ErrorKind::LimitExceeded,
                format!("{e}; the cell's changes to the namespace were not kept"),
            );
            false
        }
    }
}

/// Charge what a live session's mirror will hold once `done` is folded in,
/// leaving out the largest new values until it fits its budgets. The names
/// left out, or the error when even without them it does not fit.
#[cfg(target_os = "linux")]
fn admit_live(
    state: &mut State,
    done: &Done,
    report: &crate::protocol::LiveDone,
) -> Result<Vec<String>, super::HeldError> {
    let replaced: u64 = report
        .changed
        .iter()
        .chain(&report.deleted)
        .filter_map(|n| state.sizes.get(n))
        .sum();
    let mut values: Vec<(u64, &String)> = report
        .changed
        .iter()
        .filter(|n| valid_var_name(n))
        .filter_map(|n| Some((super::tenant::var_bytes(n, done.vars.get(n)?), n)))
        .collect();
    values.sort();
    let defs: u64 = done
        .definitions
        .iter()
        .map(|d| {
            64 + d.source.len() as u64 + d.names.iter().map(|n| 24 + n.len() as u64).sum::<u64>()
        })
        .sum();
    let base = state.held_bytes().saturating_sub(replaced) + defs + HISTORY_ENTRY_BYTES;
    let mut total = base + values.iter().map(|(b, _)| b).sum::<u64>();
    let mut left_out = Vec::new();
    loop {
        match state.charge(total, &|| "the session's namespace after this cell".into()) {
            Ok(()) => return Ok(left_out),
            Err(e) => match values.pop() {
                Some((b, n)) => {
                    total -= b;
                    left_out.push(n.clone());
                }
                None => return Err(e),
            },
        }
    }
}
