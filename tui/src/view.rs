//! Drawing: turns an [`App`] into a frame and changes nothing.
//!
//! Layouts adapt to the terminal: bordered panels from 60x16 of body up, a compact
//! borderless form down to [`MIN_WIDTH`]x[`MIN_HEIGHT`], and below that a message
//! asking for a larger terminal. Without colour (`NO_COLOR`, `--no-color`) only bold,
//! dim and reverse are used, and everything a colour says is also said in text.

use chrono::DateTime;
use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Cell, Clear, HighlightSpacing, Paragraph, Row, Sparkline, Table, TableState, Wrap,
};
use serde_json::Value;

use crate::app::{
    App, BalanceSort, ConflictSort, Connection, KeySort, STALE_TICKS, TREND_WINDOW, View,
};
use crate::model::{
    Account, ConflictKind, FactRow, KeyRecord, KeyStatus, Quarantined, Snapshot, Units,
};
use crate::sanitize::{Clean, sanitize};

pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 12;

#[derive(Debug, Clone, Copy)]
struct Theme {
    color: bool,
}

impl Theme {
    fn fg(self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }
    fn bold(self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }
    fn dim(self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }
    fn good(self) -> Style {
        self.fg(Color::Green)
    }
    fn bad(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }
    fn warn(self) -> Style {
        self.fg(Color::Yellow)
    }
    fn active_tab(self) -> Style {
        if self.color {
            Style::new()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
    fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }
    fn header(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    fn applied(self) -> Style {
        self.fg(Color::Green)
    }
    fn replayed(self) -> Style {
        self.fg(Color::Blue)
    }
    fn conflicts(self) -> Style {
        self.fg(Color::Red)
    }
}

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let theme = Theme { color: app.color };
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        draw_too_small(frame, area, theme);
        return;
    }
    let banner = banner(app, theme);
    // Up to two lines, so the error itself is not cut off on a narrow terminal.
    let banner_height = banner.as_ref().map_or(0, |line| {
        if line.width() > usize::from(area.width) {
            2
        } else {
            1
        }
    });
    let [tabs, banner_area, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(banner_height),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_tabs(frame, tabs, app, theme);
    if let Some(banner) = banner {
        frame.render_widget(
            Paragraph::new(banner).wrap(Wrap { trim: true }),
            banner_area,
        );
    }
    match app.view {
        View::Overview => draw_overview(frame, body, app, theme),
        View::Keys => draw_keys(frame, body, app, theme),
        View::Conflicts => draw_conflicts(frame, body, app, theme),
        View::Balances => draw_balances(frame, body, app, theme),
        View::Log => draw_log(frame, body, app, theme),
    }
    draw_footer(frame, footer, app, theme);
    if app.help {
        draw_help(frame, area, theme);
    }
}

fn draw_too_small(frame: &mut Frame, area: Rect, theme: Theme) {
    let text = vec![
        Line::styled("Terminal too small", theme.bad()),
        Line::raw(format!("{}x{}", area.width, area.height)),
        Line::raw(format!("need {MIN_WIDTH}x{MIN_HEIGHT}")),
        Line::raw("q quits"),
    ];
    let [middle] = Layout::vertical([Constraint::Length(4)])
        .flex(Flex::Center)
        .areas(area);
    frame.render_widget(
        Paragraph::new(text)
            .alignment(Alignment::Center)
            .wrap(Wrap { trim: true }),
        middle,
    );
}

/// Roomy layouts get borders and labels; compact ones fit 40x12.
fn roomy(area: Rect) -> bool {
    area.width >= 60 && area.height >= 16
}

/// Draws a titled panel when there is room and returns the area inside it.
fn panel(frame: &mut Frame, area: Rect, title: String, roomy: bool, theme: Theme) -> Rect {
    if roomy {
        let block = Block::bordered().title(Span::styled(format!(" {title} "), theme.bold()));
        let inner = block.inner(area);
        frame.render_widget(block, area);
        inner
    } else {
        let [title_area, rest] =
            Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(area);
        frame.render_widget(
            Paragraph::new(Span::styled(title, theme.bold())),
            title_area,
        );
        rest
    }
}

fn banner(app: &App, theme: Theme) -> Option<Line<'static>> {
    let server = sanitize(&app.server);
    match &app.connection {
        Connection::Disconnected { error, attempt } => Some(Line::styled(
            format!(
                "disconnected, retrying (attempt {attempt}): {}{}",
                sanitize(error),
                if app.shown().snapshot.is_some() {
                    " · showing the last data"
                } else {
                    ""
                }
            ),
            theme.bad(),
        )),
        Connection::Connecting => Some(Line::styled(
            format!("connecting to {server}…"),
            theme.warn(),
        )),
        Connection::Live if app.ticks_since_data >= STALE_TICKS => Some(Line::styled(
            format!(
                "no data from {server} for {} s",
                app.ticks_since_data.div_ceil(4)
            ),
            theme.warn(),
        )),
        Connection::Live => {
            let problems: Vec<String> = app
                .problems
                .iter()
                .map(|(endpoint, error)| format!("{endpoint}: {}", sanitize(error)))
                .collect();
            (!problems.is_empty()).then(|| Line::styled(problems.join(" · "), theme.warn()))
        }
    }
}

fn draw_tabs(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let (status, style) = match (&app.connection, app.paused()) {
        (_, true) => (
            "‖ paused".to_string(),
            theme.warn().add_modifier(Modifier::BOLD),
        ),
        (Connection::Live, false) => {
            let seq = app.shown().snapshot.as_ref().map_or(0, |s| s.last_seq);
            if area.width >= 80 {
                (format!("● live · seq {seq}"), theme.good())
            } else {
                ("● live".to_string(), theme.good())
            }
        }
        (Connection::Connecting, false) => ("… connecting".to_string(), theme.warn()),
        (Connection::Disconnected { .. }, false) => ("✕ offline".to_string(), theme.bad()),
    };
    let status_width = u16::try_from(status.chars().count() + 1).unwrap_or(u16::MAX);
    let [left, right] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(status_width)]).areas(area);
    let full = area.width >= 70;
    let mut spans = Vec::new();
    for view in View::ALL {
        let number = view.index() + 1;
        if view == app.view {
            spans.push(Span::styled(
                format!(" {number} {} ", view.title()),
                theme.active_tab(),
            ));
        } else if full {
            spans.push(Span::raw(format!(" {number} {} ", view.title())));
        } else {
            spans.push(Span::raw(format!(" {number} ")));
        }
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), left);
    frame.render_widget(
        Paragraph::new(Span::styled(status, style)).alignment(Alignment::Right),
        right,
    );
}

fn draw_footer(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let line = if let Some(input) = &app.input {
        let hint = if app.view == View::Keys {
            "  Enter apply · Esc cancel · status:pending client:NAME text"
        } else {
            "  Enter apply · Esc cancel"
        };
        Line::from(vec![
            Span::styled("/", theme.bold()),
            Span::raw(sanitize(input)),
            Span::styled("█", theme.bold()),
            Span::styled(hint, theme.dim()),
        ])
    } else {
        let mut spans = Vec::new();
        let filter = app.filter(app.view);
        if !filter.is_empty() {
            spans.push(Span::styled(
                format!("filter: {}", sanitize(filter)),
                theme.warn().add_modifier(Modifier::BOLD),
            ));
            spans.push(Span::raw(" │ "));
        }
        let hints = match app.view {
            _ if area.width < 60 => "? help · q quit",
            View::Keys if app.detail_open => "Esc close · ? help · / filter · s sort · q quit",
            View::Keys => "Enter detail · [ ] page · / filter · s sort · p pause · ? help · q quit",
            View::Overview => "1-5 Tab views · / filter keys · p pause · ? help · q quit",
            View::Log => "j/k scroll · End follow · / filter · p pause · ? help · q quit",
            View::Conflicts | View::Balances => {
                "j/k move · / filter · s sort · p pause · ? help · q quit"
            }
        };
        spans.push(Span::styled(hints, theme.dim()));
        Line::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}

const HELP: &[(&str, &str)] = &[
    ("Tab Shift-Tab 1-5", "switch view"),
    ("j k ↑ ↓", "move"),
    ("PgUp PgDn Home End", "jump"),
    ("/", "filter; Enter applies, Esc cancels"),
    ("", "keys: status:pending client:NAME text"),
    ("Enter", "key detail (Keys view)"),
    ("[ ]", "previous / next page of keys"),
    ("s", "change the sort order"),
    ("p", "pause / resume the display"),
    ("?", "this help"),
    ("q Esc Ctrl-C", "quit"),
];

/// The same keys in words that fit a 40-column terminal.
const HELP_SHORT: &[(&str, &str)] = &[
    ("Tab 1-5", "switch view"),
    ("j k ↑ ↓", "move"),
    ("PgUp PgDn", "page"),
    ("Home End", "first, last"),
    ("/", "filter (Enter, Esc)"),
    ("Enter [ ]", "key detail, pages"),
    ("s p", "sort, pause"),
    ("q Esc ^C", "quit"),
];

fn draw_help(frame: &mut Frame, area: Rect, theme: Theme) {
    let (help, key_width) = if area.width >= 64 && area.height >= 18 {
        (HELP, 20)
    } else {
        (HELP_SHORT, 11)
    };
    let lines_needed = u16::try_from(help.len() + 3).unwrap_or(u16::MAX);
    let width = area.width.saturating_sub(2).min(60);
    let height = area.height.min(lines_needed);
    let [popup] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(popup);
    frame.render_widget(Clear, popup);
    let block = Block::bordered().title(Span::styled(" Help ", theme.bold()));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let mut lines: Vec<Line> = help
        .iter()
        .map(|(keys, what)| {
            Line::from(vec![
                Span::styled(format!("{keys:<key_width$}"), theme.header()),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::styled("any key closes this help", theme.dim()));
    frame.render_widget(Paragraph::new(lines), inner);
}

// ---------------------------------------------------------------- overview

fn draw_overview(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let Some(snapshot) = &app.shown().snapshot else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    if roomy(area) {
        // Tall terminals also list the pending keys; the sparklines stop growing.
        let tall = area.height >= 30;
        let [top, middle, pending, bottom] = Layout::vertical([
            Constraint::Length(7),
            if tall {
                Constraint::Length(11)
            } else {
                Constraint::Min(5)
            },
            Constraint::Fill(u16::from(tall)),
            Constraint::Length(5),
        ])
        .areas(area);
        let [keys_area, commit_area] =
            Layout::horizontal([Constraint::Fill(1), Constraint::Fill(1)]).areas(top);
        let inner = panel(frame, keys_area, "Keys".into(), true, theme);
        let mut lines = key_count_lines(app, snapshot, theme);
        lines.push(Line::from(vec![
            Span::raw("duplicates absorbed "),
            Span::styled(snapshot.counters.replayed.to_string(), theme.bold()),
        ]));
        lines.push(oldest_pending_line(snapshot, theme));
        frame.render_widget(Paragraph::new(lines), inner);

        let inner = panel(frame, commit_area, "Storage".into(), true, theme);
        let commit = snapshot.commit;
        let lines = vec![
            Line::raw(format!(
                "commit   p50 {} · p99 {}",
                millis(commit.p50_ms),
                millis(commit.p99_ms)
            )),
            Line::raw(format!(
                "batch    {:.1} avg over {} batches",
                commit.batch_size_avg, commit.batches
            )),
            Line::raw(format!("on disk  {}", disk_size(snapshot))),
            verify_line(snapshot, "verify   ", theme),
            Line::styled(
                format!(
                    "         {}",
                    snapshot
                        .verify
                        .as_ref()
                        .map_or("", |verify| verify.summary.as_str())
                ),
                theme.dim(),
            ),
        ];
        frame.render_widget(Paragraph::new(lines), inner);

        let seconds = middle.width.saturating_sub(24);
        let inner = panel(
            frame,
            middle,
            format!("Throughput per second, last {seconds} s"),
            true,
            theme,
        );
        draw_throughput(frame, inner, snapshot, 22, theme);
        if tall {
            draw_pending(frame, pending, snapshot, theme);
        }

        let inner = panel(frame, bottom, "Totals".into(), true, theme);
        let counters = &snapshot.counters;
        let lines = vec![
            Line::raw(format!(
                "applied {} · rejected {} · replayed {} · expired {}",
                counters.applied, counters.rejected, counters.replayed, counters.expired
            )),
            Line::raw(format!(
                "conflicts: 409 in flight {} · 422 reused {}",
                counters.conflicts_in_flight, counters.conflicts_reused
            )),
            rejections_line(snapshot),
        ];
        frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), inner);
    } else {
        let [keys_area, throughput, rest] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(3),
            Constraint::Fill(1),
        ])
        .areas(area);
        let counts = snapshot.keys;
        let trend = trends(app);
        let line = Line::from(vec![
            Span::raw("pend "),
            Span::styled(counts.pending.to_string(), theme.bold()),
            Span::raw(format!("{} · done ", trend_text(trend[0], true))),
            Span::styled(counts.done.to_string(), theme.bold()),
            Span::raw(format!("{} · exp ", trend_text(trend[1], true))),
            Span::styled(counts.expired.to_string(), theme.bold()),
            Span::raw(trend_text(trend[2], true)),
        ]);
        frame.render_widget(Paragraph::new(line), keys_area);
        draw_throughput(frame, throughput, snapshot, 13, theme);
        let commit = snapshot.commit;
        let counters = &snapshot.counters;
        let lines = vec![
            Line::raw(format!(
                "p50 {} p99 {} batch {:.1}",
                millis(commit.p50_ms),
                millis(commit.p99_ms),
                commit.batch_size_avg
            )),
            Line::raw(format!("disk {}", disk_size(snapshot))),
            verify_line(snapshot, "verify ", theme),
            oldest_pending_line(snapshot, theme),
            Line::raw(format!(
                "applied {} rej {} replayed {}",
                counters.applied, counters.rejected, counters.replayed
            )),
            Line::raw(format!(
                "409 {} · 422 {} · expired {}",
                counters.conflicts_in_flight, counters.conflicts_reused, counters.expired
            )),
        ];
        frame.render_widget(Paragraph::new(lines), rest);
    }
}

fn draw_waiting(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let server = sanitize(&app.server);
    let text = match app.connection {
        Connection::Disconnected { .. } => {
            format!("no data yet: nothing answers at {server}. Is `inbox-worker serve` running?")
        }
        _ => format!("waiting for data from {server}…"),
    };
    frame.render_widget(
        Paragraph::new(Span::styled(text, theme.dim())).wrap(Wrap { trim: true }),
        area,
    );
}

/// Change of (pending, done, expired) over the trend window.
fn trends(app: &App) -> [i128; 3] {
    let history = &app.shown().key_history;
    let (Some(newest), Some(oldest)) = (
        history.back(),
        history.get(history.len().saturating_sub(TREND_WINDOW + 1)),
    ) else {
        return [0; 3];
    };
    let delta = |new: u64, old: u64| i128::from(new) - i128::from(old);
    [
        delta(newest.pending, oldest.pending),
        delta(newest.done, oldest.done),
        delta(newest.expired, oldest.expired),
    ]
}

fn trend_text(delta: i128, compact: bool) -> String {
    match (delta.signum(), compact) {
        (1, true) => format!(" ↑{delta}"),
        (-1, true) => format!(" ↓{}", -delta),
        (_, true) => " =".to_string(),
        (1, false) => format!("↑ +{delta}"),
        (-1, false) => format!("↓ {delta}"),
        (_, false) => "= 0".to_string(),
    }
}

fn key_count_lines(app: &App, snapshot: &Snapshot, theme: Theme) -> Vec<Line<'static>> {
    let trend = trends(app);
    let counts = snapshot.keys;
    [
        ("pending", counts.pending, trend[0]),
        ("done", counts.done, trend[1]),
        ("expired", counts.expired, trend[2]),
    ]
    .into_iter()
    .map(|(label, count, delta)| {
        Line::from(vec![
            Span::raw(format!("{label:<8}")),
            Span::styled(format!("{count:>10}"), theme.bold()),
            Span::styled(format!("  {}", trend_text(delta, false)), theme.dim()),
        ])
    })
    .collect()
}

/// The verify result and its age; the summary goes on its own line where there is room.
fn verify_line(snapshot: &Snapshot, label: &str, theme: Theme) -> Line<'static> {
    match &snapshot.verify {
        None => Line::from(vec![
            Span::raw(label.to_string()),
            Span::styled("not run yet", theme.dim()),
        ]),
        Some(verify) => {
            let (word, style) = if verify.ok {
                ("ok", theme.good())
            } else {
                ("FAILED", theme.bad())
            };
            let ago = ago(&snapshot.now, &verify.at).unwrap_or_default();
            Line::from(vec![
                Span::raw(label.to_string()),
                Span::styled(word, style.add_modifier(Modifier::BOLD)),
                Span::raw(format!(" {ago}")),
            ])
        }
    }
}

fn oldest_pending_line(snapshot: &Snapshot, theme: Theme) -> Line<'static> {
    match snapshot.pending.first() {
        None => Line::styled("nothing pending", theme.dim()),
        Some(oldest) => Line::from(vec![
            Span::raw(format!("oldest pending {} ", format_age(oldest.age_ms))),
            if oldest.lease_expired {
                Span::styled("lease expired!", theme.bad())
            } else {
                Span::styled(oldest.key.to_string(), theme.dim())
            },
        ]),
    }
}

/// The snapshot's pending keys, oldest first: what is in flight right now.
fn draw_pending(frame: &mut Frame, area: Rect, snapshot: &Snapshot, theme: Theme) {
    let inner = panel(frame, area, "Pending now, oldest first".into(), true, theme);
    if snapshot.pending.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("nothing in flight", theme.dim())),
            inner,
        );
        return;
    }
    let rows = snapshot.pending.iter().map(|record| {
        let (lease, style) = if record.lease_expired {
            ("lease expired!", theme.bad())
        } else {
            ("", theme.warn())
        };
        Row::new(vec![
            record.client.to_string(),
            record.key.to_string(),
            record.command.to_string(),
            target(record),
            money(record.amount, &record.currency),
            format_age(record.age_ms),
            lease.to_string(),
        ])
        .style(style)
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Fill(1),
            Constraint::Length(8),
            Constraint::Length(12),
            Constraint::Length(14),
            Constraint::Length(7),
            Constraint::Length(14),
        ],
    )
    .header(
        Row::new(vec![
            "client", "key", "command", "account", "amount", "age", "",
        ])
        .style(theme.header()),
    );
    frame.render_widget(table, inner);
}

fn rejections_line(snapshot: &Snapshot) -> Line<'static> {
    let rejections: Vec<String> = snapshot
        .counters
        .rejections
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(code, count)| format!("{code} {count}"))
        .collect();
    if rejections.is_empty() {
        Line::raw("rejections: none")
    } else {
        Line::raw(format!("rejections: {}", rejections.join(" · ")))
    }
}

/// Three sparklines on one scale (applied, replayed, conflicts), labelled with the
/// newest second and the peak of the window.
fn draw_throughput(frame: &mut Frame, area: Rect, snapshot: &Snapshot, label: u16, theme: Theme) {
    let rows = Layout::vertical([Constraint::Fill(1); 3]).split(area);
    let [_, chart_width] =
        Layout::horizontal([Constraint::Length(label), Constraint::Fill(1)]).areas(area);
    let window = usize::from(chart_width.width);
    let samples = &snapshot.throughput[snapshot.throughput.len().saturating_sub(window)..];
    let series: [(&str, Vec<u64>, Style); 3] = [
        (
            "applied",
            samples.iter().map(|s| s.applied).collect(),
            theme.applied(),
        ),
        (
            "replayed",
            samples.iter().map(|s| s.replayed).collect(),
            theme.replayed(),
        ),
        (
            "conflicts",
            samples.iter().map(|s| s.conflicts).collect(),
            theme.conflicts(),
        ),
    ];
    // One scale for all three, so a conflict spike is not drawn as tall as the traffic.
    let max = series
        .iter()
        .flat_map(|(_, data, _)| data.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    for ((name, data, style), row) in series.iter().zip(rows.iter()) {
        let [label_area, chart] =
            Layout::horizontal([Constraint::Length(label), Constraint::Fill(1)]).areas(*row);
        let now = data.last().copied().unwrap_or(0);
        let peak = data.iter().copied().max().unwrap_or(0);
        let text = if label >= 20 {
            format!("{name:<10}{now:>4}/s ^{peak}")
        } else {
            format!("{name:<10}{now:>3}")
        };
        frame.render_widget(Paragraph::new(Span::styled(text, *style)), label_area);
        frame.render_widget(
            Sparkline::default().data(data).max(max).style(*style),
            chart,
        );
    }
}

// ---------------------------------------------------------------- keys

fn draw_keys(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let detail = app.detail_open.then(|| app.selected_key()).flatten();
    let (table_area, detail_area) = match detail {
        None => (area, None),
        Some(_) if area.width >= 100 => {
            let [table, detail] =
                Layout::horizontal([Constraint::Fill(3), Constraint::Fill(2)]).areas(area);
            (table, Some(detail))
        }
        Some(_) if roomy => {
            let [table, detail] = Layout::vertical([
                Constraint::Fill(1),
                Constraint::Length((area.height / 2 + 2).min(14)),
            ])
            .areas(area);
            (table, Some(detail))
        }
        // Too little room for both: the detail takes the whole body.
        Some(_) => (Rect::default(), Some(area)),
    };
    if let (Some(record), Some(detail_area)) = (detail, detail_area) {
        draw_key_detail(frame, detail_area, app, record, roomy, theme);
    }
    if table_area.is_empty() {
        return;
    }
    let keys = app.visible_keys();
    let page = app.shown().keys.as_ref();
    // Compact layouts drop the name: the tab bar already says it.
    let mut title = if roomy { "Keys · " } else { "" }.to_string();
    if let Some(page) = page {
        title.push_str(&format!("{} shown", keys.len()));
        if page.next.is_some() {
            title.push_str(", more: ]");
        }
        if !app.key_pages.is_empty() {
            title.push_str(&format!(" · page {}", app.key_pages.len() + 1));
        }
    }
    match app.sorts.keys {
        KeySort::Server => {}
        KeySort::OldestFirst => title.push_str(" · oldest first"),
        KeySort::Key => title.push_str(" · by key"),
        KeySort::Client => title.push_str(" · by client"),
    }
    if keys.iter().any(|k| k.lease_expired) {
        title.push_str(" · ! lease expired");
    }
    let inner = panel(frame, table_area, title, roomy, theme);
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
    let width = inner.width;
    let (header, widths): (Vec<&str>, Vec<Constraint>) = if width >= 100 {
        (
            vec![
                "status",
                "client",
                "key",
                "command",
                "account",
                "amount",
                "age",
                "replays",
                "conflicts",
            ],
            vec![
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Fill(1),
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(14),
                Constraint::Length(7),
                Constraint::Length(7),
                Constraint::Length(9),
            ],
        )
    } else if width >= 64 {
        (
            vec![
                "status", "client", "key", "command", "amount", "age", "repl",
            ],
            vec![
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Fill(1),
                Constraint::Length(8),
                Constraint::Length(13),
                Constraint::Length(7),
                Constraint::Length(4),
            ],
        )
    } else {
        (
            vec!["status", "key", "age"],
            vec![
                Constraint::Length(8),
                Constraint::Fill(1),
                Constraint::Length(7),
            ],
        )
    };
    let columns = header.len();
    let rows = keys.iter().map(|record| {
        let status = match (record.status, record.lease_expired) {
            (KeyStatus::Pending, true) => "pending!".to_string(),
            (status, _) => status.name().to_string(),
        };
        let style = if record.lease_expired {
            theme.bad()
        } else {
            match record.status {
                KeyStatus::Pending => theme.warn(),
                KeyStatus::Expired => theme.dim(),
                KeyStatus::Done | KeyStatus::Unknown => Style::new(),
            }
        };
        let all = [
            status,
            record.client.to_string(),
            record.key.to_string(),
            record.command.to_string(),
            target(record),
            money(record.amount, &record.currency),
            format_age(record.age_ms),
            record.replays.to_string(),
            record.conflicts.to_string(),
        ];
        let cells: Vec<Cell> = match columns {
            9 => all.into_iter().map(Cell::from).collect(),
            7 => [0, 1, 2, 3, 5, 6, 7]
                .iter()
                .map(|i| Cell::from(all[*i].clone()))
                .collect(),
            _ => [0, 2, 6]
                .iter()
                .map(|i| Cell::from(all[*i].clone()))
                .collect(),
        };
        Row::new(cells).style(style)
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

fn draw_key_detail(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    record: &KeyRecord,
    roomy: bool,
    theme: Theme,
) {
    let inner = panel(frame, area, "Key detail".into(), roomy, theme);
    let label = |text: &str| Span::styled(format!("{text:<10}"), theme.header());
    let mut lines = vec![
        Line::from(vec![label("client"), Span::raw(record.client.to_string())]),
        Line::from(vec![label("key"), Span::raw(record.key.to_string())]),
        Line::from(vec![
            label("status"),
            Span::raw(format!(
                "{}, age {}",
                record.status.name(),
                format_age(record.age_ms)
            )),
            if record.lease_expired {
                Span::styled(" lease expired!", theme.bad())
            } else {
                Span::raw("")
            },
        ]),
        Line::from(vec![
            label("command"),
            Span::raw(format!(
                "{} {} {}",
                record.command,
                money(record.amount, &record.currency),
                target(record)
            )),
        ]),
        Line::from(vec![
            label("repeats"),
            Span::raw(format!(
                "{} replayed · {} conflicted",
                record.replays, record.conflicts
            )),
        ]),
    ];
    lines.push(Line::from(vec![
        label("outcome"),
        Span::raw(match &record.outcome {
            Some(outcome) => fields_text(outcome),
            None if record.status == KeyStatus::Pending => "none yet: in flight".to_string(),
            None => "not stored (swept after retention)".to_string(),
        }),
    ]));
    let fact = app
        .shown()
        .detail
        .as_ref()
        .filter(|d| d.client == record.client && d.key == record.key)
        .and_then(|d| d.fact.as_ref())
        .or(record.fact.as_ref());
    lines.push(Line::from(vec![
        label("fact"),
        Span::raw(match fact {
            Some(fact) => fields_text(fact),
            None if record.status == KeyStatus::Pending => "none yet: in flight".to_string(),
            None => "loading…".to_string(),
        }),
    ]));
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

/// The account a command names, or for a refund the withdrawal it refunds.
fn target(record: &KeyRecord) -> String {
    match &record.withdrawal {
        Some(withdrawal) if record.account.is_empty() => format!("of {withdrawal}"),
        _ => record.account.to_string(),
    }
}

// ---------------------------------------------------------------- conflicts

fn draw_conflicts(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
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
    let mut title = if roomy {
        format!(
            "Conflicts · 409 in flight {} · 422 reused {} · duplicates absorbed {}",
            counters.conflicts_in_flight, counters.conflicts_reused, counters.replayed
        )
    } else {
        format!(
            "409 {} · 422 {} · absorbed {}",
            counters.conflicts_in_flight, counters.conflicts_reused, counters.replayed
        )
    };
    match app.sorts.conflicts {
        ConflictSort::Newest => {}
        ConflictSort::Client => title.push_str(" · by client"),
        ConflictSort::Key => title.push_str(" · by key"),
    }
    let inner = panel(frame, area, title, roomy, theme);
    let conflicts = app.visible_conflicts();
    if conflicts.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled(
                "no conflicts: every repeat matched its first attempt",
                theme.dim(),
            ))
            .wrap(Wrap { trim: true }),
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
    let title = format!("Quarantined by the inbox · newest {}", quarantined.len());
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

// ---------------------------------------------------------------- balances

fn draw_balances(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let Some(page) = &app.shown().accounts else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    let (users, system) = app.visible_accounts();
    let sums = currency_sums(&page.accounts, &page.sums);
    let system_rows = u16::try_from(system.len().min(6)).unwrap_or(6);
    let sum_rows = u16::try_from(sums.len().clamp(1, 4)).unwrap_or(4);
    let chrome = if roomy { 2 } else { 1 };
    let [users_area, system_area, sums_area] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(if roomy { system_rows + chrome + 1 } else { 2 }),
        Constraint::Length(if roomy { sum_rows + chrome } else { 1 }),
    ])
    .areas(area);

    let sort = match app.sorts.balances {
        BalanceSort::Account => "by account",
        BalanceSort::Currency => "by currency",
        BalanceSort::BalanceHighFirst => "by balance ↓",
        BalanceSort::BalanceLowFirst => "by balance ↑",
    };
    let inner = panel(
        frame,
        users_area,
        format!("Accounts · {} · {sort}", users.len()),
        roomy,
        theme,
    );
    let rows = users.iter().map(|account| account_row(account));
    draw_table(
        frame,
        inner,
        balance_header(theme),
        rows,
        BALANCE_COLUMNS.to_vec(),
        app.selected[View::Balances.index()],
        theme,
    );

    if roomy {
        let inner = panel(frame, system_area, "System accounts".into(), true, theme);
        let rows = system.iter().map(|account| account_row(account));
        let table = Table::new(rows, BALANCE_COLUMNS)
            .flex(Flex::Start)
            .header(balance_header(theme))
            .highlight_spacing(HighlightSpacing::Always)
            .highlight_symbol("  ");
        frame.render_widget(table, inner);
        let inner = panel(frame, sums_area, "Sum per currency".into(), true, theme);
        let lines: Vec<Line> = sums.iter().map(|sum| sum_line(sum, theme, false)).collect();
        frame.render_widget(Paragraph::new(lines), inner);
    } else {
        let system_text: Vec<String> = system
            .iter()
            .map(|a| format!("{} {}", a.account, money_signed(a.balance, &a.currency)))
            .collect();
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled("system ", theme.bold()),
                Span::raw(system_text.join(" · ")),
            ]))
            .wrap(Wrap { trim: true }),
            system_area,
        );
        let mut spans = vec![Span::styled("sum ", theme.bold())];
        for sum in &sums {
            spans.extend(sum_line(sum, theme, true).spans);
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), sums_area);
    }
}

/// Account names are short; a wide name column would push the numbers off to the edge.
const BALANCE_COLUMNS: [Constraint; 3] = [
    Constraint::Max(32),
    Constraint::Length(8),
    Constraint::Length(18),
];

fn balance_header(theme: Theme) -> Row<'static> {
    Row::new(vec![
        Cell::from("account"),
        Cell::from("currency"),
        Cell::from(Line::raw("balance").alignment(Alignment::Right)),
    ])
    .style(theme.header())
}

fn account_row(account: &Account) -> Row<'static> {
    Row::new(vec![
        Cell::from(account.account.to_string()),
        Cell::from(account.currency.to_string()),
        Cell::from(Line::raw(account.balance.to_string()).alignment(Alignment::Right)),
    ])
}

struct CurrencySum {
    currency: Clean,
    /// Summed here over every account, filters aside. i128: no overflow whatever the feed.
    local: i128,
    /// What the worker reported, if it did.
    reported: Option<i128>,
}

fn currency_sums(
    accounts: &[Account],
    reported: &std::collections::BTreeMap<Clean, Units>,
) -> Vec<CurrencySum> {
    let mut sums: std::collections::BTreeMap<Clean, i128> = std::collections::BTreeMap::new();
    for account in accounts {
        *sums.entry(account.currency.clone()).or_default() += account.balance.0;
    }
    for currency in reported.keys() {
        sums.entry(currency.clone()).or_default();
    }
    sums.into_iter()
        .map(|(currency, local)| CurrencySum {
            reported: reported.get(&currency).map(|units| units.0),
            currency,
            local,
        })
        .collect()
}

fn sum_line(sum: &CurrencySum, theme: Theme, compact: bool) -> Line<'static> {
    let balanced = sum.local == 0 && sum.reported.is_none_or(|r| r == 0);
    let (mark, style) = if balanced {
        ("✓", theme.good())
    } else {
        ("✗", theme.bad())
    };
    let mut spans = vec![
        Span::styled(format!("{} ", sum.currency), theme.bold()),
        Span::raw(format!("= {} ", sum.local)),
        Span::styled(mark, style.add_modifier(Modifier::BOLD)),
    ];
    if !compact {
        spans.push(Span::styled(
            if balanced {
                "  balanced: every movement has two legs".to_string()
            } else {
                format!(
                    "  NOT ZERO (worker says {})",
                    sum.reported
                        .map_or("nothing".to_string(), |r| r.to_string())
                )
            },
            style,
        ));
    } else {
        spans.push(Span::raw("  "));
    }
    Line::from(spans)
}

// ---------------------------------------------------------------- log

fn draw_log(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let facts = app.visible_facts();
    let mode = if app.follow_log {
        "following"
    } else {
        "scrolled, End follows"
    };
    let inner = panel(
        frame,
        area,
        format!("Log · {} facts · {mode}", facts.len()),
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
    let wide = inner.width >= 100;
    let (header, widths) = if wide {
        (
            vec![
                "seq", "time", "client", "key", "fact", "account", "amount", "after",
            ],
            vec![
                Constraint::Length(6),
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Fill(1),
                Constraint::Length(30),
                Constraint::Length(10),
                Constraint::Length(13),
                Constraint::Length(10),
            ],
        )
    } else if inner.width >= 64 {
        (
            vec!["seq", "key", "fact", "account", "amount"],
            vec![
                Constraint::Length(6),
                Constraint::Fill(1),
                Constraint::Length(28),
                Constraint::Length(9),
                Constraint::Length(11),
            ],
        )
    } else {
        (
            vec!["seq", "key", "fact"],
            vec![
                Constraint::Length(5),
                Constraint::Fill(1),
                Constraint::Length(12),
            ],
        )
    };
    let columns = header.len();
    let rows = facts.iter().map(|fact| {
        let style = if fact.code.is_some() {
            theme.warn()
        } else {
            Style::new()
        };
        let name = fact_name(fact);
        let cells: Vec<String> = match columns {
            8 => vec![
                fact.seq.to_string(),
                clock_time(&fact.at),
                fact.client.to_string(),
                fact.key.to_string(),
                name,
                fact_target(fact),
                money(fact.amount, &fact.currency),
                fact.balance_after.map_or(String::new(), |b| b.to_string()),
            ],
            5 => vec![
                fact.seq.to_string(),
                fact.key.to_string(),
                name,
                fact_target(fact),
                money(fact.amount, &fact.currency),
            ],
            _ => vec![
                fact.seq.to_string(),
                fact.key.to_string(),
                fact.name.as_str().trim_end_matches("Recorded").to_string(),
            ],
        };
        Row::new(cells).style(style)
    });
    draw_table(
        frame,
        inner,
        Row::new(header).style(theme.header()),
        rows,
        widths,
        app.selected[View::Log.index()],
        theme,
    );
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

// ---------------------------------------------------------------- shared

fn draw_table<'a>(
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

/// A JSON value from the feed as one line of text, with client strings sanitised.
/// serde_json escapes C0 controls itself; `sanitize` removes the rest (C1, bidi).
pub fn json_text(value: &Value) -> String {
    sanitize(&serde_json::to_string(value).unwrap_or_default())
}

/// A JSON object as `name=value` words, so it wraps at word boundaries in a narrow
/// pane; anything else as JSON. Sanitised like [`json_text`].
fn fields_text(value: &Value) -> String {
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(name, value)| match value {
                Value::String(text) => format!("{}={}", sanitize(name), sanitize(text)),
                other => format!("{}={}", sanitize(name), json_text(other)),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => json_text(other),
    }
}

fn join_clean(items: &[Clean], separator: &str) -> String {
    items
        .iter()
        .map(Clean::as_str)
        .collect::<Vec<_>>()
        .join(separator)
}

/// Amounts stay integers of minor units, as the ledger keeps them.
fn money(amount: Option<u64>, currency: &Clean) -> String {
    match amount {
        Some(amount) => format!("{amount} {currency}"),
        None => String::new(),
    }
}

fn money_signed(amount: Units, currency: &Clean) -> String {
    format!("{amount} {currency}")
}

pub fn format_age(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0 => format!("{ms}ms"),
        1..60 => format!("{seconds}.{}s", (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
        _ => format!("{}d{:02}h", seconds / 86_400, (seconds % 86_400) / 3600),
    }
}

fn millis(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_string(), |ms| format!("{ms:.1} ms"))
}

fn disk_size(snapshot: &Snapshot) -> String {
    snapshot
        .size_on_disk_bytes
        .map_or_else(|| "unknown".to_string(), format_bytes)
}

pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    // A display value only; the precision lost on petabytes does not matter.
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `HH:MM:SS` of an RFC 3339 time, in the worker's zone as sent; the text itself if it
/// does not parse.
fn clock_time(at: &Clean) -> String {
    match DateTime::parse_from_rfc3339(at.as_str()) {
        Ok(time) => time.format("%H:%M:%S").to_string(),
        Err(_) => at.as_str().chars().take(8).collect(),
    }
}

/// How long before the worker's `now` a time was.
fn ago(now: &Clean, at: &Clean) -> Option<String> {
    let now = DateTime::parse_from_rfc3339(now.as_str()).ok()?;
    let at = DateTime::parse_from_rfc3339(at.as_str()).ok()?;
    let ms = u64::try_from((now - at).num_milliseconds()).unwrap_or(0);
    Some(format!("{} ago", format_age(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(format_age(12), "12ms");
        assert_eq!(format_age(1_250), "1.2s");
        assert_eq!(format_age(65_000), "1m05s");
        assert_eq!(format_age(3_600_000 * 2 + 60_000 * 10), "2h10m");
        assert_eq!(format_age(86_400_000 + 3_600_000), "1d01h");
        assert_eq!(format_bytes(123_456), "120.6 KiB");
        assert_eq!(format_bytes(10), "10 B");
    }
}
