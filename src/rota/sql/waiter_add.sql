-- Queue.wait: say that this waiter listens for the job (docs/design.md, "Results").
INSERT INTO {schema}.job_waiters (job_id, waiter) VALUES (%(id)s, %(waiter)s::uuid)
