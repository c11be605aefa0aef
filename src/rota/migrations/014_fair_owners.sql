-- Fair by owner (docs/design.md, "The fair claim"; docs/fast-claim.md, "The owner
-- level"): fair_groups copies each group's owner from rota's groups table, as it copies
-- plan and active, and names its owner (unit, per plan: plan_key); fair_owners keeps
-- one row per owner with its groups' served counts summed and a bound of their keys, so
-- the claim by owner walks owners instead of reading every group; fair_owner_changes
-- records what the owners' rows do not account for yet. The owners' rows are built
-- here from the groups' rows as they are.

ALTER TABLE {schema}.fair_groups ADD COLUMN owner_id text;
ALTER TABLE {schema}.fair_groups ADD COLUMN unit text
    GENERATED ALWAYS AS (CASE WHEN owner_id IS NULL THEN 'g:' || group_id
                              ELSE 'o:' || owner_id END) STORED;
ALTER TABLE {schema}.fair_groups ADD COLUMN plan_key text
    GENERATED ALWAYS AS (coalesce('p:' || plan, '')) STORED;
UPDATE {schema}.fair_groups fg SET owner_id = g.owner_id
FROM {schema}.groups g
WHERE g.group_id = fg.group_id AND g.owner_id IS NOT NULL;

CREATE INDEX fair_groups_unit_walk_idx
    ON {schema}.fair_groups (type, plan_key, unit, served_n, head_lb, head_id)
    WHERE active AND head_lb < 'infinity';
-- Every group of an owner, for the fold's sums (fair_owners).
CREATE INDEX fair_groups_unit_idx ON {schema}.fair_groups (type, plan_key, unit);

CREATE TABLE {schema}.fair_owners (
    type       text NOT NULL,
    plan_key   text NOT NULL,
    unit       text NOT NULL,
    plan       text,
    served_n   bigint NOT NULL DEFAULT 0,
    b_served   integer NOT NULL DEFAULT 0,
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

CREATE TABLE {schema}.fair_owner_changes (
    type      text NOT NULL,
    group_id  text NOT NULL,
    plan_key  text NOT NULL,
    unit      text NOT NULL,
    n         integer NOT NULL DEFAULT 0,
    xid       xid8 NOT NULL DEFAULT pg_current_xact_id()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

CREATE INDEX fair_owner_changes_xid_idx ON {schema}.fair_owner_changes (type, xid);

ALTER TABLE {schema}.fair_owner_changes REPLICA IDENTITY FULL;

INSERT INTO {schema}.fair_owners (type, plan_key, unit, plan, served_n, b_served,
                                  b_head_lb, b_head_id, ready_lb)
SELECT fg.type, fg.plan_key, fg.unit, min(fg.plan), sum(fg.served_n),
       coalesce((array_agg(fg.served_n ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                 FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1], 0),
       coalesce((array_agg(fg.head_lb ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                 FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1], 'infinity'),
       coalesce((array_agg(fg.head_id ORDER BY fg.served_n, fg.head_lb, fg.head_id)
                 FILTER (WHERE fg.active AND fg.head_lb < 'infinity'))[1], 0),
       coalesce(min(fg.ready_lb) FILTER (WHERE fg.active), 'infinity')
FROM {schema}.fair_groups fg
GROUP BY fg.type, fg.plan_key, fg.unit;

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

CREATE OR REPLACE FUNCTION {schema}.fair_groups_changed() RETURNS trigger
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

CREATE OR REPLACE FUNCTION {schema}.fair_insert_groups(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[], p_served int[]
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
               coalesce(sum(t.served), 0)::int AS served
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

CREATE OR REPLACE FUNCTION {schema}.fair_note_pending_each(
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

CREATE OR REPLACE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    gs text[];
    missing text[];
    marked text[];
    ukeys text[];
    uunits text[];
    fkeys text[];
    funits text[];
    fns bigint[];
    folded integer := 0;
    mark xid8;
    new_mark xid8;
    had_rows boolean;
BEGIN
    INSERT INTO {schema}.fair_fold_lock (type) VALUES (p_type) ON CONFLICT (type) DO NOTHING;
    PERFORM 1 FROM {schema}.fair_fold_lock l WHERE l.type = p_type FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    new_mark := pg_snapshot_xmin(pg_current_snapshot());
    mark := coalesce((SELECT max(m.upto) FROM {schema}.fair_fold_mark m
                      WHERE m.type = p_type), '0');
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_served f WHERE f.type = p_type AND f.xid >= mark;
    SELECT array_agg(DISTINCT l.group_id) INTO marked
    FROM {schema}.fair_owner_changes l WHERE l.type = p_type AND l.xid >= mark;
    had_rows := gs IS NOT NULL OR marked IS NOT NULL;
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
    SELECT array_agg(l.group_id) INTO gs FROM (
        SELECT fg.group_id FROM {schema}.fair_groups fg
        JOIN (SELECT x.group_id FROM unnest(gs) AS x(group_id)
              UNION
              SELECT e.group_id FROM (
                  SELECT e.group_id FROM {schema}.fair_groups e
                  WHERE e.type = p_type AND e.head_until <= p_now
                    AND e.head_until < 'infinity'
                  ORDER BY e.head_until LIMIT 100) e) w ON w.group_id = fg.group_id
        WHERE fg.type = p_type
        ORDER BY fg.group_id
        FOR UPDATE OF fg SKIP LOCKED
    ) l;
    IF gs IS NULL AND marked IS NULL THEN
        RETURN 0;
    END IF;
    -- The owners to compute again: those of the groups to fold and of the changed groups
    -- (as they are now), and those the changes name; their rows made when missing (only
    -- a fold writes them, one fold of a type at a time: nothing waits here).
    SELECT array_agg(x.plan_key), array_agg(x.unit) INTO ukeys, uunits FROM (
        SELECT DISTINCT u.plan_key, u.unit FROM (
            SELECT fg.plan_key, fg.unit FROM {schema}.fair_groups fg
            WHERE fg.type = p_type AND fg.group_id = ANY (gs || marked)
            UNION ALL
            SELECT c.plan_key, c.unit FROM {schema}.fair_owner_changes c
            WHERE c.type = p_type AND c.xid >= mark) u
        ORDER BY u.plan_key, u.unit) x;
    INSERT INTO {schema}.fair_owners (type, plan_key, unit, plan)
    SELECT p_type, u.k, u.u, CASE WHEN u.k = '' THEN NULL ELSE substr(u.k, 3) END
    FROM unnest(ukeys, uunits) AS u(k, u)
    ON CONFLICT DO NOTHING;
    IF gs IS NOT NULL THEN
        -- A new statement: its snapshot sees every writer that finished before the locks.
        WITH moved AS (
            DELETE FROM {schema}.fair_served d
            WHERE d.ctid = ANY (ARRAY(
                SELECT f.ctid FROM {schema}.fair_served f
                JOIN unnest(gs) AS x(group_id) ON x.group_id = f.group_id
                WHERE f.type = p_type AND f.xid >= mark
                FOR UPDATE OF f SKIP LOCKED))
            RETURNING d.group_id, d.n
        ),
        sums AS (
            SELECT mv.group_id, sum(mv.n)::int AS n FROM moved mv GROUP BY mv.group_id
        ),
        b0 AS (
            SELECT g.group_id,
                   coalesce(sm.n, 0) AS n,
                   (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                      AND j.group_id = g.group_id AND j.status = 'pending') AS ready,
                   rh.created_at AS ready_head, rh.id AS ready_id,
                   ah.created_at AS any_head, ah.id AS any_id,
                   (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                      AND j.group_id = g.group_id AND j.status = 'pending'
                      AND j.run_after > p_now) AS next_due
            FROM unnest(gs) AS g(group_id)
            LEFT JOIN sums sm ON sm.group_id = g.group_id
            -- The first ready job among the 200 oldest: read in index order, the scan
            -- stops at it (rather than taking the min over all 200).
            LEFT JOIN LATERAL (
                SELECT o.created_at, o.id FROM (
                    SELECT j.created_at, j.id, j.run_after FROM {schema}.jobs j
                    WHERE j.type = p_type AND j.group_id = g.group_id
                      AND j.status = 'pending'
                    ORDER BY j.created_at, j.id LIMIT 200) o
                WHERE o.run_after <= p_now
                ORDER BY o.created_at, o.id LIMIT 1) rh ON true
            LEFT JOIN LATERAL (
                SELECT j.created_at, j.id FROM {schema}.jobs j
                WHERE j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
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
            WHERE fg.type = p_type AND fg.group_id = b.group_id
            RETURNING fg.plan_key, fg.unit, b.n
        )
        -- What each owner's groups gained, for its row below.
        SELECT (SELECT count(*) FROM upd)::int, array_agg(x.plan_key), array_agg(x.unit),
               array_agg(x.n)
        INTO folded, fkeys, funits, fns
        FROM (SELECT u.plan_key, u.unit, sum(u.n)::bigint AS n FROM upd u
              GROUP BY u.plan_key, u.unit) x;
        -- Drop rows with nothing left to say (no pending job, no served count).
        DELETE FROM {schema}.fair_groups fg
        USING unnest(gs) AS x(group_id)
        WHERE fg.type = p_type AND fg.group_id = x.group_id
          AND fg.served_n = 0 AND fg.ready_lb = 'infinity';
    END IF;
    IF ukeys IS NOT NULL THEN
        -- The owners' rows: their served counts moved on by what their groups gained
        -- above and by the changes taken in here (those older than the fold's first
        -- snapshot, new_mark, its xmin: their writers had ended, so the statements above
        -- saw them and their owners are among these; and the fold's own), exactly as
        -- recorded; their bounds computed again from their groups as they are now.
        WITH del AS (
            DELETE FROM {schema}.fair_owner_changes d
            WHERE d.type = p_type AND d.xid >= mark
              AND (d.xid < new_mark OR d.xid = pg_current_xact_id())
              AND (d.plan_key, d.unit) IN (SELECT u.k, u.u
                                          FROM unnest(ukeys, uunits) AS u(k, u))
            RETURNING d.plan_key, d.unit, d.n
        ),
        moved AS (
            SELECT m.k, m.u, sum(m.n)::bigint AS n FROM (
                SELECT d.plan_key AS k, d.unit AS u, d.n::bigint AS n FROM del d
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
            LEFT JOIN {schema}.fair_groups fg
              ON fg.type = p_type AND fg.plan_key = u.k AND fg.unit = u.u
            GROUP BY u.k, u.u
        )
        UPDATE {schema}.fair_owners o
        SET served_n = o.served_n + coalesce(mv.n, 0),
            b_served = coalesce(a.b_served, 0),
            b_head_lb = coalesce(a.b_head_lb, 'infinity'),
            b_head_id = coalesce(a.b_head_id, 0),
            ready_lb = coalesce(a.ready, 'infinity')
        FROM agg a
        LEFT JOIN moved mv ON mv.k = a.plan_key AND mv.u = a.unit
        WHERE o.type = p_type AND o.plan_key = a.plan_key AND o.unit = a.unit;
        -- Owners with no group and nothing served left.
        DELETE FROM {schema}.fair_owners o
        USING unnest(ukeys, uunits) AS u(k, u)
        WHERE o.type = p_type AND o.plan_key = u.k AND o.unit = u.u AND o.served_n = 0
          AND NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                          WHERE fg.type = p_type AND fg.plan_key = u.k
                            AND fg.unit = u.u);
    END IF;
    -- The new mark, after the rows moved (a fold that found none keeps the old one, so
    -- an idle queue writes no mark). Rows left behind hold it at their xid.
    IF had_rows THEN
        SELECT least(new_mark, (SELECT min(f.xid) FROM {schema}.fair_served f
                                WHERE f.type = p_type AND f.xid >= mark),
                     (SELECT min(l.xid) FROM {schema}.fair_owner_changes l
                      WHERE l.type = p_type AND l.xid >= mark))
        INTO new_mark;
        IF new_mark > mark THEN
            INSERT INTO {schema}.fair_fold_mark (type, upto) VALUES (p_type, new_mark);
            DELETE FROM {schema}.fair_fold_mark m WHERE m.type = p_type AND m.upto < new_mark;
        END IF;
    END IF;
    RETURN folded;
END
$$;
