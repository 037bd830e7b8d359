//! The conflicts view: the 409 and 422 answers, and the inbox's quarantine.

use super::*;

pub(super) fn draw_conflicts(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let Some(snapshot) = &app.shown().snapshot else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    // The quarantine takes the lower part of the view, only when there is one: messages
    // refused by the inbox are conflicts of the broker's kind.
    let quarantined = app
        .shown()
        .quarantine
        .as_ref()
        .map(|q| q.quarantined.as_slice())
        .unwrap_or_default();
    // Both panels are framed alike, as the whole view would be.
    let roomy = roomy(area);
    let area = if quarantined.is_empty() || area.height < 12 {
        area
    } else {
        let rows = u16::try_from(quarantined.len()).unwrap_or(u16::MAX);
        let lower = rows.saturating_add(3).min(area.height / 2);
        let [upper, lower_area] =
            Layout::vertical([Constraint::Fill(1), Constraint::Length(lower)]).areas(area);
        draw_quarantine(frame, lower_area, roomy, quarantined, theme);
        upper
    };
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
    let title = Parts::first_fitting(title_width, vec![sorted(title), sorted(counted_only)]);
    let inner = panel(frame, area, title, roomy, theme);
    let started = started_at(app);
    let counted = counters
        .conflicts_in_flight
        .saturating_add(counters.conflicts_reused);
    if snapshot.conflicts.is_empty() {
        let text = if counted == 0 {
            "no conflicts: every repeat matched its first attempt".to_string()
        } else {
            let since = started.map(|t| format!(" at {t}")).unwrap_or_default();
            // A worker that counts its own came by them since it started: the inbox.
            let came = match snapshot.observed_scope {
                ObservedScope::Worker => "through the inbox",
                ObservedScope::Ledger | ObservedScope::Unknown => {
                    "before that, or through the inbox"
                }
            };
            format!(
                "none listed: this worker has answered none over HTTP since it started{since}; \
                 the {counted} counted came {came}"
            )
        };
        frame.render_widget(
            Paragraph::new(Span::styled(text, theme.dim())).wrap(Wrap { trim: true }),
            inner,
        );
        return;
    }
    let [listed_area, inner] =
        Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(inner);
    let listed = |kind: ConflictKind| {
        usize_units(snapshot.conflicts.iter().filter(|c| c.kind == kind).count())
    };
    let kinds = Parts::new()
        .text("listed: ")
        .num(listed(ConflictKind::InFlight))
        .text(" in flight · ")
        .num(listed(ConflictKind::Reused))
        .text(" reused");
    let since = started.map(|t| format!(" at {t}")).unwrap_or_default();
    let line = Parts::first_fitting(
        listed_area.width.into(),
        vec![
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
        ],
    );
    frame.render_widget(
        Paragraph::new(restyle(line.line(listed_area.width.into()), theme.dim())),
        listed_area,
    );
    let conflicts = app.visible_conflicts();
    if conflicts.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("none matches the filter", theme.dim())),
            inner,
        );
        return;
    }
    let wide = inner.width >= 64;
    let (header, widths) = if wide {
        (
            vec!["time", "kind", "client", "key", "command", "differs"],
            vec![
                Constraint::Length(8),
                Constraint::Length(13),
                Constraint::Length(10),
                Constraint::Fill(1),
                Constraint::Length(8),
                Constraint::Fill(1),
            ],
        )
    } else {
        (
            vec!["time", "kind", "key", "differs"],
            vec![
                Constraint::Length(8),
                Constraint::Length(4),
                Constraint::Fill(1),
                Constraint::Fill(1),
            ],
        )
    };
    let rows = conflicts.iter().map(|conflict| {
        let (kind, style) = match conflict.kind {
            ConflictKind::InFlight => ("409 in flight", theme.warn()),
            ConflictKind::Reused => ("422 reused", theme.bad()),
            ConflictKind::Unknown => ("?", Style::new()),
        };
        let differs = if conflict.differs.is_empty() {
            "-".to_string()
        } else {
            join_clean(&conflict.differs, ",")
        };
        let time = clock_time(&conflict.at);
        let cells: Vec<Cell> = if wide {
            vec![
                Cell::from(time),
                Cell::from(Span::styled(kind, style)),
                Cell::from(conflict.client.to_string()),
                Cell::from(conflict.key.to_string()),
                Cell::from(conflict.command.to_string()),
                Cell::from(differs),
            ]
        } else {
            vec![
                Cell::from(time),
                Cell::from(Span::styled(&kind[..3], style)),
                Cell::from(conflict.key.to_string()),
                Cell::from(differs),
            ]
        };
        Row::new(cells)
    });
    draw_table(
        frame,
        inner,
        Row::new(header).style(theme.header()),
        rows,
        widths,
        app.selected[View::Conflicts.index()],
        theme,
    );
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
    let title = Parts::new()
        .text("Quarantined by the inbox · newest ")
        .num(usize_units(quarantined.len()));
    let inner = panel(frame, area, title, roomy, theme);
    let wide = inner.width >= 64;
    let (header, widths) = if wide {
        (
            vec!["time", "message", "reason", "payload"],
            vec![
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(22),
                Constraint::Fill(1),
            ],
        )
    } else {
        (
            vec!["time", "reason", "payload"],
            vec![
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Fill(1),
            ],
        )
    };
    let rows = quarantined.iter().map(|q| {
        // The reason starts with its code ("message_id_reused: …"); the rest is prose.
        let code = q
            .reason
            .as_str()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let time = clock_time(&q.at);
        let payload = q.payload.to_string();
        let cells: Vec<Cell> = if wide {
            let message = q
                .message_id
                .as_ref()
                .map_or_else(|| "-".to_string(), ToString::to_string);
            vec![
                Cell::from(time),
                Cell::from(message),
                Cell::from(Span::styled(code, theme.bad())),
                Cell::from(payload),
            ]
        } else {
            vec![
                Cell::from(time),
                Cell::from(Span::styled(code, theme.bad())),
                Cell::from(payload),
            ]
        };
        Row::new(cells)
    });
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(theme.header()))
        .flex(Flex::Start);
    frame.render_widget(table, inner);
}
