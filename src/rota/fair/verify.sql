-- The fair claim's contract, executable (docs/fast-claim.md, "The contract"): every
-- invariant the claim's exactness rests on, recounted from jobs in one read-only
-- statement (one snapshot, so a live queue can be checked without stopping it: every
-- writer keeps jobs and the bookkeeping equal within its own transaction). One row per
-- violation: the group, the invariant broken, the value the jobs say it should have
-- (expected) and the value kept (found), and for the owners' invariants (owner_served,
-- owner_bound, changes_mark) the owner's row they concern, by plan_key and unit (NULL
-- for the others). No row: the bookkeeping is exact.
--
--   served      served_n + the group's fair_served deltas the type's fold mark does
--               not cover (those the claim reads) = its running jobs plus its
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
--   mark        no fair_served delta of the group is covered by its type's newest fold
--               mark (fair_fold_mark: below upto and not open; no row: 0): the claim
--               would not read it.
--   owner_id    fair_groups.owner_id is the owner of rota's groups table (no row: none).
--   owner_served  each owner's fair_owners.served_n (no row: 0) plus its
--               fair_owner_changes the mark does not cover is the sum of its groups'
--               fair_groups.served_n, by rota's groups table's plan and owner (a group
--               without an owner is its own; group_id names the owner and its plan): a
--               damaged served_n shows here too, a damaged copy of plan or owner only as
--               plan or owner_id.
--   owner_bound for each active group with pending jobs not named in fair_owner_changes
--               the mark does not cover: its owner (as above) has a row, whose (b_served,
--               b_head_lb, b_head_id) <= the group's (served_n, head_lb, head_id) and
--               ready_lb <= the group's ready_lb.
--   changes_mark  no fair_owner_changes row is covered by its type's newest fold mark.
--   floor       for each active group with a head (head_lb < 'infinity') not named in
--               fair_owner_changes the mark does not cover: its (served_n, head_lb,
--               head_id) is at or above its plan's walk floor (fair_walk_floor, level
--               'group'; no row: none), where the claim's walk of the plan starts.
--   owner_floor each fair_owners row with a bound (b_head_lb < 'infinity'): its
--               (served_n, b_served, b_head_lb, b_head_id) is at or above its plan's
--               owner floor (level 'owner'), where the owner walk starts.
--
-- Values are text; timestamps print in the session's TimeZone (FairClaim.verify sets
-- UTC). Cost: one pass over the jobs that are pending, running or done (done history
-- is bounded by pruning), and over the bookkeeping tables.
-- Needs: no parameters.
WITH marks AS (
    SELECT t.type, coalesce(m.upto, '0') AS upto, coalesce(m.open, '{{}}') AS open
    FROM (SELECT fs.type FROM {schema}.fair_served fs
          UNION
          SELECT fc.type FROM {schema}.fair_owner_changes fc
          UNION
          SELECT fg.type FROM {schema}.fair_groups fg) t
    LEFT JOIN LATERAL (SELECT m.upto, m.open FROM {schema}.fair_fold_mark m
                       WHERE m.type = t.type ORDER BY m.upto DESC LIMIT 1) m ON true
),
counted AS (
    SELECT j.type, j.group_id,
           coalesce(sum(j.cost) FILTER (WHERE j.status = 'running'
                                        OR (j.status = 'done'
                                            AND j.finished_at
                                                >= coalesce(e.edge, '-infinity'))), 0)
             AS served,
           count(*) FILTER (WHERE j.status = 'pending') AS pending,
           min(j.run_after) FILTER (WHERE j.status = 'pending') AS ready
    FROM {schema}.jobs j
    LEFT JOIN {schema}.fair_edge e ON e.type = j.type
    WHERE j.group_id IS NOT NULL AND j.status IN ('pending', 'running', 'done')
    GROUP BY j.type, j.group_id
),
-- Each group row's owner, from rota's groups table (a group without one is its own).
owned AS (
    SELECT fg.type, fg.group_id, fg.served_n,
           coalesce('p:' || g.plan, '') AS plan_key,
           CASE WHEN g.owner_id IS NULL THEN 'g:' || fg.group_id
                ELSE 'o:' || g.owner_id END AS unit,
           coalesce(g.active, true) AS active
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
),
kept AS (
    SELECT k.type, k.group_id, sum(k.n) AS served
    FROM (SELECT fg.type, fg.group_id, fg.served_n AS n FROM {schema}.fair_groups fg
          UNION ALL
          SELECT fs.type, fs.group_id, fs.n FROM {schema}.fair_served fs
          JOIN marks m ON m.type = fs.type
          WHERE fs.xid >= m.upto OR fs.xid = ANY (m.open)) k
    GROUP BY k.type, k.group_id
),
violations AS (
    SELECT coalesce(c.type, k.type) AS type, coalesce(c.group_id, k.group_id) AS group_id,
           'served' AS invariant,
           coalesce(c.served, 0)::text AS expected, coalesce(k.served, 0)::text AS found,
           NULL::text AS plan_key, NULL::text AS unit
    FROM counted c
    FULL JOIN kept k ON k.type = c.type AND k.group_id = c.group_id
    WHERE coalesce(c.served, 0) <> coalesce(k.served, 0)
    UNION ALL
    SELECT c.type, c.group_id, 'row',
           'a fair_groups row (' || c.pending || ' pending jobs)', 'none', NULL, NULL
    FROM counted c
    WHERE c.pending > 0
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                      WHERE fg.type = c.type AND fg.group_id = c.group_id)
    UNION ALL
    SELECT c.type, c.group_id, 'ready_lb', '<= ' || c.ready, fg.ready_lb::text, NULL, NULL
    FROM counted c
    JOIN {schema}.fair_groups fg ON fg.type = c.type AND fg.group_id = c.group_id
    WHERE c.pending > 0 AND fg.ready_lb > c.ready
    UNION ALL
    (SELECT DISTINCT ON (fg.type, fg.group_id) fg.type, fg.group_id, 'head',
            '(head_lb, head_id) <= (' || j.created_at || ', ' || j.id
            || ') or head_until <= ' || j.run_after,
            '(' || fg.head_lb || ', ' || fg.head_id || '), head_until ' || fg.head_until,
            NULL, NULL
     FROM {schema}.fair_groups fg
     JOIN {schema}.jobs j
       ON j.type = fg.type AND j.group_id = fg.group_id AND j.status = 'pending'
     WHERE (j.created_at, j.id) < (fg.head_lb, fg.head_id) AND j.run_after < fg.head_until
     ORDER BY fg.type, fg.group_id, j.created_at, j.id)
    UNION ALL
    SELECT fg.type, fg.group_id, 'plan', quote_nullable(g.plan), quote_nullable(fg.plan),
           NULL, NULL
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
    WHERE fg.plan IS DISTINCT FROM g.plan
    UNION ALL
    SELECT fg.type, fg.group_id, 'active', coalesce(g.active, true)::text, fg.active::text,
           NULL, NULL
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
    WHERE fg.active IS DISTINCT FROM coalesce(g.active, true)
    UNION ALL
    SELECT fg.type, fg.group_id, 'fair_plans',
           'plan ' || quote_literal(fg.plan) || ' listed', 'not listed', NULL, NULL
    FROM {schema}.fair_groups fg
    WHERE fg.plan IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_plans p
                      WHERE p.type = fg.type AND p.plan = fg.plan)
    UNION ALL
    SELECT fs.type, fs.group_id, 'mark', 'deltas at or above mark ' || m.upto,
           count(*) || ' below it, from xid ' || min(fs.xid), NULL, NULL
    FROM {schema}.fair_served fs
    JOIN marks m ON m.type = fs.type
    WHERE fs.xid < m.upto AND NOT fs.xid = ANY (m.open)
    GROUP BY fs.type, fs.group_id, m.upto
    UNION ALL
    SELECT fg.type, fg.group_id, 'owner_id', quote_nullable(g.owner_id),
           quote_nullable(fg.owner_id), NULL, NULL
    FROM {schema}.fair_groups fg
    LEFT JOIN {schema}.groups g ON g.group_id = fg.group_id
    WHERE fg.owner_id IS DISTINCT FROM g.owner_id
    UNION ALL
    SELECT coalesce(o.type, s.type), coalesce(o.unit, s.unit) || ' ' || quote_literal(
               coalesce(o.plan_key, s.plan_key)), 'owner_served',
           coalesce(s.served, 0)::text, coalesce(o.served, 0)::text,
           coalesce(o.plan_key, s.plan_key), coalesce(o.unit, s.unit)
    FROM (SELECT k.type, k.plan_key, k.unit, sum(k.n) AS served
          FROM (SELECT fo.type, fo.plan_key, fo.unit, fo.served_n AS n
                FROM {schema}.fair_owners fo
                UNION ALL
                SELECT fc.type, fc.plan_key, fc.unit, fc.n
                FROM {schema}.fair_owner_changes fc
                JOIN marks m ON m.type = fc.type
                WHERE fc.xid >= m.upto OR fc.xid = ANY (m.open)) k
          GROUP BY 1, 2, 3) o
    FULL JOIN (SELECT ow.type, ow.plan_key, ow.unit, sum(ow.served_n) AS served
               FROM owned ow GROUP BY 1, 2, 3) s
      ON s.type = o.type AND s.plan_key = o.plan_key AND s.unit = o.unit
    WHERE coalesce(s.served, 0) <> coalesce(o.served, 0)
    UNION ALL
    SELECT fg.type, fg.group_id, 'owner_bound',
           '(b_served, b_head_lb, b_head_id) <= (' || fg.served_n || ', ' || fg.head_lb
           || ', ' || fg.head_id || ') and ready_lb <= ' || fg.ready_lb,
           coalesce('(' || o.b_served || ', ' || o.b_head_lb || ', ' || o.b_head_id
                    || '), ready_lb ' || o.ready_lb, 'no owner row'),
           ow.plan_key, ow.unit
    FROM {schema}.fair_groups fg
    JOIN owned ow ON ow.type = fg.type AND ow.group_id = fg.group_id
    LEFT JOIN marks m ON m.type = fg.type
    LEFT JOIN {schema}.fair_owners o
      ON o.type = fg.type AND o.plan_key = ow.plan_key AND o.unit = ow.unit
    WHERE ow.active AND fg.head_lb < 'infinity'
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_owner_changes fc
                      WHERE fc.type = fg.type AND fc.group_id = fg.group_id
                        AND (fc.xid >= coalesce(m.upto, '0')
                             OR fc.xid = ANY (coalesce(m.open, '{{}}'))))
      AND (o.unit IS NULL
           OR (o.b_served, o.b_head_lb, o.b_head_id) > (fg.served_n, fg.head_lb, fg.head_id)
           OR o.ready_lb > fg.ready_lb)
    UNION ALL
    SELECT fc.type, fc.group_id, 'changes_mark', 'rows at or above mark ' || m.upto,
           count(*) || ' below it, from xid ' || min(fc.xid), fc.plan_key, fc.unit
    FROM {schema}.fair_owner_changes fc
    JOIN marks m ON m.type = fc.type
    WHERE fc.xid < m.upto AND NOT fc.xid = ANY (m.open)
    GROUP BY fc.type, fc.group_id, m.upto, fc.plan_key, fc.unit
    UNION ALL
    SELECT fg.type, fg.group_id, 'floor',
           '(served_n, head_lb, head_id) >= (' || w.served_n || ', ' || w.head_lb || ', '
           || w.head_id || ')',
           '(' || fg.served_n || ', ' || fg.head_lb || ', ' || fg.head_id || ')',
           NULL, NULL
    FROM {schema}.fair_groups fg
    LEFT JOIN marks m ON m.type = fg.type
    CROSS JOIN LATERAL (
        SELECT w.served_n, w.head_lb, w.head_id FROM {schema}.fair_walk_floor w
        WHERE w.type = fg.type AND w.level = 'group' AND w.plan_key = fg.plan_key
        ORDER BY w.seq DESC LIMIT 1) w
    WHERE fg.active AND fg.head_lb < 'infinity'
      AND (fg.served_n, fg.head_lb, fg.head_id) < (w.served_n, w.head_lb, w.head_id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.fair_owner_changes fc
                      WHERE fc.type = fg.type AND fc.group_id = fg.group_id
                        AND (fc.xid >= coalesce(m.upto, '0')
                             OR fc.xid = ANY (coalesce(m.open, '{{}}'))))
    UNION ALL
    SELECT o.type, o.unit || ' ' || quote_literal(o.plan_key), 'owner_floor',
           '(served_n, b_served, b_head_lb, b_head_id) >= (' || w.served_n || ', '
           || w.b_served || ', ' || w.head_lb || ', ' || w.head_id || ')',
           '(' || o.served_n || ', ' || o.b_served || ', ' || o.b_head_lb || ', '
           || o.b_head_id || ')',
           o.plan_key, o.unit
    FROM {schema}.fair_owners o
    CROSS JOIN LATERAL (
        SELECT w.served_n, w.b_served, w.head_lb, w.head_id FROM {schema}.fair_walk_floor w
        WHERE w.type = o.type AND w.level = 'owner' AND w.plan_key = o.plan_key
        ORDER BY w.seq DESC LIMIT 1) w
    WHERE o.b_head_lb < 'infinity'
      AND (o.served_n, o.b_served, o.b_head_lb, o.b_head_id)
          < (w.served_n, w.b_served, w.head_lb, w.head_id)
)
SELECT v.type, v.group_id, v.invariant, v.expected, v.found, v.plan_key, v.unit
FROM violations v
ORDER BY v.type, v.group_id, v.invariant, v.plan_key, v.unit
