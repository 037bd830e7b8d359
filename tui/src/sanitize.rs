//! Client text made safe to draw.
//!
//! Keys, accounts and client names come from whoever sends commands. A key such as
//! `"\x1b[2J"` must not clear the operator's screen, and a right-to-left override must
//! not make one key look like another. So every such string is cleaned once, while the
//! feed is parsed, and the rest of the dashboard only ever holds the clean form.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// Removes control characters (C0, DEL, C1, which covers ESC and the 8-bit CSI) and the
/// invisible format characters that reorder or hide text. Tabs and line breaks become a
/// space so that words stay apart; everything else that is not drawable is dropped.
pub fn sanitize(raw: &str) -> String {
    raw.chars()
        .filter_map(|c| match c {
            '\t' | '\n' | '\r' => Some(' '),
            c if c.is_control() || is_invisible_format(c) => None,
            c => Some(c),
        })
        .collect()
}

/// Bidirectional overrides and isolates, zero-width characters and the byte order mark:
/// drawn as nothing, they let two different strings look the same.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

/// A string that has been through [`sanitize`]. Model fields that a client can
/// influence have this type, so raw client text cannot reach `draw` by accident.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Clean(String);

impl Clean {
    pub fn new(raw: &str) -> Clean {
        Clean(sanitize(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Clean {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Clean {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Clean, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(Clean::new(&raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_lose_their_escape() {
        assert_eq!(sanitize("ord-1\u{1b}[2J"), "ord-1[2J");
        assert_eq!(sanitize("a\u{9b}31mb"), "a31mb");
        assert_eq!(sanitize("line\nbreak\ttab"), "line break tab");
        assert_eq!(sanitize("abc\u{202E}fed"), "abcfed");
        assert_eq!(sanitize("plain ord-8831 Ünïcode"), "plain ord-8831 Ünïcode");
    }
}
