-- Idem on PostgreSQL, schema version 3: the command's transaction does less work for the
-- same guarantees (measured in BENCHMARKS.md).
--
-- A profile of PostgreSQL under 64 connections (perf, the postgres processes) showed a
-- tenth of its time in `fmgr_sql`, parsing and planning idem_claim_lock's body on every
-- call: the planner inlines an IMMUTABLE SQL function only when its body is immutable
-- too, and `text || integer` (anytextcat) is merely stable. `length(a)::text` spells the
-- same text with immutable parts, so the hashes, and the locks, are the ones version 2
-- takes: workers of both versions still exclude each other.
CREATE OR REPLACE FUNCTION idem_claim_lock(kind text, a text, b text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended(kind || length(a)::text || ':' || a || b, 7157) $$;

-- The key's row is written once, done, by idem_apply_v3, instead of inserted pending here
-- and updated at the end. The claim has been the advisory lock since version 2: every
-- writer of a key holds it from before it reads the key to its commit, so a twin that
-- gets the lock after the first committed reads the first's row (each statement of READ
-- COMMITTED reads a snapshot taken after the lock was granted), and no two transactions
-- that both found the key absent overlap. The primary key still refuses a second row.
-- One heap tuple instead of two and no update: the update of `status` could never be a
-- HOT update, since the sweep's partial index is on it, so it wrote a new entry in both
-- indexes, and left a dead tuple for vacuum.
--
-- idem_claim_v3 answers as idem_claim (version 2) does, with these changes:
-- - 'claimed' means the key was absent and its lock is ours; nothing is inserted;
-- - the advisory locks are assignments, which PL/pgSQL evaluates as simple expressions,
--   where PERFORM starts an executor;
-- - a deposit's or a withdrawal's account is locked here, not through a call of
--   idem_lock (a function scan, then its own statement).
-- The functions of version 2 stay for workers of the previous build during an upgrade:
-- they take the same advisory locks, so both kinds exclude each other on a key.
CREATE FUNCTION idem_claim_v3(
    p_client text, p_key text, p_hash bytea, p_at timestamptz, p_wait_ms integer,
    p_message text, p_message_fp bytea, p_withdrawal text, p_account text,
    p_lease_ms integer,
    OUT state text, OUT message_claimed boolean, OUT hash bytea, OUT seq bigint,
    OUT body bytea, OUT withdrawal_seq bigint, OUT withdrawal bytea, OUT currency text,
    OUT balance text)
LANGUAGE plpgsql AS $$
DECLARE
    setting text;
BEGIN
    message_claimed := false;
    setting := set_config('lock_timeout', p_wait_ms::text, true);
    BEGIN
        -- pg_advisory_xact_lock returns void; as text it is '' and the assignment is a
        -- simple expression.
        setting := pg_advisory_xact_lock(idem_claim_lock('k', p_client, p_key))::text;
        IF p_message IS NOT NULL THEN
            setting := pg_advisory_xact_lock(idem_claim_lock('m', p_message, ''))::text;
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
    SELECT k.request_hash, k.seq, f.body INTO hash, seq, body
      FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq
     WHERE k.client = p_client AND k.key = p_key;
    IF FOUND THEN
        state := 'seen';
        RETURN;
    END IF;
    state := 'claimed';
    IF p_withdrawal IS NOT NULL THEN
        SELECT f.seq, f.body INTO withdrawal_seq, withdrawal
          FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
         WHERE k.client = p_client AND k.key = p_withdrawal;
    ELSIF p_account IS NOT NULL THEN
        -- idem_lock's account step: the lock, then the number (see idem_lock).
        SELECT a.currency, a.balance::text INTO currency, balance FROM accounts a
         WHERE a.account = p_account FOR UPDATE;
        seq := nextval('fact_seq');
    END IF;
END $$;

-- idem_apply (version 2) with the key's row inserted, done, where version 2 updated the
-- pending row idem_claim had inserted; `p_hash` is the key's fingerprint.
CREATE FUNCTION idem_apply_v3(
    p_seq bigint, p_at timestamptz, p_client text, p_key text, p_kind text,
    p_rejection text, p_body bytea, p_doc jsonb, p_response jsonb,
    p_counter text, p_shard smallint,
    p_account text, p_currency text, p_delta bigint, p_account_exists boolean,
    p_balance_after text,
    p_system text, p_system_delta bigint,
    p_withdrawal text, p_refund bigint, p_withdrawn bigint, p_refunded_exists boolean,
    p_refunded_after bigint,
    p_message text, p_hash bytea)
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
    -- The system shard, the fact, the counter and the key's row in one statement: one
    -- executor start instead of four. Each writes exactly one row or raises (a second row
    -- for the key is a unique violation, and the attempt is retried, to find it).
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
    INSERT INTO idempotency_keys (client, key, request_hash, status, created_at, seq, response)
    VALUES (p_client, p_key, p_hash, 'done', p_at, p_seq, p_response);
    IF p_message IS NOT NULL THEN
        UPDATE inbox SET seq = p_seq WHERE message_id = p_message;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> 1 THEN
            RAISE EXCEPTION 'the inbox row of % is missing', p_message
                USING ERRCODE = 'IDM01';
        END IF;
    END IF;
END $$;
