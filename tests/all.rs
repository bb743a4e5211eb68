//! One integration-test binary (keeps link time down); the tests live in
//! tests/suite/.
mod suite;
