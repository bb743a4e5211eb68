//! Deny-by-default capability policy and the call budget of a run tree.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Which capabilities a session may call, and how often. Nothing is allowed
/// unless named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Calls to host tools (every capability but `emit`, `answer` and
    /// `run_cell`) per run tree; also counted in `max_calls`.
    pub max_tool_calls: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allow: BTreeSet::new(),
            max_calls: 1000,
            max_calls_per_capability: BTreeMap::new(),
            max_depth: 3,
            max_tool_calls: 1000,
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
        self.allow.contains(name)
            || name
                .rsplit_once('.')
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
            max_tool_calls: self.max_tool_calls.min(other.max_tool_calls),
        }
    }
}

/// Calls used so far in one run tree; shared by a cell and its sub-cells.
#[derive(Debug, Default)]
pub struct Budget {
    /// Calls made, and calls to each capability with a cap of its own (no
    /// other name is kept: a cell chooses the names it calls).
    used: Mutex<(u32, BTreeMap<String, u32>)>,
    emitted: EmitTally,
    /// Host tool calls made (see [`Policy::max_tool_calls`]).
    tool_calls: Mutex<u32>,
}

/// `emit` events one run tree (a cell and its sub-cells) may record.
pub const MAX_EMITS_PER_CELL: u64 = 1000;
/// Bytes of `emit` events (as JSON) one run tree may record.
pub const MAX_EMIT_BYTES_PER_CELL: u64 = 1 << 20;
/// `emit` events one session may record over its life.
pub const MAX_EMITS_PER_SESSION: u64 = 10_000;
/// Bytes of `emit` events one session may record over its life.
pub const MAX_EMIT_BYTES_PER_SESSION: u64 = 16 << 20;

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
        per: &str,
    ) -> Result<(), String> {
        let mut t = crate::util::lock(&self.0);
        if t.0 >= max_count {
            return Err(format!(
                "emit refused: {max_count} events per {per} were recorded already"
            ));
        }
        if t.1.saturating_add(bytes) > max_bytes {
            return Err(format!(
                "emit refused: the event is {bytes} bytes, and {} of the {max_bytes} bytes \
                 per {per} were recorded already",
                t.1
            ));
        }
        t.0 += 1;
        t.1 += bytes;
        Ok(())
    }
}

/// Why a call could not be charged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("call budget exhausted: {max} capability calls per run")]
    Total { max: u32 },
    #[error("call budget for {cap:?} exhausted: {max} calls per run")]
    PerCapability { cap: String, max: u32 },
    #[error("tool call budget exhausted: {max} tool calls per run (max_tool_calls)")]
    Tools { max: u32 },
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
    pub(crate) fn charge_emit(&self, bytes: u64) -> Result<(), String> {
        self.emitted
            .charge(bytes, MAX_EMITS_PER_CELL, MAX_EMIT_BYTES_PER_CELL, "cell")
    }

    /// Charge one host tool call under `policy.max_tool_calls`.
    pub fn charge_tool(&self, policy: &Policy) -> Result<u32, BudgetError> {
        let mut n = crate::util::lock(&self.tool_calls);
        if *n >= policy.max_tool_calls {
            return Err(BudgetError::Tools {
                max: policy.max_tool_calls,
            });
        }
        *n += 1;
        Ok(*n)
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
        let b = Budget::default();
        assert!(b.charge_tool(&p).is_ok());
        assert_eq!(b.charge_tool(&p), Err(BudgetError::Tools { max: 1 }));
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
