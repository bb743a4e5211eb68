//! A reply for every request that has an id.
//!
//! rmcp reads each message into its typed form; a message that is JSON but
//! not of that form (say `tools/list` with `"params": 7`) is answered over
//! stdio with an error whose id is null and over HTTP with a bare `415`, so
//! a client waiting on the request's id waits forever. A known method with
//! params of the wrong shape (`tools/call` without a `name`) reaches the
//! handler as a custom request and was answered "method not found".
//!
//! Here: [`check`] looks at each message before rmcp does. When it is JSON
//! with an id but does not read as an MCP message, stdio hands rmcp a
//! stand-in request for [`INVALID_METHOD`] with the same id (answered by the
//! handler through [`error_for`]), and HTTP answers the POST itself with a
//! JSON-RPC error for that id ([`error_reply`]). Known methods with params
//! of the wrong shape get `invalid params` naming what was wrong.

use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ErrorCode, InitializeRequestParams,
    PaginatedRequestParams,
};
use rmcp::ErrorData;
use serde_json::{json, Value};

/// The method of the stand-in request for a message that did not parse.
pub const INVALID_METHOD: &str = "cellbox/invalid_message";

/// MCP methods a client may call (whose params rmcp reads into a type).
const CLIENT_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
];

/// Whether `method` is one of MCP's client requests.
pub fn is_client_method(method: &str) -> bool {
    CLIENT_METHODS.contains(&method)
}

/// What is wrong with `params` for `method`, when we can say (the methods
/// whose params we know the type of).
pub fn params_problem(method: &str, params: Option<&Value>) -> Option<String> {
    let p = params.cloned().unwrap_or(Value::Null);
    let typed = match method {
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(p).err(),
        "initialize" => serde_json::from_value::<InitializeRequestParams>(p).err(),
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            serde_json::from_value::<Option<PaginatedRequestParams>>(p).err()
        }
        _ => None,
    };
    typed.map(|e| e.to_string())
}

/// The error for a request of `method` (if it named one) that could not be
/// read: `invalid params` when its params were found wrong, `invalid
/// request` otherwise.
pub fn error_for(method: Option<&str>, params_wrong: bool, problem: &str) -> ErrorData {
    match method {
        Some(m) if params_wrong => ErrorData::new(
            ErrorCode::INVALID_PARAMS,
            format!("{m}: invalid params: {problem}"),
            None,
        ),
        Some(m) => ErrorData::invalid_request(
            format!("{m}: not a valid JSON-RPC request: {problem}"),
            None,
        ),
        None => {
            ErrorData::invalid_request(format!("not a valid JSON-RPC request: {problem}"), None)
        }
    }
}

/// A message rmcp cannot read that still has an id to answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    pub id: Value,
    pub method: Option<String>,
    /// The params were found wrong for the method (else the envelope).
    pub params_wrong: bool,
    pub problem: String,
}

/// Whether `bytes` (one message) needs answering here: a JSON request (a
/// `method` and a number or string `id`) that does not read as an MCP
/// client message. A message that reads, is not JSON, or is not a request
/// gives `None` (rmcp handles it, or there is no one to answer).
pub fn check(bytes: &[u8]) -> Option<Unreadable> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let err = serde_json::from_slice::<ClientJsonRpcMessage>(bytes).err()?;
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let id = value.get("id").filter(|v| v.is_number() || v.is_string())?;
    // Only requests are answered: a reply to a message without a method
    // (a malformed response) could start an error storm with the peer.
    let method = value.get("method").and_then(Value::as_str)?.to_owned();
    let from_params = params_problem(&method, value.get("params"));
    Some(Unreadable {
        id: id.clone(),
        method: Some(method),
        params_wrong: from_params.is_some(),
        problem: from_params.unwrap_or_else(|| err.to_string()),
    })
}

impl Unreadable {
    /// The stand-in request rmcp reads in its place (stdio), one line.
    pub fn stand_in(&self) -> Vec<u8> {
        let mut text = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "method": INVALID_METHOD,
            "params": {
                "method": self.method,
                "params_wrong": self.params_wrong,
                "problem": self.problem,
            },
        })
        .to_string()
        .into_bytes();
        text.push(b'\n');
        text
    }

    /// The JSON-RPC error response for it (HTTP).
    pub fn error_reply(&self) -> Value {
        let e = error_for(self.method.as_deref(), self.params_wrong, &self.problem);
        json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": e.code.0, "message": e.message},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_requests_with_ids_are_found() {
        for (text, id, code, needle) in [
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":7}"#,
                json!(5),
                -32602,
                "tools/list: invalid params",
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"foo/bar","params":7}"#,
                json!("a"),
                -32600,
                "foo/bar",
            ),
            (
                r#"{"jsonrpc":"2.0","id":9,"method":"prompts/list","params":"x"}"#,
                json!(9),
                -32602,
                "prompts/list: invalid params",
            ),
            (
                r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#,
                json!(3),
                -32600,
                "ping: not a valid",
            ),
        ] {
            let u = check(text.as_bytes()).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(u.id, id);
            let r = u.error_reply();
            assert_eq!(r["id"], id);
            assert_eq!(r["error"]["code"], code, "{r}");
            let msg = r["error"]["message"].as_str().unwrap();
            assert!(msg.contains(needle), "{text}: {msg}");
            let s: Value = serde_json::from_slice(&u.stand_in()).unwrap();
            assert_eq!(s["id"], id);
            assert_eq!(s["method"], INVALID_METHOD);
            // The stand-in itself reads as an MCP message.
            assert!(check(&u.stand_in()).is_none());
        }
        // Readable, not JSON, or no id: nothing to do here.
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/list","params":7}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list","params":7}"#,
            r#"{"jsonrpc":"2.0","id":4,"result":7,"error":1}"#,
            "{not json",
            "",
        ] {
            assert_eq!(check(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn tools_call_problems_are_named() {
        let p = params_problem("tools/call", Some(&json!({"name": 5}))).unwrap();
        assert!(p.contains("invalid type"), "{p}");
        let p = params_problem("tools/call", Some(&json!({"arguments": {}}))).unwrap();
        assert!(p.contains("name"), "{p}");
        assert_eq!(
            params_problem("tools/call", Some(&json!({"name": "x"}))),
            None
        );
        let e = error_for(Some("tools/call"), true, &p);
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    }
}
