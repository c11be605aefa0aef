-- The upkeep's edge move (fair_advance) no longer makes a type's missing fair_edge row.
-- It inserted it (ON CONFLICT DO NOTHING) after the fold of the same upkeep statement had
-- locked the rows of the groups it folds (fair_groups, FOR UPDATE SKIP LOCKED); when the
-- type's first completion, in a transaction still open, had inserted the row
-- (fair_lock_edges), the insert waited for that transaction, and that transaction's next
-- enqueue into one of those groups (FOR KEY SHARE, fair_jobs_insert) waited for the
-- upkeep: a deadlock. The first counting writer makes the row, as before; until it
-- commits, the edge stays '-infinity' and the upkeep moves nothing (returns false, as
-- when a writer holds the row). Only the function changes.

CREATE OR REPLACE FUNCTION {schema}.fair_advance(p_type text, p_target timestamptz)
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
