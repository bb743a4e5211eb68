#![no_main]
//! Target `from_worker`: the properties are in `cellbox::fuzzing::from_worker`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::from_worker(data));
