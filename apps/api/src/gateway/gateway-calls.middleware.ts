import { Injectable, NestMiddleware } from '@nestjs/common';
import { idempotencyOutcomeOf } from '@app/idempotency';
import type { NextFunction, Request, Response } from 'express';
import { GatewayMetrics } from './gateway.metrics';

const RAN = Symbol('gateway:ran');

/** The handler ran (the call went upstream): it counts its own outcome. */
export function markGatewayRun(req: object): void {
  Object.defineProperty(req, RAN, { value: true, configurable: true });
}

/**
 * Counts the calls the handler never saw (a replay, an attached duplicate, a
 * refusal) once their answer is over, and the time to the caller's first
 * byte of every call.
 */
@Injectable()
export class GatewayCallsMiddleware implements NestMiddleware {
  constructor(private readonly metrics: GatewayMetrics) {}

  use(req: Request, res: Response, next: NextFunction): void {
    const arrived = performance.now();
    // Put back as it was, and called with its own `this`.
    // eslint-disable-next-line @typescript-eslint/unbound-method
    const writeHead = res.writeHead;
    const metrics = this.metrics;
    res.writeHead = function (this: Response, ...args: Parameters<Response['writeHead']>) {
      res.writeHead = writeHead;
      const stream = (req.body as { stream?: unknown } | undefined)?.stream === true;
      metrics.firstByteAt('caller', stream, (performance.now() - arrived) / 1000);
      return writeHead.apply(this, args);
    } as Response['writeHead'];
    res.once('close', () => {
      if ((req as { [RAN]?: boolean })[RAN]) return;
      const outcome = idempotencyOutcomeOf(req);
      if (outcome === 'replayed' || outcome === 'attached') metrics.call(outcome);
      else if (res.statusCode >= 400) metrics.call('rejected');
    });
    next();
  }
}
