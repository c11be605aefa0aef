-- The jobs UPDATE trigger compares a row's old and new versions by grouping the
-- transition tables by id instead of joining them. Its statements have no parameters,
-- so each session plans them once, for the rows of its first call: a join planned for a
-- claim of one job (a nested loop) compared every pair of a later 1,000-job claim,
-- release or heartbeat, about a second each (docs/design.md, "The fair claim"). Its net
-- change goes to the writing session's shard, so concurrent claimers share no row. And
-- fair_still_claimable, which the claim asks before locking a candidate.
CREATE OR REPLACE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    edges text[];
BEGIN
    -- Old and new versions of a row are compared by grouping both transition tables by
    -- id (a sort or a hash, whatever the plan), never by joining them: these statements
    -- have no parameters, so each session plans them once, for the rows of its first
    -- call, and a join planned for a few rows (a nested loop) compared every pair of a
    -- later 1,000-row claim, release or heartbeat (about a second each).
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
    -- net goes to this session's shard (its backend pid), so concurrent claimers never
    -- wait on each other's bookkeeping rows (with a shard per job id, claims of many
    -- groups queued behind one another); only the sum over a group's shards matters.
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
    SELECT v.type, v.group_id, (pg_backend_pid() % 32767)::smallint, sum(v.delta)::int
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

-- Whether a claim candidate is still claimable as last committed (the claim's lock step
-- asks before locking it). VOLATILE, so its query reads a snapshot of its own: a row
-- another claimer took after the claim's snapshot is passed over instead of locked. A
-- lock taken on such a row would not be given back when the row then failed the
-- claim's recheck, and held that worker's completion of it until the claim committed
-- (with several workers, claims and completions queued behind one another for seconds).
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
