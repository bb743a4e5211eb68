#![no_main]
//! Target `serve_config`: the properties are in `cellbox::fuzzing::serve_config`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::serve_config(data));
