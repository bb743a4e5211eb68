//! `cellbox serve` settings: a strictly parsed TOML file, the same settings as
//! command-line flags (a flag wins over the file), and the validated
//! [`Settings`] the server runs with.
//!
//! Every error names the key it is about, in both spellings when a flag
//! exists (`server.max_concurrency (--max-concurrency)`), so an operator can
//! find it in either place.

use super::principal::{self, NamedToken};
use crate::cli::CellArgs;
use crate::{Language, Limits, Policy, SessionConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest config or token file we agree to read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Longest wall-clock limit a cell may be given.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// The `cellbox serve` flags. Each one overrides the config file.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(
    mut_arg("timeout", |a| a.help("Wall-clock limit per cell in seconds (calls may only lower it)")),
    mut_arg("max_output", |a| a.help("Bytes of stdout (and of stderr) kept per cell (calls may only lower it)")),
    mut_arg("memory", |a| a.help("Memory limit per cell in bytes")),
    mut_arg("max_operations", |a| a.help("Rhai: operations before the engine stops a script (0 = no limit)")),
    mut_arg("python", |a| a.help("Python interpreter for python cells (default: the real python3 on PATH)")),
)]
pub struct ServeArgs {
    /// Read settings from this TOML file (see examples/cellbox.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve MCP over streamable HTTP on this address (loopback only unless
    /// --listen-public) instead of stdio.
    #[arg(long, value_name = "ADDR:PORT")]
    pub http: Option<String>,
    /// Allow --http on a non-loopback address. Requires --token-file.
    #[arg(long)]
    pub listen_public: bool,
    /// Require `Authorization: Bearer <token>` on every HTTP request: the
    /// file holds one token, or `NAME TOKEN` lines (one principal each);
    /// tokens are at least 16 characters.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// HTTP connections open at once; further ones are closed at once.
    #[arg(long = "max-connections", value_name = "N")]
    pub max_connections: Option<usize>,
    /// HTTP connections one peer address may hold before they authenticate.
    #[arg(long = "max-connections-per-peer", value_name = "N")]
    pub max_connections_per_peer: Option<usize>,
    /// Seconds an HTTP request body may take to arrive.
    #[arg(long = "body-timeout", value_name = "SECS")]
    pub body_timeout: Option<u64>,
    /// Languages `execute_code` accepts (comma-separated or repeated;
    /// default: python, rhai, shell).
    #[arg(long = "language", value_name = "LANG")]
    pub languages: Vec<String>,
    /// Sandbox profile for one language: LANG=NAME_OR_PATH (repeatable).
    #[arg(long = "profile", value_name = "LANG=PROFILE")]
    pub profiles: Vec<String>,
    /// `--allow`, `--timeout`, `--max-output`, `--memory`,
    /// `--max-operations`, `--python`, `--events`.
    #[command(flatten)]
    pub cell: CellArgs,
    /// How many sessions may exist at once.
    #[arg(long = "max-sessions", value_name = "N")]
    pub max_sessions: Option<usize>,
    /// How many sessions one principal (token) may hold at once.
    #[arg(long = "max-sessions-per-principal", value_name = "N")]
    pub max_sessions_per_principal: Option<usize>,
    /// Close a session after this many seconds without a call.
    #[arg(long = "session-idle-expiry", value_name = "SECS")]
    pub session_idle_expiry: Option<u64>,
    /// How many cells run at once; further calls wait in a queue.
    #[arg(long = "max-concurrency", value_name = "N")]
    pub max_concurrency: Option<usize>,
    /// How many calls may wait for a free slot; past that a call is refused.
    #[arg(long = "max-queue", value_name = "N")]
    pub max_queue: Option<usize>,
    /// How many calls of one principal (token) may wait for a slot.
    #[arg(long = "max-queue-per-principal", value_name = "N")]
    pub max_queue_per_principal: Option<usize>,
    /// Bytes the scratch directories of all cells may hold together,
    /// outside each session's own (a tmpfs; enforced when serving as root).
    #[arg(long = "scratch-bytes", value_name = "BYTES")]
    pub scratch_bytes: Option<u64>,
    /// Bytes one session's scratch may hold, its sub-cells' included (a
    /// tmpfs of the session's own; enforced when serving as root).
    #[arg(long = "session-scratch-bytes", value_name = "BYTES")]
    pub session_scratch_bytes: Option<u64>,
    /// Files, directories and links one session's scratch may hold.
    #[arg(long = "session-scratch-inodes", value_name = "N")]
    pub session_scratch_inodes: Option<u64>,
    /// Bytes of memory all cells may hold together, the warm workers
    /// included (a memory cgroup; enforced when serving as root).
    #[arg(long = "cells-memory-bytes", value_name = "BYTES")]
    pub cells_memory_bytes: Option<u64>,
    /// A cgroup per session and per cell (memory, processes, the cell's
    /// whole process tree); default true where the host allows it.
    #[arg(long = "session-cgroups", value_name = "BOOL")]
    pub session_cgroups: Option<bool>,
    /// Bytes the events file may hold before it is moved to FILE.1
    /// (replacing the older one); default 64 MiB.
    #[arg(long = "events-max-bytes", value_name = "BYTES")]
    pub events_max_bytes: Option<u64>,
    /// The output schema `execute_code` lists: `none` (no tool lists one;
    /// the default with short descriptions), `compact` (its top level
    /// typed, each nested part's shape in its description; the default with
    /// long descriptions) or `full` (every nested part typed too).
    #[arg(long = "output-schema", value_name = "none|compact|full")]
    pub output_schema: Option<OutputSchema>,
    /// How much `tools/list` says: `short` (what a model needs to call each
    /// tool; the default) or `long` (every detail, as docs/mcp.md shows).
    #[arg(long = "tool-descriptions", value_name = "short|long")]
    pub tool_descriptions: Option<ToolDescriptions>,
    /// Seconds running cells get to finish after SIGTERM or SIGINT before
    /// they are killed (default 25: inside Kubernetes' 30 s grace period).
    #[arg(long = "drain-timeout", value_name = "SECS")]
    pub drain_timeout: Option<u64>,
    /// Serve Prometheus metrics (`GET /metrics`), `/healthz` and `/readyz`
    /// on this address, e.g. 127.0.0.1:9464 (no token: nothing there is
    /// secret); over stdio too.
    #[arg(long = "metrics", value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Log lines as `text` (the default) or `json` (one object a line);
    /// also CELLBOX_LOG_FORMAT.
    #[arg(long = "log-format", value_name = "text|json")]
    pub log_format: Option<LogFormat>,
}

/// How `serve` writes its log lines to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line an event.
    #[default]
    Text,
    /// One JSON object a line (`tracing-subscriber`'s JSON layer).
    Json,
}

/// How much the tools' descriptions say (see [`crate::serve::describe`]).
///
/// Every client reads `tools/list` into its model's context, on every
/// request of an agent: the short form keeps it to a few kilobytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ToolDescriptions {
    /// What a model needs to call each tool well: the languages, the
    /// sandbox in a line, what persists, the limits, the capabilities.
    #[default]
    Short,
    /// Every detail: the paths each profile shows a cell, the limits'
    /// consequences, the queues, each input's meaning at length.
    Long,
}

/// The output schema `execute_code` lists (see [`crate::serve::schema`]).
///
/// Clients that check each result against its tool's output schema pay for
/// it on every call, and some pay per node of the schema itself: the
/// official Python SDK 1.x checks the schema against its metaschema on every
/// `tools/call`, about 8 ms for the full one and 1.6 ms for the compact one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OutputSchema {
    /// No tool lists an output schema (results still carry
    /// structuredContent): the default with short descriptions.
    #[default]
    None,
    /// The top level typed (every field, its type, the status values, what
    /// is required); each nested object's or list's shape written out in
    /// its description.
    Compact,
    /// Every nested object and list typed as well.
    Full,
}

/// Bytes of stdout (and of stderr) a `serve` call keeps by default: sized
/// for a model's context (about 8k tokens per stream) rather than the
/// library's 1 MiB. `limits.max_output_bytes` / `--max-output` change it.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 32 * 1024;

/// The config file. Unknown keys are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    pub server: ServerSection,
    pub http: HttpSection,
    pub sessions: SessionsSection,
    /// Sandbox profile per language (a built-in name or a TOML file).
    pub profiles: ProfilesSection,
    /// Limits for every cell; per-call limits may only tighten them.
    /// `max_output_bytes` defaults to [`DEFAULT_MAX_OUTPUT_BYTES`].
    #[serde(deserialize_with = "serve_limits")]
    pub limits: Limits,
    /// Capability allowlist and budgets for every cell.
    pub policy: Policy,
    /// Budgets per principal, over all its sessions and calls.
    pub principals: principal::PrincipalsSection,
    /// Model endpoints (`[models.NAME]`), offered to cells as
    /// `model_query` and `model_query_batched` when the policy allows them.
    pub models: crate::models::ModelsSection,
    /// `[files]`: roots and workspace of the file tools (none by default).
    #[cfg(target_os = "linux")]
    pub files: crate::files::FilesConfig,
    /// `[tools.NAME]`: declared tools (none by default).
    #[cfg(target_os = "linux")]
    pub tools: crate::tools::ToolsConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            server: ServerSection::default(),
            http: HttpSection::default(),
            sessions: SessionsSection::default(),
            profiles: ProfilesSection::default(),
            limits: Limits {
                max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
                ..Limits::default()
            },
            policy: Policy::default(),
            principals: Default::default(),
            models: Default::default(),
            #[cfg(target_os = "linux")]
            files: crate::files::FilesConfig::default(),
            #[cfg(target_os = "linux")]
            tools: crate::tools::ToolsConfig::default(),
        }
    }
}

/// `[limits]` as the library reads it, but with `serve`'s own default
/// output cap where the file does not set one.
fn serve_limits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Limits, D::Error> {
    let mut table = toml::Table::deserialize(d)?;
    table
        .entry("max_output_bytes")
        .or_insert(toml::Value::Integer(DEFAULT_MAX_OUTPUT_BYTES as i64));
    Limits::deserialize(toml::Value::Table(table)).map_err(serde::de::Error::custom)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Languages `execute_code` accepts.
    pub languages: Vec<String>,
    /// Cells running at once.
    pub max_concurrency: usize,
    /// Calls waiting for a slot before further calls are refused.
    pub max_queue: usize,
    /// Calls of one principal waiting for a slot; by default all of
    /// `max_queue` with one principal, half of it with several.
    pub max_queue_per_principal: Option<usize>,
    /// How often a running call reports progress when the client asked.
    pub progress_interval_ms: u64,
    /// Seconds running cells get to finish after SIGTERM or SIGINT.
    pub drain_timeout_seconds: u64,
    /// Serve Prometheus metrics, `/healthz` and `/readyz` on this address.
    pub metrics: Option<SocketAddr>,
    /// Bytes the scratch directories of all cells may hold together.
    pub scratch_bytes: u64,
    /// Bytes one session's scratch may hold (its own tmpfs).
    pub session_scratch_bytes: u64,
    /// Inodes one session's scratch may hold.
    pub session_scratch_inodes: u64,
    /// Bytes of memory all cells may hold together; by default room for
    /// every running call's memory limit plus 512 MiB for the warm workers.
    pub cells_memory_bytes: Option<u64>,
    /// A cgroup per session and per cell beneath the cells' one.
    pub session_cgroups: bool,
    /// Without root: every profile's `identity.subordinate_ids`, when
    /// given (otherwise each profile's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subordinate_ids: Option<crate::profiles::SubordinateIds>,
    /// Python interpreter for python cells.
    pub python: Option<PathBuf>,
    /// Append run events (JSON lines) to this file.
    pub events: Option<PathBuf>,
    /// Bytes the events file may hold before it is rotated to `<file>.1`.
    pub events_max_bytes: u64,
    /// The output schema `execute_code` lists; by default `none` with
    /// short descriptions and `compact` with long ones.
    pub output_schema: Option<OutputSchema>,
    /// How much the tools' descriptions say.
    pub tool_descriptions: ToolDescriptions,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            languages: vec![
                "python".into(),
                "rhai".into(),
                "shell".into(),
                "bash".into(),
            ],
            max_concurrency: 4,
            max_queue: 64,
            max_queue_per_principal: None,
            progress_interval_ms: 1000,
            drain_timeout_seconds: 25,
            metrics: None,
            scratch_bytes: crate::supervisor::DEFAULT_SCRATCH_BYTES,
            session_scratch_bytes: crate::supervisor::DEFAULT_SESSION_SCRATCH.bytes,
            session_scratch_inodes: crate::supervisor::DEFAULT_SESSION_SCRATCH.inodes,
            cells_memory_bytes: None,
            session_cgroups: true,
            subordinate_ids: None,
            python: None,
            events: None,
            events_max_bytes: crate::supervisor::DEFAULT_EVENTS_MAX_BYTES,
            output_schema: None,
            tool_descriptions: ToolDescriptions::Short,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSection {
    /// Serve streamable HTTP on this address instead of stdio.
    pub listen: Option<String>,
    /// Allow a non-loopback `listen` address (requires `token_file`).
    pub listen_public: bool,
    /// File holding the bearer token(s) every request must carry.
    pub token_file: Option<PathBuf>,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections one peer address may hold before authenticating.
    pub max_connections_per_peer: usize,
    /// Seconds a request body may take to arrive.
    pub body_timeout_seconds: u64,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            listen: None,
            listen_public: false,
            token_file: None,
            max_connections: 256,
            max_connections_per_peer: 32,
            body_timeout_seconds: 30,
        }
    }
}

/// The most `[sessions] max_download_bytes` may be: a file of it, as
/// base64, still fits the 960 KiB a result may take
/// (`crate::serve::fit::MAX_RESULT_BYTES`).
pub const MAX_DOWNLOAD_BYTES: u64 = 640 << 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsSection {
    /// Sessions that may exist at once.
    pub max_sessions: usize,
    /// Seconds without a call after which a session is closed.
    pub idle_expiry_seconds: u64,
    /// Sessions one principal may hold at once; by default all of
    /// `max_sessions` with one principal, half of it with several.
    pub max_sessions_per_principal: Option<usize>,
    /// Bytes one `upload_file` may write into a session's working directory.
    pub max_upload_bytes: u64,
    /// Bytes one `download_file` may return.
    pub max_download_bytes: u64,
    /// Bytes one session may make the server hold in its own memory (its
    /// namespace's JSON mirror, definitions, history, checkpoints' copies).
    pub max_held_bytes: u64,
    /// Bytes one principal's sessions and file tool calls may make it hold
    /// together.
    pub max_held_bytes_per_principal: u64,
}

impl Default for SessionsSection {
    fn default() -> Self {
        SessionsSection {
            max_sessions: 16,
            idle_expiry_seconds: 1800,
            max_sessions_per_principal: None,
            max_upload_bytes: 4 << 20,
            // As base64, well within the 1 MiB response the strictest
            // official MCP client accepts.
            max_download_bytes: 512 << 10,
            max_held_bytes: crate::supervisor::DEFAULT_MAX_HELD_BYTES,
            max_held_bytes_per_principal: crate::supervisor::DEFAULT_MAX_HELD_BYTES_PER_TENANT,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfilesSection {
    pub rhai: Option<String>,
    pub python: Option<String>,
    pub shell: Option<String>,
}

/// Why the settings were rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: String },
}

fn invalid(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

/// Who may reach the HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Bound to a loopback address; Host headers must name the loopback too.
    Loopback,
    /// Bound to any address, with a bearer token required.
    Public,
}

/// How MCP messages reach the server.
/// Whether each principal gets a workspace of its own (`WORKSPACE/NAME`):
/// when the token file names its principals. One principal (stdio, HTTP
/// without a token, a file of one bare token) uses the workspace itself.
fn own_workspaces(transport: &Transport) -> bool {
    match transport {
        Transport::Stdio => false,
        Transport::Http { tokens, .. } => match tokens.as_slice() {
            [] => false,
            [only] => only.name != super::principal::BARE_TOKEN_NAME,
            _ => true,
        },
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http {
        addr: SocketAddr,
        exposure: Exposure,
        /// Bearer tokens accepted, one per principal; none: no token needed
        /// (one principal, [`super::Principal::local`]).
        tokens: Vec<NamedToken>,
        limits: HttpLimits,
    },
}

/// Bounds on what HTTP clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections one peer address may hold before authenticating.
    pub max_connections_per_peer: usize,
    /// Time a request body may take to arrive.
    pub body_timeout: Duration,
}

/// Validated settings the server runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Languages `execute_code` accepts, in a stable order.
    pub languages: Vec<Language>,
    /// Sandbox profile name or path per language.
    pub profiles: BTreeMap<Language, String>,
    /// Policy and limits of every session (the profile comes per language).
    pub session: SessionConfig,
    /// `[principals]`: the budgets of each principal, over all its sessions
    /// and calls (checked against the principals there are).
    pub principals: principal::PrincipalsSection,
    pub max_sessions: usize,
    pub max_sessions_per_principal: usize,
    pub idle_expiry: Duration,
    /// Size limits of `upload_file` and `download_file`.
    pub max_upload_bytes: u64,
    pub max_download_bytes: u64,
    /// Bytes one principal may make the server hold (see
    /// `crate::supervisor::tenant`); one session's are in `session`.
    pub max_held_bytes_per_principal: u64,
    /// Each principal has a workspace of its own beneath `[files]
    /// workspace` (a server whose token file names its principals).
    pub own_workspaces: bool,
    pub max_concurrency: usize,
    pub max_queue: usize,
    pub max_queue_per_principal: usize,
    pub scratch_bytes: u64,
    /// The bounds of each session's own scratch.
    pub session_scratch: crate::supervisor::ScratchQuota,
    pub cells_memory_bytes: u64,
    pub session_cgroups: bool,
    /// Every profile's `identity.subordinate_ids`, when given.
    pub subordinate_ids: Option<crate::profiles::SubordinateIds>,
    pub progress_interval: Duration,
    /// How long running cells get to finish after SIGTERM or SIGINT.
    pub drain_timeout: Duration,
    /// Where `/metrics` is served, if anywhere.
    pub metrics: Option<SocketAddr>,
    pub python: Option<PathBuf>,
    pub events: Option<PathBuf>,
    pub events_max_bytes: u64,
    /// The output schema `execute_code` lists.
    pub output_schema: OutputSchema,
    /// How much the tools' descriptions say.
    pub tool_descriptions: ToolDescriptions,
    pub transport: Transport,
    /// The model endpoints (validated; keys are read when the supervisor
    /// is built).
    pub models: crate::models::ModelsSection,
    /// `[files]` as written.
    #[cfg(target_os = "linux")]
    pub files: crate::files::FilesConfig,
    /// `[tools.NAME]` as written.
    #[cfg(target_os = "linux")]
    pub tools: crate::tools::ToolsConfig,
}

fn read_capped(what: &'static str, path: &Path) -> Result<String, ConfigError> {
    let err = |source| ConfigError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(err)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(err(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes"
        ))));
    }
    String::from_utf8(bytes).map_err(|e| {
        err(std::io::Error::other(format!(
            "not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )))
    })
}

impl ServeConfig {
    /// Parse a config document; `path` names it in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<ServeConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// Read and parse the config file. Every environment variable it names
    /// for a secret (see [`ServeConfig::secret_vars`]) is read now and its
    /// value registered with the redaction ([`crate::secrets`]); a secret
    /// too short to be caught in part is warned about on stderr.
    pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = read_capped("the config file", path)?;
        let config = ServeConfig::from_toml(&text, path)?;
        let warnings = crate::secrets::load(config.secret_vars())
            .map_err(|e| invalid("the config's secrets", e.to_string()))?;
        for w in warnings {
            crate::report!("cellbox: warning: {w}");
        }
        Ok(config)
    }

    /// The environment variables this configuration reads secrets from:
    /// model keys (`api_key_env`), http tools' headers (`{ env = ... }`),
    /// upstream tokens (`token_env`) and the secrets of command tools' and
    /// upstream servers' environments (`env = { NAME = { env = ... } }`).
    pub fn secret_vars(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .models
            .values()
            .filter_map(|m| m.api_key_env.as_deref())
            .collect();
        #[cfg(target_os = "linux")]
        for tool in self.tools.values() {
            use crate::tools::config::{EnvValue, HeaderValue, ToolDecl};
            match tool {
                ToolDecl::Command { env, .. } => out.extend(env.values().filter_map(|v| match v {
                    EnvValue::FromEnv(f) => Some(f.env.as_str()),
                    EnvValue::Literal(_) => None,
                })),
                ToolDecl::Http { headers, .. } => {
                    out.extend(headers.values().filter_map(|h| match h {
                        HeaderValue::Env { env, .. } => Some(env.as_str()),
                        HeaderValue::Literal(_) => None,
                    }))
                }
                ToolDecl::Mcp { token_env, env, .. } => {
                    out.extend(token_env.as_deref());
                    out.extend(env.values().filter_map(|v| match v {
                        EnvValue::FromEnv(f) => Some(f.env.as_str()),
                        EnvValue::Literal(_) => None,
                    }));
                }
            }
        }
        out
    }

    /// Apply the flags on top of the file.
    pub fn apply_args(&mut self, args: &ServeArgs) -> Result<(), ConfigError> {
        if let Some(h) = &args.http {
            self.http.listen = Some(h.clone());
        }
        if args.listen_public {
            self.http.listen_public = true;
        }
        if let Some(t) = &args.token_file {
            self.http.token_file = Some(t.clone());
        }
        if let Some(n) = args.max_connections {
            self.http.max_connections = n;
        }
        if let Some(n) = args.max_connections_per_peer {
            self.http.max_connections_per_peer = n;
        }
        if let Some(n) = args.body_timeout {
            self.http.body_timeout_seconds = n;
        }
        let languages = split_list(&args.languages);
        if !languages.is_empty() {
            self.server.languages = languages;
        }
        for p in &args.profiles {
            let (lang, name) = p.split_once('=').ok_or_else(|| {
                invalid(
                    "--profile",
                    format!("{p:?}: write LANG=PROFILE, e.g. python=python or rhai=/etc/cellbox/rhai.toml"),
                )
            })?;
            let lang: Language = lang
                .trim()
                .parse()
                .map_err(|e: crate::Error| invalid("--profile", e.to_string()))?;
            let slot = match lang {
                Language::Rhai => &mut self.profiles.rhai,
                Language::Python => &mut self.profiles.python,
                Language::Shell => &mut self.profiles.shell,
                Language::Bash => {
                    return Err(invalid(
                        "--profile",
                        format!(
                        "{p:?}: bash runs under the shell language's profile; give shell=PROFILE"
                    ),
                    ))
                }
            };
            *slot = Some(name.trim().to_owned());
        }
        for name in split_list(&args.cell.allow) {
            self.policy.allow.insert(name);
        }
        if let Some(t) = args.cell.timeout {
            if !(t.is_finite() && t > 0.0 && t * 1000.0 <= MAX_TIMEOUT_MS as f64) {
                return Err(invalid(
                    "limits.timeout_ms (--timeout)",
                    format!("{t}: give seconds above 0 and at most 86400"),
                ));
            }
            self.limits.timeout_ms = (t * 1000.0).ceil() as u64;
        }
        if let Some(m) = args.cell.max_output {
            self.limits.max_output_bytes = m;
        }
        if let Some(m) = args.cell.memory {
            self.limits.rlimits.memory_bytes = m;
        }
        if let Some(n) = args.cell.max_operations {
            self.limits.max_operations = n;
        }
        if let Some(n) = args.max_sessions {
            self.sessions.max_sessions = n;
        }
        if let Some(n) = args.max_sessions_per_principal {
            self.sessions.max_sessions_per_principal = Some(n);
        }
        if let Some(n) = args.session_idle_expiry {
            self.sessions.idle_expiry_seconds = n;
        }
        if let Some(n) = args.max_concurrency {
            self.server.max_concurrency = n;
        }
        if let Some(n) = args.scratch_bytes {
            self.server.scratch_bytes = n;
        }
        if let Some(n) = args.session_scratch_bytes {
            self.server.session_scratch_bytes = n;
        }
        if let Some(n) = args.session_scratch_inodes {
            self.server.session_scratch_inodes = n;
        }
        if let Some(n) = args.cells_memory_bytes {
            self.server.cells_memory_bytes = Some(n);
        }
        if let Some(schema) = args.output_schema {
            self.server.output_schema = Some(schema);
        }
        if let Some(d) = args.tool_descriptions {
            self.server.tool_descriptions = d;
        }
        if let Some(on) = args.session_cgroups {
            self.server.session_cgroups = on;
        }
        if let Some(n) = args.max_queue {
            self.server.max_queue = n;
        }
        if let Some(n) = args.drain_timeout {
            self.server.drain_timeout_seconds = n;
        }
        if let Some(a) = args.metrics {
            self.server.metrics = Some(a);
        }
        if let Some(n) = args.max_queue_per_principal {
            self.server.max_queue_per_principal = Some(n);
        }
        if let Some(p) = &args.cell.python {
            self.server.python = Some(p.clone());
        }
        if let Some(p) = &args.cell.events {
            self.server.events = Some(p.clone());
        }
        if let Some(n) = args.events_max_bytes {
            self.server.events_max_bytes = n;
        }
        Ok(())
    }

    /// Check every value and resolve the transport (reading the token file).
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        crate::models::config::validate(&self.models).map_err(|e| invalid(&e.key, e.problem))?;
        let mut languages = Vec::new();
        for l in &self.server.languages {
            let lang: Language = l.parse().map_err(|e: crate::Error| {
                invalid("server.languages (--language)", e.to_string())
            })?;
            if !languages.contains(&lang) {
                languages.push(lang);
            }
        }
        if languages.is_empty() {
            return Err(invalid(
                "server.languages (--language)",
                "name at least one of python, rhai, shell, bash",
            ));
        }
        languages.sort_by_key(|l| l.as_str());

        let mut profiles = BTreeMap::new();
        for (lang, given) in [
            (Language::Rhai, &self.profiles.rhai),
            (Language::Python, &self.profiles.python),
            (Language::Shell, &self.profiles.shell),
        ] {
            let name = given
                .clone()
                .unwrap_or_else(|| lang.default_profile().to_owned());
            let key = format!("profiles.{lang} (--profile {lang}=...)");
            if name.trim().is_empty() {
                return Err(invalid(&key, "empty profile name"));
            }
            crate::profiles::Profile::load(&name).map_err(|e| invalid(&key, e.to_string()))?;
            profiles.insert(lang, name);
        }
        // Bash runs under the shell language's profile.
        if let Some(shell) = profiles.get(&Language::Shell).cloned() {
            profiles.insert(Language::Bash, shell);
        }

        for name in &self.policy.allow {
            if !valid_capability_name(name) {
                return Err(invalid(
                    "policy.allow (--allow)",
                    format!("{name:?} is not a capability name"),
                ));
            }
        }

        let l = &self.limits;
        if l.timeout_ms == 0 || l.timeout_ms > MAX_TIMEOUT_MS {
            return Err(invalid(
                "limits.timeout_ms (--timeout)",
                format!("{}: give 1 to {MAX_TIMEOUT_MS} milliseconds", l.timeout_ms),
            ));
        }
        if l.max_output_bytes == 0 {
            return Err(invalid(
                "limits.max_output_bytes (--max-output)",
                "must be at least 1",
            ));
        }
        if l.max_script_bytes == 0 {
            return Err(invalid("limits.max_script_bytes", "must be at least 1"));
        }
        if l.rlimits.memory_bytes == 0 {
            return Err(invalid(
                "limits.memory_bytes (--memory)",
                "must be at least 1",
            ));
        }

        let s = &self.server;
        if s.max_concurrency == 0 {
            return Err(invalid(
                "server.max_concurrency (--max-concurrency)",
                "must be at least 1",
            ));
        }
        if s.scratch_bytes < 1 << 20 {
            return Err(invalid(
                "server.scratch_bytes (--scratch-bytes)",
                format!("{}: give at least 1048576 (1 MiB)", s.scratch_bytes),
            ));
        }
        let session_scratch = crate::supervisor::ScratchQuota {
            bytes: s.session_scratch_bytes,
            inodes: s.session_scratch_inodes,
        };
        if s.session_scratch_bytes < 1 << 20 {
            return Err(invalid(
                "server.session_scratch_bytes (--session-scratch-bytes)",
                format!("{}: give at least 1048576 (1 MiB)", s.session_scratch_bytes),
            ));
        }
        if let Some(problem) = session_scratch.problem() {
            return Err(invalid(
                "server.session_scratch_inodes (--session-scratch-inodes)",
                problem,
            ));
        }
        let cells_memory_bytes = match s.cells_memory_bytes {
            Some(n) if n < 64 << 20 => {
                return Err(invalid(
                    "server.cells_memory_bytes (--cells-memory-bytes)",
                    format!("{n}: give at least 67108864 (64 MiB)"),
                ))
            }
            Some(n) => n,
            // Every running call's limit, plus the scratch of every session
            // that may hold files, running or idle (tmpfs pages are memory
            // that cannot be reclaimed without swap: idle sessions' files
            // must not take what running cells are entitled to), plus room
            // for the warm workers.
            None => self
                .limits
                .rlimits
                .memory_bytes
                .saturating_mul(s.max_concurrency as u64)
                .saturating_add(
                    s.session_scratch_bytes
                        .saturating_mul((s.max_concurrency + self.sessions.max_sessions) as u64),
                )
                .saturating_add(512 << 20),
        };
        if s.events_max_bytes < 4096 {
            return Err(invalid(
                "server.events_max_bytes (--events-max-bytes)",
                format!("{}: give at least 4096", s.events_max_bytes),
            ));
        }
        if s.progress_interval_ms < 50 {
            return Err(invalid(
                "server.progress_interval_ms",
                format!("{}: give at least 50 milliseconds", s.progress_interval_ms),
            ));
        }
        if self.sessions.max_sessions == 0 {
            return Err(invalid(
                "sessions.max_sessions (--max-sessions)",
                "must be at least 1",
            ));
        }
        if self.sessions.idle_expiry_seconds == 0 {
            return Err(invalid(
                "sessions.idle_expiry_seconds (--session-idle-expiry)",
                "must be at least 1 second",
            ));
        }
        if self.sessions.max_download_bytes > MAX_DOWNLOAD_BYTES {
            return Err(invalid(
                "sessions.max_download_bytes",
                format!(
                    "{}: at most {} (as base64, a larger file would not fit the {} bytes a result \
                     may take)",
                    self.sessions.max_download_bytes,
                    MAX_DOWNLOAD_BYTES,
                    super::fit::MAX_RESULT_BYTES
                ),
            ));
        }
        // Below a few KiB not even an empty session's history fits.
        for (key, n) in [
            ("sessions.max_held_bytes", self.sessions.max_held_bytes),
            (
                "sessions.max_held_bytes_per_principal",
                self.sessions.max_held_bytes_per_principal,
            ),
        ] {
            if n < 64 << 10 {
                return Err(invalid(key, format!("{n}: give at least 65536 bytes")));
            }
        }

        let transport = self.transport()?;
        let principals = match &transport {
            Transport::Http { tokens, .. } => tokens.len().max(1),
            Transport::Stdio => 1,
        };
        // With several principals none may take more than half by default.
        let share = |total: usize, floor: usize| {
            if principals > 1 {
                (total / 2).max(floor)
            } else {
                total
            }
        };
        let max_sessions_per_principal = match self.sessions.max_sessions_per_principal {
            Some(0) => {
                return Err(invalid(
                    "sessions.max_sessions_per_principal (--max-sessions-per-principal)",
                    "must be at least 1",
                ))
            }
            Some(n) if n > self.sessions.max_sessions => {
                return Err(invalid(
                    "sessions.max_sessions_per_principal (--max-sessions-per-principal)",
                    format!(
                        "{n}: at most sessions.max_sessions ({})",
                        self.sessions.max_sessions
                    ),
                ))
            }
            Some(n) => n,
            None => share(self.sessions.max_sessions, 1),
        };
        let known: Vec<String> = match &transport {
            Transport::Http { tokens, .. } if !tokens.is_empty() => {
                tokens.iter().map(|t| t.name.clone()).collect()
            }
            _ => vec![super::Principal::local().name().to_owned()],
        };
        if let Some((key, problem)) = self.principals.problem(&known) {
            return Err(ConfigError::Invalid { key, problem });
        }
        let max_queue_per_principal = match s.max_queue_per_principal {
            Some(n) if n > s.max_queue => {
                return Err(invalid(
                    "server.max_queue_per_principal (--max-queue-per-principal)",
                    format!("{n}: at most server.max_queue ({})", s.max_queue),
                ))
            }
            Some(n) => n,
            None => share(s.max_queue, 0),
        };

        Ok(Settings {
            languages,
            profiles,
            session: SessionConfig {
                policy: self.policy.clone(),
                limits: self.limits.clone(),
                profile: None,
                max_held_bytes: self.sessions.max_held_bytes,
                ..Default::default()
            },
            principals: self.principals.clone(),
            max_sessions: self.sessions.max_sessions,
            max_sessions_per_principal,
            idle_expiry: Duration::from_secs(self.sessions.idle_expiry_seconds),
            max_upload_bytes: self.sessions.max_upload_bytes,
            max_download_bytes: self.sessions.max_download_bytes,
            max_held_bytes_per_principal: self.sessions.max_held_bytes_per_principal,
            own_workspaces: own_workspaces(&transport),
            max_concurrency: s.max_concurrency,
            max_queue: s.max_queue,
            max_queue_per_principal,
            scratch_bytes: s.scratch_bytes,
            session_scratch,
            cells_memory_bytes,
            session_cgroups: s.session_cgroups,
            subordinate_ids: s.subordinate_ids,
            progress_interval: Duration::from_millis(s.progress_interval_ms),
            drain_timeout: Duration::from_secs(s.drain_timeout_seconds),
            metrics: s.metrics,
            python: s.python.clone(),
            events: s.events.clone(),
            events_max_bytes: s.events_max_bytes,
            output_schema: s.output_schema.unwrap_or(match s.tool_descriptions {
                ToolDescriptions::Short => OutputSchema::None,
                ToolDescriptions::Long => OutputSchema::Compact,
            }),
            tool_descriptions: s.tool_descriptions,
            transport,
            models: self.models.clone(),
            #[cfg(target_os = "linux")]
            files: self.files.clone(),
            #[cfg(target_os = "linux")]
            tools: self.tools.clone(),
        })
    }

    fn transport(&self) -> Result<Transport, ConfigError> {
        let h = &self.http;
        let Some(listen) = &h.listen else {
            if h.listen_public {
                return Err(invalid(
                    "http.listen_public (--listen-public)",
                    "only applies with an HTTP address (--http ADDR:PORT)",
                ));
            }
            if h.token_file.is_some() {
                return Err(invalid(
                    "http.token_file (--token-file)",
                    "only applies with an HTTP address (--http ADDR:PORT)",
                ));
            }
            return Ok(Transport::Stdio);
        };
        let addr: SocketAddr = listen.trim().parse().map_err(|_| {
            invalid(
                "http.listen (--http)",
                format!("{listen:?}: give IP:PORT, e.g. 127.0.0.1:8080"),
            )
        })?;
        let tokens = match &h.token_file {
            Some(path) => read_tokens(path)?,
            None => Vec::new(),
        };
        let exposure = if h.listen_public {
            if tokens.is_empty() {
                return Err(invalid(
                    "http.listen_public (--listen-public)",
                    "a public listener needs a bearer token: pass --token-file FILE",
                ));
            }
            Exposure::Public
        } else if addr.ip().is_loopback() {
            Exposure::Loopback
        } else {
            return Err(invalid(
                "http.listen (--http)",
                format!(
                    "{addr} is not a loopback address; to accept other hosts pass \
                     --listen-public with --token-file FILE"
                ),
            ));
        };
        if h.max_connections == 0 {
            return Err(invalid(
                "http.max_connections (--max-connections)",
                "must be at least 1",
            ));
        }
        if h.max_connections_per_peer == 0 || h.max_connections_per_peer > h.max_connections {
            return Err(invalid(
                "http.max_connections_per_peer (--max-connections-per-peer)",
                format!(
                    "{}: give 1 to http.max_connections ({})",
                    h.max_connections_per_peer, h.max_connections
                ),
            ));
        }
        if h.body_timeout_seconds == 0 {
            return Err(invalid(
                "http.body_timeout_seconds (--body-timeout)",
                "must be at least 1 second",
            ));
        }
        Ok(Transport::Http {
            addr,
            exposure,
            tokens,
            limits: HttpLimits {
                max_connections: h.max_connections,
                max_connections_per_peer: h.max_connections_per_peer,
                body_timeout: Duration::from_secs(h.body_timeout_seconds),
            },
        })
    }
}

/// The principals' tokens; each is a secret the redaction knows (see
/// [`crate::secrets`]) under the name `token:PRINCIPAL`.
fn read_tokens(path: &Path) -> Result<Vec<NamedToken>, ConfigError> {
    let text = read_capped("the token file", path)?;
    let tokens = principal::parse_token_file(&text).map_err(|e| {
        invalid(
            "http.token_file (--token-file)",
            format!("{}: {e}", path.display()),
        )
    })?;
    crate::secrets::register(
        tokens
            .iter()
            .map(|t| crate::secrets::Secret::new(&format!("token:{}", t.name), t.token.clone()))
            .collect(),
    )
    .map_err(|e| invalid("http.token_file (--token-file)", e.to_string()))?;
    Ok(tokens)
}

/// The one grammar of allowed names (see
/// [`crate::supervisor::is_allow_name`]).
fn valid_capability_name(name: &str) -> bool {
    crate::supervisor::is_allow_name(name)
}

/// `["a,b", "c"]` → `["a", "b", "c"]`.
fn split_list(items: &[String]) -> Vec<String> {
    items
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Resolve the settings from the flags (and the file they name).
pub fn resolve(args: &ServeArgs) -> Result<Settings, ConfigError> {
    let mut config = match &args.config {
        Some(path) => ServeConfig::load(path)?,
        None => ServeConfig::default(),
    };
    config.apply_args(args)?;
    config.validate()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeConfig, ConfigError> {
        ServeConfig::from_toml(text, Path::new("test.toml"))
    }

    /// `server.subordinate_ids` reaches the settings only when given
    /// (each profile's own decides otherwise).
    #[test]
    fn subordinate_ids_are_set_for_every_profile_only_when_given() {
        use crate::profiles::SubordinateIds;
        let s = ServeConfig::default().validate().unwrap();
        assert_eq!(s.subordinate_ids, None);
        let c = parse("[server]\nsubordinate_ids = \"auto\"\n").unwrap();
        assert_eq!(
            c.validate().unwrap().subordinate_ids,
            Some(SubordinateIds::Auto)
        );
        assert!(parse("[server]\nsubordinate_ids = \"yes\"\n").is_err());
    }

    #[test]
    fn defaults_are_valid_and_use_stdio() {
        let s = ServeConfig::default().validate().unwrap();
        assert_eq!(s.transport, Transport::Stdio);
        assert_eq!(
            s.languages,
            vec![
                Language::Bash,
                Language::Python,
                Language::Rhai,
                Language::Shell
            ]
        );
        assert!(s.session.policy.allow.is_empty());
        assert_eq!(s.profiles[&Language::Python], "python");
    }

    #[test]
    fn serve_keeps_less_output_by_default() {
        let s = ServeConfig::default().validate().unwrap();
        assert_eq!(s.session.limits.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
        // A [limits] section without the key keeps serve's default ...
        let c = parse("[limits]\ntimeout_ms = 5000\n").unwrap();
        assert_eq!(c.limits.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
        assert_eq!(c.limits.timeout_ms, 5000);
        // ... the file and the flag set it, and unknown keys still fail.
        let c = parse("[limits]\nmax_output_bytes = 1000\n").unwrap();
        assert_eq!(c.limits.max_output_bytes, 1000);
        let e = parse("[limits]\nmax_outptu_bytes = 1000\n").unwrap_err();
        assert!(e.to_string().contains("max_outptu_bytes"), "{e}");
        let args = ServeArgs {
            cell: CellArgs {
                max_output: Some(2000),
                ..CellArgs::default()
            },
            ..Default::default()
        };
        let mut c = ServeConfig::default();
        c.apply_args(&args).unwrap();
        assert_eq!(c.limits.max_output_bytes, 2000);
    }

    #[test]
    fn output_schema_from_file_and_flag() {
        let d = ServeConfig::default().validate().unwrap();
        assert_eq!(d.tool_descriptions, ToolDescriptions::Short);
        assert_eq!(d.output_schema, OutputSchema::None);
        let long = parse("[server]\ntool_descriptions = \"long\"\n").unwrap();
        assert_eq!(
            long.validate().unwrap().output_schema,
            OutputSchema::Compact
        );
        let mut c = parse("[server]\noutput_schema = \"full\"\n").unwrap();
        assert_eq!(c.validate().unwrap().output_schema, OutputSchema::Full);
        c.apply_args(&ServeArgs {
            output_schema: Some(OutputSchema::Compact),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.validate().unwrap().output_schema, OutputSchema::Compact);
        for bad in ["output_schema = \"short\"", "output_schema = true"] {
            let e = parse(&format!("[server]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("output_schema"), "{bad}: {e}");
        }
    }

    #[test]
    fn session_scratch_from_file_and_flags() {
        let d = ServeConfig::default().validate().unwrap().session_scratch;
        assert_eq!(d, crate::supervisor::DEFAULT_SESSION_SCRATCH);
        assert_eq!((d.bytes, d.inodes), (256 << 20, 16384));
        let mut c =
            parse("[server]\nsession_scratch_bytes = 8388608\nsession_scratch_inodes = 1000\n")
                .unwrap();
        let q = c.validate().unwrap().session_scratch;
        assert_eq!((q.bytes, q.inodes), (8 << 20, 1000));
        c.apply_args(&ServeArgs {
            session_scratch_bytes: Some(1 << 30),
            session_scratch_inodes: Some(64),
            ..Default::default()
        })
        .unwrap();
        let q = c.validate().unwrap().session_scratch;
        assert_eq!((q.bytes, q.inodes), (1 << 30, 64));
        let e = parse("[server]\nsession_scratch_bytes = 4096\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.session_scratch_bytes (--session-scratch-bytes)"),
            "{e}"
        );
        let e = parse("[server]\nsession_scratch_inodes = 10\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.session_scratch_inodes (--session-scratch-inodes)"),
            "{e}"
        );
        // Strict like the rest: a string, a negative number and a
        // misspelt key are refused.
        for bad in [
            "session_scratch_bytes = \"1M\"",
            "session_scratch_inodes = -1",
            "session_scratch_inode = 100",
        ] {
            assert!(parse(&format!("[server]\n{bad}\n")).is_err(), "{bad}");
        }
    }

    #[test]
    fn scratch_bytes_from_file_and_flag() {
        let mut c = parse("[server]\nscratch_bytes = 8388608\n").unwrap();
        assert_eq!(c.validate().unwrap().scratch_bytes, 8 << 20);
        let args = ServeArgs {
            scratch_bytes: Some(1 << 30),
            ..ServeArgs::default()
        };
        c.apply_args(&args).unwrap();
        assert_eq!(c.validate().unwrap().scratch_bytes, 1 << 30);
        assert_eq!(
            ServeConfig::default().validate().unwrap().scratch_bytes,
            crate::supervisor::DEFAULT_SCRATCH_BYTES
        );
        let e = parse("[server]\nscratch_bytes = 4096\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.scratch_bytes (--scratch-bytes)"), "{e}");
    }

    #[test]
    fn cells_memory_bytes_from_file_and_flag() {
        let mut c = parse("[server]\ncells_memory_bytes = 2147483648\n").unwrap();
        assert_eq!(c.validate().unwrap().cells_memory_bytes, 2 << 30);
        let args = ServeArgs {
            cells_memory_bytes: Some(8 << 30),
            ..ServeArgs::default()
        };
        c.apply_args(&args).unwrap();
        assert_eq!(c.validate().unwrap().cells_memory_bytes, 8 << 30);
        // By default: every running call's memory limit, plus the scratch of
        // every running call and every session, plus 512 MiB.
        assert_eq!(
            ServeConfig::default()
                .validate()
                .unwrap()
                .cells_memory_bytes,
            4 * (1 << 30)
                + (4 + 16) * crate::supervisor::DEFAULT_SESSION_SCRATCH.bytes
                + (512 << 20)
        );
        let args = ServeArgs {
            cell: CellArgs {
                memory: Some(256 << 20),
                ..CellArgs::default()
            },
            max_concurrency: Some(2),
            ..ServeArgs::default()
        };
        let mut c = ServeConfig::default();
        c.apply_args(&args).unwrap();
        assert_eq!(
            c.validate().unwrap().cells_memory_bytes,
            (512 << 20) + (2 + 16) * crate::supervisor::DEFAULT_SESSION_SCRATCH.bytes + (512 << 20)
        );
        let e = parse("[server]\ncells_memory_bytes = 4096\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.cells_memory_bytes (--cells-memory-bytes)"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse("[server]\nmax_concurency = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_concurency"), "{e}");
        let e = parse("[limits]\ntimeout = 3\n").unwrap_err().to_string();
        assert!(e.contains("timeout"), "{e}");
        let e = parse("[nope]\n").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
        let e = parse("[server]\nmax_queue = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_queue"), "{e}");
    }

    #[test]
    fn file_values_apply_and_flags_win() {
        let mut c = parse(
            "[server]\nmax_concurrency = 2\nlanguages = [\"rhai\"]\n\
             [limits]\ntimeout_ms = 5000\n[policy]\nallow = [\"emit\"]\n\
             [sessions]\nmax_sessions = 3\nidle_expiry_seconds = 60\n",
        )
        .unwrap();
        let args = ServeArgs {
            max_concurrency: Some(7),
            cell: CellArgs {
                allow: vec!["answer".into()],
                ..CellArgs::default()
            },
            ..ServeArgs::default()
        };
        c.apply_args(&args).unwrap();
        let s = c.validate().unwrap();
        assert_eq!(s.max_concurrency, 7);
        assert_eq!(s.languages, vec![Language::Rhai]);
        assert_eq!(s.session.limits.timeout_ms, 5000);
        assert_eq!(s.max_sessions, 3);
        assert_eq!(s.idle_expiry, Duration::from_secs(60));
        let allow: Vec<&str> = s.session.policy.allow.iter().map(String::as_str).collect();
        assert_eq!(allow, vec!["answer", "emit"]);
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut c = ServeConfig::default();
        c.server.max_concurrency = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("server.max_concurrency"), "{e}");

        let mut c = ServeConfig::default();
        c.server.languages = vec!["cobol".into()];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("server.languages"), "{e}");

        let mut c = ServeConfig::default();
        c.profiles.python = Some("nonesuch".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("profiles.python"), "{e}");

        // A download larger than a result may hold (as base64).
        let mut c = ServeConfig::default();
        c.sessions.max_download_bytes = MAX_DOWNLOAD_BYTES + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("sessions.max_download_bytes"), "{e}");
        c.sessions.max_download_bytes = MAX_DOWNLOAD_BYTES;
        c.validate().unwrap();

        let mut c = ServeConfig::default();
        let e = c
            .apply_args(&ServeArgs {
                profiles: vec!["python".into()],
                ..ServeArgs::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--profile"), "{e}");
    }

    #[test]
    fn http_is_loopback_unless_public_with_a_token() {
        let mut c = ServeConfig::default();
        c.http.listen = Some("127.0.0.1:0".into());
        assert!(matches!(
            c.validate().unwrap().transport,
            Transport::Http {
                exposure: Exposure::Loopback,
                ref tokens,
                ..
            } if tokens.is_empty()
        ));

        c.http.listen = Some("0.0.0.0:8080".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("http.listen") && e.contains("--listen-public"),
            "{e}"
        );

        c.http.listen_public = true;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        c.http.token_file = Some(short);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");

        let good = dir.path().join("good");
        std::fs::write(&good, "0123456789abcdef0123\n").unwrap();
        c.http.token_file = Some(good);
        match c.validate().unwrap().transport {
            Transport::Http {
                exposure, tokens, ..
            } => {
                assert_eq!(exposure, Exposure::Public);
                assert_eq!(tokens.len(), 1);
                assert_eq!(tokens[0].name, "default");
                assert_eq!(tokens[0].token, "0123456789abcdef0123");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn per_principal_caps_default_to_a_share_with_several_principals() {
        let s = ServeConfig::default().validate().unwrap();
        assert_eq!(s.max_sessions_per_principal, 16);
        assert_eq!(s.max_queue_per_principal, 64);

        let dir = tempfile::tempdir().unwrap();
        let two = dir.path().join("two");
        std::fs::write(&two, "x 0123456789abcdef-x\ny 0123456789abcdef-y\n").unwrap();
        let mut c = ServeConfig::default();
        c.http.listen = Some("127.0.0.1:0".into());
        c.http.token_file = Some(two);
        let s = c.validate().unwrap();
        assert_eq!(s.max_sessions_per_principal, 8);
        assert_eq!(s.max_queue_per_principal, 32);
        match &s.transport {
            Transport::Http { tokens, limits, .. } => {
                assert_eq!(tokens.len(), 2);
                assert_eq!(limits.max_connections, 256);
                assert_eq!(limits.max_connections_per_peer, 32);
                assert_eq!(limits.body_timeout, Duration::from_secs(30));
            }
            other => panic!("{other:?}"),
        }

        let args = ServeArgs {
            max_sessions_per_principal: Some(3),
            max_queue_per_principal: Some(5),
            max_connections: Some(10),
            max_connections_per_peer: Some(4),
            body_timeout: Some(7),
            ..ServeArgs::default()
        };
        c.apply_args(&args).unwrap();
        let s = c.validate().unwrap();
        assert_eq!(s.max_sessions_per_principal, 3);
        assert_eq!(s.max_queue_per_principal, 5);
        let Transport::Http { limits, .. } = s.transport else {
            panic!("not http")
        };
        assert_eq!(limits.max_connections, 10);
        assert_eq!(limits.max_connections_per_peer, 4);
        assert_eq!(limits.body_timeout, Duration::from_secs(7));

        for (text, key) in [
            (
                "[sessions]\nmax_sessions_per_principal = 17\n",
                "sessions.max_sessions_per_principal",
            ),
            (
                "[sessions]\nmax_sessions_per_principal = 0\n",
                "sessions.max_sessions_per_principal",
            ),
            (
                "[server]\nmax_queue_per_principal = 65\n",
                "server.max_queue_per_principal",
            ),
            (
                "[http]\nlisten = \"127.0.0.1:0\"\nmax_connections = 0\n",
                "http.max_connections",
            ),
            (
                "[http]\nlisten = \"127.0.0.1:0\"\nmax_connections_per_peer = 300\n",
                "http.max_connections_per_peer",
            ),
            (
                "[http]\nlisten = \"127.0.0.1:0\"\nbody_timeout_seconds = 0\n",
                "http.body_timeout_seconds",
            ),
        ] {
            let e = parse(text).unwrap().validate().unwrap_err().to_string();
            assert!(e.starts_with(key), "{text}: {e}");
        }
    }

    #[test]
    fn principals_take_defaults_and_overrides_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let two = dir.path().join("two");
        std::fs::write(&two, "alice 0123456789abcdef-a\nbob 0123456789abcdef-b\n").unwrap();
        let head = format!(
            "[http]\nlisten = \"127.0.0.1:0\"\ntoken_file = {:?}\n",
            two.to_str().unwrap()
        );
        let c = parse(&format!(
            "{head}[principals]\nmax_cost = 1.5\nmax_tool_calls = 10\nwindow_seconds = 60\n\
             [principals.alice]\nmax_cost = 3.0\nmax_upstream_connections = 2\n"
        ))
        .unwrap();
        let s = c.validate().unwrap();
        let alice = s.principals.of("alice");
        assert_eq!(alice.max_cost, Some(3.0));
        assert_eq!(alice.max_tool_calls, Some(10));
        assert_eq!(alice.window_seconds, Some(60));
        assert_eq!(alice.max_upstream_connections, Some(2));
        let bob = s.principals.of("bob");
        assert_eq!(
            (bob.max_cost, bob.max_upstream_connections),
            (Some(1.5), None)
        );
        // It writes back as it reads.
        let again = parse(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(again.principals, c.principals);
        for (text, want) in [
            ("[principals]\nmax_cots = 1\n", "max_cots"),
            ("[principals.alice]\nmax_cots = 1\n", "principals.alice"),
            ("[principals]\nmax_tool_calls = -1\n", "max_tool_calls"),
            ("[principals]\nmax_tool_calls = \"10\"\n", "max_tool_calls"),
            (
                "[principals.\"a/b\"]\nmax_cost = 1\n",
                "not a principal name",
            ),
        ] {
            let e = parse(&format!("{head}{text}")).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        for (text, want) in [
            (
                "[principals.carol]\nmax_cost = 1\n",
                "principals.carol: no such principal; the principals are: alice, bob",
            ),
            ("[principals]\nmax_cost = -1.0\n", "principals.max_cost: -1"),
            ("[principals]\nmax_cost = nan\n", "principals.max_cost: NaN"),
            (
                "[principals.bob]\nwindow_seconds = 0\n",
                "principals.bob.window_seconds",
            ),
        ] {
            let e = parse(&format!("{head}{text}"))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(want), "{text}: {e}");
        }
        // Without a token file the one principal is `local`.
        let e = parse("[principals.alice]\nmax_cost = 1\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("the principals are: local"), "{e}");
        parse("[principals.local]\nmax_cost = 1\n")
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../examples/cellbox.toml");
        let c = parse(text).unwrap();
        c.validate().unwrap();
    }
}
