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

/// A valid namespace variable (and capability parameter) name: letters,
/// digits and `_`, not starting with a digit.
pub(crate) fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
