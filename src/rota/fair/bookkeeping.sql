-- == The fair claim's bookkeeping (docs/fast-claim.md) ===================================
--
-- It lets the claim rank groups without reading the backlog, and is kept exact by
-- triggers on jobs (enqueue, batch enqueue, claim, complete, fail, defer, release, stuck
-- sweep, retry, pruning, and any future statement), so no write path can forget it.
-- Nothing here is a hot spot: no row is updated by every claim or every completion of
-- a group (see each table).
--
-- A group's served count (docs/fast-claim.md#the-bookkeeping-and-its-invariants) is its
-- jobs of the type that are running, or done at or after the type's edge (fair_edge).
-- Running jobs count whatever their lock's age (fair_count_served is given 'infinity'
-- as their finish time, which passes any edge), and the claim subtracts those locked
-- before the window start. A completion (running to done, in one session) nets to no
-- write.
--
-- The rules, each in one place here: the delta rule (fair_served, append-only), the
-- fold mark (fair_fold, fair_fold_mark), the edge lock
-- (fair_lock_edges, taken by every counting writer; fair_advance), the head-bound
-- protocol (FOR KEY SHARE by writers in fair_note_pending_each and fair_note_pending,
-- FOR UPDATE SKIP LOCKED by fair_fold), and the copy of plan and active
-- (fair_groups_changed, fair_insert_groups). src/rota/fair/verify.sql checks every
-- invariant stated here; src/rota/fair/repair.sql rebuilds the tables from jobs.

-- Groups of a type that may have pending jobs or a served count, one row each.
-- Head bounds (docs/fast-claim.md#writers-three-protocols-and-one-delta-rule): ready_lb and head_lb
-- are lower bounds of the group's pending jobs' run_after and (created_at, id), the
-- latter as (head_lb, head_id), compared as a row like the claim's key (so jobs that
-- share a created_at, as one statement's do, do not tie). Invariant: for every pending
-- job j with a group, a row (j.type, j.group_id) exists with ready_lb <= j.run_after,
-- and (head_lb, head_id) <= (j.created_at, j.id) or head_until <= j.run_after.
-- So while the queue's clock is before head_until, (head_lb, head_id) bounds the
-- (created_at, id) of every claimable job of the group; after it, the claim treats the head as unknown (the
-- group is probed) until fair_fold renews it. head_until lets jobs deferred far ahead
-- (older than the group's ready jobs) stay out of the bound instead of loosening it.
-- Writers that put a job into pending lower the bounds when needed (rare: a new job is
-- newer than its group's head) and otherwise only take FOR KEY SHARE on the row (shared,
-- like a foreign-key check, so concurrent enqueuers of one group never wait for each
-- other). The claim's upkeep raises the bounds afterwards (fair_fold) with FOR UPDATE
-- SKIP LOCKED, which skips a row while any writer that relied on it is still open.
-- served_n is the group's folded served count (fair_served holds the changes not yet
-- folded). A group with no pending job keeps its row (bounds 'infinity': ready_lb
-- 'infinity' means no pending job) while served_n > 0, so the claim reads one row per
-- group.
-- plan and active copy rota's own groups table (kept by the trigger on it, in the same
-- transaction as the change, so a plan change or a pause takes effect at the next claim
-- without touching a job); they let the claim walk each plan's groups through
-- fair_groups_walk_idx instead of reading every group. A queue whose groups relation is
-- an application's view reads plan and active from it at claim time instead.
CREATE TABLE {schema}.fair_groups (
    type       text NOT NULL,
    group_id   text NOT NULL,
    head_lb    timestamptz NOT NULL,
    head_until timestamptz NOT NULL DEFAULT 'infinity',
    ready_lb   timestamptz NOT NULL,
    served_n   numeric NOT NULL DEFAULT 0,
    plan       text,
    active     boolean NOT NULL DEFAULT true,
    head_id    bigint NOT NULL DEFAULT 0,  -- with head_lb: a bound of (created_at, id)
    owner_id   text,  -- rota's groups table's owner_id (copied like plan and active)
    -- The unit fair_by "owner" compares (docs/fast-claim.md, "The owner level"): the
    -- owner, or the group itself when it has none; per plan (plan_key: '' for none).
    unit       text GENERATED ALWAYS AS (CASE WHEN owner_id IS NULL THEN 'g:' || group_id
                                              ELSE 'o:' || owner_id END) STORED,
    plan_key   text GENERATED ALWAYS AS (coalesce('p:' || plan, '')) STORED,
    PRIMARY KEY (type, group_id)
) WITH (fillfactor = 70,  -- room for HOT updates
       -- small and rewritten all the time: vacuum it often, not at 20% dead rows
       autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

-- The claim's walk: per type and plan, active groups with pending jobs by served count
-- and head (a lower bound of each group's first job's key within its plan).
CREATE INDEX fair_groups_walk_idx ON {schema}.fair_groups (type, plan, served_n, head_lb, head_id)
    WHERE active AND head_lb < 'infinity';
-- Groups whose head bound has run out (or will): the claim probes them explicitly.
CREATE INDEX fair_groups_expiry_idx ON {schema}.fair_groups (type, head_until)
    WHERE head_until < 'infinity';
-- A groups-table change updates the group's rows of every type (fair_groups_changed).
CREATE INDEX fair_groups_group_idx ON {schema}.fair_groups (group_id);
-- The owner claim's walk of one owner's groups, like fair_groups_walk_idx within a plan.
CREATE INDEX fair_groups_unit_walk_idx
    ON {schema}.fair_groups (type, plan_key, unit, served_n, head_lb, head_id)
    WHERE active AND head_lb < 'infinity';
-- Every group of an owner, for the fold's sums (fair_owners).
CREATE INDEX fair_groups_unit_idx ON {schema}.fair_groups (type, plan_key, unit);

-- The owners' rows (docs/fast-claim.md, "The owner level"), one per (type, plan_key,
-- unit) that has groups, written only by fair_fold (and the rebuild): served_n plus its
-- fair_owner_changes rows the type's fold mark does not cover is the sum of its groups'
-- served_n (a group's served_n changes only in a fold, which computes its owner's row
-- in the same transaction; a plan or owner change appends the move); (b_served,
-- b_head_lb, b_head_id) is a lower bound of (served_n, head_lb, head_id) over its
-- active groups with pending jobs, and ready_lb of their ready_lb, except the groups
-- named in fair_owner_changes the mark does not cover: the claim takes those as
-- special. No writer of jobs or groups locks these rows, so none waits on an owner.
CREATE TABLE {schema}.fair_owners (
    type       text NOT NULL,
    plan_key   text NOT NULL,
    unit       text NOT NULL,
    plan       text,
    served_n   numeric NOT NULL DEFAULT 0,
    b_served   numeric NOT NULL DEFAULT 0,
    b_head_lb  timestamptz NOT NULL DEFAULT 'infinity',
    b_head_id  bigint NOT NULL DEFAULT 0,
    ready_lb   timestamptz NOT NULL DEFAULT 'infinity',
    PRIMARY KEY (type, plan_key, unit)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0,
       autovacuum_vacuum_threshold = 2000);

-- The owner claim's walk: per type and plan, owners with pending work by served count
-- and their best group's bound.
CREATE INDEX fair_owners_walk_idx
    ON {schema}.fair_owners (type, plan_key, served_n, b_served, b_head_lb, b_head_id)
    WHERE b_head_lb < 'infinity';

-- What the owners' rows do not account for yet, stamped with the writer's transaction
-- id (append-only, like fair_served: no row is updated, none written by two
-- transactions): a group whose bounds a writer lowered (fair_note_pending_each), whose
-- row was made (fair_insert_groups) or whose plan, owner or status changed
-- (fair_copy_group), with its owner then (plan_key, unit) and n = the served count it
-- brought to that owner (a move writes -served_n for the old owner and +served_n for
-- the new one; otherwise 0). The owner claim takes these owners and groups as special
-- until fair_fold computes the owners' rows again and deletes the rows its new mark
-- covers (fair_served's fold mark: the claim reads the rows it does not cover).
CREATE TABLE {schema}.fair_owner_changes (
    type      text NOT NULL,
    group_id  text NOT NULL,
    plan_key  text NOT NULL,
    unit      text NOT NULL,
    n         numeric NOT NULL DEFAULT 0,
    xid       xid8 NOT NULL DEFAULT pg_current_xact_id()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

CREATE INDEX fair_owner_changes_xid_idx ON {schema}.fair_owner_changes (type, xid);

ALTER TABLE {schema}.fair_owner_changes REPLICA IDENTITY FULL;

-- The plans present among a type's groups (NULL, no plan, is always walked). Rows are
-- only ever added (INSERT … ON CONFLICT DO NOTHING takes no lock); a plan no longer
-- used costs the claim one empty index probe. The claim reads its levels here rather
-- than by a loose index scan of fair_groups_walk_idx, which meets the dead entries that
-- folding leaves at the head of every plan's range (bench/RESULTS.md has the figures).
CREATE TABLE {schema}.fair_plans (
    type  text NOT NULL,
    plan  text NOT NULL,
    PRIMARY KEY (type, plan)
);

-- Changes to served counts not yet folded into fair_groups.served_n: a job entering
-- running adds 1 and one leaving it takes 1 away; done jobs count while finished at or
-- after the edge. The delta rule, used by every writer (the jobs triggers through
-- fair_count_served and fair_jobs_update; fair_advance): a writer only INSERTs its
-- statement's net change per (type, group), a row of its own stamped with its
-- transaction id (xid). No row is ever updated, and none is written by two
-- transactions, so concurrent claimers, completers and folds never wait on each other's
-- bookkeeping. Only the sum over a group's rows means anything. fair_fold moves the rows
-- into served_n every upkeep round and records a mark (fair_fold_mark): every delta
-- whose xid the type's newest mark covers is folded, so the claim reads only the rest
-- (fair_served_xid_idx), however many dead versions a long transaction keeps (docs/
-- operations.md, "Long transactions"). A fold may also move the deltas it left into
-- one row per group of its own xid. No primary key: REPLICA
-- IDENTITY FULL lets a publication FOR ALL TABLES carry the fold's deletes.
CREATE TABLE {schema}.fair_served (
    type      text NOT NULL,
    group_id  text NOT NULL,
    n         numeric NOT NULL,
    xid       xid8 NOT NULL DEFAULT pg_current_xact_id()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

CREATE INDEX fair_served_xid_idx ON {schema}.fair_served (type, xid);

ALTER TABLE {schema}.fair_served REPLICA IDENTITY FULL;

-- The fold's lock, one row per type, only ever locked (FOR UPDATE SKIP LOCKED by
-- fair_fold), never updated: one fold of a type at a time, and none waits for another.
CREATE TABLE {schema}.fair_fold_lock (
    type      text PRIMARY KEY
);

-- Fold marks, per type (no row: 0 and none open): every fair_served delta and
-- fair_owner_changes row of the type whose xid is below upto and not in open is folded,
-- in the same transaction that recorded the mark; the claim reads the rest (xid at or
-- above upto, or in open: open's xids all lie below upto). Marks only grow; each fold
-- inserts its own and deletes the older ones, so the newest is the first entry of a
-- backward scan of fair_fold_mark_idx whatever dead versions lie below it.
CREATE TABLE {schema}.fair_fold_mark (
    type      text NOT NULL,
    upto      xid8 NOT NULL,
    open      xid8[] NOT NULL DEFAULT '{{}}'
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE INDEX fair_fold_mark_idx ON {schema}.fair_fold_mark (type, upto);

ALTER TABLE {schema}.fair_fold_mark REPLICA IDENTITY FULL;

-- The walks' floors (docs/fast-claim.md, "The walk floors"), per type and plan
-- (plan_key, as fair_groups names it): a lower bound of the walk key of every row the
-- claim's index walk of that plan reads as it stands, so the walk starts at it and not
-- at the front of its index range, where the dead versions of the rows every fold
-- rewrites lie while a long transaction keeps them (bench/RESULTS.md, section 31).
-- level 'group': (served_n, head_lb, head_id) <= that of every active fair_groups row
-- of the plan with a head (head_lb < 'infinity'; fair_groups_walk_idx) that no
-- fair_owner_changes row the type's fold mark does not cover names (the claim takes
-- those groups as special). level 'owner': (served_n, b_served, b_head_lb, b_head_id)
-- <= that of every fair_owners row of the plan with a bound (fair_owners_walk_idx);
-- b_served is the group level's served_n. No row: no floor. 'Infinity': the plan has
-- no such row. Written only by fair_fold (fair_walk_floors), one fold of a type at a
-- time, in the transaction that wrote the rows: every row a fold writes or takes in
-- (a lowered, new or moved group, once the mark covers its change) is in its plans'
-- new floors, and every other row lay at or above the old one. Rows are only inserted
-- (seq one past the plan's newest, read under the fold's lock; no sequence, whose
-- nextval a worker's role would need a grant for) and the older one deleted: the
-- newest is the first entry of a backward scan of fair_walk_floor_idx whatever dead
-- versions lie below it.
CREATE TABLE {schema}.fair_walk_floor (
    type      text NOT NULL,
    level     text NOT NULL CHECK (level IN ('group', 'owner')),
    plan_key  text NOT NULL,
    seq       bigint NOT NULL,
    served_n  numeric NOT NULL,
    b_served  numeric NOT NULL,
    head_lb   timestamptz NOT NULL,
    head_id   bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE INDEX fair_walk_floor_idx ON {schema}.fair_walk_floor (type, level, plan_key, seq);

ALTER TABLE {schema}.fair_walk_floor REPLICA IDENTITY FULL;

-- The expected cost of a type's jobs (docs/design.md, "Cost"): what a job counts in its
-- group's served count while it runs, set on the row by the claim (jobs.cost) and
-- replaced by its charged cost when it completes. It is the mean charged cost of the
-- type's 100 most recently finished done jobs, rounded to 6 decimal places, renewed by
-- fair_fold when it folded something (no row: 1). Written only by the fold, one per
-- type at a time, and only when the mean changed.
CREATE TABLE {schema}.fair_costs (
    type      text PRIMARY KEY,
    expected  numeric NOT NULL CHECK (expected > 0)
);

-- Caps (docs/design.md, "Caps"): one row per capped owner (plan_key, unit, as
-- fair_groups names it) that a claim has taken jobs of, only ever locked, never updated:
-- the claim locks the rows of the capped owners among its candidates (fair_cap_lock),
-- so two claimers never count the same free slot. Rows of owners no longer capped stay
-- (a row an owner; the upkeep does not prune them). A group capped on its own
-- (groups.max_running; docs/design.md, "Caps") has its row too: plan_key '', unit
-- 'c:' || group_id.
CREATE TABLE {schema}.fair_caps (
    plan_key  text NOT NULL,
    unit      text NOT NULL,
    PRIMARY KEY (plan_key, unit)
);

-- Lock a capped owner for this transaction (its fair_caps row, made when missing; FOR
-- UPDATE SKIP LOCKED: never waits) and count its running jobs whose lock is fresh
-- (locked at or after p_stale_before) among its groups p_groups, as last committed:
-- VOLATILE, so the count reads a snapshot taken after the lock, which sees every claim
-- of another claimer that held it. Returns NULL when another transaction holds the
-- owner (the caller takes none of its jobs). The count is a probe of
-- jobs_running_group_idx per group, each group once: asked as one `= ANY` over the
-- groups, a plan made without statistics read every running job of every type
-- through jobs_running_idx instead.
CREATE FUNCTION {schema}.fair_cap_lock(p_plan_key text, p_unit text, p_groups text[],
                                       p_stale_before timestamptz) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.fair_caps (plan_key, unit) VALUES (p_plan_key, p_unit)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM {schema}.fair_caps c
    WHERE c.plan_key = p_plan_key AND c.unit = p_unit
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT count(*)
            FROM (SELECT DISTINCT u.group_id FROM unnest(p_groups) AS u(group_id)) g
            CROSS JOIN LATERAL (
                SELECT 1 FROM {schema}.jobs j
                WHERE j.group_id = g.group_id AND j.status = 'running'
                  AND j.locked_at >= p_stale_before) x);
END
$$;

-- The checkpoint of the served counts per type (no row: -infinity): served_n and
-- fair_served count the done jobs finished at or after the edge. The claim adds an
-- exact correction over [edge, window start) read from jobs_done_idx, so any window and
-- any clock offset give the exact count; fair_advance keeps the edge near the window
-- start so the correction stays small. Counting writers lock the type's row FOR SHARE
-- (fair_lock_edges) while they decide against the edge; fair_advance locks it FOR
-- UPDATE SKIP LOCKED, so no completion straddles a move of the edge. Row locks, never
-- advisory locks: a role without access to this schema cannot take them.
CREATE TABLE {schema}.fair_edge (
    type      text PRIMARY KEY,
    edge      timestamptz NOT NULL
);

-- Lock the edges of these types (fair_edge rows, FOR SHARE, in type order) for a writer
-- that decides against them: fair_advance takes a row FOR UPDATE SKIP LOCKED, so no
-- completion straddles a move of the edge. A type without a row gets one at
-- '-infinity' first (its first counting writer, once), so there is always a row to lock.
-- Row locks, not advisory locks: only roles granted rota's schema can take them.
CREATE FUNCTION {schema}.fair_lock_edges(p_types text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_types) AS t(type)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_edge e WHERE e.type = t.type))
    THEN
        INSERT INTO {schema}.fair_edge (type, edge)
        SELECT DISTINCT t.type, '-infinity'::timestamptz FROM unnest(p_types) AS t(type)
        ORDER BY 1
        ON CONFLICT (type) DO NOTHING;
    END IF;
    PERFORM 1 FROM {schema}.fair_edge e WHERE e.type = ANY (p_types)
    ORDER BY e.type
    FOR SHARE;
END
$$;

-- Set a group's copy of plan, active and owner in its fair_groups rows of every type.
-- Each row that changes is recorded in fair_owner_changes: a move to another owner or
-- plan as -served_n for the old owner and +served_n for the new one, otherwise 0 (the
-- new owner's bounds do not account for the group until the next fold). The rows are
-- locked first (FOR NO KEY UPDATE: writers' FOR KEY SHARE goes on; fair_fold, FOR
-- UPDATE SKIP LOCKED, leaves them and their served_n alone until this commits). No
-- owner's row is touched.
CREATE FUNCTION {schema}.fair_copy_group(p_group text, p_plan text, p_active boolean,
                                         p_owner text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- Locked and recorded first, in a statement of its own (a row locked by the
    -- statement that also updates it would be skipped as updated by that statement).
    WITH changing AS (
        SELECT fg.type, fg.plan_key, fg.unit, fg.served_n
        FROM {schema}.fair_groups fg
        WHERE fg.group_id = p_group
          AND (fg.plan IS DISTINCT FROM p_plan OR fg.active IS DISTINCT FROM p_active
               OR fg.owner_id IS DISTINCT FROM p_owner)
        ORDER BY fg.type
        FOR NO KEY UPDATE
    )
    INSERT INTO {schema}.fair_owner_changes (type, group_id, plan_key, unit, n)
    SELECT c.type, p_group, x.plan_key, x.unit, x.n
    FROM changing c
    CROSS JOIN LATERAL (
        SELECT coalesce('p:' || p_plan, '') AS new_key,
               CASE WHEN p_owner IS NULL THEN 'g:' || p_group
                    ELSE 'o:' || p_owner END AS new_unit) nw
    CROSS JOIN LATERAL (
        -- The new owner (or the same one, for a status change).
        SELECT nw.new_key, nw.new_unit,
               CASE WHEN (nw.new_key, nw.new_unit) = (c.plan_key, c.unit) THEN 0
                    ELSE c.served_n END
        UNION ALL
        -- The old one, when it moves.
        SELECT c.plan_key, c.unit, -c.served_n
        WHERE (nw.new_key, nw.new_unit) <> (c.plan_key, c.unit)) x(plan_key, unit, n);
    UPDATE {schema}.fair_groups SET plan = p_plan, active = p_active, owner_id = p_owner
    WHERE group_id = p_group
      AND (plan IS DISTINCT FROM p_plan OR active IS DISTINCT FROM p_active
           OR owner_id IS DISTINCT FROM p_owner);
    IF p_plan IS NOT NULL THEN
        INSERT INTO {schema}.fair_plans (type, plan)
        SELECT DISTINCT f.type, p_plan FROM {schema}.fair_groups f
        WHERE f.group_id = p_group
        ON CONFLICT DO NOTHING;
    END IF;
END
$$;

-- Keep fair_groups' copy of plan, active and owner (fair_copy_group). A group missing
-- from the table ranks as an active group with no owner, so a delete resets the copy to
-- that.
CREATE FUNCTION {schema}.fair_groups_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM {schema}.fair_copy_group(OLD.group_id, NULL, true, NULL);
    ELSE
        IF TG_OP = 'UPDATE' AND OLD.group_id <> NEW.group_id THEN
            PERFORM {schema}.fair_copy_group(OLD.group_id, NULL, true, NULL);
        END IF;
        PERFORM {schema}.fair_copy_group(NEW.group_id, NEW.plan, NEW.active, NEW.owner_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER groups_fair_changed
    AFTER INSERT OR UPDATE OR DELETE ON {schema}.groups
    FOR EACH ROW EXECUTE FUNCTION {schema}.fair_groups_changed();

-- TRUNCATE fires no row trigger: every group is gone, so each copy becomes a missing
-- group's (no plan, active, no owner), group by group as a delete would make it.
CREATE FUNCTION {schema}.fair_groups_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_copy_group(g.group_id, NULL, true, NULL)
    FROM (SELECT DISTINCT f.group_id FROM {schema}.fair_groups f
          WHERE f.plan IS NOT NULL OR NOT f.active OR f.owner_id IS NOT NULL
          ORDER BY f.group_id) g;
    RETURN NULL;
END
$$;

CREATE TRIGGER groups_fair_truncated
    AFTER TRUNCATE ON {schema}.groups
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_groups_truncated();

-- Insert missing fair_groups rows (bounds and served count as given), copying plan,
-- active and owner from rota's groups table under FOR SHARE of those rows (and recording
-- each new row in fair_owner_changes), so a concurrent plan
-- change either commits first (and is read here) or waits and then updates these rows.
-- Rows that exist are left alone. The head is the first ready job by (created_at, id).
CREATE FUNCTION {schema}.fair_insert_groups(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[], p_served numeric[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH want0 AS (
        SELECT t.type, t.group_id,
               coalesce((array_agg(t.head ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 'infinity') AS head,
               coalesce((array_agg(t.id ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 0) AS head_id,
               min(t.ready) AS ready,
               coalesce(sum(t.served), 0) AS served
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies, p_served)
             AS t(type, group_id, head, id, ready, served)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups f
                          WHERE f.type = t.type AND f.group_id = t.group_id)
        GROUP BY t.type, t.group_id
    ),
    -- The head covers the jobs ready now; older jobs due later cut its validity.
    want AS (
        SELECT w.type, w.group_id, w.head, w.head_id, w.ready, w.served,
               coalesce(min(t.ready) FILTER (WHERE t.ready > now()
                                             AND (t.head, t.id) < (w.head, w.head_id)),
                        'infinity') AS until
        FROM want0 w
        JOIN unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
          ON t.type = w.type AND t.group_id = w.group_id
        GROUP BY w.type, w.group_id, w.head, w.head_id, w.ready, w.served
    ),
    g AS (
        SELECT g.group_id, g.plan, g.active, g.owner_id FROM {schema}.groups g
        WHERE g.group_id IN (SELECT group_id FROM want)
        ORDER BY g.group_id
        FOR SHARE
    ),
    ins AS (
        INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, head_id, head_until,
                                                ready_lb, served_n, plan, active, owner_id)
        SELECT w.type, w.group_id, w.head, w.head_id, w.until, w.ready, w.served, g.plan,
               coalesce(g.active, true), g.owner_id
        FROM want w LEFT JOIN g ON g.group_id = w.group_id
        ORDER BY w.type, w.group_id
        ON CONFLICT (type, group_id) DO NOTHING
        RETURNING fg.type, fg.plan, fg.group_id, fg.plan_key, fg.unit
    ),
    -- A new row: its owner's row does not account for it until the next fold.
    marked AS (
        INSERT INTO {schema}.fair_owner_changes (type, group_id, plan_key, unit)
        SELECT i.type, i.group_id, i.plan_key, i.unit FROM ins i
    )
    INSERT INTO {schema}.fair_plans (type, plan)
    SELECT DISTINCT i.type, i.plan FROM ins i WHERE i.plan IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups, keeping
-- its invariant, one array entry per job as given. Lock first, then lower: fair_fold
-- cannot raise a bound this transaction relies on once the row is locked, and the
-- lowering statement sees its latest value. Called by fair_note_pending, which folds
-- each group's jobs due now into one entry first.
CREATE FUNCTION {schema}.fair_note_pending_each(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted int;
    locked int;
BEGIN
    LOOP
        PERFORM {schema}.fair_insert_groups(p_types, p_groups, p_heads, p_ids, p_readies,
                                            NULL);

        SELECT count(DISTINCT (t.type, t.group_id)) INTO wanted
        FROM unnest(p_types, p_groups) AS t(type, group_id);
        -- FOR KEY SHARE: shared among writers; conflicts only with fair_fold's FOR UPDATE.
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM {schema}.fair_groups fg
            WHERE (fg.type, fg.group_id) IN (
                SELECT t.type, t.group_id FROM unnest(p_types, p_groups) AS t(type, group_id))
            ORDER BY fg.type, fg.group_id
            FOR KEY SHARE
        ) l;
        EXIT WHEN locked = wanted;  -- else fair_fold deleted a row in between: again
    END LOOP;

    -- Lower where needed: a job ready now lowers (head_lb, head_id); an older job due
    -- later cuts head_until instead. Rows are locked in key order (FOR NO KEY UPDATE,
    -- which does not conflict with other writers' FOR KEY SHARE), so two writers
    -- lowering the same groups cannot deadlock. Rare: new jobs come after their group's
    -- head. A lowered group is recorded in fair_owner_changes: its owner's bounds do not
    -- account for it until the next fold.
    WITH lowered AS (
    UPDATE {schema}.fair_groups AS fg
    SET head_lb = a.head, head_id = a.head_id, head_until = a.until, ready_lb = a.ready
    FROM (
        SELECT l.type, l.group_id, n.head, n.head_id, n.ready,
               least(l.head_until, m.until) AS until
        FROM {schema}.fair_groups l
        JOIN (
            -- Per group: the first job ready now, the first due time, and the jobs due
            -- later (the row's bounds are read again below, after the lock; this one
            -- only selects which rows to lock).
            SELECT t.type, t.group_id,
                   (array_agg(t.head ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_head,
                   (array_agg(t.id ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_id,
                   min(t.ready) AS min_ready,
                   array_agg(t.head) FILTER (WHERE t.ready > now()) AS due_heads,
                   array_agg(t.id) FILTER (WHERE t.ready > now()) AS due_ids,
                   array_agg(t.ready) FILTER (WHERE t.ready > now()) AS due_readies
            FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
                 AS t(type, group_id, head, id, ready)
            GROUP BY t.type, t.group_id
        ) m0 ON m0.type = l.type AND m0.group_id = l.group_id
        CROSS JOIN LATERAL (
            SELECT CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_head ELSE l.head_lb END AS head,
                   CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_id ELSE l.head_id END AS head_id,
                   least(l.ready_lb, m0.min_ready) AS ready) n
        CROSS JOIN LATERAL (
            SELECT min(d.ready) AS until
            FROM unnest(m0.due_heads, m0.due_ids, m0.due_readies) AS d(head, id, ready)
            WHERE (d.head, d.id) < (n.head, n.head_id)) m
        -- Only rows that change are locked: enqueuers of one group never queue here.
        WHERE (n.head, n.head_id) < (l.head_lb, l.head_id) OR n.ready < l.ready_lb
           OR m.until < l.head_until
        ORDER BY l.type, l.group_id
        FOR NO KEY UPDATE OF l
    ) a
    WHERE fg.type = a.type AND fg.group_id = a.group_id
      AND (fg.head_lb <> a.head OR fg.head_id <> a.head_id OR fg.head_until <> a.until
           OR fg.ready_lb <> a.ready)
    RETURNING fg.type, fg.group_id, fg.plan_key, fg.unit
    )
    INSERT INTO {schema}.fair_owner_changes (type, group_id, plan_key, unit)
    SELECT l.type, l.group_id, l.plan_key, l.unit FROM lowered l;
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups: the entry
-- point of the triggers. Only two things about a group's jobs that are due now matter:
-- their first (created_at, id) and their earliest run_after; jobs due later matter one
-- by one (they may cut the head's validity). So each group's due-now jobs become one
-- entry for fair_note_pending_each and the rest pass through (one entry per job made a
-- batch enqueue slower); and when the rows already bound the new jobs, only the shared
-- locks are taken.
CREATE FUNCTION {schema}.fair_note_pending(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    wanted int;
    locked int;
    bounded int;
BEGIN
    -- The usual enqueue: every job due now, into groups whose rows exist and already
    -- bound them ((head_lb, head_id) <= (created_at, id), ready_lb <= run_after). Then
    -- the invariant holds as it is, and the shared locks are all there is to take: one
    -- statement instead of the several below.
    IF NOT EXISTS (SELECT 1 FROM unnest(p_readies) AS x(ready) WHERE x.ready > now()) THEN
        WITH c AS (
            SELECT t.type, t.group_id, (array_agg(t.head ORDER BY t.head, t.id))[1] AS head,
                   (array_agg(t.id ORDER BY t.head, t.id))[1] AS id, min(t.ready) AS ready
            FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
                 AS t(type, group_id, head, id, ready)
            GROUP BY t.type, t.group_id
        )
        SELECT (SELECT count(*) FROM c), count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, locked, bounded
        FROM (SELECT (fg.head_lb, fg.head_id) <= (c.head, c.id)
                     AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = locked AND locked = bounded THEN
            RETURN;
        END IF;
    END IF;
    SELECT array_agg(c.type) AS types, array_agg(c.group_id) AS groups,
           array_agg(c.head) AS heads, array_agg(c.id) AS ids, array_agg(c.ready) AS readies
    INTO r
    FROM (
        SELECT t.type, t.group_id, (array_agg(t.head ORDER BY t.head, t.id))[1] AS head,
               (array_agg(t.id ORDER BY t.head, t.id))[1] AS id, min(t.ready) AS ready
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
        WHERE t.ready <= now()
        GROUP BY t.type, t.group_id
        UNION ALL
        SELECT t.type, t.group_id, t.head, t.id, t.ready
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
        WHERE t.ready > now()
    ) c;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending_each(r.types, r.groups, r.heads, r.ids,
                                                r.readies);
    END IF;
END
$$;

-- Add the costs p_costs to fair_served for the served jobs (type, group, finished_at)
-- finished at or after their type's edge, under a shared lock of each type's edge row
-- (fair_lock_edges), as new rows (the delta rule). Running jobs are passed with
-- finished_at 'infinity', so they always count. A job counts its cost (docs/design.md,
-- "Cost"): a removed job is passed with its cost negated.
CREATE FUNCTION {schema}.fair_count_served(
    p_types text[], p_groups text[], p_finished timestamptz[], p_costs numeric[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_lock_edges(p_types);
    INSERT INTO {schema}.fair_served (type, group_id, n)
    SELECT d.type, d.group_id, sum(d.cost)
    FROM unnest(p_types, p_groups, p_finished, p_costs) AS d(type, group_id, finished, cost)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id;
END
$$;

-- The bookkeeping triggers on jobs are statement triggers: one set-based pass over the
-- statement's transition tables, so a batch enqueue, a 1,000-job complete_many or a
-- pruning batch pays once, not per row (bench/RESULTS.md has what a row trigger cost).

-- INSERT: new pending jobs are noted in fair_groups; new running or done ones counted.
-- The usual case, every inserted job pending, due now, in a group whose row already
-- bounds it, takes the shared row locks in one statement over the transition table and
-- stops, without building arrays.
CREATE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    bounded boolean;
BEGIN
    -- The usual case in one statement: lock the rows of the inserted jobs' groups (in key
    -- order), then return when every inserted job with a group is pending, due now and
    -- in a group whose row exists and bounds it. A group's jobs are bounded when the row
    -- is at or below (their earliest created_at, their smallest id), which is at or
    -- below each job's (created_at, id); a row that bounds them only taken together
    -- (rare: an id below the row's at its created_at) is left to the steps below, which
    -- test it exactly. Nothing is locked here when a job with a group is inserted
    -- running or done: the steps below take what that needs. The jobs are grouped once
    -- (c), and the groups that must be locked are counted from it: a second pass that
    -- counted the distinct (type, group_id) pairs took half of this statement's time
    -- for a batch of 1,000 (bench/RESULTS.md, section 32).
    WITH c AS MATERIALIZED (
        SELECT i.type, i.group_id, min(i.created_at) AS head, min(i.id) AS id,
               min(i.run_after) AS ready, bool_and(i.run_after <= now()) AS due,
               bool_and(i.status = 'pending') AS pending
        FROM inserted i
        WHERE i.group_id IS NOT NULL
        GROUP BY i.type, i.group_id
    )
    SELECT count(*) = (SELECT count(*) FROM c) AND coalesce(bool_and(l.ok), true)
    INTO bounded
    FROM (SELECT c.due AND (fg.head_lb, fg.head_id) <= (c.head, c.id)
                 AND fg.ready_lb <= c.ready AS ok
          FROM c
          JOIN {schema}.fair_groups fg ON fg.type = c.type AND fg.group_id = c.group_id
          WHERE NOT EXISTS (SELECT 1 FROM c x WHERE NOT x.pending)
          ORDER BY fg.type, fg.group_id
          FOR KEY SHARE OF fg) l;
    IF bounded THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(created_at) AS heads, array_agg(id) AS ids,
           array_agg(run_after) AS readies
    INTO r FROM inserted WHERE status = 'pending' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    -- Served counts: done rows at or after the edge, and running rows (counted whatever
    -- their lock's age, as 'infinity' passes any edge), each by its cost.
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished,
           array_agg(cost) AS costs
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.finished, r.costs);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_insert
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_insert();

-- UPDATE: each changed row is handled set-based by the kind of change:
--   a row that leaves 'done' or 'running' (or changes its type, group or finish time) is
--   uncounted, a row that enters them (or changes those) is counted;
--   a row that is pending with a group after the update, and entered pending or moved
--   its type, group, created_at or earlier run_after, is noted in fair_groups.
-- Statements that change none of that (a heartbeat) find no row and return.
CREATE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    edges text[];
BEGIN
    -- Old and new versions of a row are compared by grouping both transition tables by
    -- id (a sort or a hash, whatever the plan), never by joining them: these statements
    -- have no parameters, so each session plans them once, for the rows of its first
    -- call, and a join planned for a few rows (a nested loop) compares every pair of a
    -- later 1,000-row claim, release or heartbeat.
    -- A heartbeat (running rows that stay running in their type, group and cost) changes
    -- no count and notes nothing.
    IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status <> 'running')
       AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.status <> 'running')
       AND NOT EXISTS (SELECT 1
                       FROM (SELECT o.id, o.type, o.group_id, o.cost FROM old_rows o
                             UNION ALL
                             SELECT n.id, n.type, n.group_id, n.cost FROM new_rows n) x
                       GROUP BY x.id
                       HAVING count(DISTINCT (x.type, x.group_id, x.cost)) > 1) THEN
        RETURN NULL;
    END IF;
    -- Served counts: a row counts its cost while it is running, or done at or after its
    -- type's edge. Each changed row takes its old version's cost away and adds its new
    -- one's, netted per (type, group): a completion (running to done) writes only the
    -- difference between its charged cost and the expected cost it was claimed with
    -- (nothing when they are equal, as with no charge and no charging); a claim adds
    -- the expected cost per job; a row whose counted state did not change nets to
    -- nothing. The net is appended as new rows (the delta rule).
    -- Done rows are decided against the edge under the types' edge rows locked FOR
    -- SHARE, as fair_count_served does.
    SELECT array_agg(x.type) INTO edges
    FROM (SELECT o.type FROM old_rows o WHERE o.status = 'done' AND o.group_id IS NOT NULL
          UNION
          SELECT n.type FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL) x;
    IF edges IS NOT NULL THEN
        PERFORM {schema}.fair_lock_edges(edges);
    END IF;
    INSERT INTO {schema}.fair_served (type, group_id, n)
    SELECT v.type, v.group_id, sum(v.delta)
    FROM (SELECT o.type, o.group_id, o.id, o.status, o.finished_at, -o.cost AS delta
          FROM old_rows o
          UNION ALL
          SELECT n.type, n.group_id, n.id, n.status, n.finished_at, n.cost
          FROM new_rows n) v
    LEFT JOIN {schema}.fair_edge e ON e.type = v.type
    WHERE v.group_id IS NOT NULL
      AND (v.status = 'running'
           OR (v.status = 'done' AND v.finished_at >= coalesce(e.edge, '-infinity')))
    GROUP BY 1, 2
    HAVING sum(v.delta) <> 0;
    -- Rows put into pending (fail with retries left, defer, release, retry) are noted in
    -- fair_groups: those that entered pending, or moved their type, group, created_at or
    -- to an earlier run_after.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.status = 'pending' AND n.group_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(c.type) AS types, array_agg(c.group_id) AS groups,
           array_agg(c.created_at) AS heads, array_agg(c.id) AS ids,
           array_agg(c.run_after) AS readies
    INTO r
    FROM (SELECT x.id,
                 (array_agg(x.status) FILTER (WHERE x.side = 0))[1] AS was_status,
                 (array_agg(x.type) FILTER (WHERE x.side = 0))[1] AS was_type,
                 (array_agg(x.group_id) FILTER (WHERE x.side = 0))[1] AS was_group,
                 (array_agg(x.created_at) FILTER (WHERE x.side = 0))[1] AS was_created,
                 (array_agg(x.run_after) FILTER (WHERE x.side = 0))[1] AS was_ready,
                 (array_agg(x.type) FILTER (WHERE x.side = 1))[1] AS type,
                 (array_agg(x.group_id) FILTER (WHERE x.side = 1))[1] AS group_id,
                 (array_agg(x.created_at) FILTER (WHERE x.side = 1))[1] AS created_at,
                 (array_agg(x.run_after) FILTER (WHERE x.side = 1))[1] AS run_after,
                 bool_or(x.side = 1) AS pending
          FROM (SELECT 0 AS side, o.id, o.status, o.type, o.group_id, o.created_at,
                       o.run_after
                FROM old_rows o
                UNION ALL
                SELECT 1, n.id, n.status, n.type, n.group_id, n.created_at, n.run_after
                FROM new_rows n
                WHERE n.status = 'pending' AND n.group_id IS NOT NULL) x
          GROUP BY x.id) c
    WHERE c.pending
      AND (c.was_status IS DISTINCT FROM 'pending'
           OR c.was_type IS DISTINCT FROM c.type
           OR c.was_group IS DISTINCT FROM c.group_id
           OR c.was_created IS DISTINCT FROM c.created_at
           OR c.was_ready > c.run_after);
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    RETURN NULL;
END
$$;

-- Whether a claim candidate is still claimable as last committed (the claim's lock step
-- asks before locking it). VOLATILE, so its query reads a snapshot of its own: a row
-- another claimer took after the claim's snapshot is passed over instead of locked. A
-- lock taken on such a row would not be given back when the row then failed the
-- claim's recheck, and held that worker's completion of it until the claim committed
-- (with several workers, claims and completions queued behind one another).
CREATE FUNCTION {schema}.fair_still_claimable(p_id bigint, p_now timestamptz,
                                              p_stale_before timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM {schema}.jobs j
        WHERE j.id = p_id AND j.run_after <= p_now
          AND (j.status = 'pending'
               OR (j.status = 'running' AND j.locked_at < p_stale_before
                   AND j.attempts < j.max_attempts)));
END
$$;

CREATE TRIGGER jobs_fair_update
    AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_update();

-- DELETE (pruning, mostly): deleted done rows at or after the edge, and deleted running
-- rows, leave the served counts. A deleted pending job needs nothing: its group's
-- bounds stay valid lower bounds.
CREATE FUNCTION {schema}.fair_jobs_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished,
           array_agg(-cost) AS costs
    INTO r FROM deleted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.finished, r.costs);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_delete
    AFTER DELETE ON {schema}.jobs
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_delete();

-- Move a type's edge to p_target (either direction), recording the change as deltas in
-- fair_served (folded later like any other). Locks the type's edge row FOR UPDATE SKIP
-- LOCKED: when a counting writer holds it (FOR SHARE, fair_lock_edges), it does nothing
-- and returns false (the claim stays exact, its correction is just wider). A type
-- without a row gets none here, and nothing moves: its first counting writer makes it
-- (fair_lock_edges). Making it here waited for that writer's uncommitted insert of the
-- row, while the upkeep's fold, in the same statement, held the rows of the groups it
-- folds (FOR UPDATE), which the writer's next enqueue into one of them (FOR KEY SHARE)
-- waited for: a deadlock (tests/test_fair_lock_order.py). Each statement of a volatile
-- plpgsql function reads a fresh snapshot, so once the row is locked every done job
-- that any counting writer decided on is visible. Only done jobs can sit between two
-- edges: running jobs are counted as finishing at 'infinity'.
CREATE FUNCTION {schema}.fair_advance(p_type text, p_target timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    old_edge timestamptz;
BEGIN
    SELECT e.edge INTO old_edge FROM {schema}.fair_edge e WHERE e.type = p_type
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_target <> old_edge THEN
        -- Done jobs between the old and the new edge leave (forward) or enter (back),
        -- each by its cost.
        INSERT INTO {schema}.fair_served (type, group_id, n)
        SELECT p_type, j.group_id,
               (CASE WHEN p_target > old_edge THEN -1 ELSE 1 END) * sum(j.cost)
        FROM {schema}.jobs j
        WHERE j.type = p_type AND j.status = 'done' AND j.group_id IS NOT NULL
          AND j.finished_at >= least(old_edge, p_target)
          AND j.finished_at < greatest(old_edge, p_target)
        GROUP BY j.group_id;
        UPDATE {schema}.fair_edge SET edge = p_target WHERE type = p_type;
    END IF;
    RETURN true;
END
$$;

-- The walks' floors (fair_walk_floor) of the plans whose rows a fold wrote or took in:
-- p_groups, the groups whose rows it wrote or whose changes its new mark may cover;
-- p_keys and p_units, the owners' rows it wrote. Called by fair_fold under its lock,
-- after those writes. Per plan, the new floor is the least key among the rows of those
-- that the walk reads (the rows as they are now) and the first row of the walk's index
-- from the old floor on: every other row lay at or above the old floor and still does,
-- since only a fold or a recorded change (fair_owner_changes) moves a row's key down
-- or puts a row into a walk. So that index read starts past the dead versions below
-- the old floor, and a floor is written only when it moves.
CREATE FUNCTION {schema}.fair_walk_floors(p_type text, p_groups text[], p_keys text[],
                                          p_units text[]) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    WITH touched AS (
        SELECT f.plan_key, f.served_n, f.head_lb, f.head_id, f.active
        FROM (SELECT DISTINCT x.group_id FROM unnest(p_groups) AS x(group_id)) g
        CROSS JOIN LATERAL (
            SELECT f.plan_key, f.served_n, f.head_lb, f.head_id, f.active
            FROM {schema}.fair_groups f
            -- Newest version first (claim's special_group_row.sql): a held horizon
            -- keeps every version of the row this fold just wrote.
            WHERE f.type = p_type AND f.group_id >= g.group_id AND f.group_id <= g.group_id
            ORDER BY f.group_id DESC LIMIT 1) f
    ),
    old AS (
        SELECT p.plan_key, o.tid, o.seq, o.served_n, o.head_lb, o.head_id
        FROM (SELECT DISTINCT t.plan_key FROM touched t) p
        LEFT JOIN LATERAL (
            SELECT w.ctid AS tid, w.seq, w.served_n, w.head_lb, w.head_id
            FROM {schema}.fair_walk_floor w
            WHERE w.type = p_type AND w.level = 'group' AND w.plan_key = p.plan_key
            ORDER BY w.seq DESC LIMIT 1) o ON true
    ),
    new AS (
        SELECT o.plan_key, o.tid, coalesce(o.seq, 0) + 1 AS seq,
               coalesce(n.served_n, 'Infinity') AS served_n,
               coalesce(n.head_lb, 'infinity') AS head_lb, coalesce(n.head_id, 0) AS head_id,
               o.served_n AS old_served, o.head_lb AS old_head_lb, o.head_id AS old_head_id
        FROM old o
        CROSS JOIN LATERAL (
            SELECT coalesce(o.served_n, '-Infinity') AS served_n,
                   coalesce(o.head_lb, '-infinity') AS head_lb,
                   coalesce(o.head_id, -1) AS head_id) b
        LEFT JOIN LATERAL (
            SELECT x.served_n, x.head_lb, x.head_id FROM (
                SELECT t.served_n, t.head_lb, t.head_id FROM touched t
                WHERE t.plan_key = o.plan_key AND t.active AND t.head_lb < 'infinity'
                UNION ALL
                (SELECT f.served_n, f.head_lb, f.head_id FROM {schema}.fair_groups f
                 WHERE o.plan_key <> '' AND f.type = p_type AND f.plan = substr(o.plan_key, 3)
                   AND f.active AND f.head_lb < 'infinity'
                   AND (f.served_n, f.head_lb, f.head_id) >= (b.served_n, b.head_lb, b.head_id)
                 ORDER BY f.served_n, f.head_lb, f.head_id LIMIT 1)
                UNION ALL
                (SELECT f.served_n, f.head_lb, f.head_id FROM {schema}.fair_groups f
                 WHERE o.plan_key = '' AND f.type = p_type AND f.plan IS NULL
                   AND f.active AND f.head_lb < 'infinity'
                   AND (f.served_n, f.head_lb, f.head_id) >= (b.served_n, b.head_lb, b.head_id)
                 ORDER BY f.served_n, f.head_lb, f.head_id LIMIT 1)) x
            ORDER BY x.served_n, x.head_lb, x.head_id LIMIT 1) n ON true
    ),
    moved AS (
        INSERT INTO {schema}.fair_walk_floor (type, level, plan_key, seq, served_n,
                                              b_served, head_lb, head_id)
        SELECT p_type, 'group', n.plan_key, n.seq, n.served_n, n.served_n, n.head_lb,
               n.head_id
        FROM new n
        WHERE n.tid IS NULL
           OR (n.served_n, n.head_lb, n.head_id)
              IS DISTINCT FROM (n.old_served, n.old_head_lb, n.old_head_id)
        RETURNING plan_key
    )
    DELETE FROM {schema}.fair_walk_floor w
    WHERE w.ctid = ANY (ARRAY(SELECT n.tid FROM new n
                              WHERE n.tid IS NOT NULL
                                AND n.plan_key IN (SELECT m.plan_key FROM moved m)));

    IF p_keys IS NULL THEN
        RETURN;
    END IF;
    WITH touched AS (
        SELECT o.plan_key, o.served_n, o.b_served, o.b_head_lb, o.b_head_id
        FROM (SELECT DISTINCT u.k, u.u FROM unnest(p_keys, p_units) AS u(k, u)) u
        CROSS JOIN LATERAL (
            SELECT o.plan_key, o.served_n, o.b_served, o.b_head_lb, o.b_head_id
            FROM {schema}.fair_owners o
            WHERE o.type = p_type AND o.plan_key = u.k AND o.unit >= u.u AND o.unit <= u.u
            ORDER BY o.unit DESC LIMIT 1) o  -- newest version first, as above
    ),
    old AS (
        SELECT p.plan_key, o.tid, o.seq, o.served_n, o.b_served, o.head_lb, o.head_id
        FROM (SELECT DISTINCT u.k AS plan_key FROM unnest(p_keys) AS u(k)) p
        LEFT JOIN LATERAL (
            SELECT w.ctid AS tid, w.seq, w.served_n, w.b_served, w.head_lb, w.head_id
            FROM {schema}.fair_walk_floor w
            WHERE w.type = p_type AND w.level = 'owner' AND w.plan_key = p.plan_key
            ORDER BY w.seq DESC LIMIT 1) o ON true
    ),
    new AS (
        SELECT o.plan_key, o.tid, coalesce(o.seq, 0) + 1 AS seq,
               coalesce(n.served_n, 'Infinity') AS served_n,
               coalesce(n.b_served, 'Infinity') AS b_served,
               coalesce(n.b_head_lb, 'infinity') AS head_lb,
               coalesce(n.b_head_id, 0) AS head_id,
               o.served_n AS old_served, o.b_served AS old_b_served,
               o.head_lb AS old_head_lb, o.head_id AS old_head_id
        FROM old o
        CROSS JOIN LATERAL (
            SELECT coalesce(o.served_n, '-Infinity') AS served_n,
                   coalesce(o.b_served, '-Infinity') AS b_served,
                   coalesce(o.head_lb, '-infinity') AS head_lb,
                   coalesce(o.head_id, -1) AS head_id) b
        LEFT JOIN LATERAL (
            SELECT x.served_n, x.b_served, x.b_head_lb, x.b_head_id FROM (
                SELECT t.served_n, t.b_served, t.b_head_lb, t.b_head_id FROM touched t
                WHERE t.plan_key = o.plan_key AND t.b_head_lb < 'infinity'
                UNION ALL
                (SELECT w.served_n, w.b_served, w.b_head_lb, w.b_head_id
                 FROM {schema}.fair_owners w
                 WHERE w.type = p_type AND w.plan_key = o.plan_key
                   AND w.b_head_lb < 'infinity'
                   AND (w.served_n, w.b_served, w.b_head_lb, w.b_head_id)
                       >= (b.served_n, b.b_served, b.head_lb, b.head_id)
                 ORDER BY w.served_n, w.b_served, w.b_head_lb, w.b_head_id LIMIT 1)) x
            ORDER BY x.served_n, x.b_served, x.b_head_lb, x.b_head_id LIMIT 1) n ON true
    ),
    moved AS (
        INSERT INTO {schema}.fair_walk_floor (type, level, plan_key, seq, served_n,
                                              b_served, head_lb, head_id)
        SELECT p_type, 'owner', n.plan_key, n.seq, n.served_n, n.b_served, n.head_lb,
               n.head_id
        FROM new n
        WHERE n.tid IS NULL
           OR (n.served_n, n.b_served, n.head_lb, n.head_id)
              IS DISTINCT FROM (n.old_served, n.old_b_served, n.old_head_lb, n.old_head_id)
        RETURNING plan_key
    )
    DELETE FROM {schema}.fair_walk_floor w
    WHERE w.ctid = ANY (ARRAY(SELECT n.tid FROM new n
                              WHERE n.tid IS NOT NULL
                                AND n.plan_key IN (SELECT m.plan_key FROM moved m)));
END
$$;

-- Fold a type's fair_served deltas into fair_groups.served_n (creating missing rows)
-- and, in the same row update, renew those groups' head bounds and those of up to 100
-- groups whose bound ran out, as of p_now (the queue's clock): (head_lb, head_id) the
-- first job ready at p_now (looked for among the group's 200 oldest; when all of those are
-- deferred, the oldest of all, valid forever), valid until the first job due after
-- p_now. One new row version per group per round, since every version leaves an entry
-- in the walk index. No edge lock is needed: deltas and served_n count against the
-- same edge, and a fold moves them in one transaction. Then the owners' rows
-- (fair_owners, which only the fold writes) of the groups folded and of those recorded
-- in fair_owner_changes are computed again from their groups, and the changes its first
-- snapshot covers deleted. It never waits: rows a writer holds (FOR KEY SHARE, a
-- lowering, a plan or owner change) and delta rows another fold holds are left for the
-- next one; while another fold of the type runs (its fair_fold_lock row is locked) it
-- returns 0 at once.
-- The mark: the fold reads the deltas and fair_owner_changes the type's newest mark does
-- not cover, and records as its new mark its first snapshot's: the xids it covers are
-- those below the snapshot's xmax and not in progress when it was taken (its xip list;
-- the fold's own is listed too). Each of those transactions had ended, so each of their
-- rows was visible to the fold's later statements and was folded or, for a group a
-- writer held, left: the left deltas the mark would cover are moved into one row per
-- group stamped with the fold's own xid, which it does not cover. A long transaction
-- that wrote and stays open, whether or not it holds a group's row, is one xid on the
-- list: the claim reads its rows, if any, and not every delta written since it began
-- (bench/RESULTS.md, section 30). A mark is written only when its upto passes the old
-- one's (the old one reads every row not folded); with more than 256 xids on the list
-- (that many transactions open at once), its upto is the oldest of them and none is
-- open, as long as that passes the old one's. Returns the number of groups folded.
CREATE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
-- Its plans do not depend on the statistics (a table never analyzed has none): its
-- statements reach fair_groups' and fair_owners' rows by key or ctid, never reading a
-- table whole, and read a group's jobs in jobs_pending_idx's order from the bound,
-- never sorting all of them (bench/RESULTS.md, section 25). No JIT: a sort or scan that
-- has no other way keeps the cost the settings add, which would compile every plan.
-- Generic plans: with those settings a statement's plan is the same for any argument,
-- and custom plans made each fold plan its statements again, a quarter of its time
-- (bench/RESULTS.md, section 32); but a fold of more than 200 groups plans its
-- statements for its arrays' lengths (below).
LANGUAGE plpgsql SET enable_seqscan = off SET enable_sort = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    gs text[];
    heads timestamptz[];
    head_ids bigint[];
    untils timestamptz[];
    tids tid[];
    lkeys text[];
    lunits text[];
    empties tid[];
    otids tid[];
    missing text[];
    marked text[];
    ukeys text[];
    uunits text[];
    fkeys text[];
    funits text[];
    fns numeric[];
    folded integer := 0;
    mark xid8;
    mark_open xid8[];
    snap pg_snapshot;
    new_mark xid8;
    new_open xid8[];
    left_xids xid8[];
    had_rows boolean;
BEGIN
    INSERT INTO {schema}.fair_fold_lock (type) VALUES (p_type) ON CONFLICT (type) DO NOTHING;
    PERFORM 1 FROM {schema}.fair_fold_lock l WHERE l.type = p_type FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    snap := pg_current_snapshot();
    new_mark := pg_snapshot_xmax(snap);
    new_open := ARRAY(SELECT pg_snapshot_xip(snap));
    -- The fold's own xid, not in its snapshot's list: the transaction that called it may
    -- write deltas after it (a fold inside a writer's transaction).
    IF pg_current_xact_id() < new_mark THEN
        new_open := new_open || pg_current_xact_id();
    END IF;
    SELECT m.upto, m.open INTO mark, mark_open FROM {schema}.fair_fold_mark m
    WHERE m.type = p_type ORDER BY m.upto DESC LIMIT 1;
    mark := coalesce(mark, '0');
    mark_open := coalesce(mark_open, '{{}}');
    -- The rows the mark does not cover: from its upto on, and those of each open xid,
    -- each an index lookup of its own (xid = ANY in one scan was a filter over every
    -- entry of the type, dead ones included: bench/RESULTS.md, section 30).
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM (SELECT f.group_id FROM {schema}.fair_served f
          WHERE f.type = p_type AND f.xid >= mark
          UNION ALL
          SELECT f.group_id FROM unnest(mark_open) AS o(xid)
          CROSS JOIN LATERAL (SELECT f.group_id FROM {schema}.fair_served f
                              WHERE f.type = p_type AND f.xid = o.xid OFFSET 0) f) f;
    SELECT array_agg(DISTINCT l.group_id) INTO marked
    FROM (SELECT l.group_id FROM {schema}.fair_owner_changes l
          WHERE l.type = p_type AND l.xid >= mark
          UNION ALL
          SELECT l.group_id FROM unnest(mark_open) AS o(xid)
          CROSS JOIN LATERAL (SELECT l.group_id FROM {schema}.fair_owner_changes l
                              WHERE l.type = p_type AND l.xid = o.xid OFFSET 0) l) l;
    had_rows := gs IS NOT NULL OR marked IS NOT NULL;
    -- Groups with deltas and no row (dropped when empty, or never made): made first,
    -- before the fold holds any row lock (fair_insert_groups may wait for a writer's
    -- insert of the same row, or its lock on the group; a writer may wait for a row the
    -- fold holds: made after the locks, the two could deadlock).
    IF gs IS NOT NULL THEN
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO missing
        FROM unnest(gs) AS x(group_id)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups g
                          WHERE g.type = p_type AND g.group_id = x.group_id);
        IF missing IS NOT NULL THEN
            PERFORM {schema}.fair_insert_groups(
                array_fill(p_type, ARRAY[cardinality(missing)]), missing,
                array_fill('infinity'::timestamptz, ARRAY[cardinality(missing)]),
                array_fill(0::bigint, ARRAY[cardinality(missing)]),
                array_fill('infinity'::timestamptz, ARRAY[cardinality(missing)]), NULL);
        END IF;
    END IF;
    -- Locked, never waiting, each group's row (its latest version: ctid, owner, and head
    -- bound as it stands, where from its jobs are read below): the groups with deltas
    -- and up to 100 whose bound ran out. Every row of fair_groups the fold touches is
    -- reached by its key or by the ctid read here (rows it holds locked, so no one else
    -- makes a new version of them), never by a scan of the table: without statistics
    -- the planner read it whole, every version a long transaction keeps included
    -- (bench/RESULTS.md, section 25).
    SELECT array_agg(fg.group_id), array_agg(fg.head_lb), array_agg(fg.head_id),
           array_agg(fg.head_until), array_agg(fg.tid), array_agg(fg.plan_key),
           array_agg(fg.unit)
    INTO gs, heads, head_ids, untils, tids, lkeys, lunits
    FROM (SELECT x.group_id FROM unnest(gs) AS x(group_id)
          UNION
          SELECT e.group_id FROM (
              SELECT e.group_id FROM {schema}.fair_groups e
              WHERE e.type = p_type AND e.head_until <= p_now
                AND e.head_until < 'infinity'
              ORDER BY e.head_until LIMIT 100) e) w
    CROSS JOIN LATERAL (
        SELECT f.group_id, f.ctid AS tid, f.plan_key, f.unit, f.head_lb, f.head_id,
               f.head_until
        FROM {schema}.fair_groups f
        WHERE f.type = p_type AND f.group_id = w.group_id
        FOR UPDATE SKIP LOCKED) fg;
    IF gs IS NULL AND marked IS NULL THEN
        RETURN 0;
    END IF;
    -- A fold of many groups (a bulk load, a backlog the upkeep could not fold for a
    -- while): custom plans from here on, which know the arrays' lengths. A generic plan
    -- takes every array for 10 rows, and joined the moved deltas to 10,000 groups in a
    -- nested loop: 20 s where a custom plan takes 0.8 s (bench/RESULTS.md, section 33).
    -- Restored when the function returns (its own SET clause).
    IF coalesce(array_length(gs, 1), 0) + coalesce(array_length(marked, 1), 0) > 200 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    -- The owners to compute again: those of the groups to fold and of the changed groups
    -- (as they are now), and those the changes name.
    SELECT array_agg(x.plan_key), array_agg(x.unit) INTO ukeys, uunits FROM (
        SELECT DISTINCT u.plan_key, u.unit FROM (
            SELECT l.plan_key, l.unit FROM unnest(lkeys, lunits) AS l(plan_key, unit)
            UNION ALL
            SELECT fg.plan_key, fg.unit FROM unnest(marked) AS x(group_id)
            CROSS JOIN LATERAL (
                SELECT f.plan_key, f.unit FROM {schema}.fair_groups f
                WHERE f.type = p_type AND f.group_id = x.group_id
                OFFSET 0) fg  -- a lookup by key each (not pulled up into a join)
            UNION ALL
            SELECT c.plan_key, c.unit FROM {schema}.fair_owner_changes c
            WHERE c.type = p_type AND c.xid >= mark
            UNION ALL
            SELECT c.plan_key, c.unit FROM unnest(mark_open) AS o(xid)
            CROSS JOIN LATERAL (SELECT c.plan_key, c.unit FROM {schema}.fair_owner_changes c
                                WHERE c.type = p_type AND c.xid = o.xid OFFSET 0) c) u
        ORDER BY u.plan_key, u.unit) x;
    IF gs IS NOT NULL THEN
        -- A new statement: its snapshot sees every writer that finished before the locks.
        WITH moved AS (
            DELETE FROM {schema}.fair_served d
            WHERE d.ctid = ANY (ARRAY(
                SELECT f.ctid FROM {schema}.fair_served f
                JOIN unnest(gs) AS x(group_id) ON x.group_id = f.group_id
                WHERE f.type = p_type AND f.xid >= mark
                FOR UPDATE OF f SKIP LOCKED)
                || ARRAY(
                SELECT f.ctid FROM unnest(mark_open) AS o(xid)
                CROSS JOIN LATERAL (SELECT f.ctid FROM {schema}.fair_served f
                                    WHERE f.type = p_type AND f.xid = o.xid
                                      AND f.group_id = ANY (gs)
                                    FOR UPDATE OF f SKIP LOCKED) f))
            RETURNING d.group_id, d.n
        ),
        sums AS (
            SELECT mv.group_id, sum(mv.n) AS n FROM moved mv GROUP BY mv.group_id
        ),
        -- Each group's jobs are read from its head bound on wherever the bound holds
        -- (the head invariant): for its ready jobs while head_until is after now, for all
        -- its pending jobs while head_until is 'infinity'. So the scans start past the
        -- index entries of the jobs claimed before the last fold, which a long
        -- transaction keeps from vacuum. With a ready job found, ready_lb is '-infinity',
        -- a bound of every run_after that says what the exact minimum would (due now),
        -- without a scan of jobs_pending_ready_idx from its start: jobs enqueued in one
        -- statement share run_after, so their entries share a posting list, which no
        -- scan marks dead until vacuum empties it (bench/RESULTS.md, section 25).
        b0 AS (
            SELECT g.group_id, g.tid,
                   coalesce(sm.n, 0) AS n,
                   CASE WHEN rh.created_at IS NOT NULL THEN '-infinity'::timestamptz
                        WHEN ah.created_at IS NULL THEN NULL
                        ELSE (SELECT min(j.run_after) FROM {schema}.jobs j
                              WHERE j.type = p_type AND j.group_id = g.group_id
                                AND j.status = 'pending') END AS ready,
                   rh.created_at AS ready_head, rh.id AS ready_id,
                   ah.created_at AS any_head, ah.id AS any_id,
                   (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                      AND j.group_id = g.group_id AND j.status = 'pending'
                      AND j.run_after > p_now) AS next_due
            FROM unnest(gs, heads, head_ids, untils, tids)
                 AS g(group_id, head_lb, head_id, head_until, tid)
            LEFT JOIN sums sm ON sm.group_id = g.group_id
            -- The first ready job among the 200 oldest from the bound: read in index
            -- order, the scan stops at it (rather than taking the min over all 200).
            LEFT JOIN LATERAL (
                SELECT o.created_at, o.id FROM (
                    SELECT j.created_at, j.id, j.run_after FROM {schema}.jobs j
                    WHERE j.type = p_type AND j.group_id = g.group_id
                      AND j.status = 'pending'
                      AND (j.created_at, j.id)
                          >= (CASE WHEN g.head_until > p_now THEN g.head_lb
                                   ELSE '-infinity' END,
                              CASE WHEN g.head_until > p_now THEN g.head_id ELSE 0 END)
                    ORDER BY j.created_at, j.id LIMIT 200) o
                WHERE o.run_after <= p_now
                ORDER BY o.created_at, o.id LIMIT 1) rh ON true
            -- Without one, the first pending job.
            LEFT JOIN LATERAL (
                SELECT j.created_at, j.id FROM {schema}.jobs j
                WHERE rh.created_at IS NULL
                  AND j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
                  AND (j.created_at, j.id)
                      >= (CASE WHEN g.head_until = 'infinity' THEN g.head_lb
                               ELSE '-infinity' END,
                          CASE WHEN g.head_until = 'infinity' THEN g.head_id ELSE 0 END)
                ORDER BY j.created_at, j.id LIMIT 1) ah ON true
        ),
        upd AS (
            UPDATE {schema}.fair_groups fg
            SET served_n = fg.served_n + b.n,
                head_lb = coalesce(b.ready_head, b.any_head, 'infinity'),
                head_id = coalesce(b.ready_id, b.any_id, 0),
                head_until = CASE WHEN b.ready_head IS NULL THEN 'infinity'
                                  ELSE coalesce(b.next_due, 'infinity') END,
                ready_lb = coalesce(b.ready, 'infinity')
            FROM b0 b
            WHERE fg.ctid = ANY (tids) AND fg.ctid = b.tid
            RETURNING fg.ctid AS tid, fg.plan_key, fg.unit, b.n,
                      fg.served_n = 0 AND fg.ready_lb = 'infinity' AS empty
        )
        -- What each owner's groups gained, for its row below; the rows left with nothing
        -- to say (no pending job, no served count), their new versions.
        SELECT (SELECT count(*) FROM upd)::int, array_agg(x.plan_key), array_agg(x.unit),
               array_agg(x.n), (SELECT array_agg(u.tid) FROM upd u WHERE u.empty)
        INTO folded, fkeys, funits, fns, empties
        FROM (SELECT u.plan_key, u.unit, sum(u.n) AS n FROM upd u
              GROUP BY u.plan_key, u.unit) x;
        IF empties IS NOT NULL THEN
            DELETE FROM {schema}.fair_groups fg WHERE fg.ctid = ANY (empties);
        END IF;
    END IF;
    IF ukeys IS NOT NULL THEN
        -- The owners' rows: their served counts moved on by what their groups gained
        -- above and by the changes taken in here (those its first snapshot covers: their
        -- writers had ended, so the statements above saw them and their owners are among
        -- these; and the fold's own), exactly as recorded; their bounds computed again
        -- from their groups as they are now.
        WITH del AS (
            DELETE FROM {schema}.fair_owner_changes d
            WHERE d.ctid = ANY (ARRAY(
                    SELECT c.ctid FROM {schema}.fair_owner_changes c
                    WHERE c.type = p_type AND c.xid >= mark
                    UNION ALL
                    SELECT c.ctid FROM unnest(mark_open) AS o(xid)
                    CROSS JOIN LATERAL (SELECT c.ctid FROM {schema}.fair_owner_changes c
                                        WHERE c.type = p_type AND c.xid = o.xid
                                        OFFSET 0) c))
              AND ((d.xid < new_mark AND NOT d.xid = ANY (new_open))
                   OR d.xid = pg_current_xact_id())
              AND (d.plan_key, d.unit) IN (SELECT u.k, u.u
                                          FROM unnest(ukeys, uunits) AS u(k, u))
            RETURNING d.plan_key, d.unit, d.n
        ),
        moved AS (
            SELECT m.k, m.u, sum(m.n) AS n FROM (
                SELECT d.plan_key AS k, d.unit AS u, d.n FROM del d
                UNION ALL
                SELECT f.k, f.u, f.n FROM unnest(fkeys, funits, fns) AS f(k, u, n)) m
            GROUP BY m.k, m.u
        ),
        agg AS (
            SELECT u.k AS plan_key, u.u AS unit,
                   (array_agg(fg.served_n ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                    FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1] AS b_served,
                   (array_agg(fg.head_lb ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                    FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1] AS b_head_lb,
                   (array_agg(fg.head_id ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                    FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1] AS b_head_id,
                   min(fg.ready_lb) FILTER (WHERE fg.active) AS ready
            FROM unnest(ukeys, uunits) AS u(k, u)
            LEFT JOIN LATERAL (
                SELECT f.served_n, f.head_lb, f.head_id, f.ready_lb, f.active
                FROM {schema}.fair_groups f
                WHERE f.type = p_type AND f.plan_key = u.k AND f.unit = u.u
                OFFSET 0) fg ON true
            GROUP BY u.k, u.u
        ),
        -- Each owner's row, made when missing (only a fold writes them, one fold of a
        -- type at a time: nothing waits here), in one statement: each row's key is looked
        -- up once (a long transaction keeps every version of it from vacuum).
        upo AS (
            INSERT INTO {schema}.fair_owners AS o (type, plan_key, unit, plan, served_n,
                                                   b_served, b_head_lb, b_head_id,
                                                   ready_lb)
            SELECT p_type, a.plan_key, a.unit,
                   CASE WHEN a.plan_key = '' THEN NULL ELSE substr(a.plan_key, 3) END,
                   coalesce(mv.n, 0), coalesce(a.b_served, 0),
                   coalesce(a.b_head_lb, 'infinity'), coalesce(a.b_head_id, 0),
                   coalesce(a.ready, 'infinity')
            FROM agg a
            LEFT JOIN moved mv ON mv.k = a.plan_key AND mv.u = a.unit
            ON CONFLICT (type, plan_key, unit) DO UPDATE
            SET served_n = o.served_n + excluded.served_n,
                b_served = excluded.b_served,
                b_head_lb = excluded.b_head_lb,
                b_head_id = excluded.b_head_id,
                ready_lb = excluded.ready_lb
            RETURNING o.ctid AS tid, o.served_n
        )
        SELECT array_agg(x.tid) INTO otids FROM upo x WHERE x.served_n = 0;
        -- Owners with no group and nothing served left.
        IF otids IS NOT NULL THEN
            DELETE FROM {schema}.fair_owners o
            WHERE o.ctid = ANY (otids)
              AND NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                              WHERE fg.type = p_type AND fg.plan_key = o.plan_key
                                AND fg.unit = o.unit);
        END IF;
    END IF;
    -- The walks' floors of the plans whose rows it wrote or took in (the groups it
    -- locked, those named in the changes it read, and the owners' rows it wrote).
    PERFORM {schema}.fair_walk_floors(p_type, array_cat(gs, marked), ukeys, uunits);
    -- The expected cost of the type's running jobs, from its latest done jobs
    -- (jobs_done_idx read backwards), when this fold moved something.
    IF folded > 0 THEN
        INSERT INTO {schema}.fair_costs AS fc (type, expected)
        SELECT p_type, round(avg(d.cost), 6)
        FROM (SELECT j.cost FROM {schema}.jobs j
              WHERE j.type = p_type AND j.status = 'done'
              ORDER BY j.finished_at DESC LIMIT 100) d
        HAVING count(*) > 0 AND round(avg(d.cost), 6) > 0
        ON CONFLICT (type) DO UPDATE SET expected = excluded.expected
        WHERE fc.expected <> excluded.expected;
    END IF;
    -- The new mark, after the rows moved (a fold that found none keeps the old one, so
    -- an idle queue writes no mark): the first snapshot's. A mark whose upto does not
    -- pass the old one's is not written: the old one still reads every row not folded,
    -- since it read every row this fold read.
    IF had_rows THEN
        -- The deltas left (groups a writer held) that it would cover: moved into one row
        -- per group under the fold's own xid, which it leaves open (or lies at or above
        -- its upto). Only folds delete deltas, one at a time, so nothing waits here; a
        -- claim sees either the rows or their sum, by whether the fold has committed.
        WITH gone AS (
            DELETE FROM {schema}.fair_served d
            WHERE d.ctid = ANY (ARRAY(
                    SELECT f.ctid FROM {schema}.fair_served f
                    WHERE f.type = p_type AND f.xid >= mark AND f.xid < new_mark
                    UNION ALL
                    SELECT f.ctid FROM unnest(mark_open) AS o(xid)
                    CROSS JOIN LATERAL (SELECT f.ctid FROM {schema}.fair_served f
                                        WHERE f.type = p_type AND f.xid = o.xid
                                        OFFSET 0) f))
              AND d.xid < new_mark AND NOT d.xid = ANY (new_open)
            RETURNING d.group_id, d.n
        )
        INSERT INTO {schema}.fair_served (type, group_id, n)
        SELECT p_type, g.group_id, sum(g.n) FROM gone g
        GROUP BY g.group_id HAVING sum(g.n) <> 0;
        -- Any other row left that it would cover (none: every change it covers was taken
        -- in above) stays open, so no row is ever lost to the claim.
        SELECT array_agg(DISTINCT x.xid) INTO left_xids
        FROM (SELECT f.xid FROM {schema}.fair_served f
              WHERE f.type = p_type AND f.xid >= mark
              UNION ALL
              SELECT l.xid FROM {schema}.fair_owner_changes l
              WHERE l.type = p_type AND l.xid >= mark
              UNION ALL
              SELECT o.xid FROM unnest(mark_open) AS o(xid)
              WHERE EXISTS (SELECT 1 FROM {schema}.fair_served f
                            WHERE f.type = p_type AND f.xid = o.xid)
                 OR EXISTS (SELECT 1 FROM {schema}.fair_owner_changes l
                            WHERE l.type = p_type AND l.xid = o.xid)) x
        WHERE x.xid < new_mark AND NOT x.xid = ANY (new_open);
        new_open := new_open || coalesce(left_xids, '{{}}');
        IF cardinality(new_open) > 256 THEN
            new_mark := (SELECT min(o.x) FROM unnest(new_open) AS o(x));
            new_open := '{{}}';
        END IF;
        IF new_mark > mark THEN
            INSERT INTO {schema}.fair_fold_mark (type, upto, open)
            VALUES (p_type, new_mark, new_open);
            -- From the old mark on: the dead versions of older marks a long transaction
            -- keeps lie below it.
            DELETE FROM {schema}.fair_fold_mark m
            WHERE m.type = p_type AND m.upto >= mark AND m.upto < new_mark;
        END IF;
    END IF;
    RETURN folded;
END
$$;
