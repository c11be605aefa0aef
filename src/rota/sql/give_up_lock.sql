-- Take one owed give-up for this transaction; a concurrent sweeper skips it.
SELECT * FROM {schema}.jobs
WHERE id = %(id)s AND give_up_pending
FOR UPDATE SKIP LOCKED
