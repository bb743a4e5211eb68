//! Tenants, and the bytes the supervisor holds for them.
//!
//! A **tenant** is who a session, a cell or a direct tool call is for: one
//! principal of `serve` (one bearer token), or nobody in particular (the
//! CLI, a program using the library), in which case nothing is tenant's.
//!
//! **Held bytes** are what the supervisor keeps in its own memory on a
//! tenant's behalf, outside every cgroup: the JSON mirror of a session's
//! namespace, its definitions, its history and its checkpoints' copies of
//! them, and the buffers of file tool calls in flight. Each session has a
//! budget of them (`max_held_bytes`), and each tenant one for all its
//! sessions and calls together; what would pass either is refused with an
//! error that names the budget ([`HeldError`]), charged before it is kept.

use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes one session may make the supervisor hold, by default.
pub const DEFAULT_MAX_HELD_BYTES: u64 = 64 << 20;
/// Bytes one tenant's sessions and calls may make it hold together, by
/// default.
pub const DEFAULT_MAX_HELD_BYTES_PER_TENANT: u64 = 256 << 20;

/// A budget of held bytes: a session's (with its tenant's as parent) or a
/// tenant's.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Whose budget, for messages: "the session", "principal alice".
    scope: String,
    /// The setting that sets it, for messages.
    key: &'static str,
    max: u64,
    used: AtomicU64,
    parent: Option<Arc<Ledger>>,
}

/// Bytes the supervisor would have to hold past a budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "failed to hold {asked} more bytes for {what}: {scope} would hold more than its {limit} bytes \
     in the supervisor ({key}; {used} held now)"
)]
pub struct HeldError {
    pub scope: String,
    pub key: &'static str,
    pub what: String,
    pub asked: u64,
    pub used: u64,
    pub limit: u64,
}

impl Ledger {
    pub(crate) fn new(scope: impl Into<String>, key: &'static str, max: u64) -> Arc<Ledger> {
        Arc::new(Ledger {
            scope: scope.into(),
            key,
            max,
            used: AtomicU64::new(0),
            parent: None,
        })
    }

    /// A budget within `parent`'s: what it holds, its parent holds too.
    pub(crate) fn within(
        parent: Option<Arc<Ledger>>,
        scope: impl Into<String>,
        key: &'static str,
        max: u64,
    ) -> Arc<Ledger> {
        Arc::new(Ledger {
            scope: scope.into(),
            key,
            max,
            used: AtomicU64::new(0),
            parent,
        })
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// Take `n` bytes of this budget and its parents', or none.
    fn take(&self, n: u64, what: &dyn Fn() -> String) -> Result<(), HeldError> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(n);
            if next > self.max {
                return Err(HeldError {
                    scope: self.scope.clone(),
                    key: self.key,
                    what: what(),
                    asked: n,
                    used: cur,
                    limit: self.max,
                });
            }
            match self
                .used
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        if let Some(p) = &self.parent {
            if let Err(e) = p.take(n, what) {
                self.used.fetch_sub(n, Ordering::AcqRel);
                return Err(e);
            }
        }
        Ok(())
    }

    fn force(&self, n: u64) {
        self.used.fetch_add(n, Ordering::AcqRel);
        if let Some(p) = &self.parent {
            p.force(n);
        }
    }

    fn give(&self, n: u64) {
        // Never below zero, whatever the order of releases.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
        if let Some(p) = &self.parent {
            p.give(n);
        }
    }
}

/// Bytes charged to a [`Ledger`] (and its parents) while this lives.
#[derive(Debug)]
pub(crate) struct Held {
    ledger: Arc<Ledger>,
    bytes: u64,
}

impl Held {
    /// Nothing held yet.
    pub(crate) fn empty(ledger: Arc<Ledger>) -> Held {
        Held { ledger, bytes: 0 }
    }

    /// `bytes` held for `what`, or the error naming the budget it passes.
    pub(crate) fn take(ledger: &Arc<Ledger>, bytes: u64, what: &str) -> Result<Held, HeldError> {
        ledger.take(bytes, &|| what.to_owned())?;
        Ok(Held {
            ledger: ledger.clone(),
            bytes,
        })
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Hold `bytes` in all now, whatever the budgets (for what is held
    /// already: the next charge that grows it is refused while it is over).
    pub(crate) fn force(&mut self, bytes: u64) {
        if bytes > self.bytes {
            self.ledger.force(bytes - self.bytes);
        } else {
            self.ledger.give(self.bytes - bytes);
        }
        self.bytes = bytes;
    }

    /// Hold `bytes` in all now: more is charged (or refused, leaving the
    /// charge as it was), less is given back.
    pub(crate) fn set(&mut self, bytes: u64, what: &dyn Fn() -> String) -> Result<(), HeldError> {
        if bytes > self.bytes {
            self.ledger.take(bytes - self.bytes, what)?;
        } else {
            self.ledger.give(self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.ledger.give(self.bytes);
    }
}

/// Who a session, cell or direct tool call is for: a principal of `serve`.
/// Cheap to clone; clones share its budget of held bytes.
#[derive(Clone)]
pub struct Tenant {
    inner: Arc<TenantInner>,
}

struct TenantInner {
    name: String,
    /// Its own directory beneath the file tools' workspace.
    own_workspace: bool,
    held: Arc<Ledger>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.inner.name)
            .field("own_workspace", &self.inner.own_workspace)
            .field("held_bytes", &self.inner.held.used())
            .finish()
    }
}

/// Two handles are the same tenant when they share its budget.
impl PartialEq for Tenant {
    fn eq(&self, other: &Tenant) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Tenant {
    /// The tenant `name` (a principal's name: letters, digits, `_`, `.`,
    /// `-`), which may make the supervisor hold `max_held_bytes` in all.
    /// With `own_workspace`, its file tools write in `WORKSPACE/NAME`
    /// rather than in the workspace itself.
    pub fn new(name: &str, own_workspace: bool, max_held_bytes: u64) -> Tenant {
        Tenant {
            inner: Arc::new(TenantInner {
                name: name.to_owned(),
                own_workspace,
                held: Ledger::new(
                    format!("principal {name}"),
                    "max_held_bytes_per_principal",
                    max_held_bytes,
                ),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The directory of its own beneath the workspace, if it has one.
    pub fn workspace(&self) -> Option<&str> {
        self.inner.own_workspace.then_some(self.inner.name.as_str())
    }

    /// Bytes the supervisor holds for it now.
    pub fn held_bytes(&self) -> u64 {
        self.inner.held.used()
    }

    pub(crate) fn ledger(&self) -> &Arc<Ledger> {
        &self.inner.held
    }
}

/// Bytes of the supervisor's memory `v` takes, about: each JSON node as
/// the `Value` it is, strings and keys with their bytes, arrays and maps
/// with their slots. What matters is that it grows with what a tenant can
/// make the supervisor hold, node for node (a JSON array of small
/// numbers takes some 20 times its text), not the last byte.
pub(crate) fn value_bytes(v: &Value) -> u64 {
    const NODE: u64 = std::mem::size_of::<Value>() as u64;
    // A map entry: its key's `String`, the value, and the index map's
    // hash and index slots.
    const ENTRY: u64 = std::mem::size_of::<String>() as u64 + 16;
    let mut total = NODE;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => total += s.len() as u64,
            Value::Array(a) => {
                total += NODE * a.len() as u64;
                stack.extend(a.iter());
            }
            Value::Object(m) => {
                for (k, x) in m {
                    total += ENTRY + NODE + k.len() as u64;
                    stack.push(x);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    total
}

/// Bytes one named variable takes in a namespace (its name and value).
pub(crate) fn var_bytes(name: &str, v: &Value) -> u64 {
    std::mem::size_of::<String>() as u64 + 16 + name.len() as u64 + value_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_session_and_its_tenant_are_charged_together() {
        let tenant = Tenant::new("alice", true, 100);
        let s1 = Ledger::within(
            Some(tenant.ledger().clone()),
            "the session",
            "max_held_bytes",
            70,
        );
        let s2 = Ledger::within(
            Some(tenant.ledger().clone()),
            "the session",
            "max_held_bytes",
            70,
        );
        let mut a = Held::empty(s1.clone());
        a.set(60, &|| "x".into()).unwrap();
        // The session's own budget.
        let e = a.set(80, &|| "its mirror".into()).unwrap_err();
        assert_eq!((e.key, e.limit, e.used), ("max_held_bytes", 70, 60));
        assert!(e.to_string().contains("its mirror"), "{e}");
        assert_eq!(a.bytes(), 60);
        // The tenant's, over both sessions.
        let e = Held::take(&s2, 50, "a search").unwrap_err();
        assert_eq!(e.key, "max_held_bytes_per_principal");
        assert!(e.to_string().contains("principal alice"), "{e}");
        assert_eq!((s2.used(), tenant.held_bytes()), (0, 60));
        let b = Held::take(&s2, 40, "a search").unwrap();
        assert_eq!(tenant.held_bytes(), 100);
        drop(b);
        a.set(10, &|| "x".into()).unwrap();
        assert_eq!((s1.used(), tenant.held_bytes()), (10, 10));
        drop(a);
        assert_eq!(tenant.held_bytes(), 0);
    }

    #[test]
    fn value_bytes_counts_nodes_not_text() {
        let small: Value =
            serde_json::from_str(&format!("[{}]", vec!["0"; 1000].join(","))).unwrap();
        let text = serde_json::to_string(&small).unwrap().len() as u64;
        assert!(value_bytes(&small) >= 1000 * std::mem::size_of::<Value>() as u64);
        assert!(value_bytes(&small) > 10 * text);
        let s = json!({"k": "x".repeat(10_000)});
        assert!(value_bytes(&s) >= 10_001);
        // Deep nesting is walked without recursion.
        let mut deep = json!(0);
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert!(value_bytes(&deep) > 100_000);
        // serde_json drops deep values recursively: let it go piecewise.
        while let Value::Array(mut a) = deep {
            deep = a.pop().unwrap_or(Value::Null);
        }
    }
}
