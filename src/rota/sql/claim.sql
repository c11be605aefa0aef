-- Claim a batch of one type (docs/design.md, "Claim" and "The fair claim").
-- Order: plan priority desc, then served + position asc, then created_at, id.
--   served:   the group's jobs of this type done or running within the served window
--             (finished, or locked, in it: running counts as served, so a group being
--             worked on does not look idle);
--             jobs with no group never match, so their served is 0.
--   position: the job's 0-based rank among its group's claimable jobs by age; all
--             group-less jobs form one group for it.
-- Priority comes from the plans object as bound arrays: a plan id never becomes SQL text.
-- A job with no group, or whose group has no plan (no owner), ranks as the middle plan;
-- a plan id the plans object does not know ranks as the lowest plan. A group missing
-- from the groups relation is treated as an active group with no owner, so its jobs are
-- never stranded. Only job rows are locked (FOR UPDATE OF j), never the group rows.
--
-- How it avoids reading the backlog (docs/fast-claim.md has the proof):
--   1. Every group that may have a ready job (fair_groups, one row per group) gets its
--      exact priority and served count, and a lower bound of its first job's key:
--      (priority, served, head_lb). Served = done_n + fair_done (done jobs since the
--      edge and running jobs) + the exact edge correction - jobs running since before
--      the window.
--   2. Only the first %(probe_groups)s groups in that order are probed, each for its
--      first %(probe_per)s claimable jobs through jobs_pending_idx.
--   3. The result is exact when the first group not probed, and the next job of every
--      probed group that was cut short, have lower bounds strictly after the last
--      candidate: no job left unread can rank among the candidates. Otherwise the
--      statement claims nothing and returns one row with `retry` set, and the caller
--      asks again with more groups or more jobs per group.
-- Locks are taken with SKIP LOCKED, which never waits, so the claim cannot deadlock
-- with sweepers or batch deferrals even though it locks in fair order, not id order.
WITH clock AS (
    SELECT now() + %(offset)s::interval AS now,
           now() + %(offset)s::interval - %(served_window)s::interval AS ws,
           now() + %(offset)s::interval - %(stale_after)s::interval AS stale_before,
           coalesce((SELECT e.edge FROM {schema}.fair_edge e WHERE e.type = %(type)s),
                    '-infinity') AS edge
),
plan_priority AS (
    SELECT p.plan, p.priority
    FROM unnest(%(plan_ids)s::text[], %(plan_priorities)s::int[]) AS p(plan, priority)
),
-- Running jobs are in the bookkeeping (fair_done, folded into done_n) whatever their
-- lock's age (migration 014); those locked before the window start are not served and
-- are taken away here (jobs_running_idx range: none unless a job has been running
-- longer than the window).
running_old AS (
    SELECT r.group_id, count(*)::int AS n
    FROM {schema}.jobs r, clock c
    WHERE r.type = %(type)s AND r.status = 'running' AND r.locked_at < c.ws
      AND r.group_id IS NOT NULL
    GROUP BY r.group_id
),
-- fair_done counts done jobs finished at or after the edge; between the edge and the
-- window start they are counted here exactly (jobs_done_idx range; fair_advance keeps
-- it about a second wide).
edge_fix AS (
    SELECT d.group_id,
           sum(CASE WHEN d.finished_at >= c.edge THEN -1 ELSE 1 END)::int AS n
    FROM {schema}.jobs d, clock c
    WHERE d.type = %(type)s AND d.status = 'done' AND d.group_id IS NOT NULL
      AND d.finished_at >= least(c.ws, c.edge) AND d.finished_at < greatest(c.ws, c.edge)
    GROUP BY d.group_id
),
-- Completions not yet folded into fair_groups.done_n (about a second's worth).
done_delta AS (
    SELECT f.group_id, sum(f.n)::int AS n
    FROM {schema}.fair_done f
    WHERE f.type = %(type)s
    GROUP BY f.group_id
),
-- Stale running jobs with attempts left are claimable (jobs_reclaimable_idx).
stale AS (
    SELECT r.id, r.group_id, r.created_at
    FROM {schema}.jobs r, clock c
    WHERE r.type = %(type)s AND r.status = 'running' AND r.attempts < r.max_attempts
      AND r.locked_at < c.stale_before AND r.run_after <= c.now
),
stale_head AS (
    SELECT s.group_id, min(s.created_at) AS head
    FROM stale s WHERE s.group_id IS NOT NULL GROUP BY s.group_id
),
-- Groups whose served count is not just their folded done_n: unfolded deltas (claims and
-- completions since the last fold), the edge correction, jobs running since before the
-- window, stale claimable jobs, an expired head bound. Few
-- (in-flight work, about a second of completions, heads renewed by the upkeep); their
-- keys are computed exactly (an expired head counts as -infinity) and they join the walk
-- explicitly, so for every other group done_n is its exact served count.
special AS (
    SELECT ef.group_id FROM edge_fix ef
    UNION
    SELECT dd.group_id FROM done_delta dd
    UNION
    SELECT ro.group_id FROM running_old ro
    UNION
    SELECT sh.group_id FROM stale_head sh
    UNION
    -- Groups whose head bound has run out (fair_groups_expiry_idx; the constant bound
    -- lets the generic plan use the partial index: a seq scan of fair_groups cost
    -- 1.6 ms at 10,000 groups).
    SELECT fg.group_id FROM {schema}.fair_groups fg, clock c
    WHERE fg.type = %(type)s AND fg.head_until <= c.now AND fg.head_until < 'infinity'
),
{pool},
keyed AS (
    SELECT pl.group_id, pl.head_lb, pl.done_n, pl.served_lb,
           CASE WHEN pl.group_id IS NULL OR pl.plan IS NULL THEN %(middle_priority)s::int
                ELSE coalesce(pp.priority, %(lowest_priority)s::int) END AS priority
    FROM pool pl
    LEFT JOIN plan_priority pp ON pp.plan = pl.plan
    WHERE pl.active
),
-- Groups in order of the lower bound (priority, served_lb, head_lb) of their first
-- job's key; only the first probe_groups are probed, the next one bounds the rest.
walk AS (
    SELECT k.group_id, k.head_lb, k.priority, k.served_lb,
           k.done_n + coalesce(dd.n, 0) + coalesce(ef.n, 0) - coalesce(ro.n, 0) AS served,
           row_number() OVER (ORDER BY k.priority DESC, k.served_lb, k.head_lb,
                                       k.group_id NULLS FIRST) AS rank
    FROM (SELECT * FROM keyed k
          ORDER BY k.priority DESC, k.served_lb, k.head_lb, k.group_id NULLS FIRST
          LIMIT %(probe_groups)s + 1) k
    LEFT JOIN done_delta dd ON dd.group_id = k.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = k.group_id
    LEFT JOIN running_old ro ON ro.group_id = k.group_id
),
probe AS (
    SELECT w.group_id, w.priority, w.served, j.id, j.created_at
    FROM walk w
    CROSS JOIN LATERAL (
        (SELECT p.id, p.created_at
         FROM {schema}.jobs p, clock c
         WHERE p.type = %(type)s AND p.group_id = w.group_id AND p.status = 'pending'
           -- `+ interval '0'` keeps run_after out of the index condition: the planner
           -- otherwise picks jobs_pending_ready_idx and sorts the group's ready jobs
           -- (0.022 ms a group at 100k pending) instead of reading jobs_pending_idx in
           -- order and stopping after probe_per + 1 rows (0.005 ms).
           AND p.run_after + interval '0' <= c.now
         ORDER BY p.created_at, p.id
         LIMIT %(probe_per)s + 1)
        UNION ALL
        (SELECT p.id, p.created_at
         FROM {schema}.jobs p, clock c
         WHERE w.group_id IS NULL
           AND p.type = %(type)s AND p.group_id IS NULL AND p.status = 'pending'
           AND p.run_after + interval '0' <= c.now
         ORDER BY p.created_at, p.id
         LIMIT %(probe_per)s + 1)
        UNION ALL
        SELECT s.id, s.created_at FROM stale s
        WHERE s.group_id = w.group_id OR (w.group_id IS NULL AND s.group_id IS NULL)
    ) j
    WHERE w.rank <= %(probe_groups)s
),
ranked AS (
    SELECT pr.*,
           row_number() OVER (PARTITION BY pr.group_id ORDER BY pr.created_at, pr.id) AS pos
    FROM probe pr
),
-- The best `candidates` jobs read (LIMIT also tells the planner how few they are, so
-- `locked` fetches them by primary key: a hash join over jobs instead cost 75 ms).
cand AS (
    SELECT r.id, r.group_id, r.priority, r.served + r.pos - 1 AS fair, r.created_at,
           row_number() OVER (ORDER BY r.priority DESC, r.served + r.pos - 1,
                                       r.created_at, r.id) AS ord
    FROM ranked r
    WHERE r.pos <= %(probe_per)s
    ORDER BY ord
    LIMIT %(candidates)s
),
-- The key of the limit-th candidate, or none when fewer were read. The batch (the first
-- `limit`) is exact; the candidates after it are the best of the jobs read, a reserve
-- for a claimer that finds rows locked by a concurrent claimer.
kth AS MATERIALIZED (
    SELECT c.priority, c.fair, c.created_at, c.id FROM cand c WHERE c.ord = %(limit)s
),
-- Lower bounds of every job not read: the first group not probed (its head's bound),
-- and, for each group with more than probe_per claimable jobs, its next job (read, so
-- its key is exact; the group's later jobs rank after it).
unread AS (
    SELECT w.priority, w.served_lb AS fair, w.head_lb AS created_at, NULL::bigint AS id,
           'groups' AS need
    FROM walk w WHERE w.rank = %(probe_groups)s + 1
    UNION ALL
    SELECT r.priority, r.served + r.pos - 1, r.created_at, r.id, 'per'
    FROM ranked r WHERE r.pos = %(probe_per)s + 1
),
-- Unread jobs that might rank among the candidates: none, or the claim is not exact.
-- A bound equal to the last candidate's (priority, fair, created_at) blocks unless it
-- is a read job with a larger id (the id is the last tie-break).
blocked AS (
    SELECT u.need
    FROM unread u
    LEFT JOIN kth k ON true
    WHERE k.id IS NULL
       OR NOT ((-u.priority, u.fair, u.created_at) > (-k.priority, k.fair, k.created_at)
               OR ((-u.priority, u.fair, u.created_at) = (-k.priority, k.fair, k.created_at)
                   AND coalesce(u.id > k.id, false)))  -- a group's bound has no id
),
-- Lock in fair order, one candidate at a time by primary key, re-checking eligibility on
-- the row's latest version (a concurrent claimer may have committed since this
-- statement's snapshot) and skipping rows a concurrent claimer holds. LATERAL keeps
-- it a nested loop by id whatever the estimates (a hash join over jobs here read
-- 300,000 rows, 75 ms), and the LIMIT stops locking once the batch is full.
locked AS (
    SELECT x.id, p.ord
    FROM (SELECT * FROM cand ORDER BY ord) p  -- ordered before the lateral: lock lazily
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        SELECT j.id FROM {schema}.jobs j
        WHERE j.id = p.id
          AND j.type = %(type)s
          AND j.run_after <= c.now
          AND (j.status = 'pending'
               OR (j.status = 'running'
                   AND j.locked_at < c.stale_before
                   AND j.attempts < j.max_attempts))
        FOR UPDATE SKIP LOCKED
    ) x
    WHERE NOT EXISTS (SELECT 1 FROM blocked)
    ORDER BY p.ord
    LIMIT %(limit)s
),
claimed AS (
    UPDATE {schema}.jobs AS u
    SET status = 'running',
        locked_at = now() + %(offset)s::interval,
        attempts = u.attempts + 1,          -- attempts count at claim time, so a crash counts
        run_id = %(run_id)s::uuid,
        claim_token = gen_random_uuid()     -- fences complete/fail/defer to this very claim
    WHERE u.id = ANY (ARRAY(SELECT l.id FROM locked l))
    RETURNING u.*
)
SELECT c.*, l.ord AS claim_order, NULL::text AS retry
FROM claimed c JOIN locked l ON l.id = c.id
UNION ALL
SELECT (NULL::{schema}.jobs).*, NULL::bigint, string_agg(DISTINCT b.need, ',')
FROM blocked b
HAVING count(*) > 0
