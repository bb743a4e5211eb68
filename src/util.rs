//! Small helpers any module may use; this one depends on nothing else in
//! the crate.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock `m`, also when a thread panicked while holding it: the data behind
/// every lock in cellbox stays consistent between statements (counters,
/// tables, a channel's write end), so a panic elsewhere is no reason to
/// stop using it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
