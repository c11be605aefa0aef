-- The fair-claim bookkeeping for UPDATEs of jobs, once per statement instead of once per
-- row (issue 4: drain throughput). 010's row trigger called fair_count_done for each
-- completed job (a plpgsql call, an advisory lock and an upsert per row: about 50 µs a
-- job, most of a 1,000-job complete_many). This statement trigger reads the changed rows
-- from the transition tables and handles each kind of change set-based, with the same
-- rules as the row trigger's WHEN clause and body:
--   a row that leaves 'done' or 'running' (or changes its type, group or finish time) is
--   uncounted, a row that enters them (or changes those) is counted (running rows count
--   from migration 014 on),
--   a row that is pending with a group after the update, and entered pending or moved
--   its type, group, created_at or earlier run_after, is noted in fair_groups.
-- Statements that change none of that (a claim, a heartbeat) find no row and return.
DROP TRIGGER jobs_fair_update ON {schema}.jobs;
DROP FUNCTION {schema}.fair_jobs_update();

CREATE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    -- A heartbeat (running rows that stay running in their type and group) changes no
    -- count and notes nothing.
    IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status <> 'running')
       AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.status <> 'running')
       AND NOT EXISTS (SELECT 1 FROM old_rows o JOIN new_rows n ON n.id = o.id
                       WHERE o.type IS DISTINCT FROM n.type
                          OR o.group_id IS DISTINCT FROM n.group_id) THEN
        RETURN NULL;
    END IF;
    -- Served counts (migration 014): a row counts while it is running, or done at or
    -- after its type's edge. Each changed row takes its old version's count away and
    -- adds its new one's, netted per (type, group, shard): a completion (running to
    -- done, same shard) writes nothing; a claim adds one per job. Done rows are decided
    -- against the edge under the types' shared edge locks, as fair_count_done does.
    PERFORM pg_advisory_xact_lock_shared({schema}.fair_edge_key(x.type))
    FROM (SELECT o.type FROM old_rows o WHERE o.status = 'done' AND o.group_id IS NOT NULL
          UNION
          SELECT n.type FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL
          ORDER BY 1) x;
    INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
    SELECT d.type, d.group_id, (d.id % 8)::smallint, sum(d.delta)::int
    FROM (
        SELECT v.type, v.group_id, v.id, v.delta
        FROM old_rows o
        JOIN new_rows n ON n.id = o.id
        CROSS JOIN LATERAL (VALUES (o.type, o.group_id, o.id, o.status, o.finished_at, -1),
                                   (n.type, n.group_id, n.id, n.status, n.finished_at, 1))
             AS v(type, group_id, id, status, finished_at, delta)
        LEFT JOIN {schema}.fair_edge e ON e.type = v.type
        WHERE v.group_id IS NOT NULL
          AND (v.status = 'running'
               OR (v.status = 'done' AND v.finished_at >= coalesce(e.edge, '-infinity')))
          AND (o.status IS DISTINCT FROM n.status
               OR o.type IS DISTINCT FROM n.type
               OR o.group_id IS DISTINCT FROM n.group_id
               OR o.finished_at IS DISTINCT FROM n.finished_at)
    ) d
    GROUP BY 1, 2, 3
    HAVING sum(d.delta) <> 0
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
    -- Rows put into pending (fail with retries left, defer, release, retry) are noted in
    -- fair_groups, as in 010's WHEN clause.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.status = 'pending' AND n.group_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(n.type) AS types, array_agg(n.group_id) AS groups,
           array_agg(n.created_at) AS heads, array_agg(n.run_after) AS readies
    INTO r
    FROM old_rows o JOIN new_rows n ON n.id = o.id
    WHERE n.status = 'pending' AND n.group_id IS NOT NULL
      AND (o.status IS DISTINCT FROM n.status
           OR o.type IS DISTINCT FROM n.type
           OR o.group_id IS DISTINCT FROM n.group_id
           OR o.created_at IS DISTINCT FROM n.created_at
           OR o.run_after > n.run_after);
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.readies);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_update
    AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_update();
