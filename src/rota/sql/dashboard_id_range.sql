-- Dashboard `/jobs`: the highest job id (where the first page starts) and the lowest
-- (where paging stops), each one probe of the primary key.
SELECT (SELECT max(id) FROM {schema}.jobs) AS high,
       (SELECT min(id) FROM {schema}.jobs) AS low
