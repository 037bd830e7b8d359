//! The README's tour and the command-line page's examples, run as written: every
//! ```` ```console ```` block of a document, in order, in one shell session on a fresh
//! folder, with the binaries cargo built, and each command's output compared with the
//! lines the document shows under it. A document that drifts from the product fails here.
//!
//! What a block may hold (docs/testing.md has the same list):
//! - `$ command` lines, run with `sh -c` in the session's folder, the built `inbox-worker`
//!   first on the PATH. A line ending in `\` goes on; a heredoc (`<<'EOF'`) takes the
//!   lines through its end marker. Every command must exit 0: a document that shows a
//!   failure shows its code (`…; echo "exit $?"`).
//! - `$ inbox-worker serve … &`: a worker in the background, on a port the system picks
//!   (`IDEM_LISTEN=127.0.0.1:0`); later commands reach it through `IDEM_SERVER`, and a
//!   `127.0.0.1:7420` in a command is its address. `$ kill %1; wait` stops it (SIGTERM),
//!   waits for its exit, which must be 0, and shows what it printed meanwhile.
//! - The lines under a command: its stdout and stderr as a terminal shows them. `...` on
//!   a line of its own stands for any number of lines, `[..]` for any text within a line.
//!   Times (`2026-12-01T17:42:51.881Z`), loopback ports and `(N ms)` are compared as
//!   placeholders, so the document may show real ones.
//!
//! Blocks of other kinds (`sh`, `json`, none) are not run; a `cargo install` in them must
//! say `--locked` (without it cargo resolves newer dependencies than CI tested) and its
//! `--path DIR` must name a package of this workspace.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use regex::Regex;

use crate::support::{bin, signal, wait_timeout};

/// The workspace's root, where the documents are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_readme_tour_runs_as_written() {
    let steps = run_document("README.md");
    // The tour must not shrink to nothing unnoticed: it serves, submits, consumes, verifies.
    for what in ["serve", "submit", "consume", "verify", "curl"] {
        assert!(
            steps.iter().any(|s| s.command.contains(what)),
            "the README's tour runs no {what}"
        );
    }
}

#[test]
fn the_command_line_page_runs_as_written() {
    let steps = run_document("docs/cli.md");
    assert!(
        steps.len() >= 5,
        "docs/cli.md shows {} commands",
        steps.len()
    );
}

/// The harness itself can fail: a changed line, a missing line, an extra line.
#[test]
fn a_document_that_drifts_fails() {
    let actual = "applied: deposit 1,000.00 RUB to alice\n  key      dep-1\n  at       2026-12-01T17:42:51.881Z\n";
    let matches = |expected: &[&str]| {
        let expected: Vec<String> = expected.iter().map(|l| (*l).to_owned()).collect();
        compare(&expected, actual).is_ok()
    };
    assert!(matches(&[
        "applied: deposit 1,000.00 RUB to alice",
        "  key      dep-1",
        "  at       2025-01-01T00:00:00.000Z",
    ]));
    assert!(matches(&["applied: deposit [..] to alice", "..."]));
    assert!(matches(&["...", "  at       [..]"]));
    assert!(!matches(&[
        "applied: deposit 1000 RUB to alice",
        "  key      dep-1",
        "  at       2025-01-01T00:00:00.000Z",
    ]));
    assert!(!matches(&[
        "applied: deposit 1,000.00 RUB to alice",
        "  key      dep-1"
    ]));
    assert!(!matches(&[
        "applied: deposit 1,000.00 RUB to alice",
        "  key      dep-1",
        "  at       [..]",
        "all guarantees hold",
    ]));
    assert!(!matches(&["...", "  key      dep-2", "..."]));
}

/// One `$` command of a document and the lines shown under it.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
    /// Where the command is, for messages: `README.md:123`.
    at: String,
}

/// The `console` blocks of `text`, as steps in order.
fn steps(name: &str, text: &str) -> Vec<Step> {
    static HEREDOC: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"<<-?\s*['"]?(\w+)['"]?"#).unwrap());
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut in_block = false;
    while let Some((i, line)) = lines.next() {
        if !in_block {
            in_block = line == "```console";
            continue;
        }
        if line == "```" {
            in_block = false;
            continue;
        }
        let Some(first) = line.strip_prefix("$ ") else {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("{name}:{}: output before any command", i + 1));
            step.expected.push(line.to_owned());
            continue;
        };
        let mut command = first.to_owned();
        while command.ends_with('\\') {
            let (_, next) = lines
                .next()
                .unwrap_or_else(|| panic!("{name}:{}: the command goes on past the end", i + 1));
            command.push('\n');
            command.push_str(next);
        }
        if let Some(end) = HEREDOC.captures(&command).map(|c| c[1].to_owned()) {
            loop {
                let (_, next) = lines
                    .next()
                    .unwrap_or_else(|| panic!("{name}:{}: no {end} ends the heredoc", i + 1));
                command.push('\n');
                command.push_str(next);
                if next == end {
                    break;
                }
            }
        }
        steps.push(Step {
            command,
            expected: Vec::new(),
            at: format!("{name}:{}", i + 1),
        });
    }
    assert!(!in_block, "{name}: a console block is not closed");
    steps
}

/// A background job of the session, its output going to a file.
struct Job {
    /// Its number for `kill %N`, as a shell gives it: one more than the highest of the
    /// jobs still running, so a job started after the others stopped is `%1` again.
    number: usize,
    child: Option<Child>,
    output: PathBuf,
    /// How much of the output has been shown already.
    shown: usize,
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One shell session: its folder, environment and background jobs.
struct Session {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    path: String,
    jobs: Vec<Job>,
    /// The address of the worker last started, `127.0.0.1:PORT`.
    server: Option<String>,
    outputs: usize,
}

impl Session {
    fn new() -> Session {
        let dir = tempfile::Builder::new()
            .prefix("idem-tour-")
            .tempdir()
            .unwrap();
        let bin_dir = Path::new(bin()).parent().unwrap().to_path_buf();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Session {
            dir: dir.path().to_path_buf(),
            _dir: dir,
            path,
            jobs: Vec::new(),
            server: None,
            outputs: 0,
        }
    }

    /// `sh -c command` in the session, stdout and stderr into one new file, as a terminal
    /// interleaves them.
    fn shell(&mut self, command: &str) -> (Command, PathBuf) {
        self.outputs += 1;
        let output = self.dir.join(format!(".tour-output-{}", self.outputs));
        let file = File::create(&output).unwrap();
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(command)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .env("PATH", &self.path)
            .env("IDEM_LISTEN", "127.0.0.1:0")
            .env_remove("NO_COLOR");
        // The user's own settings would change what the commands do.
        for var in [
            "IDEM_SERVER",
            "IDEM_TOKEN",
            "IDEM_ADMIN_TOKEN",
            "IDEM_STORE",
            "IDEM_AMQP",
            "IDEM_VIA",
        ] {
            sh.env_remove(var);
        }
        if let Some(server) = &self.server {
            sh.env("IDEM_SERVER", format!("http://{server}"));
        }
        (sh, output)
    }

    /// Runs one step; its output, or why it failed.
    fn run(&mut self, step: &Step) -> Result<String, String> {
        let command = step.command.trim();
        if let Some(job) = command.strip_suffix('&') {
            return self.background(job.trim(), step.expected.len());
        }
        if let Some(n) = command
            .strip_prefix("kill %")
            .and_then(|rest| rest.strip_suffix("; wait"))
        {
            let n: usize = n.parse().map_err(|_| format!("not a job number: {n}"))?;
            return self.stop(n);
        }
        let command = match &self.server {
            Some(server) => command.replace("127.0.0.1:7420", server),
            None => command.to_owned(),
        };
        let (mut sh, output) = self.shell(&command);
        let mut child = sh.spawn().map_err(|e| format!("sh: {e}"))?;
        let status = wait_timeout(&mut child, Duration::from_secs(120));
        let text = std::fs::read_to_string(&output).unwrap_or_default();
        if !status.success() {
            return Err(format!("exited with {status}:\n{text}"));
        }
        Ok(text)
    }

    /// `command &`: starts the job and shows its first `lines` lines (a worker's
    /// `listening on` among them, whose address later commands use).
    fn background(&mut self, command: &str, lines: usize) -> Result<String, String> {
        let (mut sh, output) = self.shell(&format!("exec {command}"));
        let child = sh.spawn().map_err(|e| format!("sh: {e}"))?;
        let number = self.jobs.iter().map(|j| j.number).max().unwrap_or(0) + 1;
        self.jobs.push(Job {
            number,
            child: Some(child),
            output,
            shown: 0,
        });
        let job = self.jobs.last_mut().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = loop {
            let text = std::fs::read_to_string(&job.output).unwrap_or_default();
            if text.lines().count() >= lines && text.ends_with('\n') {
                break text;
            }
            if let Some(status) = job.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("the job exited with {status}:\n{text}"));
            }
            if Instant::now() > deadline {
                return Err(format!("the job printed no {lines} lines in 30 s:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let shown: String = text.lines().take(lines).map(|l| format!("{l}\n")).collect();
        job.shown = shown.len();
        if let Some(address) = shown
            .lines()
            .find_map(|l| l.strip_prefix("listening on http://"))
        {
            self.server = Some(address.to_owned());
        }
        Ok(shown)
    }

    /// `kill %n; wait`: SIGTERM to job `n`, its exit awaited; what it printed since.
    fn stop(&mut self, n: usize) -> Result<String, String> {
        let at = self
            .jobs
            .iter()
            .position(|j| j.number == n)
            .ok_or_else(|| format!("there is no job {n}"))?;
        let mut job = self.jobs.remove(at);
        let mut child = job.child.take().unwrap();
        signal("TERM", child.id());
        let status: ExitStatus = wait_timeout(&mut child, Duration::from_secs(30));
        let text = std::fs::read_to_string(&job.output).unwrap_or_default();
        let since = text.get(job.shown..).unwrap_or_default().to_owned();
        if !status.success() {
            return Err(format!("job {n} exited with {status}:\n{since}"));
        }
        Ok(since)
    }
}

/// Runs every console block of the document at `name` (from the workspace's root) in one
/// session, and checks the packages its install lines name; returns its steps.
fn run_document(name: &str) -> Vec<Step> {
    let text = std::fs::read_to_string(root().join(name)).unwrap();
    check_install_lines(name, &text);
    let steps = steps(name, &text);
    let mut session = Session::new();
    for step in &steps {
        let actual = session
            .run(step)
            .unwrap_or_else(|why| panic!("{}: `{}` failed: {why}", step.at, step.command));
        if let Err(why) = compare(&step.expected, &actual) {
            panic!(
                "{}: `{}` printed what the document does not show ({why}).\n\
                 --- the document shows:\n{}\n--- the command printed:\n{}",
                step.at,
                step.command,
                step.expected.join("\n"),
                actual.trim_end()
            );
        }
    }
    let running: Vec<usize> = session.jobs.iter().map(|j| j.number).collect();
    assert!(
        running.is_empty(),
        "{name} leaves jobs running ({running:?}): a tour ends with its workers stopped"
    );
    steps
}

/// Every `cargo install` of the document builds with `Cargo.lock` (`--locked`) and names
/// with `--path DIR` a package with a binary.
fn check_install_lines(name: &str, text: &str) {
    static INSTALL: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"cargo install[^\n#]*").unwrap());
    static PATH: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"--path (\S+)").unwrap());
    for line in INSTALL.find_iter(text).map(|m| m.as_str()) {
        // Prose that names the command is not an install line.
        if !line.contains("--path") {
            continue;
        }
        assert!(
            line.split_whitespace().any(|w| w == "--locked"),
            "{name}: `{line}` builds without --locked, with dependencies CI never tested"
        );
        let dir = PATH
            .captures(line)
            .map(|c| c[1].trim_end_matches('`').to_owned());
        let dir = dir.unwrap_or_default();
        assert!(
            root().join(&dir).join("Cargo.toml").is_file()
                && root().join(&dir).join("src/main.rs").is_file(),
            "{name}: `{line}` names no package with a binary"
        );
    }
}

/// The install check refuses a line without `--locked` and a path with no package.
#[test]
fn install_lines_must_be_locked_and_name_a_package() {
    check_install_lines(
        "ok",
        "cargo install --locked --path inbox-worker  # the worker\n",
    );
    let refused =
        |text: &'static str| std::panic::catch_unwind(|| check_install_lines("doc", text)).is_err();
    assert!(refused("cargo install --path inbox-worker\n"));
    assert!(refused("cargo install --locked --path no-such-dir\n"));
}

/// What may differ between runs, made equal on both sides.
fn normalize(line: &str) -> String {
    static TIME: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)").unwrap()
    });
    static PORT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"127\.0\.0\.1:\d+").unwrap());
    static MS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\(\d+ ms\)").unwrap());
    let line = TIME.replace_all(line.trim_end(), "<time>");
    let line = PORT.replace_all(&line, "127.0.0.1:<port>");
    MS.replace_all(&line, "(<n> ms)").into_owned()
}

/// Whether `actual` is what `expected` shows: line by line after [`normalize`], with
/// `...` lines and `[..]` within lines.
fn compare(expected: &[String], actual: &str) -> Result<(), String> {
    let mut expected: Vec<String> = expected.iter().map(|l| normalize(l)).collect();
    while expected.last().is_some_and(String::is_empty) {
        expected.pop();
    }
    let mut actual: Vec<String> = actual.lines().map(normalize).collect();
    while actual.last().is_some_and(String::is_empty) {
        actual.pop();
    }
    if lines_match(&expected, &actual) {
        Ok(())
    } else {
        Err(first_difference(&expected, &actual))
    }
}

fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| line_matches(first, a) && lines_match(rest, more)),
    }
}

/// One line, `[..]` standing for any text.
fn line_matches(expected: &str, actual: &str) -> bool {
    let mut parts = expected.split("[..]");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Where the two first part, for the message.
fn first_difference(expected: &[String], actual: &[String]) -> String {
    for (i, e) in expected.iter().enumerate() {
        if e == "..." {
            return "after a `...`".to_owned();
        }
        match actual.get(i) {
            Some(a) if line_matches(e, a) => {}
            Some(a) => return format!("line {}: shown {e:?}, printed {a:?}", i + 1),
            None => return format!("line {}: shown {e:?}, printed nothing more", i + 1),
        }
    }
    format!(
        "printed more than shown, from line {}: {:?}",
        expected.len() + 1,
        actual.get(expected.len()).map_or("", String::as_str)
    )
}
