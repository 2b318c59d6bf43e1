import type { NestExpressApplication } from '@nestjs/platform-express';
import express from 'express';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bodyParserErrorHandler } from './body-parser-errors';
import { BodyRejectionGuard } from './body-rejection';
import { assertValidJsonLimits, JsonLimitError, type JsonLimits, scanJsonLimits } from './json-limits';

export interface JsonBodyOptions extends JsonLimits {
  /** The largest body accepted, in bytes, after decompression. */
  readonly maxBytes: number;
}

/**
 * JSON bodies for an app created with `bodyParser: false`: the parser with a
 * byte limit, the structural limits checked on the bytes before JSON.parse
 * runs (the parser's verify hook), and the guard that answers every refusal
 * as problem+json once the request has been logged and counted.
 */
export function useJsonBody(app: NestExpressApplication, options: JsonBodyOptions): void {
  const { maxBytes, ...limits } = options;
  assertValidJsonLimits(limits);
  // express.json itself, not app.useBodyParser: Nest's typing of the latter
  // leaves out `verify`, the one hook that sees the bytes before JSON.parse.
  app.use(express.json({
    limit: maxBytes,
    verify: (_req: IncomingMessage, _res: ServerResponse, buf: Buffer) => {
      const exceeded = scanJsonLimits(buf, limits);
      if (exceeded) throw new JsonLimitError(exceeded);
    },
  }));
  app.use(bodyParserErrorHandler);
  app.useGlobalGuards(new BodyRejectionGuard());
}
