-- fair_fold (010) renews each folded group's head bound from the oldest job ready now
-- among its 200 oldest pending jobs. It took the min over all 200 of them, so a round of
-- the claim upkeep over 100 groups with a backlog read 20,000 index entries (8 ms, and
-- a worker claiming 25 jobs at a time runs a round every few claims). The same value
-- is the first ready one in index order, where the scan can stop. The rest of the
-- function is 010's, unchanged.
CREATE OR REPLACE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    gs text[];
    missing text[];
    folded integer;
BEGIN
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_done f WHERE f.type = p_type;
    IF gs IS NOT NULL THEN
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO missing
        FROM unnest(gs) AS x(group_id)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups g
                          WHERE g.type = p_type AND g.group_id = x.group_id);
        IF missing IS NOT NULL THEN
            PERFORM {schema}.fair_insert_groups(
                array_fill(p_type, ARRAY[cardinality(missing)]), missing,
                array_fill('infinity'::timestamptz, ARRAY[cardinality(missing)]),
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
        DELETE FROM {schema}.fair_done d
        WHERE d.ctid = ANY (ARRAY(
            SELECT f.ctid FROM {schema}.fair_done f
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
               -- The first ready job among the 200 oldest: read in index order, the
               -- scan stops at it (010 read all 200 to take their min: a fold of 100
               -- groups of a backlog cost 8 ms).
               (SELECT o.created_at FROM (
                    SELECT j.created_at, j.run_after FROM {schema}.jobs j
                    WHERE j.type = p_type AND j.group_id = g.group_id
                      AND j.status = 'pending'
                    ORDER BY j.created_at, j.id LIMIT 200) o
                WHERE o.run_after <= p_now
                ORDER BY o.created_at LIMIT 1) AS ready_head,
               (SELECT min(j.created_at) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending') AS any_head,
               (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending'
                  AND j.run_after > p_now) AS next_due
        FROM unnest(gs) AS g(group_id)
        LEFT JOIN sums sm ON sm.group_id = g.group_id
    )
    UPDATE {schema}.fair_groups fg
    SET done_n = fg.done_n + b.n,
        head_lb = coalesce(b.ready_head, b.any_head, 'infinity'),
        head_until = CASE WHEN b.ready_head IS NULL THEN 'infinity'
                          ELSE coalesce(b.next_due, 'infinity') END,
        ready_lb = coalesce(b.ready, 'infinity')
    FROM b0 b
    WHERE fg.type = p_type AND fg.group_id = b.group_id;
    GET DIAGNOSTICS folded = ROW_COUNT;
    -- Drop rows with nothing left to say (no pending job, no done count).
    DELETE FROM {schema}.fair_groups fg
    USING unnest(gs) AS x(group_id)
    WHERE fg.type = p_type AND fg.group_id = x.group_id
      AND fg.done_n = 0 AND fg.ready_lb = 'infinity';
    RETURN folded;
END
$$;
