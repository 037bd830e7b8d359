//! The conflicts view: the 409 and 422 answers, and the inbox's quarantine.

use super::*;

pub(super) fn draw_conflicts(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let Some(snapshot) = &app.shown().snapshot else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    // Both panels are framed alike, as the whole view would be.
    let roomy = roomy(area);
    let area = draw_quarantine_below(frame, area, app, roomy, theme);
    let title = conflicts_title(app, snapshot, area, roomy);
    let inner = panel(frame, area, title, roomy, theme);
    if snapshot.conflicts.is_empty() {
        draw_none_listed(frame, inner, app, snapshot, theme);
        return;
    }
    let [listed_area, inner] =
        Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(inner);
    let conflicts = app.visible_conflicts();
    let line = listed_line(app, snapshot, &conflicts, inner, listed_area.width.into());
    frame.render_widget(
        Paragraph::new(restyle(line.line(listed_area.width.into()), theme.dim())),
        listed_area,
    );
    if conflicts.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("none matches the filter", theme.dim())),
            inner,
        );
        return;
    }
    draw_conflict_table(frame, inner, app, &conflicts, theme);
}

/// The quarantine in the lower part of the view, only when there is one: messages
/// refused by the inbox are conflicts of the broker's kind. Returns the area left above.
fn draw_quarantine_below(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    roomy: bool,
    theme: Theme,
) -> Rect {
    let quarantined = app
        .shown()
        .quarantine
        .as_ref()
        .map(|q| q.quarantined.as_slice())
        .unwrap_or_default();
    if quarantined.is_empty() || area.height < 12 {
        return area;
    }
    let rows = u16::try_from(quarantined.len()).unwrap_or(u16::MAX);
    let lower = rows.saturating_add(3).min(area.height / 2);
    let [upper, lower_area] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(lower)]).areas(area);
    draw_quarantine(frame, lower_area, roomy, quarantined, theme);
    upper
}

/// The conflicts panel's title: the counters and the order, the counters alone when both
/// do not fit.
fn conflicts_title(app: &App, snapshot: &Snapshot, area: Rect, roomy: bool) -> Parts {
    let counters = &snapshot.counters;
    // The counters count every conflict (on sled, since the ledger began; through the
    // inbox too), the list only this worker's answers over HTTP, the newest 50: the
    // header says which is which, so a count the list does not reach is not a mystery.
    let title = if roomy {
        Parts::new()
            .text("Conflicts · counted: 409 in flight ")
            .num(counters.conflicts_in_flight)
            .text(" · 422 reused ")
            .num(counters.conflicts_reused)
            .text(" · duplicates absorbed ")
            .num(counters.replayed)
    } else {
        Parts::new()
            .text("409 ")
            .num(counters.conflicts_in_flight)
            .text(" · 422 ")
            .num(counters.conflicts_reused)
            .text(" · absorbed ")
            .num(counters.replayed)
    };
    let sorted = |title: Parts| match app.sorts.conflicts {
        ConflictSort::Newest => title,
        ConflictSort::Client => title.text(" · by client"),
        ConflictSort::Key => title.text(" · by key"),
    };
    let counted_only = Parts::new()
        .text(if roomy { "Conflicts · counted: " } else { "" })
        .text("409 ")
        .num(counters.conflicts_in_flight)
        .text(" · 422 ")
        .num(counters.conflicts_reused);
    let title_width = usize::from(if roomy {
        area.width.saturating_sub(4)
    } else {
        area.width
    });
    Parts::first_fitting(title_width, vec![sorted(title), sorted(counted_only)])
}

/// No conflict listed: none at all, or why the ones counted are not in the list.
fn draw_none_listed(frame: &mut Frame, area: Rect, app: &App, snapshot: &Snapshot, theme: Theme) {
    let counters = &snapshot.counters;
    let counted = counters
        .conflicts_in_flight
        .saturating_add(counters.conflicts_reused);
    let text = if counted == 0 {
        "no conflicts: every repeat matched its first attempt".to_string()
    } else {
        let since = started_at(app)
            .map(|t| format!(" at {t}"))
            .unwrap_or_default();
        // A worker that counts its own came by them since it started: the inbox.
        let came = match snapshot.observed_scope {
            ObservedScope::Worker => "through the inbox",
            ObservedScope::Ledger | ObservedScope::Unknown => "before that, or through the inbox",
        };
        format!(
            "none listed: this worker has answered none over HTTP since it started{since}; \
             the {counted} counted came {came}"
        )
    };
    frame.render_widget(
        Paragraph::new(Span::styled(text, theme.dim())).wrap(Wrap { trim: true }),
        area,
    );
}

/// The line above the list: which rows are on screen, first, when they do not all fit
/// the table's `area` under its header, then how many of each kind are listed and what
/// the list holds, as much as fits `width`.
fn listed_line(
    app: &App,
    snapshot: &Snapshot,
    conflicts: &[&Conflict],
    area: Rect,
    width: usize,
) -> Parts {
    let listed = |kind: ConflictKind| {
        usize_units(snapshot.conflicts.iter().filter(|c| c.kind == kind).count())
    };
    let range = rows_range(
        Parts::new(),
        conflicts.len(),
        usize::from(area.height.saturating_sub(1)),
        app.selected[View::Conflicts.index()],
    );
    let counts = Parts::new()
        .num(listed(ConflictKind::InFlight))
        .text(" in flight · ")
        .num(listed(ConflictKind::Reused))
        .text(" reused");
    let kinds = match &range {
        Some(range) => range.clone().text(" · listed: "),
        None => Parts::from("listed: "),
    }
    .extend(&counts);
    let since = started_at(app)
        .map(|t| format!(" at {t}"))
        .unwrap_or_default();
    let mut variants = vec![
        kinds.clone().text(format!(
            ", this worker's answers over HTTP since it started{since}, the newest 50 at most"
        )),
        kinds
            .clone()
            .text(", this worker's answers over HTTP since it started"),
        kinds
            .clone()
            .text(": answers over HTTP since the worker started"),
        kinds.clone().text(" since the worker started"),
        kinds,
    ];
    if let Some(range) = range {
        variants.push(range.text(" · ").extend(&counts));
    }
    Parts::first_fitting(width, variants)
}

/// The listed conflicts, their kind in its colour: 409 the warning's, 422 the alarm's.
fn draw_conflict_table(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    conflicts: &[&Conflict],
    theme: Theme,
) {
    let layout = conflict_columns(area.width);
    let texts: Vec<Vec<String>> = conflicts
        .iter()
        .map(|conflict| layout.iter().map(|(col, _)| col.text(conflict)).collect())
        .collect();
    let header: Vec<&str> = layout.iter().map(|(_, header)| *header).collect();
    let (widths, fitted) = fit_table(&header, &texts, table_width(area.width), |i, need| {
        layout[i].0.column(layout[i].1, need)
    });
    let rows = conflicts.iter().zip(&texts).map(|(conflict, texts)| {
        let style = match conflict.kind {
            ConflictKind::InFlight => theme.warn(),
            ConflictKind::Reused => theme.bad(),
            ConflictKind::Unknown => Style::new(),
        };
        let cells: Vec<Cell> = layout
            .iter()
            .zip(&fitted)
            .zip(texts)
            .map(|(((col, _), width), text)| {
                let text = col.fit(text, usize::from(*width));
                match col {
                    ConflictCol::Kind | ConflictCol::KindShort => {
                        Cell::from(Span::styled(text, style))
                    }
                    _ => Cell::from(text),
                }
            })
            .collect();
        Row::new(cells)
    });
    draw_table(
        frame,
        area,
        Row::new(header).style(theme.header()),
        rows,
        widths,
        app.selected[View::Conflicts.index()],
        theme,
    );
}

/// A column of the conflicts table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConflictCol {
    Time,
    /// `409 in flight`, `422 reused`.
    Kind,
    /// `409`, `422`: for narrow tables.
    KindShort,
    Client,
    Key,
    Command,
    /// The fields of the command that differ from the key's first, comma-separated.
    Differs,
}

/// The conflicts table's columns for a table `width` cells wide, with their headers;
/// narrow tables drop the client and the command.
fn conflict_columns(width: u16) -> Vec<(ConflictCol, &'static str)> {
    if width >= 64 {
        vec![
            (ConflictCol::Time, "time"),
            (ConflictCol::Kind, "kind"),
            (ConflictCol::Client, "client"),
            (ConflictCol::Key, "key"),
            (ConflictCol::Command, "command"),
            (ConflictCol::Differs, "differs"),
        ]
    } else {
        vec![
            (ConflictCol::Time, "time"),
            (ConflictCol::KindShort, "kind"),
            (ConflictCol::Key, "key"),
            (ConflictCol::Differs, "differs"),
        ]
    }
}

impl ConflictCol {
    /// How the column is laid out, given its longest value's cells: the time and the
    /// kind as wide as they always are, the names and words as wide as their longest
    /// value while there is room, sharing it when there is not.
    fn column(self, header: &str, need: usize) -> Column {
        let header = u16::try_from(cells(header)).unwrap_or(u16::MAX);
        match self {
            ConflictCol::Time => Column::fixed(8),
            ConflictCol::Kind => Column::fixed(13),
            ConflictCol::KindShort => Column::fixed(4),
            ConflictCol::Key => Column::label(8, need),
            ConflictCol::Client | ConflictCol::Command | ConflictCol::Differs => {
                Column::label(header, need)
            }
        }
    }

    fn text(self, conflict: &Conflict) -> String {
        match self {
            ConflictCol::Time => clock_time(&conflict.at),
            ConflictCol::Kind | ConflictCol::KindShort => {
                let (long, short) = match conflict.kind {
                    ConflictKind::InFlight => ("409 in flight", "409"),
                    ConflictKind::Reused => ("422 reused", "422"),
                    ConflictKind::Unknown => ("?", "?"),
                };
                if self == ConflictCol::Kind {
                    long
                } else {
                    short
                }
                .to_string()
            }
            ConflictCol::Client => conflict.client.to_string(),
            ConflictCol::Key => conflict.key.to_string(),
            ConflictCol::Command => conflict.command.to_string(),
            ConflictCol::Differs if conflict.differs.is_empty() => "-".to_string(),
            ConflictCol::Differs => join_clean(&conflict.differs, ","),
        }
    }

    /// `text` in `width` cells: a name cut in its middle, words at their end, with a `…`
    /// either way.
    fn fit(self, text: &str, width: usize) -> String {
        match self {
            ConflictCol::Client | ConflictCol::Key => fit_middle(text, width),
            ConflictCol::Time
            | ConflictCol::Kind
            | ConflictCol::KindShort
            | ConflictCol::Command
            | ConflictCol::Differs => fit_text(text, width),
        }
    }
}

/// The newest messages the inbox kept instead of applying, newest first, below the
/// conflicts; `roomy` is the whole view's.
fn draw_quarantine(
    frame: &mut Frame,
    area: Rect,
    roomy: bool,
    quarantined: &[Quarantined],
    theme: Theme,
) {
    // The panel is at most half the view: when not every message fits, the title says
    // which are shown. The table does not scroll.
    let title = Parts::from("Quarantined by the inbox · newest ");
    let range = rows_range(
        title.clone().text("first · "),
        quarantined.len(),
        panel_rows(area, roomy),
        0,
    );
    let title = range.unwrap_or_else(|| title.num(usize_units(quarantined.len())));
    let inner = panel(frame, area, title, roomy, theme);
    let layout = quarantine_columns(inner.width);
    let texts: Vec<Vec<String>> = quarantined
        .iter()
        .map(|q| layout.iter().map(|(col, _)| col.text(q)).collect())
        .collect();
    let header: Vec<&str> = layout.iter().map(|(_, header)| *header).collect();
    // Nothing is selected here: the table has the whole width.
    let (widths, fitted) = fit_table(&header, &texts, inner.width, |i, need| {
        layout[i].0.column(layout[i].1, need)
    });
    let rows = texts.iter().map(|texts| {
        let cells: Vec<Cell> = layout
            .iter()
            .zip(&fitted)
            .zip(texts)
            .map(|(((col, _), width), text)| {
                let text = col.fit(text, usize::from(*width));
                match col {
                    QuarantineCol::Reason => Cell::from(Span::styled(text, theme.bad())),
                    _ => Cell::from(text),
                }
            })
            .collect();
        Row::new(cells)
    });
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(theme.header()))
        .flex(Flex::Start);
    frame.render_widget(table, inner);
}

/// A column of the quarantine table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuarantineCol {
    Time,
    /// The message's id, `-` when the message could not be read.
    Message,
    /// The reason's code: the reason starts with it (`message_id_reused: …`), and the
    /// rest is prose.
    Reason,
    /// The message as the inbox received it.
    Payload,
}

/// The quarantine table's columns for a table `width` cells wide, with their headers;
/// narrow tables drop the message id.
fn quarantine_columns(width: u16) -> Vec<(QuarantineCol, &'static str)> {
    if width >= 64 {
        vec![
            (QuarantineCol::Time, "time"),
            (QuarantineCol::Message, "message"),
            (QuarantineCol::Reason, "reason"),
            (QuarantineCol::Payload, "payload"),
        ]
    } else {
        vec![
            (QuarantineCol::Time, "time"),
            (QuarantineCol::Reason, "reason"),
            (QuarantineCol::Payload, "payload"),
        ]
    }
}

impl QuarantineCol {
    /// How the column is laid out, given its longest value's cells: as wide as that while
    /// there is room, the payload keeping the most cells when there is not.
    fn column(self, header: &str, need: usize) -> Column {
        let header = u16::try_from(cells(header)).unwrap_or(u16::MAX);
        match self {
            QuarantineCol::Time => Column::fixed(8),
            QuarantineCol::Message | QuarantineCol::Reason => Column::label(header, need),
            QuarantineCol::Payload => Column::label(header.max(12), need),
        }
    }

    fn text(self, q: &Quarantined) -> String {
        match self {
            QuarantineCol::Time => clock_time(&q.at),
            QuarantineCol::Message => q
                .message_id
                .as_ref()
                .map_or_else(|| "-".to_string(), ToString::to_string),
            QuarantineCol::Reason => q
                .reason
                .as_str()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string(),
            QuarantineCol::Payload => q.payload.to_string(),
        }
    }

    /// `text` in `width` cells: the message id cut in its middle, the reason's code and
    /// the payload at their end, with a `…` either way.
    fn fit(self, text: &str, width: usize) -> String {
        match self {
            QuarantineCol::Message => fit_middle(text, width),
            QuarantineCol::Time | QuarantineCol::Reason | QuarantineCol::Payload => {
                fit_text(text, width)
            }
        }
    }
}
