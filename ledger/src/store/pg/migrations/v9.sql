-- Idem on PostgreSQL, schema version 9: a group's claim reads its keys in one statement.
--
-- Version 8's claim read each command's key with a statement of its own, in a loop over
-- the group: an executor start (a nested loop, two index scans), a plan-cache lookup and
-- the index probes per command, the larger part of the claim's cost across many accounts
-- (perf on the postgres processes at 64 connections). This version replaces the body of
-- idem_group_claim_v8, with the same arguments and the same answers (states, columns,
-- order), and with the same locks taken in the same order; what changes is how many
-- statements run:
-- - the keys are read with one join of the group's (client, key) pairs against
--   `idempotency_keys` once every key's advisory lock is held (each statement of READ
--   COMMITTED reads a snapshot taken when it starts, so after every lock was granted: a
--   key's row committed by a twin that held its lock before is seen, as in version 8);
-- - the inbox is claimed, in arrival order, by a loop over the commands that carry a
--   message id only, and a refund's withdrawal is read by a loop over the refunds only;
-- - the locked rows and the commands' rows come back with one statement each.
-- Workers of the previous build call the same function, so they get the new body too.

CREATE OR REPLACE FUNCTION idem_group_claim_v8(
    p_client text[], p_key text[], p_hash bytea[], p_at timestamptz, p_wait_ms integer,
    p_message text[], p_message_fp bytea[], p_withdrawal text[], p_account text[],
    p_lease_ms integer)
RETURNS TABLE (
    r_i integer, r_state text, r_message_claimed boolean, r_hash bytea, r_seq bigint,
    r_body bytea, r_withdrawal_seq bigint, r_withdrawal bytea, r_client text, r_name text,
    r_currency text, r_balance text, r_total bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
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

-- Both functions plan their statements once per session. PL/pgSQL plans a statement with
-- parameters for their values five times, then keeps that custom planning for good if
-- the generic plan's estimate is not lower, and the estimates of arrays of unknown length
-- made that choice differ from one database to the next: in some, the apply's statements
-- were planned again on every call (4 % of the server's time at 64 connections, perf on
-- the postgres processes). The generic plans are the ones wanted at any group size: index
-- probes per command into the keys, the accounts and the facts.
ALTER FUNCTION idem_group_apply_v8(
    timestamptz, smallint, bigint[], text[], text[], text[], text[], bytea[], jsonb[],
    jsonb[], bytea[], text[], text[], text[], boolean[], text[], text[], text[], bigint[],
    bigint[], boolean[], bigint[], text[], text[], text[], text[], bigint[], text[],
    bigint[], text[], text[], text[], text[])
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
