-- Dashboard `/quotas` and the quota gauges: units used in the current period of each
-- shared quota (0 when nothing was spent yet), one primary-key probe each.
SELECT q.quota, coalesce(u.units, 0) AS used
FROM unnest(%(quotas)s::text[], %(period_starts)s::timestamptz[]) AS q(quota, period_start)
LEFT JOIN {schema}.quota_usage u
  ON u.quota = q.quota AND u.scope_key = '' AND u.period_start = q.period_start
