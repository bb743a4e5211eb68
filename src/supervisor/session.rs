//! Sessions: a namespace (JSON variables + replayable definitions), a
//! history, and a scratch directory that persist across cells.

use super::cell::{self, CellSpec, SessionView};
use super::result::{CellResult, ErrorKind, RunInfo, Status};
use super::{valid_var_name, CellRequest, Error, Inner, Language, Limits, Namespace, Policy};
use crate::protocol::{Definition, Done};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// How a session is configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    pub policy: Policy,
    pub limits: Limits,
    /// Sandbox profile name or path for every cell of this session
    /// (defaults to the supervisor's profile for the cell's language).
    pub profile: Option<String>,
}

/// One past cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub execution_count: u64,
    pub language: String,
    pub code: String,
    pub status: Status,
    pub run_id: String,
}

#[derive(Debug, Default)]
struct State {
    vars: Namespace,
    definitions: Vec<(Language, Definition)>,
    history: Vec<HistoryEntry>,
    execution_count: u64,
}

struct SessionInner {
    id: String,
    sup: Arc<Inner>,
    config: SessionConfig,
    scratch: Arc<super::scratch::Scratch>,
    /// Its cgroups (made at its first cell).
    share: Arc<super::tenancy::Share>,
    /// `emit` events of all the session's cells so far.
    emits: Arc<super::policy::EmitTally>,
    /// For a sub-agent's session: the run its cells hang beneath.
    parent: Option<RunInfo>,
    state: tokio::sync::Mutex<State>,
}

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
        config: SessionConfig,
        parent: Option<RunInfo>,
    ) -> Result<Session, Error> {
        // Made when a cell first needs it.
        let scratch = Arc::new(super::scratch::Scratch::new(
            super::scratch::Parent::Supervisor(sup.clone()),
            "cellbox-",
        ));
        Ok(Session {
            inner: Arc::new(SessionInner {
                id: cell::new_run_id(),
                sup,
                config,
                scratch,
                share: Default::default(),
                emits: Default::default(),
                parent,
                state: tokio::sync::Mutex::new(State::default()),
            }),
        })
    }

    /// Model queries, sub-agents, tool calls, tokens and cost of the
    /// session's cells so far.
    pub fn model_usage(&self) -> super::ModelUsage {
        self.inner.share.models.get()
    }

    /// Count model queries made on the session's behalf outside its cells
    /// (an agent loop's own turns), so that its cells' budgets are what is
    /// left after them: the session's `max_model_calls`, `max_total_tokens`
    /// and `max_cost` cover both.
    pub fn charge_model_use(&self, calls: u32, input_tokens: u64, output_tokens: u64, cost: f64) {
        let tally = &self.inner.share.models;
        tally.add_calls(super::policy::Metered::Model, calls);
        tally.add_usage(input_tokens, output_tokens, cost);
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
        let mut state = self.inner.state.lock().await;
        state.execution_count += 1;
        let count = state.execution_count;
        let limits = self.inner.config.limits.tighten(&request.limits);
        let run = match &self.inner.parent {
            Some(p) => RunInfo {
                run_id: cell::new_run_id(),
                parent_run_id: Some(p.run_id.clone()),
                root_run_id: p.root_run_id.clone(),
                depth: p.depth,
            },
            None => RunInfo::root(),
        };
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
        let spec = CellSpec::new(self.view(), run, request.language, request.code.clone())
            .vars(state.vars.clone())
            .definitions(definitions)
            .limits(limits)
            .forward(request.forward)
            .cancel(request.cancel.clone())
            .output(request.output.clone())
            .execution_count(count);
        let (mut result, done) = cell::run(self.inner.sup.clone(), spec).await;
        if result.status == Status::Ok && request.language != Language::Shell {
            if let Some(done) = done {
                apply(&mut state, request.language, &done, &mut result);
            }
        }
        self.push_history(&mut state, &request, &result);
        result
    }

    /// Call one capability directly (the REPL's `:call`), through the same
    /// policy, schema and budget checks as a script's call: it runs as a tiny
    /// Rhai cell that leaves the namespace untouched.
    pub async fn call(&self, cap: &str, args: serde_json::Map<String, Value>) -> CellResult {
        if !valid_var_name(cap) {
            return CellResult::refused_with(
                "rhai",
                RunInfo::root(),
                ErrorKind::UsageError,
                format!("{cap:?} is not a capability name"),
            );
        }
        let _state = self.inner.state.lock().await;
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
        forward_output: super::Forward,
    ) -> CellResult {
        let mut state = self.inner.state.lock().await;
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
        }
    }

    fn push_history(&self, state: &mut State, request: &CellRequest, result: &CellResult) {
        state.history.push(HistoryEntry {
            execution_count: result.execution_count,
            language: request.language.as_str().to_owned(),
            code: request.code.clone(),
            status: result.status,
            run_id: result.run.run_id.clone(),
        });
    }

    /// The current namespace variables.
    pub async fn vars(&self) -> Namespace {
        self.inner.state.lock().await.vars.clone()
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
        let mut state = self.inner.state.lock().await;
        remove_definition_names(&mut state, &[name.to_owned()]);
        state.vars.insert(name.to_owned(), value);
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
        let mut state = self.inner.state.lock().await;
        state.vars.clear();
        state.definitions.clear();
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
    let deleted: Vec<String> = state
        .vars
        .keys()
        .filter(|k| !done.vars.contains_key(*k))
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
    state.vars = done
        .vars
        .iter()
        .filter(|(k, _)| valid_var_name(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for d in &done.definitions {
        for n in &d.names {
            state.vars.remove(n);
        }
    }
    result.vars.changed = changed;
    result.vars.deleted = deleted;
}
