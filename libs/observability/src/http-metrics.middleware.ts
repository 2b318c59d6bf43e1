import { Injectable, NestMiddleware } from '@nestjs/common';
import type { NextFunction, Request, Response } from 'express';
import { Histogram, Registry } from 'prom-client';
import { answeredByServer } from './answered-by-server';

const NEST_NOT_FOUND_ROUTE = '{/*splat}';

/**
 * Every HTTP answer, by method, route pattern and status, with its latency.
 * The route is the pattern (`/v1/summaries/:jobId`), never the raw path, so
 * the label set stays bounded; requests that match no route are `unmatched`.
 */
@Injectable()
export class HttpMetricsMiddleware implements NestMiddleware {
  private readonly duration: Histogram<'method' | 'route' | 'status'>;

  constructor(registry: Registry) {
    const existing = registry.getSingleMetric('http_request_duration_seconds');
    this.duration =
      (existing as Histogram<'method' | 'route' | 'status'> | undefined) ??
      new Histogram({
        name: 'http_request_duration_seconds',
        help: 'HTTP requests by method, route pattern and status, with their latency',
        labelNames: ['method', 'route', 'status'],
        buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        registers: [registry],
      });
  }

  use(req: Request, res: Response, next: NextFunction): void {
    const start = process.hrtime.bigint();
    res.once('finish', () => {
      if (answeredByServer(req)) return;
      const path = (req.route as { path?: unknown } | undefined)?.path;
      // Nest answers unknown paths from a catch-all route of its own.
      const route = typeof path === 'string' && path !== NEST_NOT_FOUND_ROUTE ? path : 'unmatched';
      this.duration.observe(
        { method: req.method, route, status: String(res.statusCode) },
        Number(process.hrtime.bigint() - start) / 1e9,
      );
    });
    next();
  }
}
