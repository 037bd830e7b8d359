//! Drawing: turns an [`App`] into a frame and changes nothing.
//!
//! Layouts adapt to the terminal: bordered panels from 60x16 of body up, a compact
//! borderless form down to [`MIN_WIDTH`]x[`MIN_HEIGHT`], and below that a message
//! asking for a larger terminal. Without colour (`NO_COLOR`, `--no-color`) only bold,
//! dim and reverse are used, and everything a colour says is also said in text.

use std::collections::BTreeMap;

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
    App, BalanceSort, ConflictSort, Connection, Feed, KeySort, STALE_TICKS, TREND_WINDOW, View,
};
use crate::fit::{
    Column, Part, Parts, cells, columns, fit_middle, fit_money, fit_number, fit_tail, fit_text,
    fit_with_unit, pack, shortest_money,
};
use crate::model::{
    Account, Conflict, ConflictKind, FactRow, KeyRecord, KeyStatus, ObservedScope, Quarantined,
    Snapshot, ThroughputSample, Units,
};
use crate::sanitize::{Clean, sanitize};

mod balances;
mod conflicts;
mod help;
mod keys;
mod log;

use balances::draw_balances;
use conflicts::draw_conflicts;
use help::draw_help;
pub use help::help_scroll_max;
use keys::{draw_keys, started_at, target};
use log::draw_log;

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
        draw_help(frame, area, app.help_scroll, theme);
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
    let width = usize::from(area.width);
    let line = match &app.input {
        Some(input) => input_footer(input, app.view, width, theme),
        None => hints_footer(app, width, theme),
    };
    frame.render_widget(Paragraph::new(line.line(width)), area);
}

/// The filter being typed and, as far as they fit, the keys that finish it. A filter
/// longer than the line shows its end, where the typing is, after a `…`.
fn input_footer(input: &str, view: View, width: usize, theme: Theme) -> Parts {
    let text = sanitize(input);
    let room = width.saturating_sub(3);
    let shown = if cells(&text) <= room {
        text
    } else {
        let mut tail: Vec<char> = Vec::new();
        for c in text.chars().rev() {
            if cells(&tail.iter().collect::<String>()) + cells(&c.to_string()) >= room {
                break;
            }
            tail.push(c);
        }
        format!("…{}", tail.into_iter().rev().collect::<String>())
    };
    let typed = Parts::new()
        .styled("/", theme.bold())
        .text(shown)
        .styled("█", theme.bold());
    let mut hints = vec![
        "  Enter apply · Esc cancel · ^U clear",
        "  Enter · Esc · ^U",
        "",
    ];
    if view == View::Keys {
        hints.insert(
            0,
            "  Enter apply · Esc cancel · ^U clear · status:pending client:NAME text",
        );
    }
    let variants = hints
        .into_iter()
        .map(|hint| typed.clone().styled(hint, theme.dim()))
        .collect();
    Parts::first_fitting(width, variants)
}

/// The applied filter, then the keys of the view, as many as fit.
fn hints_footer(app: &App, width: usize, theme: Theme) -> Parts {
    let filter = app.filter(app.view);
    let start = if filter.is_empty() {
        Parts::new()
    } else {
        Parts::new()
            .styled(
                format!("filter: {}", sanitize(filter)),
                theme.warn().add_modifier(Modifier::BOLD),
            )
            .text(" │ ")
    };
    let hints = match app.view {
        // The keys' title has no room for the order here, so the footer says it.
        View::Keys if width < 60 && !app.detail_open => match app.sorts.keys {
            KeySort::Newest => "s: newest first · ? help · q quit",
            KeySort::Key => "s: by key · ? help · q quit",
        },
        View::Keys if width < 60 && app.back == Some(View::Conflicts) => "Esc back · ? help",
        _ if width < 60 => "? help · q quit",
        View::Keys if app.detail_open && app.back == Some(View::Conflicts) => {
            "Esc back to conflicts · ? help · / filter · s sort · q quit"
        }
        View::Keys if app.detail_open => "Esc close · ? help · / filter · s sort · q quit",
        View::Keys => "Enter detail · [ ] page · / filter · s sort · p pause · ? help · q quit",
        View::Overview => "1-5 Tab views · / filter keys · p pause · ? help · q quit",
        View::Log => "j/k scroll · End follow · / filter · p pause · ? help · q quit",
        View::Conflicts => "Enter open key · / filter · s sort · p pause · ? help · q quit",
        View::Balances => "j/k move · / filter · s sort · p pause · ? help · q quit",
    };
    // Beside a filter, the hints give way from the end, the first (the keys' order, on a
    // narrow terminal) last.
    let words: Vec<&str> = hints.split(" · ").collect();
    let variants = (1..=words.len())
        .rev()
        .map(|n| words[..n].join(" · "))
        .filter(|hint| !filter.is_empty() || hint.as_str() == hints)
        .map(|hint| start.clone().styled(hint, theme.dim()))
        .collect();
    Parts::first_fitting(width, variants)
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

/// The snapshot's pending keys, oldest first: what is in flight right now. Names are as
/// wide as they need while there is room and cut in the middle with a `…` past it; rows
/// that do not fit are counted in the title.
fn draw_pending(frame: &mut Frame, area: Rect, snapshot: &Snapshot, theme: Theme) {
    let pending = &snapshot.pending;
    // Two borders and the header.
    let fits = usize::from(area.height.saturating_sub(3));
    let title = Parts::new().text("Pending now, oldest first");
    let title = if pending.len() > fits {
        title
            .text(" · ")
            .num(usize_units(fits))
            .text(" of ")
            .num(usize_units(pending.len()))
            .text(" shown")
    } else {
        title
    };
    let inner = panel(frame, area, title, true, theme);
    if pending.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("nothing in flight", theme.dim())),
            inner,
        );
        return;
    }
    let texts: Vec<Vec<String>> = pending
        .iter()
        .map(|record| {
            vec![
                record.client.to_string(),
                record.key.to_string(),
                record.command.to_string(),
                target(record),
                money(record.amount, record.currency.as_str()),
                format_age(record.age_ms),
            ]
        })
        .collect();
    let header = ["client", "key", "command", "account", "amount", "age", ""];
    let (widths, fitted) = fit_table(&header, &texts, inner.width, |i, need| match i {
        0 => Column::label(6, need),
        1 => Column::label(8, need),
        2 | 3 => Column::label(7, need),
        4 => number_column(
            "amount",
            need,
            amount_cap(texts.iter().map(|t| &t[4])).max(14),
        ),
        5 => Column::fixed(7),
        _ => Column::fixed(14),
    });
    let rows = pending.iter().zip(&texts).map(|(record, texts)| {
        let (lease, style) = if record.lease_expired {
            ("lease expired!", theme.bad())
        } else {
            ("", theme.warn())
        };
        let width = |i: usize| usize::from(fitted[i]);
        Row::new(vec![
            fit_middle(&texts[0], width(0)),
            fit_middle(&texts[1], width(1)),
            fit_text(&texts[2], width(2)),
            fit_middle(&texts[3], width(3)),
            money_fit(record.amount, record.currency.as_str(), fitted[4]),
            texts[5].clone(),
            lease.to_string(),
        ])
        .style(style)
    });
    let table = Table::new(rows, widths)
        .flex(Flex::Start)
        .header(Row::new(header).style(theme.header()));
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

// ---------------------------------------------------------------- shared

/// The width [`draw_table`] leaves its columns: the highlight symbol takes two cells.
fn table_width(area_width: u16) -> u16 {
    area_width.saturating_sub(2)
}

/// A number column: as wide as its longest value up to `cap` cells (never narrower than
/// its `header`) before names widen, and wider after them while there is room. An amount
/// column of `3.00 RUB` does not hold 13 cells a long name needs; a long balance is
/// shortened to its exponent form before a name is cut.
fn number_column(header: &str, need: usize, cap: usize) -> Column {
    let header = cells(header);
    let base = need.clamp(header, cap.max(header));
    Column::number(u16::try_from(base).unwrap_or(u16::MAX), need)
}

/// The base of an amount column: 13 cells, or what the longest amount in minor units
/// needs, so that `minor units` is never cut from a number it says how to read.
fn amount_cap<'a>(amounts: impl Iterator<Item = &'a String>) -> usize {
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
fn fit_table(
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
fn panel_rows(area: Rect, roomy: bool) -> usize {
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
fn rows_range(parts: Parts, total: usize, shown: usize, selected: usize) -> Option<Parts> {
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
/// An amount of minor units in major units with its currency: `1,000.00 RUB`; with no
/// currency known, in the minor units it was sent in, said so (`100,000 minor units`),
/// so that it does not read as major units.
fn money(amount: Option<u64>, currency: &str) -> String {
    match amount {
        Some(amount) if currency.is_empty() => {
            format!("{}{MINOR_UNITS}", money::format_number(amount.into(), ""))
        }
        Some(amount) => money::format(amount.into(), currency),
        None => String::new(),
    }
}

/// The unit of an amount whose currency the dashboard cannot know.
const MINOR_UNITS: &str = " minor units";

/// [`money`] in `width` cells: the number shortens (never below its shortest form), the
/// currency, or `minor units`, stays.
fn money_fit(amount: Option<u64>, currency: &str, width: u16) -> String {
    let Some(amount) = amount else {
        return String::new();
    };
    let unit = if currency.is_empty() {
        MINOR_UNITS.to_string()
    } else {
        format!(" {currency}")
    };
    let room = usize::from(width)
        .saturating_sub(cells(&unit))
        .max(shortest_money(amount.into(), currency));
    format!("{}{unit}", fit_money(amount.into(), currency, room))
}

/// The currency of each withdrawal the dashboard has seen, by (client, key): a refund's
/// fact or row may not carry it (a rejected refund names its withdrawal only), and its
/// amount is in its withdrawal's currency. Applied withdrawals in the log tail and the
/// keys page, refunds that carry their withdrawal's currency, and the open detail.
fn withdrawal_currencies(feed: &Feed) -> BTreeMap<(&str, &str), &str> {
    let mut known = BTreeMap::new();
    for fact in &feed.facts {
        if fact.currency.is_empty() {
            continue;
        }
        let key = match &fact.withdrawal {
            Some(withdrawal) => withdrawal,
            None if fact.name.as_str() == "WithdrawalRecorded" => &fact.key,
            None => continue,
        };
        known.insert((fact.client.as_str(), key.as_str()), fact.currency.as_str());
    }
    let records = feed.keys.iter().flat_map(|page| &page.keys);
    for record in records.chain(&feed.detail) {
        if record.currency.is_empty() {
            continue;
        }
        let key = match &record.withdrawal {
            Some(withdrawal) => withdrawal,
            None if record.command.as_str() == "withdraw"
                && keys::key_result(record) == keys::KeyResult::Applied =>
            {
                &record.key
            }
            None => continue,
        };
        known.insert(
            (record.client.as_str(), key.as_str()),
            record.currency.as_str(),
        );
    }
    known
}

/// The currency of an amount: its own, else, for a refund, its withdrawal's if the
/// dashboard has seen it; empty when it cannot know.
fn currency_of<'a>(
    known: &BTreeMap<(&str, &str), &'a str>,
    client: &Clean,
    withdrawal: Option<&Clean>,
    currency: &'a Clean,
) -> &'a str {
    if !currency.is_empty() {
        return currency.as_str();
    }
    withdrawal
        .and_then(|w| known.get(&(client.as_str(), w.as_str())).copied())
        .unwrap_or_default()
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

/// The ledger's size on disk, with what the number counts, and, when the worker's start
/// found the index damaged and rebuilt it from the journal, that it did, in the warning
/// colour: as much of both as fits (the worker's log and `/metrics` tell the rest). The
/// worker measures sled's files only (its data file, a few hundred bytes on a new ledger),
/// not the journal's preallocated segments beside them; on PostgreSQL, the schema's
/// tables, indexes and sequences.
fn disk_line(snapshot: &Snapshot, label: &str, width: usize, theme: Theme) -> Parts {
    let size = disk_size(snapshot);
    let counted: &[&str] = match (snapshot.size_on_disk_bytes, snapshot.observed_scope) {
        (None, _) | (_, ObservedScope::Unknown) => &[""],
        // The scope says the store: sled keeps the counters in the ledger.
        (_, ObservedScope::Ledger) => &[
            " in sled's files; the journal is not counted",
            " in sled's files, not the journal",
            " sled, excl. journal",
            " excl. journal",
        ],
        (_, ObservedScope::Worker) => &[
            " in the schema's tables and indexes",
            " tables and indexes",
            " tables",
        ],
    };
    let rebuilt: &[&str] = if snapshot.index_rebuilt.is_some() {
        &["index rebuilt at start", "index rebuilt", "rebuilt"]
    } else {
        &[""]
    };
    // The warning keeps its words before the size gives up what it counts (the help
    // says that too).
    let mut variants = Vec::new();
    for warning in rebuilt {
        let bare = (!warning.is_empty()).then_some("");
        for what in counted.iter().chain(&bare) {
            let line = Parts::from(format!("{label}{size}{what}"));
            variants.push(if warning.is_empty() {
                line
            } else {
                line.text(" · ").styled(*warning, theme.warn())
            });
        }
    }
    Parts::first_fitting(width, variants)
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
        // Not a time: as much of it as fits a time's cells, marked when cut.
        Err(_) => fit_text(at.as_str(), 8),
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
}
