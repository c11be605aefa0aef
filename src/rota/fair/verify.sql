-- The fair claim's contract, executable (docs/fast-claim.md, "The contract"): every
-- invariant the claim's exactness rests on, recounted from jobs in one read-only
-- statement (one snapshot, so a live queue can be checked without stopping it: every
-- writer keeps jobs and the bookkeeping equal within its own transaction). One row per
-- violation: the group, the invariant broken, the value the jobs say it should have
-- (expected) and the value kept (found). No row: the bookkeeping is exact.
--
--   served      served_n + the group's fair_served deltas at or above the type's fold
--               mark (those the claim reads) = its running jobs plus its
--               done jobs finished at or after the type's edge (fair_edge; no row:
--               -infinity). A moved or damaged edge shows here, in the groups whose
--               done jobs it moved across.
--   row         a group with pending jobs has a fair_groups row.
--   ready_lb    ready_lb <= run_after of every pending job of the group.
--   head        for every pending job j of the group:
--               (head_lb, head_id) <= (j.created_at, j.id) or head_until <= j.run_after;
--               expected names the first job that breaks it, found the row's bounds.
--   plan        fair_groups.plan is the plan of rota's groups table (no row: none).
--   active      fair_groups.active is that table's active (no row: true).
--   fair_plans  every plan a type's groups have is listed in fair_plans.
--   mark        no fair_served delta of the group lies below its type's newest fold
--               mark (fair_fold_mark; no row: 0): the claim would not read it.
--
-- Values are text; timestamps print in the session's TimeZone (FairClaim.verify sets
-- UTC). Cost: one pass over the jobs that are pending, running or done (done history
-- is bounded by pruning), and over the bookkeeping tables.
-- Needs: no parameters.
WITH marks AS (
    SELECT t.type, coalesce(max(m.upto), '0') AS upto
    FROM (SELECT DISTINCT fs.type FROM {schema}.fair_served fs) t
    LEFT JOIN {schema}.fair_fold_mark m ON m.type = t.type
    GROUP BY t.type
),
counted AS (
    SELECT j.type, j.group_id,
           count(*) FILTER (WHERE j.status = 'running'
                              OR (j.status = 'done'
                                  AND j.finished_at >= coalesce(e.edge, '-infinity')))
             AS served,
           count(*) FILTER (WHERE j.status = 'pending') AS pending,
           min(j.run_after) FILTER (WHERE j.status = 'pending') AS ready
    FROM {schema}.jobs j
    LEFT JOIN {schema}.fair_edge e ON e.type = j.type
    WHERE j.group_id IS NOT NULL AND j.status IN ('pending', 'running', 'done')
    GROUP BY j.type, j.group_id
),
kept AS (
    SELECT k.type, k.group_id, sum(k.n) AS served
    FROM (SELECT fg.type, fg.group_id, fg.served_n AS n FROM {schema}.fair_groups fg
          UNION ALL
          SELECT fs.type, fs.group_id, fs.n FROM {schema}.fair_served fs
          JOIN marks m ON m.type = fs.type
          WHERE fs.xid >= m.upto) k
    GROUP BY k.type, k.group_id
),
violations AS (
    SELECT coalesce(c.type, k.type) AS type, coalesce(c.group_id, k.group_id) AS group_id,
           'served' AS invariant,
           coalesce(c.served, 0)::text AS expected, coalesce(k.served, 0)::text AS found
    FROM counted c
    FULL JOIN kept k ON k.type = c.type AND k.group_id = c.group_id
    WHERE coalesce(c.served, 0) <> coalesce(k.served, 0)
    UNION ALL
    SELECT c.type, c.group_id, 'row',
           'a fair_groups row (' || c.pending || ' pending jobs)', 'none'
    FROM counted c
    WHERE c.pending > 0
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                      WHERE fg.type = c.type AND fg.group_id = c.group_id)
    UNION ALL
    SELECT c.type, c.group_id, 'ready_lb', '<= ' || c.ready, fg.ready_lb::text
    FROM counted c
    JOIN {schema}.fair_groups fg ON fg.type = c.type AND fg.group_id = c.group_id
    WHERE c.pending > 0 AND fg.ready_lb > c.ready
    UNION ALL
    (SELECT DISTINCT ON (fg.type, fg.group_id) fg.type, fg.group_id, 'head',
            '(head_lb, head_id) <= (' || j.created_at || ', ' || j.id
            || ') or head_until <= ' || j.run_after,
            '(' || fg.head_lb || ', ' || fg.head_id || '), head_until ' || fg.head_until
     FROM {schema}.fair_groups fg
     JOIN {schema}.jobs j
       ON j.type = fg.type AND j.group_id = fg.group_id AND j.status = 'pending'
     WHERE (j.created_at, j.id) < (fg.head_lb, fg.head_id) AND j.run_after < fg.head_until
     ORDER BY fg.type, fg.group_id, j.created_at, j.id)
    UNION ALL
    SELECT fg.type, fg.group_id, 'plan', quote_nullable(g.plan), quote_nullable(fg.plan)
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
    WHERE fg.plan IS DISTINCT FROM g.plan
    UNION ALL
    SELECT fg.type, fg.group_id, 'active', coalesce(g.active, true)::text, fg.active::text
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
    WHERE fg.active IS DISTINCT FROM coalesce(g.active, true)
    UNION ALL
    SELECT fg.type, fg.group_id, 'fair_plans',
           'plan ' || quote_literal(fg.plan) || ' listed', 'not listed'
    FROM {schema}.fair_groups fg
    WHERE fg.plan IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_plans p
                      WHERE p.type = fg.type AND p.plan = fg.plan)
    UNION ALL
    SELECT fs.type, fs.group_id, 'mark', 'deltas at or above mark ' || m.upto,
           count(*) || ' below it, from xid ' || min(fs.xid)
    FROM {schema}.fair_served fs
    JOIN marks m ON m.type = fs.type
    WHERE fs.xid < m.upto
    GROUP BY fs.type, fs.group_id, m.upto
)
SELECT v.type, v.group_id, v.invariant, v.expected, v.found
FROM violations v
ORDER BY v.type, v.group_id, v.invariant
