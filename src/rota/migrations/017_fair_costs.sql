-- Fair by what the work costs (docs/design.md, "Cost"): a job counts its cost in its
-- group's served count, not 1. jobs.cost is the type's expected cost while the job runs
-- (fair_costs, kept by the fold) and what its handler charged once it is done (1 when it
-- charged nothing, so an application that never charges is ordered as before). The
-- served counts become numeric; every writer counts costs instead of rows.

ALTER TABLE {schema}.jobs ADD COLUMN cost numeric NOT NULL DEFAULT 1
    CONSTRAINT jobs_cost_check CHECK (cost > 0 AND cost <= 1000000000);
ALTER TABLE {schema}.fair_groups ALTER COLUMN served_n TYPE numeric;
ALTER TABLE {schema}.fair_owners ALTER COLUMN served_n TYPE numeric,
                                 ALTER COLUMN b_served TYPE numeric;
ALTER TABLE {schema}.fair_owner_changes ALTER COLUMN n TYPE numeric;
ALTER TABLE {schema}.fair_served ALTER COLUMN n TYPE numeric;
-- The claim's edge correction, the edge moves and the dashboard sum done jobs' costs
-- from this index, as they counted them from it.
DROP INDEX {schema}.jobs_done_idx;
CREATE INDEX jobs_done_idx ON {schema}.jobs (type, finished_at, group_id) INCLUDE (cost)
    WHERE status = 'done';

CREATE TABLE {schema}.fair_costs (
    type      text PRIMARY KEY,
    expected  numeric NOT NULL CHECK (expected > 0)
);

DROP FUNCTION {schema}.fair_count_served(text[], text[], timestamptz[], int);
DROP FUNCTION {schema}.fair_insert_groups(text[], text[], timestamptz[], bigint[],
                                          timestamptz[], int[]);

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

CREATE OR REPLACE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    wanted int;
    due int;
    locked int;
    bounded int;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM inserted i
                   WHERE i.status <> 'pending' AND i.group_id IS NOT NULL) THEN
        WITH c AS (
            SELECT i.type, i.group_id,
                   (array_agg(i.created_at ORDER BY i.created_at, i.id))[1] AS head,
                   (array_agg(i.id ORDER BY i.created_at, i.id))[1] AS id,
                   min(i.run_after) AS ready, bool_and(i.run_after <= now()) AS due
            FROM inserted i
            WHERE i.group_id IS NOT NULL
            GROUP BY i.type, i.group_id
        )
        SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE c.due),
               count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, due, locked, bounded
        FROM (SELECT (fg.head_lb, fg.head_id) <= (c.head, c.id)
                     AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = due AND due = locked AND locked = bounded THEN
            RETURN NULL;
        END IF;
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

CREATE OR REPLACE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
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

CREATE OR REPLACE FUNCTION {schema}.fair_jobs_delete() RETURNS trigger
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

CREATE OR REPLACE FUNCTION {schema}.fair_advance(p_type text, p_target timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    old_edge timestamptz;
BEGIN
    INSERT INTO {schema}.fair_edge (type, edge) VALUES (p_type, '-infinity')
    ON CONFLICT (type) DO NOTHING;
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
    fns numeric[];
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
            SELECT mv.group_id, sum(mv.n) AS n FROM moved mv GROUP BY mv.group_id
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
        FROM (SELECT u.plan_key, u.unit, sum(u.n) AS n FROM upd u
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
