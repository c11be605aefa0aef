-- Fragment of claim.sql, put in place of its claim_order placeholder for fair_by "owner"
-- (docs/design.md, "The fair claim"): the key (priority, v, fair, created_at, id) where
--   fair = the group's served + the job's position in its group (the group order), and
--   v    = (the owner's served + the job's position among its owner's claimable jobs by
--          (fair, created_at, id)) / the plan's weight (the batch interleave one level up).
-- The walk is the group claim's, one level up: owners in order of the lower bound of
-- their first job's key (priority, owner served / weight, then their best group's served
-- and head); the first probe_groups owners have their first spread groups (by served,
-- head) probed for per jobs each, sizes of their own (sized, below).
-- The proof: a job's position among its owner's jobs is exact only while every job of
-- the owner before it was read. So each probed owner has a cut, the smallest inner key
-- (fair, created_at, id) it did not read: its next group's bound, or a cut group's next
-- job. Only the jobs before the cut are candidates; every job at or after it has an
-- inner key at or after the cut and at least as many of the owner's jobs before it as
-- were read before the cut, so its key is at or after (priority, (owner served + jobs
-- before the cut) / weight, cut). That bound, the first owner not probed and the first
-- job past the candidates are the unread bounds.
-- The walk is the owner_walk placeholder: claim_owner_walk_scan.sql (every group read,
-- claim_pool_owner.sql) or claim_owner_walk_cached.sql (rota's own groups table: the
-- owners' rows, fair_owners).
-- Needs:   CTEs clock, job_cost, stale, the walk's; parameters type, limit,
--          probe_groups, probe_spread, probe_per, candidates.
-- Defines: the walk's CTEs (unit_walk, unit_sized, walk), then group_fill, group_level,
--          sized, probe, ranked, cuts, valid,
--          ordered(id, group_id, priority, v, fair, created_at, ord), unread(priority, v,
--          fair, created_at, id, need, bgroup: a group of the owner a bound belongs to,
--          null for the owners not probed; gbound: false, as a cut bounds every group
--          of its owner, never one group's jobs alone).
{owner_walk},
-- How many jobs to read from each probed group (per): what the group would give the
-- batch if every probed group had jobs enough, plus one, and at least probe_per: its
-- owner's share (claim_owner_rank.sql) spread over the owner's probed groups by a water
-- level by served, in the type's expected cost. One size for every group made a whole
-- claim read as deep as its one least-served group needed (bench/RESULTS.md, section
-- 18). An estimate: the cuts below prove the answer whatever the sizes, so a wrong one
-- costs a retry or a few rows, never exactness.
group_fill AS (
    SELECT w.plan, w.unit, w.served, w.share AS n,
           count(*) OVER g AS i, sum(w.served) OVER g AS cs
    FROM walk w
    WHERE w.grank <= w.spread AND w.share > 0
    WINDOW g AS (PARTITION BY w.plan, w.unit ORDER BY w.grank ROWS UNBOUNDED PRECEDING)
),
group_level AS (
    SELECT DISTINCT ON (gf.plan, gf.unit) gf.plan, gf.unit,
           (gf.n * jc.e + gf.cs) / gf.i AS lv
    FROM group_fill gf
    CROSS JOIN job_cost jc
    WHERE gf.served * gf.i - gf.cs <= gf.n * jc.e
    ORDER BY gf.plan, gf.unit, gf.i DESC
),
sized AS (
    SELECT w.*,
           greatest(%(probe_per)s::int,
                    ceil(greatest(0, coalesce(gl.lv, 0) - w.served) / jc.e)::int + 1)
             AS per
    FROM walk w
    CROSS JOIN job_cost jc
    LEFT JOIN group_level gl ON gl.plan IS NOT DISTINCT FROM w.plan AND gl.unit = w.unit
),
probe AS (
    SELECT w.group_id, w.plan, w.unit, w.unit_served, w.priority, w.weight, w.served,
           w.per, j.id, j.created_at
    FROM sized w
    {claim_probe_jobs}
    WHERE w.grank <= w.spread
),
ranked AS (
    SELECT pr.*,
           row_number() OVER (PARTITION BY pr.group_id ORDER BY pr.created_at, pr.id) AS pos
    FROM probe pr
),
-- Each probed owner's cut: the smallest inner key it did not read (its first group not
-- probed, or a cut group's next job), and which probe size would move it.
cuts AS (
    SELECT DISTINCT ON (x.plan, x.unit) x.plan, x.unit, x.fair, x.created_at, x.id, x.need,
           x.group_id
    FROM (SELECT w.plan, w.unit, w.served AS fair, w.head_lb AS created_at,
                 w.head_id AS id, 'spread' AS need, w.group_id
          FROM walk w WHERE w.grank = w.spread + 1
          UNION ALL
          SELECT r.plan, r.unit, r.served + (r.pos - 1) * jc.e, r.created_at, r.id,
                 'per', r.group_id
          FROM ranked r CROSS JOIN job_cost jc WHERE r.pos = r.per + 1) x
    ORDER BY x.plan, x.unit, x.fair, x.created_at, x.id
),
-- The jobs read before their owner's cut, each with its exact position in its owner.
valid AS (
    SELECT r.id, r.group_id, r.plan, r.unit, r.unit_served, r.priority, r.weight,
           r.served + (r.pos - 1) * jc.e AS fair, r.created_at,
           row_number() OVER (PARTITION BY r.plan, r.unit
                              ORDER BY r.served + (r.pos - 1) * jc.e, r.created_at,
                                       r.id) - 1
             AS upos
    FROM ranked r
    CROSS JOIN job_cost jc
    LEFT JOIN cuts ct ON ct.plan IS NOT DISTINCT FROM r.plan AND ct.unit = r.unit
    WHERE r.pos <= r.per
      AND (ct.need IS NULL
           OR (r.served + (r.pos - 1) * jc.e, r.created_at, r.id)
              < (ct.fair, ct.created_at, ct.id))
),
-- The best `candidates` jobs read, and the next one, which bounds the rest.
ordered AS MATERIALIZED (
    SELECT v.id, v.group_id, v.priority,
           (v.unit_served + v.upos * jc.e)::numeric / v.weight AS v,
           v.fair, v.created_at,
           row_number() OVER (ORDER BY v.priority DESC,
                                       (v.unit_served + v.upos * jc.e)::numeric / v.weight,
                                       v.fair, v.created_at, v.id) AS ord
    FROM valid v
    CROSS JOIN job_cost jc
    ORDER BY ord
    LIMIT %(candidates)s + 1
),
-- Lower bounds, id included, of every job not a candidate: the first owner not probed,
-- each probed owner's cut, and the first job read beyond the candidates.
unread AS (
    SELECT uw.priority, uw.v_lb AS v, uw.served AS fair, uw.head_lb AS created_at,
           uw.head_id AS id, 'groups' AS need, NULL::text AS bgroup, false AS gbound
    FROM unit_walk uw WHERE uw.urank = %(probe_groups)s + 1
    UNION ALL
    SELECT uw.priority,
           (uw.unit_served + coalesce(n.before, 0) * jc.e)::numeric / uw.weight,
           ct.fair, ct.created_at, ct.id, ct.need, ct.group_id, false
    FROM cuts ct
    CROSS JOIN job_cost jc
    JOIN unit_walk uw ON uw.plan IS NOT DISTINCT FROM ct.plan AND uw.unit = ct.unit
    -- Each owner's jobs read before its cut, counted in one pass over valid (a count
    -- per cut rescanned valid once per probed owner: bench/RESULTS.md, section 29).
    LEFT JOIN (SELECT v.plan, v.unit, count(*) AS before FROM valid v
               GROUP BY v.plan, v.unit) n
      ON n.plan IS NOT DISTINCT FROM ct.plan AND n.unit = ct.unit
    UNION ALL
    SELECT o.priority, o.v, o.fair, o.created_at, o.id, 'cand', o.group_id, false
    FROM ordered o WHERE o.ord = %(candidates)s + 1
)
