#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_macros)] // test code: a panic is a failed test; stderr is for the developer
//! One integration-test binary (keeps link time down); the tests live in
//! tests/suite/.
mod suite;
