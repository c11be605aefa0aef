-- Settings of verify.sql's (and the rebuild's) transaction: timestamps print in UTC, so
-- a violation reads the same from any session.
SELECT set_config('TimeZone', 'UTC', true)
