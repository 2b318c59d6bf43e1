import type { IncomingMessage, ServerResponse } from 'node:http';

/** What the api answered a request a test proxy forwarded: hop-by-hop headers left out. */
export interface Forwarded {
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Buffer;
}

const FORWARDED_HEADERS = ['authorization', 'content-type', 'idempotency-key', 'accept'];
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length']);

/**
 * Sends `req` (its body already read) on to `upstream` and reads the whole
 * answer. Not tied to the caller: a caller that gave up does not cancel what
 * the api does, which is what the proxies that lose answers rely on.
 */
export async function forward(upstream: string, req: IncomingMessage, body: string): Promise<Forwarded> {
  const headers: Record<string, string> = {};
  for (const name of FORWARDED_HEADERS) {
    const v = req.headers[name];
    if (typeof v === 'string') headers[name] = v;
  }
  const up = await fetch(`${upstream}${req.url}`, {
    method: req.method,
    headers,
    body: req.method === 'GET' ? undefined : body,
  });
  const out: Record<string, string> = {};
  up.headers.forEach((v, k) => {
    if (!HOP_BY_HOP.has(k)) out[k] = v;
  });
  return { status: up.status, headers: out, body: Buffer.from(await up.arrayBuffer()) };
}

/** The forwarded answer, whole, to the caller. */
export function sendForwarded(res: ServerResponse, answer: Forwarded): void {
  res.writeHead(answer.status, answer.headers);
  res.end(answer.body);
}
