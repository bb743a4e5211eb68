//! Capabilities: named, schema-checked functions a script may call through
//! the supervisor.

use super::ledger::Account;
use crate::protocol::CapabilitySpec;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;
type HostFn = dyn Fn(CallContext, Map<String, Value>) -> HandlerFuture + Send + Sync;

/// Who is calling: the run the call belongs to, and the tenant it runs
/// for (none: the supervisor's own caller).
#[derive(Debug, Clone)]
pub struct CallContext {
    pub session_id: String,
    pub run: super::RunInfo,
    pub tenant: Option<super::Tenant>,
    /// Cancelled once nobody waits for the call's answer any more (its
    /// cell ended, its client went away): a handler that works on after
    /// its future is dropped (on a blocking thread) stops when it sees it.
    pub cancel: tokio_util::sync::CancellationToken,
}

#[derive(Clone)]
pub(crate) enum Handler {
    Emit,
    Answer,
    RunCell,
    Host(Arc<HostFn>),
    /// A query to a configured model (see `crate::models`).
    Model(ModelOp),
    /// The tools `NAME.TOOL` of an upstream server (registered apart).
    Source(Arc<dyn ToolSource>),
}

/// What a [`ToolSource`] returns.
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, SourceError>> + Send + 'a>>;

/// Tools named `SERVER.TOOL` that a supervisor learns only by asking
/// (an upstream MCP server): registered under `SERVER` with
/// [`Capability::source`], looked up when a cell first calls one.
pub trait ToolSource: Send + Sync {
    /// The capability `SERVER.TOOL` (schema-checked by the supervisor,
    /// counted as a host tool call) for a cell of `account`'s tenant,
    /// starting the source (that tenant's connection to it) if need be.
    fn tool<'a>(&'a self, account: &'a Account, tool: &'a str) -> SourceFuture<'a, Capability>;
    /// Every tool of the source, starting it if need be.
    fn list<'a>(&'a self, account: &'a Account) -> SourceFuture<'a, Vec<Capability>>;
}

/// A [`ToolSource`] lookup failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    /// The source has no such tool.
    #[error("{0}")]
    Unknown(String),
    /// The source could not be reached.
    #[error("{0}")]
    Failed(String),
}

/// The model capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelOp {
    Query,
    Batch,
    Agent,
    /// One query: an instruction to summarise, then the text.
    Summarize,
}

/// A capability: name, description, JSON schema of its arguments, handler.
#[derive(Clone)]
pub struct Capability {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) schema: Value,
    pub(crate) params: Vec<String>,
    /// Compiled on first use: compiling schemas costs start-up time that a
    /// one-shot run that never calls the capability should not pay.
    pub(crate) validator: Arc<std::sync::OnceLock<Result<jsonschema::Validator, String>>>,
    pub(crate) handler: Handler,
}

impl std::fmt::Debug for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capability")
            .field("name", &self.name)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// A capability definition was rejected.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    #[error(
        "invalid capability name {0:?}: use letters, digits and '_', not starting with a digit"
    )]
    BadName(String),
    #[error("invalid JSON schema for capability {name:?}: {message}")]
    BadSchema { name: String, message: String },
    #[error("capability {0:?} is already registered")]
    Duplicate(String),
}

/// A call's arguments did not fit its capability's schema.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ArgsError {
    /// The schema itself does not compile.
    #[error("the capability's schema is invalid: {0}")]
    Schema(String),
    /// Every violation, with the path of the argument it is about.
    #[error("{}", .0.join("; "))]
    Violations(Vec<String>),
}

/// A host capability called outside any cell failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// Only a host capability runs outside a cell.
    #[error("{0} runs only inside a cell")]
    OutsideCell(String),
    /// The handler's own error, as it said it.
    #[error("{0}")]
    Handler(String),
}

/// For callers that report errors as text.
impl From<CallError> for String {
    fn from(e: CallError) -> String {
        e.to_string()
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64
}

/// The one grammar of capability names, for the CLI's `--allow`, the
/// config's `policy.allow`, a cell's calls and the MCP surface: a plain
/// NAME (letters, digits and '_', not starting with a digit, at most 64
/// bytes) or `SERVER.TOOL` of an upstream server (TOOL: letters, digits,
/// '_', '-' and '.', as MCP names its tools).
pub fn is_capability_name(name: &str) -> bool {
    valid_name(name) || valid_dotted_name(name)
}

/// A name a policy may allow: a capability name, or `SERVER.*` (every
/// tool of the upstream server SERVER, dotted names included).
pub fn is_allow_name(name: &str) -> bool {
    is_capability_name(name) || name.strip_suffix(".*").is_some_and(valid_name)
}

/// `SERVER.TOOL`: a valid SERVER, and a TOOL of letters, digits, '_', '-'
/// and '.' (as MCP names its tools), at most 128 bytes in all.
fn valid_dotted_name(name: &str) -> bool {
    name.split_once('.').is_some_and(|(server, tool)| {
        valid_name(server)
            && !tool.is_empty()
            && tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && name.len() <= 128
    })
}

impl Capability {
    fn build(
        name: &str,
        description: &str,
        schema: Value,
        handler: Handler,
    ) -> Result<Self, CapabilityError> {
        let host = matches!(handler, Handler::Host(_));
        if !(valid_name(name) || host && valid_dotted_name(name)) {
            return Err(CapabilityError::BadName(name.to_owned()));
        }
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(CapabilityError::BadSchema {
                name: name.to_owned(),
                message: "the top level must be {\"type\": \"object\", ...}".into(),
            });
        }
        let params = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        Ok(Capability {
            name: name.to_owned(),
            description: description.to_owned(),
            schema,
            params,
            validator: Arc::new(std::sync::OnceLock::new()),
            handler,
        })
    }

    /// A host capability: `handler` runs in the supervisor with arguments
    /// already validated against `schema`. Positional arguments in a script
    /// map onto the schema's `properties` in declaration order.
    pub fn new<F, Fut>(
        name: &str,
        description: &str,
        schema: Value,
        handler: F,
    ) -> Result<Self, CapabilityError>
    where
        F: Fn(CallContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, String>> + Send + 'static,
    {
        // What a host tool answers (a declared tool's, an upstream's, a
        // file's text) is redacted as it comes in, whoever called it.
        let f: Arc<HostFn> = Arc::new(move |ctx, args| {
            let reply = handler(ctx, args);
            Box::pin(async move {
                match reply.await {
                    Ok(mut v) => {
                        crate::secrets::redact_value(&mut v);
                        Ok(v)
                    }
                    Err(e) => Err(crate::secrets::redact_owned(e)),
                }
            })
        });
        let cap = Capability::build(name, description, schema, Handler::Host(f))?;
        // A host schema is checked now, so a bad one fails at registration.
        if let Err(message) = cap.validator() {
            return Err(CapabilityError::BadSchema {
                name: name.to_owned(),
                message: message.to_owned(),
            });
        }
        Ok(cap)
    }

    /// A source of tools named `NAME.TOOL` (see [`ToolSource`]).
    pub fn source(
        name: &str,
        description: &str,
        source: Arc<dyn ToolSource>,
    ) -> Result<Self, CapabilityError> {
        Capability::build(
            name,
            description,
            json!({"type": "object"}),
            Handler::Source(source),
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn description(&self) -> &str {
        &self.description
    }
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// The compiled schema, or why it does not compile (kept as text: the
    /// compiler's error borrows the schema).
    fn validator(&self) -> Result<&jsonschema::Validator, &str> {
        self.validator
            .get_or_init(|| jsonschema::validator_for(&self.schema).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::as_str)
    }

    /// Check `args` against the schema; the message lists every violation.
    pub fn validate(&self, args: &Map<String, Value>) -> Result<(), ArgsError> {
        let validator = self
            .validator()
            .map_err(|e| ArgsError::Schema(e.to_owned()))?;
        let v = Value::Object(args.clone());
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ArgsError::Violations(errors))
        }
    }

    /// Run a host capability outside any cell (`serve` offers some as MCP
    /// tools of their own) for `tenant`, until `cancel`; the arguments are
    /// validated first.
    pub async fn call_direct(
        &self,
        args: Map<String, Value>,
        tenant: Option<super::Tenant>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<Value, CallError> {
        self.validate(&args)?;
        let Handler::Host(f) = &self.handler else {
            return Err(CallError::OutsideCell(self.name.clone()));
        };
        let ctx = CallContext {
            session_id: String::new(),
            run: super::RunInfo {
                run_id: String::new(),
                parent_run_id: None,
                root_run_id: String::new(),
                depth: 0,
                request_id: None,
            },
            tenant,
            cancel,
        };
        f(ctx, args).await.map_err(CallError::Handler)
    }

    pub(crate) fn spec(&self) -> CapabilitySpec {
        CapabilitySpec {
            name: self.name.clone(),
            params: self.params.clone(),
            allowed: true,
        }
    }
}

/// All capabilities a supervisor knows. Built-ins are always registered;
/// whether a session may call them is the policy's business.
#[derive(Debug, Clone)]
pub struct Registry {
    caps: BTreeMap<String, Capability>,
    /// Tool sources by server name: their tools are `SERVER.TOOL`.
    sources: BTreeMap<String, Capability>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut caps = BTreeMap::new();
        let builtins = [
            Capability::build(
                "emit",
                "Record a trace event (any JSON value) in the run's event log.",
                json!({"type": "object", "properties": {"event": {}}, "required": ["event"],
                       "additionalProperties": false}),
                Handler::Emit,
            ),
            Capability::build(
                "answer",
                "Set the cell's final answer (any JSON value).",
                json!({"type": "object", "properties": {"value": {}}, "required": ["value"],
                       "additionalProperties": false}),
                Handler::Answer,
            ),
            Capability::build(
                "run_cell",
                "Run a sub-cell at depth + 1 under a policy no wider than this one; returns its value.",
                json!({"type": "object", "properties": {
                        "language": {"type": "string", "enum": ["rhai", "python", "shell", "bash"]},
                        "code": {"type": "string"},
                        "vars": {"type": "object"}},
                       "required": ["language", "code"], "additionalProperties": false}),
                Handler::RunCell,
            ),
        ];
        for cap in builtins.into_iter().flatten() {
            caps.insert(cap.name.clone(), cap);
        }
        Registry {
            caps,
            sources: BTreeMap::new(),
        }
    }

    /// Register `model_query`, `model_query_batched`, `agent_query` and
    /// `summarize`.
    pub(crate) fn register_models(&mut self) -> Result<(), CapabilityError> {
        let message = json!({"type": "object", "properties": {
            "role": {"type": "string"}, "content": {"type": "string"}},
            "required": ["role", "content"]});
        let prompt = json!({"anyOf": [{"type": "string"}, {"type": "array", "items": message}]});
        let query = json!({"type": "object", "properties": {
                "prompt": prompt,
                "model": {"type": ["string", "null"]},
                "max_tokens": {"type": ["integer", "null"], "minimum": 1},
                "temperature": {"type": ["number", "null"], "minimum": 0}},
            "required": ["prompt"], "additionalProperties": false});
        let batch = json!({"type": "object", "properties": {
                "prompts": {"type": "array", "items": prompt, "maxItems": 1000},
                "model": {"type": ["string", "null"]},
                "max_tokens": {"type": ["integer", "null"], "minimum": 1},
                "temperature": {"type": ["number", "null"], "minimum": 0}},
            "required": ["prompts"], "additionalProperties": false});
        for cap in [
            Capability::build(
                "model_query",
                "model_query(prompt_or_messages, model=None, max_tokens=None, temperature=None): \
                 ask a configured model; returns the reply text.",
                query,
                Handler::Model(ModelOp::Query),
            )?,
            Capability::build(
                "model_query_batched",
                "model_query_batched(prompts, model=None, max_tokens=None, temperature=None): \
                 ask a configured model several prompts at once; the replies in order.",
                batch,
                Handler::Model(ModelOp::Batch),
            )?,
            Capability::build(
                "agent_query",
                "agent_query(task, context=None, model=None): run a sub-agent (a model writing \
                 code in a fresh session, at depth + 1, with what is left of this run's budgets); \
                 returns its answer.",
                json!({"type": "object", "properties": {
                        "task": {"type": "string"},
                        "context": {},
                        "model": {"type": ["string", "null"]}},
                       "required": ["task"], "additionalProperties": false}),
                Handler::Model(ModelOp::Agent),
            )?,
            Capability::build(
                "summarize",
                "summarize(text, max_tokens=None, model=None): ask a configured model for a \
                 summary of text in at most max_tokens tokens; returns the summary.",
                json!({"type": "object", "properties": {
                        "text": {"type": "string"},
                        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
                        "model": {"type": ["string", "null"]}},
                       "required": ["text"], "additionalProperties": false}),
                Handler::Model(ModelOp::Summarize),
            )?,
        ] {
            self.register(cap)?;
        }
        Ok(())
    }

    pub fn register(&mut self, cap: Capability) -> Result<(), CapabilityError> {
        if self.caps.contains_key(&cap.name) || self.sources.contains_key(&cap.name) {
            return Err(CapabilityError::Duplicate(cap.name));
        }
        if matches!(cap.handler, Handler::Source(_)) {
            self.sources.insert(cap.name.clone(), cap);
        } else {
            self.caps.insert(cap.name.clone(), cap);
        }
        Ok(())
    }

    /// The source of `SERVER.TOOL` and TOOL, when SERVER is a registered
    /// tool source.
    pub fn source_of<'a>(&self, name: &'a str) -> Option<(Arc<dyn ToolSource>, &'a str)> {
        let (server, tool) = name.split_once('.')?;
        match &self.sources.get(server)?.handler {
            Handler::Source(s) => Some((s.clone(), tool)),
            _ => None,
        }
    }

    /// The names (and descriptions) of the registered tool sources.
    pub fn sources(&self) -> impl Iterator<Item = &Capability> {
        self.sources.values()
    }

    /// True when `name` is a capability, or `SERVER.TOOL` / `SERVER.*` of
    /// a tool source (its tools are not looked up: the source is not
    /// started).
    pub fn may_name(&self, name: &str) -> bool {
        self.caps.contains_key(name)
            || name.split_once('.').is_some_and(|(server, tool)| {
                self.sources.contains_key(server) && (tool == "*" || valid_dotted_name(name))
            })
    }

    pub fn get(&self, name: &str) -> Option<&Capability> {
        self.caps.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.caps.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_validate_args() {
        let r = Registry::with_builtins();
        let rc = r.get("run_cell").unwrap();
        assert_eq!(rc.params, vec!["language", "code", "vars"]);
        let mut ok = Map::new();
        ok.insert("language".into(), json!("rhai"));
        ok.insert("code".into(), json!("1"));
        assert!(rc.validate(&ok).is_ok());
        let mut bad = ok.clone();
        bad.insert("language".into(), json!("cobol"));
        assert!(rc.validate(&bad).is_err());
        bad.remove("language");
        assert!(rc
            .validate(&bad)
            .unwrap_err()
            .to_string()
            .contains("language"));
    }

    struct NoTools;
    impl ToolSource for NoTools {
        fn tool<'a>(&'a self, _: &'a Account, tool: &'a str) -> SourceFuture<'a, Capability> {
            Box::pin(async move { Err(SourceError::Unknown(tool.to_owned())) })
        }
        fn list<'a>(&'a self, _: &'a Account) -> SourceFuture<'a, Vec<Capability>> {
            Box::pin(async { Ok(Vec::new()) })
        }
    }

    #[test]
    fn dotted_names_belong_to_tool_sources() {
        let h = |_c: CallContext, _a: Map<String, Value>| async { Ok(Value::Null) };
        assert!(Capability::new("gh.search-issues", "", json!({"type": "object"}), h).is_ok());
        for bad in ["gh.", ".x", "1gh.x", "gh.x y", "gh..x y"] {
            assert!(
                Capability::new(bad, "", json!({"type": "object"}), h).is_err(),
                "{bad}"
            );
        }
        let mut r = Registry::with_builtins();
        r.register(Capability::source("gh", "", Arc::new(NoTools)).unwrap())
            .unwrap();
        assert!(r.get("gh").is_none(), "a source is not a capability");
        assert!(r.source_of("gh.search").is_some_and(|(_, t)| t == "search"));
        assert!(r.source_of("other.search").is_none());
        assert!(r.may_name("gh.*") && r.may_name("gh.search") && r.may_name("emit"));
        assert!(!r.may_name("gh") && !r.may_name("other.*") && !r.may_name("gh.a b"));
        for ok in ["emit", "gh.search", "gh.x.y", "gh.a-b", "gh.*"] {
            assert!(is_allow_name(ok), "{ok}");
        }
        for bad in ["", "gh.", ".x", "gh.x y", "1x", "gh.*.x", "*", "gh.x.*"] {
            assert!(!is_allow_name(bad), "{bad}");
        }
        assert!(is_capability_name("gh.x.y") && !is_capability_name("gh.*"));
        assert!(matches!(
            r.register(Capability::source("gh", "", Arc::new(NoTools)).unwrap()),
            Err(CapabilityError::Duplicate(_))
        ));
    }

    #[test]
    fn rejects_bad_definitions() {
        let h = |_c: CallContext, _a: Map<String, Value>| async { Ok(Value::Null) };
        assert!(matches!(
            Capability::new("1x", "", json!({"type": "object"}), h),
            Err(CapabilityError::BadName(_))
        ));
        assert!(matches!(
            Capability::new("x", "", json!({"type": "string"}), h),
            Err(CapabilityError::BadSchema { .. })
        ));
        let mut r = Registry::with_builtins();
        let dup = Capability::new("emit", "", json!({"type": "object"}), h).unwrap();
        assert!(matches!(
            r.register(dup),
            Err(CapabilityError::Duplicate(_))
        ));
    }
}
