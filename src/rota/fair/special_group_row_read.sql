-- Fragment of claim_pool_special.sql for the sorted pass (claim_pool_sorted.sql), in
-- the FROM of a special group (alias s): its fair_groups row as fg, or nulls, from the
-- pass's one read of the type's rows (group_rows). While the horizon is held every fold
-- leaves a version of each folded row with its index entries, so a lookup of one
-- group's row by index visits all its versions: at 100,000 pending over 2,000 groups,
-- flat out, 60 s into a pin, the special groups' 100 lookups read 4,630 buffers (46 a
-- group), about half the claim's (bench/RESULTS.md, section 17).
-- Needs:   alias s (a special row: group_id); CTE group_rows.
-- Defines: alias fg(head_lb, head_id, head_until, ready_lb, served_n).
    LEFT JOIN group_rows fg ON fg.group_id = s.group_id
