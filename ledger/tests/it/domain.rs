//! Table-driven domain tests: each case is a script of commands run through one `check`
//! helper by the library's own scenario runner (`ledger::scenario`: a real ledger on sled
//! with a hand-moved clock); the transcript of answers, balances and counters is an insta
//! snapshot in the workspace's `snapshots/`.

use ledger::scenario::Scenario;

/// Runs a script through the library's scenario runner and returns its transcript.
fn run(script: &str) -> String {
    let scenario = Scenario::parse(script).unwrap_or_else(|e| panic!("{e}"));
    scenario.run().unwrap_or_else(|e| panic!("{e}"))
}

fn check(name: &str, script: &str) {
    let transcript = run(script);
    insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"), prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(format!("ledger_{name}"), transcript);
    });
}

#[test]
fn seed_scenario() {
    check(
        "seed_scenario",
        "
        default/dep-1 deposit alice 1000 RUB
        # the client retries req-7f3a twice: one withdrawal, three identical answers
        default/req-7f3a withdraw alice 300 RUB
        default/req-7f3a withdraw alice 300 RUB
        default/req-7f3a withdraw alice 300 RUB
        # another key is another withdrawal
        default/req-91bc withdraw alice 200 RUB
        balances
        stats
        ",
    );
}

#[test]
fn every_rejection_code_is_final_and_replayed() {
    check(
        "rejections",
        "
        default/w-ghost withdraw ghost 10 RUB
        default/d-1 deposit alice 100 RUB
        default/d-2 deposit alice 100 USD
        default/w-cur withdraw alice 10 USD
        default/w-big withdraw alice 101 RUB
        default/r-none refund w-nothing 10
        default/w-ok withdraw alice 60 RUB
        default/r-over refund w-ok 61
        # rejections are replayed: a retry never turns a failure into a success
        default/d-3 deposit alice 1000 RUB
        default/w-big withdraw alice 101 RUB
        default/r-none refund w-nothing 10
        balances
        stats
        ",
    );
}

#[test]
fn same_key_other_command_is_refused_and_changes_nothing() {
    check(
        "reuse",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 301 RUB
        default/w-1 withdraw bob 300 RUB
        default/w-1 withdraw alice 300 USD
        default/w-1 deposit alice 300 RUB
        default/w-1 refund d-1 300
        default/w-1 withdraw alice 300 RUB
        balances
        stats
        ",
    );
}

#[test]
fn refunds_partial_over_unknown_and_of_rejections() {
    check(
        "refunds",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/r-1 refund w-1 100
        default/r-1 refund w-1 100
        default/r-2 refund w-1 150
        default/r-3 refund w-1 51
        default/r-4 refund w-1 50
        default/r-5 refund w-1 1
        # a rejected withdrawal cannot be refunded
        default/w-2 withdraw alice 5000 RUB
        default/r-6 refund w-2 10
        # nor can a deposit, or another client's withdrawal
        default/r-7 refund d-1 10
        other/r-8 refund w-1 10
        balances
        stats
        ",
    );
}

#[test]
fn clients_never_see_each_others_keys() {
    check(
        "clients",
        "
        shop/d-1 deposit alice 1000 RUB
        bank/d-1 deposit bob 500 RUB
        shop/d-1 deposit alice 1000 RUB
        bank/d-1 deposit bob 500 RUB
        bank/d-1 deposit alice 1000 RUB
        balances
        ",
    );
}

#[test]
fn currencies_are_fixed_by_the_first_deposit() {
    check(
        "currencies",
        "
        default/d-1 deposit alice 1000 EUR
        default/d-2 deposit alice 1000 USD
        default/d-3 deposit bob 70 USD
        default/w-1 withdraw bob 70 USD
        default/w-2 withdraw alice 1 USD
        default/d-4 deposit carol 1000000000000000 JPY
        default/d-5 deposit carol 1000000000000000 JPY
        balances
        ",
    );
}

#[test]
fn keys_expire_but_effects_do_not() {
    check(
        "retention",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        clock +23h
        sweep
        default/w-2 withdraw alice 100 RUB
        clock +2h
        sweep
        key default/w-1
        key default/w-2
        # after expiry the answer is rebuilt from the fact, and no money moves
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 999 RUB
        default/r-1 refund w-1 300
        restart
        default/w-1 withdraw alice 300 RUB
        clock +24h
        sweep
        sweep
        balances
        stats
        ",
    );
}

#[test]
fn clock_going_backwards_keeps_the_log_in_order() {
    check(
        "clock_backwards",
        "
        default/d-1 deposit alice 1000 RUB
        clock -2h
        default/w-1 withdraw alice 1 RUB
        clock +25h
        sweep
        clock -30h
        sweep
        default/w-1 withdraw alice 1 RUB
        stats
        ",
    );
}

#[test]
fn in_flight_duplicates_get_409_and_a_dead_lease_is_taken_over() {
    check(
        "in_flight",
        "
        default/d-1 deposit alice 1000 RUB
        pause
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-1 withdraw alice 999 RUB
        key default/w-1
        clock +11s
        key default/w-1
        # the first attempt's lease ran out: this one takes the claim over
        default/w-1 withdraw alice 300 RUB
        resume
        default/w-1 withdraw alice 300 RUB
        balances
        stats
        ",
    );
}

#[test]
fn answers_survive_a_restart() {
    check(
        "restart",
        "
        default/d-1 deposit alice 1000 RUB
        default/w-1 withdraw alice 300 RUB
        default/w-2 withdraw alice 3000 RUB
        restart
        default/w-1 withdraw alice 300 RUB
        default/w-2 withdraw alice 3000 RUB
        default/w-3 withdraw alice 700 RUB
        restart
        balances
        stats
        ",
    );
}
