//! Tables: columns laid out from their texts, the rows on screen, the selection.

use super::*;

/// The width [`draw_table`] leaves its columns: the highlight symbol takes two cells.
pub(super) fn table_width(area_width: u16) -> u16 {
    area_width.saturating_sub(2)
}

/// A number column: as wide as its longest value up to `cap` cells (never narrower than
/// its `header`) before names widen, and wider after them while there is room. An amount
/// column of `3.00 RUB` does not hold 13 cells a long name needs; a long balance is
/// shortened to its exponent form before a name is cut.
pub(super) fn number_column(header: &str, need: usize, cap: usize) -> Column {
    let header = cells(header);
    let base = need.clamp(header, cap.max(header));
    Column::number(u16::try_from(base).unwrap_or(u16::MAX), need)
}

/// The base of an amount column: 13 cells, or what the longest amount in minor units
/// needs, so that `minor units` is never cut from a number it says how to read.
pub(super) fn amount_cap<'a>(amounts: impl Iterator<Item = &'a String>) -> usize {
    amounts
        .filter(|text| text.ends_with(MINOR_UNITS))
        .map(|text| cells(text))
        .max()
        .unwrap_or(0)
        .max(13)
}

/// Lays out a table in `width` cells, a cell between two columns, from its `headers` and
/// its rows' `texts` (each cell's text in full): `spec` says how column `i` is laid out,
/// given its longest text's cells ([`Column::label`] for a name or a code, a
/// [`number_column`] for an amount). Every column is as wide as its longest text while
/// there is room, numbers first, the names sharing the rest ([`columns`]); returns the
/// constraints and the cells each column gets, which its texts are then fitted to
/// ([`fit_middle`] for names, [`fit_text`] for codes and prose), so a cut is marked.
pub(super) fn fit_table(
    headers: &[&str],
    texts: &[Vec<String>],
    width: u16,
    spec: impl Fn(usize, usize) -> Column,
) -> (Vec<Constraint>, Vec<u16>) {
    let spec: Vec<Column> = (0..headers.len())
        .map(|i| {
            let need = texts
                .iter()
                .filter_map(|row| row.get(i))
                .map(|text| cells(text))
                .max()
                .unwrap_or(0);
            spec(i, need)
        })
        .collect();
    columns(&spec, width, 1)
}

/// The rows a table has under its header in `area`, drawn in a [`panel`] (its borders,
/// or its title line in the compact layout).
pub(super) fn panel_rows(area: Rect, roomy: bool) -> usize {
    usize::from(area.height.saturating_sub(if roomy { 3 } else { 2 }))
}

/// The first and last rows a table of `total` rows shows in `shown` rows with `selected`
/// selected, counted from 1: the table scrolls just far enough to show the selection, as
/// [`draw_table`]'s does.
fn rows_shown(total: usize, shown: usize, selected: usize) -> (usize, usize) {
    let first = selected
        .min(total.saturating_sub(1))
        .saturating_sub(shown.saturating_sub(1));
    (first + 1, (first + shown).min(total))
}

/// `parts` and which of a table's `total` rows are on screen when they do not all fit its
/// `shown` rows (`21–40 of 50`); `None` when every row is on screen.
pub(super) fn rows_range(
    parts: Parts,
    total: usize,
    shown: usize,
    selected: usize,
) -> Option<Parts> {
    if total <= shown {
        return None;
    }
    let (first, last) = rows_shown(total, shown, selected);
    Some(
        parts
            .num(usize_units(first))
            .text("–")
            .num(usize_units(last))
            .text(" of ")
            .num(usize_units(total)),
    )
}

pub(super) fn draw_table<'a>(
    frame: &mut Frame,
    area: Rect,
    header: Row<'a>,
    rows: impl IntoIterator<Item = Row<'a>>,
    widths: Vec<Constraint>,
    selected: usize,
    theme: Theme,
) {
    let table = Table::new(rows, widths)
        .header(header)
        .flex(Flex::Start)
        .row_highlight_style(theme.selected())
        .highlight_symbol("> ")
        .highlight_spacing(HighlightSpacing::Always);
    // A fresh state each frame: ratatui scrolls it so the selection is visible, and
    // `draw` keeps nothing between frames.
    let mut state = TableState::new().with_selected(Some(selected));
    frame.render_stateful_widget(table, area, &mut state);
}
