-- Idem on PostgreSQL, schema version 4: the rules on rows are checked the same, at less
-- cost per command (measured in BENCHMARKS.md).
--
-- The rules on accounts move from table CHECKs to domains, with what they require
-- unchanged: a user account is not named like a system one, a system account is, and a
-- user's balance is never negative. A table's CHECK is read back from its stored form and
-- planned again for every statement that writes the table (PostgreSQL keeps no compiled
-- copy between statements): `ExecConstraints` was 6.4–9.4 % of the server's samples at
-- 64 connections (perf on the postgres processes). A domain's checks are planned once per
-- session and kept. Changing the types rewrites both tables once.
CREATE DOMAIN idem_user_account AS text COLLATE "C" CHECK (VALUE NOT LIKE '@%');
CREATE DOMAIN idem_system_account AS text COLLATE "C" CHECK (VALUE LIKE '@%');
CREATE DOMAIN idem_user_balance AS numeric(39, 0) CHECK (VALUE >= 0);
ALTER TABLE accounts
    DROP CONSTRAINT accounts_row,
    ALTER COLUMN account TYPE idem_user_account,
    ALTER COLUMN balance TYPE idem_user_balance;
ALTER TABLE system_balances
    DROP CONSTRAINT system_balances_account_check,
    ALTER COLUMN account TYPE idem_system_account;

-- The rule on a key's row stays a table CHECK (it spans three columns), with the same
-- meaning, but as a call of a PL/pgSQL function: the CASE spelled in the CHECK was read
-- back and planned for every insert, and cost about 16 µs of the server's time per row
-- against 6 µs for the call (pgbench inserting into a copy of the table).
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
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_state,
    ADD CONSTRAINT idempotency_keys_state
        CHECK (idem_key_state_ok(status, seq IS NULL, response IS NULL));
