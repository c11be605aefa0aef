-- The rebuild (docs/fast-claim.md, "The contract"), under repair_lock's locks after
-- repair_clear: one fair_groups row per (type, group) with pending jobs or a served
-- count, from jobs, on the queue's clock (now() + offset):
--   served_n   the cost of the group's running jobs and of its done jobs at or after the
--              type's edge
--              (fair_served is left empty);
--   ready_lb   the earliest run_after of its pending jobs ('infinity': none);
--   head       the first job ready now by (created_at, id), valid until the earliest
--              run_after of the older jobs not ready (as fair_fold renews it); none
--              ready: the oldest pending job, valid forever; none pending: 'infinity';
--   plan, active, owner_id  copied from rota's groups table (no row: none, true, none);
-- then one fair_owners row per owner (its groups' served_n summed, its bounds the
-- smallest of its active groups'), the plans present added to fair_plans, and the edge
-- row ('-infinity', as a first completion makes it) of a type with done jobs and none
-- (bookkeeping restored from a backup older than the type's first completion): the
-- upkeep moves an edge only where its row exists (fair_advance), and without one every
-- claim's edge correction reads all the type's done jobs before the window start.
-- Returns the number of rows written.
-- Needs: parameter offset.
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
counted AS (
    SELECT j.type, j.group_id,
           coalesce(sum(j.cost) FILTER (WHERE j.status = 'running'
                                        OR (j.status = 'done'
                                            AND j.finished_at
                                                >= coalesce(e.edge, '-infinity'))), 0)
             AS served,
           min(j.run_after) FILTER (WHERE j.status = 'pending') AS ready,
           bool_or(j.status = 'done') AS any_done
    FROM {schema}.jobs j
    LEFT JOIN {schema}.fair_edge e ON e.type = j.type
    WHERE j.group_id IS NOT NULL AND j.status IN ('pending', 'running', 'done')
    GROUP BY j.type, j.group_id
),
heads AS (
    SELECT c.type, c.group_id, c.served, c.ready,
           coalesce(rh.created_at, ah.created_at, 'infinity') AS head_lb,
           coalesce(rh.id, ah.id, 0) AS head_id,
           CASE WHEN rh.id IS NULL THEN 'infinity'::timestamptz
                ELSE coalesce((SELECT min(o.run_after) FROM {schema}.jobs o
                               WHERE o.type = c.type AND o.group_id = c.group_id
                                 AND o.status = 'pending'
                                 AND (o.created_at, o.id) < (rh.created_at, rh.id)),
                              'infinity') END AS head_until
    FROM counted c
    CROSS JOIN clock k
    LEFT JOIN LATERAL (
        SELECT j.created_at, j.id FROM {schema}.jobs j
        WHERE j.type = c.type AND j.group_id = c.group_id AND j.status = 'pending'
          AND j.run_after <= k.now
        ORDER BY j.created_at, j.id LIMIT 1) rh ON true
    LEFT JOIN LATERAL (
        SELECT j.created_at, j.id FROM {schema}.jobs j
        WHERE j.type = c.type AND j.group_id = c.group_id AND j.status = 'pending'
        ORDER BY j.created_at, j.id LIMIT 1) ah ON true
    WHERE c.served > 0 OR c.ready IS NOT NULL
),
rows AS (
    INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, head_id, head_until,
                                            ready_lb, served_n, plan, active, owner_id)
    SELECT h.type, h.group_id, h.head_lb, h.head_id, h.head_until,
           coalesce(h.ready, 'infinity'), h.served, g.plan, coalesce(g.active, true),
           g.owner_id
    FROM heads h
    LEFT JOIN {schema}.groups g ON g.group_id = h.group_id
    ORDER BY h.type, h.group_id
    RETURNING fg.type, fg.plan, fg.plan_key, fg.unit, fg.served_n, fg.head_lb, fg.head_id,
              fg.ready_lb, fg.active
),
-- The owners' rows from the groups' (as fair_fold computes them).
owners AS (
    INSERT INTO {schema}.fair_owners (type, plan_key, unit, plan, served_n, b_served,
                                      b_head_lb, b_head_id, ready_lb)
    SELECT r.type, r.plan_key, r.unit, min(r.plan), sum(r.served_n),
           coalesce((array_agg(r.served_n ORDER BY r.served_n, r.head_lb, r.head_id)
                     FILTER (WHERE r.active AND r.head_lb < 'infinity'))[1], 0),
           coalesce((array_agg(r.head_lb ORDER BY r.served_n, r.head_lb, r.head_id)
                     FILTER (WHERE r.active AND r.head_lb < 'infinity'))[1], 'infinity'),
           coalesce((array_agg(r.head_id ORDER BY r.served_n, r.head_lb, r.head_id)
                     FILTER (WHERE r.active AND r.head_lb < 'infinity'))[1], 0),
           coalesce(min(r.ready_lb) FILTER (WHERE r.active), 'infinity')
    FROM rows r
    GROUP BY r.type, r.plan_key, r.unit
),
plans AS (
    INSERT INTO {schema}.fair_plans (type, plan)
    SELECT DISTINCT r.type, r.plan FROM rows r WHERE r.plan IS NOT NULL
    ON CONFLICT DO NOTHING
),
edges AS (
    INSERT INTO {schema}.fair_edge (type, edge)
    SELECT DISTINCT c.type, '-infinity'::timestamptz FROM counted c WHERE c.any_done
    ON CONFLICT DO NOTHING
)
SELECT count(*) FROM rows
