-- Fragment of claim_order_owner.sql, put in place of its owner_walk placeholder on
-- rota's own groups table (docs/fast-claim.md, "The owner level"): the owners in order
-- of their first job's lower bound, read from the owners' rows (fair_owners_walk_idx)
-- instead of every group, and the groups of the first probe_groups owners
-- (fair_groups_unit_walk_idx). An owner with a special group (claim_pool_owner_cached.sql)
-- or named in a change is special: its served count is its row's plus its changes' and
-- its special groups' unfolded deltas, and its bound the smaller of its row's and its
-- special groups' exact keys. Every other owner's row is exact: its served_n is the sum
-- of its groups' (none of which has a delta or a change the fold has not taken in), and
-- its bound holds for each of its groups. A special owner of a priority below every one
-- of the first probe_groups + 1 other owners is left out before its row is read: it
-- would rank after all of them (owner_floor).
-- Needs:   CTEs clock, plan_priority, stale, changes, special, special_rows, pool;
--          job_cost; parameters type, middle_priority, lowest_priority,
--          middle_weight, lowest_weight, probe_groups, probe_spread, limit.
-- Defines: CTEs special_units, special_best, owner_levels, owner_rows, owner_floor,
--          units, unit_walk(plan, plan_key, unit, unit_served, served, head_lb,
--          head_id, priority, weight, v_lb, urank),
--          walk(group_id, head_lb, head_id, served, plan, plan_key, unit, unit_served,
--          priority, weight, share, spread, grank); includes groupless_head.sql and
--          claim_owner_rank.sql.
special_units AS (
    SELECT x.plan_key, x.unit,
           CASE WHEN x.plan_key = '' THEN NULL ELSE substr(x.plan_key, 3) END AS plan,
           sum(x.adj) AS adj
    FROM (SELECT sr.plan_key, sr.unit, sr.adj FROM special_rows sr
          UNION ALL
          SELECT ch.plan_key, ch.unit, ch.n FROM changes ch) x
    GROUP BY x.plan_key, x.unit
),
-- Each special owner's best special group (its smallest exact key), in one pass.
special_best AS (
    SELECT DISTINCT ON (p.plan_key, p.unit) p.plan_key, p.unit, p.served_lb, p.head_lb,
           p.head_id
    FROM pool p
    ORDER BY p.plan_key, p.unit, p.served_lb, p.head_lb, p.head_id
),
-- The plan levels of the type's owners, each with its plan's priority (as units ranks
-- them below).
owner_levels AS (
    SELECT l.plan_key,
           CASE WHEN l.plan_key = '' THEN %(middle_priority)s::int
                ELSE coalesce(pp.priority, %(lowest_priority)s::int) END AS priority,
           coalesce(w.served_n, '-Infinity') AS f_served,
           coalesce(w.b_served, '-Infinity') AS f_b_served,
           coalesce(w.head_lb, '-infinity') AS f_head_lb, coalesce(w.head_id, -1) AS f_head_id
    FROM (SELECT 'p:' || p.plan AS plan_key, p.plan FROM {schema}.fair_plans p
          WHERE p.type = %(type)s
          UNION ALL
          SELECT '', NULL) l
    LEFT JOIN plan_priority pp ON pp.plan = l.plan
    -- The plan's owner floor (fair_walk_floor, level 'owner'): the walk below starts
    -- at it, past the dead versions of owners' rows a long transaction keeps below it.
    LEFT JOIN LATERAL (
        SELECT w.served_n, w.b_served, w.head_lb, w.head_id FROM {schema}.fair_walk_floor w
        WHERE w.type = %(type)s AND w.level = 'owner' AND w.plan_key = l.plan_key
        ORDER BY w.seq DESC LIMIT 1) w ON true
),
-- Per plan, the first probe_groups + 1 other owners by their row's key, plan levels read
-- by priority, highest first, and only until probe_groups + 1 owners are read (with the
-- rest of their priority: plans of one priority interleave by weight): an owner of a
-- lower priority ranks after all of them, so it is neither probed nor the bound
-- (bench/RESULTS.md, section 27). The levels are sorted before the lateral, so the limit
-- stops the walk.
owner_rows AS (
    SELECT l.priority, o.plan, o.plan_key, o.unit, o.served_n AS unit_served,
           o.b_served AS served, o.b_head_lb AS head_lb, o.b_head_id AS head_id
    FROM (SELECT * FROM owner_levels ORDER BY priority DESC) l
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        SELECT o.* FROM {schema}.fair_owners o
        WHERE o.type = %(type)s AND o.plan_key = l.plan_key
          AND o.b_head_lb < 'infinity' AND o.ready_lb <= c.now
          AND (o.served_n, o.b_served, o.b_head_lb, o.b_head_id)
              >= (l.f_served, l.f_b_served, l.f_head_lb, l.f_head_id)
          AND (o.plan_key, o.unit) NOT IN (SELECT su.plan_key, su.unit
                                          FROM special_units su)
{cap_filter_owner}
        ORDER BY o.served_n, o.b_served, o.b_head_lb, o.b_head_id
        LIMIT %(probe_groups)s + 1) o
    ORDER BY l.priority DESC
    FETCH FIRST (%(probe_groups)s + 1) ROWS WITH TIES
),
-- The lowest priority those owners reach, once there are probe_groups + 1 of them: a
-- special owner of a lower priority ranks after all of them, so it is neither probed
-- nor the bound, and its row is not looked up (with plans of several priorities, most
-- special owners: bench/RESULTS.md, section 29).
owner_floor AS (
    SELECT min(o.priority) AS priority FROM owner_rows o
    HAVING count(*) > %(probe_groups)s
),
-- Each owner with its priority: its plan level's (owner_levels) for the owners walked,
-- its plan's for the special ones (the same rule: no plan ranks as the middle plan, an
-- unknown one as the lowest), the middle plan's for the group-less unit.
units AS (
    SELECT u.*,
           CASE WHEN u.unit = '-' OR u.plan IS NULL THEN %(middle_weight)s::int
                ELSE coalesce(pp.weight, %(lowest_weight)s::int) END AS weight
    FROM (
        SELECT o.plan, o.plan_key, o.unit, o.unit_served, o.served, o.head_lb, o.head_id,
               o.priority
        FROM owner_rows o
        UNION ALL
        -- The special owners, exactly: those not below owner_floor (all of them when
        -- the walk read fewer than probe_groups + 1 owners).
        SELECT su.plan, su.plan_key, su.unit, coalesce(o.served_n, 0) + su.adj,
               b.served, b.head_lb, b.head_id, su.priority
        FROM (SELECT s.* FROM (
                  SELECT su.*,
                         CASE WHEN su.plan IS NULL THEN %(middle_priority)s::int
                              ELSE coalesce(sp.priority, %(lowest_priority)s::int) END
                           AS priority
                  FROM special_units su
                  LEFT JOIN plan_priority sp ON sp.plan = su.plan) s
              WHERE NOT EXISTS (SELECT 1 FROM owner_floor f
                                WHERE f.priority > s.priority)) su
        LEFT JOIN LATERAL (
            SELECT x.served_n, x.b_served, x.b_head_lb, x.b_head_id
            FROM {schema}.fair_owners x
            -- Newest version first, as special_group_row.sql reads a group's row.
            WHERE x.type = %(type)s AND x.plan_key = su.plan_key
              AND x.unit >= su.unit AND x.unit <= su.unit
            ORDER BY x.unit DESC LIMIT 1) o ON true
        LEFT JOIN special_best sb ON sb.plan_key = su.plan_key AND sb.unit = su.unit
        -- The smaller of the row's bound (when it has one) and the best special group's
        -- key (when there is one); an owner with neither has nothing claimable.
        CROSS JOIN LATERAL (
            SELECT o.b_head_lb < 'infinity'
                   AND (sb.head_lb IS NULL
                        OR (o.b_served, o.b_head_lb, o.b_head_id)
                           <= (sb.served_lb, sb.head_lb, sb.head_id)) AS own) r
        CROSS JOIN LATERAL (
            SELECT CASE WHEN r.own THEN o.b_served ELSE sb.served_lb END AS served,
                   CASE WHEN r.own THEN o.b_head_lb ELSE sb.head_lb END AS head_lb,
                   CASE WHEN r.own THEN o.b_head_id ELSE sb.head_id END AS head_id) b
        WHERE o.b_head_lb < 'infinity' OR sb.head_lb IS NOT NULL
        UNION ALL
        -- The group-less jobs, one owner of their own (served 0, the middle plan).
        SELECT NULL, '', '-', 0, 0, h.head, h.head_id, %(middle_priority)s::int
        FROM {groupless_head} h
    ) u
    LEFT JOIN plan_priority pp ON pp.plan = u.plan
{cap_filter_unit}
),
{claim_owner_rank}
-- The groups of the first probe_groups owners: per owner its first spread + 1
-- other groups by (served_n, head) and its special groups, numbered by (served, head).
walk AS (
    SELECT x.*,
           row_number() OVER (PARTITION BY x.plan_key, x.unit
                              ORDER BY x.served, x.head_lb, x.head_id,
                                       x.group_id NULLS FIRST) AS grank
    FROM (
        SELECT g.group_id, g.head_lb, g.head_id, g.served, uw.plan, uw.plan_key, uw.unit,
               uw.unit_served, uw.priority, uw.weight, uw.share, uw.spread
        FROM unit_sized uw
        CROSS JOIN clock c
        CROSS JOIN LATERAL (
            (SELECT f.group_id, f.head_lb, f.head_id, f.served_n AS served
             FROM {schema}.fair_groups f
             WHERE f.type = %(type)s AND f.plan_key = uw.plan_key AND f.unit = uw.unit
               AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
               AND f.head_until > c.now
               -- From the owner's bound on: every group of it outside `special` lies
               -- at or above it, the dead versions a long transaction keeps below.
               AND (f.served_n, f.head_lb, f.head_id) >= (uw.served, uw.head_lb, uw.head_id)
               AND f.group_id NOT IN (SELECT s.group_id FROM special s)
             ORDER BY f.served_n, f.head_lb, f.head_id
             LIMIT uw.spread + 1)
            UNION ALL
            SELECT NULL, h.head, h.head_id, 0 FROM {groupless_head} h WHERE uw.unit = '-'
        ) g
        WHERE uw.urank <= %(probe_groups)s
        UNION ALL
        -- The probed owners' special groups, joined once (not a scan of the pool per
        -- owner: bench/RESULTS.md, section 29).
        SELECT p.group_id, p.head_lb, p.head_id, p.served_lb, uw.plan, uw.plan_key,
               uw.unit, uw.unit_served, uw.priority, uw.weight, uw.share, uw.spread
        FROM unit_sized uw
        JOIN pool p ON p.plan_key = uw.plan_key AND p.unit = uw.unit
        WHERE uw.urank <= %(probe_groups)s
    ) x
)
