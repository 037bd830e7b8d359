-- Idem on PostgreSQL, schema version 7: a user account's statement.
--
-- A statement lists one account's movements in seq order, a page at a time. The facts
-- table has the account only in `doc` (the fact as the API shows it), so this index is on
-- that expression, for movements only (a rejection moves nothing). PostgreSQL keeps it
-- in the transaction that writes the fact, with no change to the command's functions: a
-- page is an index range scan of its account, however long the log.
--
-- Paging by the last seq read misses nothing: a movement takes its seq while it holds its
-- account's row lock (idem_claim_v3, idem_lock), so no movement of an account commits
-- after another of the same account with a higher seq.
CREATE INDEX facts_by_account ON facts ((doc ->> 'account'), seq)
    WHERE kind <> 'CommandRejected';
