-- Whether this role may VACUUM the claim bookkeeping tables (a member of their owner
-- role, or a superuser).
SELECT bool_and(pg_has_role(c.relowner, 'USAGE'))
       OR (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname IN ('fair_groups', 'fair_served', 'fair_fold_mark',
                                                 'fair_owners', 'fair_owner_changes')
