-- Dashboard `/quotas`: per-owner allowances in their current period: how many owners
-- spent some, the units spent in all and the most one owner spent.
SELECT q.quota, count(u.units) AS owners, coalesce(sum(u.units), 0) AS used,
       coalesce(max(u.units), 0) AS most
FROM unnest(%(quotas)s::text[], %(period_starts)s::timestamptz[]) AS q(quota, period_start)
LEFT JOIN {schema}.quota_usage u
  ON u.quota = q.quota AND u.scope_key <> '' AND u.period_start = q.period_start
GROUP BY q.quota
