import { classifyLlmError, OpenAiLlmClient } from '@app/llm';
import { DeadlineExceededError, NonRetryableError, RetryError } from '../../libs/workflows/src/retry/retry.errors';
import { RetryPolicy } from '../../libs/workflows/src/retry/retry-policy.service';
import { monotonicClock, realSleep, type RetryPolicyOptions } from '../../libs/workflows/src/retry/retry-policy.tokens';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import { eventually } from '../support/infra';

/** The worker's model client over HTTP to a local server, under RetryPolicy. */
describe('model calls through OpenAiLlmClient and RetryPolicy', () => {
  let server: FakeOpenAiServer;
  /** Every backoff the policy slept, in ms, in order. */
  const slept: number[] = [];

  beforeAll(async () => {
    server = await new FakeOpenAiServer().start();
  });
  afterAll(() => server.stop());
  beforeEach(() => {
    server.requests.length = 0;
    slept.length = 0;
  });

  const call = (options: Partial<RetryPolicyOptions> = {}, budgetMs = 10_000, sdkTimeoutMs?: number) => {
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
      requestTimeoutMs: sdkTimeoutMs ?? policyOptions.callTimeoutMs + 1000,
    });
    const policy = new RetryPolicy(
      policyOptions,
      monotonicClock,
      (ms, signal) => (slept.push(ms), realSleep(ms, signal)),
      Math.random,
    );
    return policy.run((signal) => llm.summarize('Some text to summarise.', { signal }), classifyLlmError, {
      deadline: performance.now() + budgetMs,
    });
  };

  it('a 429 is retried and succeeds on the second request', async () => {
    server.reply = (n) => (n === 1 ? { kind: 'error', status: 429 } : { kind: 'complete', content: 'Got it.' });
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
    server.reply = (n) =>
      n === 1
        ? { kind: 'error', status: 429, headers: { 'retry-after': '1' } }
        : { kind: 'complete', content: 'Later.' };
    await expect(call()).resolves.toMatchObject({ attempts: 2 });
    expect(server.calls).toBe(2);
    expect(slept).toEqual([1000]);
  });

  it('honours retry-after-ms', async () => {
    server.reply = (n) =>
      n === 1
        ? { kind: 'error', status: 503, headers: { 'retry-after-ms': '300' } }
        : { kind: 'complete', content: 'Later.' };
    await expect(call()).resolves.toMatchObject({ attempts: 2 });
    expect(server.calls).toBe(2);
    expect(slept).toEqual([300]);
  });

  it('a model that always hangs: 0.2 s per call, 0.5 s deadline, fails after at most three calls', async () => {
    // The deadline shows in the calls: four attempts are allowed, and only
    // the deadline stops the fourth (that the last call is cut at the
    // deadline is retry-policy.service.spec's, on fake timers).
    server.reply = () => ({ kind: 'hang' });
    const err = await call({ callTimeoutMs: 200, minUsefulAttemptMs: 200 }, 500).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetryError);
    expect((err as RetryError).transient).toBe(true);
    expect((err as RetryError).last?.kind).toBe('timeout');
    expect(server.calls).toBeGreaterThanOrEqual(1);
    expect(server.calls).toBeLessThanOrEqual(3);
    // the HTTP requests were really aborted, not left running
    await eventually(() => (server.requests.every((r) => r.closedEarly) ? true : undefined), 5000, 'every call closed');
  });

  it('a server that drips a byte at a time is cut off by the wall-clock limit', async () => {
    server.reply = () => ({ kind: 'drip', everyMs: 50 });
    // The drip never ends and the SDK's timeout is ten minutes: only the policy's 300 ms limit can end the call.
    const err = await call({ callTimeoutMs: 300, maxAttempts: 1 }, 10_000, 600_000).catch((e: unknown) => e);
    expect((err as RetryError).last?.kind).toBe('timeout');
    expect((err as RetryError).transient).toBe(true);
    await eventually(() => (server.requests[0].closedEarly ? true : undefined), 5000, 'the call closed');
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
