//! Fitting numbers into the room the screen has.
//!
//! A terminal cuts what does not fit without a word: a right-aligned `-101000000000000000`
//! in 18 cells reads `101000000000000000`, a left-aligned `100000` in 5 reads `10000`.
//! Both are wrong numbers that look right. So numbers are fitted before they are drawn:
//! all their digits when they fit, scientific notation with the sign and as many digits
//! as fit when they do not (`-1.01e17`), and `#`s when not even that fits. Text around
//! them gives way only after the numbers have been shortened, and then with a visible `…`.

use ratatui::layout::Constraint;
use ratatui::style::Style;
use ratatui::text::{Line, Span};

/// `n` in at most `width` cells: every digit if they fit; else `d.ddde±x` rounded to as
/// many significant digits as fit, trailing zeros dropped (`-1.01e17`); else, in widths
/// too small for any exponent form, `#`s after the sign (`-##`), which say "cut" as a
/// spreadsheet does. The sign is kept whenever two cells or more are given.
pub fn fit_number(n: i128, width: usize) -> String {
    let sign = if n < 0 { "-" } else { "" };
    let digits = n.unsigned_abs().to_string();
    if sign.len() + digits.len() <= width {
        return format!("{sign}{digits}");
    }
    // Fewest digits last: the first form that fits shows the most.
    for shown in (1..digits.len()).rev() {
        let text = scientific(sign, &digits, shown);
        if text.len() <= width {
            return text;
        }
    }
    hashes(sign, width)
}

/// `width` cells of `#` after the sign: a number too wide for any form, marked as cut.
fn hashes(sign: &str, width: usize) -> String {
    match width {
        0 => String::new(),
        1 => "#".to_string(),
        _ => format!("{sign}{}", "#".repeat(width - sign.len())),
    }
}

/// A sequence number in at most `width` cells: all its digits, else `…` and its last
/// digits. Abbreviated, neighbouring seqs would all read `1.8e19`; their last digits are
/// what tells them apart, and the `…` says the front is missing.
pub fn fit_tail(n: u64, width: usize) -> String {
    let digits = n.to_string();
    if digits.len() <= width {
        return digits;
    }
    match width {
        0 => String::new(),
        _ => format!("…{}", &digits[digits.len() - (width - 1)..]),
    }
}

/// The fewest cells [`fit_number`] can show `n` in without `#`s: all of it when it is
/// that short, else its one-digit exponent form (at most 5 cells: `-2e38`).
pub fn shortest(n: i128) -> usize {
    let sign = usize::from(n < 0);
    let digits = n.unsigned_abs().to_string();
    let exact = sign + digits.len();
    if digits.len() == 1 {
        return exact;
    }
    exact.min(scientific(if n < 0 { "-" } else { "" }, &digits, 1).len())
}

/// `digits` (no leading zeros, more than `shown`) rounded half up to `shown` significant
/// digits, as `d.ddde<x>`.
fn scientific(sign: &str, digits: &str, shown: usize) -> String {
    scientific_shifted(sign, digits, shown, 0)
}

/// [`scientific`] of `digits` × 10^-`shift` (minor units shown in major ones); `digits`
/// must have more than `shift` of them, so the exponent stays at zero or above.
fn scientific_shifted(sign: &str, digits: &str, shown: usize, shift: usize) -> String {
    let mut exponent = digits.len() - 1 - shift;
    let mut kept: Vec<u8> = digits.as_bytes()[..shown].to_vec();
    if digits.as_bytes()[shown] >= b'5' {
        // Carry: 9.99|7 becomes 10.00, which is 1.00 one power up.
        let mut i = kept.len();
        loop {
            if i == 0 {
                kept.insert(0, b'1');
                kept.pop();
                exponent += 1;
                break;
            }
            i -= 1;
            if kept[i] == b'9' {
                kept[i] = b'0';
            } else {
                kept[i] += 1;
                break;
            }
        }
    }
    while kept.len() > 1 && kept.last() == Some(&b'0') {
        kept.pop();
    }
    let first = char::from(kept[0]);
    let rest = String::from_utf8_lossy(&kept[1..]);
    if rest.is_empty() {
        format!("{sign}{first}e{exponent}")
    } else {
        format!("{sign}{first}.{rest}e{exponent}")
    }
}

/// `minor` units of `code` as major units in at most `width` cells: grouped
/// (`1,000.00`) when that fits, else ungrouped (`1000.00`), else the major value in the
/// exponent form of [`fit_number`] (`-1.01e15`), else `#`s. A number is never cut
/// silently, and never shown in minor units.
pub fn fit_money(minor: i128, code: &str, width: usize) -> String {
    let grouped = money::format_number(minor, code);
    if grouped.len() <= width {
        return grouped;
    }
    let plain = grouped.replace(',', "");
    if plain.len() <= width {
        return plain;
    }
    let sign = if minor < 0 { "-" } else { "" };
    let digits = minor.unsigned_abs().to_string();
    let shift = money::exponent(code) as usize;
    if digits.len() > shift + 1 {
        for shown in (1..digits.len()).rev() {
            let text = scientific_shifted(sign, &digits, shown, shift);
            if text.len() <= width {
                return text;
            }
        }
    }
    hashes(sign, width)
}

/// The fewest cells [`fit_money`] can show `minor` in without `#`s.
pub fn shortest_money(minor: i128, code: &str) -> usize {
    let full = money::format_number(minor, code).replace(',', "").len();
    let digits = minor.unsigned_abs().to_string();
    let shift = money::exponent(code) as usize;
    if digits.len() <= shift + 1 {
        return full;
    }
    let sign = if minor < 0 { "-" } else { "" };
    full.min(scientific_shifted(sign, &digits, 1, shift).len())
}

/// `n` and a unit after it (`" RUB"`, `"/s"`) in at most `width` cells; the number is
/// fitted into what the unit leaves, and never below its [`shortest`] form, so a unit
/// too long for the cell is what gets cut, not the number.
pub fn fit_with_unit(n: i128, unit: &str, width: usize) -> String {
    let room = width.saturating_sub(cells(unit)).max(shortest(n));
    format!("{}{unit}", fit_number(n, room))
}

/// Display cells of `text`, as ratatui counts them.
pub fn cells(text: &str) -> usize {
    Span::raw(text).width()
}

/// A piece of a line: text, or a number that may be shortened to fit.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String, Style),
    /// Right-aligned in `pad` cells when the line has room for that.
    Number {
        value: i128,
        style: Style,
        pad: usize,
        /// Money: `value` is in minor units of this currency, shown in major units.
        currency: Option<String>,
    },
}

impl Part {
    fn fit(value: i128, currency: Option<&String>, width: usize) -> String {
        match currency {
            Some(code) => fit_money(value, code, width),
            None => fit_number(value, width),
        }
    }

    fn shortest(value: i128, currency: Option<&String>) -> usize {
        match currency {
            Some(code) => shortest_money(value, code),
            None => shortest(value),
        }
    }
}

/// A line of [`Part`]s, built up and then fitted with [`Parts::line`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parts(pub Vec<Part>);

impl Parts {
    pub fn new() -> Parts {
        Parts::default()
    }

    pub fn text(self, text: impl Into<String>) -> Parts {
        self.styled(text, Style::new())
    }

    pub fn styled(mut self, text: impl Into<String>, style: Style) -> Parts {
        self.0.push(Part::Text(text.into(), style));
        self
    }

    pub fn num(self, value: impl Into<i128>) -> Parts {
        self.num_styled(value, Style::new(), 0)
    }

    pub fn num_styled(mut self, value: impl Into<i128>, style: Style, pad: usize) -> Parts {
        self.0.push(Part::Number {
            value: value.into(),
            style,
            pad,
            currency: None,
        });
        self
    }

    /// `n` and its noun, singular for exactly one: `1 fact`, `2 facts`.
    pub fn count(self, n: impl Into<i128>, one: &str, many: &str) -> Parts {
        let n = n.into();
        self.num(n)
            .text(format!(" {}", if n == 1 { one } else { many }))
    }

    /// [`Parts::count`] with the number styled.
    pub fn count_styled(self, n: impl Into<i128>, one: &str, many: &str, style: Style) -> Parts {
        let n = n.into();
        self.num_styled(n, style, 0)
            .styled(format!(" {}", if n == 1 { one } else { many }), style)
    }

    /// The first of `variants` (longest first) that fits `width` cells whole, else the
    /// last, to be fitted by [`Parts::line`]: a line says less rather than end in `…`.
    pub fn first_fitting(width: usize, variants: Vec<Parts>) -> Parts {
        let last = variants.len().saturating_sub(1);
        variants
            .into_iter()
            .enumerate()
            .find(|(i, parts)| *i == last || parts.full_width() <= width)
            .map(|(_, parts)| parts)
            .unwrap_or_default()
    }

    /// `self`, then the parts of `more`.
    pub fn extend(mut self, more: &Parts) -> Parts {
        self.0.extend(more.0.iter().cloned());
        self
    }

    /// `minor` units of `currency`, shown in major units (`1,000.00`), fitted as numbers are.
    pub fn money(self, minor: i128, currency: &str) -> Parts {
        self.money_styled(minor, currency, Style::new())
    }

    pub fn money_styled(mut self, minor: i128, currency: &str, style: Style) -> Parts {
        self.0.push(Part::Number {
            value: minor,
            style,
            pad: 0,
            currency: Some(currency.to_owned()),
        });
        self
    }

    /// The line in at most `width` cells. Padding goes first; then every number is
    /// held to the same number of cells, the largest that lets the line fit, so equal
    /// numbers read alike (never below a number's [`shortest`] form). If the line is
    /// still too long it ends in `…` where it is cut, and a number that would be split
    /// there is left out whole.
    pub fn line(&self, width: usize) -> Line<'static> {
        let full: Vec<usize> = self
            .0
            .iter()
            .map(|part| match part {
                Part::Text(..) => 0,
                Part::Number {
                    value, currency, ..
                } => Part::fit(*value, currency.as_ref(), usize::MAX).len(),
            })
            .collect();
        let padded: Vec<usize> = self
            .0
            .iter()
            .zip(&full)
            .map(|(part, full)| match part {
                Part::Number { pad, .. } => (*pad).max(*full),
                Part::Text(..) => 0,
            })
            .collect();
        let mut room = padded;
        let longest = full.iter().copied().max().unwrap_or(0);
        for cap in (0..=longest).rev() {
            if self.width(&room) <= width {
                break;
            }
            room = self
                .0
                .iter()
                .zip(&full)
                .map(|(part, full)| match part {
                    Part::Number {
                        value, currency, ..
                    } => {
                        let floor = Part::shortest(*value, currency.as_ref());
                        Part::fit(*value, currency.as_ref(), cap.min(*full).max(floor)).len()
                    }
                    Part::Text(..) => 0,
                })
                .collect();
        }
        let spans = self.spans(&room);
        if self.width(&room) <= width {
            return Line::from(spans);
        }
        cut(spans, &self.0, width)
    }

    /// The cells the line takes with every number in full and padded.
    pub fn full_width(&self) -> usize {
        self.0
            .iter()
            .map(|part| match part {
                Part::Text(text, _) => cells(text),
                Part::Number {
                    value,
                    pad,
                    currency,
                    ..
                } => Part::fit(*value, currency.as_ref(), usize::MAX)
                    .len()
                    .max(*pad),
            })
            .sum()
    }

    fn width(&self, room: &[usize]) -> usize {
        self.0
            .iter()
            .zip(room)
            .map(|(part, room)| match part {
                Part::Text(text, _) => cells(text),
                Part::Number { .. } => *room,
            })
            .sum()
    }

    fn spans(&self, room: &[usize]) -> Vec<Span<'static>> {
        self.0
            .iter()
            .zip(room)
            .map(|(part, room)| match part {
                Part::Text(text, style) => Span::styled(text.clone(), *style),
                Part::Number {
                    value,
                    style,
                    currency,
                    ..
                } => Span::styled(
                    format!("{:>room$}", Part::fit(*value, currency.as_ref(), *room)),
                    *style,
                ),
            })
            .collect()
    }
}

impl From<&str> for Parts {
    fn from(text: &str) -> Parts {
        Parts::new().text(text)
    }
}

impl From<String> for Parts {
    fn from(text: String) -> Parts {
        Parts::new().text(text)
    }
}

/// `spans` cut to `width - 1` cells plus `…`; a number's span is kept whole or dropped.
fn cut(spans: Vec<Span<'static>>, parts: &[Part], width: usize) -> Line<'static> {
    let mut left = width.saturating_sub(1);
    let mut kept = Vec::new();
    for (span, part) in spans.into_iter().zip(parts) {
        let span_cells = span.width();
        if span_cells <= left {
            left -= span_cells;
            kept.push(span);
            continue;
        }
        if let Part::Text(..) = part {
            let mut text = String::new();
            for c in span.content.chars() {
                let c_cells = cells(&c.to_string());
                if c_cells > left {
                    break;
                }
                left -= c_cells;
                text.push(c);
            }
            kept.push(Span::styled(text, span.style));
        }
        break;
    }
    if width > 0 {
        kept.push(Span::raw("…"));
    }
    Line::from(kept)
}

/// `label`, then `items` (each a few words, `sep` between two items) word-wrapped into at
/// most `rows` lines of `width` cells, and how many items that shows. Items that do not
/// fit are left out whole and counted at the end (`+2 more`), so no item is shown without
/// its number. An empty `sep` leaves two spaces between items.
pub fn pack(
    label: Span<'static>,
    items: &[Vec<Span<'static>>],
    sep: &str,
    width: usize,
    rows: usize,
) -> (Vec<Line<'static>>, usize) {
    let mut fewest = Vec::new();
    for shown in (0..=items.len()).rev() {
        let mut words = vec![label.clone()];
        for (i, item) in items[..shown].iter().enumerate() {
            if i > 0 {
                words.push(Span::raw(sep.to_string()));
            }
            words.extend(item.iter().cloned());
        }
        if shown < items.len() {
            if shown > 0 {
                words.push(Span::raw(sep.to_string()));
            }
            words.push(Span::raw(format!("+{} more", items.len() - shown)));
        }
        let lines = wrap_words(words, width);
        if lines.len() <= rows {
            return (lines, shown);
        }
        fewest = lines;
    }
    // Not even the label and the count fit: as much of them as does.
    fewest.truncate(rows);
    (fewest, 0)
}

/// Words joined by a space, a new line when the next does not fit; an empty word (a
/// separator) is one more space between its neighbours on a line, and a word longer
/// than a line is split.
fn wrap_words(words: Vec<Span<'static>>, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let mut line: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    // An empty word widens the gap before the next word on the same line.
    let mut gap = 1;
    for word in words {
        let cells = word.width();
        if cells == 0 {
            gap += 1;
            continue;
        }
        if used > 0 && used + gap + cells <= width {
            line.push(Span::raw(" ".repeat(gap)));
            line.push(word);
            used += gap + cells;
            gap = 1;
            continue;
        }
        gap = 1;
        if used > 0 {
            lines.push(Line::from(std::mem::take(&mut line)));
            used = 0;
        }
        // Only text is ever longer than a line: numbers are fitted before they get here.
        let mut piece = String::new();
        for c in word.content.chars() {
            let c_cells = Span::raw(c.to_string()).width();
            if used > 0 && used + c_cells > width {
                line.push(Span::styled(std::mem::take(&mut piece), word.style));
                lines.push(Line::from(std::mem::take(&mut line)));
                used = 0;
            }
            piece.push(c);
            used += c_cells;
        }
        line.push(Span::styled(piece, word.style));
    }
    lines.push(Line::from(line));
    lines
}

/// `text` in at most `width` cells: whole, or cut with a `…` that says so.
pub fn fit_text(text: &str, width: usize) -> String {
    if cells(text) <= width {
        return text.to_string();
    }
    let mut out = String::new();
    for c in text.chars() {
        if cells(&out) + cells(&c.to_string()) + 1 > width {
            break;
        }
        out.push(c);
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// A name (a key, an account, a client) in at most `width` cells: whole, or its start and
/// its end with a `…` between them. Names differ at both ends (`shop/customer-000123:wallet`,
/// `payout-2026-12-07-customer-000123`): the tenant or kind is at the start, the number or
/// the account's part at the end, so the cut goes in the middle, where it is marked.
pub fn fit_middle(text: &str, width: usize) -> String {
    if cells(text) <= width {
        return text.to_string();
    }
    if width <= 2 {
        return fit_text(text, width);
    }
    let room = width - 1;
    let head_room = room.div_ceil(2);
    let mut head = String::new();
    let mut used = 0;
    for c in text.chars() {
        let c_cells = cells(&c.to_string());
        if used + c_cells > head_room {
            break;
        }
        used += c_cells;
        head.push(c);
    }
    // The end gets what the start left, so a wide character there costs no cell.
    let tail_room = room - used;
    let mut tail: Vec<char> = Vec::new();
    let mut tail_used = 0;
    for c in text.chars().rev() {
        let c_cells = cells(&c.to_string());
        if tail_used + c_cells > tail_room {
            break;
        }
        tail_used += c_cells;
        tail.push(c);
    }
    let tail: String = tail.into_iter().rev().collect();
    format!("{head}…{tail}")
}

/// A table column as [`columns`] lays it out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Column {
    /// Text: drawn with `constraint`; [`columns`] counts on at least `min` cells for it.
    Text { constraint: Constraint, min: u16 },
    /// Text of known length (a code, a key, an account): `base` cells, widened towards
    /// `need` (its longest value) after the numbers, the labels sharing the room fairly,
    /// and cut with a `…` ([`fit_text`], [`fit_middle`]) to what it gets.
    Label { base: u16, need: usize },
    /// Numbers: `base` cells, widened towards `need` (its longest value) while the text
    /// columns keep their minimum. Amounts widen first; sequence numbers, which are cut
    /// to their last digits ([`fit_tail`]) rather than abbreviated, get what is left.
    Number { base: u16, need: usize, seq: bool },
}

impl Column {
    pub fn fixed(width: u16) -> Column {
        Column::Text {
            constraint: Constraint::Length(width),
            min: width,
        }
    }

    pub fn text(constraint: Constraint, min: u16) -> Column {
        Column::Text { constraint, min }
    }

    pub fn number(base: u16, need: usize) -> Column {
        Column::Number {
            base,
            need,
            seq: false,
        }
    }

    pub fn label(base: u16, need: usize) -> Column {
        Column::Label { base, need }
    }

    pub fn seq(base: u16, need: usize) -> Column {
        Column::Number {
            base,
            need,
            seq: true,
        }
    }
}

/// Widens the label columns of `widths` towards their need, a cell each in turn, out of
/// `room`; returns the room left.
fn share(columns: &[Column], widths: &mut [u16], mut room: u16) -> u16 {
    loop {
        let mut gave = false;
        for (column, width) in columns.iter().zip(widths.iter_mut()) {
            if room == 0 {
                return 0;
            }
            if let Column::Label { need, .. } = column
                && usize::from(*width) < *need
            {
                *width += 1;
                room -= 1;
                gave = true;
            }
        }
        if !gave {
            return room;
        }
    }
}

/// Constraints for `columns` in `width` cells with `spacing` between them, and the
/// width each column gets (a text column's minimum: a `Fill` one may get more). Every
/// column first gets its minimum (a number column its `base`, which callers keep short of
/// a number's full width only when it is long); then the labels share the room towards
/// their longest value, then the numbers widen to theirs in order, then the sequence
/// columns. So a name is cut only when the numbers beside it are already at their base,
/// and a number is then fitted into its width, shortened with its exponent, never cut.
pub fn columns(columns: &[Column], width: u16, spacing: u16) -> (Vec<Constraint>, Vec<u16>) {
    let gaps = u16::try_from(columns.len().saturating_sub(1)).unwrap_or(u16::MAX);
    let mut widths: Vec<u16> = columns
        .iter()
        .map(|column| match column {
            Column::Text { min, .. } => *min,
            Column::Number { base, .. } | Column::Label { base, .. } => *base,
        })
        .collect();
    let taken = widths.iter().fold(spacing.saturating_mul(gaps), |sum, w| {
        sum.saturating_add(*w)
    });
    // Labels and names share the room a cell at a time, so one long name does not leave
    // the others at their minimum: each is cut as little as the room allows.
    let mut room = share(columns, &mut widths, width.saturating_sub(taken));
    // Amounts and counts, then sequence numbers, which are cut to their last digits
    // ([`fit_tail`]) rather than abbreviated.
    for seq_turn in [false, true] {
        for (column, width) in columns.iter().zip(widths.iter_mut()) {
            if let Column::Number { need, seq, .. } = column
                && *seq == seq_turn
            {
                let need = u16::try_from(*need).unwrap_or(u16::MAX);
                let extra = need.saturating_sub(*width).min(room);
                room -= extra;
                *width += extra;
            }
        }
    }
    let constraints = columns
        .iter()
        .zip(&widths)
        .map(|(column, width)| match column {
            Column::Text { constraint, .. } => *constraint,
            Column::Number { .. } | Column::Label { .. } => Constraint::Length(*width),
        })
        .collect();
    (constraints, widths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_say_one_thing_or_many() {
        for (n, words) in [(0, "0 facts"), (1, "1 fact"), (2, "2 facts")] {
            let line = Parts::new().count(n, "fact", "facts").line(40);
            assert_eq!(text(&line), words);
        }
    }

    #[test]
    fn text_is_cut_with_a_mark() {
        let table: &[(&str, usize, &str)] = &[
            ("applied", 8, "applied"),
            ("applied", 7, "applied"),
            ("refund_exceeds_withdrawal", 10, "refund_ex…"),
            ("insufficient_funds", 1, "…"),
            ("insufficient_funds", 0, ""),
        ];
        for (raw, width, cut) in table {
            assert_eq!(fit_text(raw, *width), *cut, "{raw} in {width}");
            assert!(cells(&fit_text(raw, *width)) <= *width);
        }
    }

    #[test]
    fn the_first_variant_that_fits_is_taken() {
        let variants = || {
            vec![
                Parts::from("verify ok at start, 08:00:01"),
                Parts::from("verify ok 08:00:01"),
                Parts::from("verify ok"),
            ]
        };
        let chosen = |width| text(&Parts::first_fitting(width, variants()).line(width));
        assert_eq!(chosen(40), "verify ok at start, 08:00:01");
        assert_eq!(chosen(20), "verify ok 08:00:01");
        assert_eq!(chosen(9), "verify ok");
        // None fits: the last, cut with its mark.
        assert_eq!(chosen(5), "veri…");
    }

    /// Labels widen before the amounts go past their base, and sequence numbers last.
    #[test]
    fn labels_widen_before_numbers_past_their_base() {
        let spec = [
            Column::number(8, 12),
            Column::label(8, 25),
            Column::seq(4, 8),
            Column::text(Constraint::Fill(1), 10),
        ];
        // 36 cells of minimums and gaps, 14 to share: all to the label, which needs 17.
        let (_, widths) = columns(&spec, 50, 2);
        assert_eq!(widths, [8, 22, 4, 10]);
        // 30 more: 3 finish the label, 4 the amount, 4 the seq.
        let (_, widths) = columns(&spec, 80, 2);
        assert_eq!(widths, [12, 25, 8, 10]);
    }

    #[test]
    fn names_are_cut_in_the_middle_with_a_mark() {
        let table: &[(&str, usize, &str)] = &[
            ("ord-2", 10, "ord-2"),
            ("payout-2026-12-07-customer-000123", 14, "payout-…000123"),
            ("customer-000123:wallet", 10, "custo…llet"),
            ("shop/customer-000123:wallet", 16, "shop/cus…:wallet"),
            ("abc", 2, "a…"),
            ("abc", 1, "…"),
            ("abc", 0, ""),
            // Wide characters count two cells each, and are never split.
            ("日本語のキー", 7, "日…キー"),
        ];
        for (raw, width, cut) in table {
            let got = fit_middle(raw, *width);
            assert_eq!(got, *cut, "{raw} in {width}");
            assert!(cells(&got) <= *width, "{got} in {width}");
        }
    }

    /// Names share the room: each is cut as little as the room allows, rather than the
    /// first taking all of it; the amount widens past its base only after them.
    #[test]
    fn labels_share_the_room() {
        let spec = [
            Column::label(4, 30),
            Column::number(6, 9),
            Column::label(4, 6),
            Column::label(4, 30),
        ];
        // 18 of minimums and 3 gaps leave 19: 2 to the short name (all it needs), then
        // 9 and 8 to the long ones, a cell each in turn; none to the amount.
        let (_, widths) = columns(&spec, 40, 1);
        assert_eq!(widths, [13, 6, 6, 12]);
        // With room for all, each gets its need and no more.
        let (_, widths) = columns(&spec, 200, 1);
        assert_eq!(widths, [30, 9, 6, 30]);
    }

    #[test]
    fn money_fits_its_width_in_major_units() {
        let table: &[(i128, &str, usize, &str)] = &[
            (100_000, "RUB", 20, "1,000.00"),
            (100_000, "RUB", 7, "1000.00"),
            (100_000, "RUB", 5, "1e3"),
            (
                -101_000_000_000_000_000,
                "RUB",
                30,
                "-1,010,000,000,000,000.00",
            ),
            (-101_000_000_000_000_000, "RUB", 12, "-1.01e15"),
            (5, "RUB", 8, "0.05"),
            (5, "RUB", 3, "###"),
            (500, "JPY", 3, "500"),
            (1_234_567, "JPY", 9, "1,234,567"),
            (1_234_567, "JPY", 7, "1234567"),
            (1_234_567, "JPY", 5, "1.2e6"),
            (1_000, "KWD", 5, "1.000"),
            (i128::MAX, "RUB", 10, "1.70141e36"),
        ];
        for (minor, code, width, text) in table {
            let got = fit_money(*minor, code, *width);
            assert_eq!(got, *text, "{minor} {code} in {width}");
            assert!(got.len() <= *width, "{got} in {width}");
        }
        // The shortest form is what a column never goes below.
        assert_eq!(shortest_money(-101_000_000_000_000_000, "RUB"), 5); // -1e15
        assert_eq!(shortest_money(5, "RUB"), 4);
    }

    #[test]
    fn numbers_fit_their_width() {
        let cases: &[(i128, usize, &str)] = &[
            // Exact fits, zero and negatives included.
            (0, 1, "0"),
            (0, 0, ""),
            (7, 5, "7"),
            (-7, 2, "-7"),
            (12_345, 5, "12345"),
            (-12_345, 6, "-12345"),
            // One over: the exponent form, as many digits as fit.
            (123_456, 5, "1.2e5"),
            (-12_345, 5, "-1e4"),
            (-123_456, 6, "-1.2e5"),
            // The cases that were cut from the left.
            (-101_000_000_000_000_000, 19, "-101000000000000000"),
            (-101_000_000_000_000_000, 18, "-1.01e17"),
            (101_000_000_000_000_000, 18, "101000000000000000"),
            (101_000_000_000_000_000, 17, "1.01e17"),
            (-20_000_000_000_000_000_000, 20, "-2e19"),
            // Rounding, with a carry into the next power.
            (-101_500_000_000_000_000, 8, "-1.02e17"),
            (999_999, 5, "1e6"),
            (9_950_000, 6, "9.95e6"),
            (994_999, 5, "9.9e5"),
            (99_999, 4, "1e5"),
            // The model's extremes: i64, u64 and i128.
            (i128::from(i64::MIN), 20, "-9223372036854775808"),
            (i128::from(i64::MIN), 19, "-9.2233720368548e18"),
            (i128::from(i64::MAX), 19, "9223372036854775807"),
            (i128::from(i64::MAX), 8, "9.223e18"),
            (i128::from(u64::MAX), 7, "1.84e19"),
            (i128::MIN, 40, "-170141183460469231731687303715884105728"),
            (i128::MIN, 39, "-1.701411834604692317316873037158841e38"),
            (i128::MIN, 8, "-1.7e38"),
            (i128::MIN, 5, "-2e38"),
            (i128::MAX, 39, "170141183460469231731687303715884105727"),
            (i128::MAX, 4, "2e38"),
            // No room for any exponent form: marked, the sign kept while it can be.
            (i128::MIN, 4, "-###"),
            (i128::MAX, 3, "###"),
            (-10, 2, "-#"),
            (-1, 1, "#"),
            (10, 1, "#"),
            (-5, 0, ""),
        ];
        for &(n, width, expected) in cases {
            let got = fit_number(n, width);
            assert_eq!(got, expected, "fit_number({n}, {width})");
            assert!(got.len() <= width, "fit_number({n}, {width}) = {got}");
        }
    }

    proptest::proptest! {
        /// Any i128 in any width from its shortest form up: within the width, its sign,
        /// and off by at most half a unit of the last digit shown.
        #[test]
        fn a_fitted_number_reads_as_the_number(n: i128, extra in 0usize..40) {
            let width = shortest(n) + extra;
            let text = fit_number(n, width);
            proptest::prop_assert!(text.len() <= width && !text.contains('#'), "{}", text);
            proptest::prop_assert_eq!(text.starts_with('-'), n < 0);
            if let Some((mantissa, exponent)) = text.split_once('e') {
                let exponent: i32 = exponent.parse().unwrap_or(i32::MAX);
                let decimals = mantissa.split_once('.').map_or(0, |(_, d)| d.len());
                let decimals = i32::try_from(decimals).unwrap_or(0);
                let half_unit = 0.5 * 10f64.powi(exponent - decimals);
                let shown: f64 = text.parse().unwrap_or(f64::NAN);
                let n = n as f64;
                proptest::prop_assert!(
                    (shown - n).abs() <= half_unit + n.abs() * 1e-15,
                    "{} for {}", text, n
                );
            } else {
                proptest::prop_assert_eq!(text, n.to_string());
            }
        }
    }

    #[test]
    fn seqs_keep_their_last_digits() {
        for (n, width, expected) in [
            (0, 1, "0"),
            (140, 5, "140"),
            (99_999, 5, "99999"),
            (100_000, 5, "…0000"),
            (u64::MAX, 20, "18446744073709551615"),
            (u64::MAX, 16, "…744073709551615"),
            (12, 1, "…"),
            (12, 0, ""),
        ] {
            assert_eq!(fit_tail(n, width), expected, "fit_tail({n}, {width})");
            assert!(cells(&fit_tail(n, width)) <= width);
        }
    }

    #[test]
    fn the_shortest_form_is_at_most_five_cells() {
        for (n, expected) in [
            (0, 1),
            (-9, 2),
            (-99, 3),
            (12_345, 3),
            (-12_345, 4),
            (i128::MIN, 5),
            (i128::MAX, 4),
        ] {
            assert_eq!(shortest(n), expected, "shortest({n})");
            assert!(!fit_number(n, shortest(n)).contains('#'), "{n}");
        }
    }

    #[test]
    fn a_unit_stays_and_the_number_gives_way() {
        assert_eq!(fit_with_unit(300, " RUB", 14), "300 RUB");
        assert_eq!(
            fit_with_unit(i128::from(u64::MAX), " RUB", 14),
            "1.84467e19 RUB"
        );
        assert_eq!(fit_with_unit(-5, "/s", 0), "-5/s");
    }

    fn text(line: &Line) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn lines_shorten_numbers_before_text() {
        let parts = Parts::new()
            .text("applied ")
            .num(u64::MAX)
            .text(" · rejected ")
            .num(12);
        assert_eq!(
            text(&parts.line(80)),
            "applied 18446744073709551615 · rejected 12"
        );
        assert_eq!(text(&parts.line(30)), "applied 1.845e19 · rejected 12");
        // Below every number's shortest form the text is cut, visibly, and the number
        // that would be split is left out.
        assert_eq!(text(&parts.line(24)), "applied 2e19 · rejected…");
        assert_eq!(text(&parts.line(9)), "applied …");
        assert_eq!(text(&parts.line(0)), "");
        for width in 0..50 {
            assert!(parts.line(width).width() <= width, "{width}");
        }
    }

    #[test]
    fn padding_goes_before_digits() {
        let parts = Parts::new().text("done").num_styled(120, Style::new(), 10);
        assert_eq!(text(&parts.line(20)), "done       120");
        assert_eq!(text(&parts.line(7)), "done120");
    }

    #[test]
    fn packed_items_are_whole_or_counted() {
        let items: Vec<Vec<Span>> = [("@payouts", "2000"), ("@world", "-15000")]
            .iter()
            .map(|(name, n)| vec![Span::raw(*name), Span::raw(*n), Span::raw("RUB")])
            .collect();
        let texts = |lines: &[Line]| lines.iter().map(text).collect::<Vec<_>>();
        let (lines, shown) = pack(Span::raw("system"), &items, "·", 40, 2);
        assert_eq!(shown, 2);
        assert_eq!(
            texts(&lines),
            vec!["system @payouts 2000 RUB · @world -15000", "RUB"]
        );
        // One line: the second account is left out whole, and counted.
        let (lines, shown) = pack(Span::raw("system"), &items, "·", 40, 1);
        assert_eq!(shown, 1);
        assert_eq!(texts(&lines), vec!["system @payouts 2000 RUB · +1 more"]);
        // An empty separator is two spaces, and never starts a line.
        let (lines, _) = pack(Span::raw("sum"), &items, "", 24, 2);
        assert_eq!(
            texts(&lines),
            vec!["sum @payouts 2000 RUB", "@world -15000 RUB"]
        );
        // A word longer than the line is split rather than lost.
        let (lines, _) = pack(Span::raw("abcdefgh"), &[], "", 3, 3);
        assert_eq!(texts(&lines), vec!["abc", "def", "gh"]);
    }

    #[test]
    fn number_columns_widen_into_the_room_left() {
        let layout = [
            Column::text(Constraint::Max(32), 8),
            Column::fixed(8),
            Column::number(18, 19),
        ];
        // 76 cells: room for the sign.
        let (constraints, widths) = columns(&layout, 76, 1);
        assert_eq!(widths, vec![8, 8, 19]);
        assert_eq!(constraints[2], Constraint::Length(19));
        // No wider than needed, and never below the base.
        let (_, widths) = columns(&[Column::number(18, 3)], 76, 1);
        assert_eq!(widths, vec![18]);
        // 36 cells: 8 + 8 + 2 gaps leave 18; nothing to widen into.
        let (_, widths) = columns(&layout, 36, 1);
        assert_eq!(widths, vec![8, 8, 18]);
        // Earlier number columns are served first.
        let (_, widths) = columns(&[Column::number(4, 10), Column::number(4, 10)], 20, 0);
        assert_eq!(widths, vec![10, 10]);
        let (_, widths) = columns(&[Column::number(4, 10), Column::number(4, 10)], 15, 0);
        assert_eq!(widths, vec![10, 5]);
        // A sequence column widens after the amounts, wherever it stands.
        let (_, widths) = columns(&[Column::seq(4, 10), Column::number(4, 10)], 15, 0);
        assert_eq!(widths, vec![5, 10]);
    }
}
