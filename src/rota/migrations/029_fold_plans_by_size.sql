-- A fold of many groups plans its statements for its arrays' lengths.
--
-- fair_fold kept generic plans (028), which take every array for 10 rows. A fold of a
-- bulk load or of a backlog the upkeep could not fold for a while joined the moved
-- deltas to its groups in a nested loop: 20 s for 10,000 groups, where custom plans
-- took 0.8 s. Past 200 groups it now switches to custom plans for the rest of the call.

CREATE OR REPLACE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
-- Its plans do not depend on the statistics (a table never analyzed has none): its
-- statements reach fair_groups' and fair_owners' rows by key or ctid, never reading a
-- table whole, and read a group's jobs in jobs_pending_idx's order from the bound,
-- never sorting all of them (bench/RESULTS.md, section 25). No JIT: a sort or scan that
-- has no other way keeps the cost the settings add, which would compile every plan.
-- Generic plans: with those settings a statement's plan is the same for any argument,
-- and custom plans made each fold plan its statements again, a quarter of its time
-- (bench/RESULTS.md, section 32); but a fold of more than 200 groups plans its
-- statements for its arrays' lengths (below).
LANGUAGE plpgsql SET enable_seqscan = off SET enable_sort = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    gs text[];
    heads timestamptz[];
    head_ids bigint[];
    untils timestamptz[];
    tids tid[];
    lkeys text[];
    lunits text[];
    empties tid[];
    otids tid[];
    missing text[];
    marked text[];
    ukeys text[];
    uunits text[];
    fkeys text[];
    funits text[];
    fns numeric[];
    folded integer := 0;
    mark xid8;
    mark_open xid8[];
    snap pg_snapshot;
    new_mark xid8;
    new_open xid8[];
    left_xids xid8[];
    had_rows boolean;
BEGIN
    INSERT INTO {schema}.fair_fold_lock (type) VALUES (p_type) ON CONFLICT (type) DO NOTHING;
    PERFORM 1 FROM {schema}.fair_fold_lock l WHERE l.type = p_type FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    snap := pg_current_snapshot();
    new_mark := pg_snapshot_xmax(snap);
    new_open := ARRAY(SELECT pg_snapshot_xip(snap));
    -- The fold's own xid, not in its snapshot's list: the transaction that called it may
    -- write deltas after it (a fold inside a writer's transaction).
    IF pg_current_xact_id() < new_mark THEN
        new_open := new_open || pg_current_xact_id();
    END IF;
    SELECT m.upto, m.open INTO mark, mark_open FROM {schema}.fair_fold_mark m
    WHERE m.type = p_type ORDER BY m.upto DESC LIMIT 1;
    mark := coalesce(mark, '0');
    mark_open := coalesce(mark_open, '{{}}');
    -- The rows the mark does not cover: from its upto on, and those of each open xid,
    -- each an index lookup of its own (xid = ANY in one scan was a filter over every
    -- entry of the type, dead ones included: bench/RESULTS.md, section 30).
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM (SELECT f.group_id FROM {schema}.fair_served f
          WHERE f.type = p_type AND f.xid >= mark
          UNION ALL
          SELECT f.group_id FROM unnest(mark_open) AS o(xid)
          CROSS JOIN LATERAL (SELECT f.group_id FROM {schema}.fair_served f
                              WHERE f.type = p_type AND f.xid = o.xid OFFSET 0) f) f;
    SELECT array_agg(DISTINCT l.group_id) INTO marked
    FROM (SELECT l.group_id FROM {schema}.fair_owner_changes l
          WHERE l.type = p_type AND l.xid >= mark
          UNION ALL
          SELECT l.group_id FROM unnest(mark_open) AS o(xid)
          CROSS JOIN LATERAL (SELECT l.group_id FROM {schema}.fair_owner_changes l
                              WHERE l.type = p_type AND l.xid = o.xid OFFSET 0) l) l;
    had_rows := gs IS NOT NULL OR marked IS NOT NULL;
    -- Groups with deltas and no row (dropped when empty, or never made): made first,
    -- before the fold holds any row lock (fair_insert_groups may wait for a writer's
    -- insert of the same row, or its lock on the group; a writer may wait for a row the
    -- fold holds: made after the locks, the two could deadlock).
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
    -- Locked, never waiting, each group's row (its latest version: ctid, owner, and head
    -- bound as it stands, where from its jobs are read below): the groups with deltas
    -- and up to 100 whose bound ran out. Every row of fair_groups the fold touches is
    -- reached by its key or by the ctid read here (rows it holds locked, so no one else
    -- makes a new version of them), never by a scan of the table: without statistics
    -- the planner read it whole, every version a long transaction keeps included
    -- (bench/RESULTS.md, section 25).
    SELECT array_agg(fg.group_id), array_agg(fg.head_lb), array_agg(fg.head_id),
           array_agg(fg.head_until), array_agg(fg.tid), array_agg(fg.plan_key),
           array_agg(fg.unit)
    INTO gs, heads, head_ids, untils, tids, lkeys, lunits
    FROM (SELECT x.group_id FROM unnest(gs) AS x(group_id)
          UNION
          SELECT e.group_id FROM (
              SELECT e.group_id FROM {schema}.fair_groups e
              WHERE e.type = p_type AND e.head_until <= p_now
                AND e.head_until < 'infinity'
              ORDER BY e.head_until LIMIT 100) e) w
    CROSS JOIN LATERAL (
        SELECT f.group_id, f.ctid AS tid, f.plan_key, f.unit, f.head_lb, f.head_id,
               f.head_until
        FROM {schema}.fair_groups f
        WHERE f.type = p_type AND f.group_id = w.group_id
        FOR UPDATE SKIP LOCKED) fg;
    IF gs IS NULL AND marked IS NULL THEN
        RETURN 0;
    END IF;
    -- A fold of many groups (a bulk load, a backlog the upkeep could not fold for a
    -- while): custom plans from here on, which know the arrays' lengths. A generic plan
    -- takes every array for 10 rows, and joined the moved deltas to 10,000 groups in a
    -- nested loop: 20 s where a custom plan takes 0.8 s (bench/RESULTS.md, section 33).
    -- Restored when the function returns (its own SET clause).
    IF coalesce(array_length(gs, 1), 0) + coalesce(array_length(marked, 1), 0) > 200 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    -- The owners to compute again: those of the groups to fold and of the changed groups
    -- (as they are now), and those the changes name.
    SELECT array_agg(x.plan_key), array_agg(x.unit) INTO ukeys, uunits FROM (
        SELECT DISTINCT u.plan_key, u.unit FROM (
            SELECT l.plan_key, l.unit FROM unnest(lkeys, lunits) AS l(plan_key, unit)
            UNION ALL
            SELECT fg.plan_key, fg.unit FROM unnest(marked) AS x(group_id)
            CROSS JOIN LATERAL (
                SELECT f.plan_key, f.unit FROM {schema}.fair_groups f
                WHERE f.type = p_type AND f.group_id = x.group_id
                OFFSET 0) fg  -- a lookup by key each (not pulled up into a join)
            UNION ALL
            SELECT c.plan_key, c.unit FROM {schema}.fair_owner_changes c
            WHERE c.type = p_type AND c.xid >= mark
            UNION ALL
            SELECT c.plan_key, c.unit FROM unnest(mark_open) AS o(xid)
            CROSS JOIN LATERAL (SELECT c.plan_key, c.unit FROM {schema}.fair_owner_changes c
                                WHERE c.type = p_type AND c.xid = o.xid OFFSET 0) c) u
        ORDER BY u.plan_key, u.unit) x;
    IF gs IS NOT NULL THEN
        -- A new statement: its snapshot sees every writer that finished before the locks.
        WITH moved AS (
            DELETE FROM {schema}.fair_served d
            WHERE d.ctid = ANY (ARRAY(
                SELECT f.ctid FROM {schema}.fair_served f
                JOIN unnest(gs) AS x(group_id) ON x.group_id = f.group_id
                WHERE f.type = p_type AND f.xid >= mark
                FOR UPDATE OF f SKIP LOCKED)
                || ARRAY(
                SELECT f.ctid FROM unnest(mark_open) AS o(xid)
                CROSS JOIN LATERAL (SELECT f.ctid FROM {schema}.fair_served f
                                    WHERE f.type = p_type AND f.xid = o.xid
                                      AND f.group_id = ANY (gs)
                                    FOR UPDATE OF f SKIP LOCKED) f))
            RETURNING d.group_id, d.n
        ),
        sums AS (
            SELECT mv.group_id, sum(mv.n) AS n FROM moved mv GROUP BY mv.group_id
        ),
        -- Each group's jobs are read from its head bound on wherever the bound holds
        -- (the head invariant): for its ready jobs while head_until is after now, for all
        -- its pending jobs while head_until is 'infinity'. So the scans start past the
        -- index entries of the jobs claimed before the last fold, which a long
        -- transaction keeps from vacuum. With a ready job found, ready_lb is '-infinity',
        -- a bound of every run_after that says what the exact minimum would (due now),
        -- without a scan of jobs_pending_ready_idx from its start: jobs enqueued in one
        -- statement share run_after, so their entries share a posting list, which no
        -- scan marks dead until vacuum empties it (bench/RESULTS.md, section 25).
        b0 AS (
            SELECT g.group_id, g.tid,
                   coalesce(sm.n, 0) AS n,
                   CASE WHEN rh.created_at IS NOT NULL THEN '-infinity'::timestamptz
                        WHEN ah.created_at IS NULL THEN NULL
                        ELSE (SELECT min(j.run_after) FROM {schema}.jobs j
                              WHERE j.type = p_type AND j.group_id = g.group_id
                                AND j.status = 'pending') END AS ready,
                   rh.created_at AS ready_head, rh.id AS ready_id,
                   ah.created_at AS any_head, ah.id AS any_id,
                   (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                      AND j.group_id = g.group_id AND j.status = 'pending'
                      AND j.run_after > p_now) AS next_due
            FROM unnest(gs, heads, head_ids, untils, tids)
                 AS g(group_id, head_lb, head_id, head_until, tid)
            LEFT JOIN sums sm ON sm.group_id = g.group_id
            -- The first ready job among the 200 oldest from the bound: read in index
            -- order, the scan stops at it (rather than taking the min over all 200).
            LEFT JOIN LATERAL (
                SELECT o.created_at, o.id FROM (
                    SELECT j.created_at, j.id, j.run_after FROM {schema}.jobs j
                    WHERE j.type = p_type AND j.group_id = g.group_id
                      AND j.status = 'pending'
                      AND (j.created_at, j.id)
                          >= (CASE WHEN g.head_until > p_now THEN g.head_lb
                                   ELSE '-infinity' END,
                              CASE WHEN g.head_until > p_now THEN g.head_id ELSE 0 END)
                    ORDER BY j.created_at, j.id LIMIT 200) o
                WHERE o.run_after <= p_now
                ORDER BY o.created_at, o.id LIMIT 1) rh ON true
            -- Without one, the first pending job.
            LEFT JOIN LATERAL (
                SELECT j.created_at, j.id FROM {schema}.jobs j
                WHERE rh.created_at IS NULL
                  AND j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
                  AND (j.created_at, j.id)
                      >= (CASE WHEN g.head_until = 'infinity' THEN g.head_lb
                               ELSE '-infinity' END,
                          CASE WHEN g.head_until = 'infinity' THEN g.head_id ELSE 0 END)
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
            WHERE fg.ctid = ANY (tids) AND fg.ctid = b.tid
            RETURNING fg.ctid AS tid, fg.plan_key, fg.unit, b.n,
                      fg.served_n = 0 AND fg.ready_lb = 'infinity' AS empty
        )
        -- What each owner's groups gained, for its row below; the rows left with nothing
        -- to say (no pending job, no served count), their new versions.
        SELECT (SELECT count(*) FROM upd)::int, array_agg(x.plan_key), array_agg(x.unit),
               array_agg(x.n), (SELECT array_agg(u.tid) FROM upd u WHERE u.empty)
        INTO folded, fkeys, funits, fns, empties
        FROM (SELECT u.plan_key, u.unit, sum(u.n) AS n FROM upd u
              GROUP BY u.plan_key, u.unit) x;
        IF empties IS NOT NULL THEN
            DELETE FROM {schema}.fair_groups fg WHERE fg.ctid = ANY (empties);
        END IF;
    END IF;
    IF ukeys IS NOT NULL THEN
        -- The owners' rows: their served counts moved on by what their groups gained
        -- above and by the changes taken in here (those its first snapshot covers: their
        -- writers had ended, so the statements above saw them and their owners are among
        -- these; and the fold's own), exactly as recorded; their bounds computed again
        -- from their groups as they are now.
        WITH del AS (
            DELETE FROM {schema}.fair_owner_changes d
            WHERE d.ctid = ANY (ARRAY(
                    SELECT c.ctid FROM {schema}.fair_owner_changes c
                    WHERE c.type = p_type AND c.xid >= mark
                    UNION ALL
                    SELECT c.ctid FROM unnest(mark_open) AS o(xid)
                    CROSS JOIN LATERAL (SELECT c.ctid FROM {schema}.fair_owner_changes c
                                        WHERE c.type = p_type AND c.xid = o.xid
                                        OFFSET 0) c))
              AND ((d.xid < new_mark AND NOT d.xid = ANY (new_open))
                   OR d.xid = pg_current_xact_id())
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
            LEFT JOIN LATERAL (
                SELECT f.served_n, f.head_lb, f.head_id, f.ready_lb, f.active
                FROM {schema}.fair_groups f
                WHERE f.type = p_type AND f.plan_key = u.k AND f.unit = u.u
                OFFSET 0) fg ON true
            GROUP BY u.k, u.u
        ),
        -- Each owner's row, made when missing (only a fold writes them, one fold of a
        -- type at a time: nothing waits here), in one statement: each row's key is looked
        -- up once (a long transaction keeps every version of it from vacuum).
        upo AS (
            INSERT INTO {schema}.fair_owners AS o (type, plan_key, unit, plan, served_n,
                                                   b_served, b_head_lb, b_head_id,
                                                   ready_lb)
            SELECT p_type, a.plan_key, a.unit,
                   CASE WHEN a.plan_key = '' THEN NULL ELSE substr(a.plan_key, 3) END,
                   coalesce(mv.n, 0), coalesce(a.b_served, 0),
                   coalesce(a.b_head_lb, 'infinity'), coalesce(a.b_head_id, 0),
                   coalesce(a.ready, 'infinity')
            FROM agg a
            LEFT JOIN moved mv ON mv.k = a.plan_key AND mv.u = a.unit
            ON CONFLICT (type, plan_key, unit) DO UPDATE
            SET served_n = o.served_n + excluded.served_n,
                b_served = excluded.b_served,
                b_head_lb = excluded.b_head_lb,
                b_head_id = excluded.b_head_id,
                ready_lb = excluded.ready_lb
            RETURNING o.ctid AS tid, o.served_n
        )
        SELECT array_agg(x.tid) INTO otids FROM upo x WHERE x.served_n = 0;
        -- Owners with no group and nothing served left.
        IF otids IS NOT NULL THEN
            DELETE FROM {schema}.fair_owners o
            WHERE o.ctid = ANY (otids)
              AND NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                              WHERE fg.type = p_type AND fg.plan_key = o.plan_key
                                AND fg.unit = o.unit);
        END IF;
    END IF;
    -- The walks' floors of the plans whose rows it wrote or took in (the groups it
    -- locked, those named in the changes it read, and the owners' rows it wrote).
    PERFORM {schema}.fair_walk_floors(p_type, array_cat(gs, marked), ukeys, uunits);
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
    -- an idle queue writes no mark): the first snapshot's. A mark whose upto does not
    -- pass the old one's is not written: the old one still reads every row not folded,
    -- since it read every row this fold read.
    IF had_rows THEN
        -- The deltas left (groups a writer held) that it would cover: moved into one row
        -- per group under the fold's own xid, which it leaves open (or lies at or above
        -- its upto). Only folds delete deltas, one at a time, so nothing waits here; a
        -- claim sees either the rows or their sum, by whether the fold has committed.
        WITH gone AS (
            DELETE FROM {schema}.fair_served d
            WHERE d.ctid = ANY (ARRAY(
                    SELECT f.ctid FROM {schema}.fair_served f
                    WHERE f.type = p_type AND f.xid >= mark AND f.xid < new_mark
                    UNION ALL
                    SELECT f.ctid FROM unnest(mark_open) AS o(xid)
                    CROSS JOIN LATERAL (SELECT f.ctid FROM {schema}.fair_served f
                                        WHERE f.type = p_type AND f.xid = o.xid
                                        OFFSET 0) f))
              AND d.xid < new_mark AND NOT d.xid = ANY (new_open)
            RETURNING d.group_id, d.n
        )
        INSERT INTO {schema}.fair_served (type, group_id, n)
        SELECT p_type, g.group_id, sum(g.n) FROM gone g
        GROUP BY g.group_id HAVING sum(g.n) <> 0;
        -- Any other row left that it would cover (none: every change it covers was taken
        -- in above) stays open, so no row is ever lost to the claim.
        SELECT array_agg(DISTINCT x.xid) INTO left_xids
        FROM (SELECT f.xid FROM {schema}.fair_served f
              WHERE f.type = p_type AND f.xid >= mark
              UNION ALL
              SELECT l.xid FROM {schema}.fair_owner_changes l
              WHERE l.type = p_type AND l.xid >= mark
              UNION ALL
              SELECT o.xid FROM unnest(mark_open) AS o(xid)
              WHERE EXISTS (SELECT 1 FROM {schema}.fair_served f
                            WHERE f.type = p_type AND f.xid = o.xid)
                 OR EXISTS (SELECT 1 FROM {schema}.fair_owner_changes l
                            WHERE l.type = p_type AND l.xid = o.xid)) x
        WHERE x.xid < new_mark AND NOT x.xid = ANY (new_open);
        new_open := new_open || coalesce(left_xids, '{{}}');
        IF cardinality(new_open) > 256 THEN
            new_mark := (SELECT min(o.x) FROM unnest(new_open) AS o(x));
            new_open := '{{}}';
        END IF;
        IF new_mark > mark THEN
            INSERT INTO {schema}.fair_fold_mark (type, upto, open)
            VALUES (p_type, new_mark, new_open);
            -- From the old mark on: the dead versions of older marks a long transaction
            -- keeps lie below it.
            DELETE FROM {schema}.fair_fold_mark m
            WHERE m.type = p_type AND m.upto >= mark AND m.upto < new_mark;
        END IF;
    END IF;
    RETURN folded;
END
$$;
