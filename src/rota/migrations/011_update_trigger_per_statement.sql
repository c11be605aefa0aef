-- The fair-claim bookkeeping for UPDATEs of jobs, once per statement instead of once per
-- row (issue 4: drain throughput). 010's row trigger called fair_count_done for each
-- completed job (a plpgsql call, an advisory lock and an upsert per row: about 50 µs a
-- job, most of a 1,000-job complete_many). This statement trigger reads the changed rows
-- from the transition tables and makes one set-based call per kind of change, with the
-- same rules as the row trigger's WHEN clause and body:
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
    -- A claim or a heartbeat only writes running rows: nothing to do (a scan of the
    -- statement's own new rows, no join).
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.status IN ('done', 'pending') AND n.group_id IS NOT NULL) THEN
        IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status = 'done') THEN
            RETURN NULL;
        END IF;
    END IF;
    -- Changed rows as in 010's WHEN clause.
    SELECT array_agg(o.type) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_types,
           array_agg(o.group_id) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_groups,
           array_agg(o.id) FILTER (WHERE o.status = 'done' AND o.group_id IS NOT NULL)
               AS un_ids,
           array_agg(o.finished_at) FILTER (WHERE o.status = 'done'
                                              AND o.group_id IS NOT NULL) AS un_finished,
           array_agg(n.type) FILTER (WHERE n.status = 'done' AND n.group_id IS NOT NULL)
               AS do_types,
           array_agg(n.group_id) FILTER (WHERE n.status = 'done' AND n.group_id IS NOT NULL)
               AS do_groups,
           array_agg(n.id) FILTER (WHERE n.status = 'done' AND n.group_id IS NOT NULL)
               AS do_ids,
           array_agg(n.finished_at) FILTER (WHERE n.status = 'done'
                                              AND n.group_id IS NOT NULL) AS do_finished,
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
    WHERE (o.status = 'done' OR n.status = 'done'
           OR (n.status = 'pending' AND n.group_id IS NOT NULL))
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
    IF r.do_types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.do_types, r.do_groups, r.do_ids,
                                         r.do_finished, 1);
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
