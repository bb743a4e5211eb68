//! The chat-completions client: one request per attempt, 429 and 5xx
//! retried (honouring `Retry-After`), every failure a typed error that
//! names the model and the attempts made, never the key.

use super::config::{self, ModelConfig, ModelsConfigError, ModelsSection};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Largest reply read from an endpoint: a reply is read as it arrives and
/// dropped once it passes this, so a batch holds at most this much per
/// query in flight (and [`ReplyBytes`] bounds what its replies hold
/// together).
pub const MAX_REPLY_BYTES: usize = 4 << 20;
/// Tokens a reported usage may hold at most to be believed: more is not a
/// count any endpoint gives for one query.
const MAX_REPORTED_TOKENS: u64 = 100_000_000;
/// Characters of an error body quoted in a message.
const QUOTED_BODY_CHARS: usize = 300;
/// Longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Endpoint {
    config: ModelConfig,
    url: String,
    /// The API key: never printed, and known to the redaction (see
    /// [`crate::secrets`]) since it was read.
    key: Option<crate::secrets::Secret>,
}

/// Tokens one query (or many) used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl TokenUsage {
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// A model's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReply {
    pub text: String,
    /// The configured model name (the `[models.NAME]` key).
    pub model: String,
    /// The usage the reply reported (zero when it reported none that can
    /// be believed: see `usage_problem`).
    pub usage: TokenUsage,
    /// Why the reported usage was not believed: missing, or not a sane
    /// non-negative integer count. A budget then charges what it held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_problem: Option<String>,
    /// In the configured price unit, when prices are set.
    pub cost: Option<f64>,
    pub attempts: u32,
    pub ms: u64,
}

/// A query that produced no answer. Messages name the model and the
/// attempts made; none holds the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model {name:?} (configured: {known})")]
    UnknownModel { name: String, known: String },
    #[error("no model is configured: add a [models.NAME] table to the config file")]
    NoModels,
    #[error("model {model:?} answered HTTP {status} after {attempts} attempt(s): {body}")]
    Status {
        model: String,
        status: u16,
        attempts: u32,
        body: String,
    },
    #[error("model {model:?} sent a malformed reply (attempt {attempts}): {problem}")]
    Malformed {
        model: String,
        attempts: u32,
        problem: String,
    },
    #[error("model {model:?} did not answer within {seconds} s (attempt {attempts})")]
    Timeout {
        model: String,
        attempts: u32,
        seconds: u64,
    },
    #[error("model {model:?} sent a reply larger than allowed (attempt {attempts}): {message}")]
    TooLarge {
        model: String,
        attempts: u32,
        message: String,
    },
    #[error("failed to reach model {model:?} (attempt {attempts}): {message}")]
    Connect {
        model: String,
        attempts: u32,
        message: String,
    },
}

/// Building a client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Config(#[from] ModelsConfigError),
    #[error("failed to build the HTTP client: {0}")]
    Http(String),
    #[error(transparent)]
    Secrets(#[from] crate::secrets::SecretsError),
}

/// One query.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub model: Option<String>,
    /// Chat messages (`{"role", "content"}` objects).
    pub messages: Vec<Value>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    /// The bytes this query's reply shares with others (a batch's).
    pub shared_bytes: Option<std::sync::Arc<ReplyBytes>>,
}

/// Bytes several replies may hold together: each reply's bytes are taken
/// from it as they arrive, so a batch never holds more than this whatever
/// its replies are.
#[derive(Debug)]
pub struct ReplyBytes {
    max: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl ReplyBytes {
    pub fn new(max: usize) -> ReplyBytes {
        ReplyBytes {
            max,
            used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Take `n` bytes; false (taking nothing) when they pass the bound.
    fn take(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.max)
            })
            .is_ok()
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// The tokens a prompt of `messages` is counted at before it is sent: each
/// message's content in o200k_base (the tokenizer `aggregate_context`
/// counts with), plus what chat formatting adds per message and for the
/// reply's start.
pub fn estimate_prompt_tokens(messages: &[Value]) -> u64 {
    const PER_MESSAGE: u64 = 4;
    const PRIMING: u64 = 3;
    let enc = crate::context::Encoding::O200kBase;
    messages.iter().fold(PRIMING, |acc, m| {
        let content = match m.get("content") {
            Some(Value::String(s)) => enc.count(s),
            Some(other) => enc.count(&other.to_string()),
            None => enc.count(&m.to_string()),
        };
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .map_or(0, |r| enc.count(r));
        acc.saturating_add(PER_MESSAGE)
            .saturating_add(content as u64)
            .saturating_add(role as u64)
    })
}

/// The configured models and an HTTP client (rustls, no redirects).
#[derive(Debug, Clone)]
pub struct ModelClient {
    http: reqwest::Client,
    models: BTreeMap<String, Endpoint>,
    default: Option<String>,
}

impl ModelClient {
    /// Validate `models` and read each key from the environment now (a
    /// missing variable is an error that names it, never its value).
    pub fn new(models: &ModelsSection) -> Result<ModelClient, ClientError> {
        let mut keys = BTreeMap::new();
        for var in models.values().filter_map(|m| m.api_key_env.as_deref()) {
            if let Some(k) = crate::secrets::from_env(var)? {
                keys.insert(var.to_owned(), k);
            }
        }
        Self::with_env(models, |k| keys.get(k).cloned())
    }

    fn with_env(
        models: &ModelsSection,
        env: impl Fn(&str) -> Option<crate::secrets::Secret>,
    ) -> Result<ModelClient, ClientError> {
        let default = config::validate(models)?;
        let mut out = BTreeMap::new();
        for (name, m) in models {
            let key = match &m.api_key_env {
                None => None,
                Some(var) => match env(var) {
                    Some(v) if !v.expose().is_empty() => Some(v),
                    _ => {
                        return Err(ModelsConfigError {
                            key: format!("models.{name}.api_key_env"),
                            problem: format!("the environment variable {var} is not set"),
                        }
                        .into())
                    }
                },
            };
            let url = format!("{}/chat/completions", m.endpoint.trim_end_matches('/'));
            out.insert(
                name.clone(),
                Endpoint {
                    config: m.clone(),
                    url,
                    key,
                },
            );
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Http(e.to_string()))?;
        Ok(ModelClient {
            http,
            models: out,
            default,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The configured model names, the default first.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.default.iter().cloned().collect();
        v.extend(
            self.models
                .keys()
                .filter(|k| Some(*k) != self.default.as_ref())
                .cloned(),
        );
        v
    }

    pub fn default_model(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The configuration of model `name` (the default when `None`).
    pub fn config(&self, name: Option<&str>) -> Result<(&str, &ModelConfig), ModelError> {
        let (n, e) = self.endpoint(name)?;
        Ok((n, &e.config))
    }

    fn endpoint(&self, name: Option<&str>) -> Result<(&str, &Endpoint), ModelError> {
        let name = match name {
            Some(n) => n,
            None => self.default.as_deref().ok_or(ModelError::NoModels)?,
        };
        match self.models.get_key_value(name) {
            Some((k, e)) => Ok((k.as_str(), e)),
            None if self.models.is_empty() => Err(ModelError::NoModels),
            None => Err(ModelError::UnknownModel {
                name: name.to_owned(),
                known: self.models.keys().cloned().collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The cost of `usage` on model `name`, when it has prices.
    pub fn cost(config: &ModelConfig, usage: TokenUsage) -> Option<f64> {
        if config.input_price.is_none() && config.output_price.is_none() {
            return None;
        }
        Some(
            config.input_price.unwrap_or(0.0) * usage.input_tokens as f64 / 1e6
                + config.output_price.unwrap_or(0.0) * usage.output_tokens as f64 / 1e6,
        )
    }

    /// Ask one model; retries 429 and 5xx up to `max_attempts`.
    pub async fn query(&self, q: &Query) -> Result<ModelReply, ModelError> {
        let (name, ep) = self.endpoint(q.model.as_deref())?;
        let c = &ep.config;
        let mut body = json!({"model": c.model, "messages": q.messages});
        let max_tokens = match (q.max_tokens, c.max_tokens) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(n) = max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(t) = q.temperature {
            body["temperature"] = json!(t);
        }
        let t0 = Instant::now();
        let timeout = Duration::from_secs(c.timeout_seconds);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.http.post(&ep.url).timeout(timeout).json(&body);
            if let Some(k) = &ep.key {
                req = req.bearer_auth(k.expose());
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if e.is_timeout() => {
                    return Err(ModelError::Timeout {
                        model: name.to_owned(),
                        attempts: attempt,
                        seconds: c.timeout_seconds,
                    })
                }
                Err(e) => {
                    return Err(ModelError::Connect {
                        model: name.to_owned(),
                        attempts: attempt,
                        message: redact(&describe(&e)),
                    })
                }
            };
            let status = resp.status();
            let retryable = status.as_u16() == 429 || status.is_server_error();
            if retryable && attempt < c.max_attempts {
                let wait = retry_after(resp.headers()).unwrap_or_else(|| {
                    Duration::from_millis(c.backoff_ms.saturating_mul(1 << (attempt - 1).min(10)))
                });
                drop(resp);
                tokio::time::sleep(wait.min(MAX_RETRY_AFTER)).await;
                continue;
            }
            let bytes = match read_capped(resp, q.shared_bytes.as_deref()).await {
                Ok(b) => b,
                Err(ReadError::Timeout) => {
                    return Err(ModelError::Timeout {
                        model: name.to_owned(),
                        attempts: attempt,
                        seconds: c.timeout_seconds,
                    })
                }
                Err(ReadError::TooLarge(m)) => {
                    return Err(ModelError::TooLarge {
                        model: name.to_owned(),
                        attempts: attempt,
                        message: m,
                    })
                }
                Err(ReadError::Other(m)) => {
                    return Err(ModelError::Connect {
                        model: name.to_owned(),
                        attempts: attempt,
                        message: redact(&m),
                    })
                }
            };
            if !status.is_success() {
                // Redacted whole before it is cut: a cut secret would
                // leave a prefix no redaction recognises.
                let text = redact(&String::from_utf8_lossy(&bytes));
                let quoted: String = text.chars().take(QUOTED_BODY_CHARS).collect();
                return Err(ModelError::Status {
                    model: name.to_owned(),
                    status: status.as_u16(),
                    attempts: attempt,
                    body: quoted.trim().to_owned(),
                });
            }
            let (text, usage) = parse_reply(&bytes).map_err(|problem| ModelError::Malformed {
                model: name.to_owned(),
                attempts: attempt,
                problem,
            })?;
            let (usage, usage_problem) = match usage {
                Ok(u) => (u, None),
                Err(p) => (TokenUsage::default(), Some(p)),
            };
            return Ok(ModelReply {
                // An endpoint may echo what it was sent (the key among
                // it): the reply is redacted like every text that leaves.
                text: redact(&text),
                model: name.to_owned(),
                usage,
                usage_problem,
                cost: Self::cost(c, usage),
                attempts: attempt,
                ms: t0.elapsed().as_millis() as u64,
            });
        }
    }
}

/// `text` with every secret the process holds (this endpoint's key and
/// every other) redacted.
fn redact(text: &str) -> String {
    crate::secrets::redact(text).into_owned()
}

fn describe(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

enum ReadError {
    Timeout,
    TooLarge(String),
    Other(String),
}

/// The body of `resp`, read as it arrives: past [`MAX_REPLY_BYTES`], or
/// past what `shared` has left, it is dropped with an error naming the
/// bound.
async fn read_capped(
    mut resp: reqwest::Response,
    shared: Option<&ReplyBytes>,
) -> Result<Vec<u8>, ReadError> {
    if let Some(n) = resp.content_length() {
        if n > MAX_REPLY_BYTES as u64 {
            return Err(ReadError::TooLarge(format!(
                "it announced {n} bytes, over the limit of {MAX_REPLY_BYTES} bytes per reply"
            )));
        }
    }
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > MAX_REPLY_BYTES {
                    return Err(ReadError::TooLarge(format!(
                        "more than {MAX_REPLY_BYTES} bytes, the limit per reply"
                    )));
                }
                if let Some(s) = shared {
                    if !s.take(c.len()) {
                        return Err(ReadError::TooLarge(format!(
                            "the replies of one batch passed {} bytes together, the limit per \
                             batch",
                            s.max()
                        )));
                    }
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) if e.is_timeout() => return Err(ReadError::Timeout),
            Err(e) => return Err(ReadError::Other(describe(&e))),
        }
    }
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(60.0)))
}

/// The reply text of a chat-completions body, and its usage or why that
/// cannot be believed.
type Parsed = (String, Result<TokenUsage, String>);

/// One count of a reported usage: a non-negative integer no larger than
/// [`MAX_REPORTED_TOKENS`].
fn count(usage: &Value, key: &str) -> Result<u64, String> {
    match usage.get(key) {
        None | Some(Value::Null) => Err(format!("usage.{key} is missing")),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= MAX_REPORTED_TOKENS => Ok(v),
            Some(v) => Err(format!(
                "usage.{key} is {v}, more than any one query uses ({MAX_REPORTED_TOKENS})"
            )),
            None => Err(format!("usage.{key} is {n}, not a non-negative integer")),
        },
        Some(other) => {
            let shown: String = other.to_string().chars().take(40).collect();
            Err(format!("usage.{key} is {shown}, not a number"))
        }
    }
}

fn parse_reply(bytes: &[u8]) -> Result<Parsed, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        let head: String = redact(&String::from_utf8_lossy(bytes))
            .chars()
            .take(80)
            .collect();
        format!("the body is not JSON ({e}); it begins {head:?}")
    })?;
    let text = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or("no choices[0].message.content string in the body")?
        .to_owned();
    let usage = match v.get("usage") {
        None | Some(Value::Null) => Err("the reply reported no usage".to_owned()),
        Some(u) if !u.is_object() => Err("usage is not an object".to_owned()),
        Some(u) => count(u, "prompt_tokens").and_then(|input_tokens| {
            Ok(TokenUsage {
                input_tokens,
                output_tokens: count(u, "completion_tokens")?,
            })
        }),
    };
    Ok((text, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(key_env: Option<&str>) -> ModelsSection {
        let mut s = ModelsSection::new();
        s.insert(
            "m".into(),
            ModelConfig {
                endpoint: "http://127.0.0.1:9/v1/".into(),
                model: "x".into(),
                api_key_env: key_env.map(str::to_owned),
                timeout_seconds: 5,
                max_attempts: 2,
                backoff_ms: 1,
                max_tokens: None,
                input_price: Some(2.0),
                output_price: None,
                default: false,
            },
        );
        s
    }

    #[test]
    fn key_is_read_and_never_printed() {
        let c = ModelClient::with_env(&section(Some("K")), |_| {
            Some(crate::secrets::Secret::new("K", "sekrit-123".into()))
        })
        .unwrap();
        assert!(!format!("{c:?}").contains("sekrit"));
        assert_eq!(c.models["m"].url, "http://127.0.0.1:9/v1/chat/completions");
        let e = ModelClient::with_env(&section(Some("K")), |_| None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "models.m.api_key_env: the environment variable K is not set"
        );
    }

    #[test]
    fn parses_replies_and_prices() {
        let (t, u) = parse_reply(
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        )
        .unwrap();
        let u = u.unwrap();
        assert_eq!((t.as_str(), u.total()), ("hi", 7));
        for (usage, problem) in [
            ("", "reported no usage"),
            (r#","usage":null"#, "reported no usage"),
            (r#","usage":7"#, "not an object"),
            (
                r#","usage":{"completion_tokens":4}"#,
                "prompt_tokens is missing",
            ),
            (
                r#","usage":{"prompt_tokens":-3,"completion_tokens":4}"#,
                "-3, not a non-negative integer",
            ),
            (
                r#","usage":{"prompt_tokens":3.5,"completion_tokens":4}"#,
                "3.5, not a non-negative",
            ),
            (
                r#","usage":{"prompt_tokens":"3","completion_tokens":4}"#,
                "\"3\", not a number",
            ),
            (
                r#","usage":{"prompt_tokens":3,"completion_tokens":1e300}"#,
                "not a non-negative integer",
            ),
            (
                r#","usage":{"prompt_tokens":3,"completion_tokens":18446744073709551615}"#,
                "more than any one query",
            ),
        ] {
            let body = format!(r#"{{"choices":[{{"message":{{"content":"hi"}}}}]{usage}}}"#);
            let (_, u) = parse_reply(body.as_bytes()).unwrap();
            let e = u.unwrap_err();
            assert!(e.contains(problem), "{usage}: {e}");
        }
        assert!(parse_reply(b"<html>").unwrap_err().contains("not JSON"));
        assert!(parse_reply(b"{}").unwrap_err().contains("choices"));
        let s = section(None);
        let cost = ModelClient::cost(&s["m"], u).unwrap();
        assert!((cost - 6e-6).abs() < 1e-12);
    }
}
