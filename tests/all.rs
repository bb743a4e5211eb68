#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test
//! One integration-test binary (keeps link time down); the tests live in
//! tests/suite/.
mod suite;
