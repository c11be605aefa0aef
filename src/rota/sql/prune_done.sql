-- Bounded table: delete one batch of done jobs finished before the retention cutoff
-- (never inside the served window, which the fair claim still counts), and their failed
-- attempts' errors (and any waiter a dead process left) with them (docs/design.md, "Results"). Batches keep each transaction
-- short; id order and SKIP LOCKED keep it out of claimers' way.
WITH old AS (
    SELECT id
    FROM {schema}.jobs
    WHERE status = 'done'
      AND finished_at < now() + %(offset)s::interval - %(retention)s::interval
    ORDER BY id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), errors AS (
    DELETE FROM {schema}.job_errors AS e
    USING old
    WHERE e.job_id = old.id
), waiters AS (
    -- Left by a waiter that died while waiting.
    DELETE FROM {schema}.job_waiters AS w
    USING old
    WHERE w.job_id = old.id
)
DELETE FROM {schema}.jobs AS d
USING old
WHERE d.id = old.id
