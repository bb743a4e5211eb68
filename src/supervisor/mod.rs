//! The supervisor.
