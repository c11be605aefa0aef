-- Dashboard `/fairness`: the owners served most in the last hour (the cost charged to
-- the jobs done then, all types: docs/design.md, "Cost"), with their plan, how many
-- jobs that was and how many of their groups had work done (docs/design.md, "The fair
-- claim": a group without an owner is its own). Index-only reads of jobs_done_idx per
-- type; the groups relation is looked up for the groups done.
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
done AS (
    SELECT d.group_id, count(*) AS done, sum(d.cost) AS charged
    FROM ({done_last_hour}) d
    WHERE d.group_id IS NOT NULL
    GROUP BY d.group_id
),
owned AS (
    SELECT coalesce(g.owner_id::text, dn.group_id) AS owner_id, g.owner_id IS NULL AS own,
           g.plan::text AS plan, dn.done, dn.charged
    FROM done dn
    LEFT JOIN {groups} g ON g.group_id = dn.group_id
)
SELECT o.owner_id, o.own, min(o.plan) AS plan, count(*) AS groups, sum(o.done)::bigint AS done,
       sum(o.charged) AS charged
FROM owned o
GROUP BY o.owner_id, o.own
ORDER BY sum(o.charged) DESC, o.owner_id
LIMIT %(limit)s
