-- The owner and plan of a job's group, for per-owner allowances.
SELECT owner_id, plan FROM {groups} WHERE group_id = %(group_id)s
