//! `cellbox tools`: the definitions of the tools a configuration offers,
//! in the format of a model API (OpenAI's function tools, Anthropic's
//! tools) or as MCP's `tools/list` says them.
//!
//! The list is the one `serve` answers `tools/list` with, made by the same
//! code from the same registry of capabilities that checks each call (see
//! docs/architecture.md §13): a tool the policy does not allow is not in
//! it, and its input schema is the one a call is checked against. Only the
//! envelope differs between the formats.

use super::config::{self, ServeArgs};
use super::{build_supervisor, CellboxServer};
use crate::cli::{EXIT_INTERNAL, EXIT_USAGE};
use rmcp::model::Tool;
use serde_json::{json, Map, Value};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// The formats `cellbox tools --format` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolFormat {
    /// `{"tools": [...]}`, the result of MCP's `tools/list`.
    Mcp,
    /// A list of `{"type": "function", "function": {name, description,
    /// parameters}}`, the `tools` of OpenAI's chat completions (and of
    /// every OpenAI-compatible server).
    Openai,
    /// A list of `{name, description, input_schema}`, the `tools` of
    /// Anthropic's messages API.
    Anthropic,
}

/// `cellbox tools`: the options of `serve` (the tools depend on them) and
/// the format.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolsArgs {
    /// mcp (as tools/list), openai (function tools) or anthropic.
    #[arg(long, value_enum, default_value = "mcp")]
    pub format: ToolFormat,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Why a tool cannot be given to a model API as it is.
#[derive(Debug, thiserror::Error)]
pub enum ToolDefError {
    #[error(
        "tool {name:?} cannot be given to the {api} API: its names are 1 to 64 of \
         A-Z a-z 0-9 _ -"
    )]
    Name { name: String, api: &'static str },
}

/// Longest tool name OpenAI's and Anthropic's APIs take.
const MAX_API_NAME: usize = 64;

fn api_name(name: &str, api: &'static str) -> Result<String, ToolDefError> {
    let fits = !name.is_empty()
        && name.len() <= MAX_API_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if fits {
        Ok(name.to_owned())
    } else {
        Err(ToolDefError::Name {
            name: name.to_owned(),
            api,
        })
    }
}

/// A tool's input schema as a model API takes it: MCP's schema minus the
/// dialect it may declare (the APIs read the keywords, not the dialect).
fn parameters(tool: &Tool) -> Value {
    let mut schema: Map<String, Value> = tool.input_schema.as_ref().clone();
    schema.remove("$schema");
    Value::Object(schema)
}

fn description(tool: &Tool) -> String {
    tool.description.as_deref().unwrap_or_default().to_owned()
}

/// `tools` in `format`.
pub fn render(tools: &[Tool], format: ToolFormat) -> Result<Value, ToolDefError> {
    match format {
        ToolFormat::Mcp => Ok(json!({ "tools": tools })),
        ToolFormat::Openai => tools
            .iter()
            .map(|t| {
                Ok(json!({
                    "type": "function",
                    "function": {
                        "name": api_name(&t.name, "OpenAI")?,
                        "description": description(t),
                        "parameters": parameters(t),
                    },
                }))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        ToolFormat::Anthropic => tools
            .iter()
            .map(|t| {
                Ok(json!({
                    "name": api_name(&t.name, "Anthropic")?,
                    "description": description(t),
                    "input_schema": parameters(t),
                }))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
    }
}

/// The tools `serve` would list with these options: its supervisor is
/// built and its warm workers probed, as at a server's start (the
/// descriptions say what the sandbox gave), then let go.
pub async fn listed(args: &ServeArgs) -> Result<Vec<Tool>, String> {
    let settings = config::resolve(args).map_err(|e| e.to_string())?;
    let sup = build_supervisor(&settings).map_err(|e| e.to_string())?;
    let shutdown = CancellationToken::new();
    let server = CellboxServer::new(sup, settings, shutdown.clone());
    let tools = server.list().await.to_vec();
    shutdown.cancel();
    server.sessions().close_all();
    let gate = server.gate().clone();
    drop(server);
    super::drain(&gate).await;
    Ok(tools)
}

/// `cellbox tools`.
pub async fn cli_main(args: ToolsArgs) -> ExitCode {
    let tools = match listed(&args.serve).await {
        Ok(t) => t,
        Err(e) => {
            crate::report!("cellbox tools: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let out = match render(&tools, args.format) {
        Ok(v) => v,
        Err(e) => {
            crate::report!("cellbox tools: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match serde_json::to_string_pretty(&out) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::report!("cellbox tools: failed to encode the definitions: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tool(name: &str) -> Tool {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        });
        Tool::new(
            name.to_owned(),
            "Read a file.",
            Arc::new(schema.as_object().cloned().unwrap_or_default()),
        )
    }

    #[test]
    fn each_format_has_its_apis_envelope() {
        let tools = [tool("read_file")];
        let openai = render(&tools, ToolFormat::Openai).unwrap();
        assert_eq!(openai[0]["type"], "function");
        assert_eq!(openai[0]["function"]["name"], "read_file");
        assert_eq!(openai[0]["function"]["description"], "Read a file.");
        assert_eq!(openai[0]["function"]["parameters"]["required"][0], "path");
        assert!(openai[0]["function"]["parameters"].get("$schema").is_none());
        let anthropic = render(&tools, ToolFormat::Anthropic).unwrap();
        assert_eq!(anthropic[0]["name"], "read_file");
        assert_eq!(anthropic[0]["input_schema"]["type"], "object");
        assert!(anthropic[0]["input_schema"].get("$schema").is_none());
        let mcp = render(&tools, ToolFormat::Mcp).unwrap();
        assert_eq!(mcp["tools"][0]["name"], "read_file");
        assert_eq!(mcp["tools"][0]["inputSchema"]["type"], "object");
    }

    #[test]
    fn a_name_the_apis_refuse_is_an_error_naming_it() {
        for bad in ["github.search", "", &"x".repeat(65), "naïve"] {
            let e = render(&[tool(bad)], ToolFormat::Openai).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
            assert!(render(&[tool(bad)], ToolFormat::Anthropic).is_err());
            // MCP takes any name the server lists.
            assert!(render(&[tool(bad)], ToolFormat::Mcp).is_ok());
        }
        assert!(render(&[tool(&"x".repeat(64))], ToolFormat::Openai).is_ok());
    }
}
