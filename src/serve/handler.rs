//! The MCP tool handler: `execute_code` and the session tools.
//!
//! One [`CellboxServer`] value is shared by every MCP connection (stdio, or
//! each HTTP client), so sessions, the concurrency gate and the shutdown
//! signal are server-wide. A call is cancelled — its cell killed and reaped
//! — when the client sends `notifications/cancelled`, when its connection
//! goes away, when its session is closed, or when the server shuts down: in
//! each case the future running the cell is dropped, and dropping it kills
//! the worker's process group and reaps it.

use super::config::{OutputSchema, Settings};
use super::describe::{self, Facts, Observations};
use super::fit;
use super::gate::{Gate, Refused};
use super::principal::Principal;
use super::schema;
use super::sessions::{SessionError, SessionTable};
use crate::supervisor as cellbox_output;
use crate::{CellRequest, CellResult, ErrorKind, Language, RunInfo, Supervisor};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest,
    CustomResult, ErrorCode, Implementation, JsonObject, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
#[allow(deprecated)] // see `execute_code`
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, SetLevelRequestParams};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// `execute_code` arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteArgs {
    language: String,
    code: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    timeout_seconds: Option<f64>,
    #[serde(default)]
    max_output_bytes: Option<usize>,
    /// Include the sandbox report and run ids in the result.
    #[serde(default)]
    verbose: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    session_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointArgs {
    session_id: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

struct State {
    sup: Supervisor,
    settings: Settings,
    /// Each principal's budgets, which its sessions and sessionless calls
    /// draw from.
    accounts: Arc<super::principal::Accounts>,
    sessions: SessionTable,
    gate: Gate,
    shutdown: CancellationToken,
    /// Draining, and past the drain timeout (see [`super::ops`]).
    ops: super::ops::Ops,
    observed: tokio::sync::OnceCell<Observations>,
    /// The tool list, built once the probe is done.
    tools: tokio::sync::OnceCell<Vec<Tool>>,
    /// The warm workers started (see [`CellboxServer::start_pools`]).
    pools: tokio::sync::OnceCell<()>,
    /// `logging/setLevel` per client (see [`client_of`]); none set: all.
    #[allow(deprecated)]
    log_levels: std::sync::Mutex<HashMap<String, LoggingLevel>>,
    /// Calls running, by client and request id, so a
    /// `notifications/cancelled` that arrives on another connection (a
    /// separate HTTP POST) reaches them.
    inflight: Arc<InflightTable>,
    /// Each principal as the supervisor knows it: its workspace, its
    /// budget of bytes the server holds for it.
    tenants: std::sync::Mutex<HashMap<Principal, crate::Tenant>>,
}

/// The MCP server: cheap to clone, every clone shares one state.
#[derive(Clone)]
pub struct CellboxServer {
    state: Arc<State>,
}

impl std::fmt::Debug for CellboxServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellboxServer")
            .field("sessions", &self.state.sessions)
            .field("gate", &self.state.gate)
            .finish_non_exhaustive()
    }
}

/// The host tools `serve` offers without a cell (the file tools and
/// `aggregate_context`, when configured): capabilities registered in the
/// supervisor whose names are in [`crate::tools::DIRECT`].
#[cfg(target_os = "linux")]
fn direct_capability<'a>(sup: &'a Supervisor, name: &str) -> Option<&'a crate::Capability> {
    if !crate::tools::DIRECT.contains(&name) {
        return None;
    }
    sup.capabilities().find(|c| c.name() == name)
}

#[cfg(not(target_os = "linux"))]
fn direct_capability<'a>(_sup: &'a Supervisor, _name: &str) -> Option<&'a crate::Capability> {
    None
}

fn direct_tools(sup: &Supervisor, long: bool) -> Vec<Tool> {
    sup.capabilities()
        .filter(|c| direct_capability(sup, c.name()).is_some())
        .filter_map(|c| {
            let input = c.schema().as_object()?.clone();
            let description = if long {
                c.description()
            } else {
                describe::first_sentence(c.description())
            };
            Some(
                Tool::new(c.name().to_owned(), description.to_owned(), input)
                    .with_raw_output_schema(Arc::new(
                        json!({"type": "object"})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    ))
                    .with_annotations(ToolAnnotations::new().open_world(false)),
            )
        })
        .collect()
}

/// A host tool's refusal before it ran (the server or the caller's queue
/// full), shaped like a cell's: a status and an error with its type.
fn direct_refusal(kind: ErrorKind, message: String) -> CallToolResult {
    fit::value_result(
        json!({
            "status": kind.status().as_str(),
            "error": {"type": kind.as_str(), "message": message},
        }),
        true,
    )
}

/// What a tool call answers, redacted (see [`crate::secrets`]): every
/// result leaves the server through here. One whose redacted form does not
/// read as a result any more is withheld.
fn redacted(result: CallToolResult) -> CallToolResult {
    let result = crate::secrets::redact_typed(result).unwrap_or_else(|_| {
        tool_error("the result held a secret that could not be redacted in place; it was withheld")
    });
    // A redaction marker is longer than the bytes it replaces: a result
    // fitted to the maximum may have grown past what clients read.
    let size = serde_json::to_vec(&result).map_or(usize::MAX, |b| b.len());
    if size > fit::MAX_RESULT_BYTES + REDACTION_ROOM {
        return tool_error(format!(
            "the result grew to {size} bytes when the secrets in it were redacted, past the \
             {} bytes a result may take; it was withheld",
            fit::MAX_RESULT_BYTES
        ));
    }
    result
}

/// How far redaction may grow a result past [`fit::MAX_RESULT_BYTES`]
/// and still leave it within the 1 MiB the strictest client reads.
const REDACTION_ROOM: usize = 48 * 1024;

fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn structured(text: String, value: Value, is_error: bool) -> CallToolResult {
    let mut r = CallToolResult::structured(value);
    r.content = vec![ContentBlock::text(text)];
    r.is_error = Some(is_error);
    r
}

/// The MCP result for a cell: the data a program needs as
/// structuredContent, a bounded readable rendering as content (see
/// [`fit`]), isError for every status but ok.
pub fn cell_tool_result(r: CellResult, verbose: bool) -> Result<CallToolResult, ErrorData> {
    fit::tool_result(r, verbose).map_err(|e| {
        ErrorData::internal_error(format!("failed to encode the cell result: {e}"), None)
    })
}

/// One cell's live output on its way to the client: each stream redacted
/// as one text (see [`crate::secrets::StreamRedaction`]), so that a secret
/// written in two pieces is caught across them.
struct LiveOutput {
    stdout: crate::secrets::StreamRedaction,
    stderr: crate::secrets::StreamRedaction,
}

impl LiveOutput {
    fn new() -> LiveOutput {
        LiveOutput {
            stdout: crate::secrets::StreamRedaction::new(crate::secrets::Reader::Tenant),
            stderr: crate::secrets::StreamRedaction::new(crate::secrets::Reader::Tenant),
        }
    }

    fn stream(&mut self, s: cellbox_output::OutputStream) -> &mut crate::secrets::StreamRedaction {
        match s {
            cellbox_output::OutputStream::Stdout => &mut self.stdout,
            cellbox_output::OutputStream::Stderr => &mut self.stderr,
        }
    }

    /// Send what of `chunk` may go out now.
    async fn send(
        &mut self,
        peer: &rmcp::service::Peer<RoleServer>,
        chunk: cellbox_output::OutputChunk,
        session_id: &Option<String>,
    ) {
        let text = self.stream(chunk.stream).push(&chunk.text);
        send_output(peer, chunk.stream, text, session_id).await;
    }

    /// The cell ended: send what each stream held back.
    async fn finish(
        &mut self,
        peer: &rmcp::service::Peer<RoleServer>,
        session_id: &Option<String>,
    ) {
        for s in [
            cellbox_output::OutputStream::Stdout,
            cellbox_output::OutputStream::Stderr,
        ] {
            let text = self.stream(s).finish();
            send_output(peer, s, text, session_id).await;
        }
    }
}

/// One piece of a cell's output (already redacted) to the client, as a log
/// notification (logger "stdout" / "stderr"). Deprecated by SEP-2577 (see
/// `execute_code`), still how MCP hosts show live output.
#[allow(deprecated)]
async fn send_output(
    peer: &rmcp::service::Peer<RoleServer>,
    stream: cellbox_output::OutputStream,
    text: String,
    session_id: &Option<String>,
) {
    if text.is_empty() {
        return;
    }
    let logger = match stream {
        cellbox_output::OutputStream::Stdout => "stdout",
        cellbox_output::OutputStream::Stderr => "stderr",
    };
    let param = LoggingMessageNotificationParam::new(
        LoggingLevel::Info,
        json!({
            "stream": logger,
            "text": text,
            "session_id": session_id,
        }),
    )
    .with_logger(logger);
    if let Err(e) = peer.notify_logging_message(param).await {
        tracing::debug!("could not send output: {e}");
    }
}

fn refused(language: Language, kind: ErrorKind, message: String, request_id: &str) -> CellResult {
    let mut run = RunInfo::root();
    run.request_id = Some(request_id.to_owned());
    CellResult::refused_with(language.as_str(), run, kind, message)
}

/// Where each call's line is logged (at INFO; see docs/service.md).
pub const CALLS_LOG: &str = "cellbox::serve::calls";

/// A new request id: unique within this server (its start time and a
/// count), short enough to quote.
fn new_request_id() -> String {
    static START: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    });
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("req-{:x}-{n}", *START)
}

/// What a call's log line says of a cell's result: its status and error
/// type, and its wall time.
fn cell_fields(r: &CallToolResult) -> (Option<String>, Option<String>, Option<u64>) {
    let Some(v) = r.structured_content.as_ref() else {
        return (None, None, None);
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    (
        text(v.get("status")),
        text(v.pointer("/error/type")),
        v.pointer("/usage/wall_ms").and_then(Value::as_u64),
    )
}

fn parse_args<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Option<JsonObject>,
) -> Result<T, ErrorData> {
    serde_json::from_value(Value::Object(args.unwrap_or_default()))
        .map_err(|e| ErrorData::invalid_params(format!("{tool}: invalid arguments: {e}"), None))
}

/// How a running call ended when it did not produce a result.
enum Interrupted {
    /// The client cancelled the request or went away.
    Cancelled,
    ShuttingDown,
    SessionClosed,
    /// The server is draining and the call ran past the drain timeout.
    Draining,
}

/// Who sent a request, for what the server keeps between one client's
/// requests: over HTTP, where each POST is a connection of its own, the
/// [`Principal`] the listener put on it (one per bearer token; every client
/// of a server without a token is [`Principal::local`]); over stdio, the
/// one client.
pub(crate) fn client_of(ext: &rmcp::model::Extensions) -> String {
    match ext.get::<http::request::Parts>() {
        Some(parts) => match parts.extensions.get::<Principal>() {
            Some(p) => principal_key(p),
            // The listener puts a principal on every request it passes on.
            None => "http:unknown".to_owned(),
        },
        None => "stdio".to_owned(),
    }
}

/// The [`client_of`] key of a principal over HTTP.
pub(crate) fn principal_key(p: &Principal) -> String {
    format!("principal:{}", p.name())
}

/// A request id as a map key: its JSON text, so `5` and `"5"` differ.
fn id_key(id: &Value) -> String {
    id.to_string()
}

/// Severity order of the MCP log levels (RFC 5424, least severe first).
#[allow(deprecated)]
fn severity(l: LoggingLevel) -> u8 {
    match l {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Running calls by (client, request id): each with a serial number and
/// the token that cancels it.
type InflightTable = std::sync::Mutex<HashMap<(String, String), Vec<(u64, CancellationToken)>>>;

static CALL_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A running call's entry in the in-flight table, removed when dropped.
struct Inflight {
    table: Arc<InflightTable>,
    key: (String, String),
    serial: u64,
    token: CancellationToken,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        let mut t = crate::util::lock(&self.table);
        if let Some(v) = t.get_mut(&self.key) {
            v.retain(|(n, _)| *n != self.serial);
            if v.is_empty() {
                t.remove(&self.key);
            }
        }
    }
}

impl CellboxServer {
    /// Cancel the running calls that `client` made with request `id`
    /// (a `notifications/cancelled` seen by the HTTP listener). Returns how
    /// many there were. Ids are the client's own: clients that share a
    /// principal (the same token, or no token) and reuse an id cancel each
    /// other's call.
    pub fn cancel_request(&self, client: &Principal, id: &Value) -> usize {
        let t = crate::util::lock(&self.state.inflight);
        let Some(v) = t.get(&(principal_key(client), id_key(id))) else {
            return 0;
        };
        for (_, token) in v {
            token.cancel();
        }
        v.len()
    }

    fn track(&self, ctx: &RequestContext<RoleServer>) -> Inflight {
        let id = serde_json::to_value(&ctx.id).unwrap_or(Value::Null);
        let key = (client_of(&ctx.extensions), id_key(&id));
        let token = CancellationToken::new();
        let serial = CALL_SERIAL.fetch_add(1, Ordering::Relaxed);
        crate::util::lock(&self.state.inflight)
            .entry(key.clone())
            .or_default()
            .push((serial, token.clone()));
        Inflight {
            table: self.state.inflight.clone(),
            key,
            serial,
            token,
        }
    }

    /// Whether log notifications at `level` go to the client of this
    /// request: at or above the level the request names in `_meta`
    /// (protocol 2026-07-28, where a request without one gets none), else
    /// the one the client set with `logging/setLevel` (all when it set none).
    #[allow(deprecated)]
    fn logs(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel) -> bool {
        if let Some(min) = ctx.meta.log_level() {
            return severity(level) >= severity(min);
        }
        if ctx
            .meta
            .contains_key("io.modelcontextprotocol/protocolVersion")
        {
            return false;
        }
        let levels = crate::util::lock(&self.state.log_levels);
        levels
            .get(&client_of(&ctx.extensions))
            .is_none_or(|min| severity(level) >= severity(*min))
    }

    pub fn new(sup: Supervisor, settings: Settings, shutdown: CancellationToken) -> Self {
        let accounts = Arc::new(super::principal::Accounts::new(
            settings.principals.clone(),
            settings.session.policy.clone(),
        ));
        let sessions = SessionTable::new(
            sup.clone(),
            settings.session.clone(),
            settings.max_sessions,
            settings.max_sessions_per_principal,
            settings.idle_expiry,
        );
        let gate = Gate::new(
            settings.max_concurrency,
            settings.max_queue,
            settings.max_queue_per_principal,
        );
        CellboxServer {
            state: Arc::new(State {
                sup,
                settings,
                accounts,
                sessions,
                gate,
                shutdown,
                ops: super::ops::Ops::default(),
                observed: tokio::sync::OnceCell::new(),
                tools: tokio::sync::OnceCell::new(),
                pools: tokio::sync::OnceCell::new(),
                log_levels: std::sync::Mutex::new(HashMap::new()),
                inflight: Arc::default(),
                tenants: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The account a session or cell of `principal` runs under: its
    /// tenant (see [`CellboxServer::tenant`]) and its budgets (see
    /// [`super::principal::Accounts`]).
    pub(crate) fn account(&self, principal: &Principal) -> crate::Account {
        crate::Account::principal(
            self.tenant(principal),
            self.state.accounts.ledger(principal),
        )
    }

    /// `principal` as the supervisor knows it (made at its first call).
    pub(crate) fn tenant(&self, principal: &Principal) -> crate::Tenant {
        let st = &self.state;
        crate::util::lock(&st.tenants)
            .entry(principal.clone())
            .or_insert_with(|| {
                crate::Tenant::new(
                    principal.name(),
                    st.settings.own_workspaces,
                    st.settings.max_held_bytes_per_principal,
                )
            })
            .clone()
    }

    /// A host tool offered without a cell (a file tool,
    /// `aggregate_context`): for the caller's principal (its workspace,
    /// its budget of held bytes), through the same gate and queue as a
    /// cell, holding its slot until the tool's work is over, and stopped
    /// when the call is cancelled.
    async fn direct_tool(
        &self,
        cap: crate::Capability,
        args: Option<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let st = &self.state;
        let principal = Principal::of(&ctx)?;
        let admission = match st.gate.admit(&principal) {
            Ok(a) => a,
            Err(refusal) => {
                let kind = match refusal {
                    Refused::Busy(_) => ErrorKind::ServerBusy,
                    Refused::PrincipalBusy(_) => ErrorKind::ClientQueueFull,
                };
                crate::metrics::get().refusal(kind.as_str());
                return Ok(direct_refusal(kind, refusal.to_string()));
            }
        };
        // A tool called without a cell is a tool call of its principal,
        // like one from a cell; counted once the server took it in (a call
        // refused as busy did nothing, and costs nothing).
        if let Err(e) = self
            .account(&principal)
            .chain
            .charge(crate::Metered::Tool, 1)
        {
            return Ok(direct_refusal(
                ErrorKind::LimitExceeded,
                format!("{}: {e}", cap.name()),
            ));
        }
        let tenant = self.tenant(&principal);
        let stop = CancellationToken::new();
        let name = cap.name().to_owned();
        // A task of its own, so that a caller that goes away frees the
        // slot only once the tool has stopped (its work runs on a blocking
        // thread that sees `stop`).
        let mut task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let slot = tokio::select! {
                    s = admission.slot() => s,
                    _ = stop.cancelled() => return None,
                };
                let done = cap
                    .call_direct(args.unwrap_or_default(), Some(tenant), stop)
                    .await;
                drop((slot, admission));
                Some(done)
            }
        });
        let cancel = self.track(&ctx);
        let outcome = tokio::select! {
            r = &mut task => Ok(r),
            _ = ctx.ct.cancelled() => Err(Interrupted::Cancelled),
            _ = cancel.token.cancelled() => Err(Interrupted::Cancelled),
            _ = st.shutdown.cancelled() => Err(Interrupted::ShuttingDown),
            _ = st.ops.expired().cancelled() => Err(Interrupted::Draining),
        };
        match outcome {
            Ok(Ok(Some(Ok(v)))) => Ok(fit::value_result(v, false)),
            Ok(Ok(Some(Err(e)))) => Ok(fit::value_result(
                json!({"error": format!("{name}: {e}")}),
                true,
            )),
            Ok(Ok(None)) | Err(Interrupted::Cancelled) | Err(Interrupted::SessionClosed) => {
                stop.cancel();
                Err(ErrorData::internal_error(
                    format!("the call was cancelled; {name} was stopped"),
                    None,
                ))
            }
            Ok(Err(e)) => Err(ErrorData::internal_error(
                format!("{name} failed: {e}"),
                None,
            )),
            Err(Interrupted::ShuttingDown) | Err(Interrupted::Draining) => {
                stop.cancel();
                Err(ErrorData::internal_error(
                    "the server is shutting down; the call was stopped",
                    None,
                ))
            }
        }
    }

    pub fn sessions(&self) -> &SessionTable {
        &self.state.sessions
    }

    /// The server's operating state (see [`super::ops`]).
    pub fn ops(&self) -> &super::ops::Ops {
        &self.state.ops
    }

    /// The probe's findings, once the warm workers are up and the sandbox
    /// was probed (the first `tools/list` is answered then).
    pub fn warmed(&self) -> Option<&Observations> {
        self.state.tools.get()?;
        self.state.observed.get()
    }

    pub fn gate(&self) -> &Gate {
        &self.state.gate
    }

    /// The supervisor that runs the calls' cells.
    pub(crate) fn supervisor(&self) -> &Supervisor {
        &self.state.sup
    }

    /// Run the sandbox probe once (tool descriptions wait for it).
    pub async fn observations(&self) -> &Observations {
        let st = &self.state;
        st.observed
            .get_or_init(|| describe::probe(&st.sup, &st.settings))
            .await
    }

    /// Start the warm workers (the Rhai fork server, the Python zygotes),
    /// once; without them cells run cold. A cell that comes first waits
    /// only for the worker it needs.
    pub async fn start_pools(&self) {
        self.state
            .pools
            .get_or_init(|| async {
                if let Err(e) = self.state.sup.start_pools().await {
                    crate::report!("cellbox serve: warm workers unavailable, cells run cold: {e}");
                }
            })
            .await;
    }

    /// The tools, with descriptions that include the probe's findings. The
    /// first call starts the warm workers and probes the sandbox at once,
    /// and once the workers are up prepares the session of the first call
    /// that names none (its workers forked from them); it returns once all
    /// is done: a client that has the tool list meets a server at rest.
    pub async fn list(&self) -> &[Tool] {
        self.state
            .tools
            .get_or_init(|| async {
                let warm = async {
                    self.start_pools().await;
                    let session = self.state.settings.session.clone();
                    self.state.sup.prepare_for_runs(session).await;
                };
                let ((), observed) = tokio::join!(warm, self.observations());
                self.tools(Some(observed))
            })
            .await
    }

    fn tools(&self, observed: Option<&Observations>) -> Vec<Tool> {
        let st = &self.state;
        let facts = Facts::new(&st.sup, &st.settings, observed);
        let limits = &st.settings.session.limits;
        // Closed world only when every language's probe got its own network
        // namespace and no capability is allowed to reach out for it.
        let isolated = observed.is_some_and(|o| {
            st.settings.languages.iter().all(|l| {
                o.get(l)
                    .and_then(|ob| ob.sandbox.as_ref())
                    .is_some_and(|r| r.namespaces.iter().any(|n| n == "net"))
            })
        }) && st.settings.session.policy.allow.is_empty();
        let exec = Tool::new(
            "execute_code",
            facts.execute_code(),
            schema::execute_code_input(
                &st.settings.languages,
                limits.timeout_ms as f64 / 1000.0,
                limits.max_output_bytes,
                facts.long,
            ),
        )
        .with_title("Run code in a sandbox")
        .with_raw_output_schema(Arc::new(match st.settings.output_schema {
            OutputSchema::Full => schema::cell_result(),
            OutputSchema::Compact | OutputSchema::None => schema::cell_result_compact(),
        }))
        .with_annotations(
            // The title once, in the short form.
            if facts.long {
                ToolAnnotations::with_title("Run code in a sandbox")
            } else {
                ToolAnnotations::new()
            }
            .read_only(false)
            .idempotent(false)
            .open_world(!isolated),
        );
        let session_tool = |name: &'static str, desc: String, input: JsonObject, output| {
            Tool::new(name, desc, input)
                .with_raw_output_schema(Arc::new(output))
                .with_annotations(ToolAnnotations::new().open_world(false))
        };
        let mut tools = vec![
            exec,
            session_tool(
                "create_session",
                facts.create_session(),
                schema::no_input(),
                schema::created_session(),
            ),
            session_tool(
                "reset_session",
                facts.reset_session(),
                schema::session_id_input(facts.long),
                schema::session_done(),
            ),
            session_tool(
                "close_session",
                facts.close_session(),
                schema::session_id_input(facts.long),
                schema::session_done(),
            ),
            session_tool(
                "list_sessions",
                facts.list_sessions(),
                schema::no_input(),
                schema::session_list(),
            ),
            session_tool(
                "checkpoint_session",
                facts.checkpoint_session(),
                schema::checkpoint_input(facts.long),
                schema::session_done(),
            ),
            session_tool(
                "restore_session",
                facts.restore_session(),
                schema::checkpoint_input(facts.long),
                schema::session_done(),
            ),
        ];
        #[cfg(target_os = "linux")]
        tools.extend(super::session_files::tools(
            super::session_files::limits(&st.settings),
            facts.long,
        ));
        tools.extend(direct_tools(&st.sup, facts.long));
        // Results carry structuredContent either way; without a listed
        // schema a client has nothing to check it against, and nothing to
        // read on every request.
        if st.settings.output_schema == OutputSchema::None {
            for t in &mut tools {
                t.output_schema = None;
            }
        }
        // Unknown arguments are refused either way, with a message saying
        // which; the short form does not list that.
        if !facts.long {
            for t in &mut tools {
                Arc::make_mut(&mut t.input_schema).remove("additionalProperties");
            }
        }
        tools.into_iter().map(schema::with_dialect).collect()
    }

    // Logging notifications are how MCP hosts show live output today;
    // SEP-2577 deprecates them in favour of a successor not yet in rmcp.
    #[allow(deprecated)]
    async fn execute_code(
        &self,
        args: Option<JsonObject>,
        ctx: RequestContext<RoleServer>,
        request_id: &str,
    ) -> Result<CallToolResult, ErrorData> {
        let st = &self.state;
        let principal = Principal::of(&ctx)?;
        let a: ExecuteArgs = parse_args("execute_code", args)?;
        let language: Language = a
            .language
            .parse()
            .ok()
            .filter(|l| st.settings.languages.contains(l))
            .ok_or_else(|| {
                let langs: Vec<&str> = st.settings.languages.iter().map(|l| l.as_str()).collect();
                ErrorData::invalid_params(
                    format!(
                        "execute_code: language {:?} is not available here; use one of: {}",
                        a.language,
                        langs.join(", ")
                    ),
                    None,
                )
            })?;
        let mut request = CellRequest::new(language, a.code);
        request.request_id = Some(request_id.to_owned());
        if let Some(t) = a.timeout_seconds {
            if !(t.is_finite() && t > 0.0) {
                return Err(ErrorData::invalid_params(
                    format!("execute_code: timeout_seconds {t}: give a number of seconds above 0"),
                    None,
                ));
            }
            // Values above the configured limit are lowered to it by
            // `Limits::tighten`; clamp first so the conversion cannot overflow.
            let ms = (t * 1000.0).ceil().min(u64::MAX as f64 / 2.0) as u64;
            request.limits.timeout_ms = Some(ms.max(1));
        }
        if let Some(m) = a.max_output_bytes {
            if m == 0 {
                return Err(ErrorData::invalid_params(
                    "execute_code: max_output_bytes must be at least 1",
                    None,
                ));
            }
            request.limits.max_output_bytes = Some(m);
        }
        // A client that asked for progress also gets the cell's output live,
        // as log notifications (logger "stdout" / "stderr").
        let progress_token = ctx.meta.get_progress_token();
        let mut live = None;
        if progress_token.is_some() && self.logs(&ctx, LoggingLevel::Info) {
            let (tx, rx) = tokio::sync::mpsc::channel::<cellbox_output::OutputChunk>(64);
            request.output = Some(tx);
            live = Some(rx);
        }

        let lease = match &a.session_id {
            Some(id) => match st.sessions.lease(&principal, id) {
                Ok(l) => Some(l),
                Err(e) => {
                    let kind = match e {
                        SessionError::Unknown { .. } => ErrorKind::UnknownSession,
                        _ => ErrorKind::SessionError,
                    };
                    return cell_tool_result(
                        refused(language, kind, e.to_string(), request_id),
                        a.verbose,
                    );
                }
            },
            None => None,
        };
        let admission = match st.gate.admit(&principal) {
            Ok(a) => a,
            Err(refusal) => {
                let kind = match refusal {
                    Refused::Busy(_) => ErrorKind::ServerBusy,
                    Refused::PrincipalBusy(_) => ErrorKind::ClientQueueFull,
                };
                crate::metrics::get().refusal(kind.as_str());
                return cell_tool_result(
                    refused(language, kind, refusal.to_string(), request_id),
                    a.verbose,
                );
            }
        };

        let timeout_s = st
            .settings
            .session
            .limits
            .tighten(&request.limits)
            .timeout_ms as f64
            / 1000.0;
        let running = AtomicBool::new(false);
        let closed = lease.as_ref().map(|l| l.closed.clone()).unwrap_or_default();
        let admitted = Instant::now();
        let work = async {
            // One call at a time per session, in arrival order; then a slot.
            let _lane = match &lease {
                Some(l) => Some(l.lane.clone().lock_owned().await),
                None => None,
            };
            let slot = admission.slot().await;
            crate::metrics::get().queued(admitted.elapsed().as_secs_f64());
            running.store(true, Ordering::Release);
            let (result, tail) = match &lease {
                Some(l) => {
                    let result = l.session.run(request).await;
                    (result, l.session.tail())
                }
                None => {
                    // A cell without a session of its own runs for its
                    // caller (a session's cells for the session's owner).
                    let config = crate::SessionConfig {
                        account: self.account(&principal),
                        ..st.settings.session.clone()
                    };
                    st.sup.run_answered(request, config).await
                }
            };
            // A cell answered at its worker's `done` keeps its slot until
            // its worker and process tree are gone.
            if let Some(t) = tail {
                tokio::spawn(async move {
                    t.wait().await;
                    drop(slot);
                });
            }
            result
        };
        let cancel = self.track(&ctx);
        let started = Instant::now();
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + st.settings.progress_interval,
            st.settings.progress_interval,
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(work);
        let mut shown = LiveOutput::new();
        let outcome = loop {
            tokio::select! {
                r = &mut work => break Ok(r),
                _ = ctx.ct.cancelled() => break Err(Interrupted::Cancelled),
                _ = cancel.token.cancelled() => break Err(Interrupted::Cancelled),
                _ = st.shutdown.cancelled() => break Err(Interrupted::ShuttingDown),
                _ = st.ops.expired().cancelled() => break Err(Interrupted::Draining),
                _ = closed.cancelled() => break Err(Interrupted::SessionClosed),
                Some(chunk) = async {
                    match live.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => shown.send(&ctx.peer, chunk, &a.session_id).await,
                _ = ticks.tick(), if progress_token.is_some() => {
                    if let Some(token) = &progress_token {
                        let elapsed = started.elapsed().as_secs_f64();
                        let message = if running.load(Ordering::Acquire) {
                            format!("{language} cell running for {elapsed:.0} s")
                        } else {
                            format!("waiting for a free slot for {elapsed:.0} s")
                        };
                        let p = ProgressNotificationParam::new(token.clone(), elapsed)
                            .with_total(timeout_s.max(elapsed))
                            .with_message(message);
                        if let Err(e) = ctx.peer.notify_progress(p).await {
                            tracing::debug!("could not send progress: {e}");
                        }
                    }
                }
            }
        };
        // Output the cell wrote just before it ended may still be queued:
        // it goes out before the result.
        if let (Ok(_), Some(rx)) = (&outcome, live.as_mut()) {
            while let Ok(chunk) = rx.try_recv() {
                shown.send(&ctx.peer, chunk, &a.session_id).await;
            }
            shown.finish(&ctx.peer, &a.session_id).await;
        }
        // Leaving the loop drops `work` with everything it holds: a cell
        // still running is killed and reaped, its slot and lane are freed.
        match outcome {
            Ok(result) => cell_tool_result(result, a.verbose),
            Err(Interrupted::SessionClosed) => cell_tool_result(
                refused(
                    language,
                    ErrorKind::Killed,
                    "the session was closed while this cell ran; the cell was killed".into(),
                    request_id,
                ),
                a.verbose,
            ),
            Err(Interrupted::Draining) => cell_tool_result(
                refused(
                    language,
                    ErrorKind::Draining,
                    "the server is stopping and this cell ran past the drain timeout; \
                     the cell was killed"
                        .into(),
                    request_id,
                ),
                a.verbose,
            ),
            Err(Interrupted::Cancelled) => Err(ErrorData::internal_error(
                "the call was cancelled; its cell was killed",
                None,
            )),
            Err(Interrupted::ShuttingDown) => Err(ErrorData::internal_error(
                "the server is shutting down; the cell was killed",
                None,
            )),
        }
    }

    /// The session tools, for `principal`: its own sessions only; another
    /// principal's session id answers as an unknown one.
    async fn session_tool(
        &self,
        principal: &Principal,
        name: &str,
        args: Option<JsonObject>,
    ) -> Result<CallToolResult, ErrorData> {
        let sessions = &self.state.sessions;
        let idle = sessions.idle_expiry().as_secs();
        match name {
            "create_session" => {
                let _: NoArgs = parse_args(name, args)?;
                match sessions.create(principal, self.account(principal)) {
                    Ok(id) => Ok(structured(
                        format!(
                            "Created session {id}. Pass session_id={id:?} to execute_code to \
                             keep variables, definitions and files between calls. It closes \
                             after {idle} s without a call."
                        ),
                        json!({
                            "session_id": id,
                            "idle_expiry_seconds": idle,
                            "sessions_open": sessions.held_by(principal),
                            "max_sessions": sessions.max_per_principal(),
                        }),
                        false,
                    )),
                    Err(e) => Ok(tool_error(e.to_string())),
                }
            }
            "reset_session" => {
                let a: SessionArgs = parse_args(name, args)?;
                match sessions.reset(principal, &a.session_id).await {
                    Ok(()) => Ok(structured(
                        format!(
                            "Session {} reset: variables and definitions forgotten, files kept.",
                            a.session_id
                        ),
                        json!({"session_id": a.session_id, "done": "reset"}),
                        false,
                    )),
                    Err(e) => Ok(tool_error(e.to_string())),
                }
            }
            "checkpoint_session" | "restore_session" => {
                let a: CheckpointArgs = parse_args(name, args)?;
                let restore = name == "restore_session";
                let done = if restore {
                    sessions.restore(principal, &a.session_id, &a.name).await
                } else {
                    sessions.checkpoint(principal, &a.session_id, &a.name).await
                };
                match done {
                    Ok(Ok(())) => {
                        let (verb, done) = if restore {
                            ("restored to", "restored")
                        } else {
                            ("checkpointed as", "checkpointed")
                        };
                        Ok(structured(
                            format!("Session {} {verb} {:?}.", a.session_id, a.name),
                            json!({"session_id": a.session_id, "done": done, "name": a.name}),
                            false,
                        ))
                    }
                    Ok(Err(e)) => Ok(tool_error(e.to_string())),
                    Err(e) => Ok(tool_error(e.to_string())),
                }
            }
            "close_session" => {
                let a: SessionArgs = parse_args(name, args)?;
                match sessions.close(principal, &a.session_id) {
                    Ok(()) => Ok(structured(
                        format!("Session {} closed.", a.session_id),
                        json!({"session_id": a.session_id, "done": "closed"}),
                        false,
                    )),
                    Err(e) => Ok(tool_error(e.to_string())),
                }
            }
            "list_sessions" => {
                let _: NoArgs = parse_args(name, args)?;
                // The caller's sessions, and nothing about the host (paths,
                // pids and cgroups are for `cellbox doctor` and the logs).
                let list = sessions.list(principal).await;
                let mut text = if list.is_empty() {
                    "No open sessions.".to_owned()
                } else {
                    format!("{} open session(s):", list.len())
                };
                for s in &list {
                    text.push_str(&format!(
                        "\n- {}: {} cell(s) run, {}, expires in {} s, variables: {}",
                        s.session_id,
                        s.execution_count,
                        if s.busy { "running a cell" } else { "idle" },
                        s.expires_in_seconds,
                        if s.variables.is_empty() {
                            "(none)".to_owned()
                        } else {
                            s.variables.join(", ")
                        }
                    ));
                }
                let value = json!({
                    "sessions": list,
                    "max_sessions": sessions.max_per_principal(),
                    "idle_expiry_seconds": idle,
                });
                Ok(structured(text, value, false))
            }
            #[cfg(target_os = "linux")]
            name if super::session_files::TOOLS.contains(&name) => {
                let args = args.unwrap_or_default();
                let id = args
                    .get("session_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ErrorData::invalid_params(format!("{name} needs a session_id"), None)
                    })?
                    .to_owned();
                let lease = match sessions.lease(principal, &id) {
                    Ok(l) => l,
                    Err(e) => return Ok(tool_error(e.to_string())),
                };
                // After the session's running cell, before its next one.
                let lane = lease.lane.clone();
                let _turn = lane.lock().await;
                let dir = match lease.session.scratch_dir() {
                    Ok(d) => d.to_path_buf(),
                    Err(e) => return Ok(tool_error(e.to_string())),
                };
                let limits = super::session_files::limits(&self.state.settings);
                // What the call holds while it runs is its principal's.
                let held = match crate::supervisor::tenant::Held::take(
                    self.tenant(principal).ledger(),
                    super::session_files::held_bound(name, limits),
                    &format!("a {name} call"),
                ) {
                    Ok(h) => h,
                    Err(e) => {
                        return Ok(direct_refusal(
                            ErrorKind::LimitExceeded,
                            format!("limit_exceeded: {e}"),
                        ))
                    }
                };
                let name = name.to_owned();
                tokio::task::spawn_blocking(move || {
                    let _held = held;
                    super::session_files::call(&name, &dir, limits, args)
                })
                .await
                .map_err(|e| ErrorData::internal_error(format!("{e}"), None))?
                .map_err(|m| ErrorData::invalid_params(m, None))
            }
            other => {
                // The tools this server lists, whatever they are.
                let names: Vec<String> = self
                    .tools(self.state.observed.get())
                    .into_iter()
                    .map(|t| t.name.to_string())
                    .collect();
                let listed = match names.split_last() {
                    Some((last, [])) => last.clone(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => "none".to_owned(),
                };
                Err(ErrorData::invalid_params(
                    format!("unknown tool {other:?}: use {listed}"),
                    None,
                ))
            }
        }
    }
}

impl ServerHandler for CellboxServer {
    // Logging notifications are how MCP hosts show live output today;
    // SEP-2577 deprecates them in favour of a successor not yet in rmcp.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let st = &self.state;
        let facts = Facts::new(&st.sup, &st.settings, st.observed.get());
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("cellbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(facts.instructions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.list().await.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        match self.state.tools.get() {
            Some(tools) => tools.iter().find(|t| t.name == name).cloned(),
            None => self
                .tools(self.state.observed.get())
                .into_iter()
                .find(|t| t.name == name),
        }
    }

    /// `logging/setLevel`: log notifications below `level` are no longer
    /// sent to this client (live output is sent at level info).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        crate::util::lock(&self.state.log_levels)
            .insert(client_of(&context.extensions), request.level);
        Ok(())
    }

    /// Requests rmcp could not read into their type: the stand-in for a
    /// message too long to read (see [`super::lines`]) or one that did not
    /// parse (see [`super::jsonrpc`]), and a known method whose params have
    /// the wrong shape. Each is answered with what was wrong, so the
    /// client's request does not wait forever.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        // A known method whose params rmcp could not read arrives here:
        // for logging/setLevel that is a level not in the protocol.
        if request.method == "logging/setLevel" {
            let level = request
                .params
                .as_ref()
                .and_then(|p| p.get("level"))
                .map(Value::to_string)
                .unwrap_or_else(|| "nothing".into());
            return Err(ErrorData::invalid_params(
                format!(
                    "logging/setLevel: level must be one of debug, info, notice, warning, \
                     error, critical, alert, emergency; got {level}"
                ),
                None,
            ));
        }
        use super::jsonrpc;
        if request.method == jsonrpc::INVALID_METHOD {
            let p = request.params.unwrap_or_default();
            return Err(jsonrpc::error_for(
                p.get("method").and_then(Value::as_str),
                p.get("params_wrong")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                p.get("problem")
                    .and_then(Value::as_str)
                    .unwrap_or("unreadable"),
            ));
        }
        if jsonrpc::is_client_method(&request.method) {
            let problem = jsonrpc::params_problem(&request.method, request.params.as_ref());
            return Err(jsonrpc::error_for(
                Some(&request.method),
                true,
                problem
                    .as_deref()
                    .unwrap_or("the params do not have the shape this method takes"),
            ));
        }
        if request.method != super::lines::OVERSIZED_METHOD {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {:?}", request.method),
                None,
            ));
        }
        let p = request.params.unwrap_or_default();
        let what = match p.get("method").and_then(Value::as_str) {
            Some(m) => format!("the {m} request"),
            None => "the message".to_owned(),
        };
        let bytes = p.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        let limit = p.get("limit").and_then(Value::as_u64).unwrap_or(0);
        let max_script = self.state.settings.session.limits.max_script_bytes;
        Err(ErrorData::invalid_request(
            format!(
                "{what} was {bytes} bytes, over the limit of {limit} bytes for one message \
                 (scripts may be {max_script} bytes); it was not read"
            ),
            None,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.state.ops.call_begun();
        // Counted under its name when it is one of the tools listed.
        let tool = match self.get_tool(&request.name) {
            Some(t) => t.name.to_string(),
            None => crate::metrics::UNKNOWN.to_owned(),
        };
        if self.state.ops.is_draining() {
            let m = crate::metrics::get();
            m.refusal(ErrorKind::Draining.as_str());
            m.tool_call(tool, "refused");
            return Err(ErrorData::new(
                rmcp::model::ErrorCode(super::ops::DRAINING_CODE),
                super::ops::DRAINING,
                None,
            ));
        }
        // Every log line of the call carries its request id, principal,
        // tool and session (a session id as the client gave it, cut short).
        let request_id = new_request_id();
        let principal = Principal::of(&context)
            .map(|p| p.name().to_owned())
            .unwrap_or_default();
        let session_id: String = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("session_id"))
            .and_then(Value::as_str)
            .map(|s| s.chars().take(64).collect())
            .unwrap_or_default();
        let span = tracing::info_span!(
            "call",
            request_id = %request_id,
            principal = %principal,
            tool = %tool,
            session_id = %session_id,
        );
        let t0 = Instant::now();
        let answered = self
            .answer(request, context, &request_id)
            .instrument(span.clone())
            .await;
        let outcome = match &answered {
            Ok(r) if r.is_error == Some(true) => "error",
            Ok(_) => "ok",
            Err(_) => "failed",
        };
        let (status, error_type, wall_ms) =
            answered.as_ref().map_or((None, None, None), cell_fields);
        span.in_scope(|| {
            tracing::info!(
                target: CALLS_LOG,
                outcome,
                status = status.as_deref(),
                error_type = error_type.as_deref(),
                wall_ms,
                ms = t0.elapsed().as_millis() as u64,
                "call answered"
            )
        });
        crate::metrics::get().tool_call(tool, outcome);
        Ok(redacted(answered?).into())
    }
}

impl CellboxServer {
    /// A tool call's result, before redaction.
    async fn answer(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        request_id: &str,
    ) -> Result<CallToolResult, ErrorData> {
        let result = match request.name.as_ref() {
            "execute_code" => {
                self.execute_code(request.arguments, context, request_id)
                    .await?
            }
            other if direct_capability(&self.state.sup, other).is_some() => {
                let Some(cap) = direct_capability(&self.state.sup, other).cloned() else {
                    return Err(ErrorData::invalid_params(
                        format!("unknown tool {other:?}"),
                        None,
                    ));
                };
                self.direct_tool(cap, request.arguments, context).await?
            }
            // Answers that grow with what a tenant made (a listing of its
            // sessions' variables, of its files) are held to the maximum
            // like a cell's.
            other => {
                let principal = Principal::of(&context)?;
                fit::held_to_max(
                    self.session_tool(&principal, other, request.arguments)
                        .await?,
                )
            }
        };
        Ok(result)
    }
}
