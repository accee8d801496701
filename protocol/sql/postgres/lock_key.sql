-- First statement of every keyed transaction: serializes same-key submits, cancels and
-- retries, which READ COMMITTED alone lets both insert. The function and the seed 0 are
-- fixed by the protocol, so upstream's keyed operations and ours exclude each other.
-- Released at commit or rollback.
select pg_advisory_xact_lock(hashtextextended(:key::text, 0))
