/*
 * Fills the BullMQ queue with N jobs before its worker starts (Queue.addBulk,
 * in chunks), each the job our api enqueues: { jobId, tenant, payload: { text,
 * notify } }, under its job id. Args: N, text, notify prefix. Env: REDIS_URL, QUEUE.
 * Prints `filled <N>` on stdout.
 */
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';

const [n = '1000', text = 'Bench me.', notify = 'bench'] = process.argv.slice(2);
const connection = new Redis(process.env.REDIS_URL, { maxRetriesPerRequest: null });
const queue = new Queue(process.env.QUEUE ?? 'summaries-bullmq', { connection });
const total = Number(n);
const CHUNK = 500;
for (let i = 0; i < total; i += CHUNK) {
  const jobs = [];
  for (let j = i; j < Math.min(total, i + CHUNK); j++) {
    const jobId = randomUUID();
    jobs.push({
      name: 'summary',
      data: { jobId, tenant: 'bench', payload: { text, notify: `${notify}-${j}@example.com` } },
      opts: { jobId },
    });
  }
  await queue.addBulk(jobs);
}
console.log(`filled ${total}`);
await queue.close();
connection.disconnect();
