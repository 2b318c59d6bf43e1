import { ApiClient, getRefund, issueRefund, refundKey, type RefundRequest } from '@app/client';
import { IdempotencyProblemTypes } from '@app/idempotency';
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { DataSource } from 'typeorm';
import { refundIdFor } from '../../apps/api/src/refunds/refunds.service';
import { type ApiHarness, startApi, TENANT_A } from '../support/api-harness';
import { FakePaymentsServer } from '../support/fake-payments-server';
import { eventually } from '../support/infra';
import {
  attemptRows,
  keyRecord,
  lookupsFor,
  paidAnswer,
  paidRow,
  payoutPostsFor,
  refundOperation,
  refundRows,
} from '../support/refunds';
import { forward, sendForwarded } from '../support/forward';

/**
 * `issueRefund` from @app/client against the real api (in-process, on a
 * loopback port, paying through a FakePaymentsServer), with an HTTP proxy
 * in front of it that loses answers: it forwards the request, waits until
 * the api has answered (so the refund is paid and recorded), then destroys
 * the caller's socket without passing the answer on, or cuts it halfway.
 * The guarantee: one payout and one `refunds` row whatever the client saw;
 * the client reports a replay when a retry gets the stored answer, and
 * `unknown` (never failed, never rejected) when its deadline passes first.
 */

interface Seen {
  readonly n: number;
  readonly method: string;
  readonly url: string;
  readonly key: string | undefined;
  readonly body: string;
  /** What the api answered this request (the caller may never have seen it); set once it arrived. */
  upstream?: { readonly status: number; readonly replayed: boolean; readonly body: string };
}

type Behaviour =
  | { readonly kind: 'forward' }
  /**
   * Forwards, waits for the api's whole answer, then destroys the caller's socket: nothing of the answer reaches
   * it.
   */
  | { readonly kind: 'forward-and-drop' }
  /** Forwards, then sends the api's status line, headers and half the body, and destroys the socket. */
  | { readonly kind: 'forward-and-cut' };

interface Proxy {
  readonly url: string;
  readonly seen: Seen[];
  posts(): Seen[];
  close(): Promise<void>;
}

const isRefundPost = (s: Seen): boolean => s.method === 'POST' && s.url === '/v1/refunds';

async function startProxy(upstream: string, behave: (seen: Seen) => Behaviour): Promise<Proxy> {
  const seen: Seen[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    res.on('error', () => undefined);
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const entry: Seen = {
        n: seen.length + 1,
        method: req.method ?? '',
        url: req.url ?? '',
        key: req.headers['idempotency-key'] as string | undefined,
        body,
      };
      seen.push(entry);
      const behaviour = behave(entry);
      void (async () => {
        const answer = await forward(upstream, req, body);
        entry.upstream = {
          status: answer.status,
          replayed: answer.headers['idempotent-replayed'] === 'true',
          body: answer.body.toString('utf8'),
        };
        if (behaviour.kind === 'forward-and-drop') {
          req.socket.destroy();
          return;
        }
        if (behaviour.kind === 'forward-and-cut') {
          res.writeHead(answer.status, { ...answer.headers, 'content-length': String(answer.body.length) });
          res.write(answer.body.subarray(0, Math.floor(answer.body.length / 2)), () =>
            setTimeout(() => req.socket.destroy(), 20),
          );
          return;
        }
        sendForwarded(res, answer);
      })().catch((err: unknown) => {
        if (!res.headersSent) res.writeHead(599).end(String(err));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    posts: () => seen.filter(isRefundPost),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe('issueRefund through a proxy that loses the answers', () => {
  let fake: FakePaymentsServer;
  let api: ApiHarness;
  let apiUrl: string;
  let ds: DataSource;
  const proxies: Proxy[] = [];
  const proxy = async (behave: (seen: Seen) => Behaviour) => {
    const p = await startProxy(apiUrl, behave);
    proxies.push(p);
    return p;
  };
  const client = (baseUrl: string, over: Partial<ConstructorParameters<typeof ApiClient>[0]> = {}) =>
    new ApiClient({ baseUrl, apiKey: TENANT_A.key, backoff: { baseMs: 20, capMs: 200 }, ...over });
  const newRefund = (): RefundRequest => {
    const tag = randomUUID().slice(0, 8);
    return { ticket_id: `T-${tag}`, order_id: `ord-${tag}`, amount: 1250, currency: 'EUR' };
  };
  const operationOf = (r: RefundRequest) => refundOperation(TENANT_A.tenant, refundKey(r));
  const refundIdOf = (r: RefundRequest) => refundIdFor(operationOf(r));
  /** A proxy that loses (`kind`) the answer to the first POST /v1/refunds, and forwards everything else. */
  const proxyLosingFirstAnswer = (kind: 'forward-and-drop' | 'forward-and-cut') => {
    let refundPosts = 0;
    return proxy((s) => (isRefundPost(s) && ++refundPosts === 1 ? { kind } : { kind: 'forward' }));
  };

  /**
   * One payout (one paying POST) at the provider, one row carrying it, the key completed with that answer, no send
   * mark left.
   */
  const expectPaidOnce = async (r: RefundRequest) => {
    const refundId = refundIdOf(r);
    const payouts = fake.payoutsFor(refundId);
    expect(payouts).toHaveLength(1);
    expect(payouts[0]).toMatchObject({
      reference: refundId,
      order_id: r.order_id,
      amount: r.amount,
      currency: r.currency,
      idempotencyKey: refundId,
    });
    expect(payoutPostsFor(fake, refundId)).toHaveLength(1);
    expect(await refundRows(ds, refundId)).toEqual([paidRow(refundId, TENANT_A.tenant, r, payouts[0].payout_id)]);
    const expected = paidAnswer(refundId, r, payouts[0].payout_id);
    const record = await keyRecord(ds, operationOf(r));
    expect(record).toMatchObject({ state: 'completed', status: 201 });
    expect(JSON.parse(record!.body!)).toEqual(expected);
    expect(await attemptRows(ds, refundId)).toEqual([]);
    return expected;
  };

  beforeAll(async () => {
    fake = await new FakePaymentsServer().start();
    api = await startApi({ env: { PAYMENTS_URL: fake.url(), PAYMENTS_TIMEOUT_S: '1' } });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    ds = api.app.get(DataSource);
  });
  afterEach(async () => {
    await Promise.all(proxies.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await api?.close();
    await fake?.stop();
  });

  it('the first answer is lost after the api paid and recorded: the retry (same key) is a replay; one payout, one row, two POSTs', async () => {
    // Attempt 1 reaches the api, which pays and commits the row with its
    // answer; the proxy destroys the caller's socket. Attempt 2, same key,
    // gets the stored answer. The handler ran once.
    const p = await proxyLosingFirstAnswer('forward-and-drop');
    const r = newRefund();
    const result = await issueRefund(client(p.url), r);

    const expected = await expectPaidOnce(r);
    expect(result).toEqual({
      outcome: 'succeeded',
      status: 201,
      body: expected,
      replayed: true,
      location: `/v1/refunds/${expected.refund_id}`,
      attempts: 2,
    });
    const posts = p.posts();
    expect(posts).toHaveLength(2);
    expect(posts.map((s) => s.key)).toEqual([refundKey(r), refundKey(r)]);
    expect(posts[1].body).toBe(posts[0].body);
    // What the caller never saw: the api's first answer, the refund itself, not a replay.
    expect(posts[0].upstream).toMatchObject({ status: 201, replayed: false });
    expect(JSON.parse(posts[0].upstream!.body)).toEqual(expected);
    expect(posts[1].upstream).toMatchObject({ status: 201, replayed: true });
  });

  it('the first answer is cut halfway through its body: a lost answer too; the retry is a replay, one payout', async () => {
    const p = await proxyLosingFirstAnswer('forward-and-cut');
    const r = newRefund();
    const result = await issueRefund(client(p.url), r);

    const expected = await expectPaidOnce(r);
    expect(result).toMatchObject({ outcome: 'succeeded', status: 201, body: expected, replayed: true, attempts: 2 });
    expect(p.posts()).toHaveLength(2);
  });

  it('every answer is lost until the deadline passes: unknown (never failed or rejected); one payout, one row; a later GET and retry on a healthy path show the refund', async () => {
    const p = await proxy((s) => (isRefundPost(s) ? { kind: 'forward-and-drop' } : { kind: 'forward' }));
    const r = newRefund();
    const result = await issueRefund(client(p.url, { deadlineMs: 1500, attemptTimeoutMs: 1000, maxAttempts: 1000 }), r);

    expect(result.outcome).toBe('unknown');
    if (result.outcome !== 'unknown') throw new Error('unreachable');
    expect(result.reason).toBe('deadline');
    expect(result.attempts).toBeGreaterThanOrEqual(2);
    expect(['network', 'timeout']).toContain(result.lastError?.kind);

    // Every attempt reached the api (an attempt cut by the deadline included): wait for its answers.
    const posts = p.posts();
    expect(posts.length).toBeGreaterThanOrEqual(result.attempts);
    await eventually(
      () => (posts.every((s) => s.upstream !== undefined) ? true : undefined),
      5000,
      "the api's answers to every attempt",
    );
    expect(new Set(posts.map((s) => s.key))).toEqual(new Set([refundKey(r)]));
    // The api paid once and answered every later attempt from the stored answer.
    expect(posts[0].upstream).toMatchObject({ status: 201, replayed: false });
    for (const s of posts.slice(1)) expect(s.upstream).toMatchObject({ status: 201, replayed: true });
    const expected = await expectPaidOnce(r);

    // The caller looks it up on a healthy path: it is there, with the one payout.
    const healthy = client(apiUrl);
    const found = await getRefund(healthy, expected.refund_id);
    expect(found).toMatchObject({
      outcome: 'succeeded',
      status: 200,
      body: { ...expected, created_at: expect.any(String) },
    });
    // Or retries the same request: a replay, nothing paid again.
    const again = await issueRefund(healthy, r);
    expect(again).toMatchObject({ outcome: 'succeeded', status: 201, body: expected, replayed: true, attempts: 1 });
    await expectPaidOnce(r);
  });

  it('the api answers 503 outcome-unknown (the payout paid, its answer and the lookup lost): the client retries the same key and gets the refund, found by lookup; one payout', async () => {
    // The provider pays and drops the connection; the api's immediate lookup
    // fails: 503 outcome-unknown, the key abandoned. The client's retry takes
    // it over; the recovery's lookup finds the payout and records it.
    fake.nextPayouts({ kind: 'pay-then-drop' }).nextLookups({ kind: 'fail' });
    const p = await proxy(() => ({ kind: 'forward' }));
    const r = newRefund();
    const result = await issueRefund(client(p.url), r);

    const expected = await expectPaidOnce(r);
    expect(result).toMatchObject({ outcome: 'succeeded', status: 201, body: expected, attempts: 2 });
    const posts = p.posts();
    expect(posts).toHaveLength(2);
    expect(posts[0].upstream).toMatchObject({ status: 503 });
    expect(JSON.parse(posts[0].upstream!.body)).toMatchObject({ type: IdempotencyProblemTypes.outcomeUnknown });
    expect(lookupsFor(fake, expected.refund_id)).toHaveLength(2);
  });
});
