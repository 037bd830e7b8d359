-- Idem on PostgreSQL, schema version 10: less work per command in a group's transaction,
-- for the same guarantees.
--
-- The log's unique index on (client, key) goes. It repeated the keys' primary key: every
-- fact is written in the transaction that writes its key's row, by the same statement
-- sequence over the same arrays (idem_group_apply_v8; idem_apply_v3 and idem_apply before
-- it), and nothing deletes a key's row (the sweep only marks it expired), so a second fact
-- for a key would come with a second row for the key, which the primary key refuses, and
-- the transaction with it. One effect per key is still what `verify` checks on the log
-- itself. The index was one of the five each command inserts into, on a key spread over
-- the whole index like the primary key's, about 3 % of the server's time at 64
-- connections (perf on the postgres processes).
ALTER TABLE facts DROP CONSTRAINT facts_one_per_key;

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
