-- Served-count deltas are append-only and stamped with the writer's transaction id
-- (docs/operations.md, "Long transactions"; docs/fast-claim.md, "Writers: three
-- protocols and one delta rule"). Before, each session updated its own fair_served row
-- in place (the shard rule, fair_shard) and every fold deleted the rows; while a long
-- transaction held the xmin horizon none of those versions could go, and the claim,
-- which summed the type's whole index range, read every one of them (76 % of a
-- pinned claim's reads after one minute, bench/RESULTS.md). Now writers only insert,
-- each fold records a mark below which every delta is folded, and the claim reads from
-- the mark on. Existing deltas keep their meaning: they take this migration's
-- transaction id, above any mark.

ALTER TABLE {schema}.fair_served DROP CONSTRAINT fair_served_pkey;
ALTER TABLE {schema}.fair_served DROP COLUMN shard;
ALTER TABLE {schema}.fair_served ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX fair_served_xid_idx ON {schema}.fair_served (type, xid);
ALTER TABLE {schema}.fair_served REPLICA IDENTITY FULL;

CREATE TABLE {schema}.fair_fold_lock (
    type      text PRIMARY KEY
);

-- Fold marks, per type (no row: 0): every fair_served delta of the type with an xid
-- below the newest mark is folded into served_n, in the same transaction that recorded
-- the mark. Marks only grow; each fold inserts its own and deletes the older ones, so
-- the newest is the first entry of a backward scan of fair_fold_mark_idx whatever dead
-- versions lie below it.
CREATE TABLE {schema}.fair_fold_mark (
    type      text NOT NULL,
    upto      xid8 NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE INDEX fair_fold_mark_idx ON {schema}.fair_fold_mark (type, upto);

ALTER TABLE {schema}.fair_fold_mark REPLICA IDENTITY FULL;

CREATE OR REPLACE FUNCTION {schema}.fair_count_served(
    p_types text[], p_groups text[], p_finished timestamptz[], p_delta int
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_lock_edges(p_types);
    INSERT INTO {schema}.fair_served (type, group_id, n)
    SELECT d.type, d.group_id, p_delta * count(*)::int
    FROM unnest(p_types, p_groups, p_finished) AS d(type, group_id, finished)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id;
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
    -- A heartbeat (running rows that stay running in their type and group) changes no
    -- count and notes nothing.
    IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status <> 'running')
       AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.status <> 'running')
       AND NOT EXISTS (SELECT 1
                       FROM (SELECT o.id, o.type, o.group_id FROM old_rows o
                             UNION ALL
                             SELECT n.id, n.type, n.group_id FROM new_rows n) x
                       GROUP BY x.id
                       HAVING count(DISTINCT (x.type, x.group_id)) > 1) THEN
        RETURN NULL;
    END IF;
    -- Served counts: a row counts while it is running, or done at or after its type's
    -- edge. Each changed row takes its old version's count away and adds its new one's,
    -- netted per (type, group): a completion (running to done) writes nothing; a claim
    -- adds one per job; a row whose counted state did not change nets to nothing. The
    -- net is appended as new rows (the delta rule).
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
    SELECT v.type, v.group_id, sum(v.delta)::int
    FROM (SELECT o.type, o.group_id, o.id, o.status, o.finished_at, -1 AS delta
          FROM old_rows o
          UNION ALL
          SELECT n.type, n.group_id, n.id, n.status, n.finished_at, 1
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
        -- Done jobs between the old and the new edge leave (forward) or enter (back).
        INSERT INTO {schema}.fair_served (type, group_id, n)
        SELECT p_type, j.group_id,
               (CASE WHEN p_target > old_edge THEN -1 ELSE 1 END) * count(*)::int
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
    folded integer;
    mark xid8;
    new_mark xid8;
    had_deltas boolean;
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
    had_deltas := gs IS NOT NULL;
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
    IF gs IS NULL THEN
        RETURN 0;
    END IF;
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
        -- The first ready job among the 200 oldest: read in index order, the scan stops
        -- at it (rather than taking the min over all 200).
        LEFT JOIN LATERAL (
            SELECT o.created_at, o.id FROM (
                SELECT j.created_at, j.id, j.run_after FROM {schema}.jobs j
                WHERE j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
                ORDER BY j.created_at, j.id LIMIT 200) o
            WHERE o.run_after <= p_now
            ORDER BY o.created_at, o.id LIMIT 1) rh ON true
        LEFT JOIN LATERAL (
            SELECT j.created_at, j.id FROM {schema}.jobs j
            WHERE j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
            ORDER BY j.created_at, j.id LIMIT 1) ah ON true
    )
    UPDATE {schema}.fair_groups fg
    SET served_n = fg.served_n + b.n,
        head_lb = coalesce(b.ready_head, b.any_head, 'infinity'),
        head_id = coalesce(b.ready_id, b.any_id, 0),
        head_until = CASE WHEN b.ready_head IS NULL THEN 'infinity'
                          ELSE coalesce(b.next_due, 'infinity') END,
        ready_lb = coalesce(b.ready, 'infinity')
    FROM b0 b
    WHERE fg.type = p_type AND fg.group_id = b.group_id;
    GET DIAGNOSTICS folded = ROW_COUNT;
    -- Drop rows with nothing left to say (no pending job, no served count).
    DELETE FROM {schema}.fair_groups fg
    USING unnest(gs) AS x(group_id)
    WHERE fg.type = p_type AND fg.group_id = x.group_id
      AND fg.served_n = 0 AND fg.ready_lb = 'infinity';
    -- The new mark, after the deltas moved (a fold that found none keeps the old one, so
    -- an idle queue writes no mark). Deltas left behind hold it at their xid.
    IF had_deltas THEN
        SELECT least(new_mark, min(f.xid)) INTO new_mark
        FROM {schema}.fair_served f WHERE f.type = p_type AND f.xid >= mark;
        IF new_mark > mark THEN
            INSERT INTO {schema}.fair_fold_mark (type, upto) VALUES (p_type, new_mark);
            DELETE FROM {schema}.fair_fold_mark m WHERE m.type = p_type AND m.upto < new_mark;
        END IF;
    END IF;
    RETURN folded;
END
$$;

DROP FUNCTION {schema}.fair_shard(boolean);
