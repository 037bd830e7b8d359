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
use crate::fit::{
    Column, Part, Parts, cells, columns, fit_money, fit_number, fit_tail, fit_text, fit_with_unit,
    pack, shortest_money,
};
use crate::model::{
    Account, ConflictKind, FactRow, KeyRecord, KeyStatus, ObservedScope, Quarantined, Snapshot,
    ThroughputSample, Units,
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

/// Draws a titled panel when there is room and returns the area inside it. Titles carry
/// counters, so they are fitted like any line of numbers.
fn panel(
    frame: &mut Frame,
    area: Rect,
    title: impl Into<Parts>,
    roomy: bool,
    theme: Theme,
) -> Rect {
    let title = title.into();
    if roomy {
        // The border's corners and a space either side of the title.
        let mut spans = vec![Span::raw(" ")];
        spans.extend(title.line(usize::from(area.width.saturating_sub(4))).spans);
        spans.push(Span::raw(" "));
        let block = Block::bordered().title(restyle(Line::from(spans), theme.bold()));
        let inner = block.inner(area);
        frame.render_widget(block, area);
        inner
    } else {
        let [title_area, rest] =
            Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(area);
        frame.render_widget(
            Paragraph::new(restyle(
                title.line(usize::from(title_area.width)),
                theme.bold(),
            )),
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
    // A long seq takes the room of the view names rather than be cut.
    let names: usize = View::ALL
        .iter()
        .map(|view| cells(&format!(" {} {} ", view.index() + 1, view.title())))
        .sum();
    let full = area.width >= 70 && names <= usize::from(left.width);
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
            // The keys' title has no room for the order here, so the footer says it.
            View::Keys if area.width < 60 && !app.detail_open => match app.sorts.keys {
                KeySort::Newest => "s: newest first · ? help · q quit",
                KeySort::Key => "s: by key · ? help · q quit",
            },
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
        let inner = panel(frame, keys_area, "Keys", true, theme);
        let mut lines = key_count_lines(app, snapshot, theme);
        let absorbed = Parts::new().text("duplicates absorbed ").num_styled(
            snapshot.counters.replayed,
            theme.bold(),
            0,
        );
        lines.push(match snapshot.observed_scope {
            ObservedScope::Worker => Parts::first_fitting(
                inner.width.into(),
                vec![
                    absorbed.clone().text(" since the worker started"),
                    absorbed.text(" (this worker)"),
                ],
            ),
            ObservedScope::Ledger | ObservedScope::Unknown => absorbed,
        });
        lines.push(oldest_pending_line(snapshot, theme));
        draw_lines(frame, inner, &lines);

        let inner = panel(frame, commit_area, "Storage", true, theme);
        let commit = snapshot.commit;
        let lines = vec![
            Parts::from(format!(
                "commit   p50 {} · p99 {}",
                millis(commit.p50_ms),
                millis(commit.p99_ms)
            )),
            Parts::new()
                .text(format!(
                    "batch    {} avg over ",
                    decimal(commit.batch_size_avg)
                ))
                .count(commit.batches, "batch", "batches"),
            disk_line(snapshot, "on disk  ", inner.width.into(), theme),
        ];
        let lines: Vec<Parts> = lines
            .into_iter()
            .chain(verify_lines(snapshot, theme, inner.width.into(), false))
            .collect();
        draw_lines(frame, inner, &lines);

        // The panel's borders take two cells, the labels theirs; the rest is one per second.
        let inner_width = middle.width.saturating_sub(2);
        let seconds = inner_width.saturating_sub(throughput_label(snapshot, true, inner_width));
        let inner = panel(
            frame,
            middle,
            Parts::new()
                .text("Throughput per second, last ")
                .num(seconds)
                .text(" s"),
            true,
            theme,
        );
        draw_throughput(frame, inner, snapshot, true, theme);
        if tall {
            draw_pending(frame, pending, snapshot, theme);
        }

        let inner = panel(
            frame,
            bottom,
            totals_title(app, snapshot, bottom.width),
            true,
            theme,
        );
        let counters = &snapshot.counters;
        let lines = vec![
            Parts::new()
                .text("applied ")
                .num(counters.applied)
                .text(" · rejected ")
                .num(counters.rejected)
                .text(" · replayed ")
                .num(counters.replayed)
                .text(" · expired ")
                .num(counters.expired),
            Parts::new()
                .text("conflicts: 409 in flight ")
                .num(counters.conflicts_in_flight)
                .text(" · 422 reused ")
                .num(counters.conflicts_reused),
            rejections_line(snapshot),
        ];
        draw_lines(frame, inner, &lines);
    } else {
        let [keys_area, throughput, rest] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(3),
            Constraint::Fill(1),
        ])
        .areas(area);
        let counts = snapshot.keys;
        let trend = trends(app);
        let line = trend_parts(
            trend_parts(
                trend_parts(
                    Parts::new()
                        .text("pend ")
                        .num_styled(counts.pending, theme.bold(), 0),
                    trend[0],
                )
                .text(" · done ")
                .num_styled(counts.done, theme.bold(), 0),
                trend[1],
            )
            .text(" · exp ")
            .num_styled(counts.expired, theme.bold(), 0),
            trend[2],
        );
        draw_lines(frame, keys_area, &[line]);
        draw_throughput(frame, throughput, snapshot, false, theme);
        let commit = snapshot.commit;
        let counters = &snapshot.counters;
        let lines = vec![
            Parts::from(format!(
                "p50 {} p99 {} batch {}",
                millis(commit.p50_ms),
                millis(commit.p99_ms),
                decimal(commit.batch_size_avg)
            )),
            disk_line(snapshot, "disk ", rest.width.into(), theme),
            verify_lines(snapshot, theme, rest.width.into(), true)
                .into_iter()
                .next()
                .unwrap_or_default(),
            oldest_pending_line(snapshot, theme),
            Parts::new()
                .text("applied ")
                .num(counters.applied)
                .text(" rej ")
                .num(counters.rejected)
                .text(" replayed ")
                .num(counters.replayed),
            Parts::new()
                .text("409 ")
                .num(counters.conflicts_in_flight)
                .text(" · 422 ")
                .num(counters.conflicts_reused)
                .text(" · expired ")
                .num(counters.expired),
        ];
        draw_lines(frame, rest, &lines);
    }
}

/// The totals' title: a PostgreSQL worker counts replays and conflicts from its start.
fn totals_title(app: &App, snapshot: &Snapshot, width: u16) -> Parts {
    if snapshot.observed_scope != ObservedScope::Worker {
        return Parts::from("Totals");
    }
    let since = match started_at(app) {
        Some(time) => format!("Totals · replays and conflicts since the worker started {time}"),
        None => "Totals · replays and conflicts since the worker started".to_string(),
    };
    Parts::first_fitting(
        usize::from(width.saturating_sub(4)),
        vec![
            Parts::from(since),
            Parts::from("Totals · replays, conflicts since the worker started"),
            Parts::from("Totals · replays, conflicts: this worker"),
        ],
    )
}

/// One line per row of `area`, each fitted to its width: no wrapping, no silent cut.
fn draw_lines(frame: &mut Frame, area: Rect, lines: &[Parts]) {
    let width = usize::from(area.width);
    let lines: Vec<Line> = lines.iter().map(|parts| parts.line(width)).collect();
    frame.render_widget(Paragraph::new(lines), area);
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

/// `parts` and a compact trend: ` ↑2`, ` ↓3`, ` =`.
fn trend_parts(parts: Parts, delta: i128) -> Parts {
    match delta.signum() {
        1 => parts.text(" ↑").num(delta),
        -1 => parts.text(" ↓").num(-delta),
        _ => parts.text(" ="),
    }
}

fn key_count_lines(app: &App, snapshot: &Snapshot, theme: Theme) -> Vec<Parts> {
    let trend = trends(app);
    let counts = snapshot.keys;
    [
        ("pending", counts.pending, trend[0]),
        ("done", counts.done, trend[1]),
        ("expired", counts.expired, trend[2]),
    ]
    .into_iter()
    .map(|(label, count, delta)| {
        let line = Parts::new()
            .text(format!("{label:<8}"))
            .num_styled(count, theme.bold(), 10);
        match delta.signum() {
            1 => line
                .styled("  ↑ +", theme.dim())
                .num_styled(delta, theme.dim(), 0),
            -1 => line
                .styled("  ↓ ", theme.dim())
                .num_styled(delta, theme.dim(), 0),
            _ => line.styled("  = 0", theme.dim()),
        }
    })
    .collect()
}

/// The last verify in one line (`compact`) or two of `width` cells: its result, when it
/// ran (at start or periodically, and how long ago), and what it covered: the log up to
/// which seq, against the last seq now, and when it runs next. A verify at start on an
/// empty ledger reads `up to seq 0 of 140`, not a bare `checked 0 facts`.
fn verify_lines(snapshot: &Snapshot, theme: Theme, width: usize, compact: bool) -> Vec<Parts> {
    let label = if compact { "verify " } else { "verify   " };
    let indent = " ".repeat(cells(label));
    let Some(verify) = &snapshot.verify else {
        let line = Parts::new().text(label).styled("not run yet", theme.dim());
        return if compact {
            vec![line]
        } else {
            vec![line, Parts::new()]
        };
    };
    let (word, style) = if verify.ok {
        ("ok", theme.good())
    } else {
        ("FAILED", theme.bad())
    };
    let head = || {
        Parts::new()
            .text(label)
            .styled(word, style.add_modifier(Modifier::BOLD))
    };
    let time = clock_time(&verify.at);
    let when = match verify.run.as_ref().map(Clean::as_str) {
        Some("start") => format!(" at start, {time}"),
        Some("periodic") => format!(" periodic, {time}"),
        _ => format!(" at {time}"),
    };
    let ago = ago(&snapshot.now, &verify.at)
        .map(|ago| format!(", {ago}"))
        .unwrap_or_default();
    let violations = |parts: Parts| match verify.violations {
        Some(n) if n > 0 => {
            parts
                .text(": ")
                .count_styled(n, "violation", "violations", theme.bad())
        }
        _ => parts,
    };
    let next = verify
        .next_at
        .as_ref()
        .map(|next| format!(" · next {}", clock_time(next)));
    let Some(up_to) = verify.up_to_seq else {
        // A worker that sends only its summary, or a run that could not read the store.
        let first = Parts::first_fitting(
            width,
            vec![
                head().text(format!("{when}{ago}")),
                head().text(when.clone()),
            ],
        );
        let summary = Parts::new().styled(format!("{indent}{}", verify.summary), theme.dim());
        return if compact {
            vec![first]
        } else {
            vec![first, summary]
        };
    };
    let covered = |parts: Parts| {
        parts
            .text("up to seq ")
            .num(up_to)
            .text(" of ")
            .num(snapshot.last_seq)
    };
    if compact {
        return vec![Parts::first_fitting(
            width,
            vec![
                covered(head().text(format!("{when}, "))),
                covered(head().text(format!(" {time} "))),
                violations(head().text(format!(" {time}"))),
            ],
        )];
    }
    let first = Parts::first_fitting(
        width,
        vec![
            violations(head().text(format!("{when}{ago}"))),
            violations(head().text(when.clone())),
            violations(head().text(format!(" {time}"))),
            violations(head()),
        ],
    );
    let checked = |parts: Parts| match verify.facts {
        Some(facts) => parts
            .text("checked ")
            .count(facts, "fact", "facts")
            .text(", "),
        None => parts,
    };
    // Where to look when it failed; when it holds, when it runs again.
    let after = if verify.ok {
        next.unwrap_or_default()
    } else {
        " · the worker's log lists the violations".to_string()
    };
    let second = Parts::first_fitting(
        width,
        vec![
            covered(checked(Parts::new().text(indent.clone()))).text(after.clone()),
            covered(Parts::new().text(indent.clone())).text(after),
            covered(Parts::new().text(indent)),
        ],
    );
    vec![first, second]
}

fn oldest_pending_line(snapshot: &Snapshot, theme: Theme) -> Parts {
    match snapshot.pending.first() {
        None => Parts::new().styled("nothing pending", theme.dim()),
        Some(oldest) => {
            let line = Parts::new().text(format!("oldest pending {} ", format_age(oldest.age_ms)));
            if oldest.lease_expired {
                line.styled("lease expired!", theme.bad())
            } else {
                line.styled(oldest.key.to_string(), theme.dim())
            }
        }
    }
}

/// The snapshot's pending keys, oldest first: what is in flight right now.
fn draw_pending(frame: &mut Frame, area: Rect, snapshot: &Snapshot, theme: Theme) {
    let inner = panel(frame, area, "Pending now, oldest first", true, theme);
    if snapshot.pending.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("nothing in flight", theme.dim())),
            inner,
        );
        return;
    }
    let amount_need = snapshot
        .pending
        .iter()
        .map(|record| cells(&money(record.amount, &record.currency)))
        .max()
        .unwrap_or(0);
    let (widths, fitted) = columns(
        &[
            Column::fixed(10),
            Column::text(Constraint::Fill(1), 8),
            Column::fixed(8),
            Column::fixed(12),
            Column::number(14, amount_need),
            Column::fixed(7),
            Column::fixed(14),
        ],
        inner.width,
        1,
    );
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
            money_fit(record.amount, &record.currency, fitted[4]),
            format_age(record.age_ms),
            lease.to_string(),
        ])
        .style(style)
    });
    let table = Table::new(rows, widths).header(
        Row::new(vec![
            "client", "key", "command", "account", "amount", "age", "",
        ])
        .style(theme.header()),
    );
    frame.render_widget(table, inner);
}

fn rejections_line(snapshot: &Snapshot) -> Parts {
    let mut line = Parts::new().text("rejections: ");
    let mut any = false;
    for (code, count) in &snapshot.counters.rejections {
        if *count == 0 {
            continue;
        }
        if any {
            line = line.text(" · ");
        }
        line = line.text(format!("{code} ")).num(*count);
        any = true;
    }
    if any { line } else { line.text("none") }
}

/// The three series of the throughput panel: name, samples, style.
fn throughput_series(
    samples: &[ThroughputSample],
    theme: Theme,
) -> [(&'static str, Vec<u64>, Style); 3] {
    [
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
    ]
}

/// A series' label: the newest second, and in roomy layouts the peak of the window.
fn throughput_label_parts(name: &str, data: &[u64], roomy: bool) -> Parts {
    let now = data.last().copied().unwrap_or(0);
    let peak = data.iter().copied().max().unwrap_or(0);
    let label = Parts::new().text(format!("{name:<10}"));
    if roomy {
        label
            .num_styled(now, Style::new(), 4)
            .text("/s ^")
            .num(peak)
    } else {
        label.num_styled(now, Style::new(), 3)
    }
}

/// The width of the label column: 22 cells (13 compact), wider when a rate needs more,
/// up to two fifths of `width`: the sparkline gives up seconds before a rate loses digits.
/// Measured over every sample kept, at least the window's peak.
fn throughput_label(snapshot: &Snapshot, roomy: bool, width: u16) -> u16 {
    let (base, gap) = if roomy { (22, 1) } else { (13, 0) };
    // Only the names and numbers count here, not the styles.
    let needed = throughput_series(&snapshot.throughput, Theme { color: false })
        .iter()
        .map(|(name, data, _)| throughput_label_parts(name, data, roomy).full_width() + gap)
        .max()
        .unwrap_or(0);
    let needed = u16::try_from(needed).unwrap_or(u16::MAX);
    needed.clamp(base, base.max(width / 5 * 2))
}

/// Three sparklines on one scale (applied, replayed, conflicts), labelled with the
/// newest second and the peak of the window.
fn draw_throughput(frame: &mut Frame, area: Rect, snapshot: &Snapshot, roomy: bool, theme: Theme) {
    let label = throughput_label(snapshot, roomy, area.width);
    let rows = Layout::vertical([Constraint::Fill(1); 3]).split(area);
    let [_, chart_width] =
        Layout::horizontal([Constraint::Length(label), Constraint::Fill(1)]).areas(area);
    let window = usize::from(chart_width.width);
    let samples = &snapshot.throughput[snapshot.throughput.len().saturating_sub(window)..];
    let series = throughput_series(samples, theme);
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
        // Roomy labels keep a cell before the chart, so the peak does not run into it.
        let width = usize::from(label) - usize::from(roomy);
        let text = throughput_label_parts(name, data, roomy).line(width);
        frame.render_widget(Paragraph::new(restyle(text, *style)), label_area);
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
    // Where the status has no column of its own, the outcome's says it too.
    let merged = !layout.iter().any(|(c, _)| *c == KeyCol::Status);
    let needs = |col: KeyCol| -> usize {
        keys.iter()
            .map(|record| match col {
                KeyCol::Amount => cells(&money(record.amount, &record.currency)),
                KeyCol::Outcome => cells(&outcome_cell(record, merged)),
                KeyCol::Replays => record.replays.to_string().len(),
                KeyCol::Conflicts => record.conflicts.to_string().len(),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    };
    let spec: Vec<Column> = layout
        .iter()
        .map(|(col, header)| col.column(cells(header), needs(*col)))
        .collect();
    let (widths, fitted) = columns(&spec, table_width(inner.width), 1);
    // The key column fills what the others leave; a key longer than that ends in `…`.
    let others: u16 = widths
        .iter()
        .map(|w| match w {
            Constraint::Length(n) => *n + 1,
            _ => 0,
        })
        .sum();
    let key_width = usize::from(table_width(inner.width).saturating_sub(others));
    let rows = keys.iter().map(|record| {
        let style = if record.lease_expired {
            theme.bad()
        } else {
            match record.status {
                KeyStatus::Pending => theme.warn(),
                KeyStatus::Expired => theme.dim(),
                KeyStatus::Done | KeyStatus::Unknown => Style::new(),
            }
        };
        let cells: Vec<Cell> = layout
            .iter()
            .zip(&fitted)
            .map(|((col, _), cell_width)| {
                let width = usize::from(*cell_width);
                match col {
                    KeyCol::Status => Cell::from(status_cell(record)),
                    KeyCol::Client => Cell::from(record.client.to_string()),
                    KeyCol::Key => Cell::from(fit_text(record.key.as_str(), key_width)),
                    KeyCol::Command => Cell::from(record.command.to_string()),
                    KeyCol::Account => Cell::from(target(record)),
                    KeyCol::Amount => {
                        Cell::from(money_fit(record.amount, &record.currency, *cell_width))
                    }
                    KeyCol::Outcome => Cell::from(Span::styled(
                        fit_text(&outcome_cell(record, merged), width),
                        outcome_style(&key_result(record), theme),
                    )),
                    KeyCol::Age => Cell::from(format_age(record.age_ms)),
                    KeyCol::Replays => Cell::from(fit_number(record.replays.into(), width)),
                    KeyCol::Conflicts => Cell::from(fit_number(record.conflicts.into(), width)),
                }
            })
            .collect();
        Row::new(cells).style(style)
    });
    let header: Vec<&str> = layout.iter().map(|(_, header)| *header).collect();
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
    /// How the column is laid out, given its header's cells and its longest value's.
    fn column(self, header: usize, need: usize) -> Column {
        let header = u16::try_from(header).unwrap_or(u16::MAX);
        match self {
            KeyCol::Status | KeyCol::Command | KeyCol::Client => Column::fixed(8),
            // Key names shrink to 10 cells before the numbers shorten.
            KeyCol::Key => Column::text(Constraint::Fill(1), 10),
            KeyCol::Account => Column::fixed(10),
            KeyCol::Amount => Column::number(13, need),
            // Room for `applied` and `pending!`; a rejection code widens it after the
            // amounts, and is cut with a `…` only when the terminal is narrow.
            KeyCol::Outcome => Column::label(8, need),
            KeyCol::Age => Column::fixed(7),
            KeyCol::Replays | KeyCol::Conflicts => Column::number(header, need),
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

/// The keys panel's title, longest first: what is shown, the order, where the counts
/// begin (when they are shown), and an expired lease, which stays while anything does.
fn keys_title(app: &App, keys: &[&KeyRecord], counts_shown: bool, roomy: bool) -> Vec<Parts> {
    // Compact layouts drop the name: the tab bar already says it.
    let mut shown = Parts::new().text(if roomy { "Keys · " } else { "" });
    let mut more = Parts::new();
    if let Some(page) = app.shown().keys.as_ref() {
        shown = shown.num(usize_units(keys.len())).text(" shown");
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
            line.0.extend(part.0.iter().cloned());
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
fn started_at(app: &App) -> Option<String> {
    let snapshot = app.shown().snapshot.as_ref()?;
    snapshot.started_at.as_ref().map(clock_time)
}

/// What became of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyResult {
    Pending,
    Applied,
    /// The rejection code, sanitised.
    Rejected(String),
    /// Done, but the answer says neither (a worker this dashboard does not know).
    Unknown,
}

fn key_result(record: &KeyRecord) -> KeyResult {
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
    let fields = key_fields(record, fact, started_at(app).as_deref(), theme);
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
    theme: Theme,
) -> Vec<Field> {
    let outcome = match &record.outcome {
        Some(Value::Object(map)) => Some(map),
        _ => None,
    };
    let text = |map: Option<&serde_json::Map<String, Value>>, name: &str| {
        map.and_then(|m| m.get(name))
            .and_then(Value::as_str)
            .map(sanitize)
    };
    let currency = if record.currency.is_empty() {
        text(outcome, "currency")
            .or_else(|| text(fact.and_then(Value::as_object), "currency"))
            .unwrap_or_default()
    } else {
        record.currency.to_string()
    };
    let amount_of = |value: Option<&Value>| value.and_then(units);
    let with_money = |parts: Parts, minor: i128| {
        if currency.is_empty() {
            parts.num(minor).text(" (minor units)")
        } else {
            parts.money(minor, &currency).text(format!(" {currency}"))
        }
    };

    let mut fields = vec![
        Field::new("client", record.client.to_string()),
        Field::new("key", record.key.to_string()),
    ];
    let age = format_age(record.age_ms);
    let since = clock_time(&record.since);
    fields.push(match record.status {
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
            format!("expired: done at {since}, {age} ago; the stored answer was swept, a retry is answered from the fact"),
        ),
        KeyStatus::Unknown => Field::new("status", format!("? since {since}")),
    });

    let command = Parts::new().text(format!("{} ", record.command));
    let command = match record.amount {
        Some(amount) => with_money(command, amount.into()),
        None => command,
    };
    let command = match (&record.withdrawal, record.command.as_str()) {
        (Some(withdrawal), _) => command.text(format!(" of withdrawal {withdrawal}")),
        (None, "deposit") => command.text(format!(" to {}", record.account)),
        (None, _) => command.text(format!(" from {}", record.account)),
    };
    fields.push(Field::new("command", command));

    // The answer's seq is the fact's, which the fact line shows.
    let result = key_result(record);
    match &result {
        KeyResult::Pending => fields.push(Field::new("outcome", "none yet: in flight")),
        KeyResult::Unknown if outcome.is_none() => {
            fields.push(Field::new("outcome", "not stored (swept after retention)"))
        }
        KeyResult::Unknown => fields.push(Field::new("outcome", "?")),
        KeyResult::Applied => {
            fields.push(Field::new("outcome", "applied").styled(outcome_style(&result, theme)));
            if let Some(balance) = amount_of(outcome.and_then(|m| m.get("balance"))) {
                let account = text(outcome, "account").unwrap_or_default();
                let line = with_money(Parts::new(), balance);
                fields.push(Field::new(
                    "balance",
                    line.text(format!(" on {account} after it")),
                ));
            }
            if let Some(total) = amount_of(outcome.and_then(|m| m.get("refunded_total"))) {
                let line = with_money(Parts::new(), total);
                fields.push(Field::new(
                    "refunded",
                    line.text(" of the withdrawal in all"),
                ));
            }
        }
        KeyResult::Rejected(code) => {
            fields.push(
                Field::new("outcome", format!("rejected: {code}"))
                    .styled(outcome_style(&result, theme)),
            );
            if let Some(title) = text(outcome, "title") {
                fields.push(Field::new("reason", title));
            }
            // The figure the rejection was decided on, in major units. The answer's
            // `detail` says the same in minor units, as the API does, so it is not shown.
            let asked = |parts: Parts| match record.amount {
                Some(amount) => {
                    with_money(parts.text(", less than the "), amount.into()).text(" asked")
                }
                None => parts,
            };
            if let Some(balance) = amount_of(outcome.and_then(|m| m.get("balance"))) {
                let line =
                    with_money(Parts::new(), balance).text(format!(" on {}", record.account));
                fields.push(Field::new("balance", asked(line)));
            }
            if let Some(held) = text(outcome, "account_currency") {
                fields.push(Field::new(
                    "currency",
                    format!("{} holds {held}, not {currency}", record.account),
                ));
            }
            if let Some(left) = amount_of(outcome.and_then(|m| m.get("refundable"))) {
                let withdrawal = record
                    .withdrawal
                    .as_ref()
                    .map_or_else(String::new, |w| format!(" of withdrawal {w}"));
                let line = with_money(Parts::new(), left).text(format!("{withdrawal} to refund"));
                fields.push(Field::new("left", line));
            }
        }
    }
    if record.status == KeyStatus::Done
        && let Some(until) = &record.expires_at
    {
        fields.push(Field::new(
            "kept",
            format!("the answer until {}", date_time(until)),
        ));
    }
    // Whatever else the answer holds, labelled by its name: a worker may say more than
    // this dashboard knows of.
    for (name, value) in outcome.into_iter().flatten() {
        if SHOWN_OUTCOME_FIELDS.contains(&name.as_str()) {
            continue;
        }
        let label = sanitize(name).replace('_', " ");
        let field = match (units(value), is_money_field(name)) {
            (Some(minor), true) => Field::new(label, with_money(Parts::new(), minor)),
            (Some(n), false) => Field::new(label, Parts::new().num(n)),
            (None, _) => match value {
                Value::String(s) => Field::new(label, sanitize(s)),
                other => Field::new(label, json_text(other)),
            },
        };
        fields.push(field);
    }

    fields.push(Field::new(
        "fact",
        match fact {
            Some(fact) => fact_words(fact),
            None if record.status == KeyStatus::Pending => "none yet: in flight".to_string(),
            None => "loading…".to_string(),
        },
    ));
    let since_start = match started {
        Some(time) => format!(" since the worker started at {time}"),
        None => " since the worker started".to_string(),
    };
    fields.push(Field::new(
        "repeats",
        Parts::new()
            .count(record.replays, "replay", "replays")
            .text(" · ")
            .count(record.conflicts, "conflict", "conflicts")
            .text(since_start),
    ));
    fields
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
        Parts::new()
            .text("Accounts · ")
            .num(usize_units(users.len()))
            .text(format!(" · {sort}")),
        roomy,
        theme,
    );
    // One balance width for both tables, so their columns line up.
    let need = users
        .iter()
        .chain(&system)
        .map(|account| {
            cells(&money::format_number(
                account.balance.0,
                &account.currency.to_string(),
            ))
        })
        .max()
        .unwrap_or(0);
    let (widths, fitted) = columns(&balance_columns(need), table_width(inner.width), 1);
    let balance_width = fitted[2];
    let rows = users
        .iter()
        .map(|account| account_row(account, balance_width));
    draw_table(
        frame,
        inner,
        balance_header(theme),
        rows,
        widths.clone(),
        app.selected[View::Balances.index()],
        theme,
    );

    if roomy {
        let inner = panel(frame, system_area, "System accounts", true, theme);
        let rows = system
            .iter()
            .map(|account| account_row(account, balance_width));
        let table = Table::new(rows, widths)
            .flex(Flex::Start)
            .header(balance_header(theme))
            .highlight_spacing(HighlightSpacing::Always)
            .highlight_symbol("  ");
        frame.render_widget(table, inner);
        let inner = panel(frame, sums_area, "Sum per currency", true, theme);
        let lines: Vec<Parts> = sums.iter().map(|sum| sum_line(sum, theme)).collect();
        draw_lines(frame, inner, &lines);
    } else {
        let width = usize::from(system_area.width);
        // Numbers in full up to half a line; if that leaves accounts out, 8 cells each
        // (`-1.01e17`) when that shows more of them.
        let budgets = [width / 2, 8];
        let (lines, _) = budgets
            .iter()
            .map(|budget| {
                let items: Vec<Vec<Span>> = system
                    .iter()
                    .map(|account| {
                        vec![
                            Span::raw(account.account.to_string()),
                            Span::raw(fit_money(
                                account.balance.0,
                                &account.currency.to_string(),
                                *budget,
                            )),
                            Span::raw(account.currency.to_string()),
                        ]
                    })
                    .collect();
                let label = Span::styled("system", theme.bold());
                pack(label, &items, "·", width, system_area.height.into())
            })
            .min_by_key(|(_, shown)| std::cmp::Reverse(*shown))
            .unwrap_or_default();
        frame.render_widget(Paragraph::new(lines), system_area);
        let (lines, _) = budgets
            .iter()
            .map(|budget| {
                let items: Vec<Vec<Span>> = sums
                    .iter()
                    .map(|sum| sum_words(sum, theme, *budget))
                    .collect();
                // Two spaces between currencies, which the empty separator makes.
                let label = Span::styled("sum", theme.bold());
                pack(label, &items, "", width, sums_area.height.into())
            })
            .min_by_key(|(_, shown)| std::cmp::Reverse(*shown))
            .unwrap_or_default();
        frame.render_widget(Paragraph::new(lines), sums_area);
    }
}

/// Account names are short; a wide name column would push the numbers off to the edge.
/// The balance column is 18 cells, wider for a longer balance while names keep 8.
fn balance_columns(need: usize) -> [Column; 3] {
    [
        Column::text(Constraint::Max(32), 8),
        Column::fixed(8),
        Column::number(18, need),
    ]
}

fn balance_header(theme: Theme) -> Row<'static> {
    Row::new(vec![
        Cell::from("account"),
        Cell::from("currency"),
        Cell::from(Line::raw("balance").alignment(Alignment::Right)),
    ])
    .style(theme.header())
}

/// Right-aligned text that is too wide loses its left end, the sign and the leading
/// digits first; fitted to the column, it cannot.
fn account_row(account: &Account, balance_width: u16) -> Row<'static> {
    Row::new(vec![
        Cell::from(account.account.to_string()),
        Cell::from(account.currency.to_string()),
        Cell::from(
            Line::raw(fit_money(
                account.balance.0,
                &account.currency.to_string(),
                balance_width.into(),
            ))
            .alignment(Alignment::Right),
        ),
    ])
}

struct CurrencySum {
    currency: Clean,
    /// Summed here over every account, filters aside; `None` when the sum leaves i128,
    /// which a feed of i128 balances can make happen.
    local: Option<i128>,
    /// What the worker reported, if it did.
    reported: Option<i128>,
}

fn currency_sums(
    accounts: &[Account],
    reported: &std::collections::BTreeMap<Clean, Units>,
) -> Vec<CurrencySum> {
    let mut sums: std::collections::BTreeMap<Clean, Option<i128>> =
        std::collections::BTreeMap::new();
    for account in accounts {
        let sum = sums.entry(account.currency.clone()).or_insert(Some(0));
        *sum = sum.and_then(|sum| sum.checked_add(account.balance.0));
    }
    for currency in reported.keys() {
        sums.entry(currency.clone()).or_insert(Some(0));
    }
    sums.into_iter()
        .map(|(currency, local)| CurrencySum {
            reported: reported.get(&currency).map(|units| units.0),
            currency,
            local,
        })
        .collect()
}

impl CurrencySum {
    fn balanced(&self) -> bool {
        self.local == Some(0) && self.reported.is_none_or(|r| r == 0)
    }

    fn mark(&self, theme: Theme) -> (&'static str, Style) {
        if self.balanced() {
            ("✓", theme.good())
        } else {
            ("✗", theme.bad())
        }
    }
}

/// Where the sum is too large for i128 there is no number to show.
const SUM_OUT_OF_RANGE: &str = "out of range";

fn sum_line(sum: &CurrencySum, theme: Theme) -> Parts {
    let (mark, style) = sum.mark(theme);
    let line = Parts::new()
        .styled(format!("{} ", sum.currency), theme.bold())
        .text("= ");
    let line = match sum.local {
        Some(local) => line.money(local, &sum.currency.to_string()),
        None => line.text(SUM_OUT_OF_RANGE),
    }
    .text(" ")
    .styled(mark, style.add_modifier(Modifier::BOLD));
    if sum.balanced() {
        return line.styled("  balanced: every movement has two legs", style);
    }
    let line = line.styled("  NOT ZERO (worker says ", style);
    match sum.reported {
        Some(reported) => line.money_styled(reported, &sum.currency.to_string(), style),
        None => line.styled("nothing", style),
    }
    .styled(")", style)
}

/// A sum as words for the compact layout, its number in at most `budget` cells.
fn sum_words(sum: &CurrencySum, theme: Theme, budget: usize) -> Vec<Span<'static>> {
    let (mark, style) = sum.mark(theme);
    vec![
        Span::styled(sum.currency.to_string(), theme.bold()),
        Span::raw("="),
        Span::raw(sum.local.map_or_else(
            || SUM_OUT_OF_RANGE.to_string(),
            |local| fit_money(local, &sum.currency.to_string(), budget),
        )),
        Span::styled(mark, style.add_modifier(Modifier::BOLD)),
    ]
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
        Parts::new()
            .text("Log · ")
            .count(usize_units(facts.len()), "fact", "facts")
            .text(format!(" · {mode}")),
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
    let seq_need = digits_needed(facts.iter().map(|fact| fact.seq));
    let amount_need = facts
        .iter()
        .map(|fact| cells(&money(fact.amount, &fact.currency)))
        .max()
        .unwrap_or(0);
    let after_need = facts
        .iter()
        .filter_map(|fact| Some((fact.balance_after?, fact.currency.to_string())))
        .map(|(after, code)| cells(&money::format_number(after.0, &code)))
        .max()
        .unwrap_or(0);
    let key_column = Column::text(Constraint::Fill(1), 8);
    let (header, layout) = if wide {
        (
            vec![
                "seq", "time", "client", "key", "fact", "account", "amount", "after",
            ],
            vec![
                Column::seq(6, seq_need),
                Column::fixed(8),
                Column::fixed(10),
                key_column,
                Column::fixed(30),
                Column::fixed(10),
                Column::number(13, amount_need),
                Column::number(10, after_need),
            ],
        )
    } else if inner.width >= 64 {
        (
            vec!["seq", "key", "fact", "account", "amount"],
            vec![
                Column::seq(6, seq_need),
                key_column,
                Column::fixed(28),
                Column::fixed(9),
                Column::number(11, amount_need),
            ],
        )
    } else {
        (
            vec!["seq", "key", "fact"],
            vec![Column::seq(5, seq_need), key_column, Column::fixed(12)],
        )
    };
    let (widths, fitted) = columns(&layout, table_width(inner.width), 1);
    let columns = header.len();
    let seq = |fact: &FactRow| fit_tail(fact.seq, fitted[0].into());
    let rows = facts.iter().map(|fact| {
        let style = if fact.code.is_some() {
            theme.warn()
        } else {
            Style::new()
        };
        let name = fact_name(fact);
        let cells: Vec<String> = match columns {
            8 => vec![
                seq(fact),
                clock_time(&fact.at),
                fact.client.to_string(),
                fact.key.to_string(),
                name,
                fact_target(fact),
                money_fit(fact.amount, &fact.currency, fitted[6]),
                fact.balance_after.map_or(String::new(), |b| {
                    fit_money(b.0, &fact.currency.to_string(), fitted[7].into())
                }),
            ],
            5 => vec![
                seq(fact),
                fact.key.to_string(),
                name,
                fact_target(fact),
                money_fit(fact.amount, &fact.currency, fitted[4]),
            ],
            _ => vec![
                seq(fact),
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

/// The width [`draw_table`] leaves its columns: the highlight symbol takes two cells.
fn table_width(area_width: u16) -> u16 {
    area_width.saturating_sub(2)
}

/// The cells the longest of `values` needs in full.
fn digits_needed(values: impl Iterator<Item = u64>) -> usize {
    values.map(|n| n.to_string().len()).max().unwrap_or(0)
}

/// A count of things in memory as a number to fit; no count comes near i128's end.
fn usize_units(n: usize) -> i128 {
    i128::try_from(n).unwrap_or(i128::MAX)
}

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

fn join_clean(items: &[Clean], separator: &str) -> String {
    items
        .iter()
        .map(Clean::as_str)
        .collect::<Vec<_>>()
        .join(separator)
}

/// `style` over every span of `line`, as one span's style over its text would be.
fn restyle(mut line: Line<'static>, style: Style) -> Line<'static> {
    for span in &mut line.spans {
        span.style = style.patch(span.style);
    }
    line
}

/// Amounts stay integers of minor units, as the ledger keeps them.
/// An amount of minor units in major units with its currency: `1,000.00 RUB`.
fn money(amount: Option<u64>, currency: &Clean) -> String {
    match amount {
        Some(amount) => money::format(amount.into(), &currency.to_string()),
        None => String::new(),
    }
}

/// [`money`] in `width` cells: the number shortens (never below its shortest form), the
/// currency stays.
fn money_fit(amount: Option<u64>, currency: &Clean, width: u16) -> String {
    let Some(amount) = amount else {
        return String::new();
    };
    let code = currency.to_string();
    let unit = format!(" {code}");
    let room = usize::from(width)
        .saturating_sub(cells(&unit))
        .max(shortest_money(amount.into(), &code));
    format!("{}{unit}", fit_money(amount.into(), &code, room))
}

/// An age in at most 7 cells, the width of the age columns: past 999 days only the
/// days are left, and past 999,999 days they shorten too (`1e7d`).
pub fn format_age(ms: u64) -> String {
    let seconds = ms / 1000;
    let days = seconds / 86_400;
    match seconds {
        0 => format!("{ms}ms"),
        1..60 => format!("{seconds}.{}s", (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
        _ if days < 1000 => format!("{days}d{:02}h", (seconds % 86_400) / 3600),
        _ => fit_with_unit(days.into(), "d", 7),
    }
}

/// A latency in at most 9 cells: milliseconds below ten seconds, whole seconds above.
fn millis(value: Option<f64>) -> String {
    match value {
        None => "–".to_string(),
        Some(ms) if ms.abs() < 10_000.0 => format!("{ms:.1} ms"),
        Some(ms) => fit_with_unit(whole(ms / 1000.0), " s", 9),
    }
}

/// A measurement with one decimal, or, past a million, a whole number fitted to 9 cells:
/// `{:.1}` of a large float writes every digit of it.
fn decimal(value: f64) -> String {
    if value.abs() < 1e6 {
        format!("{value:.1}")
    } else {
        fit_number(whole(value), 9)
    }
}

/// The nearest integer; floats beyond i128 stop at its ends, which shows them as ±2e38.
#[allow(clippy::cast_possible_truncation)]
fn whole(value: f64) -> i128 {
    // `as` saturates, which is the point here: a display value, never money.
    value.round() as i128
}

/// The ledger's size on disk, and, when the worker's start found the index damaged and
/// rebuilt it from the journal, that it did, in the warning colour, as much as fits (the
/// worker's log and `/metrics` tell the rest).
fn disk_line(snapshot: &Snapshot, label: &str, width: usize, theme: Theme) -> Parts {
    let disk = Parts::from(format!("{label}{}", disk_size(snapshot)));
    if snapshot.index_rebuilt.is_none() {
        return disk;
    }
    Parts::first_fitting(
        width,
        vec![
            disk.clone()
                .text(" · ")
                .styled("index rebuilt at start", theme.warn()),
            disk.clone()
                .text(" · ")
                .styled("index rebuilt", theme.warn()),
            disk.clone().text(" · ").styled("rebuilt", theme.warn()),
            disk,
        ],
    )
}

fn disk_size(snapshot: &Snapshot) -> String {
    snapshot
        .size_on_disk_bytes
        .map_or_else(|| "unknown".to_string(), format_bytes)
}

pub fn format_bytes(bytes: u64) -> String {
    // Up to EiB, which holds u64::MAX: the value stays under 1024 and so short.
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
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

/// `YYYY-MM-DD HH:MM:SS` of an RFC 3339 time, in the worker's zone as sent; the text
/// itself if it does not parse.
fn date_time(at: &Clean) -> String {
    match DateTime::parse_from_rfc3339(at.as_str()) {
        Ok(time) => time.format("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => at.to_string(),
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

    /// The age columns are 7 cells wide; an age never needs more.
    #[test]
    fn ages_fit_seven_cells() {
        let day = 86_400_000;
        assert_eq!(format_age(999 * day + 23 * 3_600_000), "999d23h");
        assert_eq!(format_age(1000 * day), "1000d");
        assert_eq!(format_age(999_999 * day), "999999d");
        assert_eq!(format_age(9_999_999 * day), "1e7d");
        assert_eq!(format_age(u64::MAX), "2.1e11d");
        for ms in [0, 999, 59_999, 3_599_999, 86_399_999, 1000 * day, u64::MAX] {
            assert!(format_age(ms).chars().count() <= 7, "{ms}");
        }
    }

    #[test]
    fn measurements_stay_short() {
        assert_eq!(millis(None), "–");
        assert_eq!(millis(Some(0.84)), "0.8 ms");
        assert_eq!(millis(Some(9_999.9)), "9999.9 ms");
        assert_eq!(millis(Some(123_456.7)), "123 s");
        assert_eq!(millis(Some(f64::MAX)), "1.7e38 s");
        assert_eq!(decimal(12.0), "12.0");
        assert_eq!(decimal(1e15), "1e15");
        assert_eq!(decimal(-1e300), "-1.701e38");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    /// i128 balances can add up past i128: the sum says so instead of wrapping around
    /// (or, in a debug build, panicking).
    #[test]
    fn sums_beyond_i128_are_out_of_range() {
        let account = |balance| Account {
            account: Clean::default(),
            currency: Clean::default(),
            balance: Units(balance),
            system: false,
        };
        let sums = currency_sums(
            &[account(i128::MIN), account(i128::MIN)],
            &std::collections::BTreeMap::new(),
        );
        assert_eq!(sums[0].local, None);
        assert!(!sums[0].balanced());
        let sums = currency_sums(
            &[account(i128::MIN), account(i128::MAX), account(1)],
            &std::collections::BTreeMap::new(),
        );
        assert_eq!(sums[0].local, Some(0));
        assert!(sums[0].balanced());
    }
}
