-- Is work of this type left waiting for a quota's reset? (Then a run that finds nothing
-- else to do stops quota_reserve / quota_exhausted rather than no_work.)
SELECT EXISTS (
    SELECT 1 FROM {schema}.jobs
    WHERE type = %(type)s AND status = 'pending' AND run_after <= %(until)s
)
