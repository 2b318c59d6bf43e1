import type { Request } from 'express';
import { compile } from 'path-to-regexp';

function normalisePath(path: string): string {
  return path.length > 1 ? path.replace(/\/+$/, '') : path;
}

const pathFillers = new Map<string, (params: Record<string, string | string[]>) => string>();

/**
 * The path that names the operation: the route's own pattern as it was
 * registered (global prefix included) with its parameters filled in, not the
 * path the client typed. Express matches routes case-insensitively and with
 * or without a trailing slash, so `/V1/SUMMARIES/` runs the handler of
 * `/v1/summaries`; it must also find its record, or one key could run the
 * handler twice. Parameters are decoded by Express and encoded again here
 * (`a%2Fb` stays one segment), so equal parameters always give one path.
 */
export function operationPath(req: Request): string {
  const pattern = (req.route as { path?: unknown } | undefined)?.path;
  if (typeof pattern !== 'string') return normalisePath(req.path);
  let fill = pathFillers.get(pattern);
  if (fill === undefined) {
    // path-to-regexp is the parser Express and Nest match this pattern with.
    fill = compile(pattern, { encode: encodeURIComponent });
    pathFillers.set(pattern, fill);
  }
  return normalisePath(fill(req.params));
}
