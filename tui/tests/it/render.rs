//! Whole-screen snapshots on ratatui's TestBackend, from fixed data and a fixed clock.

use insta::Settings;
use ledger_tui::app::{Connection, Data};
use ledger_tui::{App, Event, draw};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::Color;

use crate::fixture::{self, data, live_app};
use crate::press;

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (40, 12)];

fn render(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| draw(frame, app)).unwrap();
    terminal
}

/// Snapshots `app` at every size as `tui_{name}_{w}x{h}` in the workspace's snapshots/.
fn check(name: &str, app: &App) {
    for (width, height) in SIZES {
        check_size(name, app, width, height);
    }
}

fn check_size(name: &str, app: &App, width: u16, height: u16) {
    let mut app = app.clone();
    // The handler learns the size from resize events, as in the real loop.
    app.handle(Event::Resize(width, height));
    let terminal = render(&app, width, height);
    let mut screen = terminal.backend().to_string();
    if !app.color {
        // Without colour the text is the same; what stands in for colour is the point.
        screen.push_str(&format!("\nstyles: {}\n", styles_used(&terminal)));
    }
    assert_no_control(&screen);
    let mut settings = Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::assert_snapshot!(format!("tui_{name}_{width}x{height}"), screen);
    });
}

fn assert_no_control(screen: &str) {
    let bad: Vec<char> = screen
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(bad.is_empty(), "control characters on screen: {bad:?}");
}

/// Every distinct style on screen, as `fg/bg/modifiers`.
fn styles_used(terminal: &Terminal<TestBackend>) -> String {
    let mut styles: Vec<String> = terminal
        .backend()
        .buffer()
        .content()
        .iter()
        .map(|cell| format!("{:?}/{:?}/{:?}", cell.fg, cell.bg, cell.modifier))
        .collect();
    styles.sort();
    styles.dedup();
    styles.join(", ")
}

/// Cells drawn with a foreground or background colour.
fn coloured_cells(terminal: &Terminal<TestBackend>) -> usize {
    terminal
        .backend()
        .buffer()
        .content()
        .iter()
        .filter(|cell| cell.fg != Color::Reset || cell.bg != Color::Reset)
        .count()
}

#[test]
fn overview() {
    check("overview", &live_app(true));
}

/// A worker whose start found the ledger's index damaged and rebuilt it from the journal:
/// the Storage panel says so in the warning colour, as much as fits each width.
#[test]
fn overview_after_an_index_rebuild() {
    let mut app = live_app(true);
    let mut snapshot = fixture::snapshot(3, 120, 4);
    snapshot.index_rebuilt = Some(
        serde_json::from_value(serde_json::json!(
            "the index was rebuilt from the journal (the base at group 0 and 40 groups after \
             it, 140 facts) in 12 ms, because sled reports Read corrupted data"
        ))
        .unwrap(),
    );
    app.handle(data(Data::Snapshot(Box::new(snapshot))));
    let (width, height) = (120, 40);
    app.handle(Event::Resize(width, height));
    let screen = render(&app, width, height).backend().to_string();
    assert!(screen.contains("index rebuilt at start"), "{screen}");
    check("overview_index_rebuilt", &app);
}

#[test]
fn keys() {
    let mut app = live_app(true);
    press(&mut app, "2j");
    check("keys", &app);
}

#[test]
fn keys_detail() {
    let mut app = live_app(true);
    press(&mut app, "2jj<Enter>");
    let (client, key) = app.wants().detail.unwrap();
    let mut detail = fixture::keys_page().keys[2].clone();
    assert_eq!(
        (detail.client.as_str(), detail.key.as_str()),
        (&*client, &*key)
    );
    detail.fact = Some(serde_json::json!({"seq": 131, "type": "WithdrawalRecorded",
        "account": "alice", "amount": 300, "currency": "RUB", "balance_after": 700}));
    app.handle(data(Data::KeyDetail(Box::new(detail))));
    check("keys_detail", &app);
}

#[test]
fn keys_filter_active() {
    let mut app = live_app(true);
    press(&mut app, "2/status:pending<Enter>");
    let query = app.key_query();
    let mut page = fixture::keys_page();
    page.keys
        .retain(|k| k.status == ledger_tui::model::KeyStatus::Pending);
    page.next = None;
    app.handle(data(Data::Keys { query, page }));
    check("keys_filter_active", &app);
}

#[test]
fn filter_being_typed() {
    let mut app = live_app(true);
    press(&mut app, "2/client:shop ord");
    check_size("filter_typing", &app, 80, 24);
}

#[test]
fn conflicts() {
    let mut app = live_app(true);
    press(&mut app, "3");
    check("conflicts", &app);
}

/// The inbox's quarantine under the conflicts, newest first, once the feed has one; a
/// payload's escape sequence does not reach the screen. At 40x12 there is no room for it.
#[test]
fn conflicts_with_quarantine() {
    let mut app = live_app(true);
    app.handle(data(Data::Quarantine(fixture::quarantine())));
    press(&mut app, "3");
    check("conflicts_quarantine", &app);
}

#[test]
fn balances() {
    let mut app = live_app(true);
    press(&mut app, "4");
    check("balances", &app);
}

#[test]
fn log() {
    let mut app = live_app(true);
    press(&mut app, "5");
    check("log", &app);
}

#[test]
fn help_overlay() {
    let mut app = live_app(true);
    press(&mut app, "?");
    check("help", &app);
}

#[test]
fn disconnected_with_old_data() {
    let mut app = live_app(true);
    app.handle(data(Data::Disconnected {
        error: "connection refused".into(),
        attempt: 3,
    }));
    check("disconnected", &app);
}

#[test]
fn disconnected_before_any_data() {
    let mut app = App::new(fixture::SERVER, true);
    app.handle(data(Data::Disconnected {
        error: "connection refused".into(),
        attempt: 1,
    }));
    assert!(matches!(app.connection, Connection::Disconnected { .. }));
    check_size("never_connected", &app, 80, 24);
}

#[test]
fn paused() {
    let mut app = live_app(true);
    press(&mut app, "p");
    check_size("paused", &app, 80, 24);
}

#[test]
fn too_small() {
    let app = live_app(true);
    check_size("too_small", &app, 39, 11);
}

#[test]
fn no_color_uses_no_colour() {
    for (view, name) in [("1", "overview"), ("2", "keys"), ("4", "balances")] {
        let mut app = live_app(false);
        press(&mut app, view);
        check_size(&format!("no_color_{name}"), &app, 80, 24);
        for (width, height) in SIZES {
            let terminal = render(&app, width, height);
            assert_eq!(coloured_cells(&terminal), 0, "{name} at {width}x{height}");
        }
    }
    // And the test can fail: the same screen in colour does use colour.
    let terminal = render(&live_app(true), 80, 24);
    assert!(coloured_cells(&terminal) > 0);
}

/// Every number on `line` that reads as one, grouped (`-1,010,000.00`), abbreviated
/// (`-1.01e15`) or plain.
fn numbers_on(line: &str) -> Vec<f64> {
    line.split(|c: char| c.is_whitespace() || c == '│' || c == '"')
        .filter_map(|word| word.replace(',', "").parse::<f64>().ok())
        .collect()
}

/// A balance too wide for its column keeps its sign and its magnitude at every size: it
/// is shown in full, or abbreviated with its exponent, never cut from the left.
#[test]
fn big_balances_keep_their_sign_and_size() {
    // 101 deposits fill an i64's 18 digits plus the sign; 20,000 outgrow an i64. Each is
    // 10^15 kopecks, shown as 10^13 roubles.
    for deposits in [101, 20_000] {
        let total = deposits as f64 * 1e13;
        let mut app = live_app(true);
        app.handle(data(Data::Accounts(fixture::accounts_after_deposits(
            deposits,
        ))));
        press(&mut app, "4");
        for (width, height) in SIZES {
            app.handle(Event::Resize(width, height));
            let screen = render(&app, width, height).backend().to_string();
            for (account, expected) in [("alice", total), ("@world", -total)] {
                let line = screen
                    .lines()
                    .find(|line| line.contains(account))
                    .unwrap_or_else(|| panic!("no {account} at {width}x{height}:\n{screen}"));
                let near = |n: &f64| ((n - expected) / expected).abs() < 1e-3;
                assert!(
                    numbers_on(line).iter().any(near),
                    "{account} should show {expected:e} at {width}x{height}:\n{screen}"
                );
                assert!(
                    !numbers_on(line).iter().any(|n| n.abs() > 1.0 && !near(n)),
                    "{account} shows a wrong number at {width}x{height}:\n{screen}"
                );
            }
        }
    }
}

// Numbers at the ends of their types, in every view that shows them: each is shown in
// full where its column can widen, else shortened with its exponent (`-1.01e17`), and
// never cut without a mark.

#[test]
fn extreme_overview() {
    check("extreme_overview", &fixture::extreme_app());
}

#[test]
fn extreme_keys() {
    let mut app = fixture::extreme_app();
    press(&mut app, "2");
    check("extreme_keys", &app);
}

#[test]
fn extreme_keys_detail() {
    let mut app = fixture::extreme_app();
    press(&mut app, "2j<Enter>");
    let mut detail = fixture::extreme_keys_page().keys[1].clone();
    detail.fact = Some(
        serde_json::json!({"seq": u64::MAX, "type": "DepositRecorded",
        "account": "alice", "amount": 1_000_000_000_000_000_u64, "currency": "RUB",
        "balance_after": "170141183460469231731687303715884105727"}),
    );
    app.handle(data(Data::KeyDetail(Box::new(detail))));
    check("extreme_keys_detail", &app);
}

#[test]
fn extreme_conflicts() {
    let mut app = fixture::extreme_app();
    press(&mut app, "3");
    check("extreme_conflicts", &app);
}

#[test]
fn extreme_balances() {
    let mut app = fixture::extreme_app();
    press(&mut app, "4");
    check("extreme_balances", &app);
}

#[test]
fn extreme_log() {
    let mut app = fixture::extreme_app();
    press(&mut app, "5");
    check("extreme_log", &app);
}

/// `s` lists keys by name, numbers in them by value: `big-17` before `big-102`.
#[test]
fn keys_by_key() {
    let mut app = live_app(true);
    press(&mut app, "2s");
    let query = app.key_query();
    let mut page = fixture::keys_page();
    for (key, age_ms) in [("big-102", 5_000), ("big-17", 9_000), ("big-9", 1_000)] {
        let mut record = page.keys[2].clone();
        record.key = ledger_tui::sanitize::Clean::new(key);
        record.age_ms = age_ms;
        page.keys.push(record);
    }
    app.handle(data(Data::Keys { query, page }));
    check("keys_by_key", &app);
}

/// A rejected key's detail: the code, the reason, and a field this dashboard has no
/// words for, labelled by its name; the key's escape sequence does not reach the screen.
#[test]
fn keys_detail_rejected() {
    let mut app = live_app(true);
    press(&mut app, "2jjjj<Enter>");
    let (_, key) = app.wants().detail.unwrap();
    assert_eq!(key, fixture::EVIL_KEY.replace(['\u{1b}', '\u{9b}'], ""));
    let mut detail = fixture::keys_page().keys[4].clone();
    detail.fact = Some(serde_json::json!({"seq": 120, "type": "CommandRejected",
        "rejection": "currency_mismatch", "at": "2026-11-30T11:50:00.000Z",
        "command": "deposit", "account": "mallory", "amount": 300, "currency": "RUB"}));
    app.handle(data(Data::KeyDetail(Box::new(detail))));
    check("keys_detail_rejected", &app);
}

/// A refund's detail names its withdrawal and shows its amount in the withdrawal's
/// currency; its rejection's code is written out.
#[test]
fn refund_detail_reads_as_words() {
    let mut app = live_app(true);
    press(&mut app, "2jjj<Enter>");
    app.handle(Event::Resize(120, 40));
    let screen = render(&app, 120, 40).backend().to_string();
    for words in [
        "refund 1.00 RUB of withdrawal ord-2",
        "outcome   rejected: refund_exceeds_withdrawal",
        "reason    The refunds would exceed the amount",
        "left      0.50 RUB of withdrawal ord-2 to",
        "repeats   5 replays · 1 conflict since the",
    ] {
        assert!(screen.contains(words), "missing {words:?} in\n{screen}");
    }
}

/// The verify at start ran on an empty ledger that has grown since: the overview says
/// when it ran and how far it reached, not a bare `checked 0 facts`.
#[test]
fn overview_verify_at_start() {
    let mut app = live_app(true);
    let mut snapshot = fixture::snapshot(3, 120, 4);
    snapshot.verify = Some(
        serde_json::from_value(serde_json::json!({
            "at": "2026-11-30T08:00:01.000Z", "run": "start", "up_to_seq": 0, "ok": true,
            "facts": 0, "keys_done": 0, "keys_expired": 0, "accounts": 0, "currencies": 0,
            "violations": 0, "next_at": "2026-11-30T08:10:01.000Z",
            "summary": "checked 0 facts, 0 keys done, 0 expired, 0 accounts in 0 currencies"
        }))
        .unwrap(),
    );
    app.handle(data(Data::Snapshot(Box::new(snapshot))));
    check("overview_verify_at_start", &app);
}

/// A PostgreSQL worker counts replays and conflicts from its own start, and says so.
#[test]
fn overview_worker_counts() {
    let mut app = live_app(true);
    let mut snapshot = fixture::snapshot(3, 120, 4);
    snapshot.observed_scope = ledger_tui::model::ObservedScope::Worker;
    app.handle(data(Data::Snapshot(Box::new(snapshot))));
    check("overview_worker_counts", &app);
}

/// Conflicts counted (before this worker started, or through the inbox) but none listed:
/// the view says why the list is empty, not that there were none.
#[test]
fn conflicts_counted_not_listed() {
    let mut app = live_app(true);
    let mut snapshot = fixture::snapshot(3, 120, 4);
    snapshot.conflicts.clear();
    app.handle(data(Data::Snapshot(Box::new(snapshot))));
    press(&mut app, "3");
    check("conflicts_counted_not_listed", &app);
}

/// Five currencies: every system account and every sum is shown, or counted where the
/// terminal has no room for it; tenants' long names are cut in the middle with a `…`.
#[test]
fn balances_many_currencies() {
    let mut app = live_app(true);
    app.handle(data(Data::Accounts(fixture::many_currencies_accounts())));
    press(&mut app, "4");
    for (width, height) in SIZES {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        // Each currency's sum is on screen, or counted among the `+N more`.
        let sums = ["RUB", "USD", "EUR", "JPY", "KWD"]
            .iter()
            .filter(|code| {
                screen.contains(&format!("{code} = 0")) || screen.contains(&format!("{code}=0"))
            })
            .count();
        let counted = screen
            .split("+")
            .skip(1)
            .filter_map(|rest| rest.split(" more").next()?.parse::<usize>().ok())
            .sum::<usize>();
        assert!(
            sums == 5 || counted > 0,
            "a sum is missing uncounted at {width}x{height}:\n{screen}"
        );
        assert!(!screen.contains(&fixture::longest_account()), "{screen}");
    }
    app.handle(Event::Resize(120, 40));
    let screen = render(&app, 120, 40).backend().to_string();
    // The longest name is cut in the middle, marked, and keeps its tenant and its end.
    let longest = screen
        .lines()
        .find(|line| line.contains("shop/xx"))
        .unwrap();
    assert!(
        longest.contains("x…x") && longest.contains("x:wallet"),
        "{screen}"
    );
    for row in ["@payouts", "@world"] {
        assert_eq!(
            screen.matches(row).count(),
            5,
            "every {row} leg at 120x40:\n{screen}"
        );
    }
    check("balances_many_currencies", &app);
}

/// Long keys and accounts in the log are cut in the middle with a `…` only where the room
/// runs out; a rejected refund's amount is in its withdrawal's currency when the dashboard
/// has seen the withdrawal, and in minor units, said so, when it has not.
#[test]
fn log_long_names() {
    let mut app = live_app(true);
    app.handle(data(Data::Facts {
        facts: fixture::long_name_facts(),
        reset: false,
    }));
    press(&mut app, "5");
    app.handle(Event::Resize(120, 40));
    let screen = render(&app, 120, 40).backend().to_string();
    // The payout's key and account, whole or cut with a mark between start and end.
    let payout = screen
        .lines()
        .find(|line| line.contains("Withdrawal") && line.contains("payo"));
    let payout = payout.unwrap_or_else(|| panic!("no payout row:\n{screen}"));
    for name in [fixture::PAYOUT_KEY, fixture::PAYOUT_ACCOUNT] {
        let (start, end) = (&name[..4], &name[name.len() - 3..]);
        let shown = payout.contains(name)
            || payout
                .split_whitespace()
                .any(|w| w.starts_with(start) && w.contains('…') && w.ends_with(end));
        assert!(shown, "{name} cut without a mark:\n{screen}");
    }
    let refund = screen.lines().find(|line| line.contains(" 142 ")).unwrap();
    assert!(refund.contains("1,000.00 RUB"), "{screen}");
    let stranger = screen.lines().find(|line| line.contains(" 143 ")).unwrap();
    assert!(stranger.contains("100,000 minor units"), "{screen}");
    check("log_long_names", &app);
}

/// Keys with long names: the columns give their room to the names that need it, and what
/// is still cut ends in a `…`; a refund row without a currency takes its withdrawal's.
#[test]
fn keys_long_names() {
    let mut app = live_app(true);
    press(&mut app, "2");
    let query = app.key_query();
    app.handle(data(Data::Keys {
        query,
        page: fixture::long_name_keys(),
    }));
    for (width, height) in SIZES {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        // Each key whole, or cut with its mark between its start and its end.
        for key in [fixture::PAYOUT_KEY, "refund-2026-12-08-customer-000123"] {
            let (start, end) = (&key[..4], &key[key.len() - 3..]);
            let shown = screen.lines().any(|line| {
                line.contains(key)
                    || line
                        .split_whitespace()
                        .any(|w| w.starts_with(start) && w.contains('…') && w.ends_with(end))
            });
            assert!(
                shown,
                "{key} cut without a mark at {width}x{height}:\n{screen}"
            );
        }
    }
    app.handle(Event::Resize(120, 40));
    let screen = render(&app, 120, 40).backend().to_string();
    let refund = screen
        .lines()
        .find(|line| line.contains("refund-"))
        .unwrap();
    assert!(refund.contains("1,000.00 RUB"), "{screen}");
    check("keys_long_names", &app);
}

/// The help scrolled to its end: the last words, and how many lines are above.
#[test]
fn help_scrolled_to_the_end() {
    for (width, height) in SIZES {
        let mut app = live_app(true);
        app.handle(Event::Resize(width, height));
        press(&mut app, "?G");
        check_size("help_end", &app, width, height);
    }
}

/// Enter on a conflict opens its key's detail in the keys view, loading, then loaded.
#[test]
fn conflict_opens_its_key() {
    let mut app = live_app(true);
    press(&mut app, "3j<Enter>");
    check_size("conflict_opens_key_loading", &app, 120, 40);
    let mut record = fixture::keys_page().keys[2].clone();
    record.fact = Some(serde_json::json!({"seq": 131, "type": "WithdrawalRecorded",
        "at": "2026-11-30T11:58:00.000Z"}));
    app.handle(data(Data::KeyDetail(Box::new(record))));
    check("conflict_opens_key", &app);
}

/// `text` is on `screen` whole, or cut with its mark: a name in its middle (a word
/// `start…end` of its start and its end), a code or a payload at its end (`start…`).
fn whole_or_marked(screen: &str, text: &str, middle: bool) -> bool {
    // The backend quotes each line of the screen.
    screen.contains(text)
        || screen
            .lines()
            .map(|line| line.strip_prefix('"').unwrap_or(line))
            .map(|line| line.strip_suffix('"').unwrap_or(line))
            .flat_map(|line| line.split(|c: char| c.is_whitespace() || c == '│'))
            .filter_map(|word| word.split_once('…'))
            .any(|(head, tail)| {
                !head.is_empty()
                    && text.starts_with(head)
                    && if middle {
                        !tail.is_empty() && text.ends_with(tail)
                    } else {
                        tail.is_empty()
                    }
            })
}

/// Conflicts and quarantined messages with the longest names: a 255-byte key under a
/// 64-byte client, a long message id, reason and payload (the payload names a 129-byte
/// account). Every column is as wide as its content while there is room, and whatever is
/// cut is marked with a `…`: names in their middle, the rest at its end.
#[test]
fn conflicts_long_names() {
    let mut app = live_app(true);
    app.handle(data(Data::Snapshot(
        Box::new(fixture::long_name_snapshot()),
    )));
    app.handle(data(Data::Quarantine(fixture::long_name_quarantine())));
    press(&mut app, "3");
    let key = fixture::longest_key();
    let client = fixture::longest_client();
    let payload = fixture::long_payload();
    for (width, height) in SIZES {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        let at = format!("at {width}x{height}:\n{screen}");
        // No terminal holds the key whole; it keeps its start and its end.
        assert!(!screen.contains(&key), "{at}");
        assert!(whole_or_marked(&screen, &key, true), "key {at}");
        assert!(
            whole_or_marked(&screen, "account,amount,currency", false),
            "differs {at}"
        );
        if width < 80 {
            // Neither the client column nor the quarantine has room at 40x12.
            continue;
        }
        assert!(whole_or_marked(&screen, &client, true), "client {at}");
        assert!(
            whole_or_marked(&screen, fixture::LONG_MESSAGE_ID, true),
            "message id {at}"
        );
        assert!(
            whole_or_marked(&screen, fixture::LONG_REASON_CODE, false),
            "reason {at}"
        );
        assert!(!screen.contains(&payload), "{at}");
        assert!(whole_or_marked(&screen, &payload, false), "payload {at}");
        assert!(screen.contains("not json"), "{at}");
    }
    check("conflicts_long_names", &app);
}

/// The rows a table's title says are on screen (`12–30 of 30`): first, last, total.
fn title_range(screen: &str) -> Option<(usize, usize, usize)> {
    range_in(screen.lines().nth(1)?)
}

/// The rows `line` says are on screen (`12–30 of 30`): first, last, total.
fn range_in(line: &str) -> Option<(usize, usize, usize)> {
    let (before, after) = line.split_once('–')?;
    let digits_before: String = before
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let last: String = after.chars().take_while(char::is_ascii_digit).collect();
    let total: String = after[last.len()..]
        .strip_prefix(" of ")?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((
        digits_before.parse().ok()?,
        last.parse().ok()?,
        total.parse().ok()?,
    ))
}

/// The numbers that follow `prefix` on the screen's lines, top to bottom: the rows a
/// table shows, by the number in their key.
fn row_numbers(screen: &str, prefix: &str) -> Vec<usize> {
    screen
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(prefix)?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// A keys page of 200 rows scrolled to its 31st: the title says which rows of the page
/// are on screen, and they are those rows.
#[test]
fn keys_more_than_fit() {
    let mut app = live_app(true);
    press(&mut app, "2");
    let query = app.key_query();
    app.handle(data(Data::Keys {
        query,
        page: fixture::full_keys_page(),
    }));
    press(&mut app, &"j".repeat(30));
    for (width, height, first) in [(80, 24, 13), (120, 40, 1), (40, 12, 24)] {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        let (shown_first, last, total) =
            title_range(&screen).unwrap_or_else(|| panic!("no rows in the title:\n{screen}"));
        assert_eq!(total, 200, "{screen}");
        assert_eq!(shown_first, first, "{screen}");
        // The selected row, the 31st, is the last on screen unless all up to it fit.
        assert_eq!(
            last,
            (first + row_numbers(&screen, "key-").len() - 1),
            "{screen}"
        );
        assert!(last >= 31, "{screen}");
        assert_eq!(
            row_numbers(&screen, "key-"),
            (shown_first..=last).collect::<Vec<_>>(),
            "{screen}"
        );
    }
    check("keys_more_than_fit", &app);
}

/// The log scrolled up from its end: the title says which facts are on screen, and they
/// are those; where all 30 fit, it counts them.
#[test]
fn log_scrolled() {
    let mut app = live_app(true);
    press(&mut app, "5kkkkkkkkkk");
    assert!(!app.follow_log);
    for (width, height) in SIZES {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        // Facts 111 to 140 are rows 1 to 30; the 20th is selected.
        let rows: Vec<usize> = row_numbers(&screen, "k-").iter().map(|n| n - 110).collect();
        match title_range(&screen) {
            Some((first, last, total)) => {
                assert_eq!((last, total), (20, 30), "{screen}");
                assert_eq!(rows, (first..=last).collect::<Vec<_>>(), "{screen}");
            }
            None => {
                assert!(screen.contains("Log · 30 facts"), "{screen}");
                assert_eq!(rows, (1..=30).collect::<Vec<_>>(), "{screen}");
            }
        }
    }
    check("log_scrolled", &app);
}

/// 50 conflicts and 20 quarantined messages, the 21st conflict selected: the line above
/// the conflicts and the quarantine's title say which rows are on screen, and they are
/// those rows.
#[test]
fn conflicts_more_than_fit() {
    let mut app = live_app(true);
    app.handle(data(Data::Snapshot(Box::new(
        fixture::many_conflicts_snapshot(),
    ))));
    app.handle(data(Data::Quarantine(fixture::full_quarantine())));
    press(&mut app, &format!("3{}", "j".repeat(20)));
    for (width, height, first, quarantined) in [
        (80, 24, 15, Some(8)),
        (120, 40, 7, Some(16)),
        (40, 12, 15, None),
    ] {
        app.handle(Event::Resize(width, height));
        let screen = render(&app, width, height).backend().to_string();
        let listed = screen.lines().nth(2).unwrap();
        assert_eq!(range_in(listed), Some((first, 21, 50)), "{screen}");
        assert_eq!(
            row_numbers(&screen, "cf-"),
            (first..=21).collect::<Vec<_>>(),
            "{screen}"
        );
        let title = screen.lines().find(|line| line.contains("Quarantined"));
        match quarantined {
            Some(last) => {
                let title = title.unwrap_or_else(|| panic!("no quarantine:\n{screen}"));
                assert_eq!(range_in(title), Some((1, last, 20)), "{screen}");
                assert_eq!(
                    row_numbers(&screen, "mq-"),
                    (1..=last).collect::<Vec<_>>(),
                    "{screen}"
                );
            }
            None => assert!(title.is_none(), "{screen}"),
        }
    }
    check("conflicts_more_than_fit", &app);
}

/// A worker with more accounts than the dashboard reads: the view says so in the
/// accounts' title, rather than showing the first ones as if they were all.
#[test]
fn balances_say_when_more_accounts_exist_than_were_read() {
    let mut app = live_app(true);
    let mut page = fixture::accounts();
    page.next = Some(ledger_tui::sanitize::Clean::new("zed"));
    app.handle(data(Data::Accounts(page)));
    press(&mut app, "4");
    let screen = render(&app, 120, 40).backend().to_string();
    assert!(screen.contains("more not read"), "{screen}");
    let mut page = fixture::accounts();
    page.next = None;
    app.handle(data(Data::Accounts(page)));
    let screen = render(&app, 120, 40).backend().to_string();
    assert!(!screen.contains("more not read"), "{screen}");
}
