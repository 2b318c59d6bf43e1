import { classifyLlmError, OpenAiLlmClient } from '@app/llm';
import { DeadlineExceededError, NonRetryableError, RetryError } from '../../apps/worker/src/retry/retry.errors';
import { RetryPolicy } from '../../apps/worker/src/retry/retry-policy.service';
import { monotonicClock, realSleep, type RetryPolicyOptions } from '../../apps/worker/src/retry/retry-policy.tokens';
import { FakeOpenAiServer } from '../support/fake-openai-server';

/** The real `openai` SDK over HTTP to a local server, under RetryPolicy. */
describe('model calls through the openai SDK and RetryPolicy', () => {
  let server: FakeOpenAiServer;
  const arrivals: number[] = [];

  beforeAll(async () => {
    server = await new FakeOpenAiServer().start();
  });
  afterAll(() => server.stop());
  beforeEach(() => {
    server.requests.length = 0;
    arrivals.length = 0;
  });

  const call = (options: Partial<RetryPolicyOptions> = {}, budgetMs = 10_000) => {
    const policyOptions: RetryPolicyOptions = {
      maxAttempts: 4,
      callTimeoutMs: 5000,
      baseDelayMs: 20,
      maxDelayMs: 100,
      maxRetryAfterMs: 5000,
      minUsefulAttemptMs: 100,
      ...options,
    };
    const llm = new OpenAiLlmClient({
      apiKey: 'test',
      baseUrl: server.baseUrl,
      model: 'gpt-4.1-mini',
      requestTimeoutMs: policyOptions.callTimeoutMs + 1000,
    });
    const policy = new RetryPolicy(policyOptions, monotonicClock, realSleep, Math.random);
    return policy.run((signal) => llm.summarize('Some text to summarise.', { signal }), classifyLlmError, {
      deadline: performance.now() + budgetMs,
    });
  };
  const recordArrival = () => arrivals.push(performance.now());

  it('a 429 is retried and succeeds on the second request', async () => {
    server.reply = (n) => (
      recordArrival(),
      n === 1 ? { kind: 'error', status: 429 } : { kind: 'complete', content: 'Got it.' }
    );
    await expect(call()).resolves.toEqual({ value: 'Got it.', attempts: 2 });
    expect(server.calls).toBe(2);
  });

  it('a 400 is permanent: the server sees exactly one request', async () => {
    server.reply = () => ({ kind: 'error', status: 400 });
    const err = await call().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NonRetryableError);
    expect(err).toMatchObject({ transient: false, last: { kind: 'client', status: 400 } });
    expect(server.calls).toBe(1);
  });

  it('honours Retry-After: the second request waits for it', async () => {
    server.reply = (n) => (
      recordArrival(),
      n === 1
        ? { kind: 'error', status: 429, headers: { 'retry-after': '1' } }
        : { kind: 'complete', content: 'Later.' }
    );
    await expect(call()).resolves.toMatchObject({ attempts: 2 });
    expect(arrivals[1] - arrivals[0]).toBeGreaterThanOrEqual(990);
  });

  it('honours retry-after-ms', async () => {
    server.reply = (n) => (
      recordArrival(),
      n === 1
        ? { kind: 'error', status: 503, headers: { 'retry-after-ms': '300' } }
        : { kind: 'complete', content: 'Later.' }
    );
    await expect(call()).resolves.toMatchObject({ attempts: 2 });
    expect(arrivals[1] - arrivals[0]).toBeGreaterThanOrEqual(290);
  });

  it('a model that always hangs: 0.2 s per call, 0.5 s deadline, fails in under 0.6 s after at most three calls', async () => {
    server.reply = () => ({ kind: 'hang' });
    const t0 = performance.now();
    const err = await call({ callTimeoutMs: 200, minUsefulAttemptMs: 200 }, 500).catch((e: unknown) => e);
    const elapsed = performance.now() - t0;
    expect(err).toBeInstanceOf(RetryError);
    expect((err as RetryError).transient).toBe(true);
    expect((err as RetryError).last?.kind).toBe('timeout');
    expect(elapsed).toBeLessThan(600);
    expect(server.calls).toBeGreaterThanOrEqual(1);
    expect(server.calls).toBeLessThanOrEqual(3);
    // the HTTP requests were really aborted, not left running
    await new Promise((r) => setTimeout(r, 50));
    expect(server.requests.every((r) => r.closedEarly)).toBe(true);
  });

  it('a server that drips a byte at a time is cut off by the wall-clock limit', async () => {
    server.reply = () => ({ kind: 'drip', everyMs: 50 });
    const t0 = performance.now();
    const err = await call({ callTimeoutMs: 300, maxAttempts: 1 }, 10_000).catch((e: unknown) => e);
    expect(performance.now() - t0).toBeLessThan(1500);
    expect((err as RetryError).last?.kind).toBe('timeout');
    expect((err as RetryError).transient).toBe(true);
    await new Promise((r) => setTimeout(r, 50));
    expect(server.requests[0].closedEarly).toBe(true);
  });

  it('a deadline that runs out is its own error, transient for the queue', async () => {
    server.reply = () => ({ kind: 'error', status: 503, headers: { 'retry-after': '5' } });
    const err = await call({}, 2000).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect(err).toMatchObject({ transient: true, attempts: 1 });
    expect(server.calls).toBe(1);
  });

  it('an empty answer is permanent', async () => {
    server.reply = () => ({ kind: 'complete', content: null });
    const err = await call().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NonRetryableError);
    expect(server.calls).toBe(1);
  });
});
