-- `rota limits`, the dashboard's quotas page and the rate gauges: every bucket with its
-- settings, the queue's clock now, units taken in the current fixed window of `per`
-- (0 once that window has passed), the jobs waiting for it (deferred for its units and
-- not due yet) and the earliest of their due times.
SELECT b.name, b.key, b.limit_units, extract(epoch FROM b.per)::float8 AS per_s,
       b.burst, extract(epoch FROM b.emission)::float8 AS emission_s,
       CASE WHEN isfinite(b.tat) THEN b.tat END AS tat,
       c.now,
       CASE WHEN c.now < b.window_start + b.per THEN b.window_units ELSE 0 END
           AS window_units,
       CASE WHEN isfinite(b.window_start) THEN b.window_start END AS window_start,
       CASE WHEN c.now < b.window_start + b.per THEN b.prev_units
            WHEN c.now < b.window_start + 2 * b.per THEN b.window_units
            ELSE 0 END AS prev_units,
       b.taken, b.refused, b.backoff_until, b.updated_at,
       coalesce(w.waiting, 0) AS waiting, w.next_wake
FROM {schema}.rate_buckets b
CROSS JOIN (SELECT clock_timestamp() + %(offset)s::interval AS now) c
LEFT JOIN LATERAL (
    SELECT count(*) AS waiting, min(j.run_after) AS next_wake
    FROM {schema}.rate_waits rw
    JOIN {schema}.jobs j
      ON j.id = rw.job_id AND j.status = 'pending' AND j.run_after = rw.until
    WHERE rw.name = b.name AND rw.key = b.key AND rw.until > c.now
) w ON true
WHERE %(name)s::text IS NULL OR b.name = %(name)s::text
ORDER BY b.name, b.key
LIMIT %(limit)s
