-- Idem on PostgreSQL, schema version 10: the group's lock on its accounts planned as an
-- index scan.
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
