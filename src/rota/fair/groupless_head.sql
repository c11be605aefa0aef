-- Fragment of claim_pool_cached.sql and claim_pool_scan.sql, a FROM item.
-- Needs:   CTE stale (claim.sql); parameter type.
-- Defines: a derived table of at most one row (head, head_id), for the caller to alias.
-- A lower bound of the group-less jobs' head: the first
-- group-less job of the type by (created_at, id), pending (due or not: one index entry,
-- where the first due one could sit behind many deferred ones) or stale. No row when
-- there is none.
(SELECT x.created_at AS head, x.id AS head_id FROM (
     (SELECT p.created_at, p.id FROM {schema}.jobs p
      WHERE p.type = %(type)s AND p.group_id IS NULL AND p.status = 'pending'
      ORDER BY p.created_at, p.id LIMIT 1)
     UNION ALL
     (SELECT s.created_at, s.id FROM stale s WHERE s.group_id IS NULL
      ORDER BY s.created_at, s.id LIMIT 1)) x
 ORDER BY x.created_at, x.id LIMIT 1)
