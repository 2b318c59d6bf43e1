import { HttpException } from '@nestjs/common';
import { PROBLEM_CONTENT_TYPE, toProblem } from '@app/problem';
import { format as formatContentType, parse as parseContentType } from 'content-type';
import { isObservable } from 'rxjs';
import { IdempotencyKeyReusedException, IdempotencyOutcomeUnknownException } from './idempotency.errors';
import type { StoredResponse } from './idempotency-store.interface';
import type { IdempotencyErrorFormat, RecoveredAnswer } from './idempotent.decorator';

/**
 * 4xx answers that say "not now" rather than "no": Request Timeout, Conflict,
 * Too Early, Too Many Requests. Stored, they would be replayed after the
 * client waited as told (Retry-After); they release the key instead.
 */
const TRANSIENT_4XX = new Set([408, 409, 425, 429]);

/** The statuses a route stores without its own `storesStatus`: every answer under 500 but the transient 4xx. */
export const storesByDefault = (status: number): boolean => status < 500 && !TRANSIENT_4XX.has(status);

/** Response headers as Node (res.getHeaders()) or a renderer gives them. */
export type HeaderValues = Readonly<Record<string, number | string | string[] | undefined>>;

/** What of a route's settings the decision reads. */
export interface SettleRoute {
  /** Whether the route stores an answer of this status (its `storesStatus`, else storesByDefault). */
  readonly storesStatus: (status: number) => boolean;
  readonly maxStoredBodyBytes: number;
  /** The route's error format: renders the business errors it stores. */
  readonly errors: IdempotencyErrorFormat | undefined;
  /** The headers stored with an answer, lower case. */
  readonly replayHeaders: ReadonlySet<string>;
}

/** How a claimed request's handler (or the route's recovery) ended, as the decision needs to know it. */
export type HandlerOutcome =
  /** The handler returned a value Nest sends (anything but a web Response or a streamed answer). */
  | {
      readonly kind: 'returned';
      readonly body: unknown;
      /** res.statusCode, res.getHeaders() and res.headersSent once it returned. */
      readonly status: number;
      readonly headers: HeaderValues;
      readonly headersSent: boolean;
    }
  /**
   * The handler returned a web Response. `bytes` is its body, read only for a
   * status the route stores (one it does not store is sent as it is, unread).
   */
  | { readonly kind: 'web-response'; readonly status: number; readonly headers: HeaderValues; readonly bytes?: Buffer }
  /** The body of a web Response the route stores could not be read. */
  | { readonly kind: 'web-response-unreadable'; readonly error: unknown }
  /** The handler, or a pipe before it (`rejectedByPipes`), threw. */
  | {
      readonly kind: 'threw';
      readonly error: unknown;
      readonly rejectedByPipes: boolean;
      /** res.headersSent once it threw. */
      readonly headersSent: boolean;
    }
  /** The route's recovery found what the key's earlier, dead request answered: that answer, as stored (jsonAnswer). */
  | { readonly kind: 'recovered'; readonly response: StoredResponse }
  /** The route's recovery threw: the earlier request's outcome cannot be known yet, or its key was reused. */
  | { readonly kind: 'recovery-failed'; readonly error: unknown };

/** Why a key is released with nothing stored. */
export type ReleaseReason =
  /** The route does not store an answer of this status (5xx, a transient 4xx, or its storesStatus said no). */
  | { readonly kind: 'status'; readonly status: number }
  /** A pipe refused the request: the handler never ran, so a corrected retry with the key must run for real. */
  | { readonly kind: 'rejected-by-pipes' }
  /** The key's operation was done with another body: a mismatch, not this operation's answer. */
  | { readonly kind: 'key-reused' }
  /** The handler sent its answer itself (@Res() without passthrough): what went out is not known here. */
  | { readonly kind: 'headers-sent' }
  /** The answer is over the route's maxStoredBodyBytes. */
  | { readonly kind: 'too-large'; readonly size: number; readonly limit: number }
  /** A value JSON cannot hold (a BigInt, a cycle): Express cannot send it either; `error` is the answer. */
  | { readonly kind: 'unserialisable'; readonly error: unknown }
  /** A value the store cannot hold (a Buffer, a stream, an Observable); `type` names it. */
  | { readonly kind: 'unstorable'; readonly type: string }
  /** The web Response's body could not be read; `error` is the answer. */
  | { readonly kind: 'unreadable'; readonly error: unknown };

/** What becomes of the claimed key once its handler ended. */
export type SettleDecision =
  /** The answer is stored, and replayed to every retry with the key. */
  | { readonly action: 'store'; readonly response: StoredResponse }
  /** The key is freed: a retry runs the handler again. */
  | { readonly action: 'release'; readonly reason: ReleaseReason }
  /** The outcome is unknown: the key is left as a dead request's, so the next request with it recovers first. */
  | { readonly action: 'abandon' };

const ABANDON: SettleDecision = { action: 'abandon' };
const release = (reason: ReleaseReason): SettleDecision => ({ action: 'release', reason });

/**
 * Store, release or abandon: the one decision for a claimed request, from how
 * its handler ended and the route's settings. Pure: it builds the answer to
 * store (allowlisted headers, serialised body) but stores nothing; the
 * interceptor performs what it says. Throws only what the route's own code
 * throws (an error renderer), as the answer.
 */
export function settleDecision(outcome: HandlerOutcome, route: SettleRoute): SettleDecision {
  switch (outcome.kind) {
    case 'returned':
      return returned(outcome, route);
    case 'web-response': {
      const { status } = outcome;
      if (!route.storesStatus(status) || outcome.bytes === undefined) return release({ kind: 'status', status });
      const headers = pickHeaders(outcome.headers, route.replayHeaders);
      const contentType = outcome.headers['content-type'];
      if (contentType !== undefined) headers['content-type'] = String(contentType);
      return sized({ status, headers, body: outcome.bytes }, route);
    }
    case 'web-response-unreadable':
      return release({ kind: 'unreadable', error: outcome.error });
    case 'threw':
      return threw(outcome, route);
    case 'recovered':
      return route.storesStatus(outcome.response.status) ? sized(outcome.response, route) : ABANDON;
    case 'recovery-failed':
      // A mismatch must not keep the key from its own body; anything else is
      // still unknown: the key stays a dead request's, for the next one to recover.
      return outcome.error instanceof IdempotencyKeyReusedException ? release({ kind: 'key-reused' }) : ABANDON;
  }
}

function returned(outcome: Extract<HandlerOutcome, { kind: 'returned' }>, route: SettleRoute): SettleDecision {
  if (outcome.headersSent) return release({ kind: 'headers-sent' });
  const { status } = outcome;
  if (!route.storesStatus(status)) return release({ kind: 'status', status });
  let serialised: ReturnType<typeof serialiseBody>;
  try {
    serialised = serialiseBody(outcome.body);
  } catch (error) {
    return release({ kind: 'unserialisable', error });
  }
  if (serialised === undefined) return release({ kind: 'unstorable', type: typeName(outcome.body) });
  const headers = pickHeaders(outcome.headers, route.replayHeaders);
  const given = headers['content-type'];
  if (given === undefined) headers['content-type'] = serialised.contentType;
  else if (outcome.body !== undefined && outcome.body !== null) headers['content-type'] = sentByExpress(given);
  return sized({ status, headers, body: Buffer.from(serialised.text) }, route);
}

/**
 * The Content-Type Express sends with a string body (res.send, res.json):
 * the handler's type with its charset made utf-8, which is how Express
 * encodes the string. Stored as sent, so a replay says what its bytes are.
 * Parsed and formatted by the package Express uses, so the two agree byte
 * for byte; a type it cannot parse is sent as it is, and stored so.
 */
function sentByExpress(type: string): string {
  try {
    const parsed = parseContentType(type);
    parsed.parameters.charset = 'utf-8';
    return formatContentType(parsed);
  } catch {
    return type;
  }
}

function threw(outcome: Extract<HandlerOutcome, { kind: 'threw' }>, route: SettleRoute): SettleDecision {
  const { error } = outcome;
  if (outcome.rejectedByPipes) return release({ kind: 'rejected-by-pipes' });
  // The handler does not know what its effect did (a provider that timed out).
  if (error instanceof IdempotencyOutcomeUnknownException) return ABANDON;
  // The handler found the key's operation done with another body (its own
  // rows outlived the record). Not stored, or the operation's own body would
  // get the 422 from then on.
  if (error instanceof IdempotencyKeyReusedException) return release({ kind: 'key-reused' });
  if (outcome.headersSent) return release({ kind: 'headers-sent' });
  const status = error instanceof HttpException ? error.getStatus() : 500;
  if (status < 400 || status >= 500 || !route.storesStatus(status)) return release({ kind: 'status', status });
  // The handler's own business answer: stored and replayed like a success,
  // with the same header allowlist (a problem may carry Set-Cookie too).
  if (route.errors) {
    const rendered = route.errors.render(error);
    const contentType = Object.entries(rendered.headers).find(([name]) => name.toLowerCase() === 'content-type')?.[1];
    const headers = {
      ...pickHeaders(rendered.headers, route.replayHeaders),
      ...(contentType ? { 'content-type': contentType } : {}),
    };
    if (!route.storesStatus(rendered.status)) return release({ kind: 'status', status: rendered.status });
    return sized({ status: rendered.status, headers, body: Buffer.from(rendered.body) }, route);
  }
  const problem = toProblem(error);
  const headers = { ...pickHeaders(problem.headers, route.replayHeaders), 'content-type': PROBLEM_CONTENT_TYPE };
  return sized({ status: problem.status, headers, body: Buffer.from(JSON.stringify(problem.body)) }, route);
}

function sized(response: StoredResponse, route: SettleRoute): SettleDecision {
  const size = response.body.length;
  if (size > route.maxStoredBodyBytes) return release({ kind: 'too-large', size, limit: route.maxStoredBodyBytes });
  return { action: 'store', response };
}

/** The allowlisted headers of an answer, lower case, one string each. */
export function pickHeaders(all: HeaderValues, allowlist: ReadonlySet<string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(all)) {
    const lower = name.toLowerCase();
    if (value === undefined || !allowlist.has(lower)) continue;
    out[lower] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return out;
}

/**
 * An answer a route gave the library itself (recovered, finalised in a
 * transaction), as it is stored: JSON, allowlisted headers.
 */
export function jsonAnswer(answer: RecoveredAnswer, allowlist: ReadonlySet<string>): StoredResponse {
  // A JSON media type the answer names (a problem+json refusal) is kept: its replays must say what it is. The
  // header's name in any case (pickHeaders lowers them all); its charset is the one the body is encoded in.
  const named = Object.entries(answer.headers ?? {}).find(([name]) => name.toLowerCase() === 'content-type')?.[1];
  const headers = {
    ...pickHeaders(answer.headers ?? {}, allowlist),
    'content-type': jsonMediaType(named) ?? 'application/json; charset=utf-8',
  };
  return { status: answer.status, headers, body: Buffer.from(JSON.stringify(answer.body) ?? '') };
}

/** A JSON media type (application/json, application/<x>+json) with its charset made utf-8; anything else undefined. */
function jsonMediaType(type: string | undefined): string | undefined {
  if (type === undefined) return undefined;
  try {
    const parsed = parseContentType(type);
    if (!JSON_MEDIA_TYPE.test(parsed.type)) return undefined;
    parsed.parameters.charset = 'utf-8';
    return formatContentType(parsed);
  } catch {
    return undefined;
  }
}

const JSON_MEDIA_TYPE = /^application\/(?:[\w.-]+\+)?json$/;

/** The bytes Express will send for a handler's return value, or undefined if it is not storable. */
function serialiseBody(body: unknown): { text: string; contentType: string } | undefined {
  if (body === undefined || body === null) return { text: '', contentType: 'text/plain; charset=utf-8' };
  if (typeof body === 'string') return { text: body, contentType: 'text/html; charset=utf-8' };
  if (typeof body === 'number' || typeof body === 'boolean') {
    return { text: String(body), contentType: 'text/html; charset=utf-8' };
  }
  if (Buffer.isBuffer(body) || isObservable(body) || body instanceof Response || isStream(body)) return undefined;
  if (typeof body === 'object') return { text: JSON.stringify(body), contentType: 'application/json; charset=utf-8' };
  return undefined;
}

function isStream(value: object): boolean {
  return typeof (value as { pipe?: unknown }).pipe === 'function' || Symbol.asyncIterator in value;
}

function typeName(value: unknown): string {
  return typeof value === 'object' && value !== null ? value.constructor.name : typeof value;
}
