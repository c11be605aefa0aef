-- Groups (rota's table or the application's groups relation) in group_id order, from
-- just after %(after)s (null: the first), at most %(limit)s: `rota groups list`. With
-- each, the cost charged to it in the served window, all types summed, from the fair
-- claim's bookkeeping (docs/design.md, "Cost"): its fair_groups rows' folded served
-- counts (fair_groups_group_idx) and its deltas not folded yet (one pass over
-- fair_served, the unfolded tail, for the whole page).
WITH page AS (
    SELECT g.group_id::text AS group_id, g.owner_id::text AS owner_id, g.plan::text AS plan,
           g.active
    FROM {groups} g
    WHERE %(after)s::text IS NULL OR g.group_id::text > %(after)s::text
    ORDER BY g.group_id::text
    LIMIT %(limit)s
),
unfolded AS (
    SELECT f.group_id, sum(f.n) AS n
    FROM {schema}.fair_served f
    WHERE f.group_id IN (SELECT p.group_id FROM page p)
    GROUP BY f.group_id
)
SELECT p.group_id, p.owner_id, p.plan, p.active,
       coalesce((SELECT sum(fg.served_n) FROM {schema}.fair_groups fg
                 WHERE fg.group_id = p.group_id), 0) + coalesce(u.n, 0) AS served
FROM page p
LEFT JOIN unfolded u ON u.group_id = p.group_id
ORDER BY p.group_id
