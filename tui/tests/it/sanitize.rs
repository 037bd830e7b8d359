//! The sanitizer: no control or escape character survives, on its own or on screen.

use ledger_tui::app::Data;
use ledger_tui::model::KeysPage;
use ledger_tui::sanitize::Clean;
use ledger_tui::{App, draw, sanitize};
use proptest::prelude::*;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::fixture::{self, data};
use crate::press;

fn is_forbidden(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Strings rich in what attackers use: C0, ESC sequences, DEL, C1 (CSI, OSC), bidi.
fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        any::<char>().prop_map(String::from),
        (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap().to_string()),
        (0x7fu32..0xa0).prop_map(|c| char::from_u32(c).unwrap().to_string()),
        Just("\u{1b}[2J".to_string()),
        Just("\u{1b}]0;title\u{7}".to_string()),
        Just("\u{202E}".to_string()),
        "[ -~]{1,8}",
    ];
    proptest::collection::vec(piece, 0..16).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn no_control_or_escape_survives(raw in hostile()) {
        let clean = sanitize(&raw);
        prop_assert!(!clean.chars().any(is_forbidden), "{clean:?}");
        prop_assert!(!clean.bytes().any(|b| b < 0x20 || b == 0x7f), "{clean:?}");
        // Cleaning twice changes nothing more.
        prop_assert_eq!(sanitize(&clean), clean.clone());
    }

    #[test]
    fn visible_ascii_keys_are_untouched(key in "[!-~]{1,255}") {
        prop_assert_eq!(sanitize(&key), key);
    }

    #[test]
    fn parsed_feed_strings_are_clean(raw in hostile()) {
        let json = serde_json::to_string(&raw).unwrap();
        let clean: Clean = serde_json::from_str(&json).unwrap();
        prop_assert!(!clean.as_str().chars().any(is_forbidden));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// End to end: hostile keys in the feed, every view drawn, nothing hostile on screen.
    #[test]
    fn hostile_keys_never_reach_the_screen(client in hostile(), key in hostile()) {
        let record = serde_json::json!({"client": client, "key": key, "status": "done",
            "command": "deposit", "account": key, "currency": client,
            "outcome": {"key": key}});
        let page: KeysPage =
            serde_json::from_value(serde_json::json!({"keys": [record]})).unwrap();
        let mut app = App::new(fixture::SERVER, true);
        app.handle(data(Data::Snapshot(Box::new(fixture::snapshot(1, 1, 1)))));
        app.handle(data(Data::Keys { query: app.key_query(), page }));
        for keys in ["1", "2", "<Enter>", "3", "4", "5"] {
            press(&mut app, keys);
            let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
            terminal.draw(|frame| draw(frame, &app)).unwrap();
            let screen = terminal.backend().to_string();
            prop_assert!(!screen.chars().any(|c| c != '\n' && is_forbidden(c)));
        }
    }
}
