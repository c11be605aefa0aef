-- Waits for rate-limit units that ended before the retention cutoff are history.
DELETE FROM {schema}.rate_waits
WHERE until < now() + %(offset)s::interval - %(retention)s::interval
