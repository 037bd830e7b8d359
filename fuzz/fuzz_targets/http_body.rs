#![no_main]

// The property checks live in inbox_worker::fuzzing, shared with the corpus test
// (inbox-worker/tests/worker/fuzz_corpus.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| inbox_worker::fuzzing::http_body(data));
