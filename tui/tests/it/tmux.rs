//! End to end in tmux: a real `inbox-worker serve`, the real `ledger-tui` in a detached
//! tmux pane of fixed size, commands sent with the real CLI, and the screen read back with
//! `capture-pane` the way an operator would see it. Every wait is a bounded poll that
//! fails with the last screen, never a fixed sleep.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Generous for a loaded 2-core CI machine; a healthy run needs well under a second per
/// step (the dashboard polls at 4 Hz).
const SCREEN_WAIT: Duration = Duration::from_secs(20);
const WIDTH: u16 = 120;
const HEIGHT: u16 = 40;

/// The pane's shell runs the dashboard, then prints its exit status and whether the
/// terminal is back in canonical (cooked) mode, i.e. raw mode was undone. The line is
/// printed only once the dashboard is gone, since the shell waits for it. The shell then
/// stays (until the tmux server is killed) so the pane and its last screen remain:
/// tmux 3.3's `remain-on-exit` loses lines printed just before the command exits.
const AFTER_EXIT: &str = r#""$0" "$@"; status=$?
if stty -a | grep -q -- '-icanon'; then mode=raw; else mode=cooked; fi
echo "ledger-tui exited: status $status, terminal $mode"
exec sleep 3600"#;

#[test]
fn dashboard_follows_a_real_worker_in_tmux() {
    require_tmux();
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::start(&dir.path().join("ledger"), &dir.path().join("worker.log"));
    let tmux = Tmux::start(
        &dir.path().join("tmux.sock"),
        &[
            "sh",
            "-c",
            AFTER_EXIT,
            env!("CARGO_BIN_EXE_ledger-tui"),
            "--server",
            &worker.base,
        ],
    );

    tmux.wait_for("the dashboard to connect", |s| s.contains("● live · seq 0"));

    // One of each: a first execution, a withdrawal, a retry (replay), and the same key
    // with another amount (a reused key: exit 5, nothing moves).
    let cli = |args: &[&str]| worker.submit(args);
    let deposit = cli(&[
        "deposit",
        "--key",
        "dep-1",
        "--account",
        "alice",
        "--amount",
        "10",
        "--currency",
        "RUB",
    ]);
    assert_exit(&deposit, 0, "applied:");
    let withdraw = [
        "withdraw",
        "--key",
        "wd-1",
        "--account",
        "alice",
        "--amount",
        "3",
        "--currency",
        "RUB",
    ];
    assert_exit(&cli(&withdraw), 0, "applied:");
    assert_exit(&cli(&withdraw), 0, "replayed:");
    let mut other_amount = withdraw;
    other_amount[6] = "2.50";
    assert_exit(&cli(&other_amount), 5, "");
    // An overdraft: rejected (exit 3), recorded as a fact.
    let mut overdraft = withdraw;
    overdraft[2] = "wd-9";
    overdraft[6] = "50";
    assert_exit(&cli(&overdraft), 3, "");

    // Overview: three keys done, one duplicate absorbed, one 422 reused-key conflict,
    // and the verify that ran at start, on the empty ledger, says so.
    let overview = tmux.wait_for("the overview to show the commands", |s| {
        let s = squeeze(s);
        s.contains("● live · seq 3")
            && s.contains("done 3 ")
            && s.contains("duplicates absorbed 1")
            && s.contains("applied 2 · rejected 1 · replayed 1")
            && s.contains("409 in flight 0 · 422 reused 1")
    });
    assert!(overview.contains("Throughput"), "{overview}");
    let storage = squeeze(&overview);
    assert!(
        storage.contains("verify ok at start,") && storage.contains("up to seq 0 of 3"),
        "{overview}"
    );

    // Keys, newest first, each with its outcome.
    tmux.press("2");
    let keys = tmux.wait_for("the keys view to list the keys", |s| {
        has_row(
            s,
            &[
                "done",
                "default",
                "dep-1",
                "deposit",
                "alice",
                "10.00 RUB",
                "applied",
            ],
        ) && has_row(
            s,
            &[
                "done", "default", "wd-1", "withdraw", "alice", "3.00 RUB", "applied",
            ],
        ) && has_row(
            s,
            &[
                "done",
                "default",
                "wd-9",
                "withdraw",
                "alice",
                "50.00 RUB",
                "insufficient_funds",
            ],
        )
    });
    assert!(
        squeeze(&keys).contains("Keys · 3 shown · newest first"),
        "{keys}"
    );
    assert!(rows_in_order(&keys, &["wd-9", "wd-1", "dep-1"]), "{keys}");
    assert!(
        !keys.contains("Throughput"),
        "still on the overview:\n{keys}"
    );
    // `s`: by key; the third is the overdraft, whose detail says why it was refused.
    tmux.press("s");
    let by_key = tmux.wait_for("the keys by key", |s| {
        squeeze(s).contains("Keys · 3 shown · by key")
            && rows_in_order(s, &["dep-1", "wd-1", "wd-9"])
    });
    assert!(
        has_row(&by_key, &["wd-9", "insufficient_funds"]),
        "{by_key}"
    );
    tmux.press("jj");
    tmux.key("Enter");
    tmux.wait_for("the overdraft's detail", |s| {
        let s = squeeze(s);
        s.contains("outcome rejected: insufficient_funds")
            && s.contains("command withdraw 50.00 RUB from alice")
            && s.contains("reason The balance is lower than the")
            && s.contains("balance 7.00 RUB on alice, less than the")
    });
    tmux.key("Escape");
    tmux.wait_for("the detail to close", |s| !s.contains("Key detail"));

    tmux.press("3");
    let conflicts = tmux.wait_for("the conflicts view to show the reused key", |s| {
        has_row(s, &["422 reused", "default", "wd-1", "withdraw", "amount"])
    });
    assert!(!conflicts.contains("dep-1"), "{conflicts}");

    tmux.press("4");
    // The screen is read until all of it is drawn: a capture may catch a frame that
    // tmux has only partly written.
    tmux.wait_for(
        "the balances view: alice, both system accounts, the sum",
        |s| {
            has_row(s, &["alice", "RUB", "7.00"])
                && has_row(s, &["@payouts", "RUB", "3.00"])
                && has_row(s, &["@world", "RUB", "-10.00"])
                && squeeze(s).contains("RUB = 0.00 ✓")
        },
    );

    tmux.press("?");
    tmux.wait_for("the help overlay", |s| {
        s.contains("┌ Help") && s.contains("What the screen says")
    });
    // Esc closes the help and leaves the view as it was. (That a second Esc does not quit
    // is a state test: a key sent right after Esc can reach the dashboard as Alt+key.)
    tmux.key("Escape");
    tmux.wait_for("the help to close over the balances", |s| {
        !s.contains("┌ Help") && has_row(s, &["alice", "RUB", "7.00"])
    });

    tmux.press("q");
    let after = tmux.wait_for("ledger-tui to exit after q", |s| {
        s.contains("ledger-tui exited")
    });
    assert!(
        after.contains("ledger-tui exited: status 0, terminal cooked"),
        "the dashboard did not exit cleanly or left the terminal raw:\n{after}"
    );
    for drawn in ["Overview", "Accounts", "alice", "live"] {
        assert!(
            !after.contains(drawn),
            "{drawn:?} is still on the screen after quitting: the alternate screen was \
             not left\n{after}"
        );
    }
    assert_eq!(
        tmux.format("#{alternate_on}"),
        "0",
        "still on the alternate screen"
    );
}

/// `--demo` runs the worker next to the dashboard's binary as a child process: the
/// screens show its storm live (commands applied, retries absorbed, conflicts), and `q`
/// ends the worker with the dashboard and deletes its folder.
#[test]
fn demo_runs_a_worker_beside_the_dashboard_and_stops_it_on_quit() {
    require_tmux();
    worker_bin();
    let dir = tempfile::tempdir().unwrap();
    let tmux = demo_in_tmux(&dir.path().join("tmux.sock"));

    let overview = tmux.wait_for("the demo's storm on the overview", |s| {
        let s = squeeze(s);
        s.contains("● live · seq")
            && !s.contains("● live · seq 0 ")
            && count_after(&s, "duplicates absorbed ").is_some_and(|n| n > 0)
            && count_after(&s, "applied ").is_some_and(|n| n > 0)
    });
    assert!(overview.contains("Throughput"), "{overview}");
    tmux.press("4");
    tmux.wait_for("the demo's accounts on the balances view", |s| {
        has_row(s, &["alice", "RUB"]) && squeeze(s).contains("RUB = 0.00 ✓")
    });

    let worker = DemoWorker::find(&tmux);
    tmux.press("q");
    let after = tmux.wait_for("ledger-tui to exit after q", |s| {
        s.contains("ledger-tui exited")
    });
    assert!(
        after.contains("ledger-tui exited: status 0, terminal cooked"),
        "the dashboard did not exit cleanly or left the terminal raw:\n{after}"
    );
    worker.assert_gone();
}

/// SIGTERM to the dashboard ends it as `q` does: terminal restored, demo worker stopped,
/// its folder deleted.
#[test]
fn demo_worker_does_not_outlive_a_terminated_dashboard() {
    require_tmux();
    worker_bin();
    let dir = tempfile::tempdir().unwrap();
    let tmux = demo_in_tmux(&dir.path().join("tmux.sock"));
    tmux.wait_for("the demo to connect", |s| s.contains("● live · seq"));

    let worker = DemoWorker::find(&tmux);
    let status = Command::new("kill")
        .args(["-TERM", &worker.dashboard.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -TERM {}", worker.dashboard);
    let after = tmux.wait_for("ledger-tui to exit on SIGTERM", |s| {
        s.contains("ledger-tui exited")
    });
    assert!(
        after.contains("ledger-tui exited: status 0, terminal cooked"),
        "the dashboard did not exit cleanly on SIGTERM or left the terminal raw:\n{after}"
    );
    worker.assert_gone();
}

/// The terminal closing under a running demo (the tmux server killed: a hang-up) takes the
/// worker with it, and its folder.
#[test]
fn demo_worker_does_not_outlive_a_closed_terminal() {
    require_tmux();
    worker_bin();
    let dir = tempfile::tempdir().unwrap();
    let tmux = demo_in_tmux(&dir.path().join("tmux.sock"));
    tmux.wait_for("the demo to connect", |s| s.contains("● live · seq"));
    let worker = DemoWorker::find(&tmux);
    drop(tmux);
    worker.assert_gone();
}

fn demo_in_tmux(socket: &Path) -> Tmux {
    Tmux::start(
        socket,
        &[
            "sh",
            "-c",
            AFTER_EXIT,
            env!("CARGO_BIN_EXE_ledger-tui"),
            "--demo",
        ],
    )
}

/// Whether the lines holding `keys` come in this order, each key on a line of its own.
fn rows_in_order(screen: &str, keys: &[&str]) -> bool {
    let lines: Vec<Option<usize>> = keys
        .iter()
        .map(|key| {
            screen
                .lines()
                .position(|line| line.split_whitespace().any(|word| word == *key))
        })
        .collect();
    lines.iter().all(Option::is_some) && lines.windows(2).all(|pair| pair[0] < pair[1])
}

/// The number right after `label` on the (squeezed) screen.
fn count_after(screen: &str, label: &str) -> Option<u64> {
    let at = screen.find(label)? + label.len();
    let digits: String = screen[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The demo's worker process, found from the tmux pane: the pane's shell runs the
/// dashboard, and the dashboard runs `inbox-worker serve --db <its folder>/ledger`.
struct DemoWorker {
    dashboard: u32,
    pid: u32,
    folder: PathBuf,
}

impl DemoWorker {
    fn find(tmux: &Tmux) -> DemoWorker {
        let shell: u32 = tmux.format("#{pane_pid}").parse().unwrap();
        let dashboard = children(shell)
            .into_iter()
            .find(|&p| {
                command_line(p)
                    .first()
                    .is_some_and(|a| a.ends_with("ledger-tui"))
            })
            .unwrap_or_else(|| panic!("no ledger-tui under the pane's shell {shell}"));
        let pid = children(dashboard)
            .into_iter()
            .find(|&p| {
                command_line(p)
                    .first()
                    .is_some_and(|a| a.ends_with("inbox-worker"))
            })
            .unwrap_or_else(|| panic!("no inbox-worker under ledger-tui {dashboard}"));
        let args = command_line(pid);
        assert_eq!(args.get(1).map(String::as_str), Some("serve"), "{args:?}");
        let db = args
            .iter()
            .skip_while(|a| *a != "--db")
            .nth(1)
            .unwrap_or_else(|| panic!("no --db in {args:?}"));
        let folder = Path::new(db).parent().unwrap().to_owned();
        assert!(folder.is_dir(), "{}", folder.display());
        DemoWorker {
            dashboard,
            pid,
            folder,
        }
    }

    /// The dashboard has reaped it, so its process is gone, not a zombie, and has
    /// deleted its folder.
    fn assert_gone(&self) {
        let proc = PathBuf::from(format!("/proc/{}", self.pid));
        let deadline = Instant::now() + SCREEN_WAIT;
        while (proc.exists() || self.folder.exists()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !proc.exists(),
            "the demo worker {} is still there after the dashboard exited",
            self.pid
        );
        assert!(
            !self.folder.exists(),
            "the demo's folder {} was not deleted",
            self.folder.display()
        );
    }
}

/// The processes whose parent is `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the command may hold spaces and parentheses.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            out.push(child);
        }
    }
    out
}

fn command_line(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Fails, never skips: CI installs tmux (`.ci/run`), and a silently skipped end-to-end
/// test would pass for the wrong reason.
fn require_tmux() {
    let found = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return;
    }
    if std::env::var_os("CI").is_some() {
        panic!("tmux is not installed on this CI machine; .ci/run should have installed it");
    }
    panic!(
        "this end-to-end test drives the dashboard in tmux, which is not installed: \
         install tmux (e.g. `apt-get install tmux`; .ci/run does it on CI) and run again"
    );
}

fn assert_exit(out: &Output, code: i32, stdout_starts: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.starts_with(stdout_starts),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// The screen with runs of spaces collapsed, so checks do not depend on column widths.
fn squeeze(screen: &str) -> String {
    let mut out = String::with_capacity(screen.len());
    for c in screen.chars() {
        if !(c == ' ' && out.ends_with(' ')) {
            out.push(c);
        }
    }
    out
}

/// Whether one line of the screen holds all `cells` in order.
fn has_row(screen: &str, cells: &[&str]) -> bool {
    screen.lines().any(|line| {
        let mut rest = line;
        cells.iter().all(|cell| match rest.find(cell) {
            Some(at) => {
                rest = &rest[at + cell.len()..];
                true
            }
            None => false,
        })
    })
}

// ---- the worker -------------------------------------------------------------------------

/// The worker binary sits next to the dashboard's in the same target folder. `cargo test
/// --workspace` builds it (the worker's own tests need it); when only this package was
/// built it is built here.
fn worker_bin() -> PathBuf {
    let tui = Path::new(env!("CARGO_BIN_EXE_ledger-tui"));
    let dir = tui.parent().unwrap();
    let bin = dir.join(format!("inbox-worker{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        return bin;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "inbox-worker", "--bin", "inbox-worker"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            build.arg("--release");
        }
        Some(profile) => {
            build.args(["--profile", profile]);
        }
    }
    let status = build.status().unwrap();
    assert!(status.success(), "building inbox-worker failed: {status}");
    assert!(
        bin.exists(),
        "built inbox-worker, but it is not next to ledger-tui at {}",
        bin.display()
    );
    bin
}

/// A running `inbox-worker serve` on a port the kernel picks; killed on drop.
struct Worker {
    child: Child,
    bin: PathBuf,
    base: String,
    log: PathBuf,
}

impl Worker {
    fn start(db: &Path, log: &Path) -> Worker {
        let bin = worker_bin();
        let mut child = Command::new(&bin)
            .args(["serve", "--db"])
            .arg(db)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.to_owned());
                }
            }
        });
        let mut worker = Worker {
            child,
            bin,
            base: String::new(),
            log: log.to_owned(),
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(base) => worker.base = base,
            Err(_) => panic!("the worker did not start:\n{}", worker.log()),
        }
        worker
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `inbox-worker submit ARGS --server BASE`, with no token from the environment.
    fn submit(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("submit")
            .args(args)
            .args(["--server", &self.base])
            .env_remove("IDEM_TOKEN")
            .env_remove("IDEM_SERVER")
            .output()
            .unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- tmux -------------------------------------------------------------------------------

/// A tmux server of its own (its socket in the test's temporary folder, no config file),
/// so neither the user's sessions nor their `.tmux.conf` play a part; killed on drop, with
/// everything running in it.
struct Tmux {
    socket: PathBuf,
}

const SESSION: &str = "tui";

impl Tmux {
    /// Starts `command` (argv, run without a shell) in a detached WIDTHxHEIGHT session.
    fn start(socket: &Path, command: &[&str]) -> Tmux {
        let tmux = Tmux {
            socket: socket.to_owned(),
        };
        let (w, h) = (WIDTH.to_string(), HEIGHT.to_string());
        let mut args = vec!["new-session", "-d", "-s", SESSION, "-x", &w, "-y", &h];
        args.extend_from_slice(command);
        let out = tmux.command(&args);
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux
    }

    fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(["-f", "/dev/null"])
            .args(args)
            // The dashboard would send this token; the worker here has none.
            .env_remove("IDEM_ADMIN_TOKEN")
            .env_remove("NO_COLOR")
            .output()
            .unwrap()
    }

    fn capture(&self) -> String {
        let out = self.command(&["capture-pane", "-p", "-t", SESSION]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn format(&self, format: &str) -> String {
        let out = self.command(&["display-message", "-p", "-t", SESSION, format]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Types keys literally, as a person at the keyboard would.
    fn press(&self, keys: &str) {
        let out = self.command(&["send-keys", "-t", SESSION, "-l", keys]);
        assert!(out.status.success(), "tmux send-keys {keys:?} failed");
    }

    /// One key by its tmux name: `Enter`, `Escape`.
    fn key(&self, name: &str) {
        let out = self.command(&["send-keys", "-t", SESSION, name]);
        assert!(out.status.success(), "tmux send-keys {name} failed");
    }

    /// Polls the screen until `ready` holds; fails with the last capture.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let screen = self.capture();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {SCREEN_WAIT:?} waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}
