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
    // A reference, not a copy: a proxying route sends the bytes on unchanged.
    Object.defineProperty(req, RAW_BODY, { value: buf, configurable: true });
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
  return {
    mounted: new Set<unknown>([...larger.map((route) => route.middleware), parse, bodyParserErrorHandler]),
    read: (req, res, path) =>
      new Promise((resolve, reject) => {
        const chain = chainOf(path);
        let i = 0;
        const next = (err?: unknown): void => {
          if (err !== undefined) {
            // What Express's error middleware would pass on, Express's final handler would answer (500).
            bodyParserErrorHandler(err, req as never, res as never, (passed?: unknown) =>
              passed === undefined
                ? resolve()
                : reject(new Error('the body parser failed with a value that is not an error')),
            );
            return;
          }
          const step = chain[i++];
          if (step === undefined) resolve();
          else step(req, res, next);
        };
        next();
      }),
  };
}
