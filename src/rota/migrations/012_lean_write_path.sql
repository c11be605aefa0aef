-- Fewer index entries per job write (issue 4: enqueue and drain throughput). Every
-- enqueue, claim and completion of a job inserts an entry into each index whose
-- predicate the new row version matches; two of 001's indexes cost that on every write
-- and served no statement that the others do not serve:
--   jobs_open_dedupe_uq indexed every open job, also the many with no dedupe key (NULL
--   never conflicts); it now holds only open jobs that have a key. Enqueue's
--   ON CONFLICT DO NOTHING names no target, so it still arbitrates on this index.
--   jobs_status_type_idx (status, type) indexed every row of every status; the claim,
--   the served window, stale reclaim, give-up hooks and pruning read the partial
--   indexes, and inspection (`rota jobs`) walks the primary key newest first. Failed
--   jobs, the one status without an index of its own, get a small partial one.
DROP INDEX {schema}.jobs_open_dedupe_uq;
CREATE UNIQUE INDEX jobs_open_dedupe_uq ON {schema}.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX {schema}.jobs_status_type_idx;
CREATE INDEX jobs_failed_idx ON {schema}.jobs (type, id) WHERE status = 'failed';

-- jobs.run_id names the run that claimed the job, for inspection. As a foreign key to
-- runs it made every claimed row look its run up (a claim of 1,000 jobs spent 2.8 of
-- its 18 ms there) and every inserted row queue a check; runs are never deleted, and
-- the runner only claims under the run it has just written, so the key checked nothing.
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_run_id_fkey;

-- fair_note_pending took one array entry per job and read the arrays several times (a
-- batch of 1,000 jobs cost 2.5 ms in the insert trigger). Only two things about the jobs
-- of a group that are due now matter to it: their oldest created_at and their earliest
-- run_after; jobs due later matter one by one (they may cut the head's validity). So the
-- entry point now folds each group's due-now jobs into one entry and passes the rest
-- through to 010's function, unchanged, under its new name; and when the rows already
-- bound the new jobs, it only takes the shared locks.
ALTER FUNCTION {schema}.fair_note_pending(text[], text[], timestamptz[], timestamptz[])
    RENAME TO fair_note_pending_each;

CREATE FUNCTION {schema}.fair_note_pending(
    p_types text[], p_groups text[], p_heads timestamptz[], p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    wanted int;
    locked int;
    bounded int;
BEGIN
    -- The usual enqueue: every job due now, into groups whose rows exist and already
    -- bound them (head_lb <= created_at, ready_lb <= run_after). Then the invariant
    -- holds as it is, and the shared locks are all there is to take: one statement
    -- instead of the several below (a one-job enqueue paid 0.15 ms for them).
    IF NOT EXISTS (SELECT 1 FROM unnest(p_readies) AS x(ready) WHERE x.ready > now()) THEN
        WITH c AS (
            SELECT t.type, t.group_id, min(t.head) AS head, min(t.ready) AS ready
            FROM unnest(p_types, p_groups, p_heads, p_readies)
                 AS t(type, group_id, head, ready)
            GROUP BY t.type, t.group_id
        )
        SELECT (SELECT count(*) FROM c), count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, locked, bounded
        FROM (SELECT fg.head_lb <= c.head AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = locked AND locked = bounded THEN
            RETURN;
        END IF;
    END IF;
    SELECT array_agg(c.type) AS types, array_agg(c.group_id) AS groups,
           array_agg(c.head) AS heads, array_agg(c.ready) AS readies
    INTO r
    FROM (
        SELECT t.type, t.group_id, min(t.head) AS head, min(t.ready) AS ready
        FROM unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
        WHERE t.ready <= now()
        GROUP BY t.type, t.group_id
        UNION ALL
        SELECT t.type, t.group_id, t.head, t.ready
        FROM unnest(p_types, p_groups, p_heads, p_readies) AS t(type, group_id, head, ready)
        WHERE t.ready > now()
    ) c;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending_each(r.types, r.groups, r.heads, r.readies);
    END IF;
END
$$;

-- The insert trigger's usual case without building arrays: every inserted job is pending,
-- due now, in a group whose row already bounds it. Then it takes the shared row locks
-- and stops (one statement over the transition table); anything else goes the way 010
-- went (its body, below the check, unchanged).
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
            SELECT i.type, i.group_id, min(i.created_at) AS head, min(i.run_after) AS ready,
                   bool_and(i.run_after <= now()) AS due
            FROM inserted i
            WHERE i.group_id IS NOT NULL
            GROUP BY i.type, i.group_id
        )
        SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE c.due),
               count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, due, locked, bounded
        FROM (SELECT fg.head_lb <= c.head AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = due AND due = locked AND locked = bounded THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(created_at) AS heads, array_agg(run_after) AS readies
    INTO r FROM inserted WHERE status = 'pending' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.readies);
    END IF;
    -- Served counts: done rows at or after the edge, and running rows (counted whatever
    -- their lock's age, as 'infinity' passes any edge; migration 014).
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.types, r.groups, r.ids, r.finished, 1);
    END IF;
    RETURN NULL;
END
$$;
