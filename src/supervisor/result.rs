//! The one result shape every surface returns (docs/architecture.md §7).

use super::limits::Limits;
use crate::exit::Exit;
use crate::protocol::{DroppedVar, ScriptError};
use crate::sandbox::SandboxReport;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSYS => "SIGSYS".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGXCPU => "SIGXCPU".into(),
        libc::SIGXFSZ => "SIGXFSZ".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

/// How a cell ended. Stable names: surfaces and clients match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Error,
    Timeout,
    Killed,
    LimitExceeded,
    PolicyDenied,
    ProtocolError,
    SandboxError,
}

impl Status {
    /// Every status, in the order the schema lists them.
    pub const ALL: [Status; 8] = [
        Status::Ok,
        Status::Error,
        Status::Timeout,
        Status::Killed,
        Status::LimitExceeded,
        Status::PolicyDenied,
        Status::ProtocolError,
        Status::SandboxError,
    ];

    /// The stable name (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Killed => "killed",
            Status::LimitExceeded => "limit_exceeded",
            Status::PolicyDenied => "policy_denied",
            Status::ProtocolError => "protocol_error",
            Status::SandboxError => "sandbox_error",
        }
    }

    /// The status with this stable name.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// How the CLI exits with a cell that ended so (docs/architecture.md §9).
    pub fn exit(self) -> Exit {
        match self {
            Status::Ok => Exit::Ok,
            Status::Error => Exit::Failed,
            Status::Timeout => Exit::Timeout,
            Status::Killed | Status::LimitExceeded => Exit::Limit,
            Status::PolicyDenied => Exit::PolicyDenied,
            Status::SandboxError => Exit::Sandbox,
            Status::ProtocolError => Exit::Internal,
        }
    }

    /// CLI exit code (docs/architecture.md §9).
    pub fn exit_code(self) -> u8 {
        self.exit().code()
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `error.type` of a result the supervisor (not the script) ended: why
/// the cell did not end on its own. Script errors (`ValueError`,
/// `SyntaxError`, ...) are the language's own names and are not listed here.
/// Stable names: clients match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The cell ran past its wall-clock limit.
    Timeout,
    /// A CPU, file-size, memory, budget or admission limit stopped the cell.
    LimitExceeded,
    /// The worker was killed by a signal.
    Killed,
    /// The cell was interrupted (cancelled) and killed.
    Interrupted,
    /// An `exec` program exited with a non-zero status.
    ExitStatus,
    /// The worker broke the protocol or ended without a result.
    ProtocolError,
    /// A sandbox layer could not be applied.
    SandboxError,
    /// The worker could not be started.
    SpawnError,
    /// The request itself was unusable (code too large, bad argv, ...).
    UsageError,
    /// The policy refused the cell (a language not allowed, a denied call).
    PermissionError,
    /// The session named does not exist (for this client).
    UnknownSession,
    /// The session could not be used.
    SessionError,
    /// The server holds as many cells as it runs.
    ServerBusy,
    /// The client holds as many cells as it may queue.
    ClientQueueFull,
    /// The server was draining (stopping on a signal) and the cell ran past
    /// the drain timeout, so it was killed.
    Draining,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::Timeout,
        ErrorKind::LimitExceeded,
        ErrorKind::Killed,
        ErrorKind::Interrupted,
        ErrorKind::ExitStatus,
        ErrorKind::ProtocolError,
        ErrorKind::SandboxError,
        ErrorKind::SpawnError,
        ErrorKind::UsageError,
        ErrorKind::PermissionError,
        ErrorKind::UnknownSession,
        ErrorKind::SessionError,
        ErrorKind::ServerBusy,
        ErrorKind::ClientQueueFull,
        ErrorKind::Draining,
    ];

    /// The stable name (the serde name), as `error.type` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "Timeout",
            ErrorKind::LimitExceeded => "LimitExceeded",
            ErrorKind::Killed => "Killed",
            ErrorKind::Interrupted => "Interrupted",
            ErrorKind::ExitStatus => "ExitStatus",
            ErrorKind::ProtocolError => "ProtocolError",
            ErrorKind::SandboxError => "SandboxError",
            ErrorKind::SpawnError => "SpawnError",
            ErrorKind::UsageError => "UsageError",
            ErrorKind::PermissionError => "PermissionError",
            ErrorKind::UnknownSession => "UnknownSession",
            ErrorKind::SessionError => "SessionError",
            ErrorKind::ServerBusy => "ServerBusy",
            ErrorKind::ClientQueueFull => "ClientQueueFull",
            ErrorKind::Draining => "Draining",
        }
    }

    /// The status a cell that ends with this kind has.
    pub fn status(self) -> Status {
        match self {
            ErrorKind::Timeout => Status::Timeout,
            ErrorKind::LimitExceeded | ErrorKind::ServerBusy | ErrorKind::ClientQueueFull => {
                Status::LimitExceeded
            }
            ErrorKind::Killed | ErrorKind::Interrupted | ErrorKind::Draining => Status::Killed,
            ErrorKind::ExitStatus
            | ErrorKind::UsageError
            | ErrorKind::UnknownSession
            | ErrorKind::SessionError => Status::Error,
            ErrorKind::ProtocolError => Status::ProtocolError,
            ErrorKind::SandboxError | ErrorKind::SpawnError => Status::SandboxError,
            ErrorKind::PermissionError => Status::PolicyDenied,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ErrorKind> for &'static str {
    fn from(kind: ErrorKind) -> Self {
        kind.as_str()
    }
}

/// What was kept of a stream that went over its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    pub total_bytes: u64,
    pub kept_head: u64,
    pub kept_tail: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    pub stdout: Option<Truncation>,
    pub stderr: Option<Truncation>,
    /// Present when the cell made more calls than `calls` keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<CallsTruncation>,
}

/// What was kept of a cell's call records (sub-cells' included) past
/// [`MAX_CALL_RECORDS`] or [`MAX_CALL_RECORD_BYTES`]: the first ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallsTruncation {
    /// Calls made.
    pub total: u64,
    /// Records kept in `calls`.
    pub kept: u64,
}

/// Call records one cell's result keeps (its sub-cells' included).
pub const MAX_CALL_RECORDS: usize = 1000;
/// Bytes of call records (names, messages, run ids) one result keeps.
pub const MAX_CALL_RECORD_BYTES: usize = 256 * 1024;

/// Namespace changes made by the cell.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VarsReport {
    /// Names whose value is new or different.
    pub changed: Vec<String>,
    /// Names the cell removed.
    pub deleted: Vec<String>,
    /// Values that could not be carried to the next cell.
    pub dropped: Vec<DroppedVar>,
}

/// One capability call as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub cap: String,
    /// `ok`, `budget` (the call ended the cell), or the
    /// [`crate::protocol::ReplyErrorKind`] the call was answered with.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub run_id: String,
    pub depth: u32,
    pub ms: u64,
    /// A model query's record: model, usage, cost, attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

/// What a cell used. `cpu_ms` is the CPU time of the cell's whole process
/// tree (its cell cgroup's count, or the worker's rusage where that is
/// larger or there is no cgroup), `max_rss_kb` the worker's peak resident
/// size from its rusage; for a live Python cell whose process became its
/// session's next state process (it does not exit), both are read from
/// `/proc` when it is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
    pub calls: u32,
}

/// Identity of a run within a tree of recursive runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    pub parent_run_id: Option<String>,
    pub root_run_id: String,
    pub depth: u32,
    /// The id of the request that ran it (an MCP `tools/call` of `serve`),
    /// as the server's log lines and events name it; a sub-cell's is its
    /// parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// How the worker process ended. A warm cell returned at `done`: its worker
/// exits with code 0 right after it (one that does not is killed and
/// logged), and `code` reads 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// The result of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub status: Status,
    pub execution_count: u64,
    pub language: String,
    pub stdout: String,
    pub stderr: String,
    pub truncated: Truncated,
    /// The last expression's value (JSON), or null.
    pub value: Value,
    /// Python: `repr()` of that value, as the REPL shows it (`'a'`, `True`,
    /// `(1, 2)`); absent for other languages and when there is no value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_repr: Option<String>,
    pub error: Option<ScriptError>,
    /// What the script passed to `answer(...)`, if anything.
    pub final_answer: Option<Value>,
    /// Rich values the cell showed: matplotlib figures and the
    /// `_repr_png_` / `_repr_html_` / `_repr_markdown_` of its last value
    /// (`data` is base64 for an image).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub display: Vec<crate::protocol::DisplayItem>,
    /// Display items left out, with the reason (a size limit, a failing
    /// `_repr_*_`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub display_dropped: Vec<crate::protocol::DisplayDropped>,
    pub vars: VarsReport,
    pub calls: Vec<CallRecord>,
    pub usage: Usage,
    /// Model queries, sub-agents, tool calls, tokens and cost: this cell's
    /// run tree and its session so far (absent when it made none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<super::ModelUsageReport>,
    pub run: RunInfo,
    pub sandbox: Option<SandboxReport>,
    pub exit: ExitInfo,
    /// A cell of a live Python session: what became of the session's live
    /// namespace (absent for other cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateOutcome>,
    /// Things worth knowing about how the cell ran (threads that did not
    /// survive it, a live namespace that could not be used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What became of a live Python session's namespace after a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateOutcome {
    /// The cell succeeded: the namespace is the one it left.
    Kept,
    /// The cell failed, timed out or was killed: the namespace is the one
    /// before it, every object as it was.
    RolledBack,
    /// The cell asked for `restore(name)`: the namespace is the checkpoint's.
    Restored,
}

impl CellResult {
    /// Keep one call record, unless the result holds its share already
    /// (counted in `truncated.calls`): a cell decides how many calls it
    /// makes, the supervisor how much of them it keeps.
    pub(crate) fn push_call(&mut self, record: CallRecord) {
        fn size(r: &CallRecord) -> usize {
            r.cap.len()
                + r.outcome.len()
                + r.run_id.len()
                + r.message.as_ref().map_or(0, String::len)
        }
        let held: usize = self.calls.iter().map(size).sum();
        if self.truncated.calls.is_none()
            && self.calls.len() < MAX_CALL_RECORDS
            && held + size(&record) <= MAX_CALL_RECORD_BYTES
        {
            self.calls.push(record);
            return;
        }
        self.count_dropped_calls(1);
    }

    /// Count calls whose records were not kept.
    pub(crate) fn count_dropped_calls(&mut self, n: u64) {
        let kept = self.calls.len() as u64;
        let t = self
            .truncated
            .calls
            .get_or_insert(CallsTruncation { total: kept, kept });
        t.total += n;
    }

    /// Take in a sub-cell's call records (within this result's caps).
    pub(crate) fn absorb_calls(&mut self, sub: &CellResult) {
        for c in &sub.calls {
            self.push_call(c.clone());
        }
        let dropped = sub.calls_made() - sub.calls.len() as u64;
        if dropped > 0 {
            self.count_dropped_calls(dropped);
        }
    }

    /// Calls made, kept or not.
    pub(crate) fn calls_made(&self) -> u64 {
        self.truncated
            .calls
            .map_or(self.calls.len() as u64, |t| t.total)
    }

    /// Take in what the worker wrote and how it ended (when that is known).
    pub(crate) fn record_end(
        &mut self,
        stdout: super::output::Capture,
        stderr: super::output::Capture,
        reaped: Option<&crate::sandbox::process::Reaped>,
    ) {
        let (out, t_out) = stdout.finish();
        let (err, t_err) = stderr.finish();
        self.stdout = out;
        self.stderr = err;
        self.truncated.stdout = t_out;
        self.truncated.stderr = t_err;
        if let Some(r) = reaped {
            self.exit = ExitInfo {
                code: r.code,
                signal: r.signal,
            };
            self.usage.cpu_ms = r.cpu_ms;
            self.usage.max_rss_kb = r.max_rss_kb;
        }
    }

    /// End the cell with `status` and an error of `kind`.
    pub(crate) fn fail(&mut self, status: Status, kind: &str, message: String) {
        self.status = status;
        self.error = Some(ScriptError {
            kind: kind.to_owned(),
            message,
            ..ScriptError::default()
        });
    }

    /// End the cell with an error of `kind`, and the status it implies.
    pub(crate) fn fail_with(&mut self, kind: ErrorKind, message: String) {
        self.fail(kind.status(), kind.as_str(), message);
    }

    /// The cell ran past its wall-clock limit and was killed.
    pub(crate) fn timed_out(&mut self, limits: &Limits) {
        self.fail_with(
            ErrorKind::Timeout,
            format!(
                "the cell ran past its wall-clock limit of {} ms and was killed",
                limits.timeout_ms
            ),
        );
    }

    /// Classify a cell whose process ended without reporting a result, from
    /// `self.exit` (and, for a memory abort, `self.stderr`). `exec`: the
    /// process is a program run by `exec`, whose exit code is its result.
    pub(crate) fn classify_exit(&mut self, limits: &Limits, exec: bool) {
        let exit = self.exit;
        match (exit.code, exit.signal) {
            (Some(0), _) if exec => self.status = Status::Ok,
            (Some(code), _) if exec => self.fail_with(
                ErrorKind::ExitStatus,
                format!("the program exited with status {code}"),
            ),
            (_, Some(libc::SIGXCPU)) => self.fail_with(
                ErrorKind::LimitExceeded,
                format!(
                    "CPU time limit of {} s exceeded",
                    limits.rlimits.cpu_seconds
                ),
            ),
            (_, Some(libc::SIGXFSZ)) => self.fail_with(
                ErrorKind::LimitExceeded,
                format!(
                    "file size limit of {} bytes exceeded",
                    limits.rlimits.max_file_size_bytes
                ),
            ),
            (_, Some(libc::SIGSYS)) => self.fail_with(
                ErrorKind::Killed,
                "killed by SIGSYS: the cell made a system call the sandbox forbids".into(),
            ),
            (_, Some(sig)) if sig == libc::SIGABRT && self.stderr.contains("memory allocation") => {
                self.fail_with(
                    ErrorKind::LimitExceeded,
                    format!(
                        "memory limit of {} bytes exceeded",
                        limits.rlimits.memory_bytes
                    ),
                )
            }
            (_, Some(sig)) => self.fail_with(
                ErrorKind::Killed,
                format!("the worker was killed by {}", signal_name(sig)),
            ),
            (Some(code), None) => self.fail_with(
                ErrorKind::ProtocolError,
                format!("the worker exited with status {code} before reporting a result"),
            ),
            (None, None) => self.fail_with(
                ErrorKind::ProtocolError,
                "the worker ended before reporting a result".into(),
            ),
        }
    }

    pub(crate) fn new(language: &str, run: RunInfo) -> Self {
        CellResult {
            status: Status::Ok,
            execution_count: 0,
            language: language.to_owned(),
            stdout: String::new(),
            stderr: String::new(),
            truncated: Truncated::default(),
            value: Value::Null,
            value_repr: None,
            error: None,
            final_answer: None,
            display: Vec::new(),
            display_dropped: Vec::new(),
            vars: VarsReport::default(),
            calls: Vec::new(),
            usage: Usage::default(),
            models: None,
            run,
            sandbox: None,
            exit: ExitInfo::default(),
            state: None,
            notes: Vec::new(),
        }
    }

    /// A result for a cell that never reached a worker, refused with an
    /// error of `kind` and the status it implies.
    pub(crate) fn refused_with(
        language: &str,
        run: RunInfo,
        kind: ErrorKind,
        message: String,
    ) -> Self {
        CellResult::refused(language, run, kind.status(), kind.as_str(), message)
    }

    /// A result for a cell that never reached a worker.
    pub(crate) fn refused(
        language: &str,
        run: RunInfo,
        status: Status,
        kind: &str,
        message: String,
    ) -> Self {
        let mut r = CellResult::new(language, run);
        r.status = status;
        r.error = Some(ScriptError {
            kind: kind.to_owned(),
            message,
            ..ScriptError::default()
        });
        r
    }

    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok
    }

    /// A plain-text rendering for people and models.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        if !self.stdout.is_empty() {
            out.push_str(&self.stdout);
            if !self.stdout.ends_with('\n') {
                out.push('\n');
            }
        }
        if let Some(t) = &self.truncated.stdout {
            out.push_str(&format!(
                "[stdout truncated: {} bytes in total, kept the first {} and the last {}]\n",
                t.total_bytes, t.kept_head, t.kept_tail
            ));
        }
        if !self.stderr.is_empty() {
            out.push_str("--- stderr ---\n");
            out.push_str(&self.stderr);
            if !self.stderr.ends_with('\n') {
                out.push('\n');
            }
        }
        if let Some(t) = &self.truncated.stderr {
            out.push_str(&format!(
                "[stderr truncated: {} bytes in total, kept the first {} and the last {}]\n",
                t.total_bytes, t.kept_head, t.kept_tail
            ));
        }
        if !self.value.is_null() {
            out.push_str(&format!("=> {}\n", self.value));
        }
        if let Some(a) = &self.final_answer {
            out.push_str(&format!("answer: {a}\n"));
        }
        if let Some(e) = &self.error {
            let summary = format!("{}: {}", e.kind, e.message);
            let mut said = false;
            if let Some(tb) = &e.traceback {
                out.push_str(tb);
                if !tb.ends_with('\n') {
                    out.push('\n');
                }
                // A Python traceback ends with the same line; say it once.
                said = tb.trim_end().lines().last() == Some(summary.as_str());
            }
            if !said {
                let pos = match (e.line, e.column) {
                    (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
                    (Some(l), None) => format!(" (line {l})"),
                    _ => String::new(),
                };
                out.push_str(&format!("{summary}{pos}\n"));
            }
        }
        if self.status != Status::Ok {
            out.push_str(&format!("[status: {}]\n", self.status));
        }
        if !self.vars.dropped.is_empty() {
            let names: Vec<String> = self
                .vars
                .dropped
                .iter()
                .map(|d| format!("{} ({}: {})", d.name, d.type_name, d.reason))
                .collect();
            out.push_str(&format!(
                "[not kept for the next cell: {}]\n",
                names.join(", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(traceback: Option<&str>) -> CellResult {
        let run = RunInfo {
            run_id: "r".into(),
            parent_run_id: None,
            root_run_id: "r".into(),
            depth: 0,
            request_id: None,
        };
        let mut r = CellResult::new("python", run);
        r.status = Status::Error;
        r.error = Some(ScriptError {
            kind: "ValueError".into(),
            message: "boom".into(),
            traceback: traceback.map(str::to_owned),
            line: Some(2),
            column: None,
        });
        r
    }

    #[test]
    fn status_names_round_trip() {
        for s in Status::ALL {
            let v = serde_json::to_value(s).unwrap();
            assert_eq!(v, Value::String(s.as_str().into()));
            assert_eq!(serde_json::from_value::<Status>(v).unwrap(), s);
            assert_eq!(Status::from_name(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(Status::from_name("fine"), None);
        let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "ok",
                "error",
                "timeout",
                "killed",
                "limit_exceeded",
                "policy_denied",
                "protocol_error",
                "sandbox_error"
            ]
        );
    }

    #[test]
    fn error_kinds_keep_their_names_and_statuses() {
        let want = [
            ("Timeout", Status::Timeout),
            ("LimitExceeded", Status::LimitExceeded),
            ("Killed", Status::Killed),
            ("Interrupted", Status::Killed),
            ("ExitStatus", Status::Error),
            ("ProtocolError", Status::ProtocolError),
            ("SandboxError", Status::SandboxError),
            ("SpawnError", Status::SandboxError),
            ("UsageError", Status::Error),
            ("PermissionError", Status::PolicyDenied),
            ("UnknownSession", Status::Error),
            ("SessionError", Status::Error),
            ("ServerBusy", Status::LimitExceeded),
            ("ClientQueueFull", Status::LimitExceeded),
            ("Draining", Status::Killed),
        ];
        assert_eq!(ErrorKind::ALL.len(), want.len());
        for (kind, (name, status)) in ErrorKind::ALL.into_iter().zip(want) {
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(kind.status(), status, "{name}");
            let v = serde_json::to_value(kind).unwrap();
            assert_eq!(v, Value::String(name.into()));
            assert_eq!(serde_json::from_value::<ErrorKind>(v).unwrap(), kind);
        }
    }

    #[test]
    fn fail_with_sets_the_status_the_kind_implies() {
        let mut r = failed(None);
        r.fail_with(ErrorKind::SpawnError, "no worker".into());
        assert_eq!(r.status, Status::SandboxError);
        let e = r.error.unwrap();
        assert_eq!(
            (e.kind.as_str(), e.message.as_str()),
            ("SpawnError", "no worker")
        );
    }

    #[test]
    fn text_names_the_error_once() {
        let tb = "Traceback (most recent call last):\n  File \"<cell>\", line 2, in <module>\nValueError: boom\n";
        let text = failed(Some(tb)).render_text();
        assert_eq!(text, format!("{tb}[status: error]\n"));

        // A traceback that does not end with it, or none: the summary line
        // with the position follows.
        let text = failed(Some("  in f\n")).render_text();
        assert_eq!(text, "  in f\nValueError: boom (line 2)\n[status: error]\n");
        let text = failed(None).render_text();
        assert_eq!(text, "ValueError: boom (line 2)\n[status: error]\n");
    }
}
