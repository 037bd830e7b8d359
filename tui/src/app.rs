//! The dashboard's state and the one place that changes it.
//!
//! Every input arrives as an [`Event`]: a key, a resize, a tick, data from the feed
//! thread, or shutdown. [`App::handle`] is the only function that mutates the state;
//! `draw` only reads it. The state never reads a clock or the network: ages come from
//! the worker, staleness is counted in ticks, so tests replay events and get the same
//! screen every time.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::model::{
    Account, AccountsPage, Conflict, FactRow, KeyCounts, KeyRecord, KeyStatus, KeysPage,
    QuarantinePage, Snapshot,
};
use crate::sanitize::Clean;

/// Keys asked of the server per page: enough to fill a tall terminal, small enough
/// that a ledger with a million keys costs the same as one with a hundred.
pub const KEYS_PAGE_LIMIT: u32 = 200;
/// Facts kept for the log view; older ones fall off the front.
pub const FACTS_KEPT: usize = 1000;
/// Snapshots kept for the key-count trend (at 4 Hz, half a minute).
pub const TREND_SAMPLES: usize = 120;
/// The trend compares the newest count with the one this many samples back (~10 s).
pub const TREND_WINDOW: usize = 40;
/// Ticks without data after which the screen says the data is stale (2 s at 4 Hz).
pub const STALE_TICKS: u32 = 8;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Key(KeyEvent),
    Resize(u16, u16),
    Tick,
    Data(Data),
    Shutdown,
}

/// What the feed thread learned.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Snapshot(Box<Snapshot>),
    /// A page of keys, with the query that produced it so stale pages can be dropped.
    Keys {
        query: KeyQuery,
        page: KeysPage,
    },
    KeyDetail(Box<KeyRecord>),
    Accounts(AccountsPage),
    /// The newest quarantined messages.
    Quarantine(QuarantinePage),
    /// New facts after the last one received; `reset` when the tail starts over
    /// (first connection, a worker with a new database, or the dashboard fell behind).
    Facts {
        facts: Vec<FactRow>,
        reset: bool,
    },
    /// The worker answered, but one endpoint did not work (HTTP error, bad JSON).
    Unavailable {
        endpoint: &'static str,
        error: String,
    },
    /// The worker did not answer; the feed thread retries on its own.
    Disconnected {
        error: String,
        attempt: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum View {
    Overview,
    Keys,
    Conflicts,
    Balances,
    Log,
}

impl View {
    pub const ALL: [View; 5] = [
        View::Overview,
        View::Keys,
        View::Conflicts,
        View::Balances,
        View::Log,
    ];

    pub fn index(self) -> usize {
        match self {
            View::Overview => 0,
            View::Keys => 1,
            View::Conflicts => 2,
            View::Balances => 3,
            View::Log => 4,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Keys => "Keys",
            View::Conflicts => "Conflicts",
            View::Balances => "Balances",
            View::Log => "Log",
        }
    }

    fn step(self, forward: bool) -> View {
        let count = View::ALL.len();
        let index = if forward {
            (self.index() + 1) % count
        } else {
            (self.index() + count - 1) % count
        };
        View::ALL[index]
    }
}

/// The server-side filter and order of the keys table, sent as query parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyQuery {
    /// The order the worker pages in; the page is then sorted the same way here.
    pub sort: KeySort,
    pub status: Option<KeyStatus>,
    pub client: Option<String>,
    pub text: Option<String>,
    /// Cursor from the previous page's `next`.
    pub after: Option<String>,
    pub limit: u32,
}

impl KeyQuery {
    /// Parses the filter line of the keys view: `status:pending client:shop ord-1`.
    /// `s:` and `c:` are short forms; every other word is text to search for.
    pub fn parse(filter: &str) -> KeyQuery {
        let mut query = KeyQuery {
            limit: KEYS_PAGE_LIMIT,
            ..KeyQuery::default()
        };
        let mut words = Vec::new();
        for word in filter.split_whitespace() {
            let status = word
                .strip_prefix("status:")
                .or_else(|| word.strip_prefix("s:"))
                .and_then(KeyStatus::parse);
            if let Some(status) = status {
                query.status = Some(status);
                continue;
            }
            let client = word
                .strip_prefix("client:")
                .or_else(|| word.strip_prefix("c:"))
                .filter(|value| !value.is_empty());
            if let Some(client) = client {
                query.client = Some(client.to_string());
                continue;
            }
            words.push(word);
        }
        if !words.is_empty() {
            query.text = Some(words.join(" "));
        }
        query
    }
}

/// What the feed thread should fetch besides the snapshot and the facts tail. The main
/// loop sends it whenever it changes, which also wakes the thread for a prompt refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wants {
    pub view: View,
    pub keys: KeyQuery,
    /// (client, key) of the key whose detail pane is open.
    pub detail: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// No answer yet.
    Connecting,
    Live,
    Disconnected {
        error: String,
        attempt: u32,
    },
}

/// How the keys table is ordered. The worker pages in this order, so the first page holds
/// the newest keys, or the first keys by name, of the whole ledger, not of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeySort {
    /// By time, newest first (`order=newest`).
    #[default]
    Newest,
    /// By key, then client, with the numbers in keys compared by value (`big-17` before
    /// `big-102`) within a page; the worker pages in byte order (`order=key`).
    Key,
}

impl KeySort {
    /// The `order` the worker is asked for.
    pub fn order(self) -> &'static str {
        match self {
            KeySort::Newest => "newest",
            KeySort::Key => "key",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConflictSort {
    #[default]
    Newest,
    Client,
    Key,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BalanceSort {
    #[default]
    Account,
    Currency,
    BalanceHighFirst,
    BalanceLowFirst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sorts {
    pub keys: KeySort,
    pub conflicts: ConflictSort,
    pub balances: BalanceSort,
}

/// Everything the worker told us. Cloned whole when the display is paused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Feed {
    pub snapshot: Option<Snapshot>,
    /// Key counts of recent snapshots, oldest first, for the trend.
    pub key_history: VecDeque<KeyCounts>,
    pub keys: Option<KeysPage>,
    /// The order the worker paged `keys` in.
    pub keys_sort: KeySort,
    pub detail: Option<KeyRecord>,
    pub accounts: Option<AccountsPage>,
    pub quarantine: Option<QuarantinePage>,
    pub facts: VecDeque<FactRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct App {
    pub server: String,
    pub color: bool,
    pub view: View,
    /// Terminal size, from resize events; used for page jumps.
    pub size: (u16, u16),
    pub connection: Connection,
    pub ticks_since_data: u32,
    pub feed: Feed,
    /// While paused, the screen shows this copy and `feed` keeps updating underneath.
    pub frozen: Option<Box<Feed>>,
    pub help: bool,
    /// Lines of the help scrolled past; the view holds it to what the help has.
    pub help_scroll: usize,
    /// The filter being typed, while `/` is open.
    pub input: Option<String>,
    /// The applied filter of each view.
    pub filters: [String; 5],
    pub selected: [usize; 5],
    pub sorts: Sorts,
    /// Whether the keys view shows the detail pane of the selected key (or of `opened`).
    pub detail_open: bool,
    /// (client, key) of a key opened from another view (Enter on a conflict): the detail
    /// shows it, wherever it is in the keys, until it is closed or the selection moves.
    pub opened: Option<(Clean, Clean)>,
    /// The view Esc goes back to from the detail of an `opened` key.
    pub back: Option<View>,
    /// The log view keeps the newest fact selected until the user scrolls up.
    pub follow_log: bool,
    /// Cursors of the keys pages before the current one, for paging back.
    pub key_pages: Vec<Option<String>>,
    pub key_page_cursor: Option<String>,
    /// Endpoints that answered with an error, and the error.
    pub problems: BTreeMap<&'static str, String>,
    pub quit: bool,
}

impl App {
    pub fn new(server: &str, color: bool) -> App {
        App {
            server: server.to_string(),
            color,
            view: View::Overview,
            size: (80, 24),
            connection: Connection::Connecting,
            ticks_since_data: 0,
            feed: Feed::default(),
            frozen: None,
            help: false,
            help_scroll: 0,
            input: None,
            filters: Default::default(),
            selected: [0; 5],
            sorts: Sorts::default(),
            detail_open: false,
            opened: None,
            back: None,
            follow_log: true,
            key_pages: Vec::new(),
            key_page_cursor: None,
            problems: BTreeMap::new(),
            quit: false,
        }
    }

    /// The data on screen: the frozen copy while paused, the live one otherwise.
    pub fn shown(&self) -> &Feed {
        self.frozen.as_deref().unwrap_or(&self.feed)
    }

    pub fn paused(&self) -> bool {
        self.frozen.is_some()
    }

    pub fn filter(&self, view: View) -> &str {
        &self.filters[view.index()]
    }

    pub fn key_query(&self) -> KeyQuery {
        KeyQuery {
            sort: self.sorts.keys,
            after: self.key_page_cursor.clone(),
            ..KeyQuery::parse(self.filter(View::Keys))
        }
    }

    pub fn wants(&self) -> Wants {
        let detail = if self.view == View::Keys && self.detail_open {
            match &self.opened {
                Some((client, key)) => Some((client.to_string(), key.to_string())),
                None => self
                    .selected_key()
                    .map(|record| (record.client.to_string(), record.key.to_string())),
            }
        } else {
            None
        };
        Wants {
            view: self.view,
            keys: self.key_query(),
            detail,
        }
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Key(key) => self.on_key(key),
            Event::Resize(width, height) => self.size = (width, height),
            Event::Tick => {
                if self.connection == Connection::Live {
                    self.ticks_since_data = self.ticks_since_data.saturating_add(1);
                }
            }
            Event::Data(data) => self.on_data(data),
            Event::Shutdown => self.quit = true,
        }
    }

    fn on_data(&mut self, data: Data) {
        match data {
            Data::Snapshot(snapshot) => {
                self.connection = Connection::Live;
                self.ticks_since_data = 0;
                self.problems.remove("snapshot");
                let history = &mut self.feed.key_history;
                history.push_back(snapshot.keys);
                while history.len() > TREND_SAMPLES {
                    history.pop_front();
                }
                self.feed.snapshot = Some(*snapshot);
            }
            Data::Keys { query, page } => {
                // A page for a filter the user has since changed would flash old rows.
                if query == self.key_query() {
                    self.problems.remove("keys");
                    // Newer keys come in above while the list is by time: a selection
                    // below the top (or with its detail open) stays on its key, not on
                    // its row; one on the top row stays there and so shows the newest.
                    let at_top = self.selected[View::Keys.index()] == 0 && !self.detail_open;
                    let selected = self.selected_id().filter(|_| !at_top);
                    self.feed.keys = Some(page);
                    self.feed.keys_sort = query.sort;
                    if !self.paused()
                        && let Some(id) = selected
                        && let Some(row) = self
                            .visible_keys()
                            .iter()
                            .position(|k| (&k.client, &k.key) == (&id.0, &id.1))
                    {
                        self.selected[View::Keys.index()] = row;
                    }
                }
            }
            Data::KeyDetail(record) => {
                self.problems.remove("key detail");
                self.feed.detail = Some(*record);
            }
            Data::Accounts(page) => {
                self.problems.remove("accounts");
                self.feed.accounts = Some(page);
            }
            Data::Quarantine(page) => {
                self.problems.remove("quarantine");
                self.feed.quarantine = Some(page);
            }
            Data::Facts { facts, reset } => {
                self.problems.remove("facts");
                self.append_facts(facts, reset);
            }
            Data::Unavailable { endpoint, error } => {
                self.problems.insert(endpoint, error);
            }
            Data::Disconnected { error, attempt } => {
                self.connection = Connection::Disconnected { error, attempt };
            }
        }
        if !self.paused() {
            self.clamp_selection();
        }
    }

    fn append_facts(&mut self, facts: Vec<FactRow>, reset: bool) {
        let log = &mut self.feed.facts;
        if reset {
            log.clear();
        }
        let last = log.back().map(|fact| fact.seq);
        log.extend(
            facts
                .into_iter()
                .filter(|fact| last.is_none_or(|last| fact.seq > last)),
        );
        let mut dropped = 0;
        while log.len() > FACTS_KEPT {
            log.pop_front();
            dropped += 1;
        }
        // Keep a scrolled-up selection on the same fact while old ones fall off.
        if !self.follow_log && !self.paused() {
            let selected = &mut self.selected[View::Log.index()];
            *selected = selected.saturating_sub(dropped);
        }
    }

    fn on_key(&mut self, key: KeyEvent) {
        if key.kind == KeyEventKind::Release {
            return;
        }
        let control = key.modifiers.contains(KeyModifiers::CONTROL);
        if control && key.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.input.is_some() {
            self.on_input_key(key);
            return;
        }
        if self.help {
            self.on_help_key(key);
            return;
        }
        if control || key.modifiers.contains(KeyModifiers::ALT) {
            // Ctrl-U clears the view's filter; other chords are not this dashboard's keys,
            // and Ctrl-J must not move the selection as `j` does.
            if control && key.code == KeyCode::Char('u') && !self.filter(self.view).is_empty() {
                self.apply_filter(String::new());
            }
            return;
        }
        self.on_view_key(key.code);
    }

    /// A plain key with nothing open over the view: moves, switches, or acts on the view.
    fn on_view_key(&mut self, code: KeyCode) {
        // Rows of a table page: the terminal less the tab bar, footer, borders and header.
        let page = isize::try_from(self.size.1.saturating_sub(6).max(1)).unwrap_or(1);
        match code {
            KeyCode::Char('q') => self.quit = true,
            // Esc goes back, never out: it closes what is open, and a second Esc does
            // nothing, so pressing it once too often cannot end the session.
            KeyCode::Esc => self.go_back(),
            KeyCode::Tab => self.switch(self.view.step(true)),
            KeyCode::BackTab => self.switch(self.view.step(false)),
            KeyCode::Char(c @ '1'..='5') => {
                let digit = c.to_digit(10).and_then(|d| usize::try_from(d).ok());
                if let Some(view) = digit.and_then(|d| View::ALL.get(d - 1)) {
                    self.switch(*view);
                }
            }
            KeyCode::Char('j') | KeyCode::Down => self.move_selection(1),
            KeyCode::Char('k') | KeyCode::Up => self.move_selection(-1),
            KeyCode::PageDown => self.move_selection(page),
            KeyCode::PageUp => self.move_selection(-page),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX),
            KeyCode::Char('/') => {
                if self.view == View::Overview {
                    // The overview has nothing to filter; keys are what one searches.
                    self.switch(View::Keys);
                }
                self.input = Some(self.filter(self.view).to_string());
            }
            KeyCode::Char('s') => self.cycle_sort(),
            KeyCode::Char('p') => {
                self.frozen = match self.frozen.take() {
                    Some(_) => None,
                    None => Some(Box::new(self.feed.clone())),
                };
                self.clamp_selection();
            }
            KeyCode::Char('?') => {
                self.help = true;
                self.help_scroll = 0;
            }
            KeyCode::Enter if self.view == View::Keys => {
                if self.detail_open {
                    self.close_detail();
                } else {
                    self.detail_open = self.selected_key().is_some();
                }
            }
            KeyCode::Enter if self.view == View::Conflicts => self.open_conflict_key(),
            KeyCode::Char(']') if self.view == View::Keys => self.next_key_page(),
            KeyCode::Char('[') if self.view == View::Keys => self.previous_key_page(),
            _ => {}
        }
    }

    /// The filter line being typed: Enter applies it, Esc cancels it, Ctrl-U empties it.
    fn on_input_key(&mut self, key: KeyEvent) {
        let Some(input) = &mut self.input else {
            return;
        };
        let chord = key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
        match key.code {
            KeyCode::Char('u') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                input.clear();
            }
            KeyCode::Enter => {
                let filter = input.trim().to_string();
                self.input = None;
                self.apply_filter(filter);
            }
            KeyCode::Esc => self.input = None,
            KeyCode::Backspace => {
                input.pop();
            }
            // Only drawable characters go into the filter; it is drawn and sent. A chord
            // is not a character typed.
            KeyCode::Char(c) if !c.is_control() && !chord => input.push(c),
            _ => {}
        }
    }

    /// The help scrolls with the keys that move elsewhere; `q` still quits from it, and
    /// any other key closes it without acting.
    fn on_help_key(&mut self, key: KeyEvent) {
        let max = crate::view::help_scroll_max(self.size.0, self.size.1);
        let page = usize::from(self.size.1.saturating_sub(4).max(1));
        let scroll = &mut self.help_scroll;
        match key.code {
            KeyCode::Char('j') | KeyCode::Down => *scroll = (*scroll + 1).min(max),
            KeyCode::Char('k') | KeyCode::Up => *scroll = scroll.saturating_sub(1),
            KeyCode::PageDown | KeyCode::Char(' ') => *scroll = (*scroll + page).min(max),
            KeyCode::PageUp => *scroll = scroll.saturating_sub(page),
            KeyCode::Home | KeyCode::Char('g') => *scroll = 0,
            KeyCode::End | KeyCode::Char('G') => *scroll = max,
            KeyCode::Char('q') => self.quit = true,
            _ => self.help = false,
        }
    }

    /// Esc: closes the key detail, back to the view the key was opened from.
    fn go_back(&mut self) {
        if self.view == View::Keys && self.detail_open {
            let back = self.back.take();
            self.close_detail();
            if let Some(view) = back {
                self.switch(view);
            }
        }
    }

    fn close_detail(&mut self) {
        self.detail_open = false;
        self.opened = None;
        self.back = None;
    }

    /// Enter on a conflict: its key's detail, in the keys view, fetched by its name
    /// whether or not the keys page holds it. Esc comes back here.
    fn open_conflict_key(&mut self) {
        let Some(conflict) = self
            .visible_conflicts()
            .get(self.selected[View::Conflicts.index()])
            .copied()
        else {
            return;
        };
        self.opened = Some((conflict.client.clone(), conflict.key.clone()));
        self.detail_open = true;
        self.switch(View::Keys);
        self.back = Some(View::Conflicts);
    }

    /// The record of the `opened` key, once the worker has sent it.
    pub fn opened_record(&self) -> Option<&KeyRecord> {
        let (client, key) = self.opened.as_ref()?;
        self.shown()
            .detail
            .as_ref()
            .filter(|d| (&d.client, &d.key) == (client, key))
    }

    fn switch(&mut self, view: View) {
        self.view = view;
        // Esc goes back only from where Enter came: another view is another path.
        self.back = None;
        self.clamp_selection();
    }

    fn apply_filter(&mut self, filter: String) {
        let view = self.view;
        self.filters[view.index()] = filter;
        self.selected[view.index()] = 0;
        if view == View::Keys {
            self.restart_key_pages();
        }
        if view == View::Log {
            self.follow_log = true;
        }
        self.clamp_selection();
    }

    /// Back to the first page, for a new filter or order. The old page belongs to the old
    /// query: nothing is shown until the new one comes, rather than wrong rows.
    fn restart_key_pages(&mut self) {
        self.key_pages.clear();
        self.key_page_cursor = None;
        self.selected[View::Keys.index()] = 0;
        self.close_detail();
        self.feed.keys = None;
    }

    fn next_key_page(&mut self) {
        let next = self
            .shown()
            .keys
            .as_ref()
            .and_then(|page| page.next.clone());
        if let Some(next) = next {
            self.key_pages.push(self.key_page_cursor.take());
            self.key_page_cursor = Some(next);
            self.selected[View::Keys.index()] = 0;
            self.close_detail();
        }
    }

    fn previous_key_page(&mut self) {
        if let Some(cursor) = self.key_pages.pop() {
            self.key_page_cursor = cursor;
            self.selected[View::Keys.index()] = 0;
            self.close_detail();
        }
    }

    fn cycle_sort(&mut self) {
        let sorts = &mut self.sorts;
        match self.view {
            View::Keys => {
                sorts.keys = match sorts.keys {
                    KeySort::Newest => KeySort::Key,
                    KeySort::Key => KeySort::Newest,
                };
                // The worker pages in the new order: its first page is another set of keys.
                self.restart_key_pages();
            }
            View::Conflicts => {
                sorts.conflicts = match sorts.conflicts {
                    ConflictSort::Newest => ConflictSort::Client,
                    ConflictSort::Client => ConflictSort::Key,
                    ConflictSort::Key => ConflictSort::Newest,
                }
            }
            View::Balances => {
                sorts.balances = match sorts.balances {
                    BalanceSort::Account => BalanceSort::Currency,
                    BalanceSort::Currency => BalanceSort::BalanceHighFirst,
                    BalanceSort::BalanceHighFirst => BalanceSort::BalanceLowFirst,
                    BalanceSort::BalanceLowFirst => BalanceSort::Account,
                }
            }
            View::Overview | View::Log => {}
        }
    }

    /// Rows of the current view that the selection moves over.
    pub fn row_count(&self, view: View) -> usize {
        match view {
            View::Overview => 0,
            View::Keys => self.visible_keys().len(),
            View::Conflicts => self.visible_conflicts().len(),
            View::Balances => self.visible_accounts().0.len(),
            View::Log => self.visible_facts().len(),
        }
    }

    fn move_selection(&mut self, delta: isize) {
        let view = self.view;
        let rows = self.row_count(view);
        let last = rows.saturating_sub(1);
        let selected = &mut self.selected[view.index()];
        *selected = match delta {
            isize::MIN => 0,
            isize::MAX => last,
            delta if delta < 0 => selected.saturating_sub(delta.unsigned_abs()),
            delta => selected.saturating_add(delta.unsigned_abs()).min(last),
        };
        if view == View::Log {
            self.follow_log = *selected >= last;
        }
        if view == View::Keys {
            // The detail follows the selection again: an opened key was left.
            self.opened = None;
            self.back = None;
            if rows == 0 {
                self.detail_open = false;
            }
        }
    }

    fn clamp_selection(&mut self) {
        for view in View::ALL {
            let last = self.row_count(view).saturating_sub(1);
            let selected = &mut self.selected[view.index()];
            if view == View::Log && self.follow_log {
                *selected = last;
            } else {
                *selected = (*selected).min(last);
            }
        }
    }

    /// The keys page as shown: server-filtered, sorted here.
    pub fn visible_keys(&self) -> Vec<&KeyRecord> {
        let Some(page) = &self.shown().keys else {
            return Vec::new();
        };
        let mut keys: Vec<&KeyRecord> = page.keys.iter().collect();
        match (self.sorts.keys, self.shown().keys_sort) {
            // The worker's order: its pending keys, then the log read backwards.
            (KeySort::Newest, KeySort::Newest) => {}
            // A page from before the order changed, held by a pause: by age, measured
            // against the worker's clock when it answered, so the smallest is the newest.
            (KeySort::Newest, KeySort::Key) => keys.sort_by_key(|k| k.age_ms),
            (KeySort::Key, _) => keys.sort_by(|a, b| {
                natural_cmp(a.key.as_str(), b.key.as_str())
                    .then_with(|| natural_cmp(a.client.as_str(), b.client.as_str()))
            }),
        }
        keys
    }

    fn selected_id(&self) -> Option<(Clean, Clean)> {
        self.selected_key()
            .map(|record| (record.client.clone(), record.key.clone()))
    }

    pub fn selected_key(&self) -> Option<&KeyRecord> {
        self.visible_keys()
            .get(self.selected[View::Keys.index()])
            .copied()
    }

    pub fn visible_conflicts(&self) -> Vec<&Conflict> {
        let Some(snapshot) = &self.shown().snapshot else {
            return Vec::new();
        };
        let needle = self.filter(View::Conflicts).to_lowercase();
        let mut conflicts: Vec<&Conflict> = snapshot
            .conflicts
            .iter()
            .filter(|c| {
                matches_text(
                    &needle,
                    &[c.client.as_str(), c.key.as_str(), c.command.as_str()],
                )
            })
            .collect();
        match self.sorts.conflicts {
            ConflictSort::Newest => {}
            ConflictSort::Client => conflicts.sort_by(|a, b| a.client.cmp(&b.client)),
            ConflictSort::Key => conflicts.sort_by(|a, b| a.key.cmp(&b.key)),
        }
        conflicts
    }

    /// (user accounts, system accounts), filtered and sorted.
    pub fn visible_accounts(&self) -> (Vec<&Account>, Vec<&Account>) {
        let Some(page) = &self.shown().accounts else {
            return (Vec::new(), Vec::new());
        };
        let needle = self.filter(View::Balances).to_lowercase();
        let (mut system, mut users): (Vec<&Account>, Vec<&Account>) = page
            .accounts
            .iter()
            .filter(|a| matches_text(&needle, &[a.account.as_str(), a.currency.as_str()]))
            .partition(|a| a.is_system());
        let by_name =
            |a: &&Account, b: &&Account| (&a.account, &a.currency).cmp(&(&b.account, &b.currency));
        match self.sorts.balances {
            BalanceSort::Account => users.sort_by(by_name),
            BalanceSort::Currency => {
                users.sort_by(|a, b| (&a.currency, &a.account).cmp(&(&b.currency, &b.account)))
            }
            // Minor units of two currencies are not comparable (100 JPY is not 100 kopecks
            // or cents), so balances are sorted within each currency.
            BalanceSort::BalanceHighFirst => users.sort_by(|a, b| {
                (&a.currency, b.balance)
                    .cmp(&(&b.currency, a.balance))
                    .then_with(|| by_name(a, b))
            }),
            BalanceSort::BalanceLowFirst => users.sort_by(|a, b| {
                (&a.currency, a.balance)
                    .cmp(&(&b.currency, b.balance))
                    .then_with(|| by_name(a, b))
            }),
        }
        system.sort_by(by_name);
        (users, system)
    }

    pub fn visible_facts(&self) -> Vec<&FactRow> {
        let needle = self.filter(View::Log).to_lowercase();
        self.shown()
            .facts
            .iter()
            .filter(|f| {
                matches_text(
                    &needle,
                    &[
                        f.client.as_str(),
                        f.key.as_str(),
                        f.account.as_str(),
                        f.name.as_str(),
                    ],
                )
            })
            .collect()
    }
}

fn matches_text(needle: &str, fields: &[&str]) -> bool {
    needle.is_empty()
        || fields
            .iter()
            .any(|field| field.to_lowercase().contains(needle))
}

/// Compares names as a person reads them: runs of digits by their value, the rest by
/// bytes, so `big-17` comes before `big-102`. Names equal that way (`a01`, `a1`) fall back
/// to bytes, so the order is total.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(p), Some(q)) if p.is_ascii_digit() && q.is_ascii_digit() => {
                let (m, rest_x) = digit_run(x);
                let (n, rest_y) = digit_run(y);
                // Without leading zeros, the longer run is the larger number.
                let order = m.len().cmp(&n.len()).then_with(|| m.cmp(n));
                if order != Ordering::Equal {
                    return order;
                }
                (x, y) = (rest_x, rest_y);
            }
            (Some(p), Some(q)) => {
                if p != q {
                    return p.cmp(q);
                }
                (x, y) = (&x[1..], &y[1..]);
            }
        }
    }
}

/// The digits at the start of `s` without their leading zeros, and what follows them.
fn digit_run(s: &[u8]) -> (&[u8], &[u8]) {
    let end = s
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    let (digits, rest) = s.split_at(end);
    let first = digits
        .iter()
        .position(|b| *b != b'0')
        .unwrap_or(digits.len());
    (&digits[first..], rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_as_people_read_them() {
        let cases: &[(&str, &str, Ordering)] = &[
            ("big-17", "big-102", Ordering::Less),
            ("big-102", "big-17", Ordering::Greater),
            ("big-9", "big-10", Ordering::Less),
            ("a", "a1", Ordering::Less),
            ("a1b", "a1", Ordering::Greater),
            ("a01", "a1", Ordering::Less),
            ("a1", "a01", Ordering::Greater),
            ("a001x", "a1y", Ordering::Less),
            ("ord-2", "ord-2", Ordering::Equal),
            ("dep-1", "ord-1", Ordering::Less),
            (
                "x99999999999999999999999",
                "x100000000000000000000000",
                Ordering::Less,
            ),
            ("2", "10", Ordering::Less),
            ("", "0", Ordering::Less),
        ];
        for (a, b, expected) in cases {
            assert_eq!(natural_cmp(a, b), *expected, "{a} vs {b}");
        }
        let mut keys = vec!["big-102", "dep-10", "big-17", "big-1", "dep-9", "big-170"];
        keys.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            keys,
            ["big-1", "big-17", "big-102", "big-170", "dep-9", "dep-10"]
        );
    }
}
