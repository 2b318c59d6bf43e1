import { Inject, Injectable } from '@nestjs/common';
import {
  type FrameEvent,
  type FramesRef,
  IdempotencyStore,
  InjectIdempotencyStore,
  onceClosed,
} from '@app/idempotency';
import { responsesEventOf, sseDataOf, type UpstreamPath, type UpstreamResponse, UpstreamTimeoutError } from '@app/llm';
import type { Response as ExpressResponse } from 'express';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { GATEWAY_UPSTREAM_HEADER } from './chat-completions.relay';
import { GATEWAY_RECORDS, type GatewayRecords, type ResponseRecord } from './gateway-records';
import { type GatewayUpstream, GatewayUpstreams } from './gateway-upstreams';
import { GATEWAY_OPTIONS, type GatewayOptions } from './gateway.options';
import { OpenAiErrorException, RESPONSES_BROKEN_STREAM_EVENT } from './openai-errors';

/** A response's own routes, as the caller asked: read it, resume its stream, cancel it, delete it. */
export type ResponseAction =
  | { readonly kind: 'get' }
  | { readonly kind: 'input_items'; readonly query: string }
  | { readonly kind: 'stream'; readonly startingAfter: number | undefined }
  | { readonly kind: 'cancel' }
  | { readonly kind: 'delete' };

/** OpenAI's response ids (`resp_` and hex); room for other providers' ids, never a path or a query. */
const RESPONSE_ID = /^[A-Za-z0-9_-]{1,256}$/;

function storeUnavailable(err: unknown): OpenAiErrorException {
  return new OpenAiErrorException(
    503,
    'idempotency_store_unavailable',
    `The gateway's records cannot be read right now (${err instanceof Error ? err.message : String(err)}). Retry.`,
    { 'Retry-After': '1' },
  );
}

/** The statuses after which a response changes no more: a stored one is then its final word. */
const FINAL_STATUSES = new Set(['completed', 'incomplete', 'failed', 'cancelled']);

/**
 * Whether a stored whole answer is this response, in a state it will not
 * leave: a `background: true` response is stored `queued` and goes on at its
 * upstream, which alone can tell how it stands now.
 */
function isFinalResponse(body: Buffer, responseId: string): boolean {
  try {
    const response = JSON.parse(body.toString('utf8')) as { id?: unknown; status?: unknown } | null;
    return response?.id === responseId && typeof response.status === 'string' && FINAL_STATUSES.has(response.status);
  } catch {
    return false;
  }
}

function notFound(): OpenAiErrorException {
  return new OpenAiErrorException(
    404,
    'response_not_found',
    'No response with this id was made through this gateway for you.',
  );
}

/**
 * GET /v1/responses/<id> (whole, or its stream resumed after a sequence
 * number), POST /v1/responses/<id>/cancel and DELETE /v1/responses/<id>: for
 * the tenant that made the response only (tenants share the provider's
 * account, so a response id is never taken on a caller's word). A keyed
 * call's response is read from its idempotency record, a stream from its
 * frames, live while it still runs; anything else goes to the upstream that
 * served it.
 */
@Injectable()
export class ResponsesLookup {
  constructor(
    @Inject(GATEWAY_RECORDS) private readonly records: GatewayRecords,
    @InjectIdempotencyStore() private readonly store: IdempotencyStore,
    private readonly upstreams: GatewayUpstreams,
    @Inject(GATEWAY_OPTIONS) private readonly options: GatewayOptions,
  ) {}

  /** The record of a response of this tenant's, or 404 (unknown, expired, or another tenant's: the same answer). */
  async find(tenant: string, responseId: string): Promise<ResponseRecord> {
    if (!RESPONSE_ID.test(responseId)) throw notFound();
    const record = await this.records.response(responseId).catch((err: unknown) => {
      throw storeUnavailable(err);
    });
    if (record === undefined || record.tenant !== tenant) throw notFound();
    return record;
  }

  async answer(tenant: string, responseId: string, action: ResponseAction, res: ExpressResponse): Promise<void> {
    const record = await this.find(tenant, responseId);
    res.setHeader(GATEWAY_UPSTREAM_HEADER, record.upstream);
    if (action.kind === 'get' || action.kind === 'stream') {
      const recorded = await this.recorded(record);
      if (action.kind === 'get' && recorded?.kind === 'whole' && isFinalResponse(recorded.body, responseId)) {
        res.status(recorded.status).type('application/json').end(recorded.body);
        return;
      }
      if (recorded?.kind === 'frames') {
        if (action.kind === 'stream' && (await this.resume(recorded.frames, responseId, action.startingAfter, res)))
          return;
        // A stream still running has no final word yet: its upstream has the response as it stands.
        const whole =
          action.kind === 'get' && !recorded.live ? await this.finalResponse(recorded.frames, responseId) : undefined;
        if (whole !== undefined) {
          res.status(200).type('application/json').end(whole);
          return;
        }
      }
    }
    await this.forward(record, responseId, action, res);
  }

  /**
   * The keyed call's answer in its idempotency record: a whole one, or its
   * frames (`live`: still coming). The record may hold another response than
   * the one asked for (this one's call broke, and a retry under the same key
   * made another): its readers check the id it carries.
   */
  private async recorded(
    record: ResponseRecord,
  ): Promise<
    { kind: 'whole'; status: number; body: Buffer } | { kind: 'frames'; frames: FramesRef; live: boolean } | undefined
  > {
    if (record.operation === undefined || !this.store.peek) return undefined;
    const found = await this.store.peek(record.operation).catch((err: unknown) => {
      throw storeUnavailable(err);
    });
    if (found.outcome === 'completed') {
      if (found.response.frames) return { kind: 'frames', frames: found.response.frames, live: false };
      return { kind: 'whole', status: found.response.status, body: found.response.body };
    }
    if (found.outcome === 'in-progress' && found.frames) return { kind: 'frames', frames: found.frames, live: true };
    return undefined;
  }

  /** The frames of a stream, from the first, then live; ends with its end (completed, or not). */
  private async *follow(frames: FramesRef, signal: AbortSignal): AsyncGenerator<FrameEvent> {
    const log = this.store.frames;
    if (!log) return;
    yield* log.follow(frames, signal);
  }

  /** A completed stream's last word: the response of its terminal event, as JSON (if it is the response asked for). */
  private async finalResponse(frames: FramesRef, responseId: string): Promise<string | undefined> {
    // A completed log is read to its end at once; the limit only bounds a store that stalls.
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), this.options.timeoutMs);
    try {
      return await this.terminalResponse(frames, responseId, stop.signal);
    } finally {
      clearTimeout(timer);
    }
  }

  private async terminalResponse(
    frames: FramesRef,
    responseId: string,
    stop: AbortSignal,
  ): Promise<string | undefined> {
    for await (const event of this.follow(frames, stop)) {
      if (event.kind === 'end' || event.kind === 'gone') break;
      if (event.kind !== 'frame') continue;
      const text = event.data.toString('utf8');
      const read = responsesEventOf(text);
      if (read.responseId !== undefined && read.responseId !== responseId) return undefined;
      if (read.kind !== 'terminal') continue;
      try {
        const response = (JSON.parse(sseDataOf(text) ?? '') as { response?: unknown }).response;
        return response === undefined ? undefined : JSON.stringify(response);
      } catch {
        return undefined;
      }
    }
    return undefined;
  }

  /**
   * The stream's events with a sequence number above `startingAfter` (all
   * without it), from the record, then live while the call runs: each as it
   * was relayed. One that ends without its terminal event ends with the
   * Responses API's error event, as its first caller's did. False, with
   * nothing written, when the record holds another response (a retry's):
   * this one is then its upstream's to tell.
   */
  private async resume(
    frames: FramesRef,
    responseId: string,
    startingAfter: number | undefined,
    res: ExpressResponse,
  ): Promise<boolean> {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), this.options.timeoutMs);
    onceClosed(res, () => stop.abort());
    const events = this.follow(frames, stop.signal)[Symbol.asyncIterator]();
    // Up to the first event that names a response: whose stream this is.
    const before: Buffer[] = [];
    let first: IteratorResult<FrameEvent>;
    for (;;) {
      first = await events.next().catch(() => ({ done: true, value: undefined }) as const);
      if (first.done) break;
      if (first.value.kind === 'head') continue;
      if (first.value.kind !== 'frame') break;
      before.push(first.value.data);
      const named = responsesEventOf(first.value.data.toString('utf8')).responseId;
      if (named === undefined) continue;
      if (named === responseId) break;
      clearTimeout(timer);
      stop.abort();
      await events.return?.(undefined);
      return false;
    }
    async function* relayed(): AsyncGenerator<Buffer> {
      let whole = false;
      try {
        const pick = (data: Buffer): boolean => {
          const seq = responsesEventOf(data.toString('utf8')).sequenceNumber;
          return startingAfter === undefined || seq === undefined || seq > startingAfter;
        };
        for (const data of before) if (pick(data)) yield data;
        let step = first;
        // The first event after the ones read: an end, or more of the log.
        while (!step.done) {
          const event = step.value;
          if (event.kind === 'end') {
            whole = event.outcome === 'completed';
            break;
          }
          if (event.kind === 'gone') break;
          if (event.kind === 'frame' && step !== first) {
            // A log is one attempt's, so one response's: no other id comes after this one's.
            if (pick(event.data)) yield event.data;
          }
          step = await events.next();
        }
      } catch {
        whole = false;
      } finally {
        clearTimeout(timer);
        stop.abort();
        await events.return?.(undefined).catch(() => undefined);
      }
      if (!whole) yield Buffer.from(RESPONSES_BROKEN_STREAM_EVENT);
    }
    res.status(200).setHeader('content-type', 'text/event-stream; charset=utf-8');
    res.setHeader('cache-control', 'no-cache');
    // pipeline: the caller's pace, and the log let go when the caller goes away.
    await pipeline(Readable.from(relayed()), res).catch(() => undefined);
    return true;
  }

  /** To the upstream that served it, as the caller asked; its answer relayed as it comes. */
  private async forward(
    record: ResponseRecord,
    responseId: string,
    action: ResponseAction,
    res: ExpressResponse,
  ): Promise<void> {
    const upstream = this.upstreams.named(record.upstream);
    if (upstream === undefined)
      throw new OpenAiErrorException(
        404,
        'response_not_found',
        `The upstream that made this response (${record.upstream}) is no longer one of GATEWAY_UPSTREAMS.`,
      );
    const stop = new AbortController();
    onceClosed(res, () => stop.abort(new Error('the caller went away')));
    const timer = setTimeout(
      () => stop.abort(new DOMException('The call ran out of time', 'TimeoutError')),
      this.options.timeoutMs,
    );
    try {
      const answer = await this.send(upstream, responseId, action, stop.signal);
      res.status(answer.status);
      for (const [name, value] of Object.entries(answer.headers))
        if (name !== 'x-request-id') res.setHeader(name, value);
      // pipeline: the caller's pace; a caller gone, or a body that breaks, ends the other side too.
      await pipeline(answer.body, res);
      if (action.kind === 'delete' && answer.status >= 200 && answer.status < 300)
        await this.records.forgetResponse(responseId).catch(() => undefined);
    } catch (err) {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (err instanceof UpstreamTimeoutError)
        throw new OpenAiErrorException(504, 'upstream_timeout', 'The upstream did not answer in time.');
      throw new OpenAiErrorException(
        502,
        'upstream_unreachable',
        `The upstream that made this response could not be reached: ${err instanceof Error ? err.message : String(err)}`,
      );
    } finally {
      clearTimeout(timer);
    }
  }

  private send(
    upstream: GatewayUpstream,
    responseId: string,
    action: ResponseAction,
    signal: AbortSignal,
  ): Promise<UpstreamResponse> {
    const id = encodeURIComponent(responseId);
    switch (action.kind) {
      case 'get':
        return upstream.client.send({ method: 'GET', path: `responses/${id}`, signal });
      case 'stream': {
        const after = action.startingAfter === undefined ? '' : `&starting_after=${action.startingAfter}`;
        const path: UpstreamPath = `responses/${id}?stream=true${after}`;
        return upstream.client.send({ method: 'GET', path, signal });
      }
      case 'input_items':
        return upstream.client.send({ method: 'GET', path: `responses/${id}/input_items${action.query}`, signal });
      case 'cancel':
        return upstream.client.send({
          method: 'POST',
          path: `responses/${id}/cancel`,
          body: Buffer.from('{}'),
          signal,
        });
      case 'delete':
        return upstream.client.send({ method: 'DELETE', path: `responses/${id}`, signal });
    }
  }
}
