-- Record a quota as used up for the period (the provider said so, for example the
-- YouTube Data API's quotaExceeded), so every run skips it until the reset.
INSERT INTO {schema}.quota_usage AS u (quota, scope_key, period_start, units, updated_at)
VALUES (%(quota)s, %(scope_key)s, %(period_start)s, %(limit)s, now() + %(offset)s::interval)
ON CONFLICT (quota, scope_key, period_start) DO UPDATE
SET units = greatest(u.units, excluded.units),
    updated_at = excluded.updated_at
