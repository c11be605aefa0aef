-- Queue.wait, done waiting (docs/design.md, "Results").
DELETE FROM {schema}.job_waiters WHERE job_id = %(id)s AND waiter = %(waiter)s::uuid
