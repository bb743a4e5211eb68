//! Declared tools (`[tools.NAME]`, see [`super::config`]) as capabilities.

use super::config::{HeaderValue, ToolDecl, ToolsConfig};
use crate::supervisor::{Capability, Limits, SessionConfig, WeakSupervisor};
use serde_json::{json, Map, Value};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Where a declared command tool finds the supervisor that runs it; set
/// once the supervisor is built (it holds the tools in its registry).
pub type SupervisorSlot = Arc<OnceLock<WeakSupervisor>>;

/// A declared tool could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DeclaredError {
    #[error("tools.{name}: {source}")]
    Capability {
        name: String,
        #[source]
        source: crate::supervisor::CapabilityError,
    },
    #[error("tools.{name}.argv: empty")]
    EmptyArgv { name: String },
    #[error("tools.{name}.allow_options: {arg:?} is not an argument of argv (write {{{arg}}} there, or \"*\" for every argument)")]
    AllowOptions { name: String, arg: String },
    #[error("tools.{name}.url: only http:// and https:// URLs are supported (got {url:?})")]
    Url { name: String, url: String },
    #[error(transparent)]
    Upstream(#[from] super::upstream::UpstreamError),
    #[error(transparent)]
    Env(#[from] super::env::EnvError),
    #[error("tools.{name}.ca_file: failed to read {path}")]
    CaFile {
        name: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tools.{name}.ca_file: {path} holds no PEM certificate{why}")]
    CaPem {
        name: String,
        path: std::path::PathBuf,
        why: String,
    },
    #[error("tools.{name}: {source}")]
    Secrets {
        name: String,
        #[source]
        source: crate::secrets::SecretsError,
    },
    #[error("tools.{name}: failed to build the HTTP client")]
    Client {
        name: String,
        #[source]
        source: reqwest::Error,
    },
}

/// Why a call of a declared tool failed (the message the script sees).
#[derive(Debug, thiserror::Error)]
pub enum ToolCallError {
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    #[error("argument {0:?} is missing")]
    MissingArgument(String),
    #[error("an argument contains a NUL byte")]
    NulByte,
    #[error(
        "argument {0:?} begins with '-', which the program would read as an option: refused \
         (the tool's declaration may allow it with allow_options)"
    )]
    OptionValue(String),
    #[error("tools.{tool}: {problem}")]
    Environment { tool: String, problem: String },
    #[error("the command did not finish in {0} ms")]
    CommandTimeout(u64),
    #[error("the command ended with status {status}: {message}")]
    CommandFailed {
        status: crate::Status,
        message: String,
    },
    #[error("header {name}: the environment variable {env} is not set")]
    HeaderEnv { name: String, env: String },
    #[error("header {name}: the value is not a valid header value")]
    HeaderValue { name: String },
    #[error("POST {url} failed: {}", error_chain(.source))]
    Post {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("reading the response of {url}: {source}")]
    Read {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the response of {url} is over {max} bytes")]
    TooLarge { url: String, max: usize },
    #[error("POST {url}: HTTP {status}: {text}")]
    Http {
        url: String,
        status: reqwest::StatusCode,
        text: String,
    },
    #[error("the response of {url} is not JSON: {source}")]
    NotJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The argv of a command tool: `{NAME}` replaced by argument NAME (a
/// string as is, anything else as JSON), `{args}` by all arguments as JSON.
/// Each template element stays one argument: nothing is split or globbed.
/// A value that would begin an element with '-' is refused (the program
/// would read it as an option) unless its argument is in `allow_options`
/// (`"*"`: all), or the element comes after a literal `"--"`.
pub fn substitute(
    template: &[String],
    args: &Map<String, Value>,
    allow_options: &[String],
) -> Result<Vec<String>, ToolCallError> {
    let may_be_option = |key: &str| allow_options.iter().any(|a| a == "*" || a == key);
    let mut options_ended = false;
    template
        .iter()
        .map(|t| {
            let checked = !options_ended;
            if t == "--" {
                options_ended = true;
            }
            let mut out = String::new();
            let mut rest = t.as_str();
            while let Some(open) = rest.find('{') {
                out.push_str(&rest[..open]);
                let after = &rest[open + 1..];
                match after.find('}') {
                    Some(close)
                        if !after[..close].is_empty()
                            && after[..close]
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        let key = &after[..close];
                        if key == "args" {
                            out.push_str(&Value::Object(args.clone()).to_string());
                        } else {
                            let value = match args.get(key) {
                                Some(Value::String(s)) => s.clone(),
                                Some(v) => v.to_string(),
                                None => return Err(ToolCallError::MissingArgument(key.to_owned())),
                            };
                            if checked
                                && out.is_empty()
                                && value.starts_with('-')
                                && !may_be_option(key)
                            {
                                return Err(ToolCallError::OptionValue(key.to_owned()));
                            }
                            out.push_str(&value);
                        }
                        rest = &after[close + 1..];
                    }
                    _ => {
                        out.push('{');
                        rest = after;
                    }
                }
            }
            out.push_str(rest);
            if out.contains('\0') {
                return Err(ToolCallError::NulByte);
            }
            Ok(out)
        })
        .collect()
}

fn cut(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (s, true)
}

/// A command tool as declared.
struct CommandTool {
    name: String,
    argv: Vec<String>,
    allow_options: Vec<String>,
    env: super::env::HelperEnv,
    timeout_ms: u64,
    max_output: usize,
}

/// The variables `tool`'s program starts with besides the sandbox's.
fn command_env(tool: &CommandTool) -> Result<Vec<(String, String)>, ToolCallError> {
    let bad = |problem| ToolCallError::Environment {
        tool: tool.name.clone(),
        problem,
    };
    tool.env
        .resolve()
        .map_err(bad)?
        .into_iter()
        .map(|(k, v)| match v.into_string() {
            Ok(v) => Ok((k, v)),
            Err(_) => Err(bad(format!(
                "the value of the environment variable {k} (pass_env) is not Unicode"
            ))),
        })
        .collect()
}

async fn run_command(
    slot: SupervisorSlot,
    tool: Arc<CommandTool>,
    args: Map<String, Value>,
) -> Result<Value, ToolCallError> {
    let sup = slot
        .get()
        .and_then(WeakSupervisor::upgrade)
        .ok_or(ToolCallError::ShuttingDown)?;
    let argv = substitute(&tool.argv, &args, &tool.allow_options)?;
    let env = command_env(&tool)?;
    let (timeout_ms, max_output) = (tool.timeout_ms, tool.max_output);
    let config = SessionConfig {
        limits: Limits {
            timeout_ms,
            max_output_bytes: max_output,
            ..Limits::default()
        },
        ..SessionConfig::default()
    };
    let r = sup.exec_with_env(argv, env, config, false).await;
    match r.status {
        crate::Status::Ok | crate::Status::Error => Ok(json!({
            "exit_code": r.exit.code,
            "signal": r.exit.signal,
            "stdout": r.stdout,
            "stderr": r.stderr,
            "stdout_truncated": r.truncated.stdout.is_some(),
            "stderr_truncated": r.truncated.stderr.is_some(),
        })),
        crate::Status::Timeout => Err(ToolCallError::CommandTimeout(timeout_ms)),
        status => Err(ToolCallError::CommandFailed {
            status,
            message: r.error.map(|e| e.message).unwrap_or_default(),
        }),
    }
}

/// A header of an http tool as it is sent: a literal, or a secret read
/// (and registered with the redaction) when the tool was declared.
#[derive(Debug, Clone)]
enum Header {
    Literal(String),
    Secret {
        env: String,
        prefix: String,
        value: Option<crate::secrets::Secret>,
    },
}

fn read_headers(
    headers: std::collections::BTreeMap<String, HeaderValue>,
) -> Result<Vec<(String, Header)>, crate::secrets::SecretsError> {
    headers
        .into_iter()
        .map(|(name, v)| {
            Ok((
                name,
                match v {
                    HeaderValue::Literal(v) => Header::Literal(v),
                    HeaderValue::Env { env, prefix } => Header::Secret {
                        value: crate::secrets::from_env(&env)?,
                        env,
                        prefix,
                    },
                },
            ))
        })
        .collect()
}

async fn post(
    client: reqwest::Client,
    url: String,
    headers: Vec<(String, Header)>,
    max: usize,
    args: Map<String, Value>,
) -> Result<Value, ToolCallError> {
    let mut req = client.post(&url).json(&Value::Object(args));
    for (name, value) in headers {
        match value {
            Header::Literal(v) => req = req.header(name, v),
            Header::Secret {
                value: Some(v),
                prefix,
                ..
            } => {
                let mut v =
                    reqwest::header::HeaderValue::try_from(format!("{prefix}{}", v.expose()))
                        .map_err(|_| ToolCallError::HeaderValue { name: name.clone() })?;
                v.set_sensitive(true);
                req = req.header(name, v);
            }
            Header::Secret {
                value: None, env, ..
            } => return Err(ToolCallError::HeaderEnv { name, env }),
        }
    }
    let mut resp = req.send().await.map_err(|source| ToolCallError::Post {
        url: url.clone(),
        source,
    })?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|source| ToolCallError::Read {
        url: url.clone(),
        source,
    })? {
        body.extend_from_slice(&chunk);
        if body.len() > max {
            return Err(ToolCallError::TooLarge { url, max });
        }
    }
    if !status.is_success() {
        // Redacted whole before it is cut (a cut secret leaves a prefix no
        // redaction recognises).
        let body = crate::secrets::redact(&String::from_utf8_lossy(&body)).into_owned();
        let (text, _) = cut(body, 500);
        return Err(ToolCallError::Http { url, status, text });
    }
    serde_json::from_slice(&body).map_err(|source| ToolCallError::NotJson { url, source })
}

/// The root certificates of `ca_file`, read at startup.
pub fn read_ca(
    name: &str,
    path: &std::path::Path,
) -> Result<Vec<reqwest::Certificate>, DeclaredError> {
    let pem = std::fs::read(path).map_err(|source| DeclaredError::CaFile {
        name: name.to_owned(),
        path: path.to_owned(),
        source,
    })?;
    let bad = |why: String| DeclaredError::CaPem {
        name: name.to_owned(),
        path: path.to_owned(),
        why,
    };
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => Err(bad(String::new())),
        Err(e) => Err(bad(format!(": {}", error_chain(&e)))),
    }
}

/// An error and its causes, joined (a TLS failure is a cause of a
/// request's error).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

/// A client trusting the roots of `ca_file` besides the built-in ones.
pub fn client_with_roots(
    builder: reqwest::ClientBuilder,
    roots: Vec<reqwest::Certificate>,
) -> reqwest::ClientBuilder {
    #[cfg(feature = "tls")]
    let builder = builder.tls_certs_merge(roots);
    #[cfg(not(feature = "tls"))]
    let _ = roots;
    builder
}

/// Every declared tool as a capability.
pub fn capabilities(
    tools: &ToolsConfig,
    slot: &SupervisorSlot,
) -> Result<Vec<Capability>, DeclaredError> {
    let mut caps = Vec::new();
    for (name, decl) in tools {
        let bad = |source| DeclaredError::Capability {
            name: name.clone(),
            source,
        };
        let cap = match decl.clone() {
            ToolDecl::Command {
                description,
                schema,
                argv,
                allow_options,
                env,
                pass_env,
                timeout_ms,
                max_output_bytes,
            } => {
                if argv.is_empty() {
                    return Err(DeclaredError::EmptyArgv { name: name.clone() });
                }
                if let Some(arg) = allow_options
                    .iter()
                    .find(|a| *a != "*" && !argv.iter().any(|t| t.contains(&format!("{{{a}}}"))))
                {
                    return Err(DeclaredError::AllowOptions {
                        name: name.clone(),
                        arg: arg.clone(),
                    });
                }
                let env =
                    super::env::HelperEnv::new(name, &env, &pass_env, super::env::SANDBOX_VARS)?;
                let tool = Arc::new(CommandTool {
                    name: name.clone(),
                    argv,
                    allow_options,
                    env,
                    timeout_ms,
                    max_output: max_output_bytes,
                });
                let schema = serde_json::to_value(schema).unwrap_or(json!({}));
                let slot = slot.clone();
                Capability::new(name, &description, schema, move |_ctx, args| {
                    let call = run_command(slot.clone(), tool.clone(), args);
                    async move { call.await.map_err(|e| e.to_string()) }
                })
                .map_err(bad)?
            }
            ToolDecl::Http {
                description,
                schema,
                url,
                headers,
                ca_file,
                timeout_ms,
                max_output_bytes,
            } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(DeclaredError::Url {
                        name: name.clone(),
                        url,
                    });
                }
                let roots = match &ca_file {
                    Some(p) => read_ca(name, p)?,
                    None => Vec::new(),
                };
                let client = client_with_roots(reqwest::Client::builder(), roots)
                    .timeout(Duration::from_millis(timeout_ms))
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .build()
                    .map_err(|source| DeclaredError::Client {
                        name: name.clone(),
                        source,
                    })?;
                let headers = read_headers(headers).map_err(|source| DeclaredError::Secrets {
                    name: name.clone(),
                    source,
                })?;
                let schema = serde_json::to_value(schema).unwrap_or(json!({}));
                let tool = name.clone();
                Capability::new(name, &description, schema, move |_ctx, args| {
                    let call = post(
                        client.clone(),
                        url.clone(),
                        headers.clone(),
                        max_output_bytes,
                        args,
                    );
                    let tool = tool.clone();
                    async move { call.await.map_err(|e| format!("{tool}: {e}")) }
                })
                .map_err(bad)?
            }
            ToolDecl::Mcp {
                description,
                command,
                url,
                token_env,
                ca_file,
                env,
                pass_env,
                timeout_ms,
                max_output_bytes,
                shared,
            } => {
                let mut target = super::upstream::Target::new(name, command, url, token_env)?
                    .with_env(name, &env, &pass_env)?;
                if let Some(p) = &ca_file {
                    target = target.with_roots(name, read_ca(name, p)?)?;
                }
                super::upstream::capability(
                    name,
                    &description,
                    target,
                    timeout_ms,
                    max_output_bytes,
                    shared,
                )?
            }
        };
        caps.push(cap);
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitution_keeps_each_element_one_argument() {
        let args = json!({"q": "a b; rm -rf /", "n": 3})
            .as_object()
            .cloned()
            .unwrap();
        let t: Vec<String> = ["grep", "-m{n}", "{q}", "{args}", "{not closed", "{}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let v = substitute(&t, &args, &[]).unwrap();
        assert_eq!(v[1], "-m3");
        assert_eq!(v[2], "a b; rm -rf /");
        assert_eq!(serde_json::from_str::<Value>(&v[3]).unwrap()["n"], 3);
        assert_eq!(v[4], "{not closed");
        assert_eq!(v[5], "{}");
        assert!(substitute(&["{missing}".into()], &args, &[]).is_err());
    }

    #[test]
    fn values_that_would_be_options_are_refused() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let args = |v: Value| v.as_object().cloned().unwrap();
        let wc = t(&["/usr/bin/wc", "-l", "{path}"]);
        for bad in [json!("-"), json!("--files0-from=/etc/passwd"), json!(-3)] {
            let e = substitute(&wc, &args(json!({ "path": bad })), &[]).unwrap_err();
            assert!(
                matches!(e, ToolCallError::OptionValue(ref a) if a == "path"),
                "{e}"
            );
        }
        // Allowed by name or for all; inside an element; after "--".
        let a = args(json!({"path": "-x"}));
        assert_eq!(substitute(&wc, &a, &["path".into()]).unwrap()[2], "-x");
        assert_eq!(substitute(&wc, &a, &["*".into()]).unwrap()[2], "-x");
        assert!(substitute(&wc, &a, &["other".into()]).is_err());
        let v = substitute(&t(&["grep", "--file={path}", "x"]), &a, &[]).unwrap();
        assert_eq!(v[1], "--file=-x");
        let v = substitute(&t(&["wc", "-l", "--", "{path}"]), &a, &[]).unwrap();
        assert_eq!(v[3], "-x");
        // An empty value before it does not hide it.
        let e = substitute(
            &t(&["{e}{path}"]),
            &args(json!({"e": "", "path": "-x"})),
            &[],
        );
        assert!(e.is_err());
        assert_eq!(
            substitute(&wc, &args(json!({"path": "a-b"})), &[]).unwrap()[2],
            "a-b"
        );
    }
}
