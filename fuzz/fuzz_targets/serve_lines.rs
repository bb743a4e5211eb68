#![no_main]
//! Target `serve_lines`: the properties are in `cellbox::fuzzing::serve_lines`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::serve_lines(data));
