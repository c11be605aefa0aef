-- Units of a quota spent in one period (0 when nothing was spent yet).
SELECT coalesce(
    (SELECT units FROM {schema}.quota_usage
     WHERE quota = %(quota)s AND scope_key = %(scope_key)s
       AND period_start = %(period_start)s),
    0) AS units
