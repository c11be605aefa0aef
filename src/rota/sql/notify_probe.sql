-- The worker's check that notifications reach its LISTEN connection (docs/operations.md,
-- "Poolers and failover"): sent through the queue's pool on a channel only the worker
-- that sends it listens for, with a token of its own. Also names the database, so a
-- listen_url on another database can be told apart.
SELECT pg_notify('rota_probe', %(token)s), current_database()
