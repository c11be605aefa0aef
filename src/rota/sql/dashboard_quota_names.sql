-- Dashboard `/quotas` when the dashboard was given no quota objects: the shared quotas
-- that have usage rows from the last two days (their limits and time zones live in the
-- application's code, not in the database). quota_usage is pruned (maintenance), so
-- reading it whole stays small.
SELECT u.quota, max(u.period_start) AS period_start,
       (array_agg(u.units ORDER BY u.period_start DESC))[1] AS units
FROM {schema}.quota_usage u
WHERE u.scope_key = '' AND u.period_start > now() + %(offset)s::interval - interval '2 days'
GROUP BY u.quota
ORDER BY u.quota
