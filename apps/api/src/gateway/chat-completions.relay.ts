import { Inject, Injectable, Logger } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import {
  DirectAnswer,
  fingerprintDigest,
  type IdempotencyRequestContext,
  NULL_BODY_STATUSES,
  onceClosed,
  StreamedAnswer,
} from '@app/idempotency';
import { rawBodyOf } from '@app/problem';
import type { Request, Response as ExpressResponse } from 'express';
import { markGatewayRun } from './gateway-calls.middleware';
import { uuidV5 } from '@app/ids';
import {
  sseEventBuffers,
  UpstreamTimeoutError,
  UpstreamUnreachableError,
  isDoneEvent,
  mayHoldUsage,
  usageIn,
  usageOf,
  type TokenUsage,
  type UpstreamResponse,
} from '@app/llm';
import type { GatewayApi } from './gateway-apis';
import { type GatewayUpstream, GatewayUpstreams } from './gateway-upstreams';
import { GATEWAY_RECORDS, type GatewayRecords } from './gateway-records';
import { DEFAULT_MAX_OUTPUT_TOKENS, type Reservation, TenantTokenLimiter, worstCaseTokens } from '@app/llm';
import { GatewayCalls } from './gateway-calls';
import { GatewayMetrics } from './gateway.metrics';
import { GATEWAY_OPTIONS, type GatewayOptions } from './gateway.options';
import { OpenAiErrorException } from './openai-errors';

/** An upstream error body is relayed whole; past this it is cut (error bodies are a few hundred bytes). */
const MAX_ERROR_BODY_BYTES = 1024 * 1024;
/**
 * The most one server-sent event of the provider may take. A chat
 * completion's chunks are a few KB (a token or two of text, a piece of a
 * tool call's arguments, the usage); the largest real ones are images that
 * image models send as base64 data URLs in one delta, 1 to 3 MB. 4 MiB is
 * also the most the gateway stores of a whole answer, so an event past it
 * could never be replayed anyway. Past it the stream is broken: the event is
 * not buffered on for ever.
 */
export const GATEWAY_MAX_EVENT_BYTES = 4 * 1024 * 1024;
/**
 * How much of a whole (non-stream) answer is read before it is answered. One
 * that ends within it is sent (and, with a key, stored) whole; a larger one
 * could not be stored anyway, so it is relayed as it arrives, at its caller's
 * pace, and its memory stays this much whatever its size.
 */
export const GATEWAY_MAX_WHOLE_ANSWER_BYTES = 4 * 1024 * 1024;
/** Of an answer relayed as it arrives, the last bytes kept to find its usage in (OpenAI writes it last). */
const USAGE_TAIL_BYTES = 64 * 1024;
/** The provider's idempotency keys are ours, one namespace for all tenants: each operation gets its own. */
const UPSTREAM_KEY_NAMESPACE = '6f1d7c8e-52a4-4c1b-9a43-0b1e7f3d2a91';

/** How long the provider may take to end its body after data: [DONE] before the connection is dropped. */
const DRAIN_AFTER_DONE_MS = 5000;

async function drainAfterDone(events: AsyncIterator<unknown>, body: AsyncIterable<Buffer>): Promise<void> {
  // The body itself is destroyed: return() on a generator waits for the read in progress.
  const timer = setTimeout(() => (body as { destroy?: () => void }).destroy?.(), DRAIN_AFTER_DONE_MS);
  try {
    while (!(await events.next()).done);
  } catch {
    // A break after [DONE] changes nothing of the answer.
  } finally {
    clearTimeout(timer);
  }
}

/** What a call's handling needs to know of it as it goes. */
interface CallState {
  /** The upstream serving it (GATEWAY_UPSTREAMS' name): X-Gateway-Upstream on its answer and errors. */
  upstream: string;
  readonly tenant: string;
  /** A keyed call's idempotency operation: where its answer is recorded. */
  readonly operation: string | undefined;
  /** The tokens the provider reported for it (usage), once it has. */
  usageTokens?: number;
  /**
   * Whether the provider may have spent tokens on it: from the send on, until its answer proves otherwise (a
   * non-2xx, a refusal). A call that may have and reported no usage settles its reservation at its worst case.
   */
  mayHaveSpent: boolean;
  /** The answer is whole: a caller leaving after this ends nothing. */
  answered: boolean;
  /** Aborted when a caller without a key went away before that. */
  readonly gone: AbortSignal;
  /** Aborted when the call ran out of GATEWAY_TIMEOUT_S. */
  readonly timeout: AbortSignal;
}

function shuttingDown(): OpenAiErrorException {
  return new OpenAiErrorException(
    503,
    'shutting_down',
    'This api instance is shutting down; nothing was stored. Retry with the same Idempotency-Key.',
    {
      'Retry-After': '1',
    },
  );
}

class StreamBrokenError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'StreamBrokenError';
  }
}

/** The provider's stream reported its own failure (`response.failed`, `error`). */
class UpstreamFailedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UpstreamFailedError';
  }
}

/** The pins could not be read or written: the call is not sent, since its retry could not be kept on one upstream. */
function pinsUnavailable(err: unknown): OpenAiErrorException {
  return new OpenAiErrorException(
    503,
    'idempotency_store_unavailable',
    `The call cannot be made safe to retry right now (the gateway's store is unreachable: ${
      err instanceof Error ? err.message : String(err)
    }); nothing was sent upstream. Retry with the same Idempotency-Key.`,
    { 'Retry-After': '1' },
  );
}

export const is2xx = (status: number): boolean => status >= 200 && status < 300;

/**
 * A whole answer as one `end()` of its bytes (no body for a status that has none, whatever the provider sent). The
 * idempotency interceptor, on both of the gateway's routes, stores it from those bytes and sends it as it is, or as
 * the web Response it stands for where the app's adapter cannot send it.
 */
function wholeAnswer(status: number, headers: Record<string, string>, bytes: Buffer): DirectAnswer {
  return new DirectAnswer(status, headers, NULL_BODY_STATUSES.has(status) ? null : bytes);
}

/** The start of a whole answer: all of it, or the part read before it passed the cap. */
interface AnswerHead {
  readonly chunks: Buffer[];
  readonly whole: boolean;
}

/**
 * The usage of a whole answer from its last bytes: the last `"usage":{...}`
 * member (its objects nest one level: the token details). In JSON text an
 * unescaped `"usage"` can only be a member's name.
 */
function usageOfTail(tail: string): TokenUsage | undefined {
  const all = [...tail.matchAll(/"usage"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})/g)];
  const last = all.at(-1);
  return last ? usageOf(`{"usage":${last[1]}}`) : undefined;
}

/**
 * The provider's Idempotency-Key for an operation: the same for every retry
 * of it, never the same for two tenants (they share our provider account)
 * nor for another body under a key whose record expired.
 */
function upstreamKeyOf(idempotency: IdempotencyRequestContext): string {
  // The digest, not the versioned fingerprint: the same key as before the
  // version for every body whose numbers are written as JavaScript writes
  // them. A body with other literals (`1.0`) gets another key than the
  // unversioned fingerprint gave it; only a call made to the provider again
  // (its record freed or expired) could meet that, and the gateway never
  // relies on the provider's deduplication.
  return uuidV5(`${idempotency.operation}\n${fingerprintDigest(idempotency.fingerprint)}`, UPSTREAM_KEY_NAMESPACE);
}

/**
 * The provider's headers as the caller gets them. Its request id moves to
 * `x-upstream-request-id`: `X-Request-Id` is ours, on every answer, and the
 * one to quote to us; the provider's is the one to quote to the provider.
 */
function relayed(headers: Readonly<Record<string, string>>, upstream: string): Record<string, string> {
  const { 'x-request-id': upstreamId, ...rest } = headers;
  return {
    ...rest,
    ...(upstreamId === undefined ? {} : { 'x-upstream-request-id': upstreamId }),
    [GATEWAY_UPSTREAM_HEADER]: upstream,
  };
}

/** On every answer that came from an upstream, and on its replays: which upstream made it. */
export const GATEWAY_UPSTREAM_HEADER = 'x-gateway-upstream';

/**
 * Answers that prove the upstream made no completion, so the call may go to
 * the next upstream that lists its model: rate limited, or failing before
 * any work (`529`: overloaded, as Anthropic-compatible providers say it).
 */
const FALLBACK_STATUSES = new Set([429, 500, 502, 503, 529]);

/**
 * What a whole 2xx answer of either API must be: JSON (by its content type)
 * and an object (its first and last bytes, past whitespace, are braces).
 * Structural, not a parse: a provider's body with a raw NUL or bytes that are
 * not UTF-8 inside a string is relayed and stored as it came (docs/clients.md);
 * an HTML page from a proxy, an empty body, or plain text is not.
 */
function looksLikeJsonObject(contentType: string | undefined, body: Buffer): boolean {
  if (!/[/+]json\b/i.test(contentType ?? '')) return false;
  let first = 0;
  let last = body.length - 1;
  while (first <= last && isJsonSpace(body[first])) first++;
  while (last >= first && isJsonSpace(body[last])) last--;
  return first < last && body[first] === 0x7b && body[last] === 0x7d;
}

function isJsonSpace(byte: number): boolean {
  return byte === 0x20 || byte === 0x0a || byte === 0x0d || byte === 0x09;
}

/** A whole answer that looks like a JSON object, parsed; undefined if it does not parse as one. */
function parsedObject(text: string): object | undefined {
  try {
    const parsed: unknown = JSON.parse(text);
    return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** A response object's `id`, from the first bytes of one too large to parse whole: its first `"id"` member. */
function responseIdNear(chunks: readonly Buffer[]): string | undefined {
  const start = Buffer.concat(chunks.slice(0, 4)).subarray(0, 4096).toString('utf8');
  return /^\s*\{\s*"id"\s*:\s*"([A-Za-z0-9_-]{1,256})"/.exec(start)?.[1];
}

function upstreamHeader(call: CallState): Record<string, string> {
  return { [GATEWAY_UPSTREAM_HEADER]: call.upstream };
}

/** A failure before the request reached the upstream (refused, DNS, TLS): nothing can have been made. */
function provesNothingSent(err: unknown): boolean {
  return err instanceof UpstreamUnreachableError && !err.requestSent;
}

/** What the gateway reads of any body it relays: whether the caller asked for a stream. */
export interface GatewayRequestBody {
  readonly stream?: boolean | null;
  readonly [parameter: string]: unknown;
}

/** One call through the gateway, as its route hands it over. */
export interface GatewayCall {
  /** Which of the provider's APIs. */
  readonly api: GatewayApi;
  /** The request body, sent upstream as the caller sent it. */
  readonly body: Buffer;
  /** The same body, parsed. */
  readonly json: GatewayRequestBody;
  readonly tenant: string;
  /** Undefined for a call without an Idempotency-Key. */
  readonly idempotency: IdempotencyRequestContext | undefined;
  /** Runs `fn` once the caller's connection is closed (at once if it is). */
  readonly onCallerClosed: (fn: () => void) => void;
}

/**
 * One call to the provider and its answer relayed back: the call's time
 * limit, what ends it (its keyless caller leaving, a shutdown), the relay of
 * a whole answer or of a stream's events, the metrics of each outcome, and
 * the OpenAI error the caller gets when it fails. The route
 * (ChatCompletionsController) only hands it the request.
 */
@Injectable()
export class ChatCompletionsRelay {
  private readonly logger = new Logger(ChatCompletionsRelay.name);

  constructor(
    private readonly upstreams: GatewayUpstreams,
    private readonly limiter: TenantTokenLimiter,
    @Inject(GATEWAY_RECORDS) private readonly records: GatewayRecords,
    @Inject(GATEWAY_OPTIONS) private readonly options: GatewayOptions,
    private readonly metrics: GatewayMetrics,
    private readonly calls: GatewayCalls,
  ) {}

  /**
   * A completion route's handler (chat completions, responses): counted as a
   * call that ran, refused while the instance stops, then the call, its body
   * as the caller sent its bytes.
   */
  handle(
    api: GatewayApi,
    req: Request,
    res: ExpressResponse,
    json: GatewayRequestBody,
    tenant: string,
    idempotency: IdempotencyRequestContext | undefined,
  ): Promise<DirectAnswer | Response | StreamedAnswer> {
    markGatewayRun(req);
    this.calls.refuseIfShuttingDown(res, this.metrics);
    return this.call({
      api,
      body: rawBodyOf(req) ?? Buffer.from(JSON.stringify(json)),
      json,
      tenant,
      idempotency,
      onCallerClosed: (fn) => onceClosed(res, fn),
    });
  }

  async call({
    api,
    body,
    json,
    tenant,
    idempotency,
    onCallerClosed,
  }: GatewayCall): Promise<DirectAnswer | Response | StreamedAnswer> {
    const keyed = idempotency !== undefined;
    const stream = json.stream === true;
    const route = await this.routeOf(
      String(json.model),
      idempotency,
      tenant,
      api.responseIdOf === undefined ? undefined : json.previous_response_id,
    );
    // A tenant with a token limit reserves the call's worst case first (TENANT_TOKEN_LIMITS); nothing goes upstream
    // for one that does not fit.
    const worstCase = worstCaseTokens(body.length, json);
    const reservation = await this.reserveTokens(tenant, worstCase);
    // The whole call, a whole stream included. A keyed call does not belong
    // to the caller's socket: one that goes away leaves it to finish and be
    // stored for its retry. A call without a key has nobody to store it for,
    // so the caller going away ends it. Shutdown cuts either after the drain.
    // A timer cleared when the call ends, not AbortSignal.timeout(): that one
    // keeps the call's signal and async context alive for the whole 300 s.
    // The call's signal is one controller's, aborted by whichever comes first: the timer, the caller going away
    // (without a key), the drain running out (GatewayCalls aborts it). AbortSignal.any() of three signals, one
    // shared by every call, cost 12-21 µs a call in its composite bookkeeping (1-2 µs this way).
    const stop = new AbortController();
    const timeout = new AbortController();
    const timer = setTimeout(() => {
      const reason = new DOMException('The call ran out of time', 'TimeoutError');
      timeout.abort(reason);
      stop.abort(reason);
    }, this.options.timeoutMs);
    timer.unref();
    const gone = new AbortController();
    const call: CallState = {
      upstream: route.upstreams[0].name,
      tenant,
      operation: idempotency?.operation,
      mayHaveSpent: false,
      answered: false,
      gone: gone.signal,
      timeout: timeout.signal,
    };
    if (!keyed) {
      // Until the answer is whole: after it, the rest of the provider's body
      // is read on (drainAfterDone) to keep its connection.
      onCallerClosed(() => {
        if (call.answered) return;
        const reason = new Error('the caller went away');
        gone.abort(reason);
        stop.abort(reason);
      });
    }
    const signal = stop.signal;
    const endCall = this.calls.begin(stop);
    let ended = false;
    const end = (): void => {
      if (ended) return;
      ended = true;
      clearTimeout(timer);
      endCall();
      // The reservation settles to the tokens the provider reported; to the worst case when it may have spent some
      // and said nothing (a stream without usage, a timeout after the send); to none when it proved it made nothing.
      const tokens = call.usageTokens ?? (call.mayHaveSpent ? worstCase : 0);
      if (reservation?.outcome === 'reserved')
        void reservation.settle(tokens).catch((err: unknown) => this.settleFailed(tenant, err));
    };
    // Without a key, the caller leaving ends the call (its stream may never be read).
    if (!keyed) onCallerClosed(end);
    const sent = performance.now();
    const upstreamKey = idempotency ? upstreamKeyOf(idempotency) : undefined;
    for (let i = 0; ; i++) {
      const target = route.upstreams[i];
      const last = i === route.upstreams.length - 1;
      call.upstream = target.name;
      if (route.pinning) {
        try {
          await this.pin(idempotency!.operation, target.name);
        } catch (err) {
          end();
          throw err;
        }
      }
      let upstream: UpstreamResponse;
      try {
        call.mayHaveSpent = true;
        upstream = await target.client.send({ path: api.path, body, json, idempotencyKey: upstreamKey, signal });
      } catch (err) {
        if (provesNothingSent(err)) call.mayHaveSpent = false;
        if (!last && provesNothingSent(err) && !signal.aborted) {
          await this.fellBack(route, idempotency, target);
          continue;
        }
        end();
        throw this.unreachable(err, call);
      }
      if (!last && FALLBACK_STATUSES.has(upstream.status)) {
        call.mayHaveSpent = false;
        // The answer proves nothing was made: its body is read and dropped, and the next upstream is asked.
        await this.readCut(upstream, MAX_ERROR_BODY_BYTES, sent, stream).catch(() => undefined);
        await this.fellBack(route, idempotency, target);
        continue;
      }
      this.metrics.upstreamCall(target.name, is2xx(upstream.status) ? 'answered' : 'error_status');
      // A refusal (non-2xx) made nothing to pay for.
      if (!is2xx(upstream.status)) call.mayHaveSpent = false;
      try {
        return await this.relay(api, upstream, tenant, keyed, stream, signal, sent, end, call);
      } catch (err) {
        end();
        throw err;
      }
    }
  }

  /**
   * The tenant's worst case reserved against its limit, or undefined without
   * one. One that does not fit: 429 `tenant_token_limit` with Retry-After (the
   * window's end); one whose worst case alone is over the whole limit: 400
   * `request_exceeds_token_limit` (no retry can fit; lower max_tokens).
   */
  private async reserveTokens(
    tenant: string,
    worstCase: number,
  ): Promise<Extract<Reservation, { outcome: 'reserved' }> | undefined> {
    if (this.limiter.limitOf(tenant) === undefined) return undefined;
    let reserved: Reservation | undefined;
    try {
      reserved = await this.limiter.reserve(tenant, worstCase, randomUUID());
    } catch (err) {
      this.metrics.call('rejected');
      throw new OpenAiErrorException(
        503,
        'token_limiter_unavailable',
        `The tenant's token limit cannot be checked right now (${err instanceof Error ? err.message : String(err)}); nothing was sent upstream. Retry.`,
        { 'Retry-After': '1' },
      );
    }
    if (reserved === undefined || reserved.outcome === 'reserved') return reserved;
    this.metrics.call('rejected');
    this.metrics.tokenRefusal(tenant);
    const { tokens, window } = reserved.limit;
    if (reserved.outcome === 'too_large')
      throw new OpenAiErrorException(
        400,
        'request_exceeds_token_limit',
        `This call may use up to ${worstCase} tokens (its prompt, estimated, and its max_tokens or the default of ` +
          `${DEFAULT_MAX_OUTPUT_TOKENS}), more than your whole limit of ${tokens} per ${window}. Lower max_tokens.`,
      );
    throw new OpenAiErrorException(
      429,
      'tenant_token_limit',
      `Your token limit (${tokens} per ${window}) has no room for this call's worst case of ${worstCase} tokens ` +
        `now; nothing was sent upstream. Retry after Retry-After seconds.`,
      { 'Retry-After': String(reserved.retryAfterS) },
    );
  }

  private settleFailed(tenant: string, err: unknown): void {
    this.logger.warn(
      `could not settle a token reservation of tenant ${tenant} (it frees at its lease's end): ${
        err instanceof Error ? err.message : String(err)
      }`,
    );
  }

  /**
   * The upstreams a call may go to, in order: those listing its model, or,
   * for an operation pinned by an earlier attempt whose outcome is unknown,
   * that attempt's upstream alone. `pinning`: a keyed call with more than one
   * upstream to choose from pins each before sending (with one, there is no
   * other to fall back to, and nothing to pin).
   */
  private async routeOf(
    model: string,
    idempotency: IdempotencyRequestContext | undefined,
    tenant: string,
    previousResponseId: unknown,
  ): Promise<{ readonly upstreams: readonly GatewayUpstream[]; readonly pinning: boolean }> {
    // A conversation goes on where it started; and only the tenant that made a response may build on it (tenants
    // share the provider's account, where any id would be taken).
    if (typeof previousResponseId === 'string')
      return { upstreams: [await this.upstreamOf(previousResponseId, tenant)], pinning: false };
    const upstreams = this.upstreams.route(model);
    if (upstreams.length === 0) {
      this.metrics.call('rejected');
      throw new OpenAiErrorException(
        404,
        'model_not_found',
        `The model ${JSON.stringify(model)} is not served by this gateway: no upstream of GATEWAY_UPSTREAMS lists it.`,
        {},
        'model',
      );
    }
    if (idempotency === undefined || upstreams.length === 1) return { upstreams, pinning: false };
    const pinned = await this.records.pinned(idempotency.operation).catch((err: unknown) => {
      this.metrics.call('rejected');
      throw pinsUnavailable(err);
    });
    const there = pinned === undefined ? undefined : this.upstreams.named(pinned);
    return { upstreams: there ? [there] : upstreams, pinning: true };
  }

  /** The upstream that made a response of this tenant's; 400 previous_response_not_found otherwise, nothing sent. */
  private async upstreamOf(responseId: string, tenant: string): Promise<GatewayUpstream> {
    const record = await this.records.response(responseId).catch((err: unknown) => {
      this.metrics.call('rejected');
      throw pinsUnavailable(err);
    });
    const upstream = record?.tenant === tenant ? this.upstreams.named(record.upstream) : undefined;
    if (upstream === undefined) {
      this.metrics.call('rejected');
      throw new OpenAiErrorException(
        400,
        'previous_response_not_found',
        `Previous response with id ${JSON.stringify(responseId)} not found: it was not made through this gateway for you, or it is past its retention.`,
        {},
        'previous_response_id',
      );
    }
    return upstream;
  }

  private async pin(operation: string, upstream: string): Promise<void> {
    await this.records.pin(operation, upstream, this.options.recordTtlMs).catch((err: unknown) => {
      throw pinsUnavailable(err);
    });
  }

  /** The upstream proved it made nothing: counted, its pin removed (best effort), and the next one is asked. */
  private async fellBack(
    route: { readonly pinning: boolean },
    idempotency: IdempotencyRequestContext | undefined,
    target: GatewayUpstream,
  ): Promise<void> {
    this.metrics.upstreamCall(target.name, 'fell_back');
    // Left in place, a pin to an upstream that made nothing only keeps the retry from falling back past it.
    if (route.pinning) await this.records.unpin(idempotency!.operation, target.name).catch(() => undefined);
  }

  private async relay(
    api: GatewayApi,
    upstream: UpstreamResponse,
    tenant: string,
    keyed: boolean,
    stream: boolean,
    signal: AbortSignal,
    sent: number,
    end: () => void,
    call: CallState,
  ): Promise<DirectAnswer | Response | StreamedAnswer> {
    if (!is2xx(upstream.status)) {
      const bytes = await this.readCut(upstream, MAX_ERROR_BODY_BYTES, sent, stream).catch(() => Buffer.alloc(0));
      call.answered = true;
      end();
      this.metrics.call('upstream_error');
      return wholeAnswer(upstream.status, relayed(upstream.headers, call.upstream), bytes);
    }
    if ((upstream.headers['content-type'] ?? '').toLowerCase().startsWith('text/event-stream')) {
      return new StreamedAnswer(
        upstream.status,
        relayed(upstream.headers, call.upstream),
        this.relayEvents(api, upstream, tenant, keyed, sent, end, call),
      );
    }
    const body = upstream.body[Symbol.asyncIterator]();
    let head: AnswerHead;
    try {
      head = await this.readHead(body, GATEWAY_MAX_WHOLE_ANSWER_BYTES, sent, stream);
    } catch (err) {
      end();
      throw this.brokenOff(err, signal, call);
    }
    if (!head.whole) {
      // Too large to hold: its id is read from its start (a response object names it first), so it can be found.
      const responseId = api.responseIdOf === undefined ? undefined : responseIdNear(head.chunks);
      if (responseId !== undefined) await this.rememberResponse(responseId, call);
      return new StreamedAnswer(
        upstream.status,
        relayed(upstream.headers, call.upstream),
        this.relayLargeAnswer(head.chunks, body, tenant, keyed, end, call),
        { storable: false, framed: false },
      );
    }
    const bytes = Buffer.concat(head.chunks);
    if (!looksLikeJsonObject(upstream.headers['content-type'], bytes)) {
      end();
      this.metrics.call('upstream_malformed');
      throw new OpenAiErrorException(
        502,
        'upstream_malformed',
        `The model provider answered ${upstream.status} with a body that is not a JSON object (content-type ${JSON.stringify(
          upstream.headers['content-type'] ?? 'none',
        )}). Nothing was stored; retry with the same Idempotency-Key.`,
        upstreamHeader(call),
      );
    }
    // Parsed once, for what the gateway reads of it (and only if there is something to read); one that does not
    // parse (a raw NUL) is relayed all the same.
    const text = bytes.toString('utf8');
    const answer = api.responseIdOf !== undefined || mayHoldUsage(text) ? parsedObject(text) : undefined;
    const responseId = answer === undefined ? undefined : api.responseIdOf?.(answer);
    if (responseId !== undefined) await this.rememberResponse(responseId, call);
    this.countUsage(call, usageIn(answer));
    end();
    call.answered = true;
    this.metrics.call(keyed ? 'new' : 'forwarded');
    return wholeAnswer(upstream.status, relayed(upstream.headers, call.upstream), bytes);
  }

  /** A call's token counts: in the metrics, and what its limit's reservation settles to (CallState.usageTokens). */
  private countUsage(call: CallState, usage: TokenUsage | undefined): void {
    if (usage === undefined) return;
    call.usageTokens = usage.prompt_tokens + usage.completion_tokens;
    this.metrics.usage(call.tenant, usage);
  }

  /**
   * A response the Responses API made: on record for GET, resume, cancel,
   * DELETE and `previous_response_id` (its tenant's alone). Best effort: the
   * call itself has succeeded; a response left off the record is one those
   * cannot find (404), which the log line says.
   */
  private rememberResponse(responseId: string, call: CallState): Promise<void> {
    const record = {
      tenant: call.tenant,
      upstream: call.upstream,
      ...(call.operation === undefined ? {} : { operation: call.operation }),
    };
    return this.records.recordResponse(responseId, record, this.options.recordTtlMs).catch((err: unknown) => {
      this.logger.warn(`could not record response ${responseId}: ${err instanceof Error ? err.message : String(err)}`);
    });
  }

  /** The chunks of a whole answer until it ends, or until they pass `maxBytes` (the rest is still in `body`). */
  private async readHead(
    body: AsyncIterator<Buffer>,
    maxBytes: number,
    sent: number,
    stream: boolean,
  ): Promise<AnswerHead> {
    const chunks: Buffer[] = [];
    let size = 0;
    for (;;) {
      const step = await body.next();
      if (step.done) return { chunks, whole: true };
      if (size === 0) this.metrics.firstByteAt('upstream', stream, (performance.now() - sent) / 1000);
      chunks.push(step.value);
      size += step.value.length;
      if (size > maxBytes) return { chunks, whole: false };
    }
  }

  /**
   * A whole answer too large to hold, relayed as it arrives: the part read so
   * far, then each chunk at its caller's pace (the provider's socket waits
   * for it). It goes out as a streamed answer that cannot be stored: the
   * key is held while it is relayed (a duplicate gets 409, never a second
   * upstream call) and freed at its end. A break cuts the caller's
   * connection: a partial JSON body must not end like a complete 200.
   */
  private async *relayLargeAnswer(
    head: Buffer[],
    body: AsyncIterator<Buffer>,
    tenant: string,
    keyed: boolean,
    end: () => void,
    call: CallState,
  ): AsyncGenerator<Buffer> {
    let tail = Buffer.alloc(0);
    let settled = false;
    const keepTail = (chunk: Buffer): void => {
      tail =
        chunk.length >= USAGE_TAIL_BYTES
          ? Buffer.from(chunk.subarray(chunk.length - USAGE_TAIL_BYTES))
          : Buffer.concat([tail.subarray(Math.max(0, tail.length + chunk.length - USAGE_TAIL_BYTES)), chunk]);
    };
    try {
      for (const chunk of head) keepTail(chunk);
      // Handed over, not kept: the generator lives as long as the answer.
      // The provider's bytes as they came: no decoding, so nothing is replaced by U+FFFD.
      yield Buffer.concat(head.splice(0));
      for (;;) {
        const step = await body.next();
        if (step.done) break;
        keepTail(step.value);
        yield step.value;
      }
      settled = true;
      // Counted before end(): its limit's reservation settles there, to these tokens.
      this.countUsage(call, usageOfTail(tail.toString('utf8')));
    } catch (err) {
      settled = true;
      this.metrics.call(this.brokenBy(call));
      throw err;
    } finally {
      // Left before its end (its caller went away): counted as such, and the provider's socket let go.
      if (!settled) this.metrics.call('caller_gone');
      await body.return?.().catch(() => undefined);
      end();
    }
    call.answered = true;
    this.metrics.call(keyed ? 'new' : 'forwarded');
  }

  /**
   * The provider's events, each exactly as it sent it, counting the tokens
   * of its usage. A chat stream ends after `data: [DONE]`; a responses stream
   * when the provider closes it after its terminal event (`api.readEvent`).
   * A response id it names is recorded (GatewayRecords) before the event
   * that names it is relayed.
   * A stream that ends before either, breaks, carries an event that is not
   * the API's, or reports its own failure (`response.failed`, `error`: that
   * event is relayed first) throws, so the answer is not stored and its
   * callers get the broken-stream event.
   *
   * Relayed as bytes, not text: an event that is not UTF-8 reaches callers,
   * and the store, as the provider sent it, never with U+FFFD in its place.
   * Only the look at it (has it ended, does it carry usage) decodes it.
   */
  private async *relayEvents(
    api: GatewayApi,
    upstream: UpstreamResponse,
    tenant: string,
    keyed: boolean,
    sent: number,
    end: () => void,
    call: CallState,
  ): AsyncGenerator<Buffer> {
    let done: boolean;
    let terminal = false;
    let first = true;
    let remembered = false;
    // The last usage the stream carried: a provider that repeats running totals is counted once.
    let usage: TokenUsage | undefined;
    const events = sseEventBuffers(upstream.body, { maxEventBytes: GATEWAY_MAX_EVENT_BYTES })[Symbol.asyncIterator]();
    try {
      for (;;) {
        const step = await events.next();
        if (step.done) {
          // Closed by the provider: whole if its terminal event came.
          done = terminal;
          break;
        }
        // A subarray of the provider's chunk: while a caller or the store holds it, it keeps that whole chunk alive.
        const event = step.value;
        if (first) {
          first = false;
          this.metrics.firstByteAt('upstream', true, (performance.now() - sent) / 1000);
        }
        const text = event.toString('utf8');
        const counted = usageOf(text);
        if (counted) {
          usage = counted;
          call.usageTokens = counted.prompt_tokens + counted.completion_tokens;
        }
        const read = api.readEvent(text);
        // A compatible proxy that ends a responses stream with chat's `data: [DONE]` after its terminal event.
        const kind = terminal && read.kind === 'malformed' && isDoneEvent(text) ? 'more' : read.kind;
        // On record before the caller learns the id (the event that names it): a GET or a resume right after finds it.
        if (read.responseId !== undefined && !remembered) {
          remembered = true;
          await this.rememberResponse(read.responseId, call);
        }
        if (kind === 'malformed') throw new StreamBrokenError('the provider sent an event that is not the API’s');
        if (kind === 'failed') {
          yield event;
          throw new UpstreamFailedError('the provider reported the call failed');
        }
        if (kind === 'terminal') {
          terminal = true;
          call.answered = true;
        }
        if (kind === 'done') {
          done = true;
          call.answered = true;
          yield event;
          break;
        }
        yield event;
      }
    } catch (err) {
      this.metrics.call(err instanceof UpstreamFailedError ? 'upstream_failed' : this.brokenBy(call));
      await events.return?.().catch(() => undefined);
      end();
      throw err;
    } finally {
      // Billed whether or not the stream completed.
      if (usage) this.metrics.usage(tenant, usage);
    }
    if (!done) {
      end();
      this.metrics.call('broken_stream');
      throw new StreamBrokenError(`the provider’s stream ended before ${api.unfinished}`);
    }
    if (terminal) {
      // Read to its end already: the provider's connection is free.
      end();
      this.metrics.call(keyed ? 'new' : 'forwarded');
      return;
    }
    this.metrics.call(keyed ? 'new' : 'forwarded');
    // The answer is whole at [DONE]; what the provider sends after it (the
    // chunked body's end) is read in the background rather than the socket
    // destroyed, so the next call reuses the connection instead of paying a
    // new TLS handshake in its time to first token.
    void drainAfterDone(events, upstream.body).finally(end);
  }

  /** An error body, cut after `maxBytes` (and the chunk that passed it): the rest is not read, its socket let go. */
  private async readCut(upstream: UpstreamResponse, maxBytes: number, sent: number, stream: boolean): Promise<Buffer> {
    const body = upstream.body[Symbol.asyncIterator]();
    const head = await this.readHead(body, maxBytes, sent, stream);
    if (!head.whole) await body.return?.();
    return Buffer.concat(head.chunks);
  }

  /** A whole answer that stopped arriving: by the timeout, a shutdown, its caller leaving, or the provider. */
  private brokenOff(err: unknown, signal: AbortSignal, call: CallState): OpenAiErrorException {
    const ended = this.endedHere(call);
    if (ended) return ended;
    if ((signal.reason as { name?: unknown } | undefined)?.name === 'TimeoutError') {
      this.metrics.call('upstream_timeout');
      return new OpenAiErrorException(504, 'upstream_timeout', this.timeoutMessage(), upstreamHeader(call));
    }
    this.metrics.call('broken_stream');
    return new OpenAiErrorException(
      502,
      'upstream_broken',
      `The model provider’s answer broke off: ${(err as Error).message}. Nothing was stored.`,
      upstreamHeader(call),
    );
  }

  private unreachable(err: unknown, call: CallState): OpenAiErrorException {
    const ended = this.endedHere(call);
    if (ended) return ended;
    if (err instanceof UpstreamTimeoutError) {
      this.metrics.call('upstream_timeout');
      this.metrics.upstreamCall(call.upstream, 'timeout');
      return new OpenAiErrorException(504, 'upstream_timeout', this.timeoutMessage(), upstreamHeader(call));
    }
    this.metrics.call('upstream_unreachable');
    this.metrics.upstreamCall(call.upstream, 'unreachable');
    const why = err instanceof UpstreamUnreachableError ? err.message : 'the model provider is unreachable';
    // Sent once only: the provider may have run it, and a second send could bill it twice.
    const unknown =
      err instanceof UpstreamUnreachableError && err.requestSent
        ? ' The provider may have received the call; it was not sent again.'
        : '';
    return new OpenAiErrorException(
      502,
      'upstream_unreachable',
      `${why}.${unknown} Nothing was stored; retry with the same Idempotency-Key.`,
      upstreamHeader(call),
    );
  }

  /**
   * The call was ended on our side, not the provider's: its keyless caller left, or a shutdown cut it. Counted as
   * such.
   */
  private endedHere(call: CallState): OpenAiErrorException | undefined {
    if (call.gone.aborted) {
      this.metrics.call('caller_gone');
      return new OpenAiErrorException(499, 'caller_gone', 'The caller went away.');
    }
    if (this.calls.signal.aborted) {
      this.metrics.call('cut_by_shutdown');
      return shuttingDown();
    }
    return undefined;
  }

  /** Why an answer already under way stopped: its keyless caller left, a shutdown, the time limit, or the provider. */
  private brokenBy(call: CallState): 'caller_gone' | 'cut_by_shutdown' | 'upstream_timeout' | 'broken_stream' {
    if (call.gone.aborted) return 'caller_gone';
    if (this.calls.signal.aborted) return 'cut_by_shutdown';
    return call.timeout.aborted ? 'upstream_timeout' : 'broken_stream';
  }

  private timeoutMessage(): string {
    return `The model provider did not answer within ${this.options.timeoutMs / 1000} s. Nothing was stored; retry with the same Idempotency-Key.`;
  }
}
