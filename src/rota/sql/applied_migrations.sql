-- admin.missing_migrations: the versions `rota migrate` has applied to this schema.
SELECT version FROM {schema}.rota_migrations ORDER BY version
