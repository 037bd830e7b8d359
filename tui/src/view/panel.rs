//! Panels and lines: the frame around a view's parts and the text inside it.

use super::*;

/// Roomy layouts get borders and labels; compact ones fit 40x12.
pub(super) fn roomy(area: Rect) -> bool {
    area.width >= 60 && area.height >= 16
}

/// Draws a titled panel when there is room and returns the area inside it. Titles carry
/// counters, so they are fitted like any line of numbers.
pub(super) fn panel(
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

/// One line per row of `area`, each fitted to its width: no wrapping, no silent cut.
pub(super) fn draw_lines(frame: &mut Frame, area: Rect, lines: &[Parts]) {
    let width = usize::from(area.width);
    let lines: Vec<Line> = lines.iter().map(|parts| parts.line(width)).collect();
    frame.render_widget(Paragraph::new(lines), area);
}

/// What a view says before it has data: waiting for it, or that nothing answers.
pub(super) fn draw_waiting(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
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

/// `style` over every span of `line`, as one span's style over its text would be.
pub(super) fn restyle(mut line: Line<'static>, style: Style) -> Line<'static> {
    for span in &mut line.spans {
        span.style = style.patch(span.style);
    }
    line
}
