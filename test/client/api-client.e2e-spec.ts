import { ApiClient, createSummary, getSummary, idempotencyKey, type SummaryJob } from '@app/client';
import { IdempotencyProblemTypes } from '@app/idempotency';
import { JOBS_STREAM, jobIdFor } from '@app/summary-queue';
import type { Redis } from 'ioredis';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import { type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { freshRedis } from '../support/infra';
import { forward, sendForwarded } from '../support/forward';

/**
 * @app/client against the real api (in-process, on a loopback port), with a
 * small node:http server in front of it or in its place for the faults: a
 * response lost after the api answered, 503s, a server that never answers, a
 * 409 with Retry-After. Effects asserted: jobs in the stream, requests seen.
 */

interface Seen {
  readonly n: number;
  readonly method: string;
  readonly url: string;
  readonly key: string | undefined;
  readonly body: string;
}
/** What the front does with the n-th request (1-based). */
type Behaviour =
  | { readonly kind: 'forward' }
  /** Forwards, lets the api answer, then destroys the client's socket: the answer is lost. */
  | { readonly kind: 'forward-and-drop' }
  | {
      readonly kind: 'answer';
      readonly status: number;
      readonly headers?: Record<string, string>;
      readonly body?: unknown;
    }
  /** Never answers. */
  | { readonly kind: 'hang' };

interface Front {
  readonly url: string;
  readonly seen: Seen[];
  close(): Promise<void>;
}

async function startFront(behave: (n: number) => Behaviour, upstream?: string): Promise<Front> {
  const seen: Seen[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const n = seen.length + 1;
      const body = Buffer.concat(chunks).toString('utf8');
      const key = req.headers['idempotency-key'] as string | undefined;
      seen.push({ n, method: req.method ?? '', url: req.url ?? '', key, body });
      const b = behave(n);
      if (b.kind === 'hang') return;
      if (b.kind === 'answer') {
        const payload = b.body === undefined ? '' : JSON.stringify(b.body);
        res.writeHead(b.status, { 'content-type': 'application/json', ...b.headers });
        res.end(payload);
        return;
      }
      void (async () => {
        const answer = await forward(upstream!, req, body);
        if (b.kind === 'forward-and-drop') {
          // The api has answered (and stored its answer); the caller never hears it.
          req.socket.destroy();
          return;
        }
        sendForwarded(res, answer);
      })().catch((err: unknown) => {
        res.writeHead(599);
        res.end(String(err));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe('@app/client against the api', () => {
  let api: ApiHarness;
  let apiUrl: string;
  let redis: Redis;
  const fronts: Front[] = [];
  const front = async (behave: (n: number) => Behaviour, upstream = apiUrl) => {
    const f = await startFront(behave, upstream);
    fronts.push(f);
    return f;
  };
  const client = (baseUrl: string, over: Partial<ConstructorParameters<typeof ApiClient>[0]> = {}) =>
    new ApiClient({ baseUrl, apiKey: TENANT_A.key, backoff: { baseMs: 20, capMs: 200 }, ...over });
  /** A real sleep that records what the client asked for: its waits, read without a clock. */
  const recordingSleep = () => {
    const slept: number[] = [];
    const sleep = (ms: number, signal?: AbortSignal) => (slept.push(ms), delay(ms, undefined, { signal }));
    return { slept, sleep };
  };
  const summary = { text: 'The quick brown fox jumps over the lazy dog.', notify: 'ops@example.com' };
  const jobs = async () => (await redis.xrange(JOBS_STREAM, '-', '+')).length;
  const jobIdOf = (key: string) => jobIdFor(`${TENANT_A.tenant}:POST:/v1/summaries:${key}`);

  beforeAll(async () => {
    redis = await freshRedis();
    api = await startApi();
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await api.close();
    redis.disconnect();
  });
  beforeEach(() => redis.flushdb());
  afterEach(async () => {
    await Promise.all(fronts.splice(0).map((f) => f.close()));
  });

  it('createSummary twice with one key: one job, the second a replay of the first', async () => {
    // Non-ASCII facts: the key is hashed, and the api takes it.
    const key = idempotencyKey('summary', 'Bericht für Jürgen', 2024);
    const c = client(apiUrl);
    const first = await createSummary(c, summary, key);
    const second = await createSummary(c, summary, key);

    expect(first).toEqual({
      outcome: 'succeeded',
      status: 202,
      body: { job_id: jobIdOf(key), status: 'queued' },
      replayed: false,
      location: `/v1/summaries/${jobIdOf(key)}`,
      attempts: 1,
    });
    expect(second).toMatchObject({
      outcome: 'succeeded',
      status: 202,
      body: { job_id: jobIdOf(key) },
      replayed: true,
      attempts: 1,
    });
    expect(await jobs()).toBe(1);

    const status = await getSummary(c, jobIdOf(key));
    expect(status).toMatchObject({
      outcome: 'succeeded',
      status: 200,
      body: { job_id: jobIdOf(key), status: 'queued' },
    });
  });

  it('the answer is lost after the api answered: the retry, same key, is a replay; one job', async () => {
    // Timeline: attempt 1 reaches the api, which enqueues the job and stores
    // its answer; the front destroys the caller's socket (the answer is lost).
    // Attempt 2, same key, gets the stored answer. The handler ran once.
    const f = await front((n) => (n === 1 ? { kind: 'forward-and-drop' } : { kind: 'forward' }));
    const key = idempotencyKey('summary', 'doc-lost-answer', 1);
    const result = await createSummary(client(f.url), summary, key);

    expect(result).toMatchObject({
      outcome: 'succeeded',
      status: 202,
      replayed: true,
      attempts: 2,
      body: { job_id: jobIdOf(key) },
    });
    expect(f.seen.map((s) => s.key)).toEqual([key, key]);
    expect(f.seen[0].body).toBe(f.seen[1].body);
    expect(await jobs()).toBe(1);
  });

  it('503 twice, then the api: succeeded on the third attempt, one job, one key', async () => {
    const f = await front((n) =>
      n <= 2
        ? { kind: 'answer', status: 503, body: { type: 'about:blank', title: 'Unavailable' } }
        : { kind: 'forward' },
    );
    const key = idempotencyKey('summary', 'doc-503', 1);
    const result = await createSummary(client(f.url), summary, key);

    expect(result).toMatchObject({ outcome: 'succeeded', status: 202, replayed: false, attempts: 3 });
    expect(f.seen).toHaveLength(3);
    expect(new Set(f.seen.map((s) => s.key))).toEqual(new Set([key]));
    expect(await jobs()).toBe(1);
  });

  it('422 (the key reused with another body): rejected at once, no retry, nothing enqueued', async () => {
    const key = idempotencyKey('summary', 'doc-422', 1);
    expect(await createSummary(client(apiUrl), summary, key)).toMatchObject({ outcome: 'succeeded' });
    const f = await front(() => ({ kind: 'forward' }));
    const result = await createSummary(client(f.url), { ...summary, text: 'Another text entirely.' }, key);

    expect(result).toMatchObject({
      outcome: 'rejected',
      status: 422,
      attempts: 1,
      problem: { type: IdempotencyProblemTypes.keyReused, status: 422 },
    });
    expect(f.seen).toHaveLength(1);
    expect(await jobs()).toBe(1);
  });

  it('400 (invalid body), 401 (unknown api key) and 404 (no such job) are never retried', async () => {
    const f = await front(() => ({ kind: 'forward' }));
    const invalid = await createSummary(
      client(f.url),
      { ...summary, notify: 'not-an-email' },
      idempotencyKey('summary', 'doc-400', 1),
    );
    expect(invalid).toMatchObject({ outcome: 'rejected', status: 400, attempts: 1 });
    const unauthorised = await createSummary(
      client(f.url, { apiKey: 'nobody-0123456789' }),
      summary,
      idempotencyKey('summary', 'doc-401', 1),
    );
    expect(unauthorised).toMatchObject({ outcome: 'rejected', status: 401, attempts: 1 });
    const missing = await getSummary(client(f.url), '00000000-0000-5000-8000-000000000000');
    expect(missing).toMatchObject({ outcome: 'rejected', status: 404, attempts: 1 });

    expect(f.seen.map((s) => s.method)).toEqual(['POST', 'POST', 'GET']);
    expect(await jobs()).toBe(0);
  });

  it('a server that never answers: unknown (deadline), after several attempts each cut at its timeout', async () => {
    // How the deadline bounds attempts and backoffs is retry-decision.spec's, a table on numbers.
    const f = await front(() => ({ kind: 'hang' }), undefined);
    const key = idempotencyKey('summary', 'doc-hang', 1);
    const result = await createSummary(client(f.url, { deadlineMs: 1500, attemptTimeoutMs: 400 }), summary, key);

    expect(result).toMatchObject({ outcome: 'unknown', reason: 'deadline', lastError: { kind: 'timeout' } });
    if (result.outcome !== 'unknown') throw new Error('unreachable');
    expect(result.attempts).toBeGreaterThan(1);
    expect(f.seen).toHaveLength(result.attempts);
    expect(new Set(f.seen.map((s) => s.key))).toEqual(new Set([key]));
    expect(result.lastError).toMatchObject({ kind: 'timeout', afterMs: expect.any(Number) });
    expect((result.lastError as { afterMs: number }).afterMs).toBeLessThanOrEqual(400);
  });

  it("the caller's signal: unknown (aborted), at once", async () => {
    const f = await front(() => ({ kind: 'hang' }), undefined);
    // An hour for the attempt and the deadline: only the caller's signal can end this call within the test's time.
    const patient = client(f.url, { deadlineMs: 3_600_000, attemptTimeoutMs: 3_600_000 });
    const result = await createSummary(patient, summary, idempotencyKey('summary', 'doc-abort', 1), {
      signal: AbortSignal.timeout(300),
    });
    expect(result).toEqual({ outcome: 'unknown', reason: 'aborted', lastError: undefined, attempts: 1 });
  });

  it('409 with Retry-After: 1: the client waits the second the server asked for, then succeeds', async () => {
    const job: SummaryJob = { job_id: '9b2a4c1e-0000-5000-8000-000000000001', status: 'queued' };
    const f = await front(
      (n) =>
        n === 1
          ? {
              kind: 'answer',
              status: 409,
              headers: { 'retry-after': '1', 'content-type': 'application/problem+json' },
              body: { type: IdempotencyProblemTypes.inProgress, status: 409 },
            }
          : { kind: 'answer', status: 202, body: job },
      undefined,
    );
    const { slept, sleep } = recordingSleep();
    // random 0: the jitter alone would not wait at all.
    const result = await createSummary(
      client(f.url, { random: () => 0, sleep }),
      summary,
      idempotencyKey('summary', 'doc-409', 1),
    );

    expect(result).toMatchObject({ outcome: 'succeeded', status: 202, body: job, attempts: 2 });
    expect(f.seen).toHaveLength(2);
    expect(slept).toEqual([1000]);
  });

  it('a Retry-After longer than the deadline allows is cut to the deadline: unknown, not a late answer', async () => {
    const f = await front(
      () => ({
        kind: 'answer',
        status: 409,
        headers: { 'retry-after': '30' },
        body: { type: IdempotencyProblemTypes.inProgress },
      }),
      undefined,
    );
    const { slept, sleep } = recordingSleep();
    const result = await createSummary(
      client(f.url, { deadlineMs: 1000, sleep }),
      summary,
      idempotencyKey('summary', 'doc-409-long', 1),
    );

    expect(result).toMatchObject({
      outcome: 'unknown',
      reason: 'deadline',
      lastError: { kind: 'status', status: 409, retryAfterMs: 30_000 },
    });
    expect(f.seen).toHaveLength(2); // one attempt, then a last one just before the deadline
    // The 30 s asked for was cut to what the deadline left, not waited.
    expect(slept).toHaveLength(1);
    expect(slept[0]).toBeLessThan(1000);
  });

  it('5xx on every attempt: unknown (attempts) after maxAttempts, never "failed"', async () => {
    const f = await front(
      () => ({ kind: 'answer', status: 503, body: { type: 'about:blank', status: 503 } }),
      undefined,
    );
    const result = await createSummary(
      client(f.url, { maxAttempts: 3 }),
      summary,
      idempotencyKey('summary', 'doc-5xx', 1),
    );
    expect(result).toMatchObject({
      outcome: 'unknown',
      reason: 'attempts',
      attempts: 3,
      lastError: { kind: 'status', status: 503 },
    });
    expect(f.seen).toHaveLength(3);
  });

  it('a connection refused is retried until the deadline: unknown, with the network error', async () => {
    const f = await front(() => ({ kind: 'forward' }));
    const url = f.url;
    await f.close();
    fronts.splice(fronts.indexOf(f), 1);
    const result = await createSummary(
      client(url, { deadlineMs: 500, maxAttempts: 1000 }),
      summary,
      idempotencyKey('summary', 'doc-refused', 1),
    );
    expect(result).toMatchObject({ outcome: 'unknown', reason: 'deadline', lastError: { kind: 'network' } });
    if (result.outcome !== 'unknown') throw new Error('unreachable');
    expect(result.attempts).toBeGreaterThan(1);
  });
});
