//! `ledger-tui`: the thin binary. Parses arguments, starts the feed, input and tick
//! threads, and runs the loop that feeds their events to the [`App`] and draws it.

mod demo;

use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use crossterm::event::{self as terminal_event, Event as TerminalEvent, KeyEventKind};
use ledger_tui::app::Wants;
use ledger_tui::feed::{self, FeedConfig};
use ledger_tui::{App, Event, draw};
use ratatui::DefaultTerminal;

/// Ticks drive the "no data for N s" warning; 4 Hz matches the feed.
const TICK: Duration = Duration::from_millis(250);

/// Live dashboard of an Idem inbox-worker. It only reads; it never moves money.
#[derive(Debug, Parser)]
#[command(name = "ledger-tui", version)]
struct Args {
    /// The worker's address.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7420",
        env = "IDEM_SERVER",
        hide_env_values = true
    )]
    server: String,
    /// Admin bearer secret, for a worker started with tokens.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// No colours (as does a non-empty NO_COLOR).
    #[arg(long)]
    no_color: bool,
    /// Start a worker on a temporary ledger, play a storm of commands against it and
    /// watch it. Runs the inbox-worker binary found next to this one, else on the PATH.
    #[arg(long)]
    demo: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let no_color = args.no_color || std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let (events_sender, events) = mpsc::channel();
    spawn_signals(events_sender.clone()).context("installing the signal handlers")?;
    // The demo worker lives until the dashboard has stopped drawing.
    let demo = if args.demo {
        Some(demo::start().context("starting the demo worker")?)
    } else {
        None
    };
    let server = demo
        .as_ref()
        .map_or_else(|| args.server.clone(), |demo| demo.server.clone());

    let mut app = App::new(&server, !no_color);
    let (wants_sender, wants) = mpsc::channel();
    let config = FeedConfig {
        server,
        token: args.token,
    };
    feed::spawn(config, events_sender.clone(), wants, app.wants())
        .context("starting the feed thread")?;
    spawn_ticks(events_sender.clone()).context("starting the tick thread")?;

    // ratatui::init installs a panic hook that restores the terminal before the
    // message is printed, so a panic does not leave the shell in raw mode.
    let mut terminal = ratatui::init();
    spawn_input(events_sender).context("starting the input thread")?;
    let result = run(&mut terminal, &mut app, &events, &wants_sender);
    // The demo worker first: after a hang-up the terminal is gone, and restoring it fails
    // loudly enough (a panic while reporting the failure) to end the process on the spot.
    drop(demo);
    ratatui::restore();
    result
}

fn run(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    events: &Receiver<Event>,
    wants: &Sender<Wants>,
) -> anyhow::Result<()> {
    let size = terminal.size()?;
    app.handle(Event::Resize(size.width, size.height));
    let mut sent = app.wants();
    loop {
        terminal.draw(|frame| draw(frame, app))?;
        let Ok(event) = events.recv() else {
            return Ok(());
        };
        app.handle(event);
        // Draw once per burst: a poll round brings several events at once.
        while let Ok(event) = events.try_recv() {
            app.handle(event);
        }
        if app.quit {
            return Ok(());
        }
        let now = app.wants();
        if now != sent {
            // The feed thread wakes on this and fetches what the user now looks at.
            let _ = wants.send(now.clone());
            sent = now;
        }
    }
}

fn spawn_ticks(events: Sender<Event>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tick".into())
        .spawn(move || {
            while events.send(Event::Tick).is_ok() {
                std::thread::sleep(TICK);
            }
        })
        .map(drop)
}

/// SIGTERM, SIGHUP and SIGINT end the dashboard as `q` does: the terminal is restored and
/// a `--demo` worker is stopped, not left running on its own. A second SIGTERM or SIGINT,
/// should the first not be enough, ends the process as it would have without this
/// handler. Hang-ups never do: a closing terminal sends several (the terminal's and the
/// kernel's), and the first is already being handled.
#[cfg(unix)]
fn spawn_signals(events: Sender<Event>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first = true;
            for signal in signals.forever() {
                if first {
                    first = false;
                    let _ = events.send(Event::Shutdown);
                } else if signal != SIGHUP {
                    let _ = signal_hook::low_level::emulate_default_handler(signal);
                }
            }
        })
        .map(drop)
}

#[cfg(not(unix))]
fn spawn_signals(_events: Sender<Event>) -> std::io::Result<()> {
    Ok(())
}

fn spawn_input(events: Sender<Event>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || {
            loop {
                let event = match terminal_event::read() {
                    Ok(TerminalEvent::Key(key)) if key.kind != KeyEventKind::Release => {
                        Event::Key(key)
                    }
                    Ok(TerminalEvent::Resize(width, height)) => Event::Resize(width, height),
                    Ok(_) => continue,
                    // The terminal is gone: nothing left to show.
                    Err(_) => Event::Shutdown,
                };
                let shutdown = event == Event::Shutdown;
                if events.send(event).is_err() || shutdown {
                    return;
                }
            }
        })
        .map(drop)
}
