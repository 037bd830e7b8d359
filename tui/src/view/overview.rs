//! The overview: key counts, storage, verify, throughput, what is pending, totals.

use super::*;
use crate::model::VerifyResult;

pub(super) fn draw_overview(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let Some(snapshot) = &app.shown().snapshot else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    if roomy(area) {
        draw_roomy(frame, area, app, snapshot, theme);
    } else {
        draw_compact(frame, area, app, snapshot, theme);
    }
}

/// The bordered overview: keys and storage side by side, the throughput under them, the
/// pending keys on a tall terminal, and the totals at the bottom.
fn draw_roomy(frame: &mut Frame, area: Rect, app: &App, snapshot: &Snapshot, theme: Theme) {
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
    draw_keys_panel(frame, keys_area, app, snapshot, theme);
    draw_storage_panel(frame, commit_area, snapshot, theme);
    draw_throughput_panel(frame, middle, snapshot, theme);
    if tall {
        draw_pending(frame, pending, snapshot, theme);
    }
    draw_totals_panel(frame, bottom, app, snapshot, theme);
}

/// The keys by status with their trends, the duplicates absorbed, the oldest pending key.
fn draw_keys_panel(frame: &mut Frame, area: Rect, app: &App, snapshot: &Snapshot, theme: Theme) {
    let inner = panel(frame, area, "Keys", true, theme);
    let mut lines = key_count_lines(app, snapshot, theme);
    lines.push(absorbed_line(snapshot, inner.width.into(), theme));
    lines.push(oldest_pending_line(snapshot, theme));
    draw_lines(frame, inner, &lines);
}

/// The duplicates absorbed; a PostgreSQL worker counts them from its start, and says so
/// as far as it fits.
fn absorbed_line(snapshot: &Snapshot, width: usize, theme: Theme) -> Parts {
    let absorbed = Parts::new().text("duplicates absorbed ").num_styled(
        snapshot.counters.replayed,
        theme.bold(),
        0,
    );
    match snapshot.observed_scope {
        ObservedScope::Worker => Parts::first_fitting(
            width,
            vec![
                absorbed.clone().text(" since the worker started"),
                absorbed.text(" (this worker)"),
            ],
        ),
        ObservedScope::Ledger | ObservedScope::Unknown => absorbed,
    }
}

/// The commits' latency and batches, the size on disk, and the last verify.
fn draw_storage_panel(frame: &mut Frame, area: Rect, snapshot: &Snapshot, theme: Theme) {
    let inner = panel(frame, area, "Storage", true, theme);
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
}

/// The throughput's sparklines in a panel whose title says how many seconds they span.
fn draw_throughput_panel(frame: &mut Frame, area: Rect, snapshot: &Snapshot, theme: Theme) {
    // The panel's borders take two cells, the labels theirs; the rest is one per second.
    let inner_width = area.width.saturating_sub(2);
    let seconds = inner_width.saturating_sub(throughput_label(snapshot, true, inner_width));
    let inner = panel(
        frame,
        area,
        Parts::new()
            .text("Throughput per second, last ")
            .num(seconds)
            .text(" s"),
        true,
        theme,
    );
    draw_throughput(frame, inner, snapshot, true, theme);
}

/// What the commands came to: outcomes, conflicts, and the rejections by code.
fn draw_totals_panel(frame: &mut Frame, area: Rect, app: &App, snapshot: &Snapshot, theme: Theme) {
    let inner = panel(
        frame,
        area,
        totals_title(app, snapshot, area.width),
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
}

/// The borderless overview down to 40x12: the key counts on one line, the throughput,
/// then a line each for storage, verify, what is pending and the totals.
fn draw_compact(frame: &mut Frame, area: Rect, app: &App, snapshot: &Snapshot, theme: Theme) {
    let [keys_area, throughput, rest] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(3),
        Constraint::Fill(1),
    ])
    .areas(area);
    draw_lines(
        frame,
        keys_area,
        &[compact_key_counts(app, snapshot, theme)],
    );
    draw_throughput(frame, throughput, snapshot, false, theme);
    let lines = compact_lines(snapshot, rest.width.into(), theme);
    draw_lines(frame, rest, &lines);
}

/// The keys by status, each with its trend, in one line.
fn compact_key_counts(app: &App, snapshot: &Snapshot, theme: Theme) -> Parts {
    let counts = snapshot.keys;
    let trend = trends(app);
    trend_parts(
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
    )
}

/// The compact overview's lines under the throughput, `width` cells each.
fn compact_lines(snapshot: &Snapshot, width: usize, theme: Theme) -> Vec<Parts> {
    let commit = snapshot.commit;
    let counters = &snapshot.counters;
    vec![
        Parts::from(format!(
            "p50 {} p99 {} batch {}",
            millis(commit.p50_ms),
            millis(commit.p99_ms),
            decimal(commit.batch_size_avg)
        )),
        disk_line(snapshot, "disk ", width, theme),
        verify_lines(snapshot, theme, width, true)
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
    ]
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

/// The keys by status, a line each, with the change over the trend window.
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
    let Some(verify) = &snapshot.verify else {
        let line = Parts::new().text(label).styled("not run yet", theme.dim());
        return if compact {
            vec![line]
        } else {
            vec![line, Parts::new()]
        };
    };
    let words = VerifyWords::new(snapshot, verify, label, theme);
    match verify.up_to_seq {
        // A worker that sends only its summary, or a run that could not read the store.
        None => words.summary_lines(width, compact),
        Some(up_to) if compact => vec![words.compact_line(up_to, width)],
        Some(up_to) => vec![words.result_line(width), words.coverage_line(up_to, width)],
    }
}

/// What the lines of one verify run are made of, each line taking the longest of its
/// variants that fits.
struct VerifyWords<'a> {
    verify: &'a VerifyResult,
    last_seq: u64,
    label: &'static str,
    /// `ok` or `FAILED`, and its colour.
    word: &'static str,
    style: Style,
    /// `HH:MM:SS` of the run.
    time: String,
    /// ` at start, HH:MM:SS`, ` periodic, HH:MM:SS` or ` at HH:MM:SS`.
    when: String,
    /// `, 5m03s ago`, or empty when the worker's clock does not say.
    ago: String,
    theme: Theme,
}

impl<'a> VerifyWords<'a> {
    fn new(
        snapshot: &Snapshot,
        verify: &'a VerifyResult,
        label: &'static str,
        theme: Theme,
    ) -> VerifyWords<'a> {
        let (word, style) = if verify.ok {
            ("ok", theme.good())
        } else {
            ("FAILED", theme.bad())
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
        VerifyWords {
            verify,
            last_seq: snapshot.last_seq,
            label,
            word,
            style,
            time,
            when,
            ago,
            theme,
        }
    }

    /// The label and the result in bold.
    fn head(&self) -> Parts {
        Parts::new()
            .text(self.label)
            .styled(self.word, self.style.add_modifier(Modifier::BOLD))
    }

    /// Spaces as wide as the label, so a second line starts under the result.
    fn indent(&self) -> String {
        " ".repeat(cells(self.label))
    }

    /// `parts` and the violations found, when there were any.
    fn violations(&self, parts: Parts) -> Parts {
        match self.verify.violations {
            Some(n) if n > 0 => {
                parts
                    .text(": ")
                    .count_styled(n, "violation", "violations", self.theme.bad())
            }
            _ => parts,
        }
    }

    /// `parts` and how far the run read: `up to seq 120 of 140`.
    fn covered(&self, parts: Parts, up_to: u64) -> Parts {
        parts
            .text("up to seq ")
            .num(up_to)
            .text(" of ")
            .num(self.last_seq)
    }

    /// `parts` and how many facts the run checked, when it says.
    fn checked(&self, parts: Parts) -> Parts {
        match self.verify.facts {
            Some(facts) => parts
                .text("checked ")
                .count(facts, "fact", "facts")
                .text(", "),
            None => parts,
        }
    }

    /// The result and when, then (unless `compact`) the worker's summary under it.
    fn summary_lines(&self, width: usize, compact: bool) -> Vec<Parts> {
        let (when, ago) = (&self.when, &self.ago);
        let first = Parts::first_fitting(
            width,
            vec![
                self.head().text(format!("{when}{ago}")),
                self.head().text(when.clone()),
            ],
        );
        let summary = Parts::new().styled(
            format!("{}{}", self.indent(), self.verify.summary),
            self.theme.dim(),
        );
        if compact {
            vec![first]
        } else {
            vec![first, summary]
        }
    }

    /// The result, when and how far, in one line.
    fn compact_line(&self, up_to: u64, width: usize) -> Parts {
        let (when, time) = (&self.when, &self.time);
        Parts::first_fitting(
            width,
            vec![
                self.covered(self.head().text(format!("{when}, ")), up_to),
                self.covered(self.head().text(format!(" {time} ")), up_to),
                self.violations(self.head().text(format!(" {time}"))),
            ],
        )
    }

    /// The first of two lines: the result, its violations, and when.
    fn result_line(&self, width: usize) -> Parts {
        let (when, ago, time) = (&self.when, &self.ago, &self.time);
        Parts::first_fitting(
            width,
            vec![
                self.violations(self.head().text(format!("{when}{ago}"))),
                self.violations(self.head().text(when.clone())),
                self.violations(self.head().text(format!(" {time}"))),
                self.violations(self.head()),
            ],
        )
    }

    /// The second of two lines: what the run checked, how far, and after it where to look
    /// when it failed or, when it holds, when it runs again.
    fn coverage_line(&self, up_to: u64, width: usize) -> Parts {
        let after = if self.verify.ok {
            self.verify
                .next_at
                .as_ref()
                .map(|next| format!(" · next {}", clock_time(next)))
                .unwrap_or_default()
        } else {
            " · the worker's log lists the violations".to_string()
        };
        let indent = Parts::new().text(self.indent());
        Parts::first_fitting(
            width,
            vec![
                self.covered(self.checked(indent.clone()), up_to)
                    .text(after.clone()),
                self.covered(indent.clone(), up_to).text(after),
                self.covered(indent, up_to),
            ],
        )
    }
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
    let inner = panel(frame, area, pending_title(pending.len(), fits), true, theme);
    if pending.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("nothing in flight", theme.dim())),
            inner,
        );
        return;
    }
    draw_pending_table(frame, inner, pending, theme);
}

/// The pending panel's title, with how many of the `total` keys its `fits` rows show when
/// not all.
fn pending_title(total: usize, fits: usize) -> Parts {
    let title = Parts::new().text("Pending now, oldest first");
    if total > fits {
        title
            .text(" · ")
            .num(usize_units(fits))
            .text(" of ")
            .num(usize_units(total))
            .text(" shown")
    } else {
        title
    }
}

/// The pending keys' table: who, which key, the command and its money, how long it has
/// waited, and whether its lease ran out.
fn draw_pending_table(frame: &mut Frame, area: Rect, pending: &[KeyRecord], theme: Theme) {
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
    let (widths, fitted) = fit_table(&header, &texts, area.width, |i, need| match i {
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
    let rows = pending
        .iter()
        .zip(&texts)
        .map(|(record, texts)| pending_row(record, texts, &fitted, theme));
    let table = Table::new(rows, widths)
        .flex(Flex::Start)
        .header(Row::new(header).style(theme.header()));
    frame.render_widget(table, area);
}

/// A pending key's row, its `texts` fitted to the columns' `fitted` cells: in the warning
/// colour, or the alarm's when its lease ran out.
fn pending_row(record: &KeyRecord, texts: &[String], fitted: &[u16], theme: Theme) -> Row<'static> {
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
