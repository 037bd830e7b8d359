//! The balances view: accounts, system accounts and the sum per currency.

use super::*;

pub(super) fn draw_balances(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let roomy = roomy(area);
    let Some(page) = &app.shown().accounts else {
        draw_waiting(frame, area, app, theme);
        return;
    };
    let (users, system) = app.visible_accounts();
    let mut sums = currency_sums(&page.accounts, &page.sums);
    // A sum that is not zero comes first: if not every currency fits, those that are
    // left out and counted are the balanced ones.
    sums.sort_by_key(CurrencySum::balanced);
    let heights = if roomy {
        roomy_heights(area.height, users.len(), system.len(), sums.len())
    } else {
        [area.height.saturating_sub(3), 2, 1]
    };
    let [users_area, system_area, sums_area] =
        Layout::vertical(heights.map(Constraint::Length)).areas(area);

    // One layout for both tables, so their columns line up.
    let spec = balance_columns(&users, &system);
    let inner_width = users_area.width.saturating_sub(if roomy { 2 } else { 0 });
    let (widths, fitted) = columns(&spec, table_width(inner_width), 1);
    let selected = app.selected[View::Balances.index()];
    let inner = panel(
        frame,
        users_area,
        accounts_title(app, users.len(), users_area, roomy),
        roomy,
        theme,
    );
    let rows = users.iter().map(|account| account_row(account, &fitted));
    draw_table(
        frame,
        inner,
        balance_header(theme),
        rows,
        widths.clone(),
        selected,
        theme,
    );
    if roomy {
        draw_system_table(frame, system_area, &system, &widths, &fitted, theme);
        draw_sum_lines(frame, sums_area, &sums, theme);
    } else {
        draw_compact_totals(frame, system_area, sums_area, &system, &sums, theme);
    }
}

/// Heights of the accounts, the system accounts and the sums in a bordered layout of
/// `height` rows. The sums come first, one line each (packed when they do not all fit),
/// then the system accounts, every one while the accounts keep a few rows; the accounts
/// scroll in the rest. What does not fit is counted in its panel's title.
fn roomy_heights(height: u16, users: usize, system: usize, sums: usize) -> [u16; 3] {
    let rows = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
    // Borders, a header, and at least a row (up to three) of accounts.
    let users_min = 3 + rows(users.clamp(1, 3));
    let system_min = 3 + rows(system.min(1));
    let sums_want = 2 + rows(sums.max(1));
    let sums_h = sums_want
        .min(height.saturating_sub(users_min + system_min))
        .max(3);
    let system_want = 3 + rows(system);
    let system_h = system_want
        .min(height.saturating_sub(users_min + sums_h))
        .max(system_min);
    [height.saturating_sub(sums_h + system_h), system_h, sums_h]
}

/// `Accounts · 5 · by account`; when they do not all fit, which rows are shown.
fn accounts_title(app: &App, users: usize, area: Rect, roomy: bool) -> Parts {
    let sort = match app.sorts.balances {
        BalanceSort::Account => "by account",
        BalanceSort::Currency => "by currency",
        BalanceSort::BalanceHighFirst => "by balance ↓ within each currency",
        BalanceSort::BalanceLowFirst => "by balance ↑ within each currency",
    };
    let count = Parts::new().text("Accounts · ");
    let selected = app.selected[View::Balances.index()];
    let count = rows_range(count.clone(), users, panel_rows(area, roomy), selected)
        .unwrap_or_else(|| count.num(usize_units(users)));
    // More accounts than the dashboard reads: the first ones are shown, and it says so.
    let unread = app
        .feed
        .accounts
        .as_ref()
        .is_some_and(|page| page.next.is_some());
    let count = if unread {
        count.text(" · more not read")
    } else {
        count
    };
    let short = sort.replace(" within each currency", " per currency");
    let width = usize::from(area.width.saturating_sub(if roomy { 4 } else { 0 }));
    Parts::first_fitting(
        width,
        vec![
            count.clone().text(format!(" · {sort}")),
            count.clone().text(format!(" · {short}")),
            count,
        ],
    )
}

/// The system accounts, all of them while they fit; the title says how many do not.
fn draw_system_table(
    frame: &mut Frame,
    area: Rect,
    system: &[&Account],
    widths: &[Constraint],
    fitted: &[u16],
    theme: Theme,
) {
    // Borders and the header.
    let fits = usize::from(area.height.saturating_sub(3));
    let title = if system.len() > fits {
        Parts::new()
            .text("System accounts · ")
            .num(usize_units(fits))
            .text(" of ")
            .num(usize_units(system.len()))
            .text(" shown; / filters by name or currency")
    } else {
        Parts::from("System accounts")
    };
    let inner = panel(frame, area, title, true, theme);
    let rows = system.iter().map(|account| account_row(account, fitted));
    let table = Table::new(rows, widths.to_vec())
        .flex(Flex::Start)
        .header(balance_header(theme))
        .highlight_spacing(HighlightSpacing::Always)
        .highlight_symbol("  ");
    frame.render_widget(table, inner);
}

/// A line per currency while they fit; else as many as fit, packed, and the rest
/// counted. The title says how many sum to zero, so a currency left out is not a doubt.
fn draw_sum_lines(frame: &mut Frame, area: Rect, sums: &[CurrencySum], theme: Theme) {
    let off = sums.iter().filter(|sum| !sum.balanced()).count();
    let mut title = Parts::new()
        .text("Sum per currency · ")
        .num(usize_units(sums.len() - off))
        .text(" ✓");
    if off > 0 {
        title = title
            .text(" · ")
            .styled(format!("{off} ✗ NOT ZERO"), theme.bad());
    }
    let inner = panel(frame, area, title, true, theme);
    if sums.len() <= usize::from(inner.height) {
        let lines: Vec<Parts> = sums.iter().map(|sum| sum_line(sum, theme)).collect();
        draw_lines(frame, inner, &lines);
        return;
    }
    let lines = pack_sums(sums, usize::from(inner.width), inner.height.into(), theme);
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The sums as words (`RUB=0.00✓`), packed into `rows` lines of `width`: numbers in full
/// up to half a line, else 8 cells each when that shows more currencies.
fn pack_sums(sums: &[CurrencySum], width: usize, rows: usize, theme: Theme) -> Vec<Line<'static>> {
    let (lines, _) = [width / 2, 8]
        .iter()
        .map(|budget| {
            let items: Vec<Vec<Span>> = sums
                .iter()
                .map(|sum| sum_words(sum, theme, *budget))
                .collect();
            // Two spaces between currencies, which the empty separator makes.
            let label = Span::styled("sum", theme.bold());
            pack(label, &items, "", width, rows)
        })
        .min_by_key(|(_, shown)| std::cmp::Reverse(*shown))
        .unwrap_or_default();
    lines
}

/// The compact layout's system accounts and sums, each packed into its lines with what
/// does not fit counted (`+2 more`).
fn draw_compact_totals(
    frame: &mut Frame,
    system_area: Rect,
    sums_area: Rect,
    system: &[&Account],
    sums: &[CurrencySum],
    theme: Theme,
) {
    let width = usize::from(system_area.width);
    // Numbers in full up to half a line; if that leaves accounts out, 8 cells each
    // (`-1.01e17`) when that shows more of them. Names keep at most half a line.
    let (lines, _) = [width / 2, 8]
        .iter()
        .map(|budget| {
            let items: Vec<Vec<Span>> = system
                .iter()
                .map(|account| {
                    vec![
                        Span::raw(fit_middle(account.account.as_str(), width / 2)),
                        Span::raw(fit_money(
                            account.balance.0,
                            account.currency.as_str(),
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
    let lines = pack_sums(sums, width, sums_area.height.into(), theme);
    frame.render_widget(Paragraph::new(lines), sums_area);
}

/// The name column is as wide as the longest name while there is room (names may be
/// `tenant/name`, up to 129 bytes), after the balance has what its longest needs; a name
/// longer than that is cut in the middle, with a `…`.
fn balance_columns(users: &[&Account], system: &[&Account]) -> [Column; 3] {
    let accounts = || users.iter().chain(system);
    let name_need = accounts()
        .map(|account| cells(account.account.as_str()))
        .max()
        .unwrap_or(0);
    let balance_need = accounts()
        .map(|account| {
            cells(&money::format_number(
                account.balance.0,
                account.currency.as_str(),
            ))
        })
        .max()
        .unwrap_or(0);
    [
        Column::label(8, name_need),
        Column::fixed(8),
        number_column("balance", balance_need, 18),
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
/// digits first; fitted to the column, it cannot. `fitted`: the columns' widths.
fn account_row(account: &Account, fitted: &[u16]) -> Row<'static> {
    Row::new(vec![
        Cell::from(fit_middle(account.account.as_str(), fitted[0].into())),
        Cell::from(fit_text(account.currency.as_str(), 8)),
        Cell::from(
            Line::raw(fit_money(
                account.balance.0,
                account.currency.as_str(),
                fitted[2].into(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
