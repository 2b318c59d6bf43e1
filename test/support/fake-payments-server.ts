import { randomBytes } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/** One payout the fake provider made: money that left. Two with one reference are a double payment. */
export interface FakePayout {
  readonly payout_id: string;
  readonly reference: string;
  readonly order_id: string;
  readonly amount: number;
  readonly currency: string;
  /** The request's `Idempotency-Key` header as it came (the fake does not act on it). */
  readonly idempotencyKey: string | undefined;
  /** ISO 8601, when the payout was registered. */
  readonly created_at: string;
}

/** One request as the fake provider received it, body read whole. */
export interface FakeRequest {
  /** 1 for the first request the server saw, and so on. */
  readonly n: number;
  readonly method: string;
  /** The path with its query, as sent (`/payouts?reference=...`). */
  readonly path: string;
  /** Names in lower case. */
  readonly headers: IncomingHttpHeaders;
  /** The body parsed as JSON; undefined when empty or not JSON. */
  readonly body: unknown;
  /** The body's text as it came. */
  readonly rawBody: string;
}

/** What the fake does with one `POST /payouts` (a well-formed one: a malformed one is a 400 and takes no behaviour). */
export type PayoutBehaviour =
  /** Registers the payout on arrival, answers 201 after `delayMs` (written even when the client has gone). */
  | { readonly kind: 'pay'; readonly delayMs?: number }
  /** Destroys the socket; nothing registered. */
  | { readonly kind: 'drop' }
  /** Registers the payout, then destroys the socket without answering. */
  | { readonly kind: 'pay-then-drop' }
  /** Answers `status` (422) with a JSON problem `body`; nothing registered. */
  | { readonly kind: 'refuse'; readonly status?: number; readonly body?: unknown }
  /** Answers `status` (500); registers a payout first when `pay`. */
  | { readonly kind: 'fail'; readonly status?: number; readonly pay?: boolean }
  /** Nothing registered, never answered (until stop). */
  | { readonly kind: 'hang' }
  /**
   * Holds the request in flight: registers on arrival when `pay` (default
   * true) and answers 201 once `gate` settles (resolved or rejected); with
   * `pay: false` it answers the default refusal (422) instead, nothing paid.
   */
  | { readonly kind: 'gate'; readonly pay?: boolean; readonly gate: Promise<unknown> };

/** What the fake does with one `GET /payouts?reference=` (a well-formed one). */
export type LookupBehaviour =
  /** Answers after `delayMs`: 200 with the first payout for the reference (as of answering), else 404. */
  | { readonly kind: 'answer'; readonly delayMs?: number }
  /** Answers `status` (503). */
  | { readonly kind: 'fail'; readonly status?: number }
  /** Destroys the socket. */
  | { readonly kind: 'drop' }
  /** Never answers (until stop). */
  | { readonly kind: 'hang' };

export interface FakePaymentsEvents {
  /** A payout was registered. */
  payout: [FakePayout];
  /** A request arrived, body read. */
  request: [FakeRequest];
}

export const DEFAULT_REFUSAL = {
  type: 'insufficient-funds',
  title: 'Insufficient funds in the merchant balance',
} as const;

interface Waiter {
  readonly kind: 'payout' | 'lookup';
  readonly n: number;
  readonly resolve: () => void;
  readonly reject: (err: Error) => void;
  readonly timer: NodeJS.Timeout;
}

const PAYOUTS_PATH = '/payouts';

/**
 * A local payment provider (`PAYMENTS_URL`) that makes double payments
 * visible: it does NOT honour `Idempotency-Key` nor dedupe by reference, so
 * every POST that pays makes a new payout, and `payoutsFor(reference)` shows
 * them all. `GET /payouts?reference=` answers the first payout with that
 * reference, or 404.
 *
 * Behaviours are queued per call kind (`nextPayouts`, `nextLookups`) and
 * consumed in order; an empty queue means `defaultPayout` / `defaultLookup`.
 * A POST whose body is not JSON, or not a payout request, is answered 400 (415
 * without a JSON content type), registers nothing and takes no behaviour.
 */
export class FakePaymentsServer extends EventEmitter<FakePaymentsEvents> {
  /** Every request seen, in order of arrival (bodies read). */
  readonly requests: FakeRequest[] = [];
  /** Used when the payout queue is empty. */
  defaultPayout: PayoutBehaviour = { kind: 'pay' };
  /** Used when the lookup queue is empty. */
  defaultLookup: LookupBehaviour = { kind: 'answer' };

  private readonly made: FakePayout[] = [];
  private readonly payoutQueue: PayoutBehaviour[] = [];
  private readonly lookupQueue: LookupBehaviour[] = [];
  private readonly sockets = new Set<Socket>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly waiters = new Set<Waiter>();
  private readonly server: Server = createServer((req, res) => void this.receive(req, res));
  private started = false;
  private stopped = false;

  /** Every payout made, in order. */
  get payouts(): readonly FakePayout[] {
    return this.made;
  }

  async start(): Promise<this> {
    if (this.started) throw new Error('FakePaymentsServer: already started');
    this.started = true;
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
    });
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return this;
  }

  /** The base URL (PAYMENTS_URL), `http://127.0.0.1:<port>`; the provider's routes are under `/payouts`. */
  url(): string {
    const address = this.server.address() as AddressInfo | null;
    if (!address) throw new Error('FakePaymentsServer: not listening (call start() first)');
    return `http://127.0.0.1:${address.port}`;
  }

  /**
   * Closes every connection (hanging and gated requests included), clears
   * pending answers and rejects pending `arrivals()` waits. Idempotent.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    for (const waiter of this.waiters) {
      clearTimeout(waiter.timer);
      waiter.reject(new Error(`FakePaymentsServer: stopped while waiting for ${waiter.n} ${waiter.kind} request(s)`));
    }
    this.waiters.clear();
    if (!this.started || !this.server.listening) return;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    for (const socket of this.sockets) socket.destroy();
    await closed;
  }

  /** Queues behaviours for the next payout requests, in order. */
  nextPayouts(...behaviours: PayoutBehaviour[]): this {
    this.payoutQueue.push(...behaviours);
    return this;
  }

  /** Queues behaviours for the next lookup requests, in order. */
  nextLookups(...behaviours: LookupBehaviour[]): this {
    this.lookupQueue.push(...behaviours);
    return this;
  }

  /** Every payout made with that reference, in order: more than one is a double payment. */
  payoutsFor(reference: string): FakePayout[] {
    return this.made.filter((p) => p.reference === reference);
  }

  /** Every `POST /payouts` seen (malformed ones included). */
  payoutRequests(): FakeRequest[] {
    return this.requests.filter(isPayoutRequest);
  }

  /** Every `GET /payouts` seen. */
  lookupRequests(): FakeRequest[] {
    return this.requests.filter(isLookupRequest);
  }

  /** Resolves once `n` payout requests have arrived (bodies read) in all; rejects after `timeoutMs`. */
  arrivals(n: number, timeoutMs = 5000): Promise<void> {
    return this.wait('payout', n, timeoutMs);
  }

  /** Resolves once `n` lookup requests have arrived in all; rejects after `timeoutMs`. */
  lookupArrivals(n: number, timeoutMs = 5000): Promise<void> {
    return this.wait('lookup', n, timeoutMs);
  }

  /** Forgets requests, payouts and queued behaviours (the defaults stay). */
  reset(): void {
    this.requests.length = 0;
    this.made.length = 0;
    this.payoutQueue.length = 0;
    this.lookupQueue.length = 0;
  }

  private count(kind: 'payout' | 'lookup'): number {
    return kind === 'payout' ? this.payoutRequests().length : this.lookupRequests().length;
  }

  private wait(kind: 'payout' | 'lookup', n: number, timeoutMs: number): Promise<void> {
    if (this.count(kind) >= n) return Promise.resolve();
    if (this.stopped)
      return Promise.reject(new Error(`FakePaymentsServer: stopped, ${n} ${kind} request(s) will not arrive`));
    return new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        kind,
        n,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(waiter);
          reject(
            new Error(
              `FakePaymentsServer: expected ${n} ${kind} request(s) within ${timeoutMs} ms, ${this.count(kind)} arrived`,
            ),
          );
        }, timeoutMs),
      };
      this.waiters.add(waiter);
    });
  }

  private settleWaiters(): void {
    for (const waiter of this.waiters) {
      if (this.count(waiter.kind) < waiter.n) continue;
      clearTimeout(waiter.timer);
      this.waiters.delete(waiter);
      waiter.resolve();
    }
  }

  private async receive(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // A client gone mid-answer is not the server's error.
    res.on('error', () => undefined);
    req.on('error', () => undefined);
    let raw: string;
    try {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      raw = Buffer.concat(chunks).toString('utf8');
    } catch {
      return; // The client went away before its body arrived: nothing seen.
    }
    if (this.stopped) {
      req.socket.destroy();
      return;
    }
    const seen: FakeRequest = {
      n: this.requests.length + 1,
      method: req.method ?? '',
      path: req.url ?? '',
      headers: { ...req.headers },
      body: parseJson(raw),
      rawBody: raw,
    };
    this.requests.push(seen);
    this.emit('request', seen);
    this.settleWaiters();

    if (isPayoutRequest(seen)) return this.payout(seen, req, res);
    if (isLookupRequest(seen)) return this.lookup(seen, req, res);
    if (pathnameOf(seen.path) === PAYOUTS_PATH) {
      return this.send(res, 405, { error: `method ${seen.method} not allowed on /payouts` }, { allow: 'GET, POST' });
    }
    this.send(res, 404, { error: `no route for ${seen.method} ${pathnameOf(seen.path)}` });
  }

  private payout(seen: FakeRequest, req: IncomingMessage, res: ServerResponse): void {
    const contentType = String(seen.headers['content-type'] ?? '');
    if (!/^application\/json\b/i.test(contentType)) {
      return this.send(res, 415, { type: 'unsupported-media-type', title: 'The body must be application/json' });
    }
    const problem = payoutProblem(seen);
    if (problem !== undefined)
      return this.send(res, 400, { type: 'invalid-request', title: 'Invalid payout request', detail: problem });
    const fields = seen.body as { reference: string; order_id: string; amount: number; currency: string };

    const behaviour = this.payoutQueue.shift() ?? this.defaultPayout;
    const register = (): FakePayout => {
      const idempotencyKey = seen.headers['idempotency-key'];
      const payout: FakePayout = {
        payout_id: `po_${this.made.length + 1}_${randomBytes(4).toString('hex')}`,
        reference: fields.reference,
        order_id: fields.order_id,
        amount: fields.amount,
        currency: fields.currency,
        idempotencyKey: Array.isArray(idempotencyKey) ? idempotencyKey.join(', ') : idempotencyKey,
        created_at: new Date().toISOString(),
      };
      this.made.push(payout);
      this.emit('payout', payout);
      return payout;
    };

    switch (behaviour.kind) {
      case 'pay': {
        const payout = register();
        return this.later(behaviour.delayMs, () => this.send(res, 201, describe(payout)));
      }
      case 'drop':
        req.socket.destroy();
        return;
      case 'pay-then-drop':
        register();
        req.socket.destroy();
        return;
      case 'refuse':
        return this.send(res, behaviour.status ?? 422, behaviour.body === undefined ? DEFAULT_REFUSAL : behaviour.body);
      case 'fail': {
        if (behaviour.pay) register();
        const status = behaviour.status ?? 500;
        return this.send(res, status, { type: 'provider-error', title: `The provider failed (${status})` });
      }
      case 'hang':
        return;
      case 'gate': {
        const payout = behaviour.pay === false ? undefined : register();
        const answer = (): void => {
          if (this.stopped) return;
          if (payout) this.send(res, 201, describe(payout));
          else this.send(res, 422, DEFAULT_REFUSAL);
        };
        behaviour.gate.then(answer, answer);
        return;
      }
    }
  }

  private lookup(seen: FakeRequest, req: IncomingMessage, res: ServerResponse): void {
    const reference = new URL(seen.path, 'http://fake').searchParams.get('reference');
    if (!reference) return this.send(res, 400, { error: 'the reference query parameter is required' });
    const behaviour = this.lookupQueue.shift() ?? this.defaultLookup;
    switch (behaviour.kind) {
      case 'answer':
        return this.later(behaviour.delayMs, () => {
          const payout = this.made.find((p) => p.reference === reference);
          if (payout) this.send(res, 200, describe(payout));
          else this.send(res, 404, { error: 'no payout with that reference' });
        });
      case 'fail': {
        const status = behaviour.status ?? 503;
        return this.send(res, status, { error: `the provider failed (${status})` });
      }
      case 'drop':
        req.socket.destroy();
        return;
      case 'hang':
        return;
    }
  }

  /** Runs `fn` now, or after `delayMs` on a timer that stop() clears. */
  private later(delayMs: number | undefined, fn: () => void): void {
    if (!delayMs || delayMs <= 0) return fn();
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      fn();
    }, delayMs);
    this.timers.add(timer);
  }

  /** Writes a JSON answer; a client that has gone is ignored. */
  private send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    if (res.destroyed || res.writableEnded || res.headersSent) return;
    try {
      res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
    } catch {
      // The socket went away between the check and the write.
    }
  }
}

/** A payout as the provider's answers describe it (the request's headers stay out). */
function describe(payout: FakePayout): Record<string, unknown> {
  const { payout_id, reference, order_id, amount, currency, created_at } = payout;
  return { payout_id, reference, order_id, amount, currency, status: 'paid', created_at };
}

function pathnameOf(path: string): string {
  const q = path.indexOf('?');
  return q === -1 ? path : path.slice(0, q);
}

function isPayoutRequest(r: FakeRequest): boolean {
  return r.method === 'POST' && pathnameOf(r.path) === PAYOUTS_PATH;
}

function isLookupRequest(r: FakeRequest): boolean {
  return r.method === 'GET' && pathnameOf(r.path) === PAYOUTS_PATH;
}

function parseJson(raw: string): unknown {
  if (raw === '') return undefined;
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    return undefined;
  }
}

/** Why a payout request's body is not one, or undefined when it is. */
function payoutProblem(seen: FakeRequest): string | undefined {
  const { body } = seen;
  if (seen.rawBody === '') return 'the body is empty';
  if (body === undefined) return 'the body is not JSON';
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return 'the body must be a JSON object';
  const f = body as Record<string, unknown>;
  if (typeof f.reference !== 'string' || f.reference === '') return 'reference must be a non-empty string';
  if (typeof f.order_id !== 'string' || f.order_id === '') return 'order_id must be a non-empty string';
  if (typeof f.amount !== 'number' || !Number.isSafeInteger(f.amount) || f.amount <= 0)
    return 'amount must be a positive integer (minor units)';
  if (typeof f.currency !== 'string' || !/^[A-Z]{3}$/.test(f.currency)) return 'currency must be three capital letters';
  return undefined;
}
