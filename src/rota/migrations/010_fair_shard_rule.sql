-- The shard rule stated once: fair_shard() names the fair_served row a writer adds to,
-- and every writer uses it (fair_count_served, which the INSERT and DELETE triggers
-- call, fair_jobs_update, fair_advance). Before, the UPDATE trigger wrote the session's
-- shard, deletes shard id % 8 and edge moves shard 0, each rule in its own function;
-- now deletes write the session's shard too, and edge moves keep shard 0 through the
-- rule. fair_count_served loses its ids argument (the shard no longer depends on a
-- job). fair_note_pending and fair_fold change only comments (timing figures moved to
-- bench/RESULTS.md). Served counts keep their meaning: only the sum over a group's
-- shards is read, so existing rows stay valid.

CREATE FUNCTION {schema}.fair_shard(p_edge_move boolean DEFAULT false) RETURNS smallint
LANGUAGE sql STABLE PARALLEL RESTRICTED
AS $$ SELECT CASE WHEN p_edge_move THEN 0 ELSE pg_backend_pid() % 32767 END::smallint $$;

DROP FUNCTION {schema}.fair_count_served(text[], text[], bigint[], timestamptz[], int);

CREATE FUNCTION {schema}.fair_count_served(
    p_types text[], p_groups text[], p_finished timestamptz[], p_delta int
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_lock_edges(p_types);
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
    SELECT d.type, d.group_id, {schema}.fair_shard(), p_delta * count(*)::int
    FROM unnest(p_types, p_groups, p_finished) AS d(type, group_id, finished)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id
    ORDER BY 1, 2
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
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
    -- their lock's age, as 'infinity' passes any edge).
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.finished, 1);
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
    -- net goes to this session's shard (the shard rule, fair_shard).
    -- Done rows are decided against the edge under the types' edge rows locked FOR
    -- SHARE, as fair_count_served does.
    SELECT array_agg(x.type) INTO edges
    FROM (SELECT o.type FROM old_rows o WHERE o.status = 'done' AND o.group_id IS NOT NULL
          UNION
          SELECT n.type FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL) x;
    IF edges IS NOT NULL THEN
        PERFORM {schema}.fair_lock_edges(edges);
    END IF;
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
    SELECT v.type, v.group_id, {schema}.fair_shard(), sum(v.delta)::int
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
    HAVING sum(v.delta) <> 0
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
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
                          ELSE finished_at END) AS finished
    INTO r FROM deleted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.finished, -1);
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
        INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
        SELECT p_type, j.group_id, {schema}.fair_shard(p_edge_move => true),
               (CASE WHEN p_target > old_edge THEN -1 ELSE 1 END) * count(*)::int
        FROM {schema}.jobs j
        WHERE j.type = p_type AND j.status = 'done' AND j.group_id IS NOT NULL
          AND j.finished_at >= least(old_edge, p_target)
          AND j.finished_at < greatest(old_edge, p_target)
        GROUP BY j.group_id
        ORDER BY j.group_id
        ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
        UPDATE {schema}.fair_edge SET edge = p_target WHERE type = p_type;
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.fair_note_pending(
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

CREATE OR REPLACE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    gs text[];
    missing text[];
    folded integer;
BEGIN
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_served f WHERE f.type = p_type;
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
            WHERE f.type = p_type
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
    RETURN folded;
END
$$;
