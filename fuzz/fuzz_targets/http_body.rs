#![no_main]

// The property checks live in the idem-fuzz-checks crate (checks/), shared with the test
// that runs the committed corpora (checks/tests/corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz_checks::http_body(data));
