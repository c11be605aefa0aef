-- The claim upkeep's periodic VACUUM of the fair-claim bookkeeping
-- (ClaimUpkeep._vacuum): small tables whose rows are rewritten by every fold: the groups'
-- rows, the served deltas, the fold marks, the walks' floors, the owners' rows and the
-- change records, whose dead entries the walks and the claim's look-up of changes
-- (fair_owner_changes_xid_idx) would otherwise read.
-- TRUNCATE false: giving back the empty pages at a table's end needs an ACCESS EXCLUSIVE
-- lock, which a vacuum waits up to 5 s for per table while claims keep reading the
-- table; that held the upkeep's loop (folds included) for seconds at every vacuum when
-- claims ran back to back (bench/RESULTS.md, section 17). Autovacuum still truncates.
VACUUM (SKIP_LOCKED, TRUNCATE false) {schema}.fair_groups, {schema}.fair_served,
    {schema}.fair_fold_mark, {schema}.fair_walk_floor, {schema}.fair_owners,
    {schema}.fair_owner_changes
