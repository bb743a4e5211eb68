//! `[models.NAME]` tables: one OpenAI-compatible endpoint each, parsed
//! strictly (unknown keys are errors), validated with errors that name the
//! key.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One model endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Base URL of an OpenAI-compatible API; requests go to
    /// `<endpoint>/chat/completions`.
    pub endpoint: String,
    /// The `model` field sent with each request.
    pub model: String,
    /// The name of the environment variable holding the API key (read by
    /// the supervisor, sent as `Authorization: Bearer`); none for servers
    /// that need no key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds one attempt may take.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Attempts per query; 429 and 5xx answers are retried.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Wait before a retry (doubled each time) unless the server sends
    /// `Retry-After`.
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    /// `max_tokens` sent when a query gives none (a query may only lower it).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Price per million input tokens, for `max_cost`.
    #[serde(default)]
    pub input_price: Option<f64>,
    /// Price per million output tokens, for `max_cost`.
    #[serde(default)]
    pub output_price: Option<f64>,
    /// The model a query without `model` uses (exactly one when there are
    /// several; a single model is the default).
    #[serde(default)]
    pub default: bool,
}

fn default_timeout() -> u64 {
    60
}
fn default_attempts() -> u32 {
    3
}
fn default_backoff() -> u64 {
    500
}

/// The `[models]` section: models by name.
pub type ModelsSection = BTreeMap<String, ModelConfig>;

/// A `[models]` section that cannot be used; `key` is the full key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ModelsConfigError {
    pub key: String,
    pub problem: String,
}

fn bad(key: String, problem: impl Into<String>) -> ModelsConfigError {
    ModelsConfigError {
        key,
        problem: problem.into(),
    }
}

/// Check every model and pick the default: `Ok(None)` when there are none.
pub fn validate(models: &ModelsSection) -> Result<Option<String>, ModelsConfigError> {
    for (name, m) in models {
        let key = |k: &str| format!("models.{name}.{k}");
        if !crate::util::valid_var_name(name) {
            return Err(bad(
                format!("models.{name}"),
                "a model name uses letters, digits and '_', not starting with a digit",
            ));
        }
        if !(m.endpoint.starts_with("http://") || m.endpoint.starts_with("https://")) {
            return Err(bad(key("endpoint"), "give an http:// or https:// URL"));
        }
        if reqwest::Url::parse(&m.endpoint).is_err() {
            return Err(bad(key("endpoint"), "not a valid URL"));
        }
        if m.model.is_empty() {
            return Err(bad(key("model"), "must not be empty"));
        }
        if let Some(env) = &m.api_key_env {
            if env.is_empty() || env.contains('=') || env.contains('\0') {
                return Err(bad(key("api_key_env"), "give an environment variable name"));
            }
        }
        if m.timeout_seconds == 0 || m.timeout_seconds > 3600 {
            return Err(bad(key("timeout_seconds"), "give 1 to 3600"));
        }
        if m.max_attempts == 0 || m.max_attempts > 20 {
            return Err(bad(key("max_attempts"), "give 1 to 20"));
        }
        if m.backoff_ms > 600_000 {
            return Err(bad(key("backoff_ms"), "give at most 600000"));
        }
        if m.max_tokens == Some(0) {
            return Err(bad(key("max_tokens"), "must be above 0"));
        }
        for (k, p) in [
            ("input_price", m.input_price),
            ("output_price", m.output_price),
        ] {
            if let Some(p) = p {
                if !(p.is_finite() && p >= 0.0) {
                    return Err(bad(key(k), "give a price of 0 or more"));
                }
            }
        }
    }
    let defaults: Vec<&String> = models
        .iter()
        .filter(|(_, m)| m.default)
        .map(|(n, _)| n)
        .collect();
    match (defaults.as_slice(), models.len()) {
        (_, 0) => Ok(None),
        ([one], _) => Ok(Some((*one).clone())),
        ([], 1) => Ok(models.keys().next().cloned()),
        ([], _) => Err(bad(
            "models".into(),
            "several models and none has `default = true`",
        )),
        (many, _) => Err(bad(
            "models".into(),
            format!(
                "only one model may be the default; {} are",
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        models: ModelsSection,
    }

    fn parse(text: &str) -> Result<ModelsSection, String> {
        toml::from_str::<Doc>(text)
            .map(|d| d.models)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_and_picks_the_default() {
        let m = parse(
            "[models.a]\nendpoint = \"http://127.0.0.1:1/v1\"\nmodel = \"x\"\n\
             [models.b]\nendpoint = \"https://api.example/v1\"\nmodel = \"y\"\ndefault = true\n\
             api_key_env = \"KEY\"\ninput_price = 1.5\n",
        )
        .unwrap();
        assert_eq!(m["a"].max_attempts, 3);
        assert_eq!(validate(&m).unwrap().as_deref(), Some("b"));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = parse("[models.a]\nendpoint = \"http://x\"\nmodel = \"x\"\napi_key = \"s\"\n")
            .unwrap_err();
        assert!(e.contains("api_key"), "{e}");
        let m = parse("[models.a]\nendpoint = \"ftp://x\"\nmodel = \"x\"\n").unwrap();
        assert_eq!(validate(&m).unwrap_err().key, "models.a.endpoint");
        let m = parse("[models.a]\nendpoint = \"http://x\"\nmodel = \"x\"\nmax_attempts = 0\n")
            .unwrap();
        assert_eq!(validate(&m).unwrap_err().key, "models.a.max_attempts");
        let m = parse(
            "[models.a]\nendpoint = \"http://x\"\nmodel = \"x\"\n\
             [models.b]\nendpoint = \"http://x\"\nmodel = \"x\"\n",
        )
        .unwrap();
        assert_eq!(validate(&m).unwrap_err().key, "models");
        assert_eq!(validate(&ModelsSection::new()).unwrap(), None);
    }
}
