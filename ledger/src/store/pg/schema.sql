-- Idem's schema on PostgreSQL, whole: every table, index and function the store uses, as
-- the migrations in `migrations/` leave them, in one file to read. The store builds its
-- schema by running those migrations in order at open (`open.rs`), recording each version
-- in `schema_version`, a table of its own that this file leaves out; `tests/it/pg_schema.rs`
-- loads this file into one fresh database, migrates another, and checks that the two have
-- the same tables, columns, constraints, indexes, sequences, domains and functions. A
-- change to the schema is a new migration and the same change here.
--
-- Run with the search_path set to the store's schema, as the migrations are. Names and
-- strings are COLLATE "C" so that ORDER BY (client, key) is byte order, the order the
-- sled store lists keys in, and so the primary key index serves it.
--
-- How a group of commands runs (see `group.rs`): BEGIN and idem_claim_group, then the
-- decisions in the worker (`core::decide`), then idem_apply_group (or idem_apply_one for
-- a group of one fact) and COMMIT: two round trips per group. Errors: a claim that waits
-- longer than the in-flight wait for a twin answers 'in_flight' for that command (a 409);
-- a write that disagrees with the decisions raises SQLSTATE IDM01, which aborts the
-- transaction, so the COMMIT sent behind it rolls back.

-- ---- The log's numbers, and the rules on rows ---------------------------------------

-- The facts' numbers. A sequence never blocks a concurrent writer, but its values are not
-- transactional: a rolled-back attempt leaves a gap, and two transactions may commit in
-- the opposite order of their numbers. A fact that touches an account takes its number
-- after locking the account, so per account the order of numbers is the order of the
-- balance changes, which is what `verify` folds.
CREATE SEQUENCE fact_seq AS bigint MINVALUE 1;

-- The rules on accounts as domains, whose checks are planned once per session (a table's
-- CHECK is planned again for every statement that writes the table): a user account is
-- not named like a system one, a system account is, and a user's balance is never
-- negative. The guarded updates in the apply functions are the first line of defence;
-- these are the last.
CREATE DOMAIN idem_user_account AS text COLLATE "C" CHECK (VALUE NOT LIKE '@%');
CREATE DOMAIN idem_system_account AS text COLLATE "C" CHECK (VALUE LIKE '@%');
CREATE DOMAIN idem_user_balance AS numeric(39, 0) CHECK (VALUE >= 0);

-- The rule on a key's row: its status agrees with its fact number and its stored
-- response. A PL/pgSQL call, because a CASE spelled in the CHECK is read back and planned
-- for every insert, and costs more than twice the call.
CREATE FUNCTION idem_key_state_ok(status text, no_seq boolean, no_response boolean)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN CASE status
        WHEN 'pending' THEN no_seq AND no_response
        WHEN 'done' THEN NOT no_seq AND NOT no_response
        WHEN 'expired' THEN NOT no_seq AND no_response
        ELSE false END;
END $$;

-- A text's UTF-8 bytes, for the stored response's digest. A generated column takes only
-- immutable functions, and `convert_to` is marked stable because its result depends on
-- the database's encoding, which a database never changes: within one database the bytes
-- of a text are a function of the text alone, which this function says.
CREATE FUNCTION idem_utf8(t text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT convert_to(t, 'UTF8') $$;

-- ---- Tables -------------------------------------------------------------------------

-- The log: one row per fact, immutable. `body` is `Fact::encode` (tag, version, postcard),
-- the same bytes the sled store keeps, and the only column read back; the others are for
-- humans and SQL. One effect per key is enforced on the log itself (facts_one_per_key),
-- not only through the keys' table, so it holds against any writer.
CREATE TABLE facts (
    seq       bigint PRIMARY KEY,
    at        timestamptz NOT NULL,
    client    text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    kind      text NOT NULL,
    rejection text,
    body      bytea NOT NULL,
    doc       jsonb NOT NULL,
    CONSTRAINT facts_one_per_key UNIQUE (client, key)
);

-- An account's statement: its movements in seq order, a page at a time, as an index range
-- scan of the account however long the log. The account is in `doc` only, and a
-- rejection moves nothing. Paging by the last seq read misses nothing: a movement takes
-- its number while it holds its account's row lock.
CREATE INDEX facts_by_account ON facts ((doc ->> 'account'), seq)
    WHERE kind <> 'CommandRejected';

-- The idempotency keys, scoped by client. The claim on a key is its advisory lock
-- (idem_claim_lock), held from before the key is read to the commit; the row is written
-- once, 'done' with its outcome, at the end of the transaction that executes the key, and
-- the primary key refuses a second one. The sweep sets 'expired' and drops the stored
-- response; the fingerprint and the fact stay, so a retry is still answered and a reuse
-- still refused. ('pending', a row inserted before its fact, is allowed by the rule and
-- written by no function here.)
CREATE TABLE idempotency_keys (
    client          text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    -- The command's fingerprint (16 bytes of SHA-256 of its canonical form).
    request_hash    bytea NOT NULL,
    status          text NOT NULL,
    -- The key's outcome (ledger::fact::json::outcome) as the text jsonb prints. Replays
    -- are rendered from the fact itself, so this copy is for SQL readers; verify checks
    -- that it agrees, through its digest.
    response        text,
    -- The fact's time (Rules.clock, never the server's now()).
    created_at      timestamptz NOT NULL,
    seq             bigint,
    -- The first 16 bytes of SHA-256 over the response's bytes, kept by the server itself
    -- whenever the response is written or cleared, so verify compares 16 bytes per key
    -- with the digest of the answer it renders from the fact.
    response_digest bytea
        GENERATED ALWAYS AS (substring(sha256(idem_utf8(response)) FOR 16)) STORED,
    PRIMARY KEY (client, key),
    CONSTRAINT idempotency_keys_state
        CHECK (idem_key_state_ok(status, seq IS NULL, response IS NULL))
);

-- What the sweep looks for: done keys by age.
CREATE INDEX idempotency_keys_sweep ON idempotency_keys (created_at) WHERE status = 'done';

-- User accounts: one row each, in the currency of its first deposit.
CREATE TABLE accounts (
    account  idem_user_account PRIMARY KEY,
    currency text NOT NULL,
    balance  idem_user_balance NOT NULL
);

-- System accounts (@world, @payouts) take the other leg of every movement. As single rows
-- they would serialise every deposit of a currency on @world's row lock; split into
-- shards, concurrent groups add to different rows and a balance is the sum of its shards.
-- Deriving them from the log instead would make every read a scan.
CREATE TABLE system_balances (
    account  idem_system_account NOT NULL,
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
    total      bigint NOT NULL,
    PRIMARY KEY (client, withdrawal),
    CONSTRAINT refunded_check CHECK (total > 0 AND total <= withdrawn)
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

-- ---- A group's transaction -----------------------------------------------------------
--
-- Locks are taken in one global order, so two groups never wait for each other in a
-- cycle: the keys' advisory locks by their hash, then the message ids' by theirs, then
-- refunded totals by (client, withdrawal), then user accounts by name; in the writes,
-- system shards by (account, currency) and counters by name. The two waits that break the
-- order (a twin's claim on a key, a refund's shared wait on its withdrawal's claim) are
-- bounded by the in-flight wait and end as a 409 for that command alone.
--
-- The functions that run a group's statements plan them once per session
-- (plan_cache_mode = force_generic_plan): with arrays of unknown length, PL/pgSQL's
-- choice between custom and generic plans differed from one database to the next, and
-- some planned every call again. Sequential scans are off, so a plan made while the
-- tables were small still probes the indexes once they are large.

-- The advisory lock that is the claim on a key ('k', client, key) or on a message id
-- ('m', id, ''): a 64-bit hash of the names, the first one length-prefixed so that no two
-- pairs spell the same text. Two claims whose hashes collide only wait for each other.
-- Every part is immutable, so the planner inlines the call.
CREATE FUNCTION idem_claim_lock(kind text, a text, b text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended(kind || length(a)::text || ':' || a || b, 7157) $$;

-- Waits for an advisory lock the caller could not take at once, at most `p_wait_ms`
-- (exclusive, or shared with `p_shared`), then restores the lease as the lock timeout.
-- False: the wait ran out (a twin's claim held past the in-flight wait). Only this wait is
-- bounded by the in-flight wait: bounding the inserts as well would turn waits that have
-- nothing to do with a twin (PostgreSQL's lock on extending a table under a burst of
-- inserts) into false 409s; they wait at most the lease. The block that catches the
-- timeout is a subtransaction, so callers try the lock first and call this only if it
-- is held.
CREATE FUNCTION idem_wait_lock(p_lock bigint, p_shared boolean, p_wait_ms integer,
                               p_lease_ms integer)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    setting text;
    got boolean := true;
BEGIN
    setting := set_config('lock_timeout', p_wait_ms::text, true);
    BEGIN
        IF p_shared THEN
            PERFORM pg_advisory_xact_lock_shared(p_lock);
        ELSE
            PERFORM pg_advisory_xact_lock(p_lock);
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        got := false;
    END;
    setting := set_config('lock_timeout', p_lease_ms::text, true);
    RETURN got;
END $$;

-- Round trip 1 of a group: claims the group's keys (and message ids), reads what they
-- hold, and locks and reads what the decisions of the claimed commands read, then takes
-- the facts' numbers. One row per command (`r_i`, from 1, in arrival order), with
-- `r_state`:
-- - 'claimed': the key was absent and its lock is ours; `r_seq` is the fact's number; for
--   a refund, `r_withdrawal_seq`/`r_withdrawal` are its withdrawal's fact (if any);
-- - 'seen': the key was there; `r_hash`, `r_seq`, `r_body` are its fingerprint and fact;
-- - 'message_reused': the message id was claimed with another fingerprint, `r_hash`;
-- - 'in_flight': a twin's claim (or a refund's withdrawal's) was held past the wait;
-- - 'vanished': a row that blocked the claim was gone when read.
-- `r_message_claimed` says the command's message id was inserted into the inbox by this
-- call. Rows with `r_i` = 0 come first: 'refunded' (`r_client`, `r_name` = the
-- withdrawal, `r_total`) and 'account' (`r_name`, `r_currency`, `r_balance`), as locked.
-- The accounts are locked by an index scan in name order (bitmap scans off): it needs no
-- sort, and it marks the index entries of dead row versions as dead as it passes them,
-- which a bitmap scan never does, so a hot account's many versions are not visited again
-- by every later lock until vacuum runs.
CREATE FUNCTION idem_claim_group(
    p_client text[], p_key text[], p_hash bytea[], p_at timestamptz, p_wait_ms integer,
    p_message text[], p_message_fp bytea[], p_withdrawal text[], p_account text[],
    p_lease_ms integer)
RETURNS TABLE (
    r_i integer, r_state text, r_message_claimed boolean, r_hash bytea, r_seq bigint,
    r_body bytea, r_withdrawal_seq bigint, r_withdrawal bytea, r_client text, r_name text,
    r_currency text, r_balance text, r_total bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
    SET enable_bitmapscan = off AS $$
DECLARE
    n integer := coalesce(cardinality(p_key), 0);
    st text[] := array_fill(NULL::text, ARRAY[n]);
    mc boolean[] := array_fill(false, ARRAY[n]);
    hs bytea[] := array_fill(NULL::bytea, ARRAY[n]);
    sq bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    bd bytea[] := array_fill(NULL::bytea, ARRAY[n]);
    wsq bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    wbd bytea[] := array_fill(NULL::bytea, ARRAY[n]);
    wacc text[] := array_fill(NULL::text, ARRAY[n]);
    messages boolean := cardinality(array_remove(p_message, NULL)) > 0;
    refunds boolean := cardinality(array_remove(p_withdrawal, NULL)) > 0;
    ordered integer[];
    j integer;
    v_hash bytea;
    v_seq bigint;
    v_body bytea;
    v_account text;
    r record;
BEGIN
    -- A group of one deposit or withdrawal without a message id (a lane's command with
    -- nothing queued behind it) takes the statements of one command: one key read and one
    -- account lock by the account's name, where the general body below runs a join over
    -- the group's arrays, a lock on a list of names built by a subquery and a scan of
    -- seven arrays for the answer (1.5-2 times the claim's CPU on a hot account). The
    -- same locks in the same order (the key's, then the account's), the same rows.
    IF n = 1 AND p_message[1] IS NULL AND p_withdrawal[1] IS NULL THEN
        r_message_claimed := false;
        IF NOT pg_try_advisory_xact_lock(idem_claim_lock('k', p_client[1], p_key[1]))
           AND NOT idem_wait_lock(idem_claim_lock('k', p_client[1], p_key[1]), false,
                                  p_wait_ms, p_lease_ms) THEN
            r_i := 1;
            r_state := 'in_flight';
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT k.request_hash, k.seq, f.body INTO r_hash, r_seq, r_body
          FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq
         WHERE k.client = p_client[1] AND k.key = p_key[1];
        IF FOUND THEN
            r_i := 1;
            r_state := 'seen';
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT a.account, a.currency, a.balance::text INTO r_name, r_currency, r_balance
          FROM accounts a WHERE a.account = p_account[1] FOR UPDATE;
        IF FOUND THEN
            r_i := 0;
            r_state := 'account';
            r_message_claimed := NULL;
            RETURN NEXT;
            r_message_claimed := false;
            r_name := NULL;
            r_currency := NULL;
            r_balance := NULL;
        END IF;
        r_i := 1;
        r_state := 'claimed';
        r_seq := nextval('fact_seq');
        RETURN NEXT;
        RETURN;
    END IF;
    -- The keys' claims, in the order of their locks (by hash, then arrival). A lock free
    -- at once costs no subtransaction; only a lock held by another is waited for, at most
    -- the in-flight wait, in idem_wait_lock's block that catches the timeout.
    IF n = 1 THEN
        ordered := ARRAY[1];
    ELSE
        ordered := ARRAY(SELECT x.j FROM unnest(p_client, p_key) WITH ORDINALITY AS x(c, k, j)
                          ORDER BY idem_claim_lock('k', x.c, x.k), x.j);
    END IF;
    FOREACH j IN ARRAY ordered LOOP
        IF NOT pg_try_advisory_xact_lock(idem_claim_lock('k', p_client[j], p_key[j]))
           AND NOT idem_wait_lock(idem_claim_lock('k', p_client[j], p_key[j]), false,
                                  p_wait_ms, p_lease_ms) THEN
            st[j] := 'in_flight';
        END IF;
    END LOOP;
    IF messages THEN
        FOR j IN SELECT x.j FROM unnest(p_message) WITH ORDINALITY AS x(m, j)
                 WHERE x.m IS NOT NULL AND st[x.j] IS NULL
                 ORDER BY idem_claim_lock('m', x.m, ''), x.j LOOP
            IF NOT pg_try_advisory_xact_lock(idem_claim_lock('m', p_message[j], ''))
               AND NOT idem_wait_lock(idem_claim_lock('m', p_message[j], ''), false,
                                      p_wait_ms, p_lease_ms) THEN
                st[j] := 'in_flight';
            END IF;
        END LOOP;
        -- The inbox in arrival order: a message id met twice in the group is inserted by
        -- the first and read back by the second.
        FOR j IN 1..n LOOP
            CONTINUE WHEN st[j] IS NOT NULL OR p_message[j] IS NULL;
            INSERT INTO inbox (message_id, fingerprint, client, key, at)
            VALUES (p_message[j], p_message_fp[j], p_client[j], p_key[j], p_at)
            ON CONFLICT (message_id) DO NOTHING;
            mc[j] := FOUND;
            IF NOT mc[j] THEN
                SELECT i.fingerprint INTO v_hash FROM inbox i WHERE i.message_id = p_message[j];
                IF NOT FOUND THEN
                    st[j] := 'vanished';
                ELSIF v_hash <> p_message_fp[j] THEN
                    st[j] := 'message_reused';
                    hs[j] := v_hash;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- Every key still undecided, in one statement, whose snapshot is taken after every
    -- key's lock was granted: the keys found are 'seen', the others are claimed.
    FOR r IN SELECT x.j, k.request_hash, k.seq, f.body
               FROM unnest(p_client, p_key, st) WITH ORDINALITY AS x(c, k, s, j)
               JOIN idempotency_keys k ON k.client = x.c AND k.key = x.k
               LEFT JOIN facts f ON f.seq = k.seq
              WHERE x.s IS NULL LOOP
        st[r.j] := 'seen';
        hs[r.j] := r.request_hash;
        sq[r.j] := r.seq;
        bd[r.j] := r.body;
    END LOOP;
    FOR j IN 1..n LOOP
        IF st[j] IS NULL THEN
            st[j] := 'claimed';
        END IF;
    END LOOP;
    -- A claimed refund reads its withdrawal.
    IF refunds THEN
        refunds := false;
        FOR j IN 1..n LOOP
            CONTINUE WHEN st[j] <> 'claimed' OR p_withdrawal[j] IS NULL;
            SELECT f.seq, f.body, f.doc ->> 'account' INTO v_seq, v_body, v_account
              FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
             WHERE k.client = p_client[j] AND k.key = p_withdrawal[j];
            IF NOT FOUND THEN
                -- The withdrawal may be in flight: wait for its claim, shared, at most
                -- the in-flight wait, and read it again.
                IF NOT idem_wait_lock(idem_claim_lock('k', p_client[j], p_withdrawal[j]),
                                      true, p_wait_ms, p_lease_ms) THEN
                    st[j] := 'in_flight';
                    -- Nothing of it stays: its message is delivered again.
                    IF mc[j] THEN
                        DELETE FROM inbox WHERE message_id = p_message[j];
                        mc[j] := false;
                    END IF;
                    CONTINUE;
                END IF;
                SELECT f.seq, f.body, f.doc ->> 'account' INTO v_seq, v_body, v_account
                  FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
                 WHERE k.client = p_client[j] AND k.key = p_withdrawal[j];
            END IF;
            IF FOUND THEN
                wsq[j] := v_seq;
                wbd[j] := v_body;
                wacc[j] := v_account;
                refunds := true;
            END IF;
        END LOOP;
    END IF;
    -- What the claimed commands' decisions read, locked in the global order: refunded
    -- totals, then accounts (an index scan in name order, so no sort).
    IF refunds THEN
        RETURN QUERY
            SELECT 0, 'refunded', NULL::boolean, NULL::bytea, NULL::bigint, NULL::bytea,
                   NULL::bigint, NULL::bytea, x.client::text, x.withdrawal::text, NULL::text,
                   NULL::text, x.total
              FROM refunded x
             WHERE (x.client, x.withdrawal) IN (
                   SELECT p_client[g], p_withdrawal[g] FROM generate_series(1, n) g
                    WHERE st[g] = 'claimed' AND wsq[g] IS NOT NULL)
             ORDER BY x.client, x.withdrawal FOR UPDATE;
    END IF;
    RETURN QUERY
        SELECT 0, 'account', NULL::boolean, NULL::bytea, NULL::bigint, NULL::bytea,
               NULL::bigint, NULL::bytea, NULL::text, a.account::text, a.currency,
               a.balance::text, NULL::bigint
          FROM accounts a
         WHERE a.account = ANY (ARRAY(
                   SELECT x.a FROM unnest(p_account, st) AS x(a, s)
                    WHERE x.s = 'claimed' AND x.a IS NOT NULL
                   UNION ALL
                   SELECT w FROM unnest(wacc) AS w WHERE w IS NOT NULL))
         ORDER BY a.account FOR UPDATE;
    -- The facts' numbers, after the locks (per account, the order of numbers is the order
    -- of the changes) and in arrival order.
    FOR j IN 1..n LOOP
        IF st[j] = 'claimed' THEN
            sq[j] := nextval('fact_seq');
        END IF;
    END LOOP;
    RETURN QUERY
        SELECT x.j::integer, x.s, x.m, x.h, x.q, x.b, x.ws, x.wb, NULL::text, NULL::text,
               NULL::text, NULL::text, NULL::bigint
          FROM unnest(st, mc, hs, sq, bd, wsq, wbd) WITH ORDINALITY AS x(s, m, h, q, b, ws, wb, j);
END $$;

-- Round trip 2 of a group: writes what the group's decisions give, each write checked
-- against them, in the global order: user accounts (net change and the balance after,
-- per account), refunded totals (per withdrawal), the system shards (per account and
-- currency), the counters (per name), then the facts, the keys' rows (done, with their
-- outcome), the inbox's answers, the inbox rows of commands that were told 409 (their
-- message comes again) and the quarantined messages. Any disagreement raises IDM01 and
-- nothing is committed.
CREATE FUNCTION idem_apply_group(
    p_at timestamptz, p_shard smallint,
    p_seq bigint[], p_client text[], p_key text[], p_kind text[], p_rejection text[],
    p_body bytea[], p_doc jsonb[], p_response text[], p_hash bytea[],
    p_account text[], p_currency text[], p_delta text[], p_exists boolean[], p_after text[],
    p_rclient text[], p_rwithdrawal text[], p_refund bigint[], p_withdrawn bigint[],
    p_rexists boolean[], p_rafter bigint[],
    p_system text[], p_scurrency text[], p_sdelta text[],
    p_counter text[], p_count bigint[],
    p_message text[], p_message_seq bigint[], p_forget text[],
    p_qmessage text[], p_qreason text[], p_qpayload text[])
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    j integer;
    v_balance numeric;
    v_total bigint;
    v_rows bigint;
    v_account text;
    v_after text;
BEGIN
    -- The accounts the claim locked, in one guarded statement (a row whose balance would
    -- not end where the decisions say is not changed, and the count tells); then the new
    -- ones, in name order.
    IF true = ANY (p_exists) THEN
        UPDATE accounts a SET balance = a.balance + x.d::numeric
          FROM unnest(p_account, p_currency, p_delta, p_after, p_exists)
               AS x(acc, cur, d, aft, ex)
         WHERE x.ex AND a.account = x.acc AND a.currency = x.cur
           AND a.balance + x.d::numeric = x.aft::numeric;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> cardinality(array_remove(p_exists, false)) THEN
            SELECT x.acc, a.balance, x.aft INTO v_account, v_balance, v_after
              FROM unnest(p_account, p_after, p_exists) AS x(acc, aft, ex)
              LEFT JOIN accounts a ON a.account = x.acc
             WHERE x.ex AND a.balance IS DISTINCT FROM x.aft::numeric LIMIT 1;
            RAISE EXCEPTION '%''s balance is %, from which the decisions do not give %',
                v_account, v_balance, v_after USING ERRCODE = 'IDM01';
        END IF;
    END IF;
    IF false = ANY (p_exists) THEN
        INSERT INTO accounts (account, currency, balance)
        SELECT x.acc, x.cur, x.d::numeric
          FROM unnest(p_account, p_currency, p_delta, p_after, p_exists)
               WITH ORDINALITY AS x(acc, cur, d, aft, ex, o)
         WHERE NOT x.ex AND x.d = x.aft
         ORDER BY x.o;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> cardinality(array_remove(p_exists, true)) THEN
            RAISE EXCEPTION 'a new account''s first change is not its balance'
                USING ERRCODE = 'IDM01';
        END IF;
    END IF;
    FOR j IN 1..coalesce(cardinality(p_rwithdrawal), 0) LOOP
        IF p_rexists[j] THEN
            UPDATE refunded SET total = total + p_refund[j]
             WHERE client = p_rclient[j] AND withdrawal = p_rwithdrawal[j]
               AND total + p_refund[j] <= withdrawn
            RETURNING total INTO v_total;
        ELSE
            INSERT INTO refunded (client, withdrawal, withdrawn, total)
            VALUES (p_rclient[j], p_rwithdrawal[j], p_withdrawn[j], p_refund[j])
            RETURNING total INTO v_total;
        END IF;
        IF v_total IS DISTINCT FROM p_rafter[j] THEN
            RAISE EXCEPTION 'the refunded total of % is %, the decision gives %',
                p_rwithdrawal[j], v_total, p_rafter[j] USING ERRCODE = 'IDM01';
        END IF;
    END LOOP;
    IF cardinality(p_system) > 0 THEN
        INSERT INTO system_balances (account, currency, shard, balance)
        SELECT x.a, x.c, p_shard, x.d::numeric
          FROM unnest(p_system, p_scurrency, p_sdelta) WITH ORDINALITY AS x(a, c, d, o)
         ORDER BY x.o
        ON CONFLICT (account, currency, shard)
        DO UPDATE SET balance = system_balances.balance + EXCLUDED.balance;
    END IF;
    -- A second fact or row for a key is a unique violation: the group is run again, and
    -- finds the key.
    IF cardinality(p_seq) > 0 THEN
        INSERT INTO facts (seq, at, client, key, kind, rejection, body, doc)
        SELECT x.s, p_at, x.c, x.k, x.kind, x.r, x.b, x.d
          FROM unnest(p_seq, p_client, p_key, p_kind, p_rejection, p_body, p_doc)
               AS x(s, c, k, kind, r, b, d);
        INSERT INTO idempotency_keys (client, key, request_hash, status, created_at, seq, response)
        SELECT x.c, x.k, x.h, 'done', p_at, x.s, x.r
          FROM unnest(p_client, p_key, p_hash, p_seq, p_response) AS x(c, k, h, s, r);
        INSERT INTO counters (name, shard, n)
        SELECT x.c, p_shard, x.n FROM unnest(p_counter, p_count) WITH ORDINALITY AS x(c, n, o)
         ORDER BY x.o
        ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n;
    END IF;
    IF coalesce(cardinality(p_message), 0) > 0 THEN
        UPDATE inbox i SET seq = x.s FROM unnest(p_message, p_message_seq) AS x(m, s)
         WHERE i.message_id = x.m;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> cardinality(p_message) THEN
            RAISE EXCEPTION '% of the group''s % inbox rows are missing',
                cardinality(p_message) - v_rows, cardinality(p_message) USING ERRCODE = 'IDM01';
        END IF;
    END IF;
    IF coalesce(cardinality(p_forget), 0) > 0 THEN
        DELETE FROM inbox WHERE message_id = ANY (p_forget) AND seq IS NULL;
    END IF;
    IF cardinality(p_qmessage) > 0 THEN
        INSERT INTO quarantine (at, message_id, reason, payload)
        SELECT p_at, x.m, x.r, x.p FROM unnest(p_qmessage, p_qreason, p_qpayload) AS x(m, r, p);
    END IF;
END $$;

-- Round trip 2 of a group of one fact that moves at most one user account and one system
-- account, with no refund, no message and nothing to quarantine (a lane's command with
-- nothing queued behind it: every group at 1 connection). The same writes, guards, order
-- and errors as idem_apply_group for such a group, with the fact's values as scalars and
-- one statement per row: idem_apply_group's joins with arrays and scans of them cost about
-- twice the CPU for one fact.
CREATE FUNCTION idem_apply_one(
    p_at timestamptz, p_shard smallint,
    p_seq bigint, p_client text, p_key text, p_kind text, p_rejection text,
    p_body bytea, p_doc jsonb, p_response text, p_hash bytea,
    p_account text, p_currency text, p_delta text, p_exists boolean, p_after text,
    p_system text, p_scurrency text, p_sdelta text,
    p_counter text, p_count bigint)
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    v_balance numeric;
BEGIN
    IF p_account IS NOT NULL AND p_exists THEN
        UPDATE accounts a SET balance = a.balance + p_delta::numeric
         WHERE a.account = p_account AND a.currency = p_currency
           AND a.balance + p_delta::numeric = p_after::numeric;
        IF NOT FOUND THEN
            SELECT a.balance INTO v_balance FROM accounts a WHERE a.account = p_account;
            RAISE EXCEPTION '%''s balance is %, from which the decisions do not give %',
                p_account, v_balance, p_after USING ERRCODE = 'IDM01';
        END IF;
    ELSIF p_account IS NOT NULL THEN
        IF p_delta IS DISTINCT FROM p_after THEN
            RAISE EXCEPTION 'a new account''s first change is not its balance'
                USING ERRCODE = 'IDM01';
        END IF;
        INSERT INTO accounts (account, currency, balance)
        VALUES (p_account, p_currency, p_delta::numeric);
    END IF;
    IF p_system IS NOT NULL THEN
        INSERT INTO system_balances (account, currency, shard, balance)
        VALUES (p_system, p_scurrency, p_shard, p_sdelta::numeric)
        ON CONFLICT (account, currency, shard)
        DO UPDATE SET balance = system_balances.balance + EXCLUDED.balance;
    END IF;
    -- A second fact or row for a key is a unique violation: the group is run again, and
    -- finds the key.
    INSERT INTO facts (seq, at, client, key, kind, rejection, body, doc)
    VALUES (p_seq, p_at, p_client, p_key, p_kind, p_rejection, p_body, p_doc);
    INSERT INTO idempotency_keys (client, key, request_hash, status, created_at, seq, response)
    VALUES (p_client, p_key, p_hash, 'done', p_at, p_seq, p_response);
    INSERT INTO counters (name, shard, n) VALUES (p_counter, p_shard, p_count)
    ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + EXCLUDED.n;
END $$;

-- ---- Names of the build that migrates to version 12 ------------------------------------
--
-- A worker of that build may still run while a database is upgraded; it calls these
-- names, and each passes its arguments on to the function of its role, so both builds
-- run the same bodies and take the same locks.

CREATE FUNCTION idem_group_claim_v8(
    p_client text[], p_key text[], p_hash bytea[], p_at timestamptz, p_wait_ms integer,
    p_message text[], p_message_fp bytea[], p_withdrawal text[], p_account text[],
    p_lease_ms integer)
RETURNS TABLE (
    r_i integer, r_state text, r_message_claimed boolean, r_hash bytea, r_seq bigint,
    r_body bytea, r_withdrawal_seq bigint, r_withdrawal bytea, r_client text, r_name text,
    r_currency text, r_balance text, r_total bigint)
LANGUAGE sql AS $$
    SELECT * FROM idem_claim_group(p_client, p_key, p_hash, p_at, p_wait_ms, p_message,
                                   p_message_fp, p_withdrawal, p_account, p_lease_ms)
$$;

CREATE FUNCTION idem_group_apply_v12(
    p_at timestamptz, p_shard smallint,
    p_seq bigint[], p_client text[], p_key text[], p_kind text[], p_rejection text[],
    p_body bytea[], p_doc jsonb[], p_response text[], p_hash bytea[],
    p_account text[], p_currency text[], p_delta text[], p_exists boolean[], p_after text[],
    p_rclient text[], p_rwithdrawal text[], p_refund bigint[], p_withdrawn bigint[],
    p_rexists boolean[], p_rafter bigint[],
    p_system text[], p_scurrency text[], p_sdelta text[],
    p_counter text[], p_count bigint[],
    p_message text[], p_message_seq bigint[], p_forget text[],
    p_qmessage text[], p_qreason text[], p_qpayload text[])
RETURNS void
LANGUAGE sql AS $$
    SELECT idem_apply_group(p_at, p_shard, p_seq, p_client, p_key, p_kind, p_rejection,
                            p_body, p_doc, p_response, p_hash, p_account, p_currency,
                            p_delta, p_exists, p_after, p_rclient, p_rwithdrawal, p_refund,
                            p_withdrawn, p_rexists, p_rafter, p_system, p_scurrency,
                            p_sdelta, p_counter, p_count, p_message, p_message_seq,
                            p_forget, p_qmessage, p_qreason, p_qpayload)
$$;

CREATE FUNCTION idem_apply_one_v12(
    p_at timestamptz, p_shard smallint,
    p_seq bigint, p_client text, p_key text, p_kind text, p_rejection text,
    p_body bytea, p_doc jsonb, p_response text, p_hash bytea,
    p_account text, p_currency text, p_delta text, p_exists boolean, p_after text,
    p_system text, p_scurrency text, p_sdelta text,
    p_counter text, p_count bigint)
RETURNS void
LANGUAGE sql AS $$
    SELECT idem_apply_one(p_at, p_shard, p_seq, p_client, p_key, p_kind, p_rejection,
                          p_body, p_doc, p_response, p_hash, p_account, p_currency,
                          p_delta, p_exists, p_after, p_system, p_scurrency, p_sdelta,
                          p_counter, p_count)
$$;
