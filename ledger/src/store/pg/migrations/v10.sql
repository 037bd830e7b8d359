-- Idem on PostgreSQL, schema version 10: the group's lock on its accounts planned as an
-- index scan, and a group of one claimed by the statements of one command.
--
-- The claim locks the group's accounts with an index scan in name order instead of a
-- bitmap scan and a sort. A bitmap scan never marks the index entries of dead row
-- versions as dead, which a plain index scan does as it passes them: a hot account's row,
-- updated by every group, leaves an entry per version that moved to another page, and
-- with bitmap scans every later lock visits them all again until vacuum runs. The scan
-- reads the index in its order, so the rows are still locked in name order (the global
-- order of version 8) and the sort is gone. What the function answers is unchanged.
ALTER FUNCTION idem_group_claim_v8(
    text[], text[], bytea[], timestamptz, integer, text[], bytea[], text[], text[], integer)
    SET enable_bitmapscan = off;


-- The claim answers a group of one deposit or withdrawal without a message id with the
-- statements of version 3 for one command; any other group runs version 9's body. What
-- it answers, and the locks it takes in their order, are unchanged. At 1 connection on a
-- hot account every group is of one, and the set-based body cost 1.5-2 times the CPU of
-- version 3's claim there (a group of one on one account row); the settings are
-- those above, which a replaced function takes from its new definition.
CREATE OR REPLACE FUNCTION idem_group_claim_v8(
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
    -- A group of one deposit or withdrawal without a message id (a lane's command when
    -- nothing queued behind it): version 3's statements for one command, one key read and
    -- one account lock by the account's name, where the general body below runs a join
    -- over the group's arrays, a lock on a list of names built by a subquery and a scan
    -- of seven arrays for the answer (1.5-2 times the claim's CPU on a hot account).
    -- The same locks in the same order (the key's, then the account's), the same rows.
    IF n = 1 AND p_message[1] IS NULL AND p_withdrawal[1] IS NULL THEN
        r_message_claimed := false;
        IF NOT pg_try_advisory_xact_lock(idem_claim_lock('k', p_client[1], p_key[1]))
           AND NOT idem_wait_lock_v8(idem_claim_lock('k', p_client[1], p_key[1]), false,
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
    -- The keys' claims, in the order of their locks (as version 8).
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
    IF messages THEN
        FOR j IN SELECT x.j FROM unnest(p_message) WITH ORDINALITY AS x(m, j)
                 WHERE x.m IS NOT NULL AND st[x.j] IS NULL
                 ORDER BY idem_claim_lock('m', x.m, ''), x.j LOOP
            IF NOT pg_try_advisory_xact_lock(idem_claim_lock('m', p_message[j], ''))
               AND NOT idem_wait_lock_v8(idem_claim_lock('m', p_message[j], ''), false,
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
    -- Every key still undecided, in one statement: the keys found are 'seen', the others
    -- are claimed.
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
    -- A claimed refund reads its withdrawal (as version 8).
    IF refunds THEN
        refunds := false;
        FOR j IN 1..n LOOP
            CONTINUE WHEN st[j] <> 'claimed' OR p_withdrawal[j] IS NULL;
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
                refunds := true;
            END IF;
        END LOOP;
    END IF;
    -- What the claimed commands' decisions read, locked in the global order: refunded
    -- totals, then accounts (as version 8).
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
    -- The facts' numbers, after the locks and in arrival order (as version 8).
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
