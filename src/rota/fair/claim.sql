-- Claim a batch of one type, in the fair order, at a cost that does not grow with the
-- backlog (docs/design.md#claim and #the-fair-claim; how: docs/fast-claim.md).
-- Order (the queue's fair_by, docs/design.md "The fair claim"):
--   fair_by "group": plan priority desc, then (served + position) / weight asc, then
--                    created_at, id;
--   fair_by "owner": plan priority desc, then the owner's (served + position) / weight,
--                    then the group's served + position, then created_at, id.
--   served:   the cost of the group's jobs of this type done or running within the
--             served window (finished, or locked, in it: running counts as served, so
--             a group being worked on does not look idle); a job's cost is 1 unless
--             its handler charged otherwise (docs/design.md, "Cost");
--             jobs with no group never match, so their served is 0. An owner's served
--             is the sum over its groups on that plan.
--   position: the job's 0-based rank among its group's claimable jobs by age; all
--             group-less jobs form one group for it. An owner's position ranks the job
--             among the owner's claimable jobs by the rest of the key. A position
--             counts in the type's expected cost (job_cost: 1 with no charges).
--   weight:   the plan's weight (Plan.weight): plans of one priority share by it.
-- Priority and weight come from the plans object as bound arrays: a plan id never
-- becomes SQL text.
-- A job with no group, or whose group has no plan (no owner), ranks as the middle plan;
-- a plan id the plans object does not know ranks as the lowest plan. A group missing
-- from the groups relation is treated as an active group with no owner, so its jobs are
-- never stranded. Only job rows are locked (FOR UPDATE OF j), never the group rows.
-- Every key is compared as five parts (priority, v, fair, created_at, id): fair_by
-- "group" keeps fair at 0.
--
-- How it avoids reading the backlog (docs/fast-claim.md has the proof):
--   1. Every group that may have a ready job (fair_groups, one row per group) gets its
--      exact priority and served count, and a lower bound of its first job's key:
--      (priority, served, head_lb, head_id). Served = served_n + fair_served (running jobs, and
--      done jobs since the edge) + the exact edge correction - jobs running since before
--      the window.
--   2. Only the first %(probe_groups)s groups in that order are probed, each for its
--      first `per` claimable jobs through jobs_pending_idx: at least %(probe_per)s, and
--      more for a group the order will take several jobs from (the claim_order
--      fragment's `sized`).
--   3. The result is exact when the first group not probed, the next job of every
--      probed group that was cut short, and the first job read but not a candidate have
--      keys (or bounds, id included) at or after the last job claimed: no job left
--      unread can rank among the claimed (a bound equal to a read job's key belongs to
--      another job, so ties never need a larger probe). Candidates locked by a
--      concurrent claimer are skipped, so the last job claimed may be further down;
--      when fewer than `limit` were locked, nothing may be left unread. Otherwise the
--      statement claims nothing and returns one row with `retry` set, and the caller
--      asks again with more groups, more jobs per group, or more candidates.
-- Locks are taken with SKIP LOCKED, which never waits, so the claim cannot deadlock
-- with sweepers or batch deferrals even though it locks in fair order, not id order.
--
-- Fragments, chosen by FairClaim.statement (each states what it needs and defines):
-- the pool placeholder is claim_pool_cached.sql (rota's groups table),
-- claim_pool_scan.sql (an application's groups relation) or claim_pool_owner.sql
-- (fair_by "owner"); the claim_order placeholder is claim_order_group.sql or claim_order_owner.sql. With a plan
-- that caps its owners' running jobs (Plan.max_running), the cap_* placeholders are
-- their *_on.sql fragments (the owners at their cap left out of the walk, the others
-- taken up to their allowance: cap_tail_on.sql); else they are nothing. The capped
-- statement also applies the caps of groups (groups.max_running, rota's own groups
-- table: cap_prelude_group_on.sql, group_cap_on.sql); the uncapped one on rota's own
-- table asks, in blocked, whether any group is capped (cap_guard_on.sql: retry "caps",
-- nothing claimed, and FairClaim.claim runs the capped statement from then on).
-- Needs:   parameters type, limit, run_id, offset, stale_after, served_window,
--          plan_ids, plan_priorities, plan_weights, middle_priority, lowest_priority,
--          middle_weight, lowest_weight, probe_groups, probe_per, candidates (and
--          probe_spread for fair_by "owner"), plan_caps with the caps.
-- Defines: CTEs clock, plan_priority, running_old, edge_fix, fold_mark, fold_open,
--          served_delta, changes, stale, stale_head, special (read by the pool); the
--          pool's CTEs; the order's CTEs (ending in ordered and unread); then cand and
--          cap_slots (the cap_tail fragment), kth, blocked, locked, last_locked, blocked_after, claimed.
--          Returns the claimed jobs' columns, claim_order and retry (one row with
--          retry set, and nothing claimed, when the proof failed).
WITH clock AS (
    SELECT now() + %(offset)s::interval AS now,
           now() + %(offset)s::interval - %(served_window)s::interval AS ws,
           now() + %(offset)s::interval - %(stale_after)s::interval AS stale_before,
           coalesce((SELECT e.edge FROM {schema}.fair_edge e WHERE e.type = %(type)s),
                    '-infinity') AS edge
),
plan_priority AS (
    SELECT p.plan, p.priority, p.weight
    FROM unnest(%(plan_ids)s::text[], %(plan_priorities)s::int[], %(plan_weights)s::int[])
         AS p(plan, priority, weight)
),
-- The type's expected cost (fair_costs, kept by the fold; 1 before any of its jobs is
-- done): what a claimed job counts while it runs, and what each place of a job's
-- position counts in the key (docs/design.md, "Cost"), so a group's queued jobs stand
-- as far apart as running them will put it.
job_cost AS MATERIALIZED (
    SELECT coalesce((SELECT fc.expected FROM {schema}.fair_costs fc
                     WHERE fc.type = %(type)s), 1) AS e
),
{cap_prelude}
-- Running jobs are in the served counts (fair_served, folded into served_n) whatever
-- their lock's age; those locked before the window start are not served and are taken
-- away here (jobs_running_idx range: none unless a job has been running
-- longer than the window). Read in that index's order (locked_at within the type), so
-- the plan reads the range, not every running job: aggregated straight by group_id, it
-- read the whole of jobs_running_group_idx (every running job of every type) for the
-- order it gives (bench/RESULTS.md, section 26).
running_old AS (
    SELECT x.group_id, sum(x.cost) AS n
    FROM (SELECT r.group_id, r.cost
          FROM {schema}.jobs r
          WHERE r.type = %(type)s AND r.status = 'running'
            AND r.locked_at < (SELECT c.ws FROM clock c)
            AND r.group_id IS NOT NULL
          ORDER BY r.locked_at) x
    GROUP BY x.group_id
),
-- fair_served counts done jobs finished at or after the edge; between the edge and the
-- window start they are counted here exactly (jobs_done_idx range; fair_advance keeps
-- it about a second wide).
edge_fix AS (
    SELECT d.group_id,
           sum(CASE WHEN d.finished_at >= (SELECT c.edge FROM clock c) THEN -d.cost
                    ELSE d.cost END) AS n
    FROM {schema}.jobs d
    WHERE d.type = %(type)s AND d.status = 'done' AND d.group_id IS NOT NULL
      AND d.finished_at >= (SELECT least(c.ws, c.edge) FROM clock c)
      AND d.finished_at < (SELECT greatest(c.ws, c.edge) FROM clock c)
    GROUP BY d.group_id
),
-- The type's newest fold mark (bookkeeping.sql, fair_fold; none: 0 and none open):
-- every delta and change whose xid is below upto and not in open is folded.
-- Its upto by the min/max path (the first entry of a backward scan of
-- fair_fold_mark_idx, whatever dead versions lie below it), then its row by that key.
fold_mark AS MATERIALIZED (
    SELECT x.upto,
           coalesce((SELECT m.open FROM {schema}.fair_fold_mark m
                     WHERE m.type = %(type)s AND m.upto = x.upto LIMIT 1), '{{}}') AS open
    FROM (SELECT coalesce(max(m.upto), '0') AS upto FROM {schema}.fair_fold_mark m
          WHERE m.type = %(type)s) x
),
-- Its open xids, each once and below upto (as fair_fold writes them): no row is read
-- twice by the reads of the rows from upto on and of each open xid's.
fold_open AS MATERIALIZED (
    SELECT DISTINCT o.xid FROM fold_mark k CROSS JOIN LATERAL unnest(k.open) AS o(xid)
    WHERE o.xid < k.upto
),
-- Served-count changes not yet folded into fair_groups.served_n (claims and completions
-- since the last upkeep round): the deltas the mark does not cover, those from its upto
-- on and those of each of its open xids (all below upto, so none is read twice), each
-- an index lookup of fair_served_xid_idx that starts past the dead versions a long
-- transaction keeps, one that wrote and stays open included (xid = ANY of the list in
-- one scan was a filter over every entry of the type: bench/RESULTS.md, section 30).
served_delta AS (
    SELECT f.group_id, sum(f.n) AS n
    FROM (SELECT f.group_id, f.n FROM {schema}.fair_served f
          WHERE f.type = %(type)s AND f.xid >= (SELECT k.upto FROM fold_mark k)
          UNION ALL
          SELECT f.group_id, f.n
          FROM fold_open o
          CROSS JOIN LATERAL (SELECT f.group_id, f.n FROM {schema}.fair_served f
                              WHERE f.type = %(type)s AND f.xid = o.xid OFFSET 0) f) f
    GROUP BY f.group_id
),
-- The fair_owner_changes rows the type's fold mark does not cover
-- (fair_owner_changes_xid_idx), read as served_delta reads the deltas: groups whose
-- bounds a writer lowered, whose row was made, or whose plan, owner or status changed,
-- since the fold. Their rows lie outside the walk floors (fair_walk_floor) and, by
-- owner, their owners' rows do not account for them: they are special.
changes AS (
    SELECT c.plan_key, c.unit, c.group_id, c.n FROM {schema}.fair_owner_changes c
    WHERE c.type = %(type)s AND c.xid >= (SELECT k.upto FROM fold_mark k)
    UNION ALL
    SELECT c.plan_key, c.unit, c.group_id, c.n
    FROM fold_open o
    CROSS JOIN LATERAL (SELECT c.plan_key, c.unit, c.group_id, c.n
                        FROM {schema}.fair_owner_changes c
                        WHERE c.type = %(type)s AND c.xid = o.xid OFFSET 0) c
),
-- Stale running jobs with attempts left are claimable (jobs_reclaimable_idx).
stale AS (
    SELECT r.id, r.group_id, r.created_at
    FROM {schema}.jobs r
    WHERE r.type = %(type)s AND r.status = 'running' AND r.attempts < r.max_attempts
      AND r.locked_at < (SELECT c.stale_before FROM clock c)
      AND r.run_after <= (SELECT c.now FROM clock c)
),
stale_head AS (
    SELECT DISTINCT ON (s.group_id) s.group_id, s.created_at AS head, s.id AS head_id
    FROM stale s WHERE s.group_id IS NOT NULL
    ORDER BY s.group_id, s.created_at, s.id
),
-- Groups whose key is not just their folded served_n and head_lb, or whose row may lie
-- below its plan's walk floor: unfolded deltas (claims, failures and deferrals since
-- the last fold), the edge correction, jobs running since before the window, stale
-- claimable jobs, a recorded change, an expired head bound. Few (the last upkeep
-- round's claims and enqueues into empty groups, about a second of completions at the
-- edge, heads renewed by the upkeep); their keys are computed exactly (an expired head
-- counts as -infinity) and they join the walk explicitly, so for every other group
-- served_n is its exact served count and its key lies at or above its plan's floor.
special AS (
    SELECT ef.group_id FROM edge_fix ef
    UNION
    SELECT dd.group_id FROM served_delta dd
    UNION
    SELECT ro.group_id FROM running_old ro
    UNION
    SELECT sh.group_id FROM stale_head sh
    UNION
    SELECT ch.group_id FROM changes ch
    UNION
    -- Groups whose head bound has run out (fair_groups_expiry_idx; the constant bound
    -- lets the generic plan use the partial index instead of a seq scan of fair_groups,
    -- (bench/RESULTS.md, "Planner notes")).
    SELECT fg.group_id FROM {schema}.fair_groups fg, clock c
    WHERE fg.type = %(type)s AND fg.head_until <= c.now AND fg.head_until < 'infinity'
),
{pool},
{claim_order},
{cap_tail}
-- The key of the limit-th candidate, or none when fewer were read. The batch (the first
-- `limit`) is exact; the candidates after it are the best of the jobs read, a reserve
-- for a claimer that finds rows locked by a concurrent claimer.
kth AS MATERIALIZED (
    SELECT c.priority, c.v, c.fair, c.created_at, c.id FROM cand c WHERE c.ord = %(limit)s
),
-- Unread jobs that might rank before the limit-th candidate: none, or the claim is not
-- exact. Keys are unique (id is the last tie-break) and the limit-th candidate was
-- read, so a bound equal to its key belongs to a job after it: `>=` is enough.
blocked AS (
    SELECT u.need
    FROM unread_open u
    LEFT JOIN kth k ON true
    WHERE k.id IS NULL
       OR (-u.priority, u.v, u.fair, u.created_at, u.id)
          < (-k.priority, k.v, k.fair, k.created_at, k.id)
{cap_guard}
),
-- Lock in fair order, one candidate at a time by primary key, re-checking eligibility on
-- the row's latest version (a concurrent claimer may have committed since this
-- statement's snapshot) and skipping rows a concurrent claimer holds. LATERAL keeps
-- it a nested loop by id whatever the estimates (not a hash join over jobs,
-- (bench/RESULTS.md, "Planner notes")), and the LIMIT stops locking once the batch is full.
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
          -- Still claimable as last committed: a row another claimer took since this
          -- statement's snapshot would be locked here, fail the recheck, and stay
          -- locked (holding up that claimer's completion) until this claim commits.
          -- Only a version some transaction has updated or locked (xmax set) is asked:
          -- a function call per candidate is not free (bench/RESULTS.md, "Planner notes").
          AND (j.xmax = '0'::xid
               OR {schema}.fair_still_claimable(j.id, c.now, c.stale_before))
        FOR UPDATE SKIP LOCKED
    ) x
    WHERE NOT EXISTS (SELECT 1 FROM blocked)
    ORDER BY p.ord
    LIMIT %(limit)s
),
-- A concurrent claimer held some candidates, so the batch reaches further down the
-- candidates: the unread must also come after the last job locked, and when the batch
-- is short, nothing may be left unread (SKIP LOCKED skipped, the claimer reads on).
last_locked AS MATERIALIZED (
    SELECT count(*) AS n, max(l.ord) AS ord FROM locked l
),
-- Its needs say "held": the claim read enough for the proof, and a concurrent claimer's
-- locks sent it further (FairClaim.claim reads further for this claim only).
blocked_after AS (
    SELECT 'held ' || u.need AS need
    FROM unread_open u
    CROSS JOIN last_locked ll
    LEFT JOIN cand k ON k.ord = ll.ord
    WHERE NOT EXISTS (SELECT 1 FROM blocked)
      AND ll.ord IS DISTINCT FROM %(limit)s::bigint  -- else the check above was this one
      AND (ll.n < %(limit)s
           OR (-u.priority, u.v, u.fair, u.created_at, u.id)
              < (-k.priority, k.v, k.fair, k.created_at, k.id))
),
claimed AS (
    UPDATE {schema}.jobs AS u
    SET status = 'running',
        locked_at = now() + %(offset)s::interval,
        started_at = now() + %(offset)s::interval,  -- the attempt's start (a heartbeat
                                            -- moves locked_at, never this)
        attempts = u.attempts + 1,          -- attempts count at claim time, so a crash counts
        run_id = %(run_id)s::uuid,
        claim_token = gen_random_uuid(),    -- fences complete/fail/defer to this very claim
        -- While it runs the job counts its type's expected cost (docs/design.md, "Cost").
        cost = (SELECT jc.e FROM job_cost jc),
        -- The slot it holds of a capped owner, or none (cap_slots: the cap_tail fragment).
        (slot_plan, slot_owner) = (SELECT cs.plan, cs.owner FROM cap_slots cs
                                   WHERE cs.id = u.id)
    WHERE u.id = ANY (ARRAY(SELECT l.id FROM locked l))
      AND NOT EXISTS (SELECT 1 FROM blocked_after)
    RETURNING u.*
)
SELECT c.*, l.ord AS claim_order, NULL::text AS retry
FROM claimed c JOIN locked l ON l.id = c.id
UNION ALL
SELECT (NULL::{schema}.jobs).*, NULL::bigint, string_agg(DISTINCT b.need, ',')
FROM (SELECT need FROM blocked UNION ALL SELECT need FROM blocked_after) b
HAVING count(*) > 0
