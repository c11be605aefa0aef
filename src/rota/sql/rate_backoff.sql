-- Hold every taker of a rate limit off for a while (the provider answered 429 with a
-- Retry-After): the bucket's next unit comes no sooner than `until`, and it refills at
-- its rate from there (no burst when a backoff ends). A backoff never shortens one in
-- force, nor forgives units spent after the fact.
WITH c AS (
    SELECT clock_timestamp() + %(offset)s::interval + %(wait)s::interval AS until
)
INSERT INTO {schema}.rate_buckets AS r
    (name, key, tat, limit_units, per, burst, emission, window_start, backoff_until,
     updated_at)
SELECT %(name)s, %(key)s, c.until + (%(burst)s::bigint - 1) * %(emission)s::interval,
       %(limit)s, %(per)s, %(burst)s, %(emission)s, '-infinity', c.until,
       c.until - %(wait)s::interval
FROM c
ON CONFLICT (name, key) DO UPDATE
SET tat = greatest(r.tat, excluded.tat),
    backoff_until = greatest(r.backoff_until, excluded.backoff_until),
    limit_units = excluded.limit_units, per = excluded.per, burst = excluded.burst,
    emission = excluded.emission, updated_at = excluded.updated_at
RETURNING backoff_until
