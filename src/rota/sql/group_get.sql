-- One group of rota's own groups table, locked (FOR UPDATE) so that `rota groups set`
-- changes only the fields it is given, with no concurrent change lost in between.
SELECT group_id, owner_id, plan, active, max_running
FROM {schema}.groups
WHERE group_id = %(group_id)s
FOR UPDATE
