//! Message types. One enum per direction; every struct rejects unknown fields.

use super::codec::Tagged;
use super::sandbox::{SandboxPlan, SandboxReport};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What the worker runs once its sandbox is in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Backend {
    /// The Rhai engine, in the worker process itself.
    Rhai,
    /// `execve` of a Python interpreter running the runtime shim.
    Python {
        interpreter: String,
        /// The shim precompiled by this interpreter (a file the sandbox
        /// opens read-only); `None` runs the shim from source.
        #[serde(default)]
        precompiled: Option<String>,
    },
    /// `execve` of an arbitrary program (`cellbox exec`, shell cells, a
    /// command tool), with `env` added to the sandbox's fixed environment
    /// (a command tool's `env` and `pass_env`).
    Exec {
        argv: Vec<String>,
        #[serde(default, skip_serializing_if = "ExecEnv::is_empty")]
        env: ExecEnv,
    },
}

/// Variables a program is executed with besides the sandbox's own. They
/// may hold secrets of the supervisor's (a command tool's `{ env = ... }`):
/// `Debug` shows their names only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecEnv(pub Vec<(String, String)>);

impl ExecEnv {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for ExecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

/// A capability as the worker sees it: a name and its parameter order, so a
/// positional call (`run_cell("rhai", "1")`) can be turned into named args.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySpec {
    pub name: String,
    pub params: Vec<String>,
    /// Whether the cell's policy allows it. A Python cell gets only the
    /// allowed ones as functions (the rest stay reachable by name, and
    /// are refused); Rhai registers every one. Absent means allowed.
    #[serde(default = "allowed_by_default", skip_serializing_if = "is_allowed")]
    pub allowed: bool,
}

fn allowed_by_default() -> bool {
    true
}

fn is_allowed(allowed: &bool) -> bool {
    *allowed
}

/// Limits the backend enforces from the inside (a courtesy: the supervisor's
/// wall clock and the OS limits are the guarantee).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptLimits {
    /// Milliseconds from the start frame after which the script should stop.
    pub timeout_ms: u64,
    pub max_operations: u64,
    pub max_call_levels: usize,
    pub max_expr_depth: usize,
    pub max_string_bytes: usize,
    pub max_array_len: usize,
    pub max_map_len: usize,
    /// Python: bytes of `display` items (base64 or UTF-8 text) kept in all,
    /// and for one item.
    #[serde(default = "default_display_bytes")]
    pub max_display_bytes: usize,
    #[serde(default = "default_display_item_bytes")]
    pub max_display_item_bytes: usize,
}

fn default_display_bytes() -> usize {
    DEFAULT_MAX_DISPLAY_BYTES
}

fn default_display_item_bytes() -> usize {
    DEFAULT_MAX_DISPLAY_ITEM_BYTES
}

/// Bytes of display items a cell keeps by default: with the rest of a
/// result, an MCP response stays within the 1 MiB the strictest official
/// client accepts.
pub const DEFAULT_MAX_DISPLAY_BYTES: usize = 320 * 1024;
/// Bytes of one display item by default.
pub const DEFAULT_MAX_DISPLAY_ITEM_BYTES: usize = 256 * 1024;

/// A rich value a cell shows (like Jupyter's display_data): a matplotlib
/// figure, or the `_repr_png_` / `_repr_html_` / `_repr_markdown_` of its
/// last value. `data` is base64 for an image, the text itself otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplayItem {
    pub mime: String,
    pub data: String,
}

/// A display item left out of the result, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplayDropped {
    pub mime: String,
    pub bytes: u64,
    pub reason: String,
}

/// The MIME types a display item may have.
pub const DISPLAY_MIMES: &[&str] = &["image/png", "text/html", "text/markdown"];

/// A definition (functions, classes, imports) carried in a session, as the
/// source that recreates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// The names this source defines.
    pub names: Vec<String>,
    pub source: String,
}

/// A variable that could not be carried to the next cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DroppedVar {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub reason: String,
}

/// An error raised by the script.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub traceback: Option<String>,
    #[serde(default)]
    pub line: Option<u64>,
    #[serde(default)]
    pub column: Option<u64>,
}

/// supervisor → worker: how to sandbox itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    pub backend: Backend,
    pub plan: SandboxPlan,
}

/// supervisor → worker: the cell to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    pub language: String,
    pub code: String,
    /// The session's carried namespace (shared, not copied, while the
    /// frame is written).
    #[serde(default)]
    pub vars: std::sync::Arc<Map<String, Value>>,
    #[serde(default)]
    pub definitions: Vec<Definition>,
    #[serde(default)]
    pub capabilities: Vec<CapabilitySpec>,
    pub limits: ScriptLimits,
    pub max_frame_bytes: usize,
    /// Python: package directories appended to `sys.path` (the profile's
    /// `[python] paths`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_paths: Vec<String>,
    /// After its `done`, the worker stays (running nothing more of the
    /// cell) until the supervisor closes the channel, so that what it used
    /// can be read from the live process before it exits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub linger: bool,
    /// The cell's variables are those of the worker's `preload` frame
    /// (`vars` is then empty). A worker that got none refuses the cell.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preloaded: bool,
}

/// What kind of failure a capability call met, as told to the script. A
/// call over the call budget gets no reply: it ends the cell (its call
/// record says `budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyErrorKind {
    /// No capability of that name is registered.
    Unknown,
    /// The policy does not allow the call (or the sub-cell it asks for).
    Denied,
    /// The arguments do not fit the capability's schema.
    InvalidArgs,
    /// A per-cell or per-session bound (on `emit`) is used up.
    Limit,
    /// The capability ran and failed, or did not finish in time.
    Failed,
}

impl ReplyErrorKind {
    /// Every kind.
    pub const ALL: [ReplyErrorKind; 5] = [
        ReplyErrorKind::Unknown,
        ReplyErrorKind::Denied,
        ReplyErrorKind::InvalidArgs,
        ReplyErrorKind::Limit,
        ReplyErrorKind::Failed,
    ];

    /// The wire name (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyErrorKind::Unknown => "unknown",
            ReplyErrorKind::Denied => "denied",
            ReplyErrorKind::InvalidArgs => "invalid_args",
            ReplyErrorKind::Limit => "limit",
            ReplyErrorKind::Failed => "failed",
        }
    }

    /// The kind with this wire name.
    pub fn from_name(name: &str) -> Option<ReplyErrorKind> {
        ReplyErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind with this wire name; a name that is none of them is
    /// `failed`.
    pub fn named(name: &str) -> ReplyErrorKind {
        ReplyErrorKind::from_name(name).unwrap_or(ReplyErrorKind::Failed)
    }

    /// The call was refused (not permitted, or no such capability): the
    /// script sees a permission error.
    pub fn is_refusal(self) -> bool {
        matches!(self, ReplyErrorKind::Unknown | ReplyErrorKind::Denied)
    }
}

impl std::fmt::Display for ReplyErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a capability call failed, as told to the script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyError {
    pub kind: ReplyErrorKind,
    pub message: String,
}

/// supervisor → worker: the answer to one `call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
}

impl Reply {
    /// The answer to call `id` from what performing it gave: its value, or
    /// the kind and message of its failure; and whether it was refused by
    /// the policy (kind `denied`).
    pub fn of(id: u64, outcome: Result<Value, (String, String)>) -> (Reply, bool) {
        match outcome {
            Ok(v) => (
                Reply {
                    id,
                    ok: Some(v),
                    error: None,
                },
                false,
            ),
            Err((kind, message)) => {
                let denied = kind == "denied";
                (Reply::failed(id, &kind, message), denied)
            }
        }
    }

    /// The answer to call `id` that it failed: `kind` as
    /// [`ReplyErrorKind::named`] reads it, and the message.
    pub fn failed(id: u64, kind: &str, message: String) -> Reply {
        Reply {
            id,
            ok: None,
            error: Some(ReplyError {
                kind: ReplyErrorKind::named(kind),
                message,
            }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWorker {
    Setup(Setup),
    Preload(Preload),
    Start(Start),
    Reply(Reply),
}

impl Tagged for ToWorker {
    const TAGS: &'static [&'static str] = &["setup", "preload", "start", "reply"];

    fn variant(tag: &str, fields: &[u8]) -> Option<serde_json::Result<Self>> {
        use super::codec::read_fields;
        Some(match tag {
            "setup" => read_fields(fields).map(ToWorker::Setup),
            "preload" => read_fields(fields).map(ToWorker::Preload),
            "start" => read_fields(fields).map(ToWorker::Start),
            "reply" => read_fields(fields).map(ToWorker::Reply),
            _ => return None,
        })
    }
}

/// supervisor → a Rhai worker started ahead of its session's next cell,
/// after its `ready` and before any `start`: the session's carried
/// namespace, made ready while no cell is there. A `start` that says
/// `preloaded` then carries no `vars`: these are its variables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preload {
    #[serde(default)]
    pub vars: std::sync::Arc<Map<String, Value>>,
}

/// worker → supervisor: the sandbox is in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    pub report: SandboxReport,
}

/// worker → supervisor: a mandatory layer could not be applied (the
/// sandbox's own report of it, carried as is).
pub use super::sandbox::SandboxFailure;

/// worker → supervisor: a capability call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub id: u64,
    pub cap: String,
    #[serde(default)]
    pub args: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub level: String,
    pub message: String,
}

/// How the script ended, as the worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneStatus {
    Ok,
    Error,
    /// The backend's own limit stopped the script (operations, memory, …).
    LimitExceeded,
    /// The backend's own deadline fired before the supervisor's.
    Timeout,
}

/// worker → supervisor: the cell is over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {
    pub status: DoneStatus,
    #[serde(default)]
    pub value: Value,
    /// The value as the backend's own language spells it (Python's
    /// `repr()`), for display; the backend may leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repr: Option<String>,
    /// The carried namespace after the cell (JSON values only), but for
    /// the names in `kept`.
    #[serde(default)]
    pub vars: Map<String, Value>,
    /// Names of `start`'s variables the cell left as they were: carried
    /// over as the session has them, not sent back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    #[serde(default)]
    pub dropped: Vec<DroppedVar>,
    /// Definitions made by this cell.
    #[serde(default)]
    pub definitions: Vec<Definition>,
    #[serde(default)]
    pub error: Option<ScriptError>,
    /// Which limit, when `status` is `limit_exceeded`.
    #[serde(default)]
    pub limit: Option<String>,
    /// Rich values the cell showed (Python).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub display: Vec<DisplayItem>,
    /// Those left out (over a limit, or a failing `_repr_*_`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub display_dropped: Vec<DisplayDropped>,
    /// A cell of a live Python session: what it did to the live namespace
    /// (`vars` then holds the JSON values of the rebound names only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveDone>,
}

/// What a cell did to its session's live namespace (see [`Done::live`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveDone {
    /// Names it bound or rebound to another object.
    #[serde(default)]
    pub changed: Vec<String>,
    #[serde(default)]
    pub deleted: Vec<String>,
    /// Threads still running when it ended (they do not survive into the
    /// next cell).
    #[serde(default)]
    pub threads: u32,
    /// A checkpoint of the namespace it leaves, asked for by
    /// `checkpoint(name)`.
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// The checkpoint the session returns to, asked for by `restore(name)`.
    #[serde(default)]
    pub restore: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromWorker {
    Ready(Ready),
    SandboxError(SandboxFailure),
    Call(Call),
    Emit { event: Value },
    Log(Log),
    Done(Box<Done>),
}

impl Tagged for FromWorker {
    const TAGS: &'static [&'static str] =
        &["ready", "sandbox_error", "call", "emit", "log", "done"];

    fn variant(tag: &str, fields: &[u8]) -> Option<serde_json::Result<Self>> {
        use super::codec::read_fields;
        Some(match tag {
            "ready" => read_fields(fields).map(FromWorker::Ready),
            "sandbox_error" => read_fields(fields).map(FromWorker::SandboxError),
            "call" => read_fields(fields).map(FromWorker::Call),
            "log" => read_fields(fields).map(FromWorker::Log),
            "done" => read_fields(fields).map(FromWorker::Done),
            _ => return None,
        })
    }
}
