//! `[tools.NAME]`: tools an operator declares for cells. Each has a
//! description and a JSON schema for its arguments (checked by the
//! supervisor before the call), and a kind:
//!
//! - `kind = "command"`: `argv`, a template run under the shell profile's
//!   sandbox without a shell. An element `{NAME}` (whole or inside an
//!   element) is replaced by argument NAME (a string as is, anything else
//!   as JSON); `{args}` by all arguments as one JSON object. A value that
//!   would begin an element with '-' (and so be read as an option) is
//!   refused, unless the argument is named in `allow_options` (`["*"]`:
//!   every argument) or the element comes after a literal `"--"` in
//!   `argv` (for programs that end their options there). The program
//!   starts with the sandbox's fixed environment plus `env` and
//!   `pass_env`, as a stdio server's below (neither may name a variable
//!   the sandbox sets: [`super::env::SANDBOX_VARS`]).
//! - `kind = "http"`: a JSON POST of the arguments to `url`, made by the
//!   supervisor (cells have no network). A header value may come from an
//!   environment variable of the supervisor (`{ env = "VAR" }`), which never
//!   reaches a cell.
//! - `kind = "mcp"`: an upstream MCP server, `command = ["prog", ...]`
//!   (stdio) or `url = "http://..."` (streamable HTTP, with an optional
//!   bearer token from the environment variable `token_env`). Its tools
//!   become capabilities `NAME.TOOL` with their own schemas (see
//!   [`super::upstream`]). A stdio server starts with an empty environment
//!   plus `env` (`NAME = "literal"` or `NAME = { env = "VAR" }`, a secret
//!   of the supervisor's) and the supervisor's variables named in
//!   `pass_env`. Each principal gets a connection of its own (a process for
//!   stdio, an MCP session for HTTP); `shared = true` gives a server that
//!   keeps no state one connection for all.
//!
//! Every value read from the supervisor's environment (`{ env = ... }` of
//! any kind, `token_env`) is a secret: it is registered with the redaction
//! ([`crate::secrets`]) when the tool is declared.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default wall-clock limit of one tool call.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 30_000;
/// Default bytes of a tool's output (each stream, or the HTTP body) kept.
pub const DEFAULT_TOOL_OUTPUT_BYTES: usize = 256 * 1024;

/// All `[tools.NAME]` tables.
pub type ToolsConfig = BTreeMap<String, ToolDecl>;

fn default_schema() -> toml::Table {
    let mut t = toml::Table::new();
    t.insert("type".into(), toml::Value::String("object".into()));
    t
}
fn default_timeout() -> u64 {
    DEFAULT_TOOL_TIMEOUT_MS
}
fn default_output() -> usize {
    DEFAULT_TOOL_OUTPUT_BYTES
}

/// One declared tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ToolDecl {
    Command {
        description: String,
        /// JSON schema of the arguments (a TOML table; `{type = "object"}`
        /// when absent).
        #[serde(default = "default_schema")]
        schema: toml::Table,
        argv: Vec<String>,
        /// Arguments whose values may begin with '-' (`"*"`: all).
        #[serde(default)]
        allow_options: Vec<String>,
        /// The program's variables besides the sandbox's fixed ones (see
        /// [`super::env`]): literals and secrets of the supervisor's.
        #[serde(default)]
        env: BTreeMap<String, EnvValue>,
        /// Variables of the supervisor's environment passed on by name:
        /// not secrets, so not redacted.
        #[serde(default)]
        pass_env: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_ms: u64,
        #[serde(default = "default_output")]
        max_output_bytes: usize,
    },
    Http {
        description: String,
        #[serde(default = "default_schema")]
        schema: toml::Table,
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, HeaderValue>,
        /// PEM file of extra root certificates trusted for `url`.
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
        #[serde(default = "default_timeout")]
        timeout_ms: u64,
        #[serde(default = "default_output")]
        max_output_bytes: usize,
    },
    /// An upstream MCP server: its tools become `NAME.TOOL`.
    Mcp {
        #[serde(default)]
        description: String,
        /// Program and arguments of a server spoken to over stdio.
        #[serde(default)]
        command: Vec<String>,
        /// URL of a server spoken to over streamable HTTP.
        #[serde(default)]
        url: Option<String>,
        /// The environment variable of the supervisor holding a bearer
        /// token for `url` (it never reaches a cell).
        #[serde(default)]
        token_env: Option<String>,
        /// PEM file of extra root certificates trusted for `url`.
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
        /// (stdio) The server's environment, besides `pass_env`: nothing
        /// of the supervisor's environment reaches it otherwise.
        #[serde(default)]
        env: BTreeMap<String, EnvValue>,
        /// (stdio) Variables of the supervisor's environment passed on by
        /// name (PATH, HOME, ...): not secrets, so not redacted.
        #[serde(default)]
        pass_env: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_ms: u64,
        #[serde(default = "default_output")]
        max_output_bytes: usize,
        /// One connection for every principal (for a server that keeps no
        /// state between calls); by default each principal has its own.
        #[serde(default)]
        shared: bool,
    },
}

/// A value of a helper's environment: literal, or a secret read from the
/// supervisor's environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    Literal(String),
    FromEnv(FromEnv),
}

/// `{ env = "VAR" }`: the value of the supervisor's variable VAR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FromEnv {
    pub env: String,
}

/// A header's value: literal, or read from the supervisor's environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    Literal(String),
    Env {
        /// The environment variable holding the value.
        env: String,
        /// Put before the value (e.g. "Bearer ").
        #[serde(default)]
        prefix: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct F {
        tools: ToolsConfig,
    }

    #[test]
    fn parses_strictly() {
        let f: F = toml::from_str(
            r#"
[tools.grep]
kind = "command"
description = "grep"
argv = ["grep", "-c", "{pattern}", "/etc/hostname"]
schema = { type = "object", properties = { pattern = { type = "string" } }, required = ["pattern"] }
[tools.weather]
kind = "http"
description = "weather"
url = "http://127.0.0.1:9/w"
headers = { Authorization = { env = "W_TOKEN", prefix = "Bearer " }, X-A = "b" }
"#,
        )
        .unwrap();
        assert!(matches!(
            f.tools["grep"],
            ToolDecl::Command {
                timeout_ms: 30_000,
                ..
            }
        ));
        let ToolDecl::Http { headers, .. } = &f.tools["weather"] else {
            panic!()
        };
        assert_eq!(
            headers["Authorization"],
            HeaderValue::Env {
                env: "W_TOKEN".into(),
                prefix: "Bearer ".into()
            }
        );
        let e = toml::from_str::<F>(
            "[tools.x]\nkind = \"command\"\ndescription = \"\"\nargv = []\nshell = true\n",
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("shell"), "{e}");
        assert!(toml::from_str::<F>("[tools.x]\nkind = \"ftp\"\ndescription = \"\"\n").is_err());
        let f: F = toml::from_str(
            "[tools.gh]\nkind = \"mcp\"\nurl = \"https://h/mcp\"\ntoken_env = \"GH\"\n",
        )
        .unwrap();
        assert!(matches!(
            &f.tools["gh"],
            ToolDecl::Mcp {
                url: Some(_),
                token_env: Some(_),
                timeout_ms: 30_000,
                ..
            }
        ));
        let e = toml::from_str::<F>("[tools.gh]\nkind = \"mcp\"\ncommand = [\"x\"]\nargv = []\n")
            .err()
            .unwrap();
        assert!(e.to_string().contains("argv"), "{e}");
        let f: F = toml::from_str(
            "[tools.gh]\nkind = \"mcp\"\ncommand = [\"x\"]\n\
             env = { GH = { env = \"GH_TOKEN\" }, LOG = \"info\" }\npass_env = [\"PATH\"]\n",
        )
        .unwrap();
        let ToolDecl::Mcp { env, pass_env, .. } = &f.tools["gh"] else {
            panic!()
        };
        assert_eq!(
            env["GH"],
            EnvValue::FromEnv(FromEnv {
                env: "GH_TOKEN".into()
            })
        );
        assert_eq!(env["LOG"], EnvValue::Literal("info".into()));
        assert_eq!(pass_env, &["PATH"]);
        for bad in [
            "env = { GH = { env = \"X\", prefix = \"y\" } }",
            "env = { GH = 3 }",
            "pass_env = \"PATH\"",
        ] {
            let text = format!("[tools.gh]\nkind = \"mcp\"\ncommand = [\"x\"]\n{bad}\n");
            assert!(toml::from_str::<F>(&text).is_err(), "{bad}");
        }
    }
}
