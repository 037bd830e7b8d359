-- Idem on PostgreSQL, schema version 8: a group of commands in one transaction.
--
-- A worker gathers the commands that arrive while its previous group is in flight and
-- decides them together: one transaction, two round trips and one commit for the whole
-- group instead of per command. The statements are those of version 3 (the key's
-- advisory lock as its claim, the inbox row, the key's read, the locks on what the
-- decision reads, the number taken after them, then the guarded writes), run over arrays
-- in the group's arrival order. The decision stays in the worker (`core::decide`), which
-- carries each account's balance and each withdrawal's refunded total from one command
-- of the group to the next, so a hot account's row is locked and written once per group.
--
-- Locks are taken in one global order, so two groups never wait for each other in a
-- cycle: the keys' advisory locks by their hash, then the message ids' by theirs (each
-- wait bounded by the in-flight wait: it is a twin's), then refunded totals by
-- (client, withdrawal), then user accounts by name; in the writes, system shards by
-- (account, currency) and counters by name. A group only ever waits for a lock that comes
-- later in this order than every lock it holds, except for a refund's shared wait on its
-- withdrawal's claim, which is bounded by the in-flight wait like a twin's.
--
-- Errors: as in version 3, a claim that waits longer than the in-flight wait answers
-- 'in_flight' for that command only; a write that disagrees with the decision raises
-- SQLSTATE IDM01, which aborts the transaction, so the COMMIT behind it rolls back.

-- Claims the group's keys (and message ids), reads what they hold, and locks and reads
-- what the decisions of the claimed commands read. One row per command (`r_i`, from 1, in
-- arrival order), with `r_state`:
-- - 'claimed': the key was absent and its lock is ours; `r_seq` is the fact's number; for
--   a refund, `r_withdrawal_seq`/`r_withdrawal` are its withdrawal's fact (if any);
-- - 'seen': the key was there; `r_hash`, `r_seq`, `r_body` are its fingerprint and fact;
-- - 'message_reused': the message id was claimed with another fingerprint;
-- - 'in_flight': a twin's claim (or a refund's withdrawal's) was held past the wait;
-- - 'vanished': a row that blocked the claim was gone when read.
-- `r_message_claimed` says the command's message id was inserted into the inbox now.
-- Then rows with `r_i` = 0: 'refunded' (`r_client`, `r_name` = the withdrawal, `r_total`)
-- and 'account' (`r_name`, `r_currency`, `r_balance`), as locked.
-- Waits for an advisory lock the caller could not take at once, at most `p_wait_ms`
-- (exclusive, or shared with `p_shared`), then restores the lease as the lock timeout.
-- False: the wait ran out (a twin's claim held past the in-flight wait).
CREATE FUNCTION idem_wait_lock_v8(p_lock bigint, p_shared boolean, p_wait_ms integer,
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

CREATE FUNCTION idem_group_claim_v8(
    p_client text[], p_key text[], p_hash bytea[], p_at timestamptz, p_wait_ms integer,
    p_message text[], p_message_fp bytea[], p_withdrawal text[], p_account text[],
    p_lease_ms integer)
RETURNS TABLE (
    r_i integer, r_state text, r_message_claimed boolean, r_hash bytea, r_seq bigint,
    r_body bytea, r_withdrawal_seq bigint, r_withdrawal bytea, r_client text, r_name text,
    r_currency text, r_balance text, r_total bigint)
LANGUAGE plpgsql AS $$
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
    refunds boolean := false;
    locking text[] := '{}';
    ordered integer[];
    j integer;
    v_hash bytea;
    v_seq bigint;
    v_body bytea;
    v_account text;
    r record;
BEGIN
    -- The keys' claims, in the order of their locks. A lock free now costs no
    -- subtransaction; only a lock that must be waited for is waited for under the
    -- in-flight wait, in a block that catches its timeout.
    -- (A group of one needs no sort, and no statement for it.)
    IF n = 1 THEN
        ordered := ARRAY[1];
    ELSE
        ordered := ARRAY(SELECT x.j FROM unnest(p_client, p_key) WITH ORDINALITY AS x(c, k, j)
                          ORDER BY idem_claim_lock('k', x.c, x.k), x.j);
    END IF;
    FOREACH j IN ARRAY ordered LOOP
        IF NOT pg_try_advisory_xact_lock(idem_claim_lock('k', p_client[j], p_key[j]))
           AND NOT idem_wait_lock_v8(idem_claim_lock('k', p_client[j], p_key[j]), false,
                                     p_wait_ms, p_lease_ms) THEN
            st[j] := 'in_flight';
        END IF;
    END LOOP;
    -- Each statement costs an executor start: the ones a group may not need are skipped.
    IF cardinality(array_remove(p_message, NULL)) > 0 THEN
        FOR j IN SELECT x.j FROM unnest(p_message) WITH ORDINALITY AS x(m, j)
                 WHERE x.m IS NOT NULL AND st[x.j] IS NULL
                 ORDER BY idem_claim_lock('m', x.m, ''), x.j LOOP
            IF NOT pg_try_advisory_xact_lock(idem_claim_lock('m', p_message[j], ''))
               AND NOT idem_wait_lock_v8(idem_claim_lock('m', p_message[j], ''), false,
                                         p_wait_ms, p_lease_ms) THEN
                st[j] := 'in_flight';
            END IF;
        END LOOP;
    END IF;
    -- In arrival order: the inbox, then the key, as version 3 for one command. A message
    -- id met twice in the group is inserted by the first and read back by the second.
    FOR j IN 1..n LOOP
        CONTINUE WHEN st[j] IS NOT NULL;
        IF p_message[j] IS NOT NULL THEN
            INSERT INTO inbox (message_id, fingerprint, client, key, at)
            VALUES (p_message[j], p_message_fp[j], p_client[j], p_key[j], p_at)
            ON CONFLICT (message_id) DO NOTHING;
            mc[j] := FOUND;
            IF NOT mc[j] THEN
                SELECT i.fingerprint INTO v_hash FROM inbox i WHERE i.message_id = p_message[j];
                IF NOT FOUND THEN
                    st[j] := 'vanished';
                    CONTINUE;
                END IF;
                IF v_hash <> p_message_fp[j] THEN
                    st[j] := 'message_reused';
                    hs[j] := v_hash;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        SELECT k.request_hash, k.seq, f.body INTO v_hash, v_seq, v_body
          FROM idempotency_keys k LEFT JOIN facts f ON f.seq = k.seq
         WHERE k.client = p_client[j] AND k.key = p_key[j];
        IF FOUND THEN
            st[j] := 'seen';
            hs[j] := v_hash;
            sq[j] := v_seq;
            bd[j] := v_body;
            CONTINUE;
        END IF;
        st[j] := 'claimed';
        IF p_account[j] IS NOT NULL THEN
            locking := locking || p_account[j];
        END IF;
        IF p_withdrawal[j] IS NOT NULL THEN
            SELECT f.seq, f.body, f.doc ->> 'account' INTO v_seq, v_body, v_account
              FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
             WHERE k.client = p_client[j] AND k.key = p_withdrawal[j];
            IF NOT FOUND THEN
                -- The withdrawal may be in flight (version 5): wait for its claim, shared,
                -- at most the in-flight wait, and read it again.
                IF NOT idem_wait_lock_v8(idem_claim_lock('k', p_client[j], p_withdrawal[j]),
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
                locking := locking || v_account;
                refunds := true;
            END IF;
        END IF;
    END LOOP;
    -- What the claimed commands' decisions read, locked in the global order: refunded
    -- totals, then accounts. ORDER BY comes before the row locks in a locking SELECT, so
    -- the rows are locked in that order.
    r_i := 0;
    IF refunds THEN
        FOR r IN SELECT x.client, x.withdrawal, x.total FROM refunded x
                  WHERE (x.client, x.withdrawal) IN (
                        SELECT p_client[g], p_withdrawal[g] FROM generate_series(1, n) g
                         WHERE st[g] = 'claimed' AND wsq[g] IS NOT NULL)
                  ORDER BY x.client, x.withdrawal FOR UPDATE LOOP
            r_state := 'refunded';
            r_client := r.client;
            r_name := r.withdrawal;
            r_total := r.total;
            RETURN NEXT;
        END LOOP;
    END IF;
    r_client := NULL;
    r_total := NULL;
    FOR r IN SELECT a.account, a.currency, a.balance::text AS balance FROM accounts a
              WHERE a.account = ANY (locking)
              ORDER BY a.account FOR UPDATE LOOP
        r_state := 'account';
        r_name := r.account;
        r_currency := r.currency;
        r_balance := r.balance;
        RETURN NEXT;
    END LOOP;
    r_name := NULL;
    r_currency := NULL;
    r_balance := NULL;
    -- The facts' numbers, after the locks (per account, the order of numbers is the order
    -- of the changes) and in arrival order.
    FOR j IN 1..n LOOP
        IF st[j] = 'claimed' THEN
            sq[j] := nextval('fact_seq');
        END IF;
    END LOOP;
    FOR j IN 1..n LOOP
        r_i := j;
        r_state := st[j];
        r_message_claimed := mc[j];
        r_hash := hs[j];
        r_seq := sq[j];
        r_body := bd[j];
        r_withdrawal_seq := wsq[j];
        r_withdrawal := wbd[j];
        RETURN NEXT;
    END LOOP;
END $$;

-- Writes what the group's decisions give, each write checked against them, in the global
-- order: user accounts (net change and the balance after, per account), refunded totals
-- (per withdrawal), the system shard (per account and currency), the counters (per
-- name), then the facts, the keys' rows (done, with their outcome), the inbox's answers,
-- the inbox rows of commands that were told 409 (their message comes again), and the
-- quarantined messages. Any disagreement raises IDM01 and nothing is committed.
CREATE FUNCTION idem_group_apply_v8(
    p_at timestamptz, p_shard smallint,
    p_seq bigint[], p_client text[], p_key text[], p_kind text[], p_rejection text[],
    p_body bytea[], p_doc jsonb[], p_response jsonb[], p_hash bytea[],
    p_account text[], p_currency text[], p_delta text[], p_exists boolean[], p_after text[],
    p_rclient text[], p_rwithdrawal text[], p_refund bigint[], p_withdrawn bigint[],
    p_rexists boolean[], p_rafter bigint[],
    p_system text[], p_scurrency text[], p_sdelta text[],
    p_counter text[], p_count bigint[],
    p_message text[], p_message_seq bigint[], p_forget text[],
    p_qmessage text[], p_qreason text[], p_qpayload text[])
RETURNS void
LANGUAGE plpgsql AS $$
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
