-- The queue's clock: the database's now() plus the queue's clock offset.
SELECT now() + %(offset)s::interval AS now
