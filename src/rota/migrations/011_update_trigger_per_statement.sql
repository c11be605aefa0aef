-- The fair-claim bookkeeping for UPDATEs of jobs, once per statement instead of once per
-- row (issue 4: drain throughput). 010's row trigger called fair_count_done for each
-- completed job (a plpgsql call, an advisory lock and an upsert per row: about 50 µs a
-- job, most of a 1,000-job complete_many). This statement trigger reads the changed rows
-- from the transition tables and handles each kind of change set-based, with the same
-- rules as the row trigger's WHEN clause and body:
--   a row that leaves 'done' (or changes its type, group or finish time) is uncounted,
--   a row that enters 'done' (or changes them) is counted,
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
    -- Rows whose change matters, as in 010's WHEN clause: `changed` below.
    -- Completions, the hot path: counted straight from the transition tables (what
    -- fair_count_done does with arrays: the types' shared edge locks in type order, then
    -- one upsert of the per-shard deltas, in key order).
    IF EXISTS (SELECT 1 FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL)
    THEN
        PERFORM pg_advisory_xact_lock_shared({schema}.fair_edge_key(x.type))
        FROM (SELECT DISTINCT n.type FROM new_rows n
              WHERE n.status = 'done' AND n.group_id IS NOT NULL ORDER BY 1) x;
        INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
        SELECT n.type, n.group_id, (n.id % 8)::smallint, count(*)::int
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id
        LEFT JOIN {schema}.fair_edge e ON e.type = n.type
        WHERE n.status = 'done' AND n.group_id IS NOT NULL
          AND n.finished_at >= coalesce(e.edge, '-infinity')
          AND (o.status IS DISTINCT FROM n.status
               OR o.type IS DISTINCT FROM n.type
               OR o.group_id IS DISTINCT FROM n.group_id
               OR o.finished_at IS DISTINCT FROM n.finished_at
               OR o.created_at IS DISTINCT FROM n.created_at
               OR o.run_after > n.run_after)
        GROUP BY 1, 2, 3
        ORDER BY 1, 2, 3
        ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
    END IF;
    -- The rare rest: rows leaving 'done' (a retry of a done job) and rows put into
    -- pending (fail with retries left, defer, release, retry). A claim or a heartbeat
    -- (running rows only) stops at these two scans.
    IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status = 'done')
       AND NOT EXISTS (SELECT 1 FROM new_rows n
                       WHERE n.status = 'pending' AND n.group_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(o.type) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_types,
           array_agg(o.group_id) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_groups,
           array_agg(o.id) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_ids,
           array_agg(o.finished_at) FILTER (WHERE o.status = 'done'
                                              AND o.group_id IS NOT NULL) AS un_finished,
           array_agg(n.type) FILTER (WHERE n.status = 'pending' AND n.group_id IS NOT NULL)
               AS pe_types,
           array_agg(n.group_id) FILTER (WHERE n.status = 'pending'
                                           AND n.group_id IS NOT NULL) AS pe_groups,
           array_agg(n.created_at) FILTER (WHERE n.status = 'pending'
                                             AND n.group_id IS NOT NULL) AS pe_heads,
           array_agg(n.run_after) FILTER (WHERE n.status = 'pending'
                                            AND n.group_id IS NOT NULL) AS pe_readies
    INTO r
    FROM old_rows o JOIN new_rows n ON n.id = o.id
    WHERE (o.status = 'done' OR (n.status = 'pending' AND n.group_id IS NOT NULL))
      AND (o.status IS DISTINCT FROM n.status
           OR o.type IS DISTINCT FROM n.type
           OR o.group_id IS DISTINCT FROM n.group_id
           OR o.finished_at IS DISTINCT FROM n.finished_at
           OR o.created_at IS DISTINCT FROM n.created_at
           OR o.run_after > n.run_after);
    IF r.un_types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.un_types, r.un_groups, r.un_ids,
                                         r.un_finished, -1);
    END IF;
    IF r.pe_types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.pe_types, r.pe_groups, r.pe_heads,
                                           r.pe_readies);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_update
    AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_update();
