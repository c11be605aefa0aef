-- Fast fair claim (issue 4): bookkeeping that lets the claim rank groups without
-- reading the backlog, kept exact by triggers on every write path (enqueue, batch
-- enqueue, claim, complete, fail, defer, stuck sweep, retry, pruning, and any future
-- statement), so no write path can forget it. Nothing here is a hot spot: no row is
-- updated by every claim or every completion of a group (see each table).

-- Groups of a type that may have pending jobs, with lower bounds of their pending jobs'
-- created_at and run_after. The claim walks these in order of a lower bound of each
-- group's first job's key and probes only the first few groups (docs/fast-claim.md).
-- Invariant: for every pending job j with a group,
--   a row (j.type, j.group_id) exists with head_lb <= j.created_at and
--   ready_lb <= j.run_after.
-- Writers that put a job into pending lower the bounds when needed (rare: a new job is
-- newer than its group's head) and otherwise only take FOR KEY SHARE on the row (shared,
-- like a foreign-key check, so concurrent enqueuers of one group never wait for each
-- other). The claim raises the bounds afterwards (fair_tighten) with FOR UPDATE SKIP
-- LOCKED, which skips a row while any writer that relied on it is still open.
CREATE TABLE {schema}.fair_groups (
    type      text NOT NULL,
    group_id  text NOT NULL,
    head_lb   timestamptz NOT NULL,
    ready_lb  timestamptz NOT NULL,
    PRIMARY KEY (type, group_id)
);

-- Done jobs with a group per type and group, counted only when finished at or after the
-- type's checkpoint (fair_edge.edge). A completion adds 1 to shard id % 8, so eight
-- workers completing jobs of one big group rarely touch the same row; fair_advance
-- folds the shards into shard 0 while it moves the checkpoint.
CREATE TABLE {schema}.fair_done (
    type      text NOT NULL,
    group_id  text NOT NULL,
    shard     smallint NOT NULL,
    n         integer NOT NULL,
    PRIMARY KEY (type, group_id, shard)
);

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

-- Probe and bound maintenance: a group's pending jobs by run_after (fair_tighten).
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

-- Record pending jobs (type, group, created_at, run_after) in fair_groups, keeping its
-- invariant. Lock first, then lower: a tightener cannot raise a bound this transaction
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
        INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, ready_lb)
        SELECT t.type, t.group_id, min(t.head), min(t.ready)
        FROM unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
        GROUP BY t.type, t.group_id
        ORDER BY t.type, t.group_id
        ON CONFLICT (type, group_id) DO NOTHING;

        SELECT count(DISTINCT (t.type, t.group_id)) INTO wanted
        FROM unnest(p_types, p_groups) AS t(type, group_id);
        -- FOR KEY SHARE: shared among writers; conflicts only with fair_tighten's FOR UPDATE.
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM {schema}.fair_groups fg
            WHERE (fg.type, fg.group_id) IN (
                SELECT t.type, t.group_id FROM unnest(p_types, p_groups) AS t(type, group_id))
            ORDER BY fg.type, fg.group_id
            FOR KEY SHARE
        ) l;
        EXIT WHEN locked = wanted;  -- else a tightener deleted a row in between: again
    END LOOP;

    -- Lower where needed. Rows are locked in key order (FOR NO KEY UPDATE, which does
    -- not conflict with other writers' FOR KEY SHARE), so two writers lowering the same
    -- groups cannot deadlock. Rare: new jobs are newer than their group's head.
    UPDATE {schema}.fair_groups AS fg
    SET head_lb = least(fg.head_lb, a.head), ready_lb = least(fg.ready_lb, a.ready)
    FROM (
        SELECT l.type, l.group_id, m.head, m.ready
        FROM {schema}.fair_groups l
        JOIN (
            SELECT t.type, t.group_id, min(t.head) AS head, min(t.ready) AS ready
            FROM unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
            GROUP BY t.type, t.group_id
        ) m ON m.type = l.type AND m.group_id = l.group_id
        WHERE l.head_lb > m.head OR l.ready_lb > m.ready
        ORDER BY l.type, l.group_id
        FOR NO KEY UPDATE OF l
    ) a
    WHERE fg.type = a.type AND fg.group_id = a.group_id;
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

-- Move a type's edge to p_target (either direction) and fold fair_done's shards. Takes
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
    -- Fold shards 1-7 into shard 0 and drop empty rows.
    WITH moved AS (
        DELETE FROM {schema}.fair_done WHERE type = p_type AND shard <> 0
        RETURNING group_id, n
    )
    INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
    SELECT p_type, m.group_id, 0::smallint, sum(m.n)::int
    FROM moved m GROUP BY m.group_id ORDER BY m.group_id
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
    DELETE FROM {schema}.fair_done WHERE type = p_type AND n = 0;
    RETURN true;
END
$$;

-- Raise the bounds of some groups of a type to their pending jobs' true minima, or
-- drop the row when the group has no pending job. Rows a writer relies on (locked FOR
-- KEY SHARE or being lowered) are skipped; the bounds are read in a later statement,
-- whose fresh snapshot sees every writer that finished before the lock was taken, while
-- writers that come later wait for this transaction and then lower again if needed.
CREATE FUNCTION {schema}.fair_tighten(p_type text, p_groups text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    got text[];
    n integer;
BEGIN
    SELECT array_agg(l.group_id) INTO got FROM (
        SELECT fg.group_id FROM {schema}.fair_groups fg
        WHERE fg.type = p_type AND fg.group_id = ANY(p_groups)
        ORDER BY fg.group_id
        FOR UPDATE SKIP LOCKED
    ) l;
    IF got IS NULL THEN
        RETURN 0;
    END IF;
    WITH b AS (
        SELECT g.group_id,
               (SELECT min(j.created_at) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending') AS head,
               (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending') AS ready
        FROM unnest(got) AS g(group_id)
    ),
    gone AS (
        DELETE FROM {schema}.fair_groups fg USING b
        WHERE fg.type = p_type AND fg.group_id = b.group_id AND b.head IS NULL
    )
    UPDATE {schema}.fair_groups fg SET head_lb = b.head, ready_lb = b.ready
    FROM b
    WHERE fg.type = p_type AND fg.group_id = b.group_id AND b.head IS NOT NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Build the bookkeeping for jobs that exist already (the triggers keep it from here).
INSERT INTO {schema}.fair_groups (type, group_id, head_lb, ready_lb)
SELECT type, group_id, min(created_at), min(run_after)
FROM {schema}.jobs
WHERE status = 'pending' AND group_id IS NOT NULL
GROUP BY type, group_id;

INSERT INTO {schema}.fair_done (type, group_id, shard, n)
SELECT type, group_id, 0, count(*)
FROM {schema}.jobs
WHERE status = 'done' AND group_id IS NOT NULL
GROUP BY type, group_id;
