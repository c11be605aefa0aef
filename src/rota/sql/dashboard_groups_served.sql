-- Dashboard `/fairness`: the groups served most in the last hour (the cost charged to
-- the jobs done then, all types: docs/design.md, "Cost"), with their plan and how many
-- jobs that was. Index-only reads of jobs_done_idx (type, finished_at, group_id)
-- INCLUDE (cost) per type; the groups relation is looked up for the top groups only.
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
served AS (
    SELECT d.group_id, count(*) AS done, sum(d.cost) AS charged
    FROM ({done_last_hour}) d
    WHERE d.group_id IS NOT NULL
    GROUP BY d.group_id
    ORDER BY sum(d.cost) DESC, d.group_id
    LIMIT %(limit)s
)
SELECT s.group_id, g.plan, s.done, s.charged
FROM served s
LEFT JOIN {groups} g ON g.group_id = s.group_id
ORDER BY s.charged DESC, s.group_id
