-- Quota usage of periods that began before the retention cutoff is history.
DELETE FROM {schema}.quota_usage
WHERE period_start < now() + %(offset)s::interval - %(retention)s::interval
