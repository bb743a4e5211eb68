#![no_main]
//! Target `to_worker`: the properties are in `cellbox::fuzzing::to_worker`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::to_worker(data));
