//! The worker.
