-- Defer jobs under their claims (docs/design.md, "Defer"): back to pending at `until`
-- (when NULL, `delay` after the queue's clock), lock cleared, and the claim's attempt
-- handed back (greatest(attempts - 1, 0)), so days of quota pressure never retire a job
-- that was never tried. last_error is untouched.
-- Each deferral is counted; past max_deferrals (when set) the job gives up instead.
-- The claim's token stays on the row, as in complete.sql, so a repeat is recognised.
-- Rows are locked in id order so batch deferrals cannot deadlock with sweepers.
WITH target AS MATERIALIZED (
{fenced_claims}
)
UPDATE {schema}.jobs AS u
SET status = CASE WHEN u.deferrals + 1 > %(max_deferrals)s::int THEN 'failed'
                  ELSE 'pending' END,
    finished_at = CASE WHEN u.deferrals + 1 > %(max_deferrals)s::int
                       THEN now() + %(offset)s::interval END,
    give_up_pending = coalesce(u.deferrals + 1 > %(max_deferrals)s::int, false),
    last_error = CASE WHEN u.deferrals + 1 > %(max_deferrals)s::int
                      THEN 'deferred more than ' || %(max_deferrals)s::int || ' times'
                      ELSE u.last_error END,
    run_after = coalesce(%(until)s::timestamptz,
                         now() + %(offset)s::interval + %(delay)s::interval),
    attempts = greatest(u.attempts - 1, 0),
    deferrals = u.deferrals + 1,
    locked_at = NULL
WHERE u.id = ANY (ARRAY(SELECT x.id FROM target x))
RETURNING u.id, u.status
