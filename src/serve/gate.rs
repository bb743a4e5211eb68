//! The concurrency gate: at most `max_concurrency` cells run at once, at most
//! `max_queue` further calls wait for a slot, and a call past that is refused
//! at once with a clear error instead of piling up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

struct Inner {
    slots: Arc<Semaphore>,
    /// Calls admitted and not finished: running plus waiting.
    admitted: AtomicUsize,
    max_concurrency: usize,
    max_queue: usize,
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
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.inner.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// Wait for a running slot.
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.slots.clone().acquire_owned().await.ok()
    }
}

impl Gate {
    pub fn new(max_concurrency: usize, max_queue: usize) -> Self {
        Gate {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(max_concurrency)),
                admitted: AtomicUsize::new(0),
                max_concurrency,
                max_queue,
            }),
        }
    }

    pub fn max_concurrency(&self) -> usize {
        self.inner.max_concurrency
    }

    pub fn max_queue(&self) -> usize {
        self.inner.max_queue
    }

    /// Calls in flight (running or waiting).
    pub fn admitted(&self) -> usize {
        self.inner.admitted.load(Ordering::Acquire)
    }

    /// Let a call in, or refuse it when running + waiting is at capacity.
    pub fn admit(&self) -> Result<Admission, Busy> {
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
                    return Ok(Admission {
                        inner: self.inner.clone(),
                    })
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
        let g = Gate::new(1, 1);
        let a = g.admit().unwrap();
        let slot_a = a.slot().await.unwrap();
        let b = g.admit().unwrap();
        let busy = g.admit().err().unwrap();
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
        assert!(g.admit().is_ok());
    }
}
