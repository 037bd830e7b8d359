//! Key sequences in, state out.

use ledger_tui::app::{BalanceSort, Connection, Data, KeyQuery, KeySort, STALE_TICKS, View};
use ledger_tui::model::KeyStatus;
use ledger_tui::{App, Event};

use crate::fixture::{self, data, live_app};
use crate::press;

#[test]
fn views_switch_by_number_and_tab() {
    let mut app = live_app(true);
    for (keys, view) in [
        ("2", View::Keys),
        ("<Tab>", View::Conflicts),
        ("<BackTab><BackTab>", View::Overview),
        ("<BackTab>", View::Log),
        ("<Tab>", View::Overview),
        ("4", View::Balances),
        ("5", View::Log),
        ("1", View::Overview),
        ("9", View::Overview),
    ] {
        press(&mut app, keys);
        assert_eq!(app.view, view, "after {keys}");
    }
}

#[test]
fn quit_keys() {
    for keys in ["q", "<C-c>", "?q", "/abc<C-c>", "2<Enter><C-c>"] {
        let mut app = live_app(true);
        press(&mut app, keys);
        assert!(app.quit, "{keys} should quit");
    }
    // Esc goes back and never out, however often it is pressed, from any view.
    for keys in [
        "/q",
        "<Esc>",
        "<Esc><Esc><Esc>",
        "?<Esc><Esc>",
        "2<Enter><Esc><Esc>",
        "/x<Esc><Esc>",
        "3<Enter><Esc><Esc>",
        "45<Esc>",
    ] {
        let mut app = live_app(true);
        press(&mut app, keys);
        assert!(!app.quit, "{keys} should not quit");
    }
    let mut app = live_app(true);
    app.handle(Event::Shutdown);
    assert!(app.quit);
}

#[test]
fn moving_in_tables() {
    let mut app = live_app(true);
    press(&mut app, "2");
    let rows = app.row_count(View::Keys);
    assert_eq!(rows, 6);
    for (keys, selected) in [
        ("jjj", 3),
        ("k", 2),
        ("<Down><Down>", 4),
        ("<Up>", 3),
        ("<End>", 5),
        ("j", 5),
        ("<Home>", 0),
        ("k", 0),
        ("<PgDn>", 5),
        ("<PgUp>", 0),
        ("G", 5),
        ("g", 0),
    ] {
        press(&mut app, keys);
        assert_eq!(app.selected[View::Keys.index()], selected, "after {keys}");
    }
    // Selections are per view.
    press(&mut app, "jj4j");
    assert_eq!(app.selected[View::Keys.index()], 2);
    assert_eq!(app.selected[View::Balances.index()], 1);
}

#[test]
fn filter_is_typed_applied_and_sent_to_the_server() {
    let mut app = live_app(true);
    press(&mut app, "2/status:pending c:shop ord");
    assert_eq!(app.input.as_deref(), Some("status:pending c:shop ord"));
    assert_eq!(app.filter(View::Keys), "", "not applied before Enter");
    press(&mut app, "<BS><BS><Enter>");
    assert_eq!(app.input, None);
    assert_eq!(app.filter(View::Keys), "status:pending c:shop o");
    let query = app.wants().keys;
    assert_eq!(
        query,
        KeyQuery {
            sort: KeySort::Newest,
            status: Some(KeyStatus::Pending),
            client: Some("shop".into()),
            text: Some("o".into()),
            after: None,
            limit: 200,
        }
    );
    // The old page belonged to the old filter.
    assert_eq!(app.feed.keys, None);
    // A late page for the old query is dropped, one for the new query is shown.
    app.handle(data(Data::Keys {
        query: KeyQuery::parse(""),
        page: fixture::keys_page(),
    }));
    assert_eq!(app.feed.keys, None);
    app.handle(data(Data::Keys {
        query,
        page: fixture::keys_page(),
    }));
    assert_eq!(app.row_count(View::Keys), 6);
}

#[test]
fn filter_escape_keeps_the_old_filter() {
    let mut app = live_app(true);
    press(&mut app, "3/shop<Enter>");
    assert_eq!(app.filter(View::Conflicts), "shop");
    assert_eq!(app.row_count(View::Conflicts), 2);
    press(&mut app, "/xyz<Esc>");
    assert_eq!(app.filter(View::Conflicts), "shop");
    press(&mut app, "/<BS><BS><BS><BS><Enter>");
    assert_eq!(app.row_count(View::Conflicts), 4);
}

#[test]
fn slash_on_the_overview_filters_keys() {
    let mut app = live_app(true);
    press(&mut app, "/ord<Enter>");
    assert_eq!(app.view, View::Keys);
    assert_eq!(app.key_query().text.as_deref(), Some("ord"));
}

#[test]
fn help_closes_on_any_key_without_acting() {
    let mut app = live_app(true);
    press(&mut app, "2?");
    assert!(app.help);
    press(&mut app, "x");
    assert!(!app.help);
    press(&mut app, "?<Esc>");
    assert!(!app.help && !app.quit);
    assert_eq!(app.selected[View::Keys.index()], 0);
    assert_eq!(app.view, View::Keys);
}

/// The help scrolls with the keys that move elsewhere, within what it has, and opens at
/// its top again.
#[test]
fn help_scrolls_within_its_lines() {
    let mut app = live_app(true);
    app.handle(Event::Resize(40, 12));
    let max = ledger_tui::view::help_scroll_max(40, 12);
    assert!(max > 0, "at 40x12 the help has more lines than rows");
    press(&mut app, "?jjj");
    assert!(app.help);
    assert_eq!(app.help_scroll, 3);
    press(&mut app, "k<End>");
    assert_eq!(app.help_scroll, max);
    press(&mut app, "j<PgDn>");
    assert_eq!(app.help_scroll, max, "not past its last line");
    press(&mut app, "<Home>");
    assert_eq!(app.help_scroll, 0);
    press(&mut app, "G<Esc>?");
    assert_eq!(app.help_scroll, 0);
    // Nothing moved underneath.
    assert_eq!(app.selected[View::Overview.index()], 0);
}

/// Ctrl-U empties the filter being typed, and clears an applied one; other Ctrl chords
/// are not typed into the filter and do not act as their letter.
#[test]
fn ctrl_u_clears_the_filter() {
    let mut app = live_app(true);
    press(&mut app, "3/shop<C-u>ord<C-j>");
    assert_eq!(app.input.as_deref(), Some("ord"));
    press(&mut app, "<C-u><Enter>");
    assert_eq!(app.filter(View::Conflicts), "");
    press(&mut app, "/shop<Enter>");
    assert_eq!(app.row_count(View::Conflicts), 2);
    press(&mut app, "<C-u>");
    assert_eq!(app.filter(View::Conflicts), "");
    assert_eq!(app.row_count(View::Conflicts), 4);
    assert_eq!(app.input, None);
    // Ctrl-J is not `j`.
    press(&mut app, "<C-j>");
    assert_eq!(app.selected[View::Conflicts.index()], 0);
    press(&mut app, "j");
    assert_eq!(app.selected[View::Conflicts.index()], 1);
}

/// Enter on a conflict opens its key in the keys view, asked of the worker by name even
/// when the keys page does not hold it; Esc goes back to the conflicts.
#[test]
fn enter_on_a_conflict_opens_its_key() {
    let mut app = live_app(true);
    // The second conflict is shop/ord-2's, which this page does not hold: the detail is
    // asked of the worker by its name.
    let query = app.key_query();
    let mut page = fixture::keys_page();
    page.keys.retain(|k| k.key.as_str() != "ord-2");
    app.handle(data(Data::Keys { query, page }));
    press(&mut app, "3j");
    press(&mut app, "<Enter>");
    assert_eq!(app.view, View::Keys);
    assert!(app.detail_open);
    assert_eq!(app.wants().detail, Some(("shop".into(), "ord-2".into())));
    assert_eq!(app.back, Some(View::Conflicts));
    assert!(app.opened_record().is_none(), "not loaded yet");
    let mut record = fixture::keys_page().keys[2].clone();
    record.fact = Some(serde_json::json!({"seq": 131, "type": "WithdrawalRecorded"}));
    app.handle(data(Data::KeyDetail(Box::new(record))));
    assert_eq!(app.opened_record().map(|r| r.key.as_str()), Some("ord-2"));
    press(&mut app, "<Esc>");
    assert_eq!(app.view, View::Conflicts);
    assert!(!app.detail_open && !app.quit);
    assert_eq!(app.wants().detail, None);
    assert_eq!(app.selected[View::Conflicts.index()], 1);
    // Moving in the keys leaves the opened key: the detail follows the selection, and
    // Esc then only closes it.
    press(&mut app, "<Enter>j");
    assert_eq!(app.opened, None);
    assert_eq!(app.wants().detail, Some(("shop".into(), "ord-8831".into())));
    press(&mut app, "<Esc>");
    assert_eq!(app.view, View::Keys);
    assert!(!app.detail_open);
}

#[test]
fn detail_pane_asks_for_the_selected_key() {
    let mut app = live_app(true);
    press(&mut app, "2jj<Enter>");
    assert!(app.detail_open);
    assert_eq!(app.wants().detail, Some(("shop".into(), "ord-2".into())));
    press(&mut app, "<Esc>");
    assert!(!app.detail_open && !app.quit);
    assert_eq!(app.wants().detail, None);
}

#[test]
fn key_pages_follow_the_server_cursor() {
    let mut app = live_app(true);
    press(&mut app, "2]");
    assert_eq!(app.key_query().after.as_deref(), Some("cursor-6"));
    assert_eq!(app.feed.keys.as_ref().map(|p| p.keys.len()), Some(6));
    press(&mut app, "[");
    assert_eq!(app.key_query().after, None);
    press(&mut app, "[");
    assert_eq!(app.key_query().after, None);
}

#[test]
fn pause_freezes_the_screen_not_the_feed() {
    let mut app = live_app(true);
    press(&mut app, "p");
    assert!(app.paused());
    app.handle(data(Data::Snapshot(Box::new(fixture::snapshot(9, 130, 4)))));
    assert_eq!(app.shown().snapshot.as_ref().unwrap().keys.pending, 3);
    assert_eq!(app.feed.snapshot.as_ref().unwrap().keys.pending, 9);
    press(&mut app, "p");
    assert_eq!(app.shown().snapshot.as_ref().unwrap().keys.pending, 9);
}

#[test]
fn log_follows_until_scrolled_up() {
    let mut app = live_app(true);
    press(&mut app, "5");
    assert_eq!(app.selected[View::Log.index()], 29);
    app.handle(data(Data::Facts {
        facts: fixture::facts(141, 145),
        reset: false,
    }));
    assert_eq!(app.selected[View::Log.index()], 34);
    press(&mut app, "kk");
    assert!(!app.follow_log);
    app.handle(data(Data::Facts {
        facts: fixture::facts(146, 150),
        reset: false,
    }));
    assert_eq!(app.selected[View::Log.index()], 32);
    // Facts already seen are not appended twice.
    app.handle(data(Data::Facts {
        facts: fixture::facts(140, 150),
        reset: false,
    }));
    assert_eq!(app.row_count(View::Log), 40);
    press(&mut app, "<End>");
    assert!(app.follow_log);
    assert_eq!(app.selected[View::Log.index()], 39);
}

#[test]
fn sort_cycles_balances() {
    let mut app = live_app(true);
    press(&mut app, "4");
    let names = |app: &App| -> Vec<String> {
        app.visible_accounts()
            .0
            .iter()
            .map(|a| format!("{} {}", a.account, a.balance))
            .collect()
    };
    assert_eq!(
        names(&app),
        [
            "alice 700",
            "bob 12000",
            "carol 5000",
            "dave 0",
            "mallory]0;pwned 300"
        ]
    );
    // By balance within each currency: minor units of RUB and USD are not compared.
    press(&mut app, "ss");
    assert_eq!(app.sorts.balances, BalanceSort::BalanceHighFirst);
    assert_eq!(
        names(&app),
        [
            "bob 12000",
            "alice 700",
            "mallory]0;pwned 300",
            "carol 5000",
            "dave 0"
        ]
    );
    press(&mut app, "s");
    assert_eq!(app.sorts.balances, BalanceSort::BalanceLowFirst);
    assert_eq!(
        names(&app),
        [
            "mallory]0;pwned 300",
            "alice 700",
            "bob 12000",
            "dave 0",
            "carol 5000"
        ]
    );
    // System accounts stay apart whatever the sort.
    assert!(app.visible_accounts().1.iter().all(|a| a.is_system()));
    assert_eq!(app.visible_accounts().1.len(), 4);
}

#[test]
fn connection_state_follows_the_feed() {
    let mut app = App::new(fixture::SERVER, true);
    assert_eq!(app.connection, Connection::Connecting);
    app.handle(data(Data::Disconnected {
        error: "refused".into(),
        attempt: 2,
    }));
    assert_eq!(
        app.connection,
        Connection::Disconnected {
            error: "refused".into(),
            attempt: 2
        }
    );
    app.handle(data(Data::Snapshot(Box::new(fixture::snapshot(0, 0, 0)))));
    assert_eq!(app.connection, Connection::Live);
    for _ in 0..STALE_TICKS {
        app.handle(Event::Tick);
    }
    assert_eq!(app.ticks_since_data, STALE_TICKS);
    app.handle(data(Data::Snapshot(Box::new(fixture::snapshot(0, 0, 0)))));
    assert_eq!(app.ticks_since_data, 0);
}

#[test]
fn resize_sets_the_page_size() {
    let mut app = live_app(true);
    app.handle(Event::Resize(80, 9));
    press(&mut app, "5<Home><PgDn>");
    assert_eq!(app.selected[View::Log.index()], 3);
}

/// Keys are by time, newest first, until `s`: then by name, numbers by value. The worker
/// pages in the chosen order, so `s` asks for a first page again.
#[test]
fn sort_switches_keys_between_time_and_name() {
    let mut app = live_app(true);
    press(&mut app, "2");
    assert_eq!(app.sorts.keys, KeySort::Newest);
    assert_eq!(app.wants().keys.sort, KeySort::Newest);
    let keys = |app: &App| -> Vec<String> {
        app.visible_keys()
            .iter()
            .map(|k| k.key.to_string())
            .collect()
    };
    // Smallest age first: the newest.
    assert_eq!(
        keys(&app),
        [
            "dep-77",
            "ord-8831",
            "ord-2",
            "ref-5",
            "evil[2J31m-key",
            "dep-1"
        ]
    );
    press(&mut app, "]jj");
    assert!(app.key_query().after.is_some());
    press(&mut app, "s");
    assert_eq!(app.sorts.keys, KeySort::Key);
    let query = app.wants().keys;
    assert_eq!((query.sort, query.after.as_deref()), (KeySort::Key, None));
    assert_eq!(app.feed.keys, None, "the page in the old order is gone");
    assert_eq!(app.selected[View::Keys.index()], 0);
    assert!(app.key_pages.is_empty());
    // A late page in the old order is dropped.
    app.handle(data(Data::Keys {
        query: KeyQuery {
            sort: KeySort::Newest,
            ..query.clone()
        },
        page: fixture::keys_page(),
    }));
    assert_eq!(app.feed.keys, None);
    let mut page = fixture::keys_page();
    for key in ["big-102", "big-17", "big-9"] {
        let mut record = page.keys[2].clone();
        record.key = ledger_tui::sanitize::Clean::new(key);
        page.keys.push(record);
    }
    app.handle(data(Data::Keys { query, page }));
    assert_eq!(
        keys(&app),
        [
            "big-9",
            "big-17",
            "big-102",
            "dep-1",
            "dep-77",
            "evil[2J31m-key",
            "ord-2",
            "ord-8831",
            "ref-5"
        ]
    );
    press(&mut app, "s");
    assert_eq!(app.sorts.keys, KeySort::Newest);
}

/// Newer keys arriving above keep the selection, and the detail pane, on its key.
#[test]
fn selection_stays_on_its_key_as_newer_keys_arrive() {
    let mut app = live_app(true);
    press(&mut app, "2jj<Enter>");
    assert_eq!(app.wants().detail, Some(("shop".into(), "ord-2".into())));
    let mut page = fixture::keys_page();
    let mut newer = page.keys[2].clone();
    newer.key = ledger_tui::sanitize::Clean::new("ord-3");
    newer.age_ms = 5;
    page.keys.insert(0, newer);
    let query = app.key_query();
    app.handle(data(Data::Keys { query, page }));
    assert_eq!(app.selected[View::Keys.index()], 3);
    assert_eq!(app.wants().detail, Some(("shop".into(), "ord-2".into())));
}

/// On the top row with no detail open, the selection stays on top: the newest key.
#[test]
fn the_top_row_follows_the_newest_key() {
    let mut app = live_app(true);
    press(&mut app, "2");
    assert_eq!(app.selected_key().unwrap().key.as_str(), "dep-77");
    let mut page = fixture::keys_page();
    let mut newer = page.keys[2].clone();
    newer.key = ledger_tui::sanitize::Clean::new("ord-3");
    newer.age_ms = 5;
    page.keys.insert(0, newer);
    let query = app.key_query();
    app.handle(data(Data::Keys { query, page }));
    assert_eq!(app.selected[View::Keys.index()], 0);
    assert_eq!(app.selected_key().unwrap().key.as_str(), "ord-3");
}

/// Paused on a page by key, `s` shows that page by time: the worker's order cannot come
/// until the pause ends, so the ages order it meanwhile.
#[test]
fn a_paused_page_is_ordered_by_age_when_the_order_changes() {
    let mut app = live_app(true);
    press(&mut app, "2s");
    let query = app.key_query();
    app.handle(data(Data::Keys {
        query,
        page: fixture::keys_page(),
    }));
    press(&mut app, "ps");
    assert!(app.paused());
    assert_eq!(app.sorts.keys, KeySort::Newest);
    let ages: Vec<u64> = app.visible_keys().iter().map(|k| k.age_ms).collect();
    assert!(ages.windows(2).all(|pair| pair[0] <= pair[1]), "{ages:?}");
    assert_eq!(app.visible_keys().len(), 6);
}
