//! `inbox-worker replay --script FILE`: the library's scenario transcript, for users of
//! other languages.

use crate::support::run;

const SCRIPT: &str = "
# a retry, a reuse, a refund, and an answer kept past the retention
shop/ord-1 deposit alice 1000 RUB
shop/ord-1 deposit alice 1000 RUB
shop/ord-1 deposit alice 999 RUB
shop/pay-1 withdraw alice 300 RUB
shop/ref-1 refund pay-1 100
clock +25h
sweep
shop/pay-1 withdraw alice 300 RUB
statement shop/alice
key shop/pay-1
balances
";

#[test]
fn replay_prints_the_librarys_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.txt");
    std::fs::write(&file, SCRIPT).unwrap();
    let out = run(&["replay", "--script", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let library = ledger::scenario::Scenario::parse(SCRIPT)
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(text, library);
    for want in [
        "> shop/ord-1 deposit alice 999 RUB\n  refused: idempotency_key_reused",
        "  expired 3",
        "  replayed: applied seq=2 alice RUB balance=700",
        "  seq=3 ref-1 RefundRecorded change=100 balance=800",
        "  expired withdraw",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
}

#[test]
fn replay_names_the_line_that_is_not_a_step_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.txt");
    std::fs::write(
        &file,
        "shop/a deposit alice 10 RUB\nshop/b withdrw alice 5 RUB\n",
    )
    .unwrap();
    let out = run(&["replay", "--script", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: a command is deposit"), "{err}");
}
