// Enqueue N jobs of one type through rota's SQL functions, in transactions of 10, every
// other transaction rolled back; prints a JSON report of what was committed. The test
// tests/test_node_client.py runs it and then a Python `rota worker`, which must run
// exactly the committed jobs, each once.
//
// Environment: DATABASE_URL (libpq URL), ROTA_SCHEMA (default rota), ROTA_ROLE (run as
// this role, SET ROLE: one that may only enqueue), JOBS (default 1000), JOB_TYPE
// (default echo), TRACEPARENT (a W3C traceparent every job carries, as a traced
// service's current span would give it; default none).
import pg from 'pg';
import { rota, RotaError } from './rota.js';

const total = Number(process.env.JOBS ?? 1000);
const type = process.env.JOB_TYPE ?? 'echo';
const queue = rota(process.env.ROTA_SCHEMA ?? 'rota');
const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
const PER_TRANSACTION = 10;
const traceContext = process.env.TRACEPARENT
  ? { traceparent: process.env.TRACEPARENT } : undefined;

await client.connect();
try {
  if (process.env.ROTA_ROLE) {
    await client.query('SELECT set_config($1, $2, false)', ['role', process.env.ROTA_ROLE]);
  }
  const committed = [];
  let rolledBack = 0;
  let duplicates = 0;
  for (let t = 0; t * PER_TRANSACTION < total; t++) {
    const first = t * PER_TRANSACTION;
    const size = Math.min(PER_TRANSACTION, total - first);
    const ns = Array.from({ length: size }, (_, k) => first + k);
    await client.query('BEGIN');
    let ids;
    if (t % 4 === 3) { // every fourth transaction as one batch
      ids = await queue.enqueueMany(client, ns.map((n) => (
        { type, payload: { n, from: 'node' }, dedupeKey: `node:${n}`, traceContext })));
    } else {
      ids = [];
      for (const n of ns) {
        ids.push(await queue.enqueue(client, type, { n, from: 'node' },
          { dedupeKey: `node:${n}`, traceContext }));
      }
    }
    // Asking again while the job is open creates nothing.
    if (await queue.enqueue(client, type, {}, { dedupeKey: `node:${first}` }) === null) {
      duplicates++;
    }
    if (t % 2 === 0) {
      await client.query('COMMIT');
      committed.push(...ids);
    } else {
      await client.query('ROLLBACK');
      rolledBack += ids.length;
    }
  }
  // Bad input: the database's error, with the same SQLSTATE and text as Python's.
  let refused = null;
  try {
    await queue.enqueue(client, type, {}, { groupId: 'no-such-group' });
  } catch (err) {
    if (!(err instanceof RotaError)) throw err;
    refused = { code: err.code, kind: err.kind, column: err.column, message: err.message };
  }
  console.log(JSON.stringify({ committed, rolledBack, duplicates, refused }));
} finally {
  await client.end();
}
