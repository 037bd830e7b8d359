//! Everything around the store: HTTP clients that own intents and retry them with their
//! own keys, a network that delays, reorders, duplicates and loses packets, an
//! at-least-once broker with its consumer, a clock that jumps both ways, and the scheduler
//! that lets one seeded RNG choose what happens next.

use std::collections::{BTreeMap, BTreeSet};

use ledger::{Account, Amount, ClientId, Command, Currency, Fingerprint, Key, MessageId, Outcome};
use ledger::{Submission, Timestamp};

use super::model::{IntentSpec, Model};
use super::rng::Rng;
use super::store::{Answer, Ck, Point, SimStore, StoreConfig, StoreError, Ticket};
use super::{Options, Report, Violation};
use ledger::store::sled::journal::{JournalOptions, Preallocate, SyncMode};

const LEASE_MS: i64 = 10_000;
const RETENTION_MS: i64 = 60_000;
/// 2026-01-01T00:00:00Z: any start works; a fixed one keeps traces readable.
const START_MS: i64 = 1_767_225_600_000;
/// Rounds of the final phase before an unresolved intent counts as a violation.
const SETTLE_ROUNDS: usize = 60;

/// Shared accounts with the currency their first deposit usually fixes.
const ACCOUNTS: [(&str, &str); 4] = [
    ("acc-a", "RUB"),
    ("acc-b", "USD"),
    ("acc-c", "RUB"),
    ("acc-d", "EUR"),
];
const CURRENCIES: [&str; 3] = ["RUB", "USD", "EUR"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Http,
    Broker,
    Both,
}

impl Channel {
    fn http(self) -> bool {
        matches!(self, Channel::Http | Channel::Both)
    }
    fn broker(self) -> bool {
        matches!(self, Channel::Broker | Channel::Both)
    }
}

/// Which command a request carries: the intent's own, or the deliberate bug of another
/// command under the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Own,
    Other,
}

struct Intent {
    ck: Ck,
    command: Command,
    fingerprint: Fingerprint,
    other: Option<(Command, Fingerprint)>,
    channel: Channel,
    started: bool,
    /// The HTTP client has heard the outcome and stops retrying.
    http_done: bool,
}

impl Intent {
    fn body(&self, body: Body) -> (&Command, Fingerprint) {
        match (body, &self.other) {
            (Body::Other, Some((c, f))) => (c, *f),
            _ => (&self.command, self.fingerprint),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The intent's own command under a fresh message id.
    Legit,
    /// Another command under the intent's key: must be refused.
    Other,
    /// A message id delivered before, now with another intent's key and command: must be
    /// quarantined.
    Rogue,
}

struct Message {
    id: MessageId,
    intent: usize,
    kind: Kind,
    acked: bool,
}

#[derive(Debug, Clone)]
enum Packet {
    /// Client to worker.
    Request { intent: usize, body: Body },
    /// Worker to client.
    Response {
        intent: usize,
        body: Body,
        answer: Answer,
    },
    /// Consumer to broker.
    Ack { message: usize },
}

/// Who waits for a queued command's answer.
#[derive(Debug, Clone, Copy)]
enum Origin {
    Http { intent: usize, body: Body },
    Broker { message: usize },
}

#[derive(Debug, Clone, Copy)]
enum Act {
    Start,
    Retry,
    Deliver,
    Duplicate,
    Drop,
    Redeliver,
    Decide,
    Sync,
    Checkpoint,
    Crash,
    Restart,
    Clock,
    Sweep,
    OtherBody,
    Rogue,
    Lead,
}

const ACTS: [Act; 16] = [
    Act::Start,
    Act::Retry,
    Act::Deliver,
    Act::Duplicate,
    Act::Drop,
    Act::Redeliver,
    Act::Decide,
    Act::Sync,
    Act::Checkpoint,
    Act::Crash,
    Act::Restart,
    Act::Clock,
    Act::Sweep,
    Act::OtherBody,
    Act::Rogue,
    Act::Lead,
];

/// How stormy this seed is: weights of the faults, chosen per seed so that some runs are
/// calm and others crash every few steps.
struct Faults {
    crash: u32,
    drop: u32,
    duplicate: u32,
}

pub struct World {
    seed: u64,
    options: Options,
    rng: Rng,
    now: i64,
    store: SimStore,
    model: Model,
    intents: Vec<Intent>,
    messages: Vec<Message>,
    net: Vec<Packet>,
    tickets: BTreeMap<Ticket, Origin>,
    next_ticket: Ticket,
    faults: Faults,
    batch_max: usize,
    main_steps: usize,
    step: usize,
    /// A crash point waiting for the next group or checkpoint to pass it.
    armed: Option<Point>,
    rogues: usize,
    /// In the last phase every replay must be answered with the outcome.
    replaying: bool,
    checked: (u64, u64),
    report: Report,
}

fn fnv(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x0000_0100_0000_01B3)
}

fn amount(units: u64) -> Amount {
    Amount::new(units).expect("simulated amounts are 1..=1000")
}

fn currency(code: &str) -> Currency {
    Currency::parse(code).expect("simulated currencies are ISO codes")
}

fn account(name: &str) -> Account {
    Account::parse(name).expect("simulated account names are valid")
}

fn key(name: &str) -> Key {
    Key::parse(name).expect("simulated keys are visible ASCII")
}

impl World {
    pub fn new(seed: u64, options: &Options) -> Self {
        let mut rng = Rng::new(seed);
        let batch_max = usize::try_from(rng.range(1, 4)).unwrap_or(1);
        let faults = Faults {
            crash: u32::try_from(rng.below(4)).unwrap_or(0),
            drop: u32::try_from(rng.below(4)).unwrap_or(0),
            duplicate: u32::try_from(rng.below(4)).unwrap_or(0),
        };
        let main_steps = usize::try_from(rng.range(40, 180)).unwrap_or(40);
        // Segments of a few groups each, so that compactions delete some; every way the
        // journal syncs and makes segments.
        let journal = JournalOptions {
            segment_size: 4096 * rng.range(1, 3),
            sync: if rng.below(2) == 0 {
                SyncMode::Fdatasync
            } else {
                SyncMode::Dsync
            },
            preallocate: [
                Preallocate::Zeros,
                Preallocate::Grow,
                Preallocate::Fallocate,
            ][rng.index(3)],
            prepare_ahead: rng.below(2) == 0,
        };
        // What each file keeps at a crash is the store's own stream, seeded from this one.
        let disk = Rng::new(rng.next_u64());
        let intents = generate(&mut rng);
        let specs = intents
            .iter()
            .map(|i| IntentSpec {
                ck: i.ck.clone(),
                command: i.command.clone(),
                fingerprint: i.fingerprint,
            })
            .collect();
        let store = SimStore::new(
            StoreConfig {
                batch_max,
                lease_ms: LEASE_MS,
                retention_ms: RETENTION_MS,
                journal,
            },
            options.mutation,
            disk,
        );
        let report = Report {
            seed,
            intents: intents.len(),
            ..Report::default()
        };
        Self {
            seed,
            options: options.clone(),
            rng,
            now: START_MS,
            store,
            model: Model::new(specs, RETENTION_MS, START_MS, seed),
            intents,
            messages: Vec::new(),
            net: Vec::new(),
            tickets: BTreeMap::new(),
            next_ticket: 1,
            faults,
            batch_max,
            main_steps,
            step: 0,
            armed: None,
            rogues: 0,
            replaying: false,
            checked: (0, 0),
            report,
        }
    }

    pub fn run(mut self) -> Report {
        if self.options.trace {
            self.trace_intents();
        }
        while self.step < self.main_steps && self.report.violation.is_none() {
            self.step += 1;
            self.one_step();
            self.check();
        }
        if self.report.violation.is_none() {
            self.note(|| {
                "-- final phase: no more faults, every intent retried until resolved".into()
            });
            self.settle();
        }
        if self.report.violation.is_none() {
            self.note(|| "-- expiry phase: past the retention, swept, every key replayed".into());
            self.expire_and_replay();
        }
        if self.report.violation.is_none() {
            self.note(|| "-- last crash: the ledger must open to the journal's durable end".into());
            self.last_crash();
        }
        self.report.steps = self.step;
        self.report.cut_appends_kept = self.store.kept_whole;
        self.report.tails_cut = self.store.tails_cut;
        self.report.replayed = self.store.replayed;
        self.report.rebuilt = self.store.rebuilt;
        self.report.facts = self.store.durable().facts.len();
        self.report
    }

    // ---- bookkeeping -------------------------------------------------------------------

    fn note(&self, text: impl FnOnce() -> String) {
        if self.options.trace {
            eprintln!(
                "{:>5} t={:>+9}ms  {}",
                self.step,
                self.now - START_MS,
                text()
            );
        }
    }

    fn trace_intents(&self) {
        eprintln!(
            "seed {}: {} main steps, at most {} commands a batch, fault weights: crash {}, \
             loss {}, duplication {}",
            self.seed,
            self.main_steps,
            self.batch_max,
            self.faults.crash,
            self.faults.drop,
            self.faults.duplicate
        );
        for (i, it) in self.intents.iter().enumerate() {
            eprintln!(
                "intent {i}: {}/{} {:?} via {:?}{}",
                it.ck.0,
                it.ck.1,
                it.command,
                it.channel,
                it.other
                    .as_ref()
                    .map(|(c, _)| format!(", will also send {c:?} under its key"))
                    .unwrap_or_default()
            );
        }
    }

    fn fail(&mut self, what: String) {
        if self.report.violation.is_none() {
            self.note(|| format!("VIOLATION: {what}"));
            self.report.violation = Some(Violation {
                seed: self.seed,
                step: self.step,
                what,
                mutation: self.options.mutation,
            });
        }
    }

    fn ts(&self) -> Timestamp {
        Timestamp(self.now)
    }

    fn set_clock(&mut self, now: i64) {
        self.now = now;
        self.model.max_now = self.model.max_now.max(now);
    }

    /// The checks after every step: answers are checked as they arrive; the store's two
    /// states are re-checked whenever they changed.
    fn check(&mut self) {
        if self.report.violation.is_some() {
            return;
        }
        if let Some(broken) = self.store.broken() {
            return self.fail(format!("invariant broken: {broken}"));
        }
        // Every quarantined message heard of is kept, each under an id of its own.
        let d = self.store.durable();
        if d.quarantines != d.quarantined || d.quarantines < self.report.quarantined as u64 {
            return self.fail(format!(
                "{} quarantine records up to id {} for {} messages told quarantined",
                d.quarantines, d.quarantined, self.report.quarantined
            ));
        }
        let versions = (self.store.durable_version, self.store.view_version);
        if versions.0 != self.checked.0
            && let Err(e) = self.model.check(self.store.durable(), true)
        {
            return self.fail(e);
        }
        // With no group sealed and not synced the view is the journal's durable end,
        // checked just above.
        if versions.1 != self.checked.1
            && self.store.unsynced() > 0
            && let Err(e) = self.model.check(self.store.view(), false)
        {
            return self.fail(e);
        }
        self.checked = versions;
    }

    // ---- the scheduler -----------------------------------------------------------------

    fn weights(&self) -> [u32; ACTS.len()] {
        // One pass over each collection: this runs every step, in a debug build.
        let (mut unstarted, mut retriable, mut buggy) = (false, false, false);
        for (n, i) in self.intents.iter().enumerate() {
            unstarted |= !i.started;
            retriable |= i.channel.http() && i.started && !i.http_done;
            buggy |= i.other.is_some() && self.model.resolved(n);
        }
        let (mut unacked, mut acked_legit) = (false, false);
        for m in &self.messages {
            unacked |= !m.acked;
            acked_legit |= m.acked && m.kind == Kind::Legit;
        }
        let requests = self.net.iter().any(|p| matches!(p, Packet::Request { .. }));
        let up = self.store.is_up();
        let net = !self.net.is_empty();
        let on = |b: bool, w: u32| if b { w } else { 0 };
        ACTS.map(|act| match act {
            Act::Start => on(unstarted, 6),
            Act::Retry => on(retriable, 5),
            Act::Deliver => on(net, 24),
            Act::Duplicate => on(requests, 2 * self.faults.duplicate),
            Act::Drop => on(net, 2 * self.faults.drop),
            Act::Redeliver => on(up && unacked, 8),
            Act::Decide => on(up && self.store.queued() > 0, 10),
            Act::Sync => on(up && self.store.unsynced() > 0, 10),
            Act::Checkpoint => on(up && self.store.checkpoint_due(), 4),
            Act::Crash => on(up && self.armed.is_none(), self.faults.crash),
            Act::Restart => on(!up, 20),
            Act::Clock => 3,
            Act::Sweep => on(up, 2),
            Act::OtherBody => on(buggy, 2),
            Act::Rogue => on(self.rogues < 2 && acked_legit, 1),
            // A blocking caller that finds the committer idle commits its command itself.
            Act::Lead => on(
                up && self.store.queued() == 1 && self.store.unsynced() == 0,
                6,
            ),
        })
    }

    fn one_step(&mut self) {
        // Time passes a little between any two events.
        let drift = self.rng.range_i64(0, 30);
        self.set_clock(self.now + drift);
        let Some(i) = self.rng.weighted(&self.weights()) else {
            return;
        };
        let act = ACTS[i];
        self.report.digest = fnv(
            fnv(self.report.digest, u64::try_from(i).unwrap_or(0)),
            self.store.view().stats.last_seq,
        );
        match act {
            Act::Start => {
                let n = self.pick_intent(|i| !i.started);
                self.start(n);
            }
            Act::Retry => {
                let n = self.pick_intent(|i| i.channel.http() && i.started && !i.http_done);
                self.note(|| format!("client retries intent {n} with its key"));
                self.net.push(Packet::Request {
                    intent: n,
                    body: Body::Own,
                });
            }
            Act::Deliver => {
                let p = self.net.swap_remove(self.rng.index(self.net.len()));
                self.deliver(p);
            }
            Act::Duplicate => {
                let requests: Vec<usize> = (0..self.net.len())
                    .filter(|n| matches!(self.net[*n], Packet::Request { .. }))
                    .collect();
                let p = self.net[requests[self.rng.index(requests.len())]].clone();
                self.note(|| format!("network duplicates {p:?}"));
                self.report.duplicated += 1;
                self.net.push(p);
            }
            Act::Drop => {
                let p = self.net.swap_remove(self.rng.index(self.net.len()));
                self.note(|| format!("network loses {}", describe(&p)));
                self.report.dropped += 1;
            }
            Act::Redeliver => {
                let unacked: Vec<usize> = (0..self.messages.len())
                    .filter(|m| !self.messages[*m].acked)
                    .collect();
                let m = unacked[self.rng.index(unacked.len())];
                self.deliver_message(m);
            }
            Act::Decide => self.decide(),
            Act::Sync => self.sync(),
            Act::Lead => self.lead(),
            Act::Checkpoint => self.checkpoint(),
            Act::Crash => self.crash(),
            Act::Restart => self.restart(),
            Act::Clock => self.move_clock(),
            Act::Sweep => {
                let (expired, answers) = self.store.sweep(self.ts());
                self.route(answers);
                self.report.expired += expired;
                self.note(|| format!("sweep stages {expired} expiries"));
            }
            Act::OtherBody => {
                let candidates: Vec<usize> = (0..self.intents.len())
                    .filter(|n| self.intents[*n].other.is_some() && self.model.resolved(*n))
                    .collect();
                let n = candidates[self.rng.index(candidates.len())];
                if self.rng.chance(500) {
                    self.note(|| format!("client sends ANOTHER command under intent {n}'s key"));
                    self.net.push(Packet::Request {
                        intent: n,
                        body: Body::Other,
                    });
                } else {
                    self.publish(n, Kind::Other, None);
                }
            }
            Act::Rogue => {
                let acked: Vec<usize> = (0..self.messages.len())
                    .filter(|m| self.messages[*m].acked && self.messages[*m].kind == Kind::Legit)
                    .collect();
                let m = acked[self.rng.index(acked.len())];
                let first = self.messages[m].intent;
                let others: Vec<usize> = (0..self.intents.len()).filter(|n| *n != first).collect();
                if !others.is_empty() {
                    let target = others[self.rng.index(others.len())];
                    let id = self.messages[m].id.clone();
                    self.rogues += 1;
                    self.publish(target, Kind::Rogue, Some(id));
                }
            }
        }
    }

    fn pick_intent(&mut self, f: impl Fn(&Intent) -> bool) -> usize {
        let candidates: Vec<usize> = (0..self.intents.len())
            .filter(|n| f(&self.intents[*n]))
            .collect();
        candidates[self.rng.index(candidates.len())]
    }

    fn start(&mut self, n: usize) {
        let channel = self.intents[n].channel;
        self.intents[n].started = true;
        self.note(|| format!("intent {n} starts via {channel:?}"));
        if channel.http() {
            self.net.push(Packet::Request {
                intent: n,
                body: Body::Own,
            });
        }
        if channel.broker() {
            // A producer that retries its publish sends the same intent under a new id.
            let copies = if self.rng.chance(200) { 2 } else { 1 };
            for _ in 0..copies {
                self.publish(n, Kind::Legit, None);
            }
        }
    }

    fn publish(&mut self, intent: usize, kind: Kind, id: Option<MessageId>) {
        let id = id.unwrap_or_else(|| {
            MessageId::parse(&format!("m{}", self.messages.len()))
                .expect("generated message ids are valid")
        });
        self.note(|| format!("producer publishes {id} ({kind:?}) for intent {intent}"));
        self.messages.push(Message {
            id,
            intent,
            kind,
            acked: false,
        });
    }

    fn move_clock(&mut self) {
        let roll = self.rng.below(100);
        let delta = match roll {
            0..40 => self.rng.range_i64(1, 1_000),
            40..60 => self.rng.range_i64(LEASE_MS, LEASE_MS + 5_000),
            60..70 => self.rng.range_i64(RETENTION_MS, 2 * RETENTION_MS),
            70..90 => -self.rng.range_i64(1, 3_000),
            _ => -self
                .rng
                .range_i64(LEASE_MS, RETENTION_MS + RETENTION_MS / 2),
        };
        if delta < 0 {
            self.report.clock_back += 1;
        }
        self.note(|| format!("clock moves {delta:+}ms"));
        self.set_clock(self.now + delta);
    }

    /// Arms a named crash point, which fires at the next group or checkpoint that passes it
    /// (as the real failpoints do), or kills the process between two commits right away.
    fn crash(&mut self) {
        if self.rng.chance(200) {
            self.note(|| "CRASH between commits".into());
            self.store.crash();
            self.died();
        } else {
            let point = Point::ALL[self.rng.index(Point::ALL.len())];
            self.note(|| format!("crash point {} armed", point.name()));
            self.armed = Some(point);
        }
    }

    /// Takes the armed point if it is one of `points`.
    fn fire(&mut self, points: &[Point]) -> Option<Point> {
        let point = self.armed.filter(|p| points.contains(p))?;
        self.armed = None;
        if let Some(n) = Point::ALL.iter().position(|p| *p == point) {
            self.report.crash_points[n] += 1;
        }
        self.note(|| format!("CRASH at {}", point.name()));
        Some(point)
    }

    fn decide(&mut self) {
        self.note(|| format!("decider takes {} queued", self.store.queued()));
        let answers = self.decider_turn();
        self.route(answers);
    }

    /// The leader's path (`Lead::try_lead`): the one queued command, with nothing sealed
    /// before it unwritten, is decided, sealed, written, synced, applied and answered with
    /// no other step in between.
    fn lead(&mut self) {
        self.note(|| "a caller finds the committer idle and leads".into());
        self.decide();
        if self.store.is_up() && self.store.unsynced() > 0 {
            self.sync();
        }
    }

    fn sync(&mut self) {
        self.note(|| {
            format!(
                "syncer writes, syncs and applies {} groups",
                self.store.unsynced()
            )
        });
        let crash = self.fire(&Point::SYNC);
        let answers = self.store.sync(crash);
        self.route(answers);
        if crash.is_some() {
            self.died();
        }
    }

    fn checkpoint(&mut self) {
        let crash = self.fire(&Point::CHECKPOINT);
        let (group, deleted) = self.store.checkpoint(crash);
        self.report.checkpoints += 1;
        self.report.segments_deleted += deleted;
        self.note(|| {
            format!("checkpoint: sled flushed at group {group}, {deleted} journal segments deleted")
        });
        if crash.is_some() {
            self.died();
        }
    }

    fn restart(&mut self) {
        self.note(|| "worker restarts".into());
        if let Err(e) = self.store.restart() {
            self.fail(e);
        }
    }

    /// The end of a run: one more crash between commits, whatever each file keeps, and the
    /// ledger must open to the journal's durable end (checked by the restart).
    fn last_crash(&mut self) {
        self.step += 1;
        self.store.crash();
        self.note(|| format!("CRASH after the run: {}", self.store.fate()));
        self.restart();
    }

    /// One turn of the store's decider, and the model's check of what it decided against
    /// the keys that were claimed when it began (a claim lives exactly while its request
    /// waits for an answer: from being queued to its answer, or to a crash).
    fn decider_turn(&mut self) -> Vec<(Ticket, Answer)> {
        let claimed: BTreeSet<Ck> = self
            .tickets
            .values()
            .map(|origin| match origin {
                Origin::Http { intent, .. } => *intent,
                Origin::Broker { message } => self.messages[*message].intent,
            })
            .map(|intent| self.intents[intent].ck.clone())
            .collect();
        let after = self.store.view().stats.last_seq;
        let answers = self.store.decide(self.ts());
        if let Err(e) = self.model.check_decided(self.store.view(), after, &claimed) {
            self.fail(e);
        }
        answers
    }

    fn died(&mut self) {
        self.note(|| format!("after the crash: {}", self.store.fate()));
        self.report.crashes += 1;
        // Whoever waited on the dead process hears nothing.
        self.tickets.clear();
    }

    // ---- the worker's front ends -------------------------------------------------------

    fn deliver(&mut self, p: Packet) {
        match p {
            Packet::Request { intent, body } => {
                if !self.store.is_up() {
                    self.note(|| format!("request for intent {intent} refused: worker down"));
                    return;
                }
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                let it = &self.intents[intent];
                let (command, fingerprint) = it.body(body);
                let answer =
                    self.store
                        .submit(self.ts(), &it.ck, command, fingerprint, None, ticket);
                match answer {
                    Some(answer) => {
                        self.note(|| {
                            format!(
                                "worker answers intent {intent} ({body:?}) at once: {}",
                                short(&answer)
                            )
                        });
                        self.net.push(Packet::Response {
                            intent,
                            body,
                            answer,
                        });
                    }
                    None => {
                        self.note(|| format!("request for intent {intent} ({body:?}) queued"));
                        self.tickets.insert(ticket, Origin::Http { intent, body });
                    }
                }
            }
            Packet::Response {
                intent,
                body,
                answer,
            } => self.client_hears(intent, body, &answer),
            Packet::Ack { message } => {
                self.note(|| format!("broker gets the ack of {}", self.messages[message].id));
                self.messages[message].acked = true;
            }
        }
    }

    fn deliver_message(&mut self, m: usize) {
        if !self.store.is_up() {
            return;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.report.deliveries += 1;
        let msg = &self.messages[m];
        let it = &self.intents[msg.intent];
        let body = if msg.kind == Kind::Other {
            Body::Other
        } else {
            Body::Own
        };
        let (command, fingerprint) = it.body(body);
        let answer = self.store.submit(
            self.ts(),
            &it.ck,
            command,
            fingerprint,
            Some(&msg.id),
            ticket,
        );
        self.note(|| format!("broker delivers {} (intent {})", msg.id, msg.intent));
        match answer {
            Some(answer) => self.consumer_hears(m, &answer),
            None => {
                self.tickets.insert(ticket, Origin::Broker { message: m });
            }
        }
    }

    /// Answers of a durable group go back to whoever is still waiting.
    fn route(&mut self, answers: Vec<(Ticket, Answer)>) {
        for (ticket, answer) in answers {
            match self.tickets.remove(&ticket) {
                Some(Origin::Http { intent, body }) => self.net.push(Packet::Response {
                    intent,
                    body,
                    answer,
                }),
                Some(Origin::Broker { message }) => self.consumer_hears(message, &answer),
                None => {}
            }
        }
    }

    /// The HTTP client of an intent reads an answer.
    fn client_hears(&mut self, intent: usize, body: Body, answer: &Answer) {
        self.note(|| {
            format!(
                "client of intent {intent} ({body:?}) hears {}",
                short(answer)
            )
        });
        self.report.answers += 1;
        match (body, answer) {
            (Body::Own, Ok(Submission::Executed(o) | Submission::Replayed(o))) => {
                let executed = matches!(answer, Ok(Submission::Executed(_)));
                self.report.replays += usize::from(!executed);
                self.hear(intent, o, executed);
                self.intents[intent].http_done = true;
            }
            (Body::Own, Ok(Submission::Reused)) => {
                self.fail(format!(
                    "intent {intent}: a retry with its own command was refused as \
                     idempotency_key_reused"
                ));
            }
            (Body::Own, Ok(Submission::Quarantined { .. })) => {
                self.fail(format!("intent {intent}: an HTTP request was quarantined"));
            }
            (Body::Other, Ok(Submission::Executed(o) | Submission::Replayed(o))) => {
                self.fail(format!(
                    "intent {intent}: another command under its key was answered with an \
                     outcome instead of idempotency_key_reused: {}",
                    ledger::json::outcome(o)
                ));
            }
            (Body::Other, Ok(Submission::Reused)) => self.report.reused_refused += 1,
            (_, Ok(Submission::InProgress { .. })) => self.report.in_flight += 1,
            (_, Err(StoreError::Corrupt(e))) => self.fail(format!("the store is corrupt: {e}")),
            (_, Ok(Submission::Quarantined { .. }) | Err(StoreError::Down)) => {}
        }
        if self.replaying
            && !matches!(
                (body, answer),
                (Body::Own, Ok(Submission::Replayed(_))) | (Body::Other, Ok(Submission::Reused))
            )
        {
            self.fail(format!(
                "intent {intent}: after expiry a repeat ({body:?}) was answered {}",
                short(answer)
            ));
        }
    }

    /// The consumer, in the worker's process, reads the ledger's answer to a delivery and
    /// acks (or not) to the broker.
    fn consumer_hears(&mut self, m: usize, answer: &Answer) {
        let (intent, kind) = (self.messages[m].intent, self.messages[m].kind);
        self.note(|| {
            format!(
                "consumer of {} ({kind:?}, intent {intent}) hears {}",
                self.messages[m].id,
                short(answer)
            )
        });
        let ack = match (kind, answer) {
            (Kind::Legit, Ok(Submission::Executed(o) | Submission::Replayed(o))) => {
                let executed = matches!(answer, Ok(Submission::Executed(_)));
                self.report.replays += usize::from(!executed);
                self.hear(intent, o, executed);
                self.model
                    .message_acked(self.messages[m].id.clone(), intent);
                true
            }
            (Kind::Legit, Ok(Submission::Reused | Submission::Quarantined { .. })) => {
                self.fail(format!(
                    "message {} with intent {intent}'s own command was refused: {}",
                    self.messages[m].id,
                    short(answer)
                ));
                true
            }
            (Kind::Other | Kind::Rogue, Ok(Submission::Executed(_) | Submission::Replayed(_))) => {
                self.fail(format!(
                    "message {} ({kind:?}) changed or replayed intent {intent}'s key: {}",
                    self.messages[m].id,
                    short(answer)
                ));
                true
            }
            (Kind::Other, Ok(Submission::Quarantined { .. })) => {
                self.fail(format!(
                    "message {} with a fresh id was quarantined as a reused id",
                    self.messages[m].id
                ));
                true
            }
            (Kind::Other | Kind::Rogue, Ok(Submission::Reused)) => {
                // The real consumer quarantines it with the reason, then acks.
                self.report.reused_refused += 1;
                true
            }
            (Kind::Rogue, Ok(Submission::Quarantined { .. })) => {
                self.report.quarantined += 1;
                true
            }
            (_, Ok(Submission::InProgress { .. })) => {
                self.report.in_flight += 1;
                false
            }
            (_, Err(StoreError::Corrupt(e))) => {
                self.fail(format!("the store is corrupt: {e}"));
                false
            }
            (_, Err(StoreError::Down)) => false,
        };
        if ack {
            self.net.push(Packet::Ack { message: m });
        }
    }

    fn hear(&mut self, intent: usize, outcome: &Outcome, executed: bool) {
        if let Err(e) = self.model.heard(intent, outcome, executed) {
            self.fail(e);
        }
    }

    // ---- the end -----------------------------------------------------------------------

    fn drain_network(&mut self) {
        while !self.net.is_empty() && self.report.violation.is_none() {
            let p = self.net.remove(0);
            self.deliver(p);
        }
    }

    fn quiet(&self) -> bool {
        self.model.all_resolved()
            && self.messages.iter().all(|m| m.acked)
            && self.net.is_empty()
            && self.store.queued() == 0
            && self.store.unsynced() == 0
    }

    /// No more faults: every intent is started, every unresolved intent retried with its
    /// own key and every unacked message redelivered, until all are resolved.
    fn settle(&mut self) {
        self.armed = None;
        if !self.store.is_up() {
            self.step += 1;
            self.restart();
            if self.report.violation.is_some() {
                return;
            }
        }
        for n in 0..self.intents.len() {
            if !self.intents[n].started {
                self.start(n);
            }
        }
        for _ in 0..SETTLE_ROUNDS {
            self.step += 1;
            self.drain_network();
            for m in 0..self.messages.len() {
                if !self.messages[m].acked {
                    self.deliver_message(m);
                }
            }
            while self.store.queued() > 0 {
                let answers = self.decider_turn();
                self.route(answers);
            }
            let answers = self.store.sync(None);
            self.route(answers);
            if self.store.checkpoint_due() {
                self.checkpoint();
            }
            self.drain_network();
            self.check();
            if self.report.violation.is_some() || self.quiet() {
                break;
            }
            for n in 0..self.intents.len() {
                let it = &self.intents[n];
                if it.channel.http() && !it.http_done {
                    self.net.push(Packet::Request {
                        intent: n,
                        body: Body::Own,
                    });
                }
            }
            self.set_clock(self.now + 100);
        }
        if self.report.violation.is_none() && !self.quiet() {
            let unresolved = self.model.unresolved();
            let unacked: Vec<&str> = self
                .messages
                .iter()
                .filter(|m| !m.acked)
                .map(|m| m.id.as_str())
                .collect();
            self.fail(format!(
                "the final phase did not settle in {SETTLE_ROUNDS} rounds: unresolved intents \
                 {unresolved:?}, unacked messages {unacked:?}, {} queued, {} claims",
                self.store.queued(),
                self.store.claims()
            ));
        }
    }

    /// Past the retention every key is swept to expired; the clock then steps back; every
    /// key is replayed with its own command (and the buggy ones with the other): the same
    /// bytes, or idempotency_key_reused, and not one new fact.
    fn expire_and_replay(&mut self) {
        self.step += 1;
        let later = self.now.max(self.model.max_now) + RETENTION_MS + 1_000;
        self.set_clock(later);
        let (expired, drained) = self.store.sweep(self.ts());
        self.report.expired += expired;
        self.route(drained);
        let answers = self.store.sync(None);
        self.route(answers);
        self.check();
        let unexpired = self
            .store
            .durable()
            .keys
            .values()
            .filter(|r| !r.expired)
            .count();
        if unexpired > 0 {
            return self.fail(format!(
                "{unexpired} keys older than the retention are not expired after a sweep"
            ));
        }
        self.set_clock(self.now - RETENTION_MS / 2);
        let (expired, drained) = self.store.sweep(self.ts());
        self.report.expired += expired;
        self.route(drained);
        let answers = self.store.sync(None);
        self.route(answers);
        self.check();
        let facts = self.store.durable().facts.len();
        self.replaying = true;
        for n in 0..self.intents.len() {
            self.net.push(Packet::Request {
                intent: n,
                body: Body::Own,
            });
            if self.intents[n].other.is_some() {
                self.net.push(Packet::Request {
                    intent: n,
                    body: Body::Other,
                });
            }
        }
        self.drain_network();
        while self.store.queued() > 0 {
            let answers = self.decider_turn();
            self.route(answers);
        }
        let answers = self.store.sync(None);
        self.route(answers);
        self.drain_network();
        self.check();
        if self.report.violation.is_some() {
            return;
        }
        if self.store.durable().facts.len() != facts {
            return self.fail("replays after expiry added facts".into());
        }
        if let Err(e) = self.model.check_final(self.store.durable()) {
            self.fail(e);
        }
    }
}

fn short(answer: &Answer) -> String {
    match answer {
        Ok(Submission::Executed(o)) => format!("executed seq {} ({})", o.seq(), verdict(o)),
        Ok(Submission::Replayed(o)) => format!("replayed seq {} ({})", o.seq(), verdict(o)),
        Ok(Submission::Reused) => "422 idempotency_key_reused".into(),
        Ok(Submission::InProgress { .. }) => "409 request_in_progress".into(),
        Ok(Submission::Quarantined { reason }) => format!("quarantined: {reason}"),
        Err(e) => format!("{e:?}"),
    }
}

fn verdict(o: &Outcome) -> &'static str {
    o.rejection().map_or("applied", |r| r.code())
}

fn describe(p: &Packet) -> String {
    match p {
        Packet::Request { intent, body } => format!("a request for intent {intent} ({body:?})"),
        Packet::Response { intent, answer, .. } => {
            format!("the answer to intent {intent} ({})", short(answer))
        }
        Packet::Ack { message } => format!("the ack of message #{message}"),
    }
}

/// The scripted intents of one seed: 1 to 4 clients sharing 4 accounts, each with 2 to 8
/// keys named `k0`, `k1`, ... (the same names in every client: scopes must not collide).
fn generate(rng: &mut Rng) -> Vec<Intent> {
    let clients = rng.range(1, 4);
    let mut intents = Vec::new();
    for c in 0..clients {
        let client = ClientId::parse(&format!("client-{c}")).expect("valid client name");
        let count = rng.range(2, 8);
        // 0 deposit, 1 withdraw, 2 refund; refunds need to know where the withdrawals are.
        let kinds: Vec<u64> = (0..count)
            .map(|_| match rng.below(100) {
                0..40 => 0,
                40..75 => 1,
                _ => 2,
            })
            .collect();
        let mut commands: Vec<Command> = Vec::new();
        for kind in &kinds {
            let (name, home) = ACCOUNTS[rng.index(ACCOUNTS.len())];
            let cur = if rng.chance(100) {
                currency(CURRENCIES[rng.index(CURRENCIES.len())])
            } else {
                currency(home)
            };
            let command = match kind {
                0 => Command::Deposit {
                    account: account(name),
                    amount: amount(rng.range(1, 500)),
                    currency: cur,
                },
                1 => Command::Withdraw {
                    account: account(if rng.chance(50) { "acc-never" } else { name }),
                    amount: amount(rng.range(1, 300)),
                    currency: cur,
                },
                _ => Command::Refund {
                    withdrawal: key("pending"),
                    amount: amount(1),
                },
            };
            commands.push(command);
        }
        let withdrawals: Vec<usize> = (0..kinds.len()).filter(|n| kinds[*n] == 1).collect();
        for n in 0..commands.len() {
            if kinds[n] != 2 {
                continue;
            }
            let roll = rng.below(100);
            let (target, units) = if roll < 70 && !withdrawals.is_empty() {
                let w = withdrawals[rng.index(withdrawals.len())];
                let withdrawn = commands[w].amount().units();
                (format!("k{w}"), rng.range(1, withdrawn + 20))
            } else if roll < 85 {
                // A key of this client that is not a withdrawal, or none of its keys: in
                // its scope there is no such withdrawal, whatever other clients hold.
                (format!("k{}", rng.below(count + 4)), rng.range(1, 100))
            } else {
                ("no-such-withdrawal".into(), rng.range(1, 100))
            };
            commands[n] = Command::Refund {
                withdrawal: key(&target),
                amount: amount(units),
            };
        }
        for (n, command) in commands.into_iter().enumerate() {
            let other = rng.chance(120).then(|| {
                let c = match &command {
                    Command::Deposit {
                        account,
                        amount: a,
                        currency,
                    } if rng.chance(500) => Command::Withdraw {
                        account: account.clone(),
                        amount: *a,
                        currency: *currency,
                    },
                    Command::Deposit {
                        account,
                        amount: a,
                        currency,
                    } => Command::Deposit {
                        account: account.clone(),
                        amount: amount(a.units() + 1),
                        currency: *currency,
                    },
                    Command::Withdraw {
                        account,
                        amount: a,
                        currency,
                    } => Command::Withdraw {
                        account: account.clone(),
                        amount: amount(a.units() + 1),
                        currency: *currency,
                    },
                    Command::Refund {
                        withdrawal,
                        amount: a,
                    } => Command::Refund {
                        withdrawal: withdrawal.clone(),
                        amount: amount(a.units() + 1),
                    },
                };
                let f = c.fingerprint();
                (c, f)
            });
            let channel = match rng.below(100) {
                0..60 => Channel::Http,
                60..85 => Channel::Broker,
                _ => Channel::Both,
            };
            intents.push(Intent {
                ck: (client.clone(), key(&format!("k{n}"))),
                fingerprint: command.fingerprint(),
                command,
                other,
                channel,
                started: false,
                http_done: false,
            });
        }
    }
    intents
}
