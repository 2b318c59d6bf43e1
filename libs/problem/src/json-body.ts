import type { NestExpressApplication } from '@nestjs/platform-express';
import express from 'express';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bodyParserErrorHandler } from './body-parser-errors';
import { BodyRejectionGuard } from './body-rejection';
import { assertValidJsonLimits, JsonLimitError, type JsonLimits, scanJsonLimits } from './json-limits';

/** body-parser passes the `type` of an error thrown from verify on, and 415s its own charset.unsupported. */
class UnsupportedCharsetError extends Error {
  readonly type = 'charset.unsupported';

  constructor() {
    super('JSON bodies must be UTF-8');
  }
}

export interface JsonBodyOptions extends JsonLimits {
  /** The largest body accepted, in bytes, after decompression. */
  readonly maxBytes: number;
  /** Paths (exact, as Express matches a mount) whose bodies may be larger, e.g. a model's whole conversation. */
  readonly largerBodies?: readonly {
    readonly path: string;
    readonly maxBytes: number;
    /** Only for requests this accepts (e.g. an authenticated caller); the others get the common limit. */
    readonly when?: (req: IncomingMessage) => boolean;
  }[];
}

const RAW_BODY = Symbol('problem:raw-body');

/** The bytes of the request's JSON body as the client sent them (after decompression), once parsed. */
export function rawBodyOf(req: object): Buffer | undefined {
  return (req as { [RAW_BODY]?: Buffer })[RAW_BODY];
}

/** The app's JSON body parsers, called without Express's router (see `useJsonBody`). */
export interface JsonBodyReader {
  /**
   * What the app's body middleware does for a request to `path` (exact, as
   * sent): the same parsers in the same order, a refusal recorded for
   * BodyRejectionGuard. Rejects only with what Express would pass on as an
   * error (not a parser's refusal).
   */
  read(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
  /** The middleware functions it mounted on the app, to tell them from others in Express's router. */
  readonly mounted: ReadonlySet<unknown>;
}

type Middleware = (req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void) => void;

/**
 * JSON bodies for an app created with `bodyParser: false`: the parser with a
 * byte limit, the structural limits checked on the bytes before JSON.parse
 * runs (the parser's verify hook), and the guard that answers every refusal
 * as problem+json once the request has been logged and counted. Returns the
 * same parsers for a route served without Express's router.
 */
export function useJsonBody(app: NestExpressApplication, options: JsonBodyOptions): JsonBodyReader {
  const { maxBytes, largerBodies = [], ...limits } = options;
  assertValidJsonLimits(limits);
  const verify = (req: IncomingMessage, _res: ServerResponse, buf: Buffer, charset: string): void => {
    // The scan reads UTF-8; the parser would decode any utf-* after it (UTF-7
    // hides every bracket from a byte scan). JSON between systems is UTF-8
    // (RFC 8259), so anything else is a 415.
    if (charset !== 'utf-8' && charset !== 'utf8') throw new UnsupportedCharsetError();
    const exceeded = scanJsonLimits(buf, limits);
    if (exceeded) throw new JsonLimitError(exceeded);
    // A reference, not a copy: a proxying route sends the bytes on unchanged. Without a byte-order mark, as the
    // parser drops it (iconv-lite's UTF-8 decoding): the bytes are the JSON text that was parsed.
    Object.defineProperty(req, RAW_BODY, { value: hasByteOrderMark(buf) ? buf.subarray(3) : buf, configurable: true });
  };
  // express.json itself, not app.useBodyParser: Nest's typing of the latter
  // leaves out `verify`, the one hook that sees the bytes before JSON.parse.
  // A body parsed by the first parser that matches is left alone by the rest.
  const larger = largerBodies.map((route) => {
    const parse = express.json({ limit: route.maxBytes, verify }) as Middleware;
    const when = route.when;
    const middleware: Middleware = when ? (req, res, next) => (when(req) ? parse(req, res, next) : next()) : parse;
    return { path: route.path, middleware };
  });
  const parse = express.json({ limit: maxBytes, verify }) as Middleware;
  for (const route of larger) app.use(route.path, route.middleware);
  app.use(parse);
  app.use(bodyParserErrorHandler);
  app.useGlobalGuards(new BodyRejectionGuard());

  const chains = new Map<string, readonly Middleware[]>();
  const chainOf = (path: string): readonly Middleware[] => {
    let chain = chains.get(path);
    if (!chain) {
      chain = [...larger.filter((route) => route.path === path).map((route) => route.middleware), parse];
      chains.set(path, chain);
    }
    return chain;
  };
  /** The limit of the parser that would read this request's body: the first larger route's it is accepted by. */
  const limitOf = (req: IncomingMessage, path: string): number => {
    for (const route of largerBodies) if (route.path === path && (route.when?.(req) ?? true)) return route.maxBytes;
    return maxBytes;
  };
  return {
    mounted: new Set<unknown>([...larger.map((route) => route.middleware), parse, bodyParserErrorHandler]),
    read: (req, res, path) =>
      new Promise((resolve, reject) => {
        // What Express's error middleware would pass on, Express's final handler would answer (500).
        const failed = (err: unknown): void =>
          bodyParserErrorHandler(err, req as never, res as never, (passed?: unknown) =>
            passed === undefined
              ? resolve()
              : reject(new Error('the body parser failed with a value that is not an error')),
          );
        const length = plainJsonLength(req);
        if (length !== undefined && length <= limitOf(req, path)) {
          readPlainJson(req, length, (buf) => verify(req, res, buf, 'utf-8'), resolve, failed);
          return;
        }
        const chain = chainOf(path);
        let i = 0;
        const next = (err?: unknown): void => {
          if (err !== undefined) return failed(err);
          const step = chain[i++];
          if (step === undefined) resolve();
          else step(req, res, next);
        };
        next();
      }),
  };
}

/** The Content-Types a plain read takes (lowercased): JSON in UTF-8, the charset named or not. */
const PLAIN_JSON_TYPES = new Set([
  'application/json',
  'application/json; charset=utf-8',
  'application/json;charset=utf-8',
]);
const DIGITS = /^\d{1,15}$/;

/**
 * The length of a body the parser would read the common way, undefined for
 * any other: JSON in UTF-8 (by its Content-Type), neither compressed nor
 * chunked, of a Content-Length above zero, on a request whose body is still
 * to come. Anything else (a gzip body, a charset to refuse, an empty body,
 * another type, a request already over) goes to body-parser itself.
 */
export function plainJsonLength(req: IncomingMessage): number | undefined {
  const { headers } = req;
  if (headers['content-encoding'] !== undefined || headers['transfer-encoding'] !== undefined) return undefined;
  const type = headers['content-type'];
  if (type === undefined || !PLAIN_JSON_TYPES.has(type.toLowerCase())) return undefined;
  const declared = headers['content-length'];
  if (declared === undefined || !DIGITS.test(declared)) return undefined;
  // on-finished's test, as body-parser makes it: a body already read (or a socket already shut) is not read again.
  if (!req.socket?.readable || (req.complete && !req.readable) || (req as { upgrade?: boolean }).upgrade)
    return undefined;
  // raw-body's own refusal of a stream it cannot read (a 500) is body-parser's to give.
  if (!req.readable || req.destroyed) return undefined;
  const length = Number(declared);
  return length > 0 ? length : undefined;
}

/**
 * The errors body-parser gives a body it reads the plain way: the same `type` and status, which are all
 * bodyParserErrorHandler reads (their messages and other properties are not body-parser's).
 */
const bodyError = (type: string, status: number, message: string): Error =>
  Object.assign(new Error(message), { type, status, statusCode: status, expose: true });

/**
 * What body-parser's JSON parser does with such a body (raw-body's read,
 * verify, iconv-lite's UTF-8 decoding, which drops a byte-order mark, and its
 * strict parse), without the generic path's type, charset and encoding
 * machinery: `req.body` set, or the error body-parser would pass on.
 */
function readPlainJson(
  req: IncomingMessage,
  length: number,
  verify: (buf: Buffer) => void,
  done: () => void,
  failed: (err: unknown) => void,
): void {
  let first: Buffer | undefined;
  let chunks: Buffer[] | undefined;
  let received = 0;
  const cleanup = (): void => {
    req.off('data', onData);
    req.off('end', onEnd);
    req.off('error', onError);
    req.off('aborted', onAborted);
    req.off('close', onAborted);
  };
  const onData = (chunk: Buffer): void => {
    received += chunk.length;
    if (first === undefined) first = chunk;
    else (chunks ??= [first]).push(chunk);
  };
  const onAborted = (): void => {
    cleanup();
    failed(bodyError('request.aborted', 400, 'request aborted'));
  };
  const onError = (err: Error): void => {
    cleanup();
    failed(Object.assign(err, { type: 'request.aborted', status: 400, statusCode: 400 }));
  };
  const onEnd = (): void => {
    cleanup();
    if (received !== length) {
      failed(bodyError('request.size.invalid', 400, 'request size did not match content length'));
      return;
    }
    const buf = chunks === undefined ? first! : Buffer.concat(chunks, received);
    try {
      verify(buf);
    } catch (err) {
      failed(
        Object.assign(err as object, {
          status: 403,
          statusCode: 403,
          type: (err as { type?: string }).type ?? 'entity.verify.failed',
        }),
      );
      return;
    }
    const text = buf.toString('utf8', hasByteOrderMark(buf) ? 3 : 0);
    try {
      (req as { body?: unknown }).body = strictJson(text);
    } catch {
      failed(bodyError('entity.parse.failed', 400, 'the body is not valid JSON'));
      return;
    }
    done();
  };
  req.on('data', onData);
  req.on('end', onEnd);
  req.on('error', onError);
  req.on('aborted', onAborted);
  // Closed before its end without either of those (destroyed here): raw-body would wait for ever; this refuses it.
  req.on('close', onAborted);
}

const hasByteOrderMark = (buf: Buffer): boolean =>
  buf.length >= 3 && buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf;

/** body-parser's strict JSON: empty is `{}`; anything but an object or an array at the top is refused. */
function strictJson(text: string): unknown {
  if (text.length === 0) return {};
  const first = text[0] === '{' ? '{' : /[^ \t\n\r]/.exec(text)?.[0];
  if (first !== '{' && first !== '[') throw new SyntaxError('strict violation');
  return JSON.parse(text);
}
