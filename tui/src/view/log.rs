//! The log view: the tail of the facts.

use super::*;

pub(super) fn draw_log(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let facts = app.visible_facts();
    let title_width = usize::from(area.width.saturating_sub(if roomy { 4 } else { 0 }));
    let title = log_title(app, facts.len(), panel_rows(area, roomy));
    let inner = panel(
        frame,
        area,
        Parts::first_fitting(title_width, title),
        roomy,
        theme,
    );
    if facts.is_empty() {
        if app.shown().snapshot.is_none() {
            draw_waiting(frame, inner, app, theme);
        } else {
            frame.render_widget(Paragraph::new(Span::styled("no facts", theme.dim())), inner);
        }
        return;
    }
    draw_log_table(frame, inner, app, &facts, theme);
}

/// The log panel's title, longest first: how many of the `total` facts there are, or
/// which are on screen when they do not all fit its `rows`, and whether it follows the
/// tail; on a narrow terminal the words go before the numbers do.
fn log_title(app: &App, total: usize, rows: usize) -> Vec<Parts> {
    let mode = if app.follow_log {
        "following"
    } else {
        "scrolled, End follows"
    };
    let selected = app.selected[View::Log.index()];
    let range = rows_range(Parts::new(), total, rows, selected);
    let mode = format!(" · {mode}");
    let name = Parts::from("Log · ");
    match range {
        Some(range) => vec![
            name.clone().extend(&range).text(" facts").text(&mode),
            name.clone().extend(&range).text(&mode),
            range.clone().text(&mode),
            name.extend(&range),
        ],
        None => {
            let count = name.count(usize_units(total), "fact", "facts");
            vec![count.clone().text(mode), count]
        }
    }
}

/// The facts' table, a rejection's row in the warning colour.
fn draw_log_table(frame: &mut Frame, area: Rect, app: &App, facts: &[&FactRow], theme: Theme) {
    let layout = log_columns(area.width);
    let known = withdrawal_currencies(app.shown());
    // A rejected refund's fact names its withdrawal, not its currency: the withdrawal's
    // is looked up among what the dashboard has seen.
    let currencies: Vec<&str> = facts
        .iter()
        .map(|f| currency_of(&known, &f.client, f.withdrawal.as_ref(), &f.currency))
        .collect();
    let texts: Vec<Vec<String>> = facts
        .iter()
        .zip(&currencies)
        .map(|(fact, currency)| {
            layout
                .iter()
                .map(|(col, _)| col.text(fact, currency))
                .collect()
        })
        .collect();
    let header: Vec<&str> = layout.iter().map(|(_, header)| *header).collect();
    let (widths, fitted) = fit_table(&header, &texts, table_width(area.width), |i, need| {
        let (col, header) = layout[i];
        match col {
            LogCol::Amount => {
                number_column(header, need, amount_cap(texts.iter().map(|row| &row[i])))
            }
            _ => col.column(header, need),
        }
    });
    let rows = facts
        .iter()
        .zip(&currencies)
        .zip(&texts)
        .map(|((fact, currency), texts)| {
            let style = if fact.code.is_some() {
                theme.warn()
            } else {
                Style::new()
            };
            let cells: Vec<String> = layout
                .iter()
                .zip(&fitted)
                .zip(texts)
                .map(|(((col, _), width), text)| col.fit(fact, currency, text, *width))
                .collect();
            Row::new(cells).style(style)
        });
    draw_table(
        frame,
        area,
        Row::new(header).style(theme.header()),
        rows,
        widths,
        app.selected[View::Log.index()],
        theme,
    );
}

/// A column of the log table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogCol {
    Seq,
    Time,
    Client,
    Key,
    /// The fact's type, or `rejected: ` and its code.
    Fact,
    /// The type without `Recorded`, or the rejection's code: for narrow tables.
    FactShort,
    Account,
    Amount,
    After,
}

/// The log table's columns for a table `width` cells wide, with their headers.
fn log_columns(width: u16) -> Vec<(LogCol, &'static str)> {
    if width >= 100 {
        vec![
            (LogCol::Seq, "seq"),
            (LogCol::Time, "time"),
            (LogCol::Client, "client"),
            (LogCol::Key, "key"),
            (LogCol::Fact, "fact"),
            (LogCol::Account, "account"),
            (LogCol::Amount, "amount"),
            (LogCol::After, "after"),
        ]
    } else if width >= 64 {
        vec![
            (LogCol::Seq, "seq"),
            (LogCol::Key, "key"),
            (LogCol::Fact, "fact"),
            (LogCol::Account, "account"),
            (LogCol::Amount, "amount"),
        ]
    } else {
        vec![
            (LogCol::Seq, "seq"),
            (LogCol::Key, "key"),
            (LogCol::FactShort, "fact"),
        ]
    }
}

impl LogCol {
    /// How the column is laid out, given its longest value's cells: as wide as that while
    /// there is room, amounts first, then the names sharing the rest, then the seqs past
    /// six digits.
    fn column(self, header: &str, need: usize) -> Column {
        let header_cells = u16::try_from(cells(header)).unwrap_or(u16::MAX);
        match self {
            LogCol::Seq => Column::seq(u16::try_from(need.clamp(3, 6)).unwrap_or(6), need),
            LogCol::Time => Column::fixed(8),
            LogCol::Client | LogCol::Account => Column::label(header_cells, need),
            LogCol::Key => Column::label(8, need),
            LogCol::Fact | LogCol::FactShort => Column::label(10, need),
            // See `amount_cap` where it is laid out.
            LogCol::Amount => number_column(header, need, 13),
            LogCol::After => number_column(header, need, 10),
        }
    }

    /// The column's text for `fact` in full, its amount in `currency` (empty: unknown).
    fn text(self, fact: &FactRow, currency: &str) -> String {
        match self {
            LogCol::Seq => fact.seq.to_string(),
            LogCol::Time => clock_time(&fact.at),
            LogCol::Client => fact.client.to_string(),
            LogCol::Key => fact.key.to_string(),
            LogCol::Fact => fact_name(fact),
            LogCol::FactShort => match &fact.code {
                Some(code) => code.to_string(),
                None => fact.name.as_str().trim_end_matches("Recorded").to_string(),
            },
            LogCol::Account => fact_target(fact),
            LogCol::Amount => money(fact.amount, currency),
            LogCol::After => fact
                .balance_after
                .map_or(String::new(), |b| money::format_number(b.0, currency)),
        }
    }

    /// `text` fitted to `width` cells: numbers shortened, names cut in the middle and
    /// codes at the end, with a `…` either way.
    fn fit(self, fact: &FactRow, currency: &str, text: &str, width: u16) -> String {
        let cells = usize::from(width);
        match self {
            LogCol::Seq => fit_tail(fact.seq, cells),
            LogCol::Client | LogCol::Key | LogCol::Account => fit_middle(text, cells),
            LogCol::Time | LogCol::Fact | LogCol::FactShort => fit_text(text, cells),
            LogCol::Amount => money_fit(fact.amount, currency, width),
            LogCol::After => fact
                .balance_after
                .map_or(String::new(), |b| fit_money(b.0, currency, cells)),
        }
    }
}

fn fact_name(fact: &FactRow) -> String {
    match &fact.code {
        Some(code) => format!("rejected: {code}"),
        None => fact.name.to_string(),
    }
}

fn fact_target(fact: &FactRow) -> String {
    match &fact.withdrawal {
        Some(withdrawal) if fact.account.is_empty() => format!("of {withdrawal}"),
        _ => fact.account.to_string(),
    }
}
