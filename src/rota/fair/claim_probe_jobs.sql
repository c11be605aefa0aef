-- Fragment of claim_order_group.sql and claim_order_owner.sql, in the FROM of their
-- probe after a group's walk row: the group's first per + 1 claimable jobs (per: the
-- walk row's probe size), and its stale ones (the group-less jobs for the walk's
-- group-less row).
-- Needs:   alias w (a walk row: group_id, head_lb, head_id, per); CTEs clock, stale;
--          parameter type.
-- Defines: alias j(id, created_at).
    CROSS JOIN LATERAL (
        (SELECT p.id, p.created_at
         FROM {schema}.jobs p, clock c
         WHERE p.type = %(type)s AND p.group_id = w.group_id AND p.status = 'pending'
           -- From the group's head bound on (the pool's, '-infinity' once expired): no
           -- claimable job lies before it (the head invariant), and the index scan
           -- starts past the entries of jobs claimed before the last fold, which a
           -- long transaction keeps from vacuum (docs/operations.md, "Long
           -- transactions").
           AND (p.created_at, p.id) >= (w.head_lb, w.head_id)
           -- `+ interval '0'` keeps run_after out of the index condition: the planner
           -- otherwise picks jobs_pending_ready_idx and sorts the group's ready jobs
           -- instead of reading jobs_pending_idx in order and stopping after
           -- per + 1 rows (bench/RESULTS.md, "Planner notes").
           AND p.run_after + interval '0' <= c.now
         ORDER BY p.created_at, p.id
         LIMIT w.per + 1)
        UNION ALL
        (SELECT p.id, p.created_at
         FROM {schema}.jobs p, clock c
         WHERE w.group_id IS NULL
           AND p.type = %(type)s AND p.group_id IS NULL AND p.status = 'pending'
           AND p.run_after + interval '0' <= c.now
         ORDER BY p.created_at, p.id
         LIMIT w.per + 1)
        UNION ALL
        SELECT s.id, s.created_at FROM stale s
        WHERE s.group_id = w.group_id OR (w.group_id IS NULL AND s.group_id IS NULL)
    ) j
