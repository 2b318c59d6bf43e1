import { BadRequestException, ConflictException, HttpException, HttpStatus, NotFoundException } from '@nestjs/common';
import { ProblemException, ProblemTypes } from '@app/problem';
import { Readable } from 'node:stream';
import { of } from 'rxjs';
import { IdempotencyKeyReusedException, IdempotencyOutcomeUnknownException } from './idempotency.errors';
import type { IdempotencyErrorFormat } from './idempotent.decorator';
import {
  type HandlerOutcome,
  jsonAnswer,
  pickHeaders,
  type SettleDecision,
  settleDecision,
  type SettleRoute,
  storesByDefault,
} from './settle-decision';

const LIMIT = 256;
const JSON_TYPE = 'application/json; charset=utf-8';
const PROBLEM_TYPE = 'application/problem+json';

/** A route's error format: its own media type, and it renders what it is given with the error's own status. */
const customErrors: IdempotencyErrorFormat = {
  render: (err) => ({
    status: err instanceof HttpException ? err.getStatus() : 500,
    headers: { 'Content-Type': 'application/vnd.shop.error+json', 'Set-Cookie': 'session=1', ETag: '"e1"' },
    body: JSON.stringify({ error: (err as Error).message }),
  }),
  brokenStreamFrame: () => 'event: error\n\n',
};
/** One that answers every error as a 503: a status the route does not store. */
const unavailableErrors: IdempotencyErrorFormat = {
  render: () => ({ status: 503, headers: {}, body: '{}' }),
  brokenStreamFrame: () => '',
};

const route = (overrides: Partial<SettleRoute> = {}): SettleRoute => ({
  storesStatus: storesByDefault,
  maxStoredBodyBytes: LIMIT,
  errors: undefined,
  replayHeaders: new Set(['location', 'content-type', 'etag']),
  ...overrides,
});
const plain = route();

const returned = (
  body: unknown,
  status = 200,
  headers: Record<string, string | string[] | number> = {},
  headersSent = false,
): HandlerOutcome => ({
  kind: 'returned',
  body,
  status,
  headers,
  headersSent,
});
const threw = (error: unknown, more: { rejectedByPipes?: boolean; headersSent?: boolean } = {}): HandlerOutcome => ({
  kind: 'threw',
  error,
  rejectedByPipes: more.rejectedByPipes ?? false,
  headersSent: more.headersSent ?? false,
});
const web = (status: number, text: string | undefined, headers: Record<string, string> = {}): HandlerOutcome => ({
  kind: 'web-response',
  status,
  headers,
  ...(text === undefined ? {} : { bytes: Buffer.from(text) }),
});

const store = (status: number, headers: Record<string, string>, body: string): SettleDecision => ({
  action: 'store',
  response: { status, headers, body: Buffer.from(body) },
});
const released = (reason: Extract<SettleDecision, { action: 'release' }>['reason']): SettleDecision => ({
  action: 'release',
  reason,
});
const releasedFor = (status: number): SettleDecision => released({ kind: 'status', status });
const abandoned: SettleDecision = { action: 'abandon' };
const problemOf = (status: number, title: string, detail: string, type: string): string =>
  JSON.stringify({ type, title, status, detail });

const cycle: Record<string, unknown> = {};
cycle.self = cycle;
const big = 'x'.repeat(LIMIT + 1);

describe('settleDecision', () => {
  it.each<[string, HandlerOutcome, SettleRoute, SettleDecision]>([
    // ── the handler returned a value ──
    [
      'an object: stored as JSON, allowlisted headers only',
      returned({ id: 1 }, 201, { Location: '/orders/1', 'Set-Cookie': 'a=1', 'X-Trace': 't' }),
      plain,
      store(201, { location: '/orders/1', 'content-type': JSON_TYPE }, '{"id":1}'),
    ],
    [
      'a string: stored as Express sends it',
      returned('done'),
      plain,
      store(200, { 'content-type': 'text/html; charset=utf-8' }, 'done'),
    ],
    [
      "a handler's other charset: Express sends the string as UTF-8 and says so, and so is it stored",
      returned('Grüße', 200, { 'content-type': 'text/plain; charset=iso-8859-1' }),
      plain,
      store(200, { 'content-type': 'text/plain; charset=utf-8' }, 'Grüße'),
    ],
    [
      'no body: Express adds no charset, and none is stored',
      returned(undefined, 204, { 'content-type': 'text/plain; charset=iso-8859-1' }),
      plain,
      store(204, { 'content-type': 'text/plain; charset=iso-8859-1' }, ''),
    ],
    ['a number', returned(42), plain, store(200, { 'content-type': 'text/html; charset=utf-8' }, '42')],
    ['nothing (204)', returned(undefined, 204), plain, store(204, { 'content-type': 'text/plain; charset=utf-8' }, '')],
    [
      'the content type the handler set is kept, its charset utf-8 as Express sends it; header arrays as one string',
      returned({ a: 1 }, 200, { 'content-type': 'application/vnd.x+json', etag: ['"a"', '"b"'], 'content-length': 7 }),
      route({ replayHeaders: new Set(['content-type', 'etag', 'content-length']) }),
      // Express sends a string body as UTF-8 and adds the charset to the type: stored as sent.
      store(
        200,
        { 'content-type': 'application/vnd.x+json; charset=utf-8', etag: '"a", "b"', 'content-length': '7' },
        '{"a":1}',
      ),
    ],
    [
      'exactly maxStoredBodyBytes: stored',
      returned('x'.repeat(LIMIT)),
      plain,
      store(200, { 'content-type': 'text/html; charset=utf-8' }, 'x'.repeat(LIMIT)),
    ],
    [
      'over maxStoredBodyBytes: released',
      returned(big),
      plain,
      released({ kind: 'too-large', size: LIMIT + 1, limit: LIMIT }),
    ],
    [
      'size in bytes, not characters',
      returned('é'.repeat(LIMIT / 2 + 1)),
      plain,
      released({ kind: 'too-large', size: LIMIT + 2, limit: LIMIT }),
    ],
    [
      'a BigInt JSON cannot hold: released, its error the answer',
      returned({ n: 1n }),
      plain,
      released({ kind: 'unserialisable', error: expect.any(TypeError) }),
    ],
    [
      'a cycle: released, its error the answer',
      returned(cycle),
      plain,
      released({ kind: 'unserialisable', error: expect.any(TypeError) }),
    ],
    ['a Buffer cannot be stored', returned(Buffer.from('x')), plain, released({ kind: 'unstorable', type: 'Buffer' })],
    ['an Observable cannot be stored', returned(of(1)), plain, released({ kind: 'unstorable', type: 'Observable' })],
    [
      'a stream cannot be stored',
      returned(Readable.from(['x'])),
      plain,
      released({ kind: 'unstorable', type: 'Readable' }),
    ],
    [
      'the handler sent its answer itself (@Res())',
      returned({ id: 1 }, 200, {}, true),
      plain,
      released({ kind: 'headers-sent' }),
    ],
    ['a 5xx status it set', returned({ retry: true }, 503), plain, releasedFor(503)],
    ['a transient 4xx it set (429)', returned({}, 429), plain, releasedFor(429)],
    [
      'a 4xx it set, stored',
      returned({ error: 'no' }, 404),
      plain,
      store(404, { 'content-type': JSON_TYPE }, '{"error":"no"}'),
    ],

    // ── the handler returned a web Response ──
    [
      'a web Response: its text stored, its content type exactly',
      web(201, 'ok', { 'content-type': 'text/plain', location: '/a', 'set-cookie': 'a=1' }),
      plain,
      store(201, { location: '/a', 'content-type': 'text/plain' }, 'ok'),
    ],
    [
      'a web Response: its content type even if the allowlist leaves it out',
      web(200, '{}', { 'content-type': 'application/json' }),
      route({ replayHeaders: new Set() }),
      store(200, { 'content-type': 'application/json' }, '{}'),
    ],
    [
      'a web Response over maxStoredBodyBytes',
      web(200, big),
      plain,
      released({ kind: 'too-large', size: LIMIT + 1, limit: LIMIT }),
    ],
    ['a web Response of a status not stored (sent unread)', web(503, undefined), plain, releasedFor(503)],
    [
      'a web Response whose body cannot be read',
      { kind: 'web-response-unreadable', error: new Error('aborted') },
      plain,
      released({ kind: 'unreadable', error: new Error('aborted') }),
    ],

    // ── the handler threw ──
    [
      'a business 4xx: stored as problem+json',
      threw(new NotFoundException('no such order')),
      plain,
      store(404, { 'content-type': PROBLEM_TYPE }, problemOf(404, 'Not Found', 'no such order', ProblemTypes.notFound)),
    ],
    [
      'a ProblemException: its document, its allowlisted headers',
      threw(
        new ProblemException({
          type: 'urn:t',
          title: 'Card declined',
          status: 402,
          detail: 'd',
          headers: { ETag: '"p"', 'Set-Cookie': 'x' },
        }),
      ),
      plain,
      store(402, { etag: '"p"', 'content-type': PROBLEM_TYPE }, problemOf(402, 'Card declined', 'd', 'urn:t')),
    ],
    [
      'a business 4xx on a route with its own errors: rendered by it, its content type kept',
      threw(new NotFoundException('gone')),
      route({ errors: customErrors }),
      store(404, { etag: '"e1"', 'content-type': 'application/vnd.shop.error+json' }, '{"error":"gone"}'),
    ],
    [
      'a business 4xx its renderer answers with a status not stored',
      threw(new NotFoundException()),
      route({ errors: unavailableErrors }),
      releasedFor(503),
    ],
    [
      'a business 4xx over maxStoredBodyBytes',
      threw(new BadRequestException(big)),
      plain,
      released({ kind: 'too-large', size: expect.any(Number), limit: LIMIT }),
    ],
    ['408 Request Timeout', threw(new HttpException('slow', HttpStatus.REQUEST_TIMEOUT)), plain, releasedFor(408)],
    ['409 Conflict', threw(new ConflictException()), plain, releasedFor(409)],
    ['425 Too Early', threw(new HttpException('early', 425)), plain, releasedFor(425)],
    [
      '429 Too Many Requests',
      threw(new HttpException('slow down', HttpStatus.TOO_MANY_REQUESTS)),
      plain,
      releasedFor(429),
    ],
    [
      '429 even with its own errors',
      threw(new HttpException('slow down', 429)),
      route({ errors: customErrors }),
      releasedFor(429),
    ],
    ['a 5xx HttpException', threw(new HttpException('down', HttpStatus.BAD_GATEWAY)), plain, releasedFor(502)],
    ['any other error (a 500)', threw(new Error('bug')), plain, releasedFor(500)],
    ['a thrown 3xx', threw(new HttpException('moved', 302)), plain, releasedFor(302)],
    [
      'rejected by the pipes: the handler never ran',
      threw(new BadRequestException('bad'), { rejectedByPipes: true }),
      plain,
      released({ kind: 'rejected-by-pipes' }),
    ],
    [
      'rejected by the pipes, whatever the error',
      threw(new IdempotencyOutcomeUnknownException('?'), { rejectedByPipes: true }),
      plain,
      released({ kind: 'rejected-by-pipes' }),
    ],
    [
      'the outcome is unknown: abandoned for a recovery',
      threw(new IdempotencyOutcomeUnknownException('provider timed out')),
      plain,
      abandoned,
    ],
    [
      'the outcome is unknown, even after headers went out',
      threw(new IdempotencyOutcomeUnknownException('?'), { headersSent: true }),
      plain,
      abandoned,
    ],
    [
      'the key was reused with another body: not stored',
      threw(new IdempotencyKeyReusedException()),
      plain,
      released({ kind: 'key-reused' }),
    ],
    [
      'a 4xx after the handler sent its answer itself',
      threw(new NotFoundException(), { headersSent: true }),
      plain,
      released({ kind: 'headers-sent' }),
    ],

    // ── the route's own storesStatus ──
    [
      'storesStatus: a 409 it stores',
      threw(new ConflictException('taken')),
      route({ storesStatus: () => true }),
      store(409, { 'content-type': PROBLEM_TYPE }, problemOf(409, 'Conflict', 'taken', ProblemTypes.http(409))),
    ],
    [
      'storesStatus: a 404 it does not store',
      threw(new NotFoundException()),
      route({ storesStatus: (s) => s < 300 }),
      releasedFor(404),
    ],
    [
      'storesStatus: a success it does not store',
      returned({ id: 1 }, 202),
      route({ storesStatus: (s) => s !== 202 }),
      releasedFor(202),
    ],
    [
      'storesStatus: a 5xx thrown is never stored',
      threw(new Error('bug')),
      route({ storesStatus: () => true }),
      releasedFor(500),
    ],
    [
      'storesStatus: a 5xx returned it stores',
      returned({ partial: true }, 500),
      route({ storesStatus: () => true }),
      store(500, { 'content-type': JSON_TYPE }, '{"partial":true}'),
    ],

    // ── the route's recovery ──
    [
      'recovered an answer: stored',
      { kind: 'recovered', response: { status: 201, headers: {}, body: Buffer.from('{}') } },
      plain,
      store(201, {}, '{}'),
    ],
    [
      'recovered an answer of a status not stored: abandoned',
      { kind: 'recovered', response: { status: 503, headers: {}, body: Buffer.from('{}') } },
      plain,
      abandoned,
    ],
    [
      'recovered an answer over maxStoredBodyBytes',
      { kind: 'recovered', response: { status: 200, headers: {}, body: Buffer.from(big) } },
      plain,
      released({ kind: 'too-large', size: LIMIT + 1, limit: LIMIT }),
    ],
    [
      'the recovery cannot know yet',
      { kind: 'recovery-failed', error: new IdempotencyOutcomeUnknownException('?') },
      plain,
      abandoned,
    ],
    ['the recovery failed otherwise', { kind: 'recovery-failed', error: new Error('db down') }, plain, abandoned],
    [
      'the recovery found the key reused',
      { kind: 'recovery-failed', error: new IdempotencyKeyReusedException() },
      plain,
      released({ kind: 'key-reused' }),
    ],
  ])('%s', (_, outcome, settings, expected) => {
    expect(settleDecision(outcome, settings)).toEqual(expected);
  });

  it('asks the route only what it needs: whether it stores the error’s status, and its renderer once', () => {
    const render = jest.fn(customErrors.render);
    const settings = route({ errors: { ...customErrors, render }, storesStatus: jest.fn(storesByDefault) });
    settleDecision(threw(new NotFoundException()), settings);
    expect(render).toHaveBeenCalledTimes(1);
    expect(settings.storesStatus).toHaveBeenCalledWith(404);
  });
});

describe('storesByDefault', () => {
  it.each([
    [200, true],
    [201, true],
    [302, true],
    [400, true],
    [404, true],
    [422, true],
    [408, false],
    [409, false],
    [425, false],
    [429, false],
    [500, false],
    [503, false],
  ])('%d → %s', (status, stored) => {
    expect(storesByDefault(status)).toBe(stored);
  });
});

describe('pickHeaders and jsonAnswer', () => {
  const allow = new Set(['location', 'etag']);

  it('keeps the allowlisted headers, lower case, one string each', () => {
    expect(pickHeaders({ Location: '/a', ETAG: ['"1"', '"2"'], 'Set-Cookie': 'x', etc: undefined }, allow)).toEqual({
      location: '/a',
      etag: '"1", "2"',
    });
  });

  it('a recovered answer as stored: JSON, allowlisted headers, its content type', () => {
    expect(jsonAnswer({ status: 200, body: { ok: true }, headers: { Location: '/r', 'X-No': '1' } }, allow)).toEqual({
      status: 200,
      headers: { location: '/r', 'content-type': JSON_TYPE },
      body: Buffer.from('{"ok":true}'),
    });
    expect(jsonAnswer({ status: 204, body: undefined }, allow).body).toEqual(Buffer.alloc(0));
  });

  // The body is JSON.stringify's, stored as UTF-8: a JSON type the answer names is kept with that charset.
  it.each<[string, Record<string, string> | undefined, string]>([
    ['no Content-Type', undefined, JSON_TYPE],
    ['problem+json kept', { 'content-type': PROBLEM_TYPE }, `${PROBLEM_TYPE}; charset=utf-8`],
    ['Content-Type in another case', { 'Content-Type': PROBLEM_TYPE }, `${PROBLEM_TYPE}; charset=utf-8`],
    [
      'CONTENT-TYPE upper case',
      { 'CONTENT-TYPE': 'application/vnd.shop+json' },
      'application/vnd.shop+json; charset=utf-8',
    ],
    ['a media type in capitals', { 'content-type': 'Application/Problem+JSON' }, `${PROBLEM_TYPE}; charset=utf-8`],
    ['text/plain replaced', { 'content-type': 'text/plain' }, JSON_TYPE],
    ['a type merely starting like JSON replaced', { 'content-type': 'application/jsonx' }, JSON_TYPE],
    ['latin1 charset normalised', { 'content-type': 'application/json; charset=latin1' }, JSON_TYPE],
    [
      'charset normalised, other parameters kept',
      { 'content-type': 'application/problem+json; charset=ISO-8859-1; profile="x"' },
      `${PROBLEM_TYPE}; charset=utf-8; profile=x`,
    ],
    ['an unparseable type replaced', { 'content-type': 'application/json; ;;=' }, JSON_TYPE],
  ])('content type: %s', (_, headers, expected) => {
    expect(jsonAnswer({ status: 422, body: { a: 'é' }, headers }, allow).headers).toEqual({ 'content-type': expected });
  });
});
