-- Idem on PostgreSQL, schema version 1. Applied once by `PgStore::open`, inside the
-- migration transaction that holds the advisory lock; the search_path is the store's
-- schema. Never change what a released migration makes: add the next version instead.
--
-- Names and strings are COLLATE "C" so that ORDER BY (client, key) is byte order, the
-- order the sled store lists keys in, and so the primary key index serves it.

-- The log's sequence numbers. A sequence never blocks a concurrent writer, but its values
-- are not transactional: a rolled-back attempt leaves a gap, and two transactions may
-- commit in the opposite order of their numbers. Facts that touch one account take their
-- number after locking the account, so per account the order of numbers is the order of
-- the balance changes, which is what `verify` folds.
CREATE SEQUENCE fact_seq AS bigint MINVALUE 1;

-- The log: one row per fact, immutable. `body` is `Fact::encode` (tag, version, postcard),
-- the same bytes the sled store keeps, and the only column read back; the others are for
-- humans and SQL.
CREATE TABLE facts (
    seq       bigint PRIMARY KEY,
    at        timestamptz NOT NULL,
    client    text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    kind      text NOT NULL,
    rejection text,
    body      bytea NOT NULL,
    doc       jsonb NOT NULL,
    -- One effect per key, enforced on the log itself and not only through the key table.
    CONSTRAINT facts_one_per_key UNIQUE (client, key)
);

-- The seed's table of keys, scoped by client. A row is inserted `pending` by the
-- transaction that executes the key (its uncommitted row is the claim a concurrent twin
-- waits on) and set `done` in the same transaction, so no other session ever sees a
-- pending row. The sweep sets `expired` and drops the stored response; the fingerprint
-- and the fact stay, so a retry is still answered and a reuse still refused.
CREATE TABLE idempotency_keys (
    client       text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    -- The command's fingerprint (16 bytes of SHA-256 of its canonical form).
    request_hash bytea NOT NULL,
    status       text NOT NULL CHECK (status IN ('pending', 'done', 'expired')),
    -- ledger::fact::json::outcome of the key's fact. Replays are rendered from the fact
    -- itself, so this copy is for SQL readers; verify checks that it agrees.
    response     jsonb,
    -- The fact's time (Rules.clock, never the server's now()).
    created_at   timestamptz NOT NULL,
    seq          bigint,
    PRIMARY KEY (client, key),
    CHECK ((status = 'pending') = (seq IS NULL)),
    CHECK ((status = 'done') = (response IS NOT NULL))
);

-- What the sweep looks for: done keys by age.
CREATE INDEX idempotency_keys_sweep ON idempotency_keys (created_at) WHERE status = 'done';

-- User accounts: one row each, in the currency of its first deposit. The check is the
-- last line of defence; the guarded update (balance >= amount) is the first.
CREATE TABLE accounts (
    account  text COLLATE "C" PRIMARY KEY CHECK (account NOT LIKE '@%'),
    currency text NOT NULL,
    balance  numeric(39, 0) NOT NULL CHECK (balance >= 0)
);

-- System accounts (@world, @payouts) take the other leg of every movement. As single rows
-- they would serialise every deposit of a currency on @world's row lock; as counters
-- split into shards, concurrent commands add to different rows and a balance is the sum
-- of its shards. Deriving them from the log instead would make every read a scan.
CREATE TABLE system_balances (
    account  text COLLATE "C" NOT NULL CHECK (account LIKE '@%'),
    currency text NOT NULL,
    shard    smallint NOT NULL,
    balance  numeric(39, 0) NOT NULL,
    PRIMARY KEY (account, currency, shard)
);

-- Refunds so far per withdrawal (the withdrawal's key, in its client's scope).
CREATE TABLE refunded (
    client     text COLLATE "C" NOT NULL,
    withdrawal text COLLATE "C" NOT NULL,
    withdrawn  bigint NOT NULL,
    total      bigint NOT NULL CHECK (total > 0 AND total <= withdrawn),
    PRIMARY KEY (client, withdrawal)
);

-- The inbox: message ids seen, with the fingerprint of (client, key, command), written in
-- the transaction of the effect. `seq` is the fact that answered the message.
CREATE TABLE inbox (
    message_id  text COLLATE "C" PRIMARY KEY,
    fingerprint bytea NOT NULL,
    client      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    seq         bigint,
    at          timestamptz NOT NULL
);

-- Inbox messages that were refused, with the reason.
CREATE TABLE quarantine (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL,
    message_id text,
    reason     text NOT NULL,
    payload    text NOT NULL
);

-- Counters of the facts (applied per kind, rejected per code) and of expired keys,
-- sharded like the system accounts for the same reason, and written in the transaction of
-- what they count, so they are exact (verify compares them with the log).
CREATE TABLE counters (
    name  text NOT NULL,
    shard smallint NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (name, shard)
);
