//! Drawing: turns an [`App`] into a frame and changes nothing.
//!
//! Layouts adapt to the terminal: bordered panels from 60x16 of body up, a compact
//! borderless form down to [`MIN_WIDTH`]x[`MIN_HEIGHT`], and below that a message
//! asking for a larger terminal. Without colour (`NO_COLOR`, `--no-color`) only bold,
//! dim and reverse are used, and everything a colour says is also said in text.
//!
//! Here are the parts every view shares on screen: the tab bar, the banner, the footer
//! and the help over them. The body is the view's own module (`overview`, `keys`,
//! `conflicts`, `balances`, `log`); `panel`, `table` and `format` hold what they draw
//! with: panels and lines, tables, and values as text.

// The names the views' modules draw with: each takes them all with `use super::*`.
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
mod format;
mod help;
mod keys;
mod log;
mod overview;
mod panel;
mod table;

use balances::draw_balances;
use conflicts::draw_conflicts;
use format::{
    MINOR_UNITS, ago, clock_time, currency_of, date_time, decimal, join_clean, millis, money,
    money_fit, usize_units, withdrawal_currencies,
};
pub use format::{format_age, format_bytes, json_text};
use help::draw_help;
pub use help::help_scroll_max;
use keys::{draw_keys, started_at, target};
use log::draw_log;
use overview::draw_overview;
use panel::{draw_lines, draw_waiting, panel, restyle, roomy};
use table::{
    amount_cap, draw_table, fit_table, number_column, panel_rows, rows_range, table_width,
};

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
