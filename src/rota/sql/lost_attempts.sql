-- Stale locks (docs/design.md, "Stale locks"): a job reclaimed after its lock went
-- stale had an attempt that ended with no error (its run was killed, or cut off from
-- the database). Recorded here, once, when the job is claimed again, so each attempt
-- before the running one has its error. Only the claimed jobs (the caller's ids and
-- claim tokens: it holds them), in id order.
INSERT INTO {schema}.job_errors (job_id, attempt, failed_at, error_type, error)
SELECT j.id, j.attempts - 1, now() + %(offset)s::interval, 'rota.errors.AttemptLost',
       'AttemptLost: the run holding this attempt stopped without settling it (killed, or cut '
       'off from the database); its lock went stale and the job was claimed again'
FROM {schema}.jobs j
WHERE j.id = ANY(%(ids)s)
  AND j.claim_token = ANY(%(claim_tokens)s)
  AND j.attempts > 1
  AND NOT EXISTS (SELECT 1 FROM {schema}.job_errors e
                  WHERE e.job_id = j.id AND e.attempt = j.attempts - 1)
ORDER BY j.id
