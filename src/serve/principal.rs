//! Principals: who is calling. Over HTTP each bearer token names one
//! principal (a client or tenant); over stdio, and over HTTP without a token,
//! there is one principal, [`Principal::local`].
//!
//! Sessions belong to the principal that created them, and the per-principal
//! caps (sessions, waiting calls) count per principal.
//!
//! The token file holds either one token (the whole file, trimmed: the
//! principal is named `default`) or one `NAME TOKEN` pair per line; blank
//! lines and lines starting with `#` are skipped. Names are 1 to 64 of
//! `A-Z a-z 0-9 _ . -`; tokens are at least 16 printable ASCII characters
//! without spaces. Names and tokens must be unique.

use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Shortest bearer token accepted: anything shorter is guessable.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest principal name.
const MAX_NAME_CHARS: usize = 64;
/// The name of the principal of a token file that holds one bare token.
pub const BARE_TOKEN_NAME: &str = "default";

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal(Arc<str>);

impl Principal {
    /// The principal of a named token.
    pub fn named(name: &str) -> Principal {
        Principal(Arc::from(name))
    }

    /// The one principal of stdio, and of HTTP without a token.
    pub fn local() -> Principal {
        Principal::named("local")
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// The principal a request came from: the one the HTTP listener put on
    /// the request after checking its token, or (no HTTP request: stdio)
    /// the local one. An HTTP request without a principal is refused, never
    /// given someone's identity.
    pub fn of(ctx: &RequestContext<RoleServer>) -> Result<Principal, rmcp::ErrorData> {
        match ctx.extensions.get::<http::request::Parts>() {
            None => Ok(Principal::local()),
            Some(parts) => parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
                rmcp::ErrorData::internal_error("the request carries no principal", None)
            }),
        }
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One token of the token file.
#[derive(Clone, PartialEq, Eq)]
pub struct NamedToken {
    pub name: String,
    pub token: String,
}

impl std::fmt::Debug for NamedToken {
    // Never print a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedToken")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn valid_name(name: &str) -> bool {
    // "." and ".." would name no directory of its own beneath the
    // workspace (see `crate::files`).
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn check_token(token: &str, where_: &str) -> Result<(), String> {
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(format!(
            "{where_}: the token must be at least {MIN_TOKEN_CHARS} characters"
        ));
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "{where_}: the token must be printable ASCII without spaces"
        ));
    }
    Ok(())
}

/// Parse a token file (see the module docs). Errors name the line, never
/// the token.
pub fn parse_token_file(text: &str) -> Result<Vec<NamedToken>, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // One field on the only line: the one-token file.
    if let [(n, line)] = lines.as_slice() {
        if !line.contains(char::is_whitespace) {
            check_token(line, &format!("line {n}"))?;
            return Ok(vec![NamedToken {
                name: BARE_TOKEN_NAME.into(),
                token: (*line).to_owned(),
            }]);
        }
    }
    if lines.is_empty() {
        return Err("no token in the file".into());
    }
    let mut out: Vec<NamedToken> = Vec::new();
    for (n, line) in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, token] = fields.as_slice() else {
            return Err(format!(
                "line {n}: write NAME TOKEN (two fields), or put a single token alone in the file"
            ));
        };
        if !valid_name(name) {
            return Err(format!(
                "line {n}: {name:?} is not a principal name (1 to {MAX_NAME_CHARS} of A-Z a-z 0-9 _ . -, not . or ..)"
            ));
        }
        check_token(token, &format!("line {n} ({name})"))?;
        if out.iter().any(|t| t.name == *name) {
            return Err(format!("line {n}: the name {name:?} is given twice"));
        }
        if out.iter().any(|t| t.token == *token) {
            return Err(format!(
                "line {n} ({name}): this token is already given to another name"
            ));
        }
        out.push(NamedToken {
            name: (*name).to_owned(),
            token: (*token).to_owned(),
        });
    }
    Ok(out)
}

/// The tokens the HTTP listener accepts, each for its principal. Only
/// digests are kept, and every check compares against all of them in time
/// independent of the input.
#[derive(Clone)]
pub struct Tokens {
    entries: Arc<[([u8; 32], Principal)]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(_, p)| p.name()).collect();
        f.debug_struct("Tokens")
            .field("principals", &names)
            .finish()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Compare in time independent of where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    pub fn new(tokens: &[NamedToken]) -> Tokens {
        Tokens {
            entries: tokens
                .iter()
                .map(|t| (digest(t.token.as_bytes()), Principal::named(&t.name)))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal whose token this is. Digests have one length, and
    /// every entry is compared, so the time taken does not tell how much
    /// of a token was right or which entry matched.
    pub fn principal(&self, given: &str) -> Option<Principal> {
        let d = digest(given.as_bytes());
        let mut found = None;
        for (want, p) in self.entries.iter() {
            if constant_time_eq(&d, want) {
                found = Some(p.clone());
            }
        }
        found
    }
}

/// The window of a principal's budgets when `[principals]` gives none: an
/// hour. Over the server's life, a long-running server (an editor's stdio
/// server, a service) would refuse its one principal for good once the
/// policy's per-session budget was spent; per hour, spending one session's
/// budget and opening another still gains nothing.
pub const DEFAULT_WINDOW_SECONDS: u64 = 3600;

/// One principal's budgets in `[principals]` (the defaults, or a
/// `[principals.NAME]` table): what every session and sessionless call of
/// the principal draws from together. A key left out takes the defaults'
/// value, and where they leave it out too, the `[policy]` budget of the
/// same name: by default a principal may spend, per hour
/// ([`DEFAULT_WINDOW_SECONDS`]), what one session may.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrincipalBudget {
    /// Model queries (`model_query`, each item of `model_query_batched`,
    /// a sub-agent's turns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_calls: Option<u64>,
    /// Sub-agents (`agent_query`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_agent_calls: Option<u64>,
    /// Calls to host and declared tools (upstream tools included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Model tokens, input and output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    /// Model cost, in the unit of the models' prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Connections to upstream MCP servers (`[tools.NAME] kind = "mcp"`,
    /// a process each for stdio) it may hold open at once; by default one
    /// per server, its own (see `shared`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_upstream_connections: Option<u64>,
    /// Budgets count over windows of this many seconds (what was used
    /// before the current window is forgotten); none:
    /// [`DEFAULT_WINDOW_SECONDS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u64>,
}

impl PrincipalBudget {
    /// Each key of `self`, else of `base`.
    fn over(&self, base: &PrincipalBudget) -> PrincipalBudget {
        PrincipalBudget {
            max_model_calls: self.max_model_calls.or(base.max_model_calls),
            max_agent_calls: self.max_agent_calls.or(base.max_agent_calls),
            max_tool_calls: self.max_tool_calls.or(base.max_tool_calls),
            max_total_tokens: self.max_total_tokens.or(base.max_total_tokens),
            max_cost: self.max_cost.or(base.max_cost),
            max_upstream_connections: self
                .max_upstream_connections
                .or(base.max_upstream_connections),
            window_seconds: self.window_seconds.or(base.window_seconds),
        }
    }

    /// The caps of a principal with these budgets, the policy's where
    /// none is given.
    fn caps(&self, policy: &crate::Policy) -> crate::Caps {
        let from = crate::Caps::of_policy(policy);
        crate::Caps {
            model_calls: self.max_model_calls.or(from.model_calls),
            agent_calls: self.max_agent_calls.or(from.agent_calls),
            tool_calls: self.max_tool_calls.or(from.tool_calls),
            total_tokens: self.max_total_tokens.or(from.total_tokens),
            cost: self.max_cost.or(from.cost),
            connections: self.max_upstream_connections,
        }
    }

    /// What is wrong with a value: its key under `at`, and the problem.
    fn problem(&self, at: &str) -> Option<(String, String)> {
        if let Some(c) = self.max_cost {
            if !(c.is_finite() && c >= 0.0) {
                return Some((
                    format!("{at}.max_cost"),
                    format!("{c}: give a number of 0 or more"),
                ));
            }
        }
        if self.window_seconds == Some(0) {
            return Some((
                format!("{at}.window_seconds"),
                format!("give 1 or more seconds (left out: {DEFAULT_WINDOW_SECONDS})"),
            ));
        }
        None
    }
}

/// `[principals]`: default budgets (its keys) and per-principal ones (its
/// `[principals.NAME]` tables).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrincipalsSection {
    pub defaults: PrincipalBudget,
    pub named: std::collections::BTreeMap<String, PrincipalBudget>,
}

impl<'de> Deserialize<'de> for PrincipalsSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let table = toml::Table::deserialize(d)?;
        let mut defaults = toml::Table::new();
        let mut named = std::collections::BTreeMap::new();
        for (k, v) in table {
            match v {
                toml::Value::Table(t) => {
                    if !valid_name(&k) {
                        return Err(D::Error::custom(format!(
                            "principals.{k}: not a principal name (1 to {MAX_NAME_CHARS} of \
                             A-Z a-z 0-9 _ . -)"
                        )));
                    }
                    let b = PrincipalBudget::deserialize(toml::Value::Table(t))
                        .map_err(|e| D::Error::custom(format!("principals.{k}: {e}")))?;
                    named.insert(k, b);
                }
                other => {
                    defaults.insert(k, other);
                }
            }
        }
        let defaults = PrincipalBudget::deserialize(toml::Value::Table(defaults))
            .map_err(|e| D::Error::custom(format!("principals: {e}")))?;
        Ok(PrincipalsSection { defaults, named })
    }
}

impl Serialize for PrincipalsSection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeMap};
        let defaults = toml::Table::try_from(&self.defaults).map_err(S::Error::custom)?;
        let mut m = s.serialize_map(Some(defaults.len() + self.named.len()))?;
        for (k, v) in &defaults {
            m.serialize_entry(k, v)?;
        }
        for (k, v) in &self.named {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl PrincipalsSection {
    /// Check the values, and that each named principal is one of `known`:
    /// the key at fault and what is wrong.
    pub fn problem(&self, known: &[String]) -> Option<(String, String)> {
        if let Some(p) = self.defaults.problem("principals") {
            return Some(p);
        }
        for (name, b) in &self.named {
            if !known.iter().any(|k| k == name) {
                return Some((
                    format!("principals.{name}"),
                    format!(
                        "no such principal; the principals are: {}",
                        known.join(", ")
                    ),
                ));
            }
            if let Some(p) = b.problem(&format!("principals.{name}")) {
                return Some(p);
            }
        }
        None
    }

    /// The budgets of `name`: its own keys, then the defaults'.
    pub fn of(&self, name: &str) -> PrincipalBudget {
        match self.named.get(name) {
            Some(b) => b.over(&self.defaults),
            None => self.defaults.clone(),
        }
    }
}

/// Every principal's budgets: its ledger, made when it first calls, which
/// all its sessions and calls draw from.
#[derive(Debug)]
pub struct Accounts {
    section: PrincipalsSection,
    policy: crate::Policy,
    made: std::sync::Mutex<std::collections::HashMap<Principal, Arc<crate::Ledger>>>,
}

impl Accounts {
    /// The ledgers of principals with `section`'s budgets, `policy`'s
    /// where it gives none.
    pub fn new(section: PrincipalsSection, policy: crate::Policy) -> Accounts {
        Accounts {
            section,
            policy,
            made: Default::default(),
        }
    }

    /// The ledger of `p`, the same one for each of its sessions and calls.
    pub fn ledger(&self, p: &Principal) -> Arc<crate::Ledger> {
        let mut made = crate::util::lock(&self.made);
        made.entry(p.clone())
            .or_insert_with(|| {
                let b = self.section.of(p.name());
                Arc::new(crate::Ledger::new(
                    crate::Owner::Principal(p.name().to_owned()),
                    b.caps(&self.policy),
                    Some(std::time::Duration::from_secs(
                        b.window_seconds.unwrap_or(DEFAULT_WINDOW_SECONDS),
                    )),
                ))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_files_are_one_principal() {
        let t = parse_token_file("  0123456789abcdef0123\n").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "default");
        assert_eq!(t[0].token, "0123456789abcdef0123");
        let t = parse_token_file("# comment\n\n0123456789abcdef0123\n").unwrap();
        assert_eq!(t[0].token, "0123456789abcdef0123");
        let e = parse_token_file("short\n").unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        assert!(parse_token_file("\n# only a comment\n").is_err());
    }

    #[test]
    fn named_tokens_are_parsed_strictly() {
        let t = parse_token_file(
            "# tenants\nalice 0123456789abcdef-alice\n\nbob\t0123456789abcdef-bob\n",
        )
        .unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["alice", "bob"]);
        assert_eq!(t[1].token, "0123456789abcdef-bob");
        // A single named line is one named principal.
        let t = parse_token_file("ci 0123456789abcdef0123\n").unwrap();
        assert_eq!(t[0].name, "ci");
        for (bad, want) in [
            (
                "alice 0123456789abcdef-a\nbob\n",
                "line 2: write NAME TOKEN",
            ),
            ("a b c\n", "line 1: write NAME TOKEN"),
            ("al/ice 0123456789abcdef-a\n", "not a principal name"),
            (
                "alice short\n",
                "line 1 (alice): the token must be at least 16",
            ),
            (
                "alice 0123456789abcdef-a\nalice 0123456789abcdef-b\n",
                "given twice",
            ),
            (
                "alice 0123456789abcdef-a\nbob 0123456789abcdef-a\n",
                "already given",
            ),
            ("alice 0123456789abcdef-\u{e9}\n", "printable ASCII"),
        ] {
            let e = parse_token_file(bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
            assert!(!e.contains("0123456789abcdef"), "a token leaked: {e}");
        }
    }

    #[test]
    fn tokens_name_their_principal() {
        let t =
            Tokens::new(&parse_token_file("a 0123456789abcdef-a\nb 0123456789abcdef-b\n").unwrap());
        assert_eq!(
            t.principal("0123456789abcdef-a"),
            Some(Principal::named("a"))
        );
        assert_eq!(
            t.principal("0123456789abcdef-b"),
            Some(Principal::named("b"))
        );
        assert_eq!(t.principal("0123456789abcdef-"), None);
        assert_eq!(t.principal(""), None);
        assert!(!format!("{t:?}").contains("0123"));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
