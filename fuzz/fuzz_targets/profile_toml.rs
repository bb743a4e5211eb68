#![no_main]
//! Target `profile_toml`: the properties are in `cellbox::fuzzing::profile_toml`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cellbox::fuzzing::profile_toml(data));
