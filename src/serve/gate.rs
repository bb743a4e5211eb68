//! The concurrency gate: at most `max_concurrency` cells run at once, at most
//! `max_queue` further calls wait for a slot, and a call past that is refused
//! at once with a clear error instead of piling up. One principal may have
//! at most `max_queue_per_principal` calls waiting, so one client cannot
//! take the whole queue.

use super::principal::Principal;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server is full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server is busy: {running} cells running and {queued} calls waiting \
     (max_concurrency {max_concurrency}, max_queue {max_queue}); try again when a call finishes"
)]
pub struct Busy {
    pub running: usize,
    pub queued: usize,
    pub max_concurrency: usize,
    pub max_queue: usize,
}

/// One principal's share of the queue is used up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "you have {waiting} calls waiting for a slot, the most one client may have \
     (max_queue_per_principal {max}); try again when one of them starts"
)]
pub struct PrincipalBusy {
    pub waiting: usize,
    pub max: usize,
}

/// Why a call was not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Busy(#[from] Busy),
    #[error(transparent)]
    PrincipalBusy(#[from] PrincipalBusy),
}

struct Inner {
    slots: Arc<Semaphore>,
    /// Calls admitted and not finished: running plus waiting.
    admitted: AtomicUsize,
    /// Calls admitted since the start.
    total: AtomicU64,
    /// Calls admitted and not yet running, per principal.
    waiting: Mutex<HashMap<Principal, usize>>,
    max_concurrency: usize,
    max_queue: usize,
    max_queue_per_principal: usize,
}

impl Inner {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<Principal, usize>> {
        crate::util::lock(&self.waiting)
    }

    fn stop_waiting(&self, who: &Principal) {
        let mut w = self.waiting();
        if let Some(n) = w.get_mut(who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.remove(who);
            }
        }
    }
}

#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("max_concurrency", &self.inner.max_concurrency)
            .field("max_queue", &self.inner.max_queue)
            .field("admitted", &self.admitted())
            .finish()
    }
}

/// A call that got in; it holds its place until dropped.
pub struct Admission {
    inner: Arc<Inner>,
    principal: Principal,
    /// Still counted among its principal's waiting calls.
    waiting: AtomicBool,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.waiting.swap(false, Ordering::AcqRel) {
            self.inner.stop_waiting(&self.principal);
        }
        self.inner.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// Wait for a running slot.
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        let permit = self.inner.slots.clone().acquire_owned().await.ok();
        if self.waiting.swap(false, Ordering::AcqRel) {
            self.inner.stop_waiting(&self.principal);
        }
        permit
    }
}

impl Gate {
    pub fn new(max_concurrency: usize, max_queue: usize, max_queue_per_principal: usize) -> Self {
        Gate {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(max_concurrency)),
                admitted: AtomicUsize::new(0),
                total: AtomicU64::new(0),
                waiting: Mutex::new(HashMap::new()),
                max_concurrency,
                max_queue,
                max_queue_per_principal,
            }),
        }
    }

    pub fn max_queue_per_principal(&self) -> usize {
        self.inner.max_queue_per_principal
    }

    pub fn max_concurrency(&self) -> usize {
        self.inner.max_concurrency
    }

    pub fn max_queue(&self) -> usize {
        self.inner.max_queue
    }

    /// Calls let in since the server started.
    pub fn total_admitted(&self) -> u64 {
        self.inner.total.load(Ordering::Acquire)
    }

    /// Calls admitted and still waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.inner.waiting().values().sum()
    }

    /// Calls in flight (running or waiting).
    pub fn admitted(&self) -> usize {
        self.inner.admitted.load(Ordering::Acquire)
    }

    /// Let a call of `who` in, or refuse it when running + waiting is at
    /// capacity, or when `who` already has its share of calls waiting and
    /// no slot is free.
    pub fn admit(&self, who: &Principal) -> Result<Admission, Refused> {
        let mut w = self.inner.waiting();
        // The server-wide limit first: with one principal it is the one hit.
        let admission = self.admit_any(who)?;
        let mine = w.get(who).copied().unwrap_or(0);
        if mine >= self.inner.max_queue_per_principal
            && mine >= self.inner.slots.available_permits()
        {
            drop(admission);
            return Err(PrincipalBusy {
                waiting: mine,
                max: self.inner.max_queue_per_principal,
            }
            .into());
        }
        *w.entry(who.clone()).or_insert(0) += 1;
        admission.waiting.store(true, Ordering::Release);
        Ok(admission)
    }

    fn admit_any(&self, who: &Principal) -> Result<Admission, Busy> {
        let cap = self
            .inner
            .max_concurrency
            .saturating_add(self.inner.max_queue);
        let mut cur = self.inner.admitted.load(Ordering::Acquire);
        loop {
            if cur >= cap {
                let running = self
                    .inner
                    .max_concurrency
                    .saturating_sub(self.inner.slots.available_permits());
                return Err(Busy {
                    running,
                    queued: cur.saturating_sub(running),
                    max_concurrency: self.inner.max_concurrency,
                    max_queue: self.inner.max_queue,
                });
            }
            match self.inner.admitted.compare_exchange(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.inner.total.fetch_add(1, Ordering::AcqRel);
                    return Ok(Admission {
                        inner: self.inner.clone(),
                        principal: who.clone(),
                        waiting: AtomicBool::new(false),
                    });
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn queues_then_refuses() {
        let p = Principal::local();
        let g = Gate::new(1, 1, 1);
        let a = g.admit(&p).unwrap();
        let slot_a = a.slot().await.unwrap();
        let b = g.admit(&p).unwrap();
        let other = Principal::named("other");
        let Err(Refused::Busy(busy)) = g.admit(&other) else {
            panic!("not refused as busy")
        };
        assert_eq!(busy.running, 1);
        assert_eq!(busy.queued, 1);
        assert!(busy.to_string().contains("max_queue 1"), "{busy}");
        // b waits until a's slot is free.
        let waiter = tokio::spawn(async move {
            let s = b.slot().await;
            (b, s)
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(slot_a);
        drop(a);
        let (b, s) = waiter.await.unwrap();
        assert!(s.is_some());
        assert_eq!(g.admitted(), 1);
        drop(b);
        assert_eq!(g.admitted(), 0);
        assert!(g.admit(&p).is_ok());
    }

    #[tokio::test]
    async fn one_principal_cannot_take_the_whole_queue() {
        let (x, y) = (Principal::named("x"), Principal::named("y"));
        let g = Gate::new(1, 4, 2);
        // x runs one call and queues two; its third waiting call is refused.
        let a = g.admit(&x).unwrap();
        let slot = a.slot().await.unwrap();
        let q1 = g.admit(&x).unwrap();
        let _q2 = g.admit(&x).unwrap();
        let Err(Refused::PrincipalBusy(e)) = g.admit(&x) else {
            panic!("x took more than its share")
        };
        assert_eq!((e.waiting, e.max), (2, 2));
        assert!(e.to_string().contains("max_queue_per_principal 2"), "{e}");
        // y still gets in.
        let _y1 = g.admit(&y).unwrap();
        let _y2 = g.admit(&y).unwrap();
        // A queued call of x that starts running frees its place.
        drop(slot);
        drop(a);
        let s1 = q1.slot().await.unwrap();
        let _q3 = g.admit(&x).unwrap();
        drop(s1);
        drop(q1);
        // A call that is let in while a slot is free is not refused.
        let g = Gate::new(2, 0, 0);
        let a = g.admit(&x).unwrap();
        let _s = a.slot().await.unwrap();
        assert!(g.admit(&x).is_ok());
    }
}
