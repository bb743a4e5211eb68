//! Deny-by-default capability policy and the call budget of a run tree.

use super::ledger::{Chain, Ledger, Owner};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Which capabilities a session may call, and how often. Nothing is allowed
/// unless named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Capability names the script may call.
    pub allow: BTreeSet<String>,
    /// Capability calls per run tree (a cell and all its sub-cells).
    pub max_calls: u32,
    /// Per-capability call caps within the run tree.
    pub max_calls_per_capability: BTreeMap<String, u32>,
    /// Deepest `run_cell` nesting; the top cell is depth 0.
    pub max_depth: u32,
    /// Model queries (`model_query`, each item of `model_query_batched`)
    /// per session, its sub-cells included.
    pub max_model_calls: u32,
    /// Sub-agents (`agent_query`) per session, counted apart from model
    /// queries.
    pub max_agent_calls: u32,
    /// Calls to host capabilities (registered by the embedding program)
    /// per session.
    pub max_tool_calls: u32,
    /// Model tokens (input plus output) per session.
    pub max_total_tokens: u64,
    /// Model cost per session, in the unit of the models' prices (only
    /// models with prices are charged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Model queries of one `model_query_batched` in flight at once.
    pub max_concurrency: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allow: BTreeSet::new(),
            max_calls: 1000,
            max_calls_per_capability: BTreeMap::new(),
            max_depth: 3,
            max_model_calls: 100,
            max_agent_calls: 10,
            max_tool_calls: 1000,
            max_total_tokens: 1_000_000,
            max_cost: None,
            max_concurrency: 4,
        }
    }
}

impl Policy {
    /// A policy that allows nothing.
    pub fn deny_all() -> Self {
        Policy::default()
    }

    /// Allow one more capability by name.
    pub fn allow(mut self, name: impl Into<String>) -> Self {
        self.allow.insert(name.into());
        self
    }

    /// Allowed by name, or by a `SERVER.*` entry for a tool named
    /// `SERVER.TOOL`.
    pub fn permits(&self, name: &str) -> bool {
        // `SERVER.*` covers every tool of SERVER, `x.y` as well as `x`.
        self.allow.contains(name)
            || name
                .split_once('.')
                .is_some_and(|(server, _)| self.allow.contains(&format!("{server}.*")))
    }

    /// The intersection of two policies: the most restrictive choice wins on
    /// every axis, so a sub-cell can never widen its parent.
    pub fn narrow(&self, other: &Policy) -> Policy {
        let mut per = self.max_calls_per_capability.clone();
        for (k, v) in &other.max_calls_per_capability {
            let e = per.entry(k.clone()).or_insert(*v);
            *e = (*e).min(*v);
        }
        Policy {
            allow: self.allow.intersection(&other.allow).cloned().collect(),
            max_calls: self.max_calls.min(other.max_calls),
            max_calls_per_capability: per,
            max_depth: self.max_depth.min(other.max_depth),
            max_model_calls: self.max_model_calls.min(other.max_model_calls),
            max_agent_calls: self.max_agent_calls.min(other.max_agent_calls),
            max_tool_calls: self.max_tool_calls.min(other.max_tool_calls),
            max_total_tokens: self.max_total_tokens.min(other.max_total_tokens),
            max_cost: match (self.max_cost, other.max_cost) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            max_concurrency: self.max_concurrency.min(other.max_concurrency),
        }
    }
}

/// Calls used so far in one run tree; shared by a cell and its sub-cells.
#[derive(Debug)]
pub struct Budget {
    /// Calls made, and calls to each capability with a cap of its own (no
    /// other name is kept: a cell chooses the names it calls).
    used: Mutex<(u32, BTreeMap<String, u32>)>,
    emitted: EmitTally,
    /// Model queries, sub-agents, tool calls, tokens and cost of the run
    /// tree (counted only: the session's ledger holds the caps).
    pub(crate) models: Arc<Ledger>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            used: Mutex::default(),
            emitted: EmitTally::default(),
            models: Arc::new(Ledger::counting(Owner::Run)),
        }
    }
}

/// Model and tool use counted against a policy's budgets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelUsage {
    pub model_calls: u32,
    pub agent_calls: u32,
    pub tool_calls: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// In the unit of the models' prices; 0 when no model has prices.
    pub cost: f64,
}

impl ModelUsage {
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    pub fn is_empty(&self) -> bool {
        self.model_calls == 0 && self.agent_calls == 0 && self.tool_calls == 0
    }
}

/// What a cell's model and tool calls used: the cell's run tree, and its
/// session up to and including this cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelUsageReport {
    pub cell: ModelUsage,
    pub session: ModelUsage,
}

/// A kind of call with a budget of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metered {
    Model,
    Agent,
    Tool,
}

/// The ledgers a cell's calls are charged to: those of its session's
/// account (a principal's, a sub-agent's parent's), its session's and its
/// run tree's, all at once (see [`super::ledger`]).
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub chain: Chain,
    tree: Arc<Ledger>,
    session: Arc<Ledger>,
}

impl Meter {
    pub(crate) fn new(account: &Chain, session: &Arc<Ledger>, tree: &Arc<Ledger>) -> Meter {
        Meter {
            chain: account.then([session.clone(), tree.clone()]),
            tree: tree.clone(),
            session: session.clone(),
        }
    }

    /// Count `n` calls of `kind`, unless a budget refuses them.
    pub(crate) fn charge(&self, kind: Metered, n: u32) -> Result<(), BudgetError> {
        self.chain.charge(kind, n)
    }

    pub(crate) fn report(&self) -> ModelUsageReport {
        ModelUsageReport {
            cell: self.tree.used(),
            session: self.session.used(),
        }
    }
}

/// `emit` events one run tree (a cell and its sub-cells) may record.
pub const MAX_EMITS_PER_CELL: u64 = 1000;
/// Bytes of `emit` events (as JSON) one run tree may record.
pub const MAX_EMIT_BYTES_PER_CELL: u64 = 1 << 20;
/// `emit` events one session may record over its life.
pub const MAX_EMITS_PER_SESSION: u64 = 10_000;
/// Bytes of `emit` events one session may record over its life.
pub const MAX_EMIT_BYTES_PER_SESSION: u64 = 16 << 20;

/// An `emit` event that would pass its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EmitRefused {
    #[error("emit refused: {max} events per {per} were recorded already")]
    Count { max: u64, per: &'static str },
    #[error(
        "emit refused: the event is {bytes} bytes, and {used} of the {max} bytes \
         per {per} were recorded already"
    )]
    Bytes {
        bytes: u64,
        used: u64,
        max: u64,
        per: &'static str,
    },
}

/// `emit` events (count, bytes) recorded so far against a bound.
#[derive(Debug, Default)]
pub(crate) struct EmitTally(Mutex<(u64, u64)>);

impl EmitTally {
    /// Count one event of `bytes`, unless it would pass the bound.
    pub(crate) fn charge(
        &self,
        bytes: u64,
        max_count: u64,
        max_bytes: u64,
        per: &'static str,
    ) -> Result<(), EmitRefused> {
        let mut t = crate::util::lock(&self.0);
        if t.0 >= max_count {
            return Err(EmitRefused::Count {
                max: max_count,
                per,
            });
        }
        if t.1.saturating_add(bytes) > max_bytes {
            return Err(EmitRefused::Bytes {
                bytes,
                used: t.1,
                max: max_bytes,
                per,
            });
        }
        t.0 += 1;
        t.1 += bytes;
        Ok(())
    }
}

/// Perform `emit`: its `event` argument, charged to the cell's run tree
/// (`budget`) and to the session (`session`), recorded in `events`. The
/// refusal is the call's `limit` error message.
pub(crate) fn emit(
    args: &serde_json::Map<String, serde_json::Value>,
    budget: &Budget,
    session: &EmitTally,
    events: &super::events::EventSink,
    run: &super::result::RunInfo,
) -> Result<(), EmitRefused> {
    let event = args
        .get("event")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    // Bounded per cell and per session, in count and bytes.
    let bytes = serde_json::to_vec(&event).map_or(0, |v| v.len() as u64);
    budget.charge_emit(bytes)?;
    session.charge(
        bytes,
        MAX_EMITS_PER_SESSION,
        MAX_EMIT_BYTES_PER_SESSION,
        "session",
    )?;
    events.record("emit", run, serde_json::json!({ "data": event }));
    Ok(())
}

/// Why a call could not be charged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("call budget exhausted: {max} capability calls per run")]
    Total { max: u32 },
    #[error("call budget for {cap:?} exhausted: {max} calls per run")]
    PerCapability { cap: String, max: u32 },
    #[error("budget {budget} exhausted: {detail}")]
    Exhausted {
        budget: &'static str,
        detail: String,
    },
}

impl Budget {
    /// Charge one call to `cap` under `policy`.
    pub fn charge(&self, policy: &Policy, cap: &str) -> Result<u32, BudgetError> {
        let mut used = crate::util::lock(&self.used);
        if used.0 >= policy.max_calls {
            return Err(BudgetError::Total {
                max: policy.max_calls,
            });
        }
        if let Some(max) = policy.max_calls_per_capability.get(cap) {
            if used.1.get(cap).copied().unwrap_or(0) >= *max {
                return Err(BudgetError::PerCapability {
                    cap: cap.to_owned(),
                    max: *max,
                });
            }
            *used.1.entry(cap.to_owned()).or_insert(0) += 1;
        }
        used.0 += 1;
        Ok(used.0)
    }

    /// Count one `emit` event of `bytes` against the run tree's bound.
    pub(crate) fn charge_emit(&self, bytes: u64) -> Result<(), EmitRefused> {
        self.emitted
            .charge(bytes, MAX_EMITS_PER_CELL, MAX_EMIT_BYTES_PER_CELL, "cell")
    }

    pub fn used(&self) -> u32 {
        crate::util::lock(&self.used).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_never_widens() {
        let parent = Policy::deny_all().allow("emit").allow("answer");
        let mut child = Policy::deny_all().allow("emit").allow("run_cell");
        child.max_calls = 5000;
        child.max_depth = 10;
        let n = parent.narrow(&child);
        assert_eq!(n.allow.iter().collect::<Vec<_>>(), vec!["emit"]);
        assert_eq!(n.max_calls, parent.max_calls);
        assert_eq!(n.max_depth, parent.max_depth);
    }

    #[test]
    fn server_wildcards_and_tool_budget() {
        let mut p = Policy::deny_all().allow("gh.*").allow("fetch");
        assert!(p.permits("gh.search") && p.permits("fetch"));
        assert!(!p.permits("ghx.search") && !p.permits("gh") && !p.permits("fetch.x"));
        p.max_tool_calls = 1;
        let session = Arc::new(Ledger::new(
            Owner::Session,
            super::super::ledger::Caps::of_policy(&p),
            None,
        ));
        let tree = Arc::new(Ledger::counting(Owner::Run));
        let m = Meter::new(&Chain::default(), &session, &tree);
        assert!(m.charge(Metered::Tool, 1).is_ok());
        let e = m.charge(Metered::Tool, 1).unwrap_err();
        assert!(e.to_string().contains("max_tool_calls"), "{e}");
        assert_eq!(m.report().cell.tool_calls, 1);
    }

    #[test]
    fn budget_counts_total_and_per_capability() {
        let mut p = Policy::deny_all();
        p.max_calls = 3;
        p.max_calls_per_capability.insert("emit".into(), 1);
        let b = Budget::default();
        assert!(b.charge(&p, "emit").is_ok());
        assert_eq!(
            b.charge(&p, "emit"),
            Err(BudgetError::PerCapability {
                cap: "emit".into(),
                max: 1
            })
        );
        assert!(b.charge(&p, "answer").is_ok());
        assert!(b.charge(&p, "answer").is_ok());
        assert_eq!(b.charge(&p, "answer"), Err(BudgetError::Total { max: 3 }));
    }
}
