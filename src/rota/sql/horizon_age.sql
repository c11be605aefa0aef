-- Metrics: how far the xmin horizon lags (docs/operations.md, "Long transactions").
-- While a transaction holds a snapshot or an xid, vacuum can remove no row version
-- newer than it, in rota's tables as in any other. `seconds`: the age of the oldest
-- such transaction of this database (other databases' sessions do not hold its tables
-- back), autovacuum workers and this session left out. `transactions`: how many
-- transactions the horizon lags, also counting standbys' feedback and replication
-- slots (which carry no start time). Without superuser or pg_read_all_stats, other
-- roles' sessions show NULL in these columns, so both are then lower bounds.
SELECT
    coalesce((SELECT extract(epoch FROM max(now() - a.xact_start))
              FROM pg_stat_activity a
              WHERE a.datname = current_database()
                AND a.pid <> pg_backend_pid()
                AND a.backend_type <> 'autovacuum worker'
                AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)), 0)::float8
        AS seconds,
    coalesce(greatest(
        (SELECT max(greatest(age(a.backend_xmin), age(a.backend_xid)))
         FROM pg_stat_activity a
         WHERE a.datname = current_database()
           AND a.pid <> pg_backend_pid()
           AND a.backend_type <> 'autovacuum worker'),
        (SELECT max(age(r.backend_xmin)) FROM pg_stat_replication r),
        (SELECT max(greatest(age(s.xmin), age(s.catalog_xmin)))
         FROM pg_replication_slots s)), 0)::int8 AS transactions
