-- A cheaper enqueue trigger for a batch, and a cheaper fold.
--
-- fair_jobs_insert grouped the inserted jobs by (type, group_id) and then counted the
-- distinct pairs again in a second pass over the transition table, which took half of
-- its usual statement's time for a batch of 1,000 jobs. It now groups them once and
-- counts the groups from that. What it locks, in which order, and when it returns early
-- are unchanged.
--
-- fair_fold's statements were planned again at every fold (custom plans, a quarter of
-- its time); its settings already make every plan the same for any argument, so it now
-- keeps generic plans.

CREATE OR REPLACE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
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

ALTER FUNCTION {schema}.fair_fold(text, timestamptz) SET plan_cache_mode = force_generic_plan;
