-- Groups (rota's table or the application's groups relation) in group_id order, from
-- just after %(after)s (null: the first), at most %(limit)s: `rota groups list`.
SELECT g.group_id::text AS group_id, g.owner_id::text AS owner_id, g.plan::text AS plan,
       g.active
FROM {groups} g
WHERE %(after)s::text IS NULL OR g.group_id::text > %(after)s::text
ORDER BY g.group_id::text
LIMIT %(limit)s
