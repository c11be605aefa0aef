-- Dashboard `/`, `/fairness` and the rota_oldest_pending_age_seconds gauge: the groups
-- whose oldest due job may have waited longest, per type, with how long it has: since
-- its run_after, or since its creation when that is later (as `rota depth` counts it).
-- Groups in paused groups are left out; jobs with no group count as one more "group".
-- Bounded, without reading the backlog (bench/RESULTS.md has what reading every pending
-- job cost at 1,000,000 pending): the claim's bookkeeping fair_groups (docs/fast-claim.md) keeps,
-- per type and group, head_lb and head_until such that every pending job has
-- head_lb <= created_at or head_until <= run_after, and ready_lb <= every pending
-- run_after. So a group's due jobs have waited since no earlier than
-- `bound` = least(head_lb, head_until) (greatest(run_after, created_at) is at least
-- each), a group with ready_lb or bound in the future has no due job, and only the
-- %(k)s groups of each type with the lowest bounds are probed, each on its first 20
-- due jobs by creation (jobs_pending_idx, index-only).
-- `next_bound` is the bound of the first group not probed, in seconds since the epoch
-- (NULL: all groups were probed): a type's answer is exact when its oldest probed
-- due_since is <= next_bound, as every group not probed has waited since no earlier
-- than that; otherwise the caller asks again with a larger k
-- (rota.web.queries.oldest_due).
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
paused AS (
    SELECT g.group_id FROM {groups} g WHERE NOT g.active
),
candidates AS (
    SELECT t.type, x.group_id, x.bound, x.n
    FROM unnest(%(types)s::text[]) AS t(type)
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        SELECT y.group_id, y.bound, row_number() OVER (ORDER BY y.bound, y.group_id) AS n
        FROM (
            SELECT f.group_id, least(f.head_lb, f.head_until) AS bound
            FROM {schema}.fair_groups f
            LEFT JOIN paused z ON z.group_id = f.group_id
            WHERE f.type = t.type AND z.group_id IS NULL
              AND f.ready_lb <= c.now
              AND least(f.head_lb, f.head_until) <= c.now
            ORDER BY 2, 1
            LIMIT %(k)s + 1
        ) y
    ) x
),
next_bounds AS (
    SELECT cd.type, extract(epoch FROM cd.bound)::float8 AS next_bound
    FROM candidates cd WHERE cd.n = %(k)s + 1
),
probed AS (
    SELECT cd.type, cd.group_id, cd.bound
    FROM candidates cd
    WHERE cd.n <= %(k)s
    UNION ALL
    SELECT t.type, NULL, '-infinity'::timestamptz
    FROM unnest(%(types)s::text[]) AS t(type)
)
SELECT p.type, p.group_id,
       (SELECT g.plan FROM {groups} g WHERE g.group_id = p.group_id) AS plan,
       CASE WHEN p.group_id IS NULL THEN
           (SELECT min(greatest(j.run_after, j.created_at)) FROM (
                SELECT s.run_after, s.created_at FROM {schema}.jobs s
                WHERE s.status = 'pending' AND s.type = p.type AND s.group_id IS NULL
                  AND s.run_after <= c.now
                ORDER BY s.created_at
                LIMIT 20) j)
       ELSE
           (SELECT min(greatest(j.run_after, j.created_at)) FROM (
                SELECT s.run_after, s.created_at FROM {schema}.jobs s
                WHERE s.status = 'pending' AND s.type = p.type AND s.group_id = p.group_id
                  AND s.run_after <= c.now
                ORDER BY s.created_at
                LIMIT 20) j)
       END AS due_since,
       nb.next_bound,
       c.now
FROM probed p
CROSS JOIN clock c
LEFT JOIN next_bounds nb ON nb.type = p.type
