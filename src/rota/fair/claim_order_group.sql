-- Fragment of claim.sql, put in place of its claim_order placeholder for fair_by
-- "group" (docs/design.md, "The fair claim"): the key (priority, (served + position) /
-- weight, 0, created_at, id), its walk of the pool's groups, the probe and the bounds.
-- Needs:   CTEs clock, plan_priority, job_cost, served_delta, edge_fix, running_old,
--          stale, pool;
--          parameters type, middle_priority, lowest_priority, middle_weight,
--          lowest_weight, limit, probe_groups, probe_per, candidates.
-- Defines: CTEs keyed, walk, group_fill, group_level, sized, probe, ranked,
--          ordered(id, group_id, priority, v, fair, created_at, ord),
--          unread(priority, v, fair, created_at, id, need, bgroup:
--          the group of the job a bound belongs to, null for the groups not probed;
--          gbound: the bound is of that group's jobs alone, a group's next job).
-- A plan's weight divides the served count (virtual time): within one plan every group
-- has the same weight, so the pool's walk by served_n per plan is the walk by v, and
-- the walk's merge of the plans orders by v.
keyed AS (
    SELECT pl.group_id, pl.head_lb, pl.head_id, pl.served_n, pl.served_lb,
           CASE WHEN pl.group_id IS NULL OR pl.plan IS NULL THEN %(middle_priority)s::int
                ELSE coalesce(pp.priority, %(lowest_priority)s::int) END AS priority,
           CASE WHEN pl.group_id IS NULL OR pl.plan IS NULL THEN %(middle_weight)s::int
                ELSE coalesce(pp.weight, %(lowest_weight)s::int) END AS weight
    FROM pool pl
    LEFT JOIN plan_priority pp ON pp.plan = pl.plan
    WHERE pl.active
{cap_filter_pool}
),
-- Groups in order of the lower bound (priority, served_lb / weight, head_lb, head_id)
-- of their first job's key; only the first probe_groups are probed, the next one bounds the rest.
walk AS (
    SELECT k.group_id, k.head_lb, k.head_id, k.priority, k.weight, k.v_lb,
           k.served_n + coalesce(dd.n, 0) + coalesce(ef.n, 0) - coalesce(ro.n, 0) AS served,
           row_number() OVER (ORDER BY k.priority DESC, k.v_lb, k.head_lb, k.head_id,
                                       k.group_id NULLS FIRST) AS rank
    FROM (SELECT k.*, k.served_lb::numeric / k.weight AS v_lb FROM keyed k
          ORDER BY k.priority DESC, k.served_lb::numeric / k.weight, k.head_lb, k.head_id,
                   k.group_id NULLS FIRST
          LIMIT %(probe_groups)s + 1) k
    LEFT JOIN served_delta dd ON dd.group_id = k.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = k.group_id
    LEFT JOIN running_old ro ON ro.group_id = k.group_id
),
-- How many jobs to read from each probed group (per): what the group would give the
-- batch if every probed group had jobs enough, plus one, and at least probe_per: a water
-- level over the first priority's probed groups by served / weight, in the type's
-- expected cost (a group gets (level - served / weight) x weight / e places). One size
-- for every group made a claim read as deep as its least-served group needed
-- (bench/RESULTS.md, section 18). An estimate: the bounds below prove the answer
-- whatever the sizes, so a wrong one costs a retry or a few rows, never exactness.
group_fill AS (
    SELECT w.rank, w.served / w.weight AS k, w.weight / jc.e AS wt,
           sum(w.weight / jc.e) OVER o AS cw, sum(w.served / jc.e) OVER o AS ckw
    FROM walk w
    CROSS JOIN job_cost jc
    WHERE w.rank <= %(probe_groups)s
      AND w.priority = (SELECT max(x.priority) FROM walk x
                        WHERE x.rank <= %(probe_groups)s)
    WINDOW o AS (ORDER BY w.served / w.weight, w.rank ROWS UNBOUNDED PRECEDING)
),
-- The level: from the last group whose own key the batch reaches (groups in key order).
group_level AS (
    SELECT (%(limit)s + f.ckw) / f.cw AS lv
    FROM group_fill f
    WHERE f.k * f.cw - f.ckw <= %(limit)s
    ORDER BY f.cw DESC
    LIMIT 1
),
sized AS (
    SELECT w.*,
           greatest(%(probe_per)s::int,
                    ceil(coalesce(greatest(0, (gl.lv - gf.k) * gf.wt), 0))::int + 1) AS per
    FROM walk w
    LEFT JOIN group_fill gf ON gf.rank = w.rank
    LEFT JOIN group_level gl ON true
),
probe AS (
    SELECT w.group_id, w.priority, w.weight, w.served, w.per, j.id, j.created_at
    FROM sized w
    {claim_probe_jobs}
    WHERE w.rank <= %(probe_groups)s
),
ranked AS (
    SELECT pr.*,
           row_number() OVER (PARTITION BY pr.group_id ORDER BY pr.created_at, pr.id) AS pos
    FROM probe pr
),
-- The best `candidates` jobs read, and the next one, which bounds the rest (LIMIT also
-- tells the planner how few they are, so `locked` fetches them by primary key rather
-- than by a hash join over jobs, (bench/RESULTS.md, "Planner notes")).
ordered AS MATERIALIZED (
    SELECT r.id, r.group_id, r.priority,
           (r.served + (r.pos - 1) * jc.e)::numeric / r.weight AS v,
           0 AS fair, r.created_at,
           row_number() OVER (ORDER BY r.priority DESC,
                                       (r.served + (r.pos - 1) * jc.e)::numeric / r.weight,
                                       r.created_at, r.id) AS ord
    FROM ranked r
    CROSS JOIN job_cost jc
    WHERE r.pos <= r.per
    ORDER BY ord
    LIMIT %(candidates)s + 1
),
-- Lower bounds, id included, of every job not a candidate: the first group not probed
-- (its head's bound), for each group with more than probe_per claimable jobs its next
-- job, and the first job read beyond the candidates (both read, so their keys are
-- exact; what they bound ranks after them).
unread AS (
    SELECT w.priority, w.v_lb AS v, 0 AS fair, w.head_lb AS created_at, w.head_id AS id,
           'groups' AS need, NULL::text AS bgroup, false AS gbound
    FROM walk w WHERE w.rank = %(probe_groups)s + 1
    UNION ALL
    SELECT r.priority, (r.served + (r.pos - 1) * jc.e)::numeric / r.weight, 0,
           r.created_at, r.id, 'per', r.group_id, true
    FROM ranked r CROSS JOIN job_cost jc WHERE r.pos = r.per + 1
    UNION ALL
    SELECT o.priority, o.v, o.fair, o.created_at, o.id, 'cand', o.group_id, false
    FROM ordered o WHERE o.ord = %(candidates)s + 1
)
