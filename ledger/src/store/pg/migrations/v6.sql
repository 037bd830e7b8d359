-- Idem on PostgreSQL, schema version 6: each stored response carries its digest.
--
-- `verify` checks that every done key's stored response is the answer its fact gives.
-- Reading each response as text made the server render a hundred thousand JSON documents
-- per hundred thousand facts, the bulk of a verify's time. The digest is computed by the
-- server itself whenever a response is written or cleared (a stored generated column), so
-- it always is the digest of the response as stored, and `verify` compares 16 bytes per
-- key with the digest of the answer it renders from the fact.
--
-- jsonb_send is the immutable form of the document's text (a version byte, then the text
-- PostgreSQL prints for jsonb); text casts depend on the encoding and are not allowed in a
-- generated column. Adding the column rewrites the table once.
ALTER TABLE idempotency_keys
    ADD COLUMN response_digest bytea
    GENERATED ALWAYS AS (substring(sha256(jsonb_send(response)) FOR 16)) STORED;
