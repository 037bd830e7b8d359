-- Idem on PostgreSQL, schema version 12: the stored response as text.
--
-- A response was stored as jsonb, with its digest over `jsonb_send` (version 6). Each
-- write made the server parse the worker's JSON into jsonb, print it again for the
-- digest and hash that: about 5 µs a row, against 3 µs for hashing the text. The
-- worker writes the response as the text jsonb prints (keys shortest first, ", " and
-- ": " between items), so a row written before this version, cast to text here, and one
-- written after read alike; the digest is the first 16 bytes of SHA-256 over that text's
-- bytes, which the server takes without parsing it. `verify` still compares 16 bytes per
-- key with the digest of the answer it renders from the fact.
--
-- A generated column takes only immutable functions. `convert_to` is marked stable
-- because its result depends on the database's encoding, which a database never changes,
-- so within one database the bytes of a text are a function of the text alone:
-- idem_utf8 says so. (MD5 of the text, immutable as shipped, costs the server about
-- 0.6 µs a row less, and the verify more: it checks a digest per key on the client, where
-- SHA-256 runs on the processor's SHA instructions and MD5 does not.)
--
-- The column changes type and its digest is computed again: the table is rewritten once.
-- Version 8's and 11's apply functions stay: a worker of an earlier build still running
-- writes jsonb into the text column through its assignment cast, which prints it in the
-- same form.
CREATE FUNCTION idem_utf8(t text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT convert_to(t, 'UTF8') $$;

ALTER TABLE idempotency_keys
    DROP COLUMN response_digest,
    ALTER COLUMN response TYPE text USING response::text,
    ADD COLUMN response_digest bytea
        GENERATED ALWAYS AS (substring(sha256(idem_utf8(response)) FOR 16)) STORED;

-- The apply functions of versions 8 and 11 under new names, taking the responses as text:
-- idem_group_apply_v8 with its plan settings of version 9, and idem_apply_one_v11; in all
-- else (body, comments, settings) each is the same as the function it is made from.
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

CREATE FUNCTION idem_apply_one_v12(
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
