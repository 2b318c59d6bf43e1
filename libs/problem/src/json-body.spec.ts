import type { NestExpressApplication } from '@nestjs/platform-express';
import { createServer, type IncomingMessage, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { bodyRejectionOf } from './body-rejection';
import { type JsonBodyReader, plainJsonLength, rawBodyOf, useJsonBody } from './json-body';

/**
 * useJsonBody's reader as the gateway's fast path calls it: the usual body
 * read without body-parser's generic path, anything else left to body-parser
 * (test/api/gateway-fast-path.e2e-spec.ts holds the two alike, answer for
 * answer). Real requests over a real socket to a server that calls it.
 */
describe('useJsonBody: the reader', () => {
  const LIMIT = 64;
  const LARGER = 256;
  const listeners = ['data', 'end', 'error', 'aborted', 'close'] as const;
  let server: Server;
  let port: number;
  let reader: JsonBodyReader;
  /** Told of each request as it arrives, and once it is read (with the listeners it left on the request). */
  let arrived: (req: IncomingMessage) => void;
  let seen: (req: IncomingMessage, left: number[]) => void;

  beforeAll(async () => {
    const app = { use: () => undefined, useGlobalGuards: () => undefined } as unknown as NestExpressApplication;
    reader = useJsonBody(app, {
      maxBytes: LIMIT,
      maxDepth: 8,
      maxMembers: 100,
      maxValues: 1000,
      largerBodies: [{ path: '/larger', maxBytes: LARGER, when: (req) => req.headers['x-larger'] === 'yes' }],
    });
    server = createServer((req, res) => {
      arrived(req);
      const plain = plainJsonLength(req);
      const before = listeners.map((event) => req.listenerCount(event));
      void reader.read(req, res, req.url!).then(() => {
        const left = listeners.map((event, i) => req.listenerCount(event) - before[i]);
        seen(req, left);
        const body = (req as { body?: unknown }).body;
        const raw = rawBodyOf(req);
        res.end(
          JSON.stringify({ plain, body, raw: raw?.toString('latin1'), rejected: bodyRejectionOf(req)?.status, left }),
        );
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
  beforeEach(() => {
    arrived = () => undefined;
    seen = () => undefined;
  });

  const post = (
    path: string,
    body: Buffer | string,
    headers: Record<string, string> = {},
  ): Promise<{ plain?: number; body?: unknown; raw?: string; rejected?: number; left: number[] }> =>
    new Promise((resolve, reject) => {
      const bytes = Buffer.from(body);
      const req = request(
        {
          port,
          path,
          method: 'POST',
          headers: { 'content-type': 'application/json', 'content-length': String(bytes.length), ...headers },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => (text += chunk));
          res.on('end', () => resolve(JSON.parse(text) as never));
        },
      );
      req.on('error', reject);
      req.end(bytes);
    });

  it('reads the usual body itself, to what body-parser gives, and leaves no listener behind', async () => {
    const bom = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"a":[1,2]}')]);
    for (const [headers, body] of [
      [{}, '{"a":[1,2]}'],
      [{ 'content-type': 'Application/JSON; charset=UTF-8' }, ' \n{"a":[1,2]}'],
      [{ 'content-type': 'application/json;charset=utf-8' }, bom],
    ] as const) {
      const answer = await post('/', body, headers);
      expect(answer).toEqual({
        plain: Buffer.from(body).length,
        body: { a: [1, 2] },
        // The bytes sent on: without the byte-order mark, which the parser drops.
        raw: Buffer.from(body)
          .subarray(Buffer.from(body)[0] === 0xef ? 3 : 0)
          .toString('latin1'),
        left: [0, 0, 0, 0, 0],
      });
    }
  });

  it('leaves every other body to body-parser, with the same result', async () => {
    for (const headers of <Record<string, string>[]>[
      { 'content-type': 'application/json; charset="utf-8"' },
      { 'content-type': 'application/vnd.api+json' },
      { 'content-encoding': 'identity' },
    ]) {
      const answer = await post('/', '{"a":1}', headers);
      expect({ headers, plain: answer.plain }).toEqual({ headers, plain: undefined });
      expect(answer.rejected ?? answer.body).toEqual(
        headers['content-type'] === 'application/vnd.api+json' ? undefined : { a: 1 },
      );
    }
    const empty = await post('/', '');
    expect(empty).toMatchObject({ body: {}, left: [0, 0, 0, 0, 0] });
    expect(empty.plain).toBeUndefined();
  });

  it('takes a body of exactly the limit, and refuses one byte more, per route and caller', async () => {
    const sized = (n: number) => `{"a":"${'x'.repeat(n - 8)}"}`;
    expect(sized(LIMIT)).toHaveLength(LIMIT);
    expect(await post('/', sized(LIMIT))).toMatchObject({ plain: LIMIT, body: { a: 'x'.repeat(LIMIT - 8) } });
    expect(await post('/', sized(LIMIT + 1))).toMatchObject({ plain: LIMIT + 1, rejected: 413 });
    // The larger route's limit, for the callers it accepts only.
    expect(await post('/larger', sized(LARGER), { 'x-larger': 'yes' })).toMatchObject({ plain: LARGER });
    expect((await post('/larger', sized(LARGER), { 'x-larger': 'yes' })).rejected).toBeUndefined();
    expect(await post('/larger', sized(LARGER + 1), { 'x-larger': 'yes' })).toMatchObject({ rejected: 413 });
    expect(await post('/larger', sized(LIMIT + 1))).toMatchObject({ rejected: 413 });
  });

  it('refuses what body-parser refuses: not JSON, not an object or an array, past the structural limits', async () => {
    for (const [body, status] of [
      ['{"a":', 400],
      ['5', 400],
      [' "text"', 400],
      ['[[[[[[[[[1]]]]]]]]]', 400],
      ['{"a":1,"a":2}', 400],
    ] as const) {
      const answer = await post('/', body);
      expect({ body, plain: answer.plain, rejected: answer.rejected, left: answer.left }).toEqual({
        body,
        plain: body.length,
        rejected: status,
        left: [0, 0, 0, 0, 0],
      });
    }
  });

  it('refuses a body cut off by its caller, and leaves no listener behind', async () => {
    const done = new Promise<{ req: IncomingMessage; left: number[] }>(
      (resolve) => (seen = (req, left) => resolve({ req, left })),
    );
    const started = new Promise<IncomingMessage>((resolve) => (arrived = resolve));
    const req = request({
      port,
      path: '/',
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': '40' },
    });
    req.on('error', () => undefined);
    req.write('{"a":"only part of it');
    // Once the server is reading the request, the caller goes away before the rest of its body.
    await started;
    req.destroy();
    const { req: served, left } = await done;
    expect(bodyRejectionOf(served)?.status).toBe(400);
    expect((served as { body?: unknown }).body).toBeUndefined();
    expect(left).toEqual([0, 0, 0, 0, 0]);
  });
});
