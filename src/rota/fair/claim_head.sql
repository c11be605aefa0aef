-- Fragment of claim_pool_cached.sql and claim_pool_scan.sql, in the FROM of a group's
-- row: the group's head, the smaller of the row's bound (none once expired) and the
-- stale head.
-- Needs:   aliases fg (a fair_groups row, or nulls), c (the clock CTE), sh (a
--          stale_head row, or nulls).
-- Defines: alias hd(head, head_id).
-- Expressions, not a sort of the two a row: the planner pulls them up into the row's
-- projection, and a group with neither has no row.
CROSS JOIN LATERAL (
    SELECT CASE WHEN b.row_first THEN b.head ELSE sh.head END AS head,
           CASE WHEN b.row_first THEN b.head_id ELSE sh.head_id END AS head_id
    FROM (SELECT x.head, x.head_id,
                 x.head IS NOT NULL
                 AND (sh.head IS NULL OR (x.head, x.head_id) <= (sh.head, sh.head_id))
                   AS row_first
          FROM (SELECT CASE WHEN fg.head_until <= c.now THEN '-infinity'::timestamptz
                            ELSE fg.head_lb END AS head,
                       CASE WHEN fg.head_until <= c.now THEN 0::bigint
                            ELSE fg.head_id END AS head_id) x) b
    WHERE b.head IS NOT NULL OR sh.head IS NOT NULL) hd
