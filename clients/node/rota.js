// Enqueue rota jobs from Node through the database's functions SCHEMA.enqueue and
// SCHEMA.enqueue_many (docs/enqueue-from-sql.md), with the `pg` package. The checks, the
// defaults, the dedupe key and the clock are the database's, the same as Python's
// Queue.enqueue: nothing here copies them. Pass the client of your own transaction and
// the job exists if and only if that transaction commits.

/** What the database said was wrong with a job, by SQLSTATE (docs/enqueue-from-sql.md,
 * "Errors"): `kind` is the Python exception rota raises for the same input. */
export class RotaError extends Error {
  /**
   * @param {string} message the database's message, as Python's
   * @param {{code: string, column?: string, cause?: unknown}} details
   */
  constructor(message, { code, column, cause }) {
    super(message, { cause });
    this.name = 'RotaError';
    /** SQLSTATE: 22023 bad argument, 23503 unknown group, 42704 undeclared job type,
     * 54000 payload too large or too deep. */
    this.code = code;
    /** The argument at fault: type, payload, group_id, dedupe_key, run_after,
     * max_attempts, or jobs (the batch's shape). */
    this.column = column;
    this.kind = KINDS[code] ?? (column === 'payload' ? 'PayloadError' : 'InvalidInput');
  }
}

const KINDS = { '23503': 'UnknownGroup', '42704': 'UnknownJobType' };
const RULES = new Set(['22023', '23503', '42704', '54000']);
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/;

/**
 * The W3C Trace Context of the span enqueueing a job (with @opentelemetry/api:
 * `propagation.inject(context.active(), carrier)`); the job's handler span continues
 * that trace (docs/operations.md, "Traces").
 * @typedef {{traceparent: string, tracestate?: string}} TraceContext
 */

/**
 * The queue in `schema` (default "rota").
 * @param {string} [schema]
 */
export function rota(schema = 'rota') {
  if (!IDENTIFIER.test(schema)) {
    throw new TypeError(`schema ${JSON.stringify(schema)} is not a valid identifier`);
  }
  const s = `"${schema}"`;
  const one = `SELECT ${s}.enqueue($1, $2::jsonb, $3, $4, $5::timestamptz, $6, $7::jsonb) AS id`;
  const many = `SELECT id FROM ${s}.enqueue_many($1::jsonb) AS id`;
  return {
    /**
     * Enqueue one job; resolves to its id (int8, as text), or null when an open job has
     * the same dedupe key.
     * @param {import('pg').ClientBase} client a client, inside your transaction or not
     * @param {string} type
     * @param {unknown} payload any JSON value (sent as JSON.stringify makes it)
     * @param {{groupId?: string, dedupeKey?: string, runAfter?: Date,
     *          maxAttempts?: number, traceContext?: TraceContext}} [options]
     * @returns {Promise<string | null>}
     */
    async enqueue(client, type, payload, options = {}) {
      const { groupId = null, dedupeKey = null, runAfter = null, maxAttempts = null,
        traceContext = null } = options;
      const params = [type, json(payload), groupId, dedupeKey,
        runAfter === null ? null : instant(runAfter), maxAttempts,
        traceContext === null ? null : JSON.stringify(traceContext)];
      const { rows } = await run(client, one, params);
      return rows[0].id;
    },

    /**
     * Enqueue a batch in one statement; resolves to the ids of the jobs created, in the
     * order given (duplicates of open jobs, or of earlier items, have none).
     * @param {import('pg').ClientBase} client
     * @param {Array<{type: string, payload: unknown, groupId?: string,
     *                dedupeKey?: string, runAfter?: Date, maxAttempts?: number,
     *                traceContext?: TraceContext}>} jobs
     * @returns {Promise<string[]>}
     */
    async enqueueMany(client, jobs) {
      const items = jobs.map((j) => ({
        type: j.type,
        payload: j.payload === undefined ? null : j.payload,
        group_id: j.groupId ?? null,
        dedupe_key: j.dedupeKey ?? null,
        run_after: j.runAfter == null ? null : instant(j.runAfter),
        max_attempts: j.maxAttempts ?? null,
        trace_context: j.traceContext ?? null,
      }));
      const { rows } = await run(client, many, [JSON.stringify(items)]);
      return rows.map((r) => r.id);
    },
  };
}

/** A payload as JSON text: pg would send a JS string as is, not as a JSON string. */
function json(payload) {
  const text = JSON.stringify(payload === undefined ? null : payload);
  if (text === undefined) {
    throw new TypeError(`payload is not JSON-serializable: ${typeof payload}`);
  }
  return text;
}

/** An instant as ISO 8601 with its offset (never a local time without one). */
function instant(when) {
  if (!(when instanceof Date) || Number.isNaN(when.getTime())) {
    throw new TypeError('runAfter must be a valid Date');
  }
  return when.toISOString();
}

async function run(client, text, params) {
  try {
    return await client.query(text, params);
  } catch (err) {
    if (err && RULES.has(err.code)) {
      throw new RotaError(err.message, { code: err.code, column: err.column, cause: err });
    }
    throw err;
  }
}
