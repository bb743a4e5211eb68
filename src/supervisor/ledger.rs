//! Budgets reserved before they are spent.
//!
//! A [`Ledger`] counts what one owner used (a cell's run tree, a session, a
//! principal of `serve`) against its caps. Every charge goes to a chain of
//! ledgers at once (the principal's, the session's, the run's, and for a
//! sub-agent its parent's as well), all or nothing, under one lock: calls
//! made at the same time against shared ledgers (the items of a batch,
//! sub-agents, sessions of one principal) can never together pass a cap.
//!
//! Calls are counted when they are made. Tokens and cost are *held* before
//! a model query is sent (its `max_tokens` plus its prompt's estimated
//! tokens, priced) and settled when its reply comes: what it reported is
//! charged and the rest given back. Only a prompt the estimate counted
//! low is charged past its hold (see `spend::settle`); a reply is never
//! charged more than its `max_tokens`.

use super::policy::{BudgetError, Metered, ModelUsage, Policy};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Taken by every change that touches more than one ledger, so that a
/// chain is checked and charged as one step.
static CHAIN: Mutex<()> = Mutex::new(());

/// The caps of one ledger; `None` is no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Caps {
    pub model_calls: Option<u64>,
    pub agent_calls: Option<u64>,
    pub tool_calls: Option<u64>,
    pub total_tokens: Option<u64>,
    pub cost: Option<f64>,
    /// Connections to upstream tool servers (a process each for stdio)
    /// held open at once.
    pub connections: Option<u64>,
}

impl Caps {
    /// The budgets of a session's policy.
    pub fn of_policy(p: &Policy) -> Caps {
        Caps {
            model_calls: Some(p.max_model_calls.into()),
            agent_calls: Some(p.max_agent_calls.into()),
            tool_calls: Some(p.max_tool_calls.into()),
            total_tokens: Some(p.max_total_tokens),
            cost: p.max_cost,
            connections: None,
        }
    }

    fn calls(&self, kind: Metered) -> (&'static str, Option<u64>) {
        match kind {
            Metered::Model => ("max_model_calls", self.model_calls),
            Metered::Agent => ("max_agent_calls", self.agent_calls),
            Metered::Tool => ("max_tool_calls", self.tool_calls),
        }
    }
}

/// Whose ledger it is, for refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A cell and its sub-cells.
    Run,
    Session,
    /// A principal of `serve` (its `[principals]` budgets).
    Principal(String),
}

#[derive(Debug, Default)]
struct Tally {
    used: ModelUsage,
    held_tokens: u64,
    held_cost: f64,
    /// Upstream connections open now (not forgotten with a window).
    connections: u64,
    /// Start of the current window, for a ledger with one.
    since: Option<Instant>,
}

/// What one owner used, held and may use.
#[derive(Debug)]
pub struct Ledger {
    owner: Owner,
    caps: Caps,
    /// Usage is forgotten this long after its window began (held amounts
    /// stay until settled); `None`: never.
    window: Option<Duration>,
    tally: Mutex<Tally>,
}

impl Ledger {
    pub fn new(owner: Owner, caps: Caps, window: Option<Duration>) -> Ledger {
        Ledger {
            owner,
            caps,
            window: window.filter(|w| !w.is_zero()),
            tally: Mutex::new(Tally::default()),
        }
    }

    /// A ledger that only counts (a run tree's: its session's caps bound it).
    pub fn counting(owner: Owner) -> Ledger {
        Ledger::new(owner, Caps::default(), None)
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        let mut t = crate::util::lock(&self.tally);
        if let Some(w) = self.window {
            let now = Instant::now();
            match t.since {
                Some(s) if now.duration_since(s) < w => {}
                Some(_) => {
                    t.used = ModelUsage::default();
                    t.since = Some(now);
                }
                None => t.since = Some(now),
            }
        }
        t
    }

    /// What was used so far (in the current window).
    pub fn used(&self) -> ModelUsage {
        self.tally().used
    }

    fn whose(&self) -> String {
        match (&self.owner, self.window) {
            (Owner::Principal(n), Some(w)) => {
                format!(" (principal {n:?}, per {} s window)", w.as_secs())
            }
            (Owner::Principal(n), None) => format!(" (principal {n:?})"),
            _ => String::new(),
        }
    }

    /// Why `ask` does not fit, if it does not.
    fn refusal(&self, t: &Tally, ask: &Ask) -> Option<BudgetError> {
        let u = &t.used;
        if let Some((kind, n)) = ask.calls {
            let used = match kind {
                Metered::Model => u.model_calls,
                Metered::Agent => u.agent_calls,
                Metered::Tool => u.tool_calls,
            };
            let (name, cap) = self.caps.calls(kind);
            if let Some(max) = cap {
                if u64::from(used) + u64::from(n) > max {
                    return Some(BudgetError::Exhausted {
                        budget: name,
                        detail: format!("{used} used, {n} more asked, of {max}{}", self.whose()),
                    });
                }
            }
            if kind == Metered::Tool {
                return None;
            }
        }
        if let Some(max) = self.caps.total_tokens {
            let taken = u.total_tokens().saturating_add(t.held_tokens);
            if taken >= max || taken.saturating_add(ask.tokens) > max {
                let held = match t.held_tokens {
                    0 => String::new(),
                    h => format!(" and {h} held by queries in flight"),
                };
                let asked = match ask.tokens {
                    0 => String::new(),
                    n => format!(", {n} more asked"),
                };
                return Some(BudgetError::Exhausted {
                    budget: "max_total_tokens",
                    detail: format!(
                        "{} tokens used{held}{asked}, of {max}{}",
                        u.total_tokens(),
                        self.whose()
                    ),
                });
            }
        }
        if let Some(max) = self.caps.cost {
            let taken = u.cost + t.held_cost;
            if taken >= max || taken + ask.cost > max {
                return Some(BudgetError::Exhausted {
                    budget: "max_cost",
                    detail: format!(
                        "{:.6} spent{}{}, of {max}{}",
                        u.cost,
                        if t.held_cost > 0.0 {
                            format!(" and {:.6} held by queries in flight", t.held_cost)
                        } else {
                            String::new()
                        },
                        if ask.cost > 0.0 {
                            format!(", {:.6} more asked", ask.cost)
                        } else {
                            String::new()
                        },
                        self.whose()
                    ),
                });
            }
        }
        None
    }

    fn add(&self, t: &mut Tally, ask: &Ask) {
        if let Some((kind, n)) = ask.calls {
            let u = &mut t.used;
            let c = match kind {
                Metered::Model => &mut u.model_calls,
                Metered::Agent => &mut u.agent_calls,
                Metered::Tool => &mut u.tool_calls,
            };
            *c = c.saturating_add(n);
        }
        t.held_tokens = t.held_tokens.saturating_add(ask.tokens);
        t.held_cost += ask.cost;
    }

    /// Tokens that may still be held here.
    fn tokens_left(&self, t: &Tally) -> u64 {
        self.caps.total_tokens.map_or(u64::MAX, |max| {
            max.saturating_sub(t.used.total_tokens().saturating_add(t.held_tokens))
        })
    }

    fn cost_left(&self, t: &Tally) -> Option<f64> {
        self.caps
            .cost
            .map(|max| (max - t.used.cost - t.held_cost).max(0.0))
    }
}

/// One charge: calls of a kind, and tokens and cost to hold.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ask {
    pub calls: Option<(Metered, u32)>,
    pub tokens: u64,
    pub cost: f64,
}

/// The ledgers a charge goes to, the widest first.
#[derive(Debug, Clone, Default)]
pub struct Chain(Vec<Arc<Ledger>>);

impl PartialEq for Chain {
    fn eq(&self, other: &Chain) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Chain {
    /// The chain of `ledgers`, each once (in the order first given).
    pub fn new(ledgers: Vec<Arc<Ledger>>) -> Chain {
        let mut out: Vec<Arc<Ledger>> = Vec::with_capacity(ledgers.len());
        for l in ledgers {
            if !out.iter().any(|o| Arc::ptr_eq(o, &l)) {
                out.push(l);
            }
        }
        Chain(out)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn ledgers(&self) -> &[Arc<Ledger>] {
        &self.0
    }

    /// This chain, then `more`.
    pub fn then(&self, more: impl IntoIterator<Item = Arc<Ledger>>) -> Chain {
        let mut v = self.0.clone();
        v.extend(more);
        Chain::new(v)
    }

    /// Charge each of `asks` to every ledger, or nothing when any does not
    /// fit: the first refusal (the widest ledger's first) is the error.
    /// The tokens and cost of each ask are held until its [`Hold`] is
    /// settled or dropped.
    pub fn hold_all(&self, asks: &[Ask]) -> Result<Vec<Hold>, BudgetError> {
        let total = asks.iter().fold(Ask::default(), |acc, a| Ask {
            calls: match (acc.calls, a.calls) {
                (Some((k, n)), Some((_, m))) => Some((k, n.saturating_add(m))),
                (x, y) => x.or(y),
            },
            tokens: acc.tokens.saturating_add(a.tokens),
            cost: acc.cost + a.cost,
        });
        let _one = crate::util::lock(&CHAIN);
        let mut tallies: Vec<_> = self.0.iter().map(|l| l.tally()).collect();
        for (l, t) in self.0.iter().zip(&tallies) {
            if let Some(e) = l.refusal(t, &total) {
                return Err(e);
            }
        }
        for (l, t) in self.0.iter().zip(tallies.iter_mut()) {
            l.add(t, &total);
        }
        Ok(asks
            .iter()
            .map(|a| Hold {
                chain: self.clone(),
                tokens: a.tokens,
                cost: a.cost,
                done: false,
            })
            .collect())
    }

    /// [`Chain::hold_all`] for one ask.
    pub fn hold(&self, ask: Ask) -> Result<Hold, BudgetError> {
        let mut v = self.hold_all(&[ask])?;
        v.pop().ok_or(BudgetError::Exhausted {
            budget: "max_model_calls",
            detail: String::new(),
        })
    }

    /// Count `n` calls of `kind`, unless a ledger refuses them.
    pub fn charge(&self, kind: Metered, n: u32) -> Result<(), BudgetError> {
        self.hold(Ask {
            calls: Some((kind, n)),
            ..Ask::default()
        })
        .map(Hold::keep_calls)
    }

    /// Count one more upstream connection held open, unless a ledger's
    /// `connections` cap refuses it; it is counted until the returned
    /// guard is dropped.
    pub fn open_connection(&self, server: &str) -> Result<OpenConnection, BudgetError> {
        let _one = crate::util::lock(&CHAIN);
        let mut tallies: Vec<_> = self.0.iter().map(|l| l.tally()).collect();
        for (l, t) in self.0.iter().zip(&tallies) {
            if let Some(max) = l.caps.connections {
                if t.connections >= max {
                    return Err(BudgetError::Exhausted {
                        budget: "max_upstream_connections",
                        detail: format!(
                            "{} upstream connections are open, of {max}{}; another to {server} \
                             is refused",
                            t.connections,
                            l.whose()
                        ),
                    });
                }
            }
        }
        for t in tallies.iter_mut() {
            t.connections += 1;
        }
        Ok(OpenConnection(self.clone()))
    }

    /// Tokens a query may still hold: the least any ledger has left.
    pub fn tokens_left(&self) -> u64 {
        let _one = crate::util::lock(&CHAIN);
        self.0
            .iter()
            .map(|l| l.tokens_left(&l.tally()))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Cost that may still be held: the least any capped ledger has left.
    pub fn cost_left(&self) -> Option<f64> {
        let _one = crate::util::lock(&CHAIN);
        self.0
            .iter()
            .filter_map(|l| l.cost_left(&l.tally()))
            .reduce(f64::min)
    }

    /// `policy` narrowed to what every ledger has left (a sub-agent's).
    pub fn remaining(&self, policy: &Policy) -> Policy {
        let _one = crate::util::lock(&CHAIN);
        let mut p = policy.clone();
        for l in &self.0 {
            let t = l.tally();
            let u = &t.used;
            let left = |cap: Option<u64>, used: u32| {
                cap.map_or(u32::MAX, |c| {
                    u32::try_from(c.saturating_sub(used.into())).unwrap_or(u32::MAX)
                })
            };
            p.max_model_calls = p
                .max_model_calls
                .min(left(l.caps.model_calls, u.model_calls));
            p.max_agent_calls = p
                .max_agent_calls
                .min(left(l.caps.agent_calls, u.agent_calls));
            p.max_tool_calls = p.max_tool_calls.min(left(l.caps.tool_calls, u.tool_calls));
            p.max_total_tokens = p.max_total_tokens.min(l.tokens_left(&t));
            if let Some(c) = l.cost_left(&t) {
                p.max_cost = Some(p.max_cost.map_or(c, |m| m.min(c)));
            }
        }
        p
    }
}

/// One upstream connection counted on a chain until dropped.
#[derive(Debug)]
pub struct OpenConnection(Chain);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let _one = crate::util::lock(&CHAIN);
        for l in self.0.ledgers() {
            let mut t = l.tally();
            t.connections = t.connections.saturating_sub(1);
        }
    }
}

/// Tokens and cost held for one query until it is settled; dropped
/// unsettled, they are given back (its calls stay counted).
#[derive(Debug)]
pub struct Hold {
    chain: Chain,
    tokens: u64,
    cost: f64,
    done: bool,
}

/// What a settled hold charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Charged {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
}

impl Hold {
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// Keep the calls charged and give the rest back.
    fn keep_calls(mut self) {
        self.release(Charged::default());
    }

    /// Charge `input` and `output` tokens and `cost`, each within what is
    /// held (the input first), and give the rest back.
    pub fn settle(mut self, input: u64, output: u64, cost: f64) -> Charged {
        let input = input.min(self.tokens);
        let output = output.min(self.tokens - input);
        let cost = if cost.is_finite() {
            cost.clamp(0.0, self.cost)
        } else {
            self.cost
        };
        let c = Charged {
            input_tokens: input,
            output_tokens: output,
            cost,
        };
        self.release(c);
        c
    }

    /// Charge `input` and `output` tokens and `cost` as they are, past
    /// the hold when they are more, and give the rest of it back: what an
    /// endpoint billed for a prompt the estimate counted low was spent
    /// all the same (a later ask then finds the ledger full).
    pub fn settle_past(mut self, input: u64, output: u64, cost: f64) -> Charged {
        let c = Charged {
            input_tokens: input,
            output_tokens: output,
            cost: if cost.is_finite() {
                cost.max(0.0)
            } else {
                self.cost
            },
        };
        self.release(c);
        c
    }

    /// Charge everything held: what a query whose use is not known costs.
    pub fn settle_whole(mut self, input_share: u64) -> Charged {
        let input = input_share.min(self.tokens);
        let c = Charged {
            input_tokens: input,
            output_tokens: self.tokens - input,
            cost: self.cost,
        };
        self.release(c);
        c
    }

    fn release(&mut self, charged: Charged) {
        if self.done {
            return;
        }
        self.done = true;
        let _one = crate::util::lock(&CHAIN);
        for l in self.chain.ledgers() {
            let mut t = l.tally();
            t.held_tokens = t.held_tokens.saturating_sub(self.tokens);
            t.held_cost = (t.held_cost - self.cost).max(0.0);
            t.used.input_tokens = t.used.input_tokens.saturating_add(charged.input_tokens);
            t.used.output_tokens = t.used.output_tokens.saturating_add(charged.output_tokens);
            t.used.cost += charged.cost;
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release(Charged::default());
    }
}

/// The ledgers a session's cells draw from besides its own (a principal's,
/// and for a sub-agent's session its parent's), and the tenant they belong
/// to (the key of its own upstream tool connections, its file tools'
/// workspace, its budget of bytes held by the supervisor).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Account {
    pub chain: Chain,
    /// `None`: the supervisor's own (an embedding program, `cellbox run`).
    pub tenant: Option<super::Tenant>,
}

/// The account of a session that has none.
pub static NO_ACCOUNT: Account = Account {
    chain: Chain(Vec::new()),
    tenant: None,
};

impl Account {
    /// A principal's account: its ledger, and the principal as the tenant.
    pub fn principal(tenant: super::Tenant, ledger: Arc<Ledger>) -> Account {
        Account {
            chain: Chain::new(vec![ledger]),
            tenant: Some(tenant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(tokens: u64, calls: u64) -> Arc<Ledger> {
        Arc::new(Ledger::new(
            Owner::Session,
            Caps {
                model_calls: Some(calls),
                total_tokens: Some(tokens),
                ..Caps::default()
            },
            None,
        ))
    }

    fn ask(tokens: u64) -> Ask {
        Ask {
            calls: Some((Metered::Model, 1)),
            tokens,
            cost: 0.0,
        }
    }

    #[test]
    fn holds_count_until_settled_and_never_pass_the_cap() {
        let l = capped(100, 10);
        let c = Chain::new(vec![l.clone()]);
        let a = c.hold(ask(60)).unwrap();
        // 60 held: 50 more does not fit, 40 does.
        let e = c.hold(ask(50)).unwrap_err().to_string();
        assert!(
            e.contains("max_total_tokens") && e.contains("60 held"),
            "{e}"
        );
        let b = c.hold(ask(40)).unwrap();
        assert_eq!(c.tokens_left(), 0);
        // Settled for less than held: the rest comes back.
        assert_eq!(a.settle(5, 5, 0.0).input_tokens, 5);
        assert_eq!(c.tokens_left(), 50);
        // Reported over the hold: only the hold is charged.
        let charged = b.settle(1000, 1000, 0.0);
        assert_eq!((charged.input_tokens, charged.output_tokens), (40, 0));
        assert_eq!(l.used().total_tokens(), 50);
        // Dropped unsettled: given back, the call still counted (the
        // refused one was not).
        drop(c.hold(ask(10)).unwrap());
        assert_eq!(l.used().total_tokens(), 50);
        assert_eq!(l.used().model_calls, 3);
    }

    #[test]
    fn a_batch_is_held_whole_or_not_at_all() {
        let l = capped(100, 10);
        let c = Chain::new(vec![l.clone()]);
        let e = c.hold_all(&[ask(40), ask(40), ask(40)]).unwrap_err();
        assert!(e.to_string().contains("120 more asked, of 100"), "{e}");
        assert_eq!(l.used().model_calls, 0);
        assert_eq!(c.tokens_left(), 100);
        let held = c.hold_all(&[ask(40), ask(40)]).unwrap();
        assert_eq!(held.len(), 2);
        assert_eq!(c.tokens_left(), 20);
    }

    #[test]
    fn every_ledger_of_the_chain_must_fit_and_a_refusal_names_the_principal() {
        let p = Arc::new(Ledger::new(
            Owner::Principal("alice".into()),
            Caps {
                model_calls: Some(2),
                ..Caps::default()
            },
            None,
        ));
        let s1 = Chain::new(vec![p.clone(), capped(1000, 10)]);
        let s2 = Chain::new(vec![p.clone(), capped(1000, 10)]);
        s1.charge(Metered::Model, 1).unwrap();
        s2.charge(Metered::Model, 1).unwrap();
        let e = s2.charge(Metered::Model, 1).unwrap_err().to_string();
        assert!(
            e.contains("max_model_calls") && e.contains("principal \"alice\""),
            "{e}"
        );
        // The session's own ledger was not charged by the refused call.
        assert_eq!(s2.ledgers()[1].used().model_calls, 1);
    }

    #[test]
    fn concurrent_holds_on_a_shared_ledger_never_overspend() {
        let shared = capped(1000, 1_000_000);
        let granted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                let c = Chain::new(vec![shared.clone(), capped(u64::MAX / 4, 1_000_000)]);
                let granted = &granted;
                s.spawn(move || {
                    for _ in 0..200 {
                        if let Ok(h) = c.hold(ask(7)) {
                            granted.fetch_add(7, std::sync::atomic::Ordering::SeqCst);
                            h.settle(3, 4, 0.0);
                        }
                    }
                });
            }
        });
        assert_eq!(shared.used().total_tokens(), 7 * (1000 / 7));
        assert!(granted.into_inner() <= 1000);
    }

    #[test]
    fn a_window_forgets_what_was_used_before_it() {
        let l = Arc::new(Ledger::new(
            Owner::Principal("p".into()),
            Caps {
                tool_calls: Some(1),
                ..Caps::default()
            },
            Some(Duration::from_millis(50)),
        ));
        let c = Chain::new(vec![l]);
        c.charge(Metered::Tool, 1).unwrap();
        let e = c.charge(Metered::Tool, 1).unwrap_err().to_string();
        assert!(e.contains("per 0 s window") || e.contains("window"), "{e}");
        std::thread::sleep(Duration::from_millis(60));
        c.charge(Metered::Tool, 1).unwrap();
    }
}
