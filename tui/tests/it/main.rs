//! The one integration-test binary of ledger-tui: screens, key sequences, the sanitizer,
//! and the end-to-end run in tmux against a real worker.
#![allow(clippy::unwrap_used)]

mod fixture;
mod render;
mod sanitize;
mod state;
mod tmux;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ledger_tui::{App, Event};

/// Presses keys: plain characters, or names in angle brackets
/// (`<Enter>`, `<Esc>`, `<Tab>`, `<BackTab>`, `<Up>`, `<Down>`, `<PgUp>`, `<PgDn>`,
/// `<Home>`, `<End>`, `<BS>`, `<C-c>`, `<C-u>`, `<C-j>`).
pub fn press(app: &mut App, keys: &str) {
    let mut rest = keys;
    while let Some(c) = rest.chars().next() {
        let (key, len) = if c == '<' && rest.len() > 1 && rest.contains('>') {
            let end = rest.find('>').unwrap();
            let name = &rest[1..end];
            let key = match name {
                "Enter" => KeyEvent::from(KeyCode::Enter),
                "Esc" => KeyEvent::from(KeyCode::Esc),
                "Tab" => KeyEvent::from(KeyCode::Tab),
                "BackTab" => KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT),
                "Up" => KeyEvent::from(KeyCode::Up),
                "Down" => KeyEvent::from(KeyCode::Down),
                "PgUp" => KeyEvent::from(KeyCode::PageUp),
                "PgDn" => KeyEvent::from(KeyCode::PageDown),
                "Home" => KeyEvent::from(KeyCode::Home),
                "End" => KeyEvent::from(KeyCode::End),
                "BS" => KeyEvent::from(KeyCode::Backspace),
                "C-c" => KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
                "C-u" => KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL),
                "C-j" => KeyEvent::new(KeyCode::Char('j'), KeyModifiers::CONTROL),
                other => panic!("unknown key name <{other}>"),
            };
            (key, end + 1)
        } else {
            (KeyEvent::from(KeyCode::Char(c)), c.len_utf8())
        };
        app.handle(Event::Key(key));
        rest = &rest[len..];
    }
}
