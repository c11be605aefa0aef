-- Spend units of a quota, atomically: the row for (quota, scope, period) is created or
-- updated only while the total stays within the limit. A concurrent spender waits on
-- the row lock and its WHERE is re-checked against the committed total, so N spenders
-- never exceed the limit. No row returned: the units are not available.
INSERT INTO {schema}.quota_usage AS u (quota, scope_key, period_start, units, updated_at)
SELECT %(quota)s, %(scope_key)s, %(period_start)s, %(units)s, now() + %(offset)s::interval
WHERE %(units)s::bigint <= %(limit)s::bigint
ON CONFLICT (quota, scope_key, period_start) DO UPDATE
SET units = u.units + excluded.units,
    updated_at = excluded.updated_at
WHERE u.units + excluded.units <= %(limit)s::bigint
RETURNING u.units
