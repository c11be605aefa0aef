-- Fragment of claim_pool_special.sql, in the FROM of a special group (alias s): its
-- fair_groups row as fg, or nulls, fetched by an index lookup of its own (LATERAL …
-- LIMIT keeps it parameterized: joined flat, the generic plan hashed all of
-- fair_groups, (bench/RESULTS.md, "Planner notes")).
-- Needs:   alias s (a special row: group_id); parameter type.
-- Defines: alias fg(head_lb, head_id, head_until, ready_lb, served_n, group_id, plan,
--          active).
    LEFT JOIN LATERAL (
        SELECT f.head_lb, f.head_id, f.head_until, f.ready_lb, f.served_n, f.group_id,
               f.plan, f.active
        FROM {schema}.fair_groups f
        -- Newest version first: while a long transaction keeps every version of the
        -- row, the one this snapshot sees is nearly always the last in the index's
        -- order (equal keys are ordered by where the version lies, and a new one goes
        -- after the old), so a backward scan meets it first instead of reading past
        -- all the others (bench/RESULTS.md, section 31). The key as a range, not an
        -- equality, so the planner keeps the order the LIMIT needs (an equality makes
        -- the ORDER BY redundant, and the scan forward); one version is visible.
        WHERE f.type = %(type)s AND f.group_id >= s.group_id AND f.group_id <= s.group_id
        ORDER BY f.group_id DESC LIMIT 1) fg ON true
