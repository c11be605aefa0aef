-- Dashboard `/fairness`: the owner and plan of the groups %(ids)s (the longest-waiting
-- ones), from the groups relation; a group missing from it has neither.
SELECT g.group_id::text AS group_id, g.owner_id::text AS owner_id, g.plan::text AS plan
FROM {groups} g
WHERE g.group_id::text = ANY (%(ids)s::text[])
