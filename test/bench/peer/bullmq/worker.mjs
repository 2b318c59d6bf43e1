/*
 * The BullMQ side of test/bench/worker-side-by-side.bench.ts: a BullMQ Worker
 * doing our worker's summary job (the summaries workflow,
 * apps/worker/src/workflows/summaries.workflow.ts, as the job did before it
 * ran on the workflow engine), in a process of its own:
 *   1. the pre-check our worker makes (SummaryWriter.isStored):
 *      SELECT 1 FROM summaries WHERE job_id = $1 (a stored job is a duplicate);
 *   2. the model through the official openai SDK (maxRetries 0, the request
 *      timeout and system prompt of libs/llm/src/openai-llm.client.ts, an
 *      AbortSignal per call as our RetryPolicy gives it);
 *   3. the summary and its outbox row in one statement, one transaction:
 *      SummaryWriter.writeWithNotification's SQL (OutboxSql.insertAfter over
 *      INSERT ... ON CONFLICT (job_id) DO NOTHING RETURNING job_id, with its
 *      pg_notify), through a pg Pool of our worker's size (concurrency + 2).
 * Completed jobs are removed (removeOnComplete), so Redis does not grow.
 *
 * Env: REDIS_URL, DATABASE_URL, OPENAI_BASE_URL, OPENAI_MODEL, CONCURRENCY,
 * QUEUE. Prints `bullmq worker ready` on stderr once the worker is running.
 */
import { Worker } from 'bullmq';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import pg from 'pg';

const env = process.env;
const concurrency = Number(env.CONCURRENCY ?? 16);
const queueName = env.QUEUE ?? 'summaries-bullmq';
const model = env.OPENAI_MODEL ?? 'gpt-4.1-mini';
const callTimeoutMs = 20_000;

const SYSTEM_PROMPT =
  'Summarise the user text in a few sentences of plain prose. Keep names, numbers and dates exact. ' +
  'Do not add anything that is not in the text.';

// SummaryWriter.writeWithNotification, as OutboxSql.insertAfter(effect, 4) renders it.
const WRITE = `WITH effect AS (
       INSERT INTO summaries (job_id, tenant, summary)
         VALUES ($1, $2, $3)
         ON CONFLICT (job_id) DO NOTHING
         RETURNING job_id
     ), message AS (
       INSERT INTO outbox (topic, dedupe_key, payload)
       SELECT $4, $5, $6::jsonb FROM effect
       RETURNING id
     )
     SELECT pg_notify('outbox_new', id::text) FROM message`;

const pool = new pg.Pool({
  connectionString: env.DATABASE_URL,
  max: Math.min(concurrency + 2, 50),
  application_name: 'bullmq-peer',
});
const openai = new OpenAI({
  apiKey: 'bench',
  baseURL: env.OPENAI_BASE_URL,
  maxRetries: 0,
  timeout: callTimeoutMs + 1000,
  logLevel: 'warn',
});

/** libs/llm's sanitizeSummary. */
function sanitize(content) {
  const text = typeof content === 'string' ? content.replaceAll('\u0000', '').toWellFormed().trim() : '';
  if (text === '') throw new Error('empty answer');
  return text;
}

async function processJob(job) {
  const { jobId, tenant, payload } = job.data;
  const stored = await pool.query('SELECT 1 FROM summaries WHERE job_id = $1', [jobId]);
  if (stored.rowCount > 0) return 'duplicate';
  const completion = await openai.chat.completions.create(
    {
      model,
      messages: [
        { role: 'system', content: SYSTEM_PROMPT },
        { role: 'user', content: payload.text },
      ],
    },
    { signal: AbortSignal.timeout(callTimeoutMs) },
  );
  const summary = sanitize(completion.choices[0]?.message?.content);
  const written = await pool.query(WRITE, [
    jobId,
    tenant,
    summary,
    'email.summary_ready',
    `summary_ready:${jobId}`,
    JSON.stringify({ job_id: jobId, to: payload.notify }),
  ]);
  return written.rowCount === 1 ? 'done' : 'duplicate';
}

const connection = new Redis(env.REDIS_URL, { maxRetriesPerRequest: null });
const worker = new Worker(queueName, processJob, {
  connection,
  concurrency,
  removeOnComplete: { count: 0 },
  removeOnFail: { count: 10_000 },
});
let failed = 0;
worker.on('failed', (job, err) => {
  if (failed++ < 5) console.error(`job ${job?.id} failed: ${err.message}`);
});
worker.on('error', (err) => console.error(`worker error: ${err.message}`));
await worker.waitUntilReady();
console.error(`bullmq worker ready (queue ${queueName}, concurrency ${concurrency})`);

process.on('SIGTERM', async () => {
  await worker.close();
  await pool.end();
  connection.disconnect();
  process.exit(0);
});
