-- Dashboard: one job page with its group's plan, the run that claimed it last, and
-- every failed attempt's error, oldest first (docs/design.md, "Results").
SELECT j.*, g.plan, g.active AS group_active,
       r.started_at AS run_started_at, r.stop_reason AS run_stop_reason,
       {job_errors} AS errors
FROM {schema}.jobs j
LEFT JOIN {groups} g ON g.group_id = j.group_id
LEFT JOIN {schema}.runs r ON r.id = j.run_id
WHERE j.id = %(id)s
