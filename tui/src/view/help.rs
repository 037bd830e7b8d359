//! The help overlay: the keys, and what the words on screen mean. It scrolls, and its last
//! line says how much is above or below, so nothing of it is hidden without a word.

use super::*;

const KEYS: &[(&str, &str)] = &[
    ("Tab Shift-Tab 1-5", "switch view"),
    ("j k ↑ ↓", "move"),
    ("PgUp PgDn Home End", "jump"),
    (
        "/",
        "filter: Enter applies, Esc cancels, Ctrl-U clears (also once applied). \
         Keys: status:pending client:NAME text",
    ),
    (
        "Enter",
        "Keys: open or close the key's detail. Conflicts: open the conflict's key",
    ),
    (
        "Esc",
        "back: closes the detail (to the conflicts, if opened there), the filter being \
         typed, this help. It never quits",
    ),
    ("[ ]", "previous / next page of keys"),
    (
        "s",
        "sort: keys newest first or by key; conflicts newest, by client or by key; \
         balances by account, currency, or balance within each currency",
    ),
    ("p", "pause / resume the display"),
    ("?", "this help"),
    ("q Ctrl-C", "quit"),
];

const WORDS: &[(&str, &str)] = &[
    (
        "pending",
        "a request holds the key and its command is being decided; nothing is written \
         yet. pending! : the claim's lease ran out (the attempt may have died), and a retry \
         takes the key over",
    ),
    (
        "done",
        "decided and written, applied or rejected; a retry gets the stored answer",
    ),
    (
        "expired",
        "done, and the stored answer swept after the retention; a retry is still \
         answered from the fact and moves nothing",
    ),
    (
        "409 in flight",
        "a repeat came while the first attempt still held the key: it was told to retry \
         (request_in_progress); nothing ran twice",
    ),
    (
        "422 reused",
        "the key came back with another command (differs names the fields): refused, \
         nothing changed. A business rejection (insufficient_funds, ...) is also a 422, \
         but it is the key's own outcome, shown in Keys",
    ),
    (
        "replayed",
        "a repeat of a done key, answered with its stored answer instead of running \
         again; the sparkline counts them per second, Totals since counting began",
    ),
    (
        "duplicates absorbed",
        "the same count as Totals' replayed: repeats that moved no money a second time. \
         409s and 422s are counted apart",
    ),
    (
        "↑ +8  ↓ -3  = 0",
        "the trend: how much a key count changed in the last 10 seconds",
    ),
    (
        "✓ ✗",
        "a currency's balances sum to 0, as every movement has two legs, or they do not",
    ),
    (
        "on disk",
        "sled: the index's files (sled's data file), not the journal's preallocated \
         segments; PostgreSQL: the schema's tables, indexes and sequences",
    ),
    (
        "since the worker started",
        "counted in the worker's memory: back to 0 when it restarts",
    ),
];

/// The popup for a terminal of `width` x `height` cells.
fn popup(width: u16, height: u16, lines: usize) -> Rect {
    let area = Rect::new(0, 0, width, height);
    // Two borders and the line that says what is above or below.
    let needed = u16::try_from(lines + 3).unwrap_or(u16::MAX);
    let [popup] = Layout::horizontal([Constraint::Length(width.saturating_sub(2).min(76))])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::vertical([Constraint::Length(height.min(needed))])
        .flex(Flex::Center)
        .areas(popup);
    popup
}

/// The help's lines for `width` cells: each term in its column, its words wrapped under
/// themselves; a term too long for the column has a line of its own.
fn help_lines(width: u16, theme: Theme) -> Vec<Line<'static>> {
    let inner = usize::from(width.saturating_sub(4).min(74));
    let term_width = if inner >= 60 { 20 } else { 11 };
    let room = inner.saturating_sub(term_width).max(1);
    let mut lines = Vec::new();
    for (title, entries) in [("Keys", KEYS), ("What the screen says", WORDS)] {
        if !lines.is_empty() {
            lines.push(Line::raw(""));
        }
        lines.push(Line::styled(title, theme.bold()));
        for (term, what) in entries {
            let alone = cells(term) >= term_width;
            if alone {
                lines.push(Line::styled(*term, theme.header()));
            }
            for (i, row) in wrap(what, room).into_iter().enumerate() {
                let label = if i == 0 && !alone {
                    format!("{term:<term_width$}")
                } else {
                    " ".repeat(term_width)
                };
                lines.push(Line::from(vec![
                    Span::styled(label, theme.header()),
                    Span::raw(row),
                ]));
            }
        }
    }
    lines
}

/// `text` in lines of at most `width` cells, broken between words; a word longer than a
/// line is split.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let needed = if line.is_empty() {
            cells(word)
        } else {
            cells(&line) + 1 + cells(word)
        };
        if needed <= width {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        for c in word.chars() {
            if cells(&line) + cells(&c.to_string()) > width && !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            line.push(c);
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// How far the help scrolls on a terminal of `width` x `height`: its lines less those
/// shown at once.
pub fn help_scroll_max(width: u16, height: u16) -> usize {
    let lines = help_lines(width, Theme { color: false }).len();
    let shown = usize::from(popup(width, height, lines).height.saturating_sub(3));
    lines.saturating_sub(shown)
}

pub(super) fn draw_help(frame: &mut Frame, area: Rect, scroll: usize, theme: Theme) {
    let lines = help_lines(area.width, theme);
    let popup = popup(area.width, area.height, lines.len());
    let popup = Rect {
        x: area.x + popup.x,
        y: area.y + popup.y,
        ..popup
    };
    frame.render_widget(Clear, popup);
    let block = Block::bordered().title(Span::styled(" Help ", theme.bold()));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let [text, status] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(1)]).areas(inner);
    let shown = usize::from(text.height);
    let scroll = scroll.min(lines.len().saturating_sub(shown));
    let below = lines.len().saturating_sub(scroll + shown);
    let visible: Vec<Line> = lines.into_iter().skip(scroll).take(shown).collect();
    frame.render_widget(Paragraph::new(visible), text);
    let width = usize::from(status.width);
    let more = |arrow: &str, n: usize, word: &str| {
        Parts::new()
            .text(arrow)
            .count(usize_units(n), "line", "lines")
            .text(word)
    };
    let line = match (scroll, below) {
        (0, 0) => Parts::from("Esc or any key closes this help"),
        (_, 0) => Parts::first_fitting(
            width,
            vec![
                more("↑ ", scroll, " above · k scrolls back · Esc closes"),
                more("↑ ", scroll, " above · Esc closes"),
                more("↑ ", scroll, " above"),
            ],
        ),
        _ => Parts::first_fitting(
            width,
            vec![
                more("↓ ", below, " below · j scrolls · Esc closes"),
                more("↓ ", below, " below · j scrolls"),
                more("↓ ", below, " below"),
            ],
        ),
    };
    frame.render_widget(
        Paragraph::new(restyle(line.line(width), theme.dim())),
        status,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wrap_within_the_width() {
        assert_eq!(wrap("a bb ccc", 4), ["a bb", "ccc"]);
        assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
        assert_eq!(wrap("", 3), [""]);
        for line in wrap(WORDS[4].1, 25) {
            assert!(cells(&line) <= 25, "{line}");
        }
    }

    /// Every term and every word of the help can be scrolled to at the smallest size.
    #[test]
    fn the_help_scrolls_to_its_end_at_40x12() {
        let lines = help_lines(40, Theme { color: false }).len();
        // 12 rows: 2 borders, the status line, 9 of text.
        assert_eq!(help_scroll_max(40, 12), lines - 9);
        // Tall enough for every line, it does not scroll; one row fewer, by one line.
        let lines = help_lines(120, Theme { color: false }).len();
        let rows = u16::try_from(lines + 3).unwrap_or(u16::MAX);
        assert_eq!(help_scroll_max(120, rows), 0);
        assert_eq!(help_scroll_max(120, rows - 1), 1);
    }
}
