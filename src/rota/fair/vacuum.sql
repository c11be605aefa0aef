-- The claim upkeep's periodic VACUUM of the fair-claim bookkeeping
-- (ClaimUpkeep._vacuum): small tables whose rows are rewritten by every fold.
VACUUM (SKIP_LOCKED) {schema}.fair_groups, {schema}.fair_served, {schema}.fair_fold_mark
