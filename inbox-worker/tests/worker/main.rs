//! Black-box tests of `inbox-worker`: each starts the real binary (on a port the kernel
//! picks) and talks to it as a client would. One test binary, several modules.

#![allow(clippy::unwrap_used)]

mod amqp;
mod answers;
mod api;
mod bad_input;
mod cli;
mod crash_loop;
mod damaged;
mod durability;
mod inbox;
mod no_5xx;
mod openapi;
mod postgres;
mod raw;
mod support;

#[test]
fn demo_tells_the_story() {
    let out = support::run(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "attempt 1: first execution                  balance=700",
        "attempt 2: replay (answer from the log)     balance=700",
        "attempt 3: replay (answer from the log)     balance=700",
        "new key:   first execution                  balance=500",
        "all guarantees hold",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("FAIL"), "{text}");
}
