-- Fast fair claim (issue 4): bookkeeping that lets the claim rank groups without
-- reading the backlog, kept exact by triggers on every write path (enqueue, batch
-- enqueue, claim, complete, fail, defer, stuck sweep, retry, pruning, and any future
-- statement), so no write path can forget it. Nothing here is a hot spot: no row is
-- updated by every claim or every completion of a group (see each table).

-- Groups of a type that may have pending jobs, with lower bounds of their pending jobs'
-- created_at and run_after. The claim walks these in order of a lower bound of each
-- group's first job's key and probes only the first few groups (docs/fast-claim.md).
-- Invariant: for every pending job j with a group, a row (j.type, j.group_id) exists
-- with ready_lb <= j.run_after, and head_lb <= j.created_at or head_until <= j.run_after.
-- So while the queue's clock is before head_until, head_lb bounds the created_at of
-- every claimable job of the group; after it, the claim treats the head as unknown (the
-- group is probed) until fair_fold renews it. head_until lets jobs deferred far ahead
-- (older than the group's ready jobs) stay out of the bound instead of loosening it.
-- Writers that put a job into pending lower the bounds when needed (rare: a new job is
-- newer than its group's head) and otherwise only take FOR KEY SHARE on the row (shared,
-- like a foreign-key check, so concurrent enqueuers of one group never wait for each
-- other). The claim's upkeep raises the bounds afterwards (fair_fold) with FOR UPDATE
-- SKIP LOCKED, which skips a row while any writer that relied on it is still open.
-- done_n is the group's folded count of done jobs finished at or after the type's edge
-- (see fair_done); a group with no pending job keeps its row (bounds 'infinity') while
-- done_n > 0 (ready_lb 'infinity' means no pending job), so the claim reads one row
-- per group.
-- plan and active copy rota's own groups table (kept by the trigger on it, in the same
-- transaction as the change, so a plan change or a pause takes effect at the next claim
-- without touching a job); they let the claim walk each plan's groups through
-- fair_groups_walk_idx instead of reading every group. A queue whose groups relation is
-- an application's view reads plan and active from it at claim time instead.
CREATE TABLE {schema}.fair_groups (
    type      text NOT NULL,
    group_id  text NOT NULL,
    head_lb   timestamptz NOT NULL,
    head_until timestamptz NOT NULL DEFAULT 'infinity',
    ready_lb  timestamptz NOT NULL,
    done_n    integer NOT NULL DEFAULT 0,
    plan      text,
    active    boolean NOT NULL DEFAULT true,
    PRIMARY KEY (type, group_id)
) WITH (fillfactor = 70,  -- room for HOT updates
       -- small and rewritten all the time: vacuum it often, not at 20% dead rows
       autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

-- The claim's walk: per type and plan, active groups with pending jobs by done count and
-- head (a lower bound of each group's first job's key within its plan).
CREATE INDEX fair_groups_walk_idx ON {schema}.fair_groups (type, plan, done_n, head_lb)
    WHERE active AND head_lb < 'infinity';
-- Groups whose head bound has run out (or will): the claim probes them explicitly.
CREATE INDEX fair_groups_expiry_idx ON {schema}.fair_groups (type, head_until)
    WHERE head_until < 'infinity';

-- The plans present among a type's groups (NULL, no plan, is always walked). Rows are
-- only ever added (INSERT … ON CONFLICT DO NOTHING takes no lock); a plan no longer
-- used costs the claim one empty index probe. The claim reads its levels here: a loose
-- index scan of fair_groups_walk_idx met the dead entries that folding leaves at the
-- head of every plan's range (2.7 ms at 1,000,000 pending, against 0.05 ms).
CREATE TABLE {schema}.fair_plans (
    type  text NOT NULL,
    plan  text NOT NULL,
    PRIMARY KEY (type, plan)
);

-- Keep fair_groups' copy of plan and active. A group missing from the table ranks as an
-- active group with no owner, so a delete resets the copy to that.
CREATE FUNCTION {schema}.fair_groups_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE {schema}.fair_groups SET plan = NULL, active = true
        WHERE group_id = OLD.group_id AND (plan IS NOT NULL OR NOT active);
    ELSE
        IF TG_OP = 'UPDATE' AND OLD.group_id <> NEW.group_id THEN
            UPDATE {schema}.fair_groups SET plan = NULL, active = true
            WHERE group_id = OLD.group_id;
        END IF;
        UPDATE {schema}.fair_groups SET plan = NEW.plan, active = NEW.active
        WHERE group_id = NEW.group_id
          AND (plan IS DISTINCT FROM NEW.plan OR active IS DISTINCT FROM NEW.active);
        INSERT INTO {schema}.fair_plans (type, plan)
        SELECT DISTINCT f.type, NEW.plan FROM {schema}.fair_groups f
        WHERE f.group_id = NEW.group_id AND NEW.plan IS NOT NULL
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER groups_fair_changed
    AFTER INSERT OR UPDATE OR DELETE ON {schema}.groups
    FOR EACH ROW EXECUTE FUNCTION {schema}.fair_groups_changed();

-- Recent changes to done counts (done jobs with a group, finished at or after the type's
-- checkpoint fair_edge.edge), per type, group and shard. A completion adds 1 to shard
-- id % 8, so eight workers completing jobs of one big group rarely touch the same row;
-- fair_advance folds these rows into fair_groups.done_n about once a second, so the
-- table stays small and the claim's sum over it is cheap.
CREATE TABLE {schema}.fair_done (
    type      text NOT NULL,
    group_id  text NOT NULL,
    shard     smallint NOT NULL,
    n         integer NOT NULL,
    PRIMARY KEY (type, group_id, shard)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

-- The checkpoint of fair_done per type (no row: -infinity). The claim counts a group's
-- served done jobs as fair_done plus an exact correction over [edge, window start)
-- read from jobs_done_idx, so any window and any clock offset give the exact count;
-- fair_advance keeps the edge near the window start so the correction stays small.
-- Counting writers hold a shared advisory lock on the type while they decide against
-- the edge; fair_advance takes it exclusively (try only), so no completion straddles
-- a move of the edge.
CREATE TABLE {schema}.fair_edge (
    type      text PRIMARY KEY,
    edge      timestamptz NOT NULL
);

-- The claim's probe reads a group's first pending jobs through jobs_pending_idx; with
-- run_after carried in the index, the ready test is made on the index entry and the
-- probe is an index-only scan on all-visible pages (at 1,000,000 pending jobs the heap
-- no longer fits in shared_buffers, and each probed job cost a heap page read).
DROP INDEX {schema}.jobs_pending_idx;
CREATE INDEX jobs_pending_idx ON {schema}.jobs (type, group_id, created_at, id)
    INCLUDE (run_after) WHERE status = 'pending';
-- Bound maintenance: a group's pending jobs by run_after (fair_fold, note_pending).
CREATE INDEX jobs_pending_ready_idx ON {schema}.jobs (type, group_id, run_after)
    WHERE status = 'pending';
-- Stale reclaim: only running jobs that still have attempts left; stuck jobs (attempts
-- used up, waiting for fail_stuck_jobs) never enter this index, so they cost nothing.
CREATE INDEX jobs_reclaimable_idx ON {schema}.jobs (type, locked_at)
    WHERE status = 'running' AND attempts < max_attempts;
-- Served window edge correction: done jobs of a type by finish time.
-- (jobs_done_idx (type, finished_at, group_id) from 001 serves it.)

-- The advisory lock key of a type's edge in this schema.
CREATE FUNCTION {schema}.fair_edge_key(p_type text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (hashtext('rota.fair_edge:{schema}') :: bigint << 32)
           | (hashtext(p_type) :: bigint & 4294967295)
$$;

-- Insert missing fair_groups rows (bounds and done count as given), copying plan and
-- active from rota's groups table under FOR SHARE of those rows, so a concurrent plan
-- change either commits first (and is read here) or waits and then updates these rows.
-- Rows that exist are left alone.
CREATE FUNCTION {schema}.fair_insert_groups(
    p_types text[], p_groups text[], p_heads timestamptz[], p_readies timestamptz[],
    p_done int[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH want0 AS (
        SELECT t.type, t.group_id,
               coalesce(min(t.head) FILTER (WHERE t.ready <= now()), 'infinity') AS head,
               min(t.ready) AS ready,
               coalesce(sum(t.done), 0)::int AS done
        FROM unnest(p_types, p_groups, p_heads, p_readies, p_done)
             AS t(type, group_id, head, ready, done)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups f
                          WHERE f.type = t.type AND f.group_id = t.group_id)
        GROUP BY t.type, t.group_id
    ),
    -- The head covers the jobs ready now; older jobs due later cut its validity.
    want AS (
        SELECT w.type, w.group_id, w.head, w.ready, w.done,
               coalesce(min(t.ready) FILTER (WHERE t.ready > now() AND t.head < w.head),
                        'infinity') AS until
        FROM want0 w
        JOIN unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
          ON t.type = w.type AND t.group_id = w.group_id
        GROUP BY w.type, w.group_id, w.head, w.ready, w.done
    ),
    g AS (
        SELECT g.group_id, g.plan, g.active FROM {schema}.groups g
        WHERE g.group_id IN (SELECT group_id FROM want)
        ORDER BY g.group_id
        FOR SHARE
    ),
    ins AS (
        INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, head_until,
                                                ready_lb, done_n, plan, active)
        SELECT w.type, w.group_id, w.head, w.until, w.ready, w.done, g.plan,
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

-- Record pending jobs (type, group, created_at, run_after) in fair_groups, keeping its
-- invariant. Lock first, then lower: fair_fold cannot raise a bound this transaction
-- relies on once the row is locked, and the lowering statement sees its latest value.
CREATE FUNCTION {schema}.fair_note_pending(
    p_types text[], p_groups text[], p_heads timestamptz[], p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted int;
    locked int;
BEGIN
    LOOP
        PERFORM {schema}.fair_insert_groups(p_types, p_groups, p_heads, p_readies, NULL);

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

    -- Lower where needed: a job ready now lowers head_lb; an older job due later cuts
    -- head_until instead. Rows are locked in key order (FOR NO KEY UPDATE, which does
    -- not conflict with other writers' FOR KEY SHARE), so two writers lowering the same
    -- groups cannot deadlock. Rare: new jobs are newer than their group's head.
    UPDATE {schema}.fair_groups AS fg
    SET head_lb = a.head, head_until = a.until, ready_lb = a.ready
    FROM (
        SELECT l.type, l.group_id, n.head, n.ready, least(l.head_until, m.until) AS until
        FROM {schema}.fair_groups l
        JOIN (
            -- Per group: the oldest job ready now, the first due time, and the first due
            -- time of a job older than both bounds (the row's head_lb is read again
            -- below, after the lock; this one only selects which rows to lock).
            SELECT t.type, t.group_id,
                   min(t.head) FILTER (WHERE t.ready <= now()) AS ready_head,
                   min(t.ready) AS min_ready,
                   array_agg(t.head) FILTER (WHERE t.ready > now()) AS due_heads,
                   array_agg(t.ready) FILTER (WHERE t.ready > now()) AS due_readies
            FROM unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
            GROUP BY t.type, t.group_id
        ) m0 ON m0.type = l.type AND m0.group_id = l.group_id
        CROSS JOIN LATERAL (
            SELECT least(l.head_lb, m0.ready_head) AS head,
                   least(l.ready_lb, m0.min_ready) AS ready) n
        CROSS JOIN LATERAL (
            SELECT min(d.ready) AS until
            FROM unnest(m0.due_heads, m0.due_readies) AS d(head, ready)
            WHERE d.head < n.head) m
        -- Only rows that change are locked: enqueuers of one group never queue here.
        WHERE n.head < l.head_lb OR n.ready < l.ready_lb OR m.until < l.head_until
        ORDER BY l.type, l.group_id
        FOR NO KEY UPDATE OF l
    ) a
    WHERE fg.type = a.type AND fg.group_id = a.group_id
      AND (fg.head_lb <> a.head OR fg.head_until <> a.until OR fg.ready_lb <> a.ready);
END
$$;

-- Add delta to fair_done for done jobs (type, group, id, finished_at) finished at or
-- after their type's edge, under the shared advisory lock of each type.
CREATE FUNCTION {schema}.fair_count_done(
    p_types text[], p_groups text[], p_ids bigint[], p_finished timestamptz[], p_delta int
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT DISTINCT x FROM unnest(p_types) AS x ORDER BY x LOOP
        PERFORM pg_advisory_xact_lock_shared({schema}.fair_edge_key(t));
    END LOOP;
    INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
    SELECT d.type, d.group_id, (d.id % 8)::smallint, p_delta * count(*)::int
    FROM unnest(p_types, p_groups, p_ids, p_finished) AS d(type, group_id, id, finished)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id, (d.id % 8)::smallint
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
END
$$;

-- Row trigger for UPDATE: fires only on the transitions that matter (the WHEN clauses
-- below), so a claim's or a heartbeat's update costs nothing extra.
CREATE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'done' AND OLD.group_id IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(ARRAY[OLD.type], ARRAY[OLD.group_id], ARRAY[OLD.id],
                                ARRAY[OLD.finished_at], -1);
    END IF;
    IF NEW.status = 'done' AND NEW.group_id IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(ARRAY[NEW.type], ARRAY[NEW.group_id], ARRAY[NEW.id],
                                ARRAY[NEW.finished_at], 1);
    END IF;
    IF NEW.status = 'pending' AND NEW.group_id IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(ARRAY[NEW.type], ARRAY[NEW.group_id],
                                  ARRAY[NEW.created_at], ARRAY[NEW.run_after]);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_update
    AFTER UPDATE ON {schema}.jobs
    FOR EACH ROW
    WHEN ((OLD.status = 'done' OR NEW.status = 'done'
           OR (NEW.status = 'pending' AND NEW.group_id IS NOT NULL))
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.type IS DISTINCT FROM NEW.type
               OR OLD.group_id IS DISTINCT FROM NEW.group_id
               OR OLD.finished_at IS DISTINCT FROM NEW.finished_at
               OR OLD.created_at IS DISTINCT FROM NEW.created_at
               OR OLD.run_after > NEW.run_after))
    EXECUTE FUNCTION {schema}.fair_jobs_update();

-- Statement triggers for INSERT and DELETE: one set-based call per statement, so a
-- batch enqueue or a pruning batch pays once, not per row.
CREATE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(created_at) AS heads, array_agg(run_after) AS readies
    INTO r FROM inserted WHERE status = 'pending' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.readies);
    END IF;
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids, array_agg(finished_at) AS finished
    INTO r FROM inserted WHERE status = 'done' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.types, r.groups, r.ids, r.finished, 1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_insert
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_insert();

CREATE FUNCTION {schema}.fair_jobs_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids, array_agg(finished_at) AS finished
    INTO r FROM deleted WHERE status = 'done' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.types, r.groups, r.ids, r.finished, -1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_delete
    AFTER DELETE ON {schema}.jobs
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_delete();

-- Move a type's edge to p_target (either direction), recording the change as deltas
-- in fair_done (folded later like any other). Takes
-- the type's advisory lock exclusively, try only: when a counting writer is open, it
-- does nothing and returns false (the claim stays exact, its correction is just wider).
-- Each statement of a volatile plpgsql function reads a fresh snapshot, so once the
-- lock is held every done job that any counting writer decided on is visible.
CREATE FUNCTION {schema}.fair_advance(p_type text, p_target timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    old_edge timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock({schema}.fair_edge_key(p_type)) THEN
        RETURN false;
    END IF;
    old_edge := coalesce((SELECT edge FROM {schema}.fair_edge WHERE type = p_type), '-infinity');
    IF p_target <> old_edge THEN
        -- Done jobs between the old and the new edge leave (forward) or enter (back).
        INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
        SELECT p_type, j.group_id, 0::smallint,
               (CASE WHEN p_target > old_edge THEN -1 ELSE 1 END) * count(*)::int
        FROM {schema}.jobs j
        WHERE j.type = p_type AND j.status = 'done' AND j.group_id IS NOT NULL
          AND j.finished_at >= least(old_edge, p_target)
          AND j.finished_at < greatest(old_edge, p_target)
        GROUP BY j.group_id
        ORDER BY j.group_id
        ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
        INSERT INTO {schema}.fair_edge (type, edge) VALUES (p_type, p_target)
        ON CONFLICT (type) DO UPDATE SET edge = excluded.edge;
    END IF;
    -- Fold the deltas into fair_groups.done_n (a row per group, created if missing).
    RETURN true;
END
$$;

-- Fold a type's fair_done deltas into fair_groups.done_n (creating missing rows) and, in
-- the same row update, renew those groups' head bounds and those of up to 100 groups
-- whose bound ran out, as of p_now (the queue's clock): head_lb the oldest job ready
-- at p_now (looked for among the group's 200 oldest; when all of those are deferred,
-- the oldest of all, valid forever), valid until the first job due after p_now. One new
-- row version per group per round, since every version leaves an entry in the walk
-- index. No advisory lock is needed: deltas and done_n count against the same edge,
-- and a fold moves them in one transaction. It never waits: rows a writer holds (FOR
-- KEY SHARE or a lowering) and delta rows another fold holds are left for the next one.
CREATE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
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
               (SELECT min(o.created_at) FROM (
                    SELECT j.created_at, j.run_after FROM {schema}.jobs j
                    WHERE j.type = p_type AND j.group_id = g.group_id
                      AND j.status = 'pending'
                    ORDER BY j.created_at, j.id LIMIT 200) o
                WHERE o.run_after <= p_now) AS ready_head,
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


-- Build the bookkeeping for jobs that exist already (the triggers keep it from here):
-- heads over every pending job, valid forever; the first claims renew them.
INSERT INTO {schema}.fair_groups (type, group_id, head_lb, ready_lb, done_n, plan, active)
SELECT j.type, j.group_id,
       coalesce(min(j.created_at) FILTER (WHERE j.status = 'pending'), 'infinity'),
       coalesce(min(j.run_after) FILTER (WHERE j.status = 'pending'), 'infinity'),
       count(*) FILTER (WHERE j.status = 'done'),
       min(g.plan), coalesce(bool_and(g.active), true)
FROM {schema}.jobs j
LEFT JOIN {schema}.groups g ON g.group_id = j.group_id
WHERE j.status IN ('pending', 'done') AND j.group_id IS NOT NULL
GROUP BY j.type, j.group_id;
INSERT INTO {schema}.fair_plans (type, plan)
SELECT DISTINCT type, plan FROM {schema}.fair_groups WHERE plan IS NOT NULL;
