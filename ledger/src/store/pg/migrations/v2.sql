-- Idem on PostgreSQL, schema version 2: the command's transaction as two functions.
--
-- The statements are the seed's (claim ON CONFLICT DO NOTHING, lock, guarded update with
-- its affected-row check, the fact, the key's outcome), in the same single transaction;
-- only where they run changes. Sent one by one they cost a protocol exchange each
-- (bind, execute, sync) and a round trip per dependent step: thirteen messages and five
-- round trips for a withdrawal. Here a withdrawal is BEGIN + idem_claim, then
-- idem_apply + COMMIT: two round trips, four messages. The decision itself stays in the
-- worker (`core::decide`, shared with sled), between the two calls.
--
-- The CHECK constraints of version 1 are folded into one per table: PostgreSQL parses and
-- plans every CHECK expression again for each statement that writes the table, so three
-- checks on the key row cost three times one. What they require is unchanged.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_status_check,
    DROP CONSTRAINT idempotency_keys_check,
    DROP CONSTRAINT idempotency_keys_check1,
    ADD CONSTRAINT idempotency_keys_state CHECK (CASE status
        WHEN 'pending' THEN seq IS NULL AND response IS NULL
        WHEN 'done' THEN seq IS NOT NULL AND response IS NOT NULL
        WHEN 'expired' THEN seq IS NOT NULL AND response IS NULL
        ELSE false END);
ALTER TABLE accounts
    DROP CONSTRAINT accounts_account_check,
    DROP CONSTRAINT accounts_balance_check,
    ADD CONSTRAINT accounts_row CHECK (account NOT LIKE '@%' AND balance >= 0);

-- Errors: a claim that waits longer than the in-flight wait for a twin's uncommitted row
-- answers state 'in_flight' (never an error, so no other lock timeout is mistaken for
-- it); a write that disagrees with the decision raises SQLSTATE IDM01, which aborts the
-- transaction, so the COMMIT sent behind it rolls back.

-- The advisory lock that is the claim on a key ('k', client, key) or on a message id
-- ('m', id, ''): a 64-bit hash of the names, the first one length-prefixed so that no two
-- pairs spell the same text. Two claims whose hashes collide only wait for each other.
CREATE FUNCTION idem_claim_lock(kind text, a text, b text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended(kind || length(a) || ':' || a || b, 7157) $$;

-- Locks what deciding a command on `p_account` (and, for a refund, the withdrawal
-- `p_withdrawal` of `p_client`) reads, then takes the fact's number. The number is taken
-- after the locks so that, per account and per withdrawal, the order of numbers is the
-- order of the changes (what `verify` folds). Runs after idem_claim in the same
-- transaction, which left lock_timeout at the lease: each lock waits at most that.
CREATE FUNCTION idem_lock(
    p_account text, p_client text, p_withdrawal text,
    OUT currency text, OUT balance text, OUT refunded bigint, OUT seq bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_withdrawal IS NOT NULL THEN
        SELECT r.total INTO refunded FROM refunded r
         WHERE r.client = p_client AND r.withdrawal = p_withdrawal FOR UPDATE;
    END IF;
    IF p_account IS NOT NULL THEN
        SELECT a.currency, a.balance::text INTO currency, balance FROM accounts a
         WHERE a.account = p_account FOR UPDATE;
    END IF;
    seq := nextval('fact_seq');
END $$;

-- Claims the message id (if any) and the key, waiting at most `p_wait_ms` for a twin.
--
-- A twin is recognised by a transaction-scoped advisory lock on the key (and one on the
-- message id), taken before the rows are inserted and held to the end of the
-- transaction. Only that wait is bounded by `p_wait_ms`: bounding the inserts instead
-- would also cut short waits that have nothing to do with a twin (PostgreSQL's lock on
-- extending the table, taken under a burst of inserts), and turn them into false 409s
-- for new keys; the inserts wait at most the lease.
--
-- `state` says what happened:
-- - 'claimed': both are ours. For a deposit or a withdrawal (`p_account` given) the
--   account is locked too and `seq` taken; for a refund `withdrawal_seq` and
--   `withdrawal` are the withdrawal's fact, and the worker calls idem_lock once it has
--   read the account from it.
-- - 'seen': the key was there; `hash`, `seq` and `body` are its fingerprint and fact.
-- - 'message_reused': the message id was claimed with another fingerprint, `hash`.
-- - 'in_flight': a twin's claim was held longer than the wait.
-- - 'vanished': a row that blocked the claim was gone when read (a twin rolled back
--   between the two statements); a new attempt will claim it.
CREATE FUNCTION idem_claim(
    p_client text, p_key text, p_hash bytea, p_at timestamptz, p_wait_ms integer,
    p_message text, p_message_fp bytea, p_withdrawal text, p_account text,
    p_lease_ms integer,
    OUT state text, OUT message_claimed boolean, OUT hash bytea, OUT seq bigint,
    OUT body bytea, OUT withdrawal_seq bigint, OUT withdrawal bytea, OUT currency text,
    OUT balance text)
LANGUAGE plpgsql AS $$
DECLARE
    key_claimed boolean;
    setting text;
BEGIN
    message_claimed := false;
    -- Assignments, not PERFORM: plpgsql evaluates a simple expression without starting
    -- an executor.
    setting := set_config('lock_timeout', p_wait_ms::text, true);
    BEGIN
        PERFORM pg_advisory_xact_lock(idem_claim_lock('k', p_client, p_key));
        IF p_message IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(idem_claim_lock('m', p_message, ''));
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        state := 'in_flight';
        RETURN;
    END;
    setting := set_config('lock_timeout', p_lease_ms::text, true);
    IF p_message IS NOT NULL THEN
        INSERT INTO inbox (message_id, fingerprint, client, key, at)
        VALUES (p_message, p_message_fp, p_client, p_key, p_at)
        ON CONFLICT (message_id) DO NOTHING;
        message_claimed := FOUND;
    END IF;
    INSERT INTO idempotency_keys (client, key, request_hash, status, created_at)
    VALUES (p_client, p_key, p_hash, 'pending', p_at)
    ON CONFLICT (client, key) DO NOTHING;
    key_claimed := FOUND;
    IF p_message IS NOT NULL AND NOT message_claimed THEN
        SELECT i.fingerprint INTO hash FROM inbox i WHERE i.message_id = p_message;
        IF NOT FOUND THEN
            state := 'vanished';
            RETURN;
        END IF;
        IF hash <> p_message_fp THEN
            state := 'message_reused';
            RETURN;
        END IF;
    END IF;
    IF NOT key_claimed THEN
        SELECT k.request_hash, k.seq, f.body INTO hash, seq, body
          FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq
         WHERE k.client = p_client AND k.key = p_key;
        state := CASE WHEN FOUND THEN 'seen' ELSE 'vanished' END;
        RETURN;
    END IF;
    state := 'claimed';
    IF p_withdrawal IS NOT NULL THEN
        SELECT f.seq, f.body INTO withdrawal_seq, withdrawal
          FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
         WHERE k.client = p_client AND k.key = p_withdrawal;
    ELSIF p_account IS NOT NULL THEN
        SELECT l.currency, l.balance, l.seq INTO currency, balance, seq
          FROM idem_lock(p_account, NULL, NULL) l;
    END IF;
END $$;

-- Writes what the decision gives and checks every write against it: the user's balance
-- after (`p_delta` signed; a withdrawal's update is guarded by balance >= amount), the
-- system account's shard, the refunded total, the fact, the key's outcome, the counter
-- and the inbox row. Any disagreement raises IDM01 and nothing is committed.
CREATE FUNCTION idem_apply(
    p_seq bigint, p_at timestamptz, p_client text, p_key text, p_kind text,
    p_rejection text, p_body bytea, p_doc jsonb, p_response jsonb,
    p_counter text, p_shard smallint,
    p_account text, p_currency text, p_delta bigint, p_account_exists boolean,
    p_balance_after text,
    p_system text, p_system_delta bigint,
    p_withdrawal text, p_refund bigint, p_withdrawn bigint, p_refunded_exists boolean,
    p_refunded_after bigint,
    p_message text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_balance numeric;
    v_total bigint;
    n bigint;
BEGIN
    IF p_delta IS NOT NULL THEN
        IF p_delta < 0 THEN
            UPDATE accounts SET balance = balance + p_delta
             WHERE account = p_account AND currency = p_currency AND balance >= -p_delta
            RETURNING balance INTO v_balance;
        ELSIF p_account_exists THEN
            UPDATE accounts SET balance = balance + p_delta
             WHERE account = p_account AND currency = p_currency
            RETURNING balance INTO v_balance;
        ELSE
            INSERT INTO accounts (account, currency, balance)
            VALUES (p_account, p_currency, p_delta)
            RETURNING balance INTO v_balance;
        END IF;
        IF v_balance IS DISTINCT FROM p_balance_after::numeric THEN
            RAISE EXCEPTION '%''s balance became %, the decision gives %',
                p_account, v_balance, p_balance_after USING ERRCODE = 'IDM01';
        END IF;
    END IF;
    IF p_withdrawal IS NOT NULL THEN
        IF p_refunded_exists THEN
            UPDATE refunded SET total = total + p_refund
             WHERE client = p_client AND withdrawal = p_withdrawal
               AND total + p_refund <= withdrawn
            RETURNING total INTO v_total;
        ELSE
            INSERT INTO refunded (client, withdrawal, withdrawn, total)
            VALUES (p_client, p_withdrawal, p_withdrawn, p_refund)
            RETURNING total INTO v_total;
        END IF;
        IF v_total IS DISTINCT FROM p_refunded_after THEN
            RAISE EXCEPTION 'the refunded total of % is %, the decision gives %',
                p_withdrawal, v_total, p_refunded_after USING ERRCODE = 'IDM01';
        END IF;
    END IF;
    -- The system shard, the fact, the counter and the key's outcome in one statement: one
    -- executor start instead of four. The upserts and the insert each write exactly one
    -- row or raise; the key's update is the one whose rows are counted.
    WITH system AS (
        INSERT INTO system_balances (account, currency, shard, balance)
        SELECT p_system, p_currency, p_shard, p_system_delta WHERE p_system IS NOT NULL
        ON CONFLICT (account, currency, shard)
        DO UPDATE SET balance = system_balances.balance + EXCLUDED.balance
    ), fact AS (
        INSERT INTO facts (seq, at, client, key, kind, rejection, body, doc)
        VALUES (p_seq, p_at, p_client, p_key, p_kind, p_rejection, p_body, p_doc)
    ), counted AS (
        INSERT INTO counters (name, shard, n) VALUES (p_counter, p_shard, 1)
        ON CONFLICT (name, shard) DO UPDATE SET n = counters.n + 1
    )
    UPDATE idempotency_keys SET status = 'done', seq = p_seq, response = p_response
     WHERE client = p_client AND key = p_key AND status = 'pending';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
        RAISE EXCEPTION 'the key % of % was not pending', p_key, p_client
            USING ERRCODE = 'IDM01';
    END IF;
    IF p_message IS NOT NULL THEN
        UPDATE inbox SET seq = p_seq WHERE message_id = p_message;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> 1 THEN
            RAISE EXCEPTION 'the inbox row of % is missing', p_message
                USING ERRCODE = 'IDM01';
        END IF;
    END IF;
END $$;
