-- Idem on PostgreSQL, schema version 13: the functions the worker calls, named by their
-- role, each body written out whole. `schema.sql` beside the migrations is the schema
-- they build, in one file; a test checks that the two agree.
--
-- Each function does what the one it takes over does: the same statements, locks, plan
-- settings and errors. The apply functions' and the wait's bodies are those functions'
-- bodies; the claim's calls idem_wait_lock, and its comments say what each step is for.
--   idem_wait_lock_v8     -> idem_wait_lock     (a bounded wait for a claim's lock)
--   idem_group_claim_v8   -> idem_claim_group   (round trip 1: claim, read, lock, number)
--   idem_group_apply_v12  -> idem_apply_group   (round trip 2: every write, checked)
--   idem_apply_one_v12    -> idem_apply_one     (round trip 2 for a group of one fact)
--
-- A worker of the build that migrates to version 12 may still run while a database is
-- upgraded: the three names it calls stay, each a one-statement SQL function that calls
-- the function of its role, so both builds run the same body and take the same locks.
-- The functions no build from version 12 on calls are dropped: the single-command ones
-- (idem_claim, idem_lock, idem_apply, idem_claim_v3, idem_apply_v3, idem_withdrawal_v5),
-- the apply functions that took the response as jsonb (idem_group_apply_v8,
-- idem_apply_one_v11), and idem_wait_lock_v8, which only idem_group_claim_v8 called.

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

-- The names the build of version 12 calls, each passing its arguments on to the function
-- of its role. A replaced function takes its settings from its new definition: these have
-- none, and the functions they call have theirs.
CREATE OR REPLACE FUNCTION idem_group_claim_v8(
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

CREATE OR REPLACE FUNCTION idem_group_apply_v12(
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

CREATE OR REPLACE FUNCTION idem_apply_one_v12(
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

DROP FUNCTION idem_claim(text, text, bytea, timestamptz, integer, text, bytea, text, text,
                         integer);
DROP FUNCTION idem_lock(text, text, text);
DROP FUNCTION idem_apply(bigint, timestamptz, text, text, text, text, bytea, jsonb, jsonb,
                         text, smallint, text, text, bigint, boolean, text, text, bigint,
                         text, bigint, bigint, boolean, bigint, text);
DROP FUNCTION idem_claim_v3(text, text, bytea, timestamptz, integer, text, bytea, text,
                            text, integer);
DROP FUNCTION idem_apply_v3(bigint, timestamptz, text, text, text, text, bytea, jsonb,
                            jsonb, text, smallint, text, text, bigint, boolean, text, text,
                            bigint, text, bigint, bigint, boolean, bigint, text, bytea);
DROP FUNCTION idem_withdrawal_v5(text, text, integer, integer);
DROP FUNCTION idem_group_apply_v8(timestamptz, smallint, bigint[], text[], text[], text[],
                                  text[], bytea[], jsonb[], jsonb[], bytea[], text[], text[],
                                  text[], boolean[], text[], text[], text[], bigint[],
                                  bigint[], boolean[], bigint[], text[], text[], text[],
                                  text[], bigint[], text[], bigint[], text[], text[], text[],
                                  text[]);
DROP FUNCTION idem_apply_one_v11(timestamptz, smallint, bigint, text, text, text, text,
                                 bytea, jsonb, jsonb, bytea, text, text, text, boolean, text,
                                 text, text, text, text, bigint);
DROP FUNCTION idem_wait_lock_v8(bigint, boolean, integer, integer);
