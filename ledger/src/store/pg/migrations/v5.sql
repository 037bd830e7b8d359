-- Idem on PostgreSQL, schema version 5: a refund is not decided against a withdrawal that
-- is still in flight.
--
-- A refund names its withdrawal by key, and idem_claim_v3 reads that key's row as
-- committed. A withdrawal whose transaction holds the key's claim (its advisory lock) and
-- has not committed has no row yet, so a refund that overtook it was decided as
-- withdrawal_not_found, which is stored under the refund's key and final. When the
-- withdrawal's row is missing, the worker now calls idem_withdrawal_v5 before deciding:
-- it waits for the withdrawal key's advisory lock at most the in-flight wait, as a twin
-- waits for its first, and reads the row again once the lock is granted (a new statement,
-- so a snapshot taken after any withdrawal that held the lock has committed or rolled
-- back). If the wait runs out, the answer is 'in_flight' and the refund is told 409,
-- with nothing stored.
--
-- The lock is taken in shared mode: refunds of one withdrawal do not exclude each other,
-- only the withdrawal's own claim (exclusive) does. Being transaction-scoped, it is held
-- until the refund commits, so a withdrawal of that key that arrives meanwhile waits for
-- the refund's commit as it would for a twin (and is told 409 if that takes longer than
-- the in-flight wait); it only happens for a refund whose withdrawal was not there, and
-- such a refund is one round trip from its commit.
--
-- `state`: 'settled' (the lock was granted; `withdrawal_seq` and `withdrawal` are the
-- withdrawal's fact, or NULL if there is none) or 'in_flight'.
CREATE FUNCTION idem_withdrawal_v5(
    p_client text, p_withdrawal text, p_wait_ms integer, p_lease_ms integer,
    OUT state text, OUT withdrawal_seq bigint, OUT withdrawal bytea)
LANGUAGE plpgsql AS $$
DECLARE
    setting text;
BEGIN
    setting := set_config('lock_timeout', p_wait_ms::text, true);
    BEGIN
        setting := pg_advisory_xact_lock_shared(
            idem_claim_lock('k', p_client, p_withdrawal))::text;
    EXCEPTION WHEN lock_not_available THEN
        state := 'in_flight';
        RETURN;
    END;
    setting := set_config('lock_timeout', p_lease_ms::text, true);
    state := 'settled';
    SELECT f.seq, f.body INTO withdrawal_seq, withdrawal
      FROM idempotency_keys k JOIN facts f ON f.seq = k.seq
     WHERE k.client = p_client AND k.key = p_withdrawal;
END $$;
