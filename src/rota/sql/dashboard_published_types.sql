-- Dashboard without an app: the job types the SQL entry points accept, as
-- `rota migrate --app` published them (the app's stage types and its queue's declared
-- ones); NULL (or no row): any type, so none is known to be run by no stage.
SELECT types FROM {schema}.enqueue_settings
