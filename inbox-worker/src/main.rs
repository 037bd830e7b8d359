//! The `inbox-worker` binary: parses the command line, runs the library, and chooses the
//! exit code. Everything else lives in the library.

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use inbox_worker::access::Token;
use inbox_worker::api::ApiOptions;
use inbox_worker::client::{self, SubmitOptions};
use inbox_worker::server::{self, ServeConfig};
use inbox_worker::wire::parse_duration;
use inbox_worker::{demo, inbox, text};
use ledger::{Account, Amount, ClientId, Command, Currency, Key, LedgerError, SledStore};

/// mimalloc instead of glibc's malloc: the committer thread allocates what the HTTP
/// threads free, and glibc spends a large share of the worker's CPU on that traffic
/// between its per-thread arenas (BENCHMARKS.md, "allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "inbox-worker",
    version,
    about = "Idem: an exactly-once money ledger. Start with `inbox-worker demo`.",
    long_about = "Idem records deposits, withdrawals and refunds exactly once per \
        idempotency key, however often a command is retried or redelivered.\n\n\
        Start with `inbox-worker demo` (needs nothing else), then `serve` a ledger and \
        `submit` commands to it."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the worker: the HTTP API, the operator feed and the key sweeper.
    #[command(
        long_about = "Run the worker on a ledger folder: the HTTP API (POST /v1/deposits, \
        /v1/withdrawals, /v1/refunds with an Idempotency-Key header), the operator feed, \
        /metrics and /healthz, and a sweeper that expires stored responses past the \
        retention.\n\nSIGTERM or Ctrl-C stops taking requests, finishes what is in \
        flight, flushes, and exits 0.\n\nExample:\n  inbox-worker serve --db ./idem-data"
    )]
    Serve(ServeArgs),
    /// Send one command to a running worker, retrying safely with the same key.
    #[command(
        long_about = "Send one command to a running worker. The key is yours: reuse it \
        for every retry of the same intent (the natural business id, e.g. ord-8831). \
        Transport failures, 5xx and 409 are retried with back-off and the same key.\n\n\
        Exit codes: 0 applied or replayed, 3 business rejection, 4 still in flight after \
        the retries, 5 key reused with another command, 2 invalid input, 1 anything \
        else.\n\nExample:\n  inbox-worker submit withdraw --key ord-8831 --account alice \
        --amount 300 --currency RUB"
    )]
    Submit {
        #[command(subcommand)]
        command: SubmitCmd,
    },
    /// Show an account's balance, read from a running worker.
    #[command(long_about = "Show an account's balance, read from a running worker \
        (GET /v1/accounts/{id}), in major units; --json prints the worker's body (minor \
        units).\n\nExit codes: 0 shown, 3 no such account, 2 invalid input, 1 anything \
        else.\n\nExample:\n  inbox-worker balance alice")]
    Balance {
        /// The account (a system account, such as @world, too).
        account: String,
        /// The balance after every fact with this seq or a lower one (a user account).
        #[arg(long, value_name = "SEQ", conflicts_with = "as_of")]
        as_of_seq: Option<u64>,
        /// The balance after every fact recorded at or before this time (RFC 3339, such
        /// as 2026-12-07T10:00:00Z; a user account).
        #[arg(long, value_name = "TIME")]
        as_of: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// List an account's movements with the balance after each, a page at a time.
    #[command(
        long_about = "List a user account's movements (deposits, withdrawals and \
        refunds to it) in the order of the log, each with its change and the balance after \
        it, read from a running worker (GET /v1/accounts/{id}/facts). One page at a time; \
        the last line says how to get the next, or --all reads them all.\n\nExit codes: \
        0 shown, 3 no such account, 2 invalid input, 1 anything else.\n\nExample:\n  \
        inbox-worker statement alice"
    )]
    Statement {
        /// The account (a user account: a system account takes the other leg of every
        /// movement, which GET /v1/facts lists).
        account: String,
        #[command(flatten)]
        page: Page,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show what a key holds: its command, its outcome, how long its answer is kept.
    #[command(
        long_about = "Show what one of your keys holds, read from a running worker \
        (GET /v1/keys/{key}): its status, its command, its outcome (applied, or the \
        rejection and the figure it was decided on) and until when its answer is \
        kept.\n\nExit codes: 0 shown, 3 no such key for this client, 2 invalid input, 1 \
        anything else.\n\nExample:\n  inbox-worker key req-7f3a"
    )]
    Key {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// List the accounts and their balances, a page at a time.
    #[command(
        long_about = "List the accounts with their balances in name order, system \
        accounts included, and the sums per currency, read from a running worker \
        (GET /v1/accounts). One page at a time; the last line says how to get the next, or \
        --all reads them all.\n\nExit codes: 0 shown, 2 invalid input, 1 anything \
        else.\n\nExample:\n  inbox-worker accounts --all"
    )]
    Accounts {
        /// Start after this account name (the `next` a page ended with).
        #[arg(long, value_name = "NAME")]
        after: Option<String>,
        /// Accounts per page, 1 to 1000 (default: the worker's, 100).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: Option<u64>,
        /// Read every page, following `next` to the end.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// Feed a JSON-lines file of messages through the inbox of a ledger folder.
    #[command(long_about = CONSUME_HELP)]
    Consume(ConsumeArgs),
    /// Rebuild the balances and key records from the log and check every guarantee; exit 1
    /// on any violation.
    Verify {
        /// The ledger folder (stop the worker first: the folder is locked while it runs).
        #[arg(long, required_unless_present = "store", conflicts_with = "store")]
        db: Option<PathBuf>,
        /// A PostgreSQL store instead (workers may keep serving it meanwhile).
        #[arg(
            long,
            value_name = "postgres://…",
            env = "IDEM_STORE",
            hide_env_values = true
        )]
        store: Option<String>,
    },
    /// Rebuild the ledger's index (sled's files) from its journal, the log of record; the
    /// old files are kept aside. An open does this by itself when it finds them damaged.
    #[command(
        long_about = "Rebuild the ledger's index (sled's files: the facts by seq, the key \
        records, balances, statements) from its journal, the log of record that every \
        acknowledged command reaches before it is answered. The old files are moved into a \
        damaged-<time> folder inside the ledger's, never deleted. Opening a ledger does this \
        by itself when sled refuses its files, panics on them, or disagrees with the \
        journal; this command does it on demand. Stop the worker first.\n\n\
        Exit codes: 0 rebuilt and opened, 1 refused (the journal damaged in its middle, \
        no base, the ledger in use).\n\nExample:\n  inbox-worker repair --db ./idem-data"
    )]
    Repair {
        /// The ledger folder.
        #[arg(long)]
        db: PathBuf,
    },
    /// Tell the whole story in one command: one withdrawal and its retries, a storm of
    /// duplicate deliveries, and a verify. Needs nothing installed or running.
    #[command(
        long_about = "Tell the whole story in one command: a worker inside this \
        process on a loopback port, one withdrawal and its retries over HTTP, a storm of \
        duplicate deliveries, the balances it must leave, and a verify. Needs nothing \
        installed or running; exit 0 only if every check holds.\n\n\
        With --db the ledger is kept in that folder. Run again on the same folder, every \
        command of the story is a retry of a done key: each is answered from the log and \
        nothing moves again, which the checks then expect."
    )]
    Demo {
        /// Keep the demo's ledger in this folder (created if missing) instead of a
        /// temporary one. A folder holding other commands than the demo's is refused.
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Run a scenario script on a fresh ledger and print its transcript.
    #[command(
        long_about = "Run a scenario script (docs/library.md: one step per line, such as         `shop/ord-1 deposit alice 1000 RUB`, `clock +25h`, `balances`) on a fresh ledger in         a temporary folder with a hand-moved clock, and print the transcript: every answer,         balance, statement and key state, the same on every run. Snapshot it in any         language to test your own flows.\n\nExit codes: 0 the transcript, 2 a line that is         not a step (its number is said), 1 the ledger failed or a guarantee broke.\n\n\
        Example:\n  inbox-worker replay --script flows/refund.txt"
    )]
    Replay {
        /// The script, or - for standard input.
        #[arg(long, value_name = "FILE|-")]
        script: String,
    },
}

const CONSUME_HELP: &str = "Feed JSON-lines messages through the inbox, as a broker \
    consumer would. One message per line:\n\n  \
    {\"message_id\":\"m-1\",\"key\":\"ord-1\",\"command\":{\"type\":\"withdraw\",\
    \"account\":\"alice\",\"amount\":300,\"currency\":\"RUB\"}}\n\n\
    `type` is deposit, withdraw (account, amount, currency) or refund (withdrawal, \
    amount); an optional \"client\" names the client (default: --client). A redelivered \
    message_id or a repeated key has no second effect. Undecodable lines, a message_id \
    seen with another payload, and a key reused for another command are quarantined with \
    the reason. Exit codes: 0 all handled, 3 all handled but some quarantined, 1 stopped \
    on an error (rerunning the same input is safe).\n\nExample:\n  \
    inbox-worker consume --db ./idem-data --from messages.jsonl";

#[derive(Args)]
struct ServeArgs {
    /// The ledger folder (embedded sled, the default); created if missing.
    #[arg(long, required_unless_present = "store", conflicts_with = "store")]
    db: Option<PathBuf>,
    /// Keep the facts in PostgreSQL instead, e.g. postgres://idem@db-host/idem. Any number
    /// of workers may serve one database; the schema is created or migrated at start.
    #[arg(
        long,
        value_name = "postgres://…",
        env = "IDEM_STORE",
        hide_env_values = true
    )]
    store: Option<String>,
    /// Connections to PostgreSQL, with --store: one for each lane, the others for reads.
    #[arg(long, default_value_t = 16)]
    pg_pool: usize,
    /// Lanes of commands, with --store (at most --pg-pool): each decides the commands
    /// queued on it in groups, one transaction and one commit per group, one group at a
    /// time, the next group's claim sent behind the previous group's COMMIT. Fewer lanes
    /// make larger groups and cost PostgreSQL less per command; more keep more of a large
    /// server busy.
    #[arg(long, default_value_t = 1, env = "IDEM_PG_LANES", hide_env_values = true,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pg_lanes: u64,
    /// The most commands one PostgreSQL transaction decides, with --store; 1 gives every
    /// command a transaction of its own.
    #[arg(long, default_value_t = 128, env = "IDEM_PG_GROUP_MAX", hide_env_values = true,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pg_group_max: u64,
    /// How long a PostgreSQL group stays open for more commands, counted from its first
    /// command's arrival (0: it takes what queued while the lane was busy, and a command
    /// that finds its lane idle never waits).
    #[arg(long, default_value = "0ms", value_parser = parse_group_wait, env = "IDEM_PG_GROUP_WAIT", hide_env_values = true)]
    pg_group_wait: Duration,
    /// Open a PostgreSQL store even when the server runs with fsync or full_page_writes
    /// off, which can lose acknowledged commands when its machine crashes: for a throwaway
    /// test server only.
    #[arg(long)]
    pg_allow_unsafe_settings: bool,
    /// Address to listen on (port 0: one the system picks; the worker prints it). Without
    /// tokens only loopback addresses are allowed.
    #[arg(
        long,
        default_value = "127.0.0.1:7420",
        env = "IDEM_LISTEN",
        hide_env_values = true
    )]
    listen: SocketAddr,
    /// A tenant's bearer secret, TENANT[:ROLE]=SECRET; repeatable. ROLE is submit (the
    /// default), read, or command kinds joined by ',' (deposit,withdraw,refund). A tenant's
    /// accounts, keys and facts are its own.
    #[arg(long = "token", value_name = "TENANT[:ROLE]=SECRET")]
    tokens: Vec<String>,
    /// A file of TENANT[:ROLE]=SECRET lines ('#' starts a comment); keeps secrets out of
    /// `ps`.
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// Listen on a non-loopback address without tokens: anyone who reaches the port may
    /// move the tenant `default`'s money. Only for a network you trust end to end.
    #[arg(long)]
    allow_no_tokens: bool,
    /// The currencies commands may name, e.g. RUB,EUR (default: any ISO 4217 code);
    /// another is refused with 400 before the ledger sees it, the key left unused.
    #[arg(long, value_delimiter = ',', value_name = "CODE,…", value_parser = parse_iso_currency)]
    currencies: Vec<ledger::Currency>,
    /// The tenant the RabbitMQ queue serves: its messages act for it, and one naming
    /// another tenant is refused (default: each message names its own, `default` if none).
    #[arg(long, value_name = "TENANT")]
    queue_client: Option<String>,
    /// The operator's bearer secret for /v1/live/* when client tokens are configured.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        value_name = "SECRET",
        hide_env_values = true
    )]
    admin_token: Option<String>,
    /// How long a done key keeps its stored response (the fact stays forever).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    retention: Duration,
    /// How long an attempt's claim on a key holds before another may take it over.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease: Duration,
    /// The ledger's page cache, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mb: u64,
    /// How long a repeat waits for an attempt of its key still in flight before answering
    /// 409.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    in_flight_wait: Duration,
    /// How often the sweeper runs (default: the smaller of 5s and half the retention).
    #[arg(long, value_parser = parse_duration)]
    sweep_every: Option<Duration>,
    /// How often verify runs for the operator snapshot (it also runs at start). It reads
    /// the log while commits go on, holding them only for a short last step.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    verify_every: Duration,
    /// Open connections at most. At the cap a new client is still served: the oldest
    /// idle connection (else one that has not sent a whole request) is closed for it.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// How long a client has to send a request's head, from connecting or from its
    /// first byte.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// How long a client has to send a request's body, from its first byte (then 408).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// How long a keep-alive connection may wait idle for its next request (and a
    /// response may wait for a client that does not read it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// On SIGTERM, how long requests already read may run to their answer before their
    /// connections are closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// Also consume inbox messages from RabbitMQ, e.g. amqp://guest:guest@127.0.0.1:5672/%2f.
    /// Each is acked only once its outcome is durable.
    #[arg(
        long,
        value_name = "amqp://…",
        env = "IDEM_AMQP",
        hide_env_values = true
    )]
    amqp: Option<String>,
    /// The queue to consume (a quorum queue, declared if missing, with its dead-letter
    /// exchange <queue>.dlx and queue <queue>.dead).
    #[arg(long, default_value = "idem.inbox")]
    queue: String,
    /// Unacked deliveries in hand at once (they are applied concurrently).
    #[arg(long, default_value_t = 64)]
    prefetch: u16,
    /// A message delivered this many times without an outcome goes to the dead letters.
    #[arg(long, default_value_t = 20)]
    max_deliveries: u32,
}

/// How `submit` and the reads reach the worker, and what they print. Shown after each
/// command's own arguments, under their own heading.
#[derive(Args)]
#[command(next_help_heading = "Connection")]
struct Connection {
    /// The worker's address, http://HOST:PORT.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7420",
        env = "IDEM_SERVER",
        hide_env_values = true
    )]
    server: String,
    /// Your bearer secret (when the worker has tokens).
    #[arg(long, env = "IDEM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Retries after the first attempt, for transport failures, 5xx and 409.
    #[arg(long, default_value_t = 5)]
    retries: u32,
    /// Print the worker's JSON body (amounts in minor units) instead of text; `submit`
    /// adds "replayed" to a stored answer.
    #[arg(long)]
    json: bool,
}

/// The page of a statement.
#[derive(Args)]
struct Page {
    /// Start after this seq (the `next_after` a page ended with).
    #[arg(long, value_name = "SEQ")]
    after: Option<u64>,
    /// Movements per page, 1 to 1000 (default: the worker's, 100).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: Option<u64>,
    /// Read every page, following `next_after` to the end.
    #[arg(long)]
    all: bool,
}

/// `submit --via`: publishing to RabbitMQ instead of calling a worker.
#[derive(Args)]
#[command(next_help_heading = "Publishing to RabbitMQ instead")]
struct Publish {
    /// Publish the command to RabbitMQ instead of calling the worker over HTTP, e.g.
    /// amqp://guest:guest@127.0.0.1:5672/%2f. Waits for the broker's confirm; the worker
    /// consuming --queue applies it (the outcome is not known here).
    #[arg(
        long,
        value_name = "amqp://…",
        env = "IDEM_VIA",
        hide_env_values = true
    )]
    via: Option<String>,
    /// The queue, with --via.
    #[arg(long, default_value = "idem.inbox")]
    queue: String,
    /// The message id, with --via (default: the key). A redelivery or a republish with
    /// the same id has no second effect.
    #[arg(long)]
    message_id: Option<String>,
    /// The client the message acts for, with --via (default: the consumer's default).
    #[arg(long)]
    client: Option<String>,
}

#[derive(Subcommand)]
enum SubmitCmd {
    /// Put money into an account (its first deposit fixes its currency).
    Deposit {
        /// The idempotency key: the same for every retry of this one intent.
        #[arg(long)]
        key: String,
        /// The account: letters, digits, '_', '-', '.', ':' (not starting with '@').
        #[arg(long)]
        account: String,
        /// In major units, as written: 12.50 or 1,000.00 (at most the currency's
        /// decimals).
        #[arg(long, allow_hyphen_values = true)]
        amount: String,
        /// ISO 4217 code, e.g. RUB.
        #[arg(long)]
        currency: String,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        publish: Publish,
    },
    /// Take money out of an account; never below zero.
    Withdraw {
        /// The idempotency key: the same for every retry of this one intent.
        #[arg(long)]
        key: String,
        /// The account to take the money from.
        #[arg(long)]
        account: String,
        /// In major units, as written: 12.50 or 1,000.00 (at most the currency's
        /// decimals).
        #[arg(long, allow_hyphen_values = true)]
        amount: String,
        /// ISO 4217 code; must be the account's currency.
        #[arg(long)]
        currency: String,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        publish: Publish,
    },
    /// Give back (part of) a withdrawal, named by its key.
    #[command(
        long_about = "Give back (part of) a withdrawal, named by its key. The \
        amount is in the withdrawal's currency: the command reads it from the worker \
        (GET /v1/keys/{withdrawal}) before sending, and refuses, sending nothing, a key \
        that holds no withdrawal of this client. All refunds of a withdrawal add up to at \
        most its amount."
    )]
    Refund {
        /// The idempotency key of this refund (not the withdrawal's).
        #[arg(long)]
        key: String,
        /// The withdrawal's idempotency key.
        #[arg(long)]
        withdrawal: String,
        /// In major units of the withdrawal's currency: 1.50.
        #[arg(long, allow_hyphen_values = true)]
        amount: String,
        /// The withdrawal's currency: checked against it over HTTP; required with --via,
        /// where no worker is asked.
        #[arg(long)]
        currency: Option<String>,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        publish: Publish,
    },
}

#[derive(Args)]
struct ConsumeArgs {
    /// The ledger folder (not while a worker serves it: the folder is locked).
    #[arg(long)]
    db: PathBuf,
    /// The JSON-lines file, or - for standard input.
    #[arg(long, value_name = "FILE|-")]
    from: String,
    /// The tenant (client) of messages that name none.
    #[arg(long, default_value = "default")]
    client: String,
    /// Refuse messages that name a tenant other than --client (a file of one tenant's).
    #[arg(long)]
    only_client: bool,
    /// The currencies commands may name, e.g. RUB,EUR (default: any ISO 4217 code).
    #[arg(long, value_delimiter = ',', value_name = "CODE,…", value_parser = parse_iso_currency)]
    currencies: Vec<ledger::Currency>,
    /// How long a done key keeps its stored response.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    retention: Duration,
}

fn main() -> ExitCode {
    // A test build arms its crash points from FAILPOINTS (see the `failpoints` feature);
    // the scenario lives as long as the process.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = Cli::parse();
    let code = match cli.command {
        Cmd::Serve(args) => serve(args).map(|()| 0),
        Cmd::Submit { command } => submit(command),
        Cmd::Balance {
            account,
            as_of_seq,
            as_of,
            connection,
        } => balance(&account, (as_of_seq, as_of.as_deref()), &connection),
        Cmd::Statement {
            account,
            page,
            connection,
        } => statement(&account, &page, &connection),
        Cmd::Key { key, connection } => show_key(&key, &connection),
        Cmd::Accounts {
            after,
            limit,
            all,
            connection,
        } => accounts(after.as_deref(), limit, all, &connection),
        Cmd::Consume(args) => consume(args),
        Cmd::Verify { db, store } => match (db, store) {
            (_, Some(url)) => verify_pg(&url),
            (Some(db), None) => verify(&db),
            (None, None) => Err(anyhow::anyhow!("say --db PATH or --store URL")),
        },
        Cmd::Repair { db } => repair(&db),
        Cmd::Demo { db } => {
            demo::run(db.as_deref(), &mut std::io::stdout()).map(|ok| u8::from(!ok))
        }
        Cmd::Replay { script } => replay(&script),
    };
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_tokens(args: &ServeArgs) -> anyhow::Result<Vec<Token>> {
    let mut lines: Vec<(String, String)> = args
        .tokens
        .iter()
        .map(|t| ("--token".to_owned(), t.clone()))
        .collect();
    if let Some(file) = &args.tokens_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading the tokens file {}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                lines.push((format!("tokens file line {}", i + 1), line.to_owned()));
            }
        }
    }
    let mut out: Vec<Token> = Vec::new();
    for (origin, line) in lines {
        let token = Token::parse(&line).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        if out.iter().any(|t| t.secret == token.secret)
            || args.admin_token.as_deref() == Some(token.secret.as_str())
        {
            anyhow::bail!("{origin}: two tokens share one secret");
        }
        out.push(token);
    }
    Ok(out)
}

/// A currency for `--currencies`: an ISO 4217 code, so that a typo in the worker's own
/// list is caught at start.
fn parse_iso_currency(s: &str) -> Result<ledger::Currency, String> {
    let code = ledger::Currency::parse(s.trim()).map_err(|e| e.to_string())?;
    if !money::is_iso_code(code.as_str()) {
        return Err("not an ISO 4217 code".into());
    }
    Ok(code)
}

/// A group wait: a duration of at most a second, since every command of a group waits it.
fn parse_group_wait(s: &str) -> Result<Duration, String> {
    let wait = parse_duration(s)?;
    if wait > Duration::from_secs(1) {
        return Err(
            "a group wait of more than 1s would hold every command that long; \
                    use a few milliseconds, or 0ms"
                .into(),
        );
    }
    Ok(wait)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let tokens = parse_tokens(&args)?;
    let inbox_rules = inbox::InboxRules {
        currencies: args.currencies.clone(),
        ..match args
            .queue_client
            .as_deref()
            .map(ClientId::parse)
            .transpose()
        {
            Ok(Some(tenant)) => inbox::InboxRules::only(tenant),
            Ok(None) => inbox::InboxRules::default(),
            Err(e) => anyhow::bail!("--queue-client: {e}"),
        }
    };
    let sweep_every = args.sweep_every.unwrap_or_else(|| {
        (args.retention / 2).clamp(Duration::from_millis(100), Duration::from_secs(5))
    });
    let config = ServeConfig {
        db: args.db.unwrap_or_default(),
        store_url: args.store.filter(|s| !s.is_empty()),
        pg_pool: args.pg_pool.max(1),
        pg_lanes: usize::try_from(args.pg_lanes).unwrap_or(1),
        pg_group_max: usize::try_from(args.pg_group_max).unwrap_or(1),
        pg_group_wait: args.pg_group_wait,
        pg_allow_unsafe_settings: args.pg_allow_unsafe_settings,
        amqp: args.amqp.filter(|u| !u.is_empty()).map(|url| {
            let mut o = inbox_worker::inbox::amqp::AmqpOptions::new(url, args.queue.clone());
            o.rules = inbox_rules.clone();
            o.prefetch = args.prefetch.max(1);
            o.max_deliveries = args.max_deliveries.max(1);
            o
        }),
        listen: args.listen,
        retention: args.retention,
        lease: args.lease,
        cache_bytes: args.cache_mb.saturating_mul(1024 * 1024),
        api: ApiOptions {
            tokens,
            admin_token: args.admin_token.filter(|t| !t.is_empty()),
            allow_no_tokens: args.allow_no_tokens,
            currencies: args.currencies,
            in_flight_wait: args.in_flight_wait,
            sweep_every,
            verify_every: args.verify_every,
            limits: inbox_worker::Limits {
                max_connections: args.max_connections.max(1),
                header_timeout: args.header_timeout,
                body_timeout: args.body_timeout,
                idle_timeout: args.idle_timeout,
                shutdown_grace: args.shutdown_grace,
            },
            consumer: None,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let signal = shutdown_signal()?;
        server::run_server(config, signal).await
    })
}

/// Installs the handlers now, before the worker announces itself, so that a SIGTERM
/// arriving right after `listening on` is a graceful stop and not the default kill;
/// the future resolves on SIGTERM or Ctrl-C.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing the Ctrl-C handler")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = interrupt.recv() => {},
            }
            eprintln!("stopping: no new requests; finishing those in flight");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("stopping: no new requests; finishing those in flight");
        })
    }
}

/// A refusal of `submit`'s input, before anything is sent: exit 2.
struct Invalid(String);

impl<E: std::fmt::Display> From<(&str, E)> for Invalid {
    fn from((flag, e): (&str, E)) -> Self {
        Invalid(format!("invalid {flag}: {e}"))
    }
}

fn submit(cmd: SubmitCmd) -> anyhow::Result<u8> {
    let (connection, publish) = match &cmd {
        SubmitCmd::Deposit {
            connection,
            publish,
            ..
        }
        | SubmitCmd::Withdraw {
            connection,
            publish,
            ..
        }
        | SubmitCmd::Refund {
            connection,
            publish,
            ..
        } => (connection, publish),
    };
    let options = SubmitOptions {
        server: connection.server.clone(),
        token: connection.token.clone(),
        retries: connection.retries,
        ..SubmitOptions::default()
    };
    if publish.via.is_none()
        && let Err(why) = client::check_server(&options.server)
    {
        eprintln!("invalid --server: {why}; nothing was sent");
        return Ok(2);
    }
    // Parse, then validate: refuse locally what the server would refuse, with exit 2.
    let built = match build(&cmd, &options, publish.via.is_some()) {
        Ok(b) => b,
        Err(Refused::Invalid(Invalid(why))) => {
            eprintln!("{why}; nothing was sent");
            return Ok(2);
        }
        Err(Refused::Failed(failed)) => {
            eprintln!("{}", client::render(&failed, None));
            return Ok(failed.verdict.exit_code());
        }
    };
    if let Some(url) = &publish.via {
        return send_to_broker(url, publish, &built);
    }
    let submitted = client::submit(&options, &built.key, &built.command, &mut |line| {
        eprintln!("{line}");
    });
    match (&submitted.answer, connection.json) {
        (Some(answer), true) => println!("{}", client::json_output(answer)),
        _ => {
            let text = client::render(&submitted, Some(built.currency.as_str()));
            if submitted.verdict.exit_code() == 0 {
                println!("{text}");
            } else {
                eprintln!("{text}");
            }
        }
    }
    Ok(submitted.verdict.exit_code())
}

/// A command ready to send, with the currency its amount was read in.
struct Built {
    key: Key,
    command: Command,
    currency: Currency,
}

enum Refused {
    Invalid(Invalid),
    /// The worker could not be asked for a refund's withdrawal.
    Failed(client::Submitted),
}

impl From<Invalid> for Refused {
    fn from(i: Invalid) -> Self {
        Refused::Invalid(i)
    }
}

/// Builds the command from the arguments. Amounts are typed in major units and become
/// minor units here, exactly; a refund's currency is its withdrawal's, which the worker
/// is asked for (over HTTP) or the user states (`--via`, where no worker is asked).
fn build(cmd: &SubmitCmd, options: &SubmitOptions, via: bool) -> Result<Built, Refused> {
    match cmd {
        SubmitCmd::Deposit {
            key,
            account,
            amount,
            currency,
            ..
        }
        | SubmitCmd::Withdraw {
            key,
            account,
            amount,
            currency,
            ..
        } => {
            let key = Key::parse(key).map_err(|e| Invalid::from(("--key", e)))?;
            let account = Account::parse(account).map_err(|e| Invalid::from(("--account", e)))?;
            let currency = iso_currency(currency)?;
            let amount = major_units(amount, currency, cmd)?;
            let command = if matches!(cmd, SubmitCmd::Deposit { .. }) {
                Command::Deposit {
                    account,
                    amount,
                    currency,
                }
            } else {
                Command::Withdraw {
                    account,
                    amount,
                    currency,
                }
            };
            Ok(Built {
                key,
                command,
                currency,
            })
        }
        SubmitCmd::Refund {
            key,
            withdrawal,
            amount,
            currency,
            ..
        } => {
            let key = Key::parse(key).map_err(|e| Invalid::from(("--key", e)))?;
            let withdrawal =
                Key::parse(withdrawal).map_err(|e| Invalid::from(("--withdrawal", e)))?;
            let stated = currency.as_deref().map(iso_currency).transpose()?;
            let currency = if via {
                stated.ok_or_else(|| {
                    Invalid(
                        "--currency is needed with --via: the amount is read in the \
                         withdrawal's currency, and no worker is asked for it"
                            .to_owned(),
                    )
                })?
            } else {
                withdrawal_currency(options, &withdrawal, stated)?
            };
            let amount = major_units(amount, currency, cmd)?;
            Ok(Built {
                key,
                command: Command::Refund { withdrawal, amount },
                currency,
            })
        }
    }
}

/// The currency of the withdrawal a refund names, as the worker knows it.
fn withdrawal_currency(
    options: &SubmitOptions,
    withdrawal: &Key,
    stated: Option<Currency>,
) -> Result<Currency, Refused> {
    let w = withdrawal.as_str();
    match client::withdrawal(options, withdrawal, &mut |line| eprintln!("{line}")) {
        client::Withdrawal::In(currency) => match stated {
            Some(s) if s != currency => Err(Invalid(format!(
                "invalid --currency: the withdrawal {w} is in {currency}, not {s}"
            ))
            .into()),
            _ => Ok(currency),
        },
        client::Withdrawal::NotAWithdrawal(command) => Err(Invalid(format!(
            "invalid --withdrawal: the key {w} holds a {command}, not a withdrawal"
        ))
        .into()),
        client::Withdrawal::Unknown => Err(Invalid(format!(
            "invalid --withdrawal: this client has no key {w} at {}; a refund names the key \
             of one of its own withdrawals",
            options.server
        ))
        .into()),
        client::Withdrawal::Failed(failed) => Err(Refused::Failed(failed)),
    }
}

/// `--currency` as a code of the ISO 4217 table: a well-formed code that is not one (`USS`
/// for `USD`) would be applied, and fix a new account to it for ever.
fn iso_currency(text: &str) -> Result<Currency, Invalid> {
    let currency = Currency::parse(text).map_err(|e| Invalid::from(("--currency", e)))?;
    if !money::is_iso_code(currency.as_str()) {
        return Err(Invalid(format!(
            "invalid --currency: {} is not an ISO 4217 currency code (such as USD, EUR, RUB, \
             JPY)",
            currency.as_str()
        )));
    }
    Ok(currency)
}

/// `--amount` in major units of `currency` as an exact amount of minor units. A sign is
/// refused with what the command's kind already says about the direction.
fn major_units(text: &str, currency: Currency, cmd: &SubmitCmd) -> Result<Amount, Invalid> {
    let code = currency.as_str();
    let minor = money::parse(text, code).map_err(|e| match e {
        money::ParseError::Negative => {
            let direction = match cmd {
                SubmitCmd::Deposit { .. } => "a deposit puts money in",
                SubmitCmd::Withdraw { .. } => "a withdrawal takes money out",
                SubmitCmd::Refund { .. } => "a refund gives money back",
            };
            Invalid(format!(
                "invalid --amount: the amount must be more than zero: {direction}, give the \
                 amount without a sign"
            ))
        }
        e => Invalid::from(("--amount", e)),
    })?;
    Amount::new(minor).map_err(|_| {
        Invalid(format!(
            "invalid --amount: at most {}",
            money::format(i128::from(ledger::domain::AMOUNT_MAX), code)
        ))
    })
}

/// The options of a read: where the worker is and the secret, checked before anything is
/// sent; `Err` is the exit code of a refusal already printed.
fn read_options(connection: &Connection) -> Result<SubmitOptions, u8> {
    if let Err(why) = client::check_server(&connection.server) {
        eprintln!("invalid --server: {why}; nothing was sent");
        return Err(2);
    }
    Ok(SubmitOptions {
        server: connection.server.clone(),
        token: connection.token.clone(),
        retries: connection.retries,
        ..SubmitOptions::default()
    })
}

/// One `GET`; the body on a 200, else the failure printed and its exit code. `missing`
/// says what a 404 of an unknown account or key means here.
fn fetch(
    options: &SubmitOptions,
    path: &str,
    json: bool,
    missing: &str,
) -> Result<serde_json::Value, u8> {
    let fetched = client::read(options, path, &mut |line| eprintln!("{line}"));
    if let Some(found) = fetched.found() {
        return Ok(found);
    }
    match (&fetched.answer, json) {
        (Some(answer), true) => println!("{}", answer.body),
        _ if fetched.exit_code() == 3 => eprintln!("not found: {missing}"),
        _ => eprintln!("{}", fetched.failure()),
    }
    Err(fetched.exit_code())
}

/// What a 404 `account_not_found` means for `account`.
fn missing_account(account: &Account, options: &SubmitOptions) -> String {
    format!(
        "there is no account {} at {} (an account exists from its first deposit)",
        account.as_str(),
        options.server
    )
}

/// The connection and the account of a read of one account; the exit code (2, nothing
/// sent) when either is invalid.
fn account_read(account: &str, connection: &Connection) -> Result<(SubmitOptions, Account), u8> {
    let options = read_options(connection)?;
    match Account::parse_any(account) {
        Ok(a) => Ok((options, a)),
        Err(e) => {
            eprintln!("invalid ACCOUNT: {e}; nothing was sent");
            Err(2)
        }
    }
}

/// `balance ACCOUNT`: exit 0 shown, 3 no such account, 2 invalid, 1 anything else.
fn balance(
    account: &str,
    (as_of_seq, as_of): (Option<u64>, Option<&str>),
    connection: &Connection,
) -> anyhow::Result<u8> {
    let (options, account) = match account_read(account, connection) {
        Ok(read) => read,
        Err(code) => return Ok(code),
    };
    let mut path = format!("/v1/accounts/{}", client::escape(account.as_str()));
    if let Some(seq) = as_of_seq {
        path.push_str(&format!("?as_of_seq={seq}"));
    }
    if let Some(at) = as_of {
        // Checked here so that a typo is a local error, never a request.
        if chrono::DateTime::parse_from_rfc3339(at).is_err() {
            eprintln!(
                "invalid --as-of: an RFC 3339 time, such as 2026-12-07T10:00:00Z; nothing was sent"
            );
            return Ok(2);
        }
        path.push_str(&format!("?as_of={}", client::escape(at)));
    }
    let missing = missing_account(&account, &options);
    Ok(match fetch(&options, &path, connection.json, &missing) {
        Ok(body) if connection.json => {
            println!("{body}");
            0
        }
        Ok(body) => {
            println!("{}", text::balance(&body));
            0
        }
        Err(code) => code,
    })
}

/// `statement ACCOUNT`: one page, or every page with `--all`. With `--json` each page is
/// the worker's body on a line of its own.
fn statement(account: &str, page: &Page, connection: &Connection) -> anyhow::Result<u8> {
    let (options, account) = match account_read(account, connection) {
        Ok(read) => read,
        Err(code) => return Ok(code),
    };
    let name = account.as_str();
    let missing = missing_account(&account, &options);
    let mut after = page.after;
    loop {
        let mut path = format!("/v1/accounts/{}/facts", client::escape(name));
        let query: Vec<String> = [
            after.map(|a| format!("after={a}")),
            page.limit.map(|l| format!("limit={l}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        let body = match fetch(&options, &path, connection.json, &missing) {
            Ok(b) => b,
            Err(code) => return Ok(code),
        };
        let next = body["next_after"].as_u64();
        if connection.json {
            println!("{body}");
        } else {
            println!("{}", text::statement(&body));
        }
        match next {
            Some(n) if page.all => after = Some(n),
            Some(n) if !connection.json => {
                let limit = page
                    .limit
                    .map(|l| format!(" --limit {l}"))
                    .unwrap_or_default();
                println!("next page: inbox-worker statement {name} --after {n}{limit} (or --all)");
                return Ok(0);
            }
            _ => return Ok(0),
        }
    }
}

/// `key KEY`: exit 0 shown, 3 no such key of this client, 2 invalid, 1 anything else. A
/// refund's amount is shown in its withdrawal's currency, asked from the worker when the
/// key's outcome does not carry it.
fn show_key(key: &str, connection: &Connection) -> anyhow::Result<u8> {
    let options = match read_options(connection) {
        Ok(o) => o,
        Err(code) => return Ok(code),
    };
    let key = match Key::parse(key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("invalid KEY: {e}; nothing was sent");
            return Ok(2);
        }
    };
    let path = format!("/v1/keys/{}", client::escape(key.as_str()));
    let missing = format!(
        "this client has no key {} at {} (a key is its client's own; one never sent, or \
         refused before the ledger saw it, holds nothing)",
        key.as_str(),
        options.server
    );
    let body = match fetch(&options, &path, connection.json, &missing) {
        Ok(b) => b,
        Err(code) => return Ok(code),
    };
    if connection.json {
        println!("{body}");
        return Ok(0);
    }
    let currency = match (
        body["withdrawal"].as_str(),
        body["outcome"]["currency"].as_str(),
    ) {
        (Some(w), None) => Key::parse(w).ok().and_then(|w| {
            match client::withdrawal(&options, &w, &mut |line| eprintln!("{line}")) {
                client::Withdrawal::In(c) => Some(c),
                _ => None,
            }
        }),
        _ => None,
    };
    println!(
        "{}",
        text::key(&body, currency.as_ref().map(Currency::as_str))
    );
    Ok(0)
}

/// `accounts`: one page, or every page with `--all` (following `next`). With `--json`
/// each page is the worker's body on a line of its own. Parameters the user did not give
/// are not sent: the worker's defaults apply.
fn accounts(
    after: Option<&str>,
    limit: Option<u64>,
    all: bool,
    connection: &Connection,
) -> anyhow::Result<u8> {
    let options = match read_options(connection) {
        Ok(o) => o,
        Err(code) => return Ok(code),
    };
    if let Some(a) = after
        && let Err(e) = Account::parse_any(a)
    {
        eprintln!("invalid --after: {e}; nothing was sent");
        return Ok(2);
    }
    let mut after = after.map(str::to_owned);
    let mut widths = (0, 0);
    let mut printed = 0usize;
    loop {
        let query: Vec<String> = [
            after
                .as_deref()
                .map(|a| format!("after={}", client::escape(a))),
            limit.map(|l| format!("limit={l}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let path = if query.is_empty() {
            "/v1/accounts".to_owned()
        } else {
            format!("/v1/accounts?{}", query.join("&"))
        };
        // The listing has no 404: every other answer is a failure.
        let body = match fetch(&options, &path, connection.json, "") {
            Ok(b) => b,
            Err(code) => return Ok(code),
        };
        let next = body["next"].as_str().map(str::to_owned);
        if connection.json {
            println!("{body}");
        } else {
            let rows = text::accounts_page(&body, &mut widths);
            if !rows.is_empty() {
                println!("{rows}");
                printed += 1;
            }
        }
        match next {
            Some(n) if all => after = Some(n),
            Some(n) if !connection.json => {
                let limit = limit.map(|l| format!(" --limit {l}")).unwrap_or_default();
                println!("next page: inbox-worker accounts --after {n}{limit} (or --all)");
                return Ok(0);
            }
            _ => {
                if !connection.json {
                    if printed == 0 {
                        println!("no accounts");
                    }
                    println!("sums: {}", text::sums(&body));
                }
                return Ok(0);
            }
        }
    }
}

/// `submit --via amqp://…`: one message, published with a publisher confirm. Exit 0 once
/// the broker has it durably, 1 if it could not be published, 2 for invalid input.
fn send_to_broker(url: &str, publish: &Publish, built: &Built) -> anyhow::Result<u8> {
    let key = &built.key;
    let id = publish.message_id.as_deref().unwrap_or(key.as_str());
    let message_id = match ledger::MessageId::parse(id) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("invalid --message-id: {e}; nothing was sent");
            return Ok(2);
        }
    };
    let client = match publish.client.as_deref().map(ClientId::parse).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("invalid --client: {e}; nothing was sent");
            return Ok(2);
        }
    };
    let body =
        inbox_worker::inbox::amqp::message_body(&message_id, client.as_ref(), key, &built.command);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match runtime.block_on(inbox_worker::inbox::amqp::publish(
        url,
        &publish.queue,
        [body],
    )) {
        Ok(_) => {
            // The confirm only says the broker holds the message: the worker may still
            // apply it, reject it or refuse it (a reused key or message id), so the line
            // says where the outcome is read.
            println!(
                "published: {} {} (key {}, message {}) to queue {}; the broker has it, \
                 which is not an outcome: the consuming worker decides it. Read the outcome \
                 with GET /v1/keys/{}; a refused message is in GET /v1/live/quarantine",
                built.command.name(),
                money::format(
                    i128::from(built.command.amount().units()),
                    built.currency.as_str()
                ),
                key.as_str(),
                message_id.as_str(),
                publish.queue,
                key.as_str()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!(
                "error: publishing to {}: {e:#}",
                inbox_worker::inbox::amqp::redact(url)
            );
            Ok(1)
        }
    }
}

fn consume(args: ConsumeArgs) -> anyhow::Result<u8> {
    let rules = match ClientId::parse(&args.client) {
        Ok(default) => inbox::InboxRules {
            default,
            only: args.only_client,
            currencies: args.currencies.clone(),
        },
        Err(e) => {
            eprintln!("invalid --client: {e}");
            return Ok(2);
        }
    };
    let (mut input, length): (Box<dyn std::io::BufRead>, Option<u64>) = if args.from == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let file =
            std::fs::File::open(&args.from).with_context(|| format!("opening {}", args.from))?;
        let length = file.metadata().ok().map(|m| m.len());
        (Box::new(std::io::BufReader::new(file)), length)
    };
    let ledger = open(&args.db, |c| c.retention(args.retention))?;
    let progress = if std::io::stderr().is_terminal() {
        let bar = match length {
            Some(n) => indicatif::ProgressBar::new(n).with_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            ),
            None => indicatif::ProgressBar::new_spinner(),
        };
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(inbox::jsonl::consume(
        &ledger, &mut input, &rules, &progress,
    ));
    progress.finish_and_clear();
    ledger.blocking().shutdown();
    match result {
        Ok(summary) => {
            print!("{summary}");
            Ok(if summary.quarantined.is_empty() { 0 } else { 3 })
        }
        Err(stopped) => {
            print!("{}", stopped.summary);
            eprintln!("error: {stopped}");
            Ok(1)
        }
    }
}

fn open(
    db: &Path,
    adjust: impl FnOnce(ledger::SledConfig) -> ledger::SledConfig,
) -> anyhow::Result<SledStore> {
    let mut config = adjust(ledger::SledConfig::new(db));
    config.progress = ledger::Progress::new(|line| eprintln!("{line}"));
    match SledStore::open(config) {
        Ok((ledger, report)) => {
            eprintln!("ledger {}: {report}", db.display());
            Ok(ledger)
        }
        Err(LedgerError::Locked { .. }) => anyhow::bail!(
            "the ledger at {} is in use by another process (a running `serve`?). \
             Stop it first, or send commands to it over HTTP",
            db.display()
        ),
        Err(e) => Err(e.into()),
    }
}

fn verify_pg(url: &str) -> anyhow::Result<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut config = ServeConfig::new("");
        config.store_url = Some(url.to_owned());
        let store = server::open_store(&config).await?;
        let report = store.verify().await;
        store.shutdown().await;
        let report = report?;
        println!("{}", text::verify_summary(&report));
        let _ = std::io::stdout().flush();
        Ok(if report.ok() { 0 } else { 1 })
    })
}

fn repair(db: &Path) -> anyhow::Result<u8> {
    let mut config = ledger::SledConfig::new(db);
    config.progress = ledger::Progress::new(|line| eprintln!("{line}"));
    match SledStore::repair(&config) {
        Ok(rebuilt) => println!("{rebuilt}"),
        Err(LedgerError::Locked { .. }) => anyhow::bail!(
            "the ledger at {} is in use by another process (a running `serve`?). Stop it \
             first",
            db.display()
        ),
        Err(e) => return Err(e.into()),
    }
    let ledger = open(db, |c| c)?;
    ledger.blocking().shutdown();
    Ok(0)
}

fn verify(db: &Path) -> anyhow::Result<u8> {
    if !db.exists() {
        anyhow::bail!("there is no ledger at {}", db.display());
    }
    // Nothing else runs on the ledger here: both cores may read it.
    let ledger = open(db, |c| ledger::SledConfig {
        verify_yields: false,
        ..c
    })?;
    let report = ledger.blocking().verify();
    ledger.blocking().shutdown();
    let report = report?;
    println!("{}", text::verify_summary(&report));
    let _ = std::io::stdout().flush();
    Ok(if report.ok() { 0 } else { 1 })
}

/// `replay`: a scenario script's transcript on stdout (docs/library.md).
fn replay(path: &str) -> anyhow::Result<u8> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the script from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?
    };
    let scenario = match ledger::scenario::Scenario::parse(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}; nothing ran");
            return Ok(2);
        }
    };
    let transcript = scenario.run().context("the scenario stopped")?;
    print!("{transcript}");
    Ok(0)
}
