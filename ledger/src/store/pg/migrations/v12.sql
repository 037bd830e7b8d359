-- Idem on PostgreSQL, schema version 12: the stored response as text.
--
-- A response was stored as jsonb, with its digest over `jsonb_send` (version 6). Each
-- write made the server parse the worker's JSON into jsonb, print it again for the
-- digest and hash that: about 5 µs a row, against 3 µs for hashing the text. The
-- worker now writes the response as the text jsonb prints (keys shortest first, ", " and
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

-- The apply functions of versions 8 and 11 again under new names, taking the responses as
-- text. Each is made from its definition as installed, changing only its name and that
-- argument's type, so the two stay the same in all else: body, comments and the plan
-- settings version 9 gave the group's.
DO $$
DECLARE
    f record;
    def text;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('idem_group_apply_v8', 'idem_group_apply_v12', 'p_response jsonb[]', 'p_response text[]'),
        ('idem_apply_one_v11', 'idem_apply_one_v12', 'p_response jsonb,', 'p_response text,'))
        AS x(old, new, arg, as_text)
    LOOP
        def := pg_get_functiondef(f.old::regproc);
        IF position(f.old || '(' IN def) = 0 OR position(f.arg IN def) = 0 THEN
            RAISE EXCEPTION 'the definition of % is not the one expected', f.old;
        END IF;
        EXECUTE replace(replace(def, f.old || '(', f.new || '('), f.arg, f.as_text);
    END LOOP;
END $$;
