//! The keys view: the table of keys and the detail of one.

use super::*;

pub(super) fn draw_keys(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let table_area = draw_detail_beside(frame, area, app, roomy, theme);
    if table_area.is_empty() {
        return;
    }
    let keys = app.visible_keys();
    let page = app.shown().keys.as_ref();
    // The panel's border takes two cells; without one, the title has the whole line.
    let inner_width = if roomy {
        table_area.width.saturating_sub(2)
    } else {
        table_area.width
    };
    let layout = key_columns(inner_width);
    let title = keys_title(
        app,
        &keys,
        layout.iter().any(|(c, _)| *c == KeyCol::Replays),
        panel_rows(table_area, roomy),
        roomy,
    );
    let title_width = if roomy {
        usize::from(inner_width.saturating_sub(2))
    } else {
        usize::from(inner_width)
    };
    let inner = panel(
        frame,
        table_area,
        Parts::first_fitting(title_width, title),
        roomy,
        theme,
    );
    if page.is_none() {
        draw_waiting(frame, inner, app, theme);
        return;
    }
    if keys.is_empty() {
        // The worker reads a bounded stretch of keys per page, so an empty page with a
        // next one says "not here yet", not "nowhere".
        let text = if page.is_some_and(|p| p.next.is_some()) {
            "no keys match on this page; ] reads on"
        } else {
            "no keys match"
        };
        frame.render_widget(Paragraph::new(Span::styled(text, theme.dim())), inner);
        return;
    }
    draw_key_table(frame, inner, app, &keys, &layout, theme);
}

/// The detail pane, when one is open, beside or below the table (or instead of it, on a
/// small terminal); returns the area left for the table.
fn draw_detail_beside(frame: &mut Frame, area: Rect, app: &App, roomy: bool, theme: Theme) -> Rect {
    if !app.detail_open {
        return area;
    }
    // A key opened from the conflicts is shown by its name, loaded or not yet.
    let record = match &app.opened {
        Some(_) => app.opened_record(),
        None => app.selected_key(),
    };
    if record.is_none() && app.opened.is_none() {
        return area;
    }
    let (table_area, detail_area) = if area.width >= 100 {
        let [table, detail] =
            Layout::horizontal([Constraint::Fill(3), Constraint::Fill(2)]).areas(area);
        (table, detail)
    } else if roomy {
        let [table, detail] = Layout::vertical([
            Constraint::Fill(1),
            Constraint::Length((area.height / 2 + 2).min(14)),
        ])
        .areas(area);
        (table, detail)
    } else {
        // Too little room for both: the detail takes the whole body.
        (Rect::default(), area)
    };
    match (record, &app.opened) {
        (Some(record), _) => draw_key_detail(frame, detail_area, app, record, roomy, theme),
        (None, Some((client, key))) => {
            let inner = panel(frame, detail_area, "Key detail", roomy, theme);
            let fields = [
                Field::new("client", client.to_string()),
                Field::new("key", key.to_string()),
                Field::new("status", "loading…"),
            ];
            let width = usize::from(inner.width);
            let lines: Vec<Line> = fields
                .iter()
                .flat_map(|field| field.lines(width, theme))
                .collect();
            frame.render_widget(Paragraph::new(lines), inner);
        }
        (None, None) => {}
    }
    table_area
}

/// The table of keys: every column as wide as its longest value while there is room,
/// numbers first, the names sharing the rest; whatever is still too long ends in `…`.
fn draw_key_table(
    frame: &mut Frame,
    inner: Rect,
    app: &App,
    keys: &[&KeyRecord],
    layout: &[(KeyCol, &'static str)],
    theme: Theme,
) {
    // Where the status has no column of its own, the outcome's says it too.
    let merged = !layout.iter().any(|(c, _)| *c == KeyCol::Status);
    let known = withdrawal_currencies(app.shown());
    let currencies: Vec<&str> = keys
        .iter()
        .map(|record| {
            currency_of(
                &known,
                &record.client,
                record.withdrawal.as_ref(),
                &record.currency,
            )
        })
        .collect();
    let texts: Vec<Vec<String>> = keys
        .iter()
        .zip(&currencies)
        .map(|(record, currency)| {
            layout
                .iter()
                .map(|(col, _)| col.text(record, merged, currency))
                .collect()
        })
        .collect();
    let header: Vec<&str> = layout.iter().map(|(_, header)| *header).collect();
    let (widths, fitted) = fit_table(&header, &texts, table_width(inner.width), |i, need| {
        let (col, header) = layout[i];
        match col {
            KeyCol::Amount => {
                number_column(header, need, amount_cap(texts.iter().map(|row| &row[i])))
            }
            _ => col.column(cells(header), need),
        }
    });
    let rows = keys
        .iter()
        .zip(&currencies)
        .zip(&texts)
        .map(|((record, currency), texts)| {
            let cells: Vec<Cell> = layout
                .iter()
                .zip(&fitted)
                .zip(texts)
                .map(|(((col, _), width), text)| col.cell(record, currency, text, *width, theme))
                .collect();
            Row::new(cells).style(key_style(record, theme))
        });
    draw_table(
        frame,
        inner,
        Row::new(header).style(theme.header()),
        rows,
        widths,
        app.selected[View::Keys.index()],
        theme,
    );
}

/// A key's row in the warning colour while pending, the alarm's when its lease ran out,
/// dim once expired.
fn key_style(record: &KeyRecord, theme: Theme) -> Style {
    if record.lease_expired {
        theme.bad()
    } else {
        match record.status {
            KeyStatus::Pending => theme.warn(),
            KeyStatus::Expired => theme.dim(),
            KeyStatus::Done | KeyStatus::Unknown => Style::new(),
        }
    }
}

/// A column of the keys table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyCol {
    Status,
    Client,
    Key,
    Command,
    Account,
    Amount,
    Outcome,
    Age,
    Replays,
    Conflicts,
}

impl KeyCol {
    /// How the column is laid out, given its header's cells and its longest value's. Each
    /// is as wide as its longest value when there is room: an amount column of `3.00 RUB`
    /// does not keep cells a long key or account needs.
    fn column(self, header: usize, need: usize) -> Column {
        let header = u16::try_from(header).unwrap_or(u16::MAX);
        match self {
            // `pending!` and every age fit their 7 or 8 cells.
            KeyCol::Status => Column::fixed(8),
            KeyCol::Age => Column::fixed(7),
            // Names and codes keep a few cells, and share what the numbers leave.
            KeyCol::Key => Column::label(8, need),
            KeyCol::Client | KeyCol::Command | KeyCol::Account | KeyCol::Outcome => {
                Column::label(header, need)
            }
            KeyCol::Amount => number_column("amount", need, 13),
            KeyCol::Replays => number_column("replays", need, 9),
            KeyCol::Conflicts => number_column("conflicts", need, 9),
        }
    }

    /// The column's cell for `record`: its `text` fitted to `width` cells, a name cut in
    /// its middle, words at their end, numbers shortened; the amount in `currency`, the
    /// outcome in its colour.
    fn cell(
        self,
        record: &KeyRecord,
        currency: &str,
        text: &str,
        width: u16,
        theme: Theme,
    ) -> Cell<'static> {
        let cells = usize::from(width);
        match self {
            KeyCol::Client | KeyCol::Key | KeyCol::Account => Cell::from(fit_middle(text, cells)),
            KeyCol::Status | KeyCol::Command | KeyCol::Age => Cell::from(fit_text(text, cells)),
            KeyCol::Amount => Cell::from(money_fit(record.amount, currency, width)),
            KeyCol::Outcome => Cell::from(Span::styled(
                fit_text(text, cells),
                outcome_style(&key_result(record), theme),
            )),
            KeyCol::Replays => Cell::from(fit_number(record.replays.into(), cells)),
            KeyCol::Conflicts => Cell::from(fit_number(record.conflicts.into(), cells)),
        }
    }

    /// The column's text for `record` in full; `currency` is the amount's, or empty when
    /// the dashboard cannot know it.
    fn text(self, record: &KeyRecord, merged: bool, currency: &str) -> String {
        match self {
            KeyCol::Status => status_cell(record),
            KeyCol::Client => record.client.to_string(),
            KeyCol::Key => record.key.to_string(),
            KeyCol::Command => record.command.to_string(),
            KeyCol::Account => target(record),
            KeyCol::Amount => money(record.amount, currency),
            KeyCol::Outcome => outcome_cell(record, merged),
            KeyCol::Age => format_age(record.age_ms),
            KeyCol::Replays => record.replays.to_string(),
            KeyCol::Conflicts => record.conflicts.to_string(),
        }
    }
}

/// The keys table's columns for a table `width` cells wide, with their headers. Narrower
/// tables drop the account, the status (the outcome column then says `pending`), the
/// counts, then the client and the command: what became of a key stays.
fn key_columns(width: u16) -> Vec<(KeyCol, &'static str)> {
    if width >= 100 {
        vec![
            (KeyCol::Status, "status"),
            (KeyCol::Client, "client"),
            (KeyCol::Key, "key"),
            (KeyCol::Command, "command"),
            (KeyCol::Account, "account"),
            (KeyCol::Amount, "amount"),
            (KeyCol::Outcome, "outcome"),
            (KeyCol::Age, "age"),
            (KeyCol::Replays, "replays"),
            (KeyCol::Conflicts, "conflicts"),
        ]
    } else if width >= 64 {
        vec![
            (KeyCol::Outcome, "outcome"),
            (KeyCol::Client, "client"),
            (KeyCol::Key, "key"),
            (KeyCol::Command, "command"),
            (KeyCol::Amount, "amount"),
            (KeyCol::Age, "age"),
        ]
    } else {
        vec![
            (KeyCol::Outcome, "outcome"),
            (KeyCol::Key, "key"),
            (KeyCol::Age, "age"),
        ]
    }
}

/// The keys panel's title, longest first: which rows of the page are on screen (all of
/// them, or `1–18 of 200` when they do not fit its `rows`), the order, where the counts
/// begin (when they are shown), and an expired lease, which stays while anything does.
fn keys_title(
    app: &App,
    keys: &[&KeyRecord],
    counts_shown: bool,
    rows: usize,
    roomy: bool,
) -> Vec<Parts> {
    // Compact layouts drop the name: the tab bar already says it.
    let mut shown = Parts::new().text(if roomy { "Keys · " } else { "" });
    let mut more = Parts::new();
    if let Some(page) = app.shown().keys.as_ref() {
        let selected = app.selected[View::Keys.index()];
        shown = rows_range(shown.clone(), keys.len(), rows, selected)
            .unwrap_or_else(|| shown.num(usize_units(keys.len())).text(" shown"));
        if page.next.is_some() {
            more = more.text(", more: ]");
        }
        if !app.key_pages.is_empty() {
            more = more
                .text(" · page ")
                .num(usize_units(app.key_pages.len()) + 1);
        }
    }
    let sort = match app.sorts.keys {
        KeySort::Newest => " · newest first",
        KeySort::Key => " · by key",
    };
    let lease = if keys.iter().any(|k| k.lease_expired) {
        " · ! lease expired"
    } else {
        ""
    };
    let since = match started_at(app) {
        Some(time) => format!(" · replays, conflicts since the worker started {time}"),
        None => " · replays, conflicts since the worker started".to_string(),
    };
    let join = |parts: &[&Parts], texts: &[&str]| {
        let mut line = Parts::new();
        for part in parts {
            line = line.extend(part);
        }
        for text in texts {
            line = line.text(*text);
        }
        line
    };
    let mut variants = Vec::new();
    if counts_shown {
        variants.push(join(&[&shown, &more], &[sort, since.as_str(), lease]));
    }
    variants.push(join(&[&shown, &more], &[sort, lease]));
    // Narrow footers say the order (see `draw_footer`): the title keeps the paging.
    variants.push(join(&[&shown, &more], &[lease]));
    variants.push(join(&[&shown], &[lease]));
    variants
}

/// `HH:MM:SS` when the worker started, if it says.
pub(super) fn started_at(app: &App) -> Option<String> {
    let snapshot = app.shown().snapshot.as_ref()?;
    snapshot.started_at.as_ref().map(clock_time)
}

/// What became of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyResult {
    Pending,
    Applied,
    /// The rejection code, sanitised.
    Rejected(String),
    /// Done, but the answer says neither (a worker this dashboard does not know).
    Unknown,
}

pub(super) fn key_result(record: &KeyRecord) -> KeyResult {
    if record.status == KeyStatus::Pending {
        return KeyResult::Pending;
    }
    let Some(Value::Object(outcome)) = &record.outcome else {
        return KeyResult::Unknown;
    };
    let word = |name: &str| outcome.get(name).and_then(Value::as_str);
    match (word("outcome"), word("code")) {
        (Some("applied"), _) => KeyResult::Applied,
        (Some("rejected") | None, Some(code)) => KeyResult::Rejected(sanitize(code)),
        _ => KeyResult::Unknown,
    }
}

fn outcome_style(result: &KeyResult, theme: Theme) -> Style {
    match result {
        KeyResult::Applied => theme.good(),
        KeyResult::Rejected(_) => theme.warn(),
        KeyResult::Pending => Style::new(),
        KeyResult::Unknown => theme.dim(),
    }
}

/// The status column: `pending!` when the claim's lease has run out.
fn status_cell(record: &KeyRecord) -> String {
    match (record.status, record.lease_expired) {
        (KeyStatus::Pending, true) => "pending!".to_string(),
        (status, _) => status.name().to_string(),
    }
}

/// The outcome column: `applied` or the rejection code; `–` while pending. `merged`: there
/// is no status column, so this one says `pending` and `expired` too.
fn outcome_cell(record: &KeyRecord, merged: bool) -> String {
    let result = match key_result(record) {
        KeyResult::Pending if merged => return status_cell(record),
        KeyResult::Unknown if merged && record.status == KeyStatus::Expired => {
            return "expired".to_string();
        }
        KeyResult::Pending | KeyResult::Unknown => "–".to_string(),
        KeyResult::Applied => "applied".to_string(),
        KeyResult::Rejected(code) => code,
    };
    if merged && record.status == KeyStatus::Expired {
        format!("{result}, expired")
    } else {
        result
    }
}

fn draw_key_detail(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    record: &KeyRecord,
    roomy: bool,
    theme: Theme,
) {
    let inner = panel(frame, area, "Key detail", roomy, theme);
    let fact = app
        .shown()
        .detail
        .as_ref()
        .filter(|d| d.client == record.client && d.key == record.key)
        .and_then(|d| d.fact.as_ref())
        .or(record.fact.as_ref());
    // A refund that does not carry its withdrawal's currency may name one seen elsewhere.
    let known = withdrawal_currencies(app.shown());
    let seen = currency_of(
        &known,
        &record.client,
        record.withdrawal.as_ref(),
        &record.currency,
    );
    let fields = key_fields(record, fact, started_at(app).as_deref(), seen, theme);
    let width = usize::from(inner.width);
    let lines: Vec<Line> = fields
        .iter()
        .flat_map(|field| field.lines(width, theme))
        .collect();
    let paragraph = Paragraph::new(lines.clone());
    // The pane does not scroll: what falls off the bottom is said, not dropped without a
    // word.
    let total = lines.len();
    if total <= usize::from(inner.height) || inner.height < 2 {
        frame.render_widget(paragraph, inner);
        return;
    }
    let [text, marker] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(1)]).areas(inner);
    frame.render_widget(paragraph, text);
    let hidden = total - usize::from(text.height);
    let line = Parts::new()
        .styled("… ", theme.warn())
        .count_styled(usize_units(hidden), "more line", "more lines", theme.warn())
        .styled("; enlarge the terminal", theme.warn());
    frame.render_widget(Paragraph::new(line.line(marker.width.into())), marker);
}

/// Cells of the labels in the key detail; values start after them.
const LABEL_CELLS: usize = 10;

/// One labelled field of the key detail: a value of words, wrapped under itself.
struct Field {
    label: String,
    value: Parts,
    style: Style,
}

impl Field {
    fn new(label: impl Into<String>, value: impl Into<Parts>) -> Field {
        Field {
            label: label.into(),
            value: value.into(),
            style: Style::new(),
        }
    }

    fn styled(mut self, style: Style) -> Field {
        self.style = style;
        self
    }

    /// The field in `width` cells: the label, then the value's words wrapped at word
    /// boundaries and indented under the first. A number stays whole on its line, fitted
    /// to it when even a line of its own is too narrow.
    fn lines(&self, width: usize, theme: Theme) -> Vec<Line<'static>> {
        let room = width.saturating_sub(LABEL_CELLS).max(1);
        let mut rows: Vec<Parts> = vec![Parts::new()];
        for part in &self.value.0 {
            let words: Vec<Part> = match part {
                Part::Text(text, style) => split_words(text)
                    .into_iter()
                    .map(|word| Part::Text(word, *style))
                    .collect(),
                number => vec![number.clone()],
            };
            for word in words {
                let current = rows.last().map_or(0, Parts::full_width);
                let piece = Parts(vec![word.clone()]).full_width();
                let blank = matches!(&word, Part::Text(text, _) if text.trim().is_empty());
                if current > 0 && current + piece > room {
                    if blank {
                        continue;
                    }
                    rows.push(Parts::new());
                }
                if let Some(row) = rows.last_mut() {
                    row.0.push(word);
                }
            }
        }
        let mut lines = Vec::new();
        // A label too long for its column (a field named by the worker) has a line of
        // its own, and the value goes under it.
        let label_alone = cells(&self.label) >= LABEL_CELLS;
        if label_alone {
            lines.push(Line::styled(self.label.clone(), theme.header()));
        }
        for (i, row) in rows.iter().enumerate() {
            let label = if i == 0 && !label_alone {
                format!("{:<LABEL_CELLS$}", self.label)
            } else {
                " ".repeat(LABEL_CELLS)
            };
            let mut spans = vec![Span::styled(label, theme.header())];
            spans.extend(restyle(row.line(room), self.style).spans);
            lines.push(Line::from(spans));
        }
        lines
    }
}

/// `text` as words that keep their following spaces, so joined they read as before.
fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c == ' ' {
            word.push(c);
        } else {
            if word.ends_with(' ') {
                words.push(std::mem::take(&mut word));
            }
            word.push(c);
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Fields of the stored answer that [`key_fields`] shows in its own words.
const SHOWN_OUTCOME_FIELDS: &[&str] = &[
    "outcome",
    "code",
    "type",
    "status",
    "title",
    "key",
    "command",
    "account",
    "amount",
    "currency",
    "withdrawal",
    "seq",
    "balance",
    "refunded_total",
    "created_at",
    "account_currency",
    "refundable",
    "detail",
];

/// Amounts among the answer's other fields, shown as money in the key's currency.
fn is_money_field(name: &str) -> bool {
    ["amount", "balance", "refund", "total"]
        .iter()
        .any(|word| name.contains(word))
}

/// The key detail as labelled fields: who and which key, where it stands, the command,
/// what became of it with its money in major units, the fact, and the counts.
fn key_fields(
    record: &KeyRecord,
    fact: Option<&Value>,
    started: Option<&str>,
    seen: &str,
    theme: Theme,
) -> Vec<Field> {
    let outcome = match &record.outcome {
        Some(Value::Object(map)) => Some(map),
        _ => None,
    };
    let currency = if record.currency.is_empty() {
        answer_text(outcome, "currency")
            .or_else(|| answer_text(fact.and_then(Value::as_object), "currency"))
            .unwrap_or_else(|| seen.to_string())
    } else {
        record.currency.to_string()
    };
    let mut fields = vec![
        Field::new("client", record.client.to_string()),
        Field::new("key", record.key.to_string()),
        status_field(record, theme),
        command_field(record, &currency),
    ];
    fields.extend(outcome_fields(record, outcome, &currency, theme));
    if record.status == KeyStatus::Done
        && let Some(until) = &record.expires_at
    {
        fields.push(Field::new(
            "kept",
            format!("the answer until {}", date_time(until)),
        ));
    }
    fields.extend(other_answer_fields(outcome, &currency));
    fields.push(fact_field(record, fact));
    fields.push(repeats_field(record, started));
    fields
}

/// The stored answer's fields, when it is an object.
type Answer = serde_json::Map<String, Value>;

/// A text field of the answer, sanitised.
fn answer_text(answer: Option<&Answer>, name: &str) -> Option<String> {
    answer
        .and_then(|m| m.get(name))
        .and_then(Value::as_str)
        .map(sanitize)
}

/// An integer field of the answer.
fn answer_units(answer: Option<&Answer>, name: &str) -> Option<i128> {
    answer.and_then(|m| m.get(name)).and_then(units)
}

/// `parts` and an amount of minor units in major units of `currency`, or in minor units,
/// said so, when the currency is not known.
fn with_money(parts: Parts, minor: i128, currency: &str) -> Parts {
    if currency.is_empty() {
        parts.num(minor).text(" (minor units)")
    } else {
        parts.money(minor, currency).text(format!(" {currency}"))
    }
}

/// Where the key stands and since when, a pending key in the warning colour, one whose
/// lease ran out in the alarm's.
fn status_field(record: &KeyRecord, theme: Theme) -> Field {
    let age = format_age(record.age_ms);
    let since = clock_time(&record.since);
    match record.status {
        KeyStatus::Pending if record.lease_expired => Field::new(
            "status",
            format!("pending since {since}, {age}: lease expired!"),
        )
        .styled(theme.bad()),
        KeyStatus::Pending => {
            Field::new("status", format!("pending since {since}, {age}")).styled(theme.warn())
        }
        KeyStatus::Done => Field::new("status", format!("done at {since}, {age} ago")),
        KeyStatus::Expired => Field::new(
            "status",
            format!(
                "expired: done at {since}, {age} ago; the stored answer was swept, a retry is answered from the fact"
            ),
        ),
        KeyStatus::Unknown => Field::new("status", format!("? since {since}")),
    }
}

/// The command, its amount, and the account or withdrawal it names.
fn command_field(record: &KeyRecord, currency: &str) -> Field {
    let command = Parts::new().text(format!("{} ", record.command));
    let command = match record.amount {
        Some(amount) => with_money(command, amount.into(), currency),
        None => command,
    };
    let command = match (&record.withdrawal, record.command.as_str()) {
        (Some(withdrawal), _) => command.text(format!(" of withdrawal {withdrawal}")),
        (None, "deposit") => command.text(format!(" to {}", record.account)),
        (None, _) => command.text(format!(" from {}", record.account)),
    };
    Field::new("command", command)
}

/// What became of the key, and the figures the answer gives for it.
fn outcome_fields(
    record: &KeyRecord,
    outcome: Option<&Answer>,
    currency: &str,
    theme: Theme,
) -> Vec<Field> {
    // The answer's seq is the fact's, which the fact line shows.
    let result = key_result(record);
    let style = outcome_style(&result, theme);
    match &result {
        KeyResult::Pending => vec![Field::new("outcome", "none yet: in flight")],
        KeyResult::Unknown if outcome.is_none() => {
            vec![Field::new("outcome", "not stored (swept after retention)")]
        }
        KeyResult::Unknown => vec![Field::new("outcome", "?")],
        KeyResult::Applied => applied_fields(outcome, currency, style),
        KeyResult::Rejected(code) => rejected_fields(record, outcome, code, currency, style),
    }
}

/// An applied command: the balance it left and, for a refund, the withdrawal's refunds
/// in all.
fn applied_fields(outcome: Option<&Answer>, currency: &str, style: Style) -> Vec<Field> {
    let mut fields = vec![Field::new("outcome", "applied").styled(style)];
    if let Some(balance) = answer_units(outcome, "balance") {
        let account = answer_text(outcome, "account").unwrap_or_default();
        let line = with_money(Parts::new(), balance, currency);
        fields.push(Field::new(
            "balance",
            line.text(format!(" on {account} after it")),
        ));
    }
    if let Some(total) = answer_units(outcome, "refunded_total") {
        let line = with_money(Parts::new(), total, currency);
        fields.push(Field::new(
            "refunded",
            line.text(" of the withdrawal in all"),
        ));
    }
    fields
}

/// A rejected command: its code and reason, and the figure it was decided on.
fn rejected_fields(
    record: &KeyRecord,
    outcome: Option<&Answer>,
    code: &str,
    currency: &str,
    style: Style,
) -> Vec<Field> {
    let mut fields = vec![Field::new("outcome", format!("rejected: {code}")).styled(style)];
    if let Some(title) = answer_text(outcome, "title") {
        fields.push(Field::new("reason", title));
    }
    // The figure the rejection was decided on, in major units. The answer's `detail`
    // says the same in minor units, as the API does, so it is not shown.
    let asked = |parts: Parts| match record.amount {
        Some(amount) => {
            with_money(parts.text(", less than the "), amount.into(), currency).text(" asked")
        }
        None => parts,
    };
    if let Some(balance) = answer_units(outcome, "balance") {
        let line =
            with_money(Parts::new(), balance, currency).text(format!(" on {}", record.account));
        fields.push(Field::new("balance", asked(line)));
    }
    if let Some(held) = answer_text(outcome, "account_currency") {
        fields.push(Field::new(
            "currency",
            format!("{} holds {held}, not {currency}", record.account),
        ));
    }
    if let Some(left) = answer_units(outcome, "refundable") {
        let withdrawal = record
            .withdrawal
            .as_ref()
            .map_or_else(String::new, |w| format!(" of withdrawal {w}"));
        let line = with_money(Parts::new(), left, currency).text(format!("{withdrawal} to refund"));
        fields.push(Field::new("left", line));
    }
    fields
}

/// Whatever else the answer holds, labelled by its name: a worker may say more than
/// this dashboard knows of.
fn other_answer_fields(outcome: Option<&Answer>, currency: &str) -> Vec<Field> {
    let mut fields = Vec::new();
    for (name, value) in outcome.into_iter().flatten() {
        if SHOWN_OUTCOME_FIELDS.contains(&name.as_str()) {
            continue;
        }
        let label = sanitize(name).replace('_', " ");
        let field = match (units(value), is_money_field(name)) {
            (Some(minor), true) => Field::new(label, with_money(Parts::new(), minor, currency)),
            (Some(n), false) => Field::new(label, Parts::new().num(n)),
            (None, _) => match value {
                Value::String(s) => Field::new(label, sanitize(s)),
                other => Field::new(label, json_text(other)),
            },
        };
        fields.push(field);
    }
    fields
}

/// The key's fact in a few words, or why there is none to show.
fn fact_field(record: &KeyRecord, fact: Option<&Value>) -> Field {
    Field::new(
        "fact",
        match fact {
            Some(fact) => fact_words(fact),
            None if record.status == KeyStatus::Pending => "none yet: in flight".to_string(),
            None => "loading…".to_string(),
        },
    )
}

/// The key's replays and conflicts, counted since the worker started.
fn repeats_field(record: &KeyRecord, started: Option<&str>) -> Field {
    let since_start = match started {
        Some(time) => format!(" since the worker started at {time}"),
        None => " since the worker started".to_string(),
    };
    Field::new(
        "repeats",
        Parts::new()
            .count(record.replays, "replay", "replays")
            .text(" · ")
            .count(record.conflicts, "conflict", "conflicts")
            .text(since_start),
    )
}

/// A fact in a few words: `#131 WithdrawalRecorded at 11:58:00`, with a rejection's code.
fn fact_words(fact: &Value) -> String {
    let field = |name: &str| fact.get(name).and_then(Value::as_str).map(sanitize);
    let mut words = Vec::new();
    if let Some(seq) = fact.get("seq").and_then(Value::as_u64) {
        words.push(format!("#{seq}"));
    }
    if let Some(name) = field("type") {
        words.push(name);
    }
    if let Some(code) = field("rejection") {
        words.push(format!("({code})"));
    }
    if let Some(at) = field("at") {
        words.push(format!("at {}", clock_time(&Clean::new(&at))));
    }
    if words.is_empty() {
        json_text(fact)
    } else {
        words.join(" ")
    }
}

/// An integer of the feed: a JSON number, or a decimal string for one wider than 64 bits.
fn units(value: &Value) -> Option<i128> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        Value::String(text) => text.parse::<i128>().ok(),
        _ => None,
    }
}

/// The account a command names, or for a refund the withdrawal it refunds.
pub(super) fn target(record: &KeyRecord) -> String {
    match &record.withdrawal {
        Some(withdrawal) if record.account.is_empty() => format!("of {withdrawal}"),
        _ => record.account.to_string(),
    }
}
