-- Fragment of claim_pool_cached.sql and claim_pool_scan.sql, in the FROM of a group's
-- row: the group's head, the smaller of the row's bound (none once expired) and the
-- stale head.
-- Needs:   aliases fg (a fair_groups row, or nulls), c (the clock CTE), sh (a
--          stale_head row, or nulls).
-- Defines: alias hd(head, head_id).
CROSS JOIN LATERAL (
    SELECT x.head, x.head_id FROM (VALUES
        (CASE WHEN fg.head_until <= c.now THEN '-infinity' ELSE fg.head_lb END,
         CASE WHEN fg.head_until <= c.now THEN 0 ELSE fg.head_id END),
        (sh.head, sh.head_id)) x(head, head_id)
    WHERE x.head IS NOT NULL
    ORDER BY x.head, x.head_id LIMIT 1) hd
