-- 004: the fair claim's bookkeeping bounds ties by id, and its edge lock is a row lock.
--
-- 1. fair_groups.head_id: the head bound becomes (head_lb, head_id), a lower bound of
--    (created_at, id) of the group's claimable jobs, ordered like the claim's key. Jobs
--    written by one statement share one created_at; with created_at alone, thousands of
--    groups tied with the batch's last key and the claim's proof could not tell whether
--    an unread job came first, so the probe grew until it had read them all
--    (docs/fast-claim.md, "Ties"). Existing rows get 0, a valid lower bound (ids start at
--    1); fair_fold renews them.
-- 2. The served window's edge is coordinated by locks on fair_edge rows (FOR SHARE by
--    counting writers, FOR UPDATE SKIP LOCKED by fair_advance) instead of advisory locks,
--    which any role of the database could take on the key rota computed and so stall
--    this queue's completions. Only roles granted access to rota's schema can lock its
--    rows.
ALTER TABLE {schema}.fair_groups ADD COLUMN head_id bigint NOT NULL DEFAULT 0;
DROP INDEX {schema}.fair_groups_walk_idx;
CREATE INDEX fair_groups_walk_idx ON {schema}.fair_groups (type, plan, served_n, head_lb, head_id)
    WHERE active AND head_lb < 'infinity';

DROP FUNCTION {schema}.fair_note_pending(text[], text[], timestamptz[], timestamptz[]);
DROP FUNCTION {schema}.fair_note_pending_each(text[], text[], timestamptz[], timestamptz[]);
DROP FUNCTION {schema}.fair_insert_groups(text[], text[], timestamptz[], timestamptz[], int[]);
DROP FUNCTION {schema}.fair_edge_key(text);

-- Lock the edges of these types (fair_edge rows, FOR SHARE, in type order) for a writer
-- that decides against them: fair_advance takes a row FOR UPDATE SKIP LOCKED, so no
-- completion straddles a move of the edge. A type without a row gets one at
-- '-infinity' first (its first counting writer, once), so there is always a row to lock.
-- Row locks, not advisory locks: only roles granted rota's schema can take them.
CREATE OR REPLACE FUNCTION {schema}.fair_lock_edges(p_types text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_types) AS t(type)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_edge e WHERE e.type = t.type))
    THEN
        INSERT INTO {schema}.fair_edge (type, edge)
        SELECT DISTINCT t.type, '-infinity'::timestamptz FROM unnest(p_types) AS t(type)
        ORDER BY 1
        ON CONFLICT (type) DO NOTHING;
    END IF;
    PERFORM 1 FROM {schema}.fair_edge e WHERE e.type = ANY (p_types)
    ORDER BY e.type
    FOR SHARE;
END
$$;

-- Insert missing fair_groups rows (bounds and served count as given), copying plan and
-- active from rota's groups table under FOR SHARE of those rows, so a concurrent plan
-- change either commits first (and is read here) or waits and then updates these rows.
-- Rows that exist are left alone. The head is the first ready job by (created_at, id).
CREATE OR REPLACE FUNCTION {schema}.fair_insert_groups(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[], p_served int[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH want0 AS (
        SELECT t.type, t.group_id,
               coalesce((array_agg(t.head ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 'infinity') AS head,
               coalesce((array_agg(t.id ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 0) AS head_id,
               min(t.ready) AS ready,
               coalesce(sum(t.served), 0)::int AS served
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies, p_served)
             AS t(type, group_id, head, id, ready, served)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups f
                          WHERE f.type = t.type AND f.group_id = t.group_id)
        GROUP BY t.type, t.group_id
    ),
    -- The head covers the jobs ready now; older jobs due later cut its validity.
    want AS (
        SELECT w.type, w.group_id, w.head, w.head_id, w.ready, w.served,
               coalesce(min(t.ready) FILTER (WHERE t.ready > now()
                                             AND (t.head, t.id) < (w.head, w.head_id)),
                        'infinity') AS until
        FROM want0 w
        JOIN unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
          ON t.type = w.type AND t.group_id = w.group_id
        GROUP BY w.type, w.group_id, w.head, w.head_id, w.ready, w.served
    ),
    g AS (
        SELECT g.group_id, g.plan, g.active FROM {schema}.groups g
        WHERE g.group_id IN (SELECT group_id FROM want)
        ORDER BY g.group_id
        FOR SHARE
    ),
    ins AS (
        INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, head_id, head_until,
                                                ready_lb, served_n, plan, active)
        SELECT w.type, w.group_id, w.head, w.head_id, w.until, w.ready, w.served, g.plan,
               coalesce(g.active, true)
        FROM want w LEFT JOIN g ON g.group_id = w.group_id
        ORDER BY w.type, w.group_id
        ON CONFLICT (type, group_id) DO NOTHING
        RETURNING fg.type, fg.plan
    )
    INSERT INTO {schema}.fair_plans (type, plan)
    SELECT DISTINCT i.type, i.plan FROM ins i WHERE i.plan IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups, keeping
-- its invariant, one array entry per job as given. Lock first, then lower: fair_fold
-- cannot raise a bound this transaction relies on once the row is locked, and the
-- lowering statement sees its latest value. Called by fair_note_pending, which folds
-- each group's jobs due now into one entry first.
CREATE OR REPLACE FUNCTION {schema}.fair_note_pending_each(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted int;
    locked int;
BEGIN
    LOOP
        PERFORM {schema}.fair_insert_groups(p_types, p_groups, p_heads, p_ids, p_readies,
                                            NULL);

        SELECT count(DISTINCT (t.type, t.group_id)) INTO wanted
        FROM unnest(p_types, p_groups) AS t(type, group_id);
        -- FOR KEY SHARE: shared among writers; conflicts only with fair_fold's FOR UPDATE.
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM {schema}.fair_groups fg
            WHERE (fg.type, fg.group_id) IN (
                SELECT t.type, t.group_id FROM unnest(p_types, p_groups) AS t(type, group_id))
            ORDER BY fg.type, fg.group_id
            FOR KEY SHARE
        ) l;
        EXIT WHEN locked = wanted;  -- else fair_fold deleted a row in between: again
    END LOOP;

    -- Lower where needed: a job ready now lowers (head_lb, head_id); an older job due
    -- later cuts head_until instead. Rows are locked in key order (FOR NO KEY UPDATE,
    -- which does not conflict with other writers' FOR KEY SHARE), so two writers
    -- lowering the same groups cannot deadlock. Rare: new jobs come after their group's
    -- head.
    UPDATE {schema}.fair_groups AS fg
    SET head_lb = a.head, head_id = a.head_id, head_until = a.until, ready_lb = a.ready
    FROM (
        SELECT l.type, l.group_id, n.head, n.head_id, n.ready,
               least(l.head_until, m.until) AS until
        FROM {schema}.fair_groups l
        JOIN (
            -- Per group: the first job ready now, the first due time, and the jobs due
            -- later (the row's bounds are read again below, after the lock; this one
            -- only selects which rows to lock).
            SELECT t.type, t.group_id,
                   (array_agg(t.head ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_head,
                   (array_agg(t.id ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_id,
                   min(t.ready) AS min_ready,
                   array_agg(t.head) FILTER (WHERE t.ready > now()) AS due_heads,
                   array_agg(t.id) FILTER (WHERE t.ready > now()) AS due_ids,
                   array_agg(t.ready) FILTER (WHERE t.ready > now()) AS due_readies
            FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
                 AS t(type, group_id, head, id, ready)
            GROUP BY t.type, t.group_id
        ) m0 ON m0.type = l.type AND m0.group_id = l.group_id
        CROSS JOIN LATERAL (
            SELECT CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_head ELSE l.head_lb END AS head,
                   CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_id ELSE l.head_id END AS head_id,
                   least(l.ready_lb, m0.min_ready) AS ready) n
        CROSS JOIN LATERAL (
            SELECT min(d.ready) AS until
            FROM unnest(m0.due_heads, m0.due_ids, m0.due_readies) AS d(head, id, ready)
            WHERE (d.head, d.id) < (n.head, n.head_id)) m
        -- Only rows that change are locked: enqueuers of one group never queue here.
        WHERE (n.head, n.head_id) < (l.head_lb, l.head_id) OR n.ready < l.ready_lb
           OR m.until < l.head_until
        ORDER BY l.type, l.group_id
        FOR NO KEY UPDATE OF l
    ) a
    WHERE fg.type = a.type AND fg.group_id = a.group_id
      AND (fg.head_lb <> a.head OR fg.head_id <> a.head_id OR fg.head_until <> a.until
           OR fg.ready_lb <> a.ready);
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups: the entry
-- point of the triggers. Only two things about a group's jobs that are due now matter:
-- their first (created_at, id) and their earliest run_after; jobs due later matter one
-- by one (they may cut the head's validity). So each group's due-now jobs become one
-- entry for fair_note_pending_each and the rest pass through (taking one entry per job
-- cost a 1,000-job batch 2.5 ms); and when the rows already bound the new jobs, only
-- the shared locks are taken.
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
    -- statement instead of the several below (a one-job enqueue paid 0.15 ms for them).
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

-- Add p_delta to fair_served for the served jobs (type, group, id, finished_at) finished
-- at or after their type's edge, under a shared lock of each type's edge row
-- (fair_lock_edges). Running jobs are passed with finished_at 'infinity', so they
-- always count.
CREATE OR REPLACE FUNCTION {schema}.fair_count_served(
    p_types text[], p_groups text[], p_ids bigint[], p_finished timestamptz[], p_delta int
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_lock_edges(p_types);
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
    SELECT d.type, d.group_id, (d.id % 8)::smallint, p_delta * count(*)::int
    FROM unnest(p_types, p_groups, p_ids, p_finished) AS d(type, group_id, id, finished)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id, (d.id % 8)::smallint
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
END
$$;

-- INSERT: new pending jobs are noted in fair_groups; new running or done ones counted.
-- The usual case, every inserted job pending, due now, in a group whose row already
-- bounds it, takes the shared row locks in one statement over the transition table and
-- stops, without building arrays.
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
           array_agg(id) AS ids,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.ids, r.finished, 1);
    END IF;
    RETURN NULL;
END
$$;

-- UPDATE: each changed row is handled set-based by the kind of change:
--   a row that leaves 'done' or 'running' (or changes its type, group or finish time) is
--   uncounted, a row that enters them (or changes those) is counted;
--   a row that is pending with a group after the update, and entered pending or moved
--   its type, group, created_at or earlier run_after, is noted in fair_groups.
-- Statements that change none of that (a heartbeat) find no row and return.
CREATE OR REPLACE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    edges text[];
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
    -- Served counts: a row counts while it is running, or done at or after its type's
    -- edge. Each changed row takes its old version's count away and adds its new one's,
    -- netted per (type, group, shard): a completion (running to done, same shard) writes
    -- nothing; a claim adds one per job. Done rows are decided against the edge under
    -- the types' edge rows locked FOR SHARE, as fair_count_served does.
    SELECT array_agg(x.type) INTO edges
    FROM (SELECT o.type FROM old_rows o WHERE o.status = 'done' AND o.group_id IS NOT NULL
          UNION
          SELECT n.type FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL) x;
    IF edges IS NOT NULL THEN
        PERFORM {schema}.fair_lock_edges(edges);
    END IF;
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
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
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
    -- Rows put into pending (fail with retries left, defer, release, retry) are noted in
    -- fair_groups.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.status = 'pending' AND n.group_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(n.type) AS types, array_agg(n.group_id) AS groups,
           array_agg(n.created_at) AS heads, array_agg(n.id) AS ids,
           array_agg(n.run_after) AS readies
    INTO r
    FROM old_rows o JOIN new_rows n ON n.id = o.id
    WHERE n.status = 'pending' AND n.group_id IS NOT NULL
      AND (o.status IS DISTINCT FROM n.status
           OR o.type IS DISTINCT FROM n.type
           OR o.group_id IS DISTINCT FROM n.group_id
           OR o.created_at IS DISTINCT FROM n.created_at
           OR o.run_after > n.run_after);
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    RETURN NULL;
END
$$;

-- Move a type's edge to p_target (either direction), recording the change as deltas in
-- fair_served (folded later like any other). Locks the type's edge row FOR UPDATE SKIP
-- LOCKED: when a counting writer holds it (FOR SHARE, fair_lock_edges), it does nothing
-- and returns false (the claim stays exact, its correction is just wider). Each
-- statement of a volatile plpgsql function reads a fresh snapshot, so once the row is
-- locked every done job that any counting writer decided on is visible. Only done jobs
-- can sit between two edges: running jobs are counted as finishing at 'infinity'.
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
        SELECT p_type, j.group_id, 0::smallint,
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

-- Fold a type's fair_served deltas into fair_groups.served_n (creating missing rows)
-- and, in the same row update, renew those groups' head bounds and those of up to 100
-- groups whose bound ran out, as of p_now (the queue's clock): (head_lb, head_id) the
-- first job ready at p_now (looked for among the group's 200 oldest; when all of those are
-- deferred, the oldest of all, valid forever), valid until the first job due after
-- p_now. One new row version per group per round, since every version leaves an entry
-- in the walk index. No edge lock is needed: deltas and served_n count against the
-- same edge, and a fold moves them in one transaction. It never waits: rows a writer
-- holds (FOR KEY SHARE or a lowering) and delta rows another fold holds are left for
-- the next one. Returns the number of groups folded.
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
        -- at it (taking the min over all 200 made a fold of 100 groups of a backlog cost
        -- 8 ms).
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

