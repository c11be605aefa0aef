-- Claim a batch of one type (DESIGN rules 3-6 and "Fair inside a batch").
-- Order: plan priority desc, then served + position asc, then created_at, id.
--   served:   the group's jobs of this type done or running within the served window
--             (running counts as served, so a group being worked on does not look idle);
--             jobs with no group never match, so their served is 0.
--   position: the job's 0-based rank among its group's claimable jobs by age; all
--             group-less jobs form one group for it.
-- Priority comes from the plans object as bound arrays: a plan id never becomes SQL text.
-- A job with no group, or whose group has no plan (no owner), ranks as the middle plan;
-- a plan id the plans object does not know ranks as the lowest plan. A group missing
-- from the groups relation is treated as an active group with no owner, so its jobs are
-- never stranded. Only job rows are locked (FOR UPDATE OF j), never the group rows.
-- Locks are taken with SKIP LOCKED, which never waits, so the claim cannot deadlock
-- with sweepers or batch deferrals even though it locks in fair order, not id order.
WITH served AS (
    SELECT s.group_id, count(*)::int AS n
    FROM {schema}.jobs s
    WHERE s.type = %(type)s
      AND s.group_id IS NOT NULL
      AND ((s.status = 'done'
            AND s.finished_at >= now() + %(offset)s::interval - %(served_window)s::interval)
        OR (s.status = 'running'
            AND s.locked_at >= now() + %(offset)s::interval - %(served_window)s::interval))
    GROUP BY s.group_id
),
plan_priority AS (
    SELECT p.plan, p.priority
    FROM unnest(%(plan_ids)s::text[], %(plan_priorities)s::int[]) AS p(plan, priority)
),
eligible AS (
    SELECT j.id, j.group_id, j.created_at,
           CASE WHEN g.plan IS NULL THEN %(middle_priority)s::int
                ELSE coalesce(pp.priority, %(lowest_priority)s::int) END AS priority
    FROM {schema}.jobs j
    LEFT JOIN {groups} g ON g.group_id = j.group_id
    LEFT JOIN plan_priority pp ON pp.plan = g.plan
    WHERE j.type = %(type)s
      AND j.run_after <= now() + %(offset)s::interval
      AND (j.status = 'pending'
           OR (j.status = 'running'
               AND j.locked_at < now() + %(offset)s::interval - %(stale_after)s::interval
               AND j.attempts < j.max_attempts))
      AND coalesce(g.active, true)
),
ranked AS (
    SELECT e.id,
           e.priority,
           coalesce(sv.n, 0)
             + row_number() OVER (PARTITION BY e.group_id ORDER BY e.created_at, e.id) - 1
             AS fair,
           e.created_at
    FROM eligible e
    LEFT JOIN served sv ON sv.group_id = e.group_id
),
picked AS (
    SELECT r.id, r.priority, r.fair,
           row_number() OVER (ORDER BY r.priority DESC, r.fair, r.created_at, r.id) AS ord
    FROM ranked r
),
locked AS (
    -- Re-check eligibility on the row's latest version: a concurrent claimer may have
    -- committed since this statement's snapshot.
    SELECT j.id, p.ord, p.priority, p.fair
    FROM {schema}.jobs j
    JOIN picked p ON p.id = j.id
    WHERE p.ord <= %(candidates)s
      AND j.type = %(type)s
      AND j.run_after <= now() + %(offset)s::interval
      AND (j.status = 'pending'
           OR (j.status = 'running'
               AND j.locked_at < now() + %(offset)s::interval - %(stale_after)s::interval
               AND j.attempts < j.max_attempts))
    ORDER BY p.ord
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {schema}.jobs AS u
SET status = 'running',
    locked_at = now() + %(offset)s::interval,
    attempts = u.attempts + 1,          -- attempts count at claim time, so a crash counts
    run_id = %(run_id)s::uuid,
    claim_token = gen_random_uuid()     -- fences complete/fail/defer to this very claim
FROM locked l
WHERE u.id = l.id
RETURNING u.*, l.ord AS claim_order
