-- A rate limit's bucket without taking from it: the queue's clock now and the instant
-- the bucket is full again (NULL: no take yet, so it is full), for the runner's look
-- before a claim (docs/design.md, "Rates").
SELECT clock_timestamp() + %(offset)s::interval AS now,
       (SELECT CASE WHEN isfinite(tat) THEN tat END FROM {schema}.rate_buckets WHERE name = %(name)s AND key = %(key)s)
           AS tat
