#![no_main]
//! Target `frame`: the properties are in `cellbox::fuzzing::frame`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::frame(data));
