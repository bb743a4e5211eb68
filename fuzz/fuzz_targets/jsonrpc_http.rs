#![no_main]
//! Target `jsonrpc_http`: the properties are in `cellbox::fuzzing::jsonrpc_http`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::jsonrpc_http(data));
