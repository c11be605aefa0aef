-- Metrics: finished runs by stop reason, for the rota_runs_total counter. Maintenance
-- prunes runs started over 30 days ago (runs_retention), so the count falls at a prune
-- (a counter reset to Prometheus); a killed run is counted once maintenance marks it. It reads the runs table whole: one row per run, small next to jobs
-- (3 ms at 10,080 runs, a week of one run a minute).
SELECT stop_reason, count(*) AS n
FROM {schema}.runs
WHERE stop_reason IS NOT NULL
GROUP BY stop_reason
ORDER BY stop_reason
