-- Which of these group ids the groups relation does not know.
SELECT x.group_id
FROM unnest(%(group_ids)s::text[]) AS x(group_id)
WHERE NOT EXISTS (SELECT 1 FROM {groups} g WHERE g.group_id = x.group_id)
ORDER BY x.group_id
