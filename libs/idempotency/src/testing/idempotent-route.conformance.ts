import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import request from 'supertest';

/** One held run of the route's handler. */
export interface RouteHold {
  /**
   * Settles when a run has reached the hold (the first request has claimed
   * its key and is inside the handler). Without it the duplicate could
   * arrive first and the case would test the race, not the rule.
   */
  readonly reached: Promise<void>;
  release(): void;
}

/** A decorated route as the conformance cases drive it. */
export interface RouteUnderTest {
  /** A supertest target: the app's http.Server, or a base URL. */
  readonly server: Server | string;
  readonly method: 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  readonly path: string;
  /** Sent with every request (auth etc.). */
  readonly headers: Readonly<Record<string, string>>;
  /** A valid body. */
  readonly body: unknown;
  /** Valid too, but a different request. */
  readonly otherBody: unknown;
  /** A body the route refuses with 400, if it validates; the validation case is skipped without one. */
  readonly invalidBody?: unknown;
  readonly successStatus: number;
  /** Holds the next run of the handler until release() (a slow fake provider, a gate around a real dependency). */
  hold(): RouteHold;
  /** How many times the handler's effect happened (jobs enqueued, upstream calls): the cases assert "at most once". */
  effects(): Promise<number>;
  /** How the route's errors look: problem+json with a `type`, or OpenAI's `{"error": {"code"}}`. */
  readonly errors: 'problem' | 'openai';
  teardown(): Promise<void>;
}

export interface IdempotentRouteOptions {
  /**
   * What a duplicate gets while the first request runs: 409 with Retry-After
   * ('conflict', the default), or the first's own answer, replayed
   * ('attached', a route with `@Idempotent({ attach })`).
   */
  readonly whileRunning?: 'conflict' | 'attached';
  /** Whether the route refuses a request without a key (`@Idempotent({ required })`). Default true. */
  readonly keyRequired?: boolean;
  /** How long a case waits for the held handler to be reached. Default 5000 ms. */
  readonly reachTimeoutMs?: number;
}

interface Answer {
  readonly status: number;
  readonly headers: Readonly<Record<string, string | undefined>>;
  readonly text: string;
}

/** The idempotency layer's error cases, by the last segment of their problem type. */
type IdempotencyCase =
  'idempotency-key-missing' | 'idempotency-key-invalid' | 'idempotency-request-in-progress' | 'idempotency-key-reused';

/** The same value with every object's keys in the reverse order: one request, other bytes. */
function reordered(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reordered);
  if (typeof value !== 'object' || value === null) return value;
  return Object.fromEntries(
    Object.entries(value as Record<string, unknown>)
      .reverse()
      .map(([k, v]) => [k, reordered(v)]),
  );
}

const isObject = (value: unknown): boolean => typeof value === 'object' && value !== null && !Array.isArray(value);

function parsed(answer: Answer): Record<string, unknown> {
  try {
    return JSON.parse(answer.text) as Record<string, unknown>;
  } catch {
    throw new Error(`expected a JSON error body, got ${answer.status} ${JSON.stringify(answer.text.slice(0, 200))}`);
  }
}

async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The standard cases for a route decorated with `@Idempotent()`, run against
 * the real app: replay, a duplicate while the first runs, another body under
 * a used key, a missing or malformed key, and nothing kept for a request that
 * failed validation, each asserting the handler's effects and the route's
 * error format. Each case uses fresh keys.
 *
 *   describeIdempotentRoute('POST /v1/things', async () => ({ server, method: 'POST', ... }));
 */
export function describeIdempotentRoute(
  name: string,
  setup: () => Promise<RouteUnderTest>,
  options: IdempotentRouteOptions = {},
): void {
  const whileRunning = options.whileRunning ?? 'conflict';
  const keyRequired = options.keyRequired ?? true;
  const reachTimeoutMs = options.reachTimeoutMs ?? 5000;

  describe(`@Idempotent() conformance: ${name}`, () => {
    let route: RouteUnderTest;
    const newKey = () => `conformance-${randomUUID()}`;

    beforeAll(async () => {
      route = await setup();
    });
    afterAll(() => route?.teardown());

    async function send(key: string | undefined, body: unknown): Promise<Answer> {
      const method = route.method.toLowerCase() as 'post' | 'put' | 'patch' | 'delete';
      let req = request(route.server)[method](route.path).set(route.headers).set('content-type', 'application/json');
      if (key !== undefined) req = req.set('idempotency-key', key);
      // Serialised here: the bytes sent are the ones the case means (key order included).
      const res = await req
        .send(JSON.stringify(body))
        .buffer(true)
        .parse((r, done) => {
          let text = '';
          r.setEncoding('utf8');
          r.on('data', (chunk: string) => (text += chunk));
          r.on('end', () => done(null, text));
        });
      return { status: res.status, headers: res.headers, text: res.body as string };
    }

    /** The error answer of `which`, in the route's format. */
    function expectIdempotencyError(answer: Answer, status: number, which: IdempotencyCase): void {
      expect({ status: answer.status, text: answer.text }).toEqual({ status, text: expect.any(String) });
      const body = parsed(answer);
      if (route.errors === 'problem') {
        expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(body).toMatchObject({ type: expect.stringMatching(new RegExp(`${which}$`)), status });
      } else {
        expect(answer.headers['content-type']).toMatch(/^application\/json/);
        expect(body).toMatchObject({
          error: { code: which.replace(/-/g, '_'), message: expect.any(String), type: expect.any(String) },
        });
      }
    }

    /** A validation error in the route's format, and not one of the idempotency layer's. */
    function expectValidationError(answer: Answer): void {
      expect(answer.status).toBe(400);
      const body = parsed(answer);
      if (route.errors === 'problem') {
        expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(body).toMatchObject({ type: expect.any(String), status: 400 });
        expect(body.type).not.toMatch(/idempotency-/);
      } else {
        expect(answer.headers['content-type']).toMatch(/^application\/json/);
        expect(body).toMatchObject({ error: { code: expect.any(String), message: expect.any(String) } });
        expect((body.error as { code: string }).code).not.toMatch(/^idempotency_/);
      }
    }

    function expectFirstRun(answer: Answer): void {
      expect({ status: answer.status, replayed: answer.headers['idempotent-replayed'] }).toEqual({
        status: route.successStatus,
        replayed: undefined,
      });
    }

    function expectReplayOf(answer: Answer, first: Answer): void {
      expect({
        status: answer.status,
        replayed: answer.headers['idempotent-replayed'],
        contentType: answer.headers['content-type'],
        text: answer.text,
      }).toEqual({
        status: first.status,
        replayed: 'true',
        contentType: first.headers['content-type'],
        text: first.text,
      });
    }

    it('replays the answer to the same key and body (keys in another order): same status and body, Idempotent-Replayed, one effect', async () => {
      const key = newKey();
      const before = await route.effects();
      const first = await send(key, route.body);
      expectFirstRun(first);
      expect(await route.effects()).toBe(before + 1);
      const replay = await send(key, isObject(route.body) ? reordered(route.body) : route.body);
      expectReplayOf(replay, first);
      expect(await route.effects()).toBe(before + 1);
    });

    if (whileRunning === 'conflict') {
      it('answers a duplicate while the first runs 409 with Retry-After ≥ 1, then replays the first’s answer; one effect', async () => {
        const key = newKey();
        const before = await route.effects();
        const held = route.hold();
        let first: Promise<Answer> | undefined;
        try {
          first = send(key, route.body);
          await within(held.reached, reachTimeoutMs, 'the first request reaching the handler');
          const duplicate = await within(
            send(key, route.body),
            reachTimeoutMs,
            'an answer to the duplicate while the first is held (a route that attaches duplicates wants whileRunning: attached)',
          );
          expectIdempotencyError(duplicate, 409, 'idempotency-request-in-progress');
          expect(duplicate.headers['retry-after']).toMatch(/^\d+$/);
          expect(Number(duplicate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
        } finally {
          held.release();
        }
        const answered = await first;
        expectFirstRun(answered);
        expectReplayOf(await send(key, route.body), answered);
        expect(await route.effects()).toBe(before + 1);
      });
    } else {
      it('gives a duplicate that arrives while the first runs the first’s answer, replayed; one effect', async () => {
        const key = newKey();
        const before = await route.effects();
        const held = route.hold();
        let first: Promise<Answer> | undefined;
        let duplicate: Promise<Answer> | undefined;
        try {
          first = send(key, route.body);
          await within(held.reached, reachTimeoutMs, 'the first request reaching the handler');
          let settled = false;
          duplicate = send(key, route.body).finally(() => (settled = true));
          // Still waiting while the first is held: attached, not answered on its own.
          await new Promise((r) => setTimeout(r, 200));
          expect(settled).toBe(false);
        } finally {
          held.release();
        }
        const [answered, attached] = await within(
          Promise.all([first, duplicate]),
          reachTimeoutMs,
          'both answers after the release',
        );
        expectFirstRun(answered);
        expectReplayOf(attached, answered);
        expect(await route.effects()).toBe(before + 1);
      });
    }

    it('answers the key with another body 422 and keeps the first answer for the first body; no effect', async () => {
      const key = newKey();
      const first = await send(key, route.body);
      expectFirstRun(first);
      const after = await route.effects();
      expectIdempotencyError(await send(key, route.otherBody), 422, 'idempotency-key-reused');
      expect(await route.effects()).toBe(after);
      expectReplayOf(await send(key, route.body), first);
      expect(await route.effects()).toBe(after);
    });

    if (keyRequired) {
      it('answers a request without a key 400; no effect', async () => {
        const before = await route.effects();
        expectIdempotencyError(await send(undefined, route.body), 400, 'idempotency-key-missing');
        expect(await route.effects()).toBe(before);
      });
    } else {
      it('runs a request without a key every time, never as a replay', async () => {
        const before = await route.effects();
        expectFirstRun(await send(undefined, route.body));
        expectFirstRun(await send(undefined, route.body));
        expect(await route.effects()).toBe(before + 2);
      });
    }

    it.each([
      ['that is too short', 'short'],
      ['with a space inside', 'conformance key with spaces'],
      ['that is too long', 'k'.repeat(129)],
    ])('answers a key %s 400; no effect', async (_, key) => {
      const before = await route.effects();
      expectIdempotencyError(await send(key, route.body), 400, 'idempotency-key-invalid');
      expect(await route.effects()).toBe(before);
    });

    // Whether the route validates is known only after setup, so this case is always
    // listed; without invalidBody it has nothing to check.
    it('keeps nothing for a body that fails validation: the same key then runs the valid body for real', async () => {
      if (route.invalidBody === undefined) return; // the route does not validate: nothing to keep or not
      const key = newKey();
      const before = await route.effects();
      expectValidationError(await send(key, route.invalidBody));
      expect(await route.effects()).toBe(before);
      const corrected = await send(key, route.body);
      expectFirstRun(corrected);
      expect(await route.effects()).toBe(before + 1);
    });
  });
}
