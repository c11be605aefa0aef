-- Included by claim_pool_cached and claim_pool_scan (the claim_head placeholder, in the
-- FROM of a group's row: fair_groups as fg, clock as c, stale_head as sh): the group's
-- head, the smaller of the row's bound (none once expired) and the stale head, as a row.
CROSS JOIN LATERAL (
    SELECT x.head, x.head_id FROM (VALUES
        (CASE WHEN fg.head_until <= c.now THEN '-infinity' ELSE fg.head_lb END,
         CASE WHEN fg.head_until <= c.now THEN 0 ELSE fg.head_id END),
        (sh.head, sh.head_id)) x(head, head_id)
    WHERE x.head IS NOT NULL
    ORDER BY x.head, x.head_id LIMIT 1) hd
