-- Fragment of claim.sql (the cap_tail placeholder) when a plan caps its owners' running
-- jobs (Plan.max_running) or a group of rota's own groups table caps its own
-- (groups.max_running; docs/design.md, "Caps"). The order is unchanged; the claim takes
-- the jobs in that order, passing over those of an owner, or of a group, that has as
-- many running as its cap allows (counting the ones this claim takes), so the capacity
-- goes to the others in fair order (work-conserving). Two allowances, in two stages:
-- each capped group keeps its first (by ord) allowance candidates, then each capped
-- owner its first allowance of those. The same as walking the order and counting both:
-- a group's jobs taken are a prefix of its jobs, since a group's job passed over for its
-- owner leaves the owner full for every later job of the group.
--   Each capped owner among the candidates is locked (fair_cap_lock: its fair_caps row,
--   FOR UPDATE SKIP LOCKED, held until this claim commits) and its running jobs counted
--   as last committed: two claimers never count the same free slot. An owner another
--   claimer holds is passed over by this claim (it takes none of its jobs).
--   A capped group is locked and counted the same way (fair_cap_lock, plan_key '',
--   unit 'c:' || group_id), its cap read through the group_cap placeholder
--   (group_cap_on.sql: max_running; group_cap.sql, an application's relation: none).
--   The proof (claim.sql) drops an unread bound of a capped owner whose allowance is
--   already used by candidates before that bound: no job it bounds would be taken. It
--   drops a bound for a capped group's used allowance only when the bound is of that
--   group's jobs alone (gbound: by group, a group's next job, 'per'), never an owner's
--   cut (by owner: it bounds the owner's other groups too). A
--   bound that stands for the jobs of many owners always counts: the bound of the
--   groups (owners) not probed, and the first job read past the candidates ('cand'),
--   which bounds every job read after it, whoever's (its own owner's used allowance
--   says nothing of theirs).
-- Needs:   CTEs clock, cap_plans (cap_prelude_on.sql), ordered(..., group_id, ...),
--          unread(..., bgroup: the group of the job a bound belongs to, or null;
--          gbound); parameter candidates.
-- Defines: CTEs cap_groups, cap_units, group_units, capped, passed_g, passed_u,
--          cand(id, group_id, priority, v, fair, created_at, plan_key, unit, ord: the
--          candidates kept, renumbered),
--          unread_open(priority, v, fair, created_at, id, need), cap_slots(id, plan,
--          owner): the slot each candidate of a capped owner would hold (jobs.slot_plan
--          and slot_owner, which cap_prelude_on.sql counts).
-- The groups of capped plans among the candidates and the unread bounds, from the
-- groups relation itself (owner and plan as this statement's snapshot sees them): a cap
-- holds whatever the bookkeeping's copies say.
cap_groups AS MATERIALIZED (
    SELECT g.group_id::text AS group_id, 'p:' || g.plan::text AS plan_key,
           CASE WHEN g.owner_id IS NULL THEN 'g:' || g.group_id::text
                ELSE 'o:' || g.owner_id::text END AS unit,
           g.owner_id::text AS owner_id, g.plan::text AS plan, cp.cap
    FROM {groups} g
    JOIN cap_plans cp ON cp.plan = g.plan::text
    WHERE g.group_id::text IN (SELECT o.group_id FROM ordered o
                               WHERE o.ord <= %(candidates)s
                               UNION
                               SELECT u.bgroup FROM unread u)
),
-- The capped owners with candidates, in (plan_key, unit) order, each locked and its
-- allowance counted: its cap less its running jobs as last committed (0 when another
-- claimer holds it).
cap_units AS MATERIALIZED (
    SELECT x.plan_key, x.unit,
           coalesce(greatest(x.cap - {schema}.fair_cap_lock(
               x.plan_key, x.unit,
               CASE WHEN x.owner_id IS NULL THEN ARRAY[x.group_id]
                    ELSE ARRAY(SELECT g.group_id::text FROM {groups} g
                               WHERE g.owner_id::text = x.owner_id
                                 AND g.plan::text = x.plan) END,
               (SELECT c.stale_before FROM clock c)), 0), 0) AS allowance
    FROM (SELECT DISTINCT ON (cg.plan_key, cg.unit) cg.plan_key, cg.unit, cg.cap,
                 cg.owner_id, cg.group_id, cg.plan
          FROM cap_groups cg
          WHERE cg.group_id IN (SELECT o.group_id FROM ordered o
                                WHERE o.ord <= %(candidates)s)
          ORDER BY cg.plan_key, cg.unit) x
    ORDER BY x.plan_key, x.unit
),
-- The capped groups with candidates, in group_id order, each locked and its allowance
-- counted: its cap less its running jobs (every type) as last committed, 0 when another
-- claimer holds it.
group_units AS MATERIALIZED (
    SELECT x.group_id,
           coalesce(greatest(x.cap - {schema}.fair_cap_lock(
               '', 'c:' || x.group_id, ARRAY[x.group_id],
               (SELECT c.stale_before FROM clock c)), 0), 0) AS allowance
    FROM (SELECT g.group_id::text AS group_id, {group_cap} AS cap
          FROM {groups} g
          WHERE g.group_id::text IN (SELECT o.group_id FROM ordered o
                                     WHERE o.ord <= %(candidates)s)) x
    WHERE x.cap IS NOT NULL
    ORDER BY x.group_id
),
-- The candidates of a capped owner or of a capped group (usually none), with their
-- allowances; the stages below rank only these (ranking every candidate in each stage
-- was three sorts of all of them: bench/RESULTS.md, section 29).
capped AS MATERIALIZED (
    SELECT o.id, o.group_id, o.ord, cu.plan_key, cu.unit, cu.allowance AS ua,
           gu.allowance AS ga
    FROM ordered o
    LEFT JOIN cap_groups cg ON cg.group_id = o.group_id
    LEFT JOIN cap_units cu ON cu.plan_key = cg.plan_key AND cu.unit = cg.unit
    LEFT JOIN group_units gu ON gu.group_id = o.group_id
    WHERE o.ord <= %(candidates)s AND (cu.unit IS NOT NULL OR gu.group_id IS NOT NULL)
),
-- The group stage: a capped group keeps its first `allowance` candidates; the rest
-- are passed over.
passed_g AS (
    SELECT x.id
    FROM (SELECT c.id, c.ga,
                 row_number() OVER (PARTITION BY c.group_id ORDER BY c.ord) AS grank
          FROM capped c WHERE c.ga IS NOT NULL) x
    WHERE x.grank > x.ga
),
-- The owner stage, over what the group stage kept.
passed_u AS (
    SELECT x.id
    FROM (SELECT c.id, c.ua,
                 row_number() OVER (PARTITION BY c.plan_key, c.unit ORDER BY c.ord)
                   AS urank
          FROM capped c
          WHERE c.ua IS NOT NULL AND c.id NOT IN (SELECT p.id FROM passed_g p)) x
    WHERE x.urank > x.ua
),
cand AS MATERIALIZED (
    SELECT o.id, o.group_id, o.priority, o.v, o.fair, o.created_at, c.plan_key, c.unit,
           row_number() OVER (ORDER BY o.ord) AS ord
    FROM ordered o
    LEFT JOIN capped c ON c.id = o.id
    WHERE o.ord <= %(candidates)s
      AND o.id NOT IN (SELECT p.id FROM passed_g p)
      AND o.id NOT IN (SELECT p.id FROM passed_u p)
),
unread_open AS (
    SELECT u.priority, u.v, u.fair, u.created_at, u.id, u.need
    FROM unread u
    LEFT JOIN cap_groups cg ON cg.group_id = u.bgroup
    LEFT JOIN cap_units cu ON cu.plan_key = cg.plan_key AND cu.unit = cg.unit
    LEFT JOIN group_units gu ON gu.group_id = u.bgroup AND u.gbound
    WHERE (cu.unit IS NULL OR u.need = 'cand'
           OR (SELECT count(*) FROM cand k
               WHERE k.plan_key = cu.plan_key AND k.unit = cu.unit
                 AND (-k.priority, k.v, k.fair, k.created_at, k.id)
                     < (-u.priority, u.v, u.fair, u.created_at, u.id)) < cu.allowance)
      AND (gu.group_id IS NULL
           OR (SELECT count(*) FROM cand k
               WHERE k.group_id = gu.group_id
                 AND (-k.priority, k.v, k.fair, k.created_at, k.id)
                     < (-u.priority, u.v, u.fair, u.created_at, u.id)) < gu.allowance)
),
-- Materialized: the update reads it once per claimed row, and it holds only the capped
-- owners' candidates, where cand holds them all.
cap_slots AS MATERIALIZED (
    SELECT k.id, substr(k.plan_key, 3) AS plan, k.unit AS owner
    FROM cand k WHERE k.unit IS NOT NULL
),
