-- queue.result (docs/design.md, "Results"): one job with its return value and every
-- failed attempt's error, oldest first.
-- run_worker: the process holding or having completed it (host:pid; NULL once its
-- run is pruned).
SELECT j.*,
       {job_errors} AS errors,
       (SELECT r.worker FROM {schema}.runs r WHERE r.id = j.run_id) AS run_worker,
       -- false: its group is paused, so it waits (NULL: no group, or none found).
       (SELECT g.active FROM {groups} g WHERE g.group_id = j.group_id) AS group_active
FROM {schema}.jobs j
WHERE j.id = %(id)s
