-- Record the give-up hook as run, in the same transaction as the hook's own writes.
UPDATE {schema}.jobs SET give_up_pending = false WHERE id = %(id)s
