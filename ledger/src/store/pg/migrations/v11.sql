-- Idem on PostgreSQL, schema version 11: a group of one applied as one command.
--
-- The worker writes a group of one fact that moves at most one user account and one
-- system account, with no refund, no message and nothing to quarantine (a lane's
-- command when nothing queued behind it, so every group at 1 connection) through
-- idem_apply_one_v11, which takes the fact's values as scalars and writes each row with
-- one statement: the guarded update of the account (or the insert of a new one), the
-- system shard's upsert, the fact, the key's row, the counter. The writes, their guards,
-- their order and the errors raised are those of idem_group_apply_v8 for such a group;
-- any other group still goes through it. Version 8's body joins the accounts with five
-- arrays and inserts from scans of seven, each a function scan: for a group of one that
-- was about twice the CPU, and the worker built 33 arrays for it.
CREATE FUNCTION idem_apply_one_v11(
    p_at timestamptz, p_shard smallint,
    p_seq bigint, p_client text, p_key text, p_kind text, p_rejection text,
    p_body bytea, p_doc jsonb, p_response jsonb, p_hash bytea,
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
