import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';

/*
 * The notification provider for the end-to-end bench, in a process of its
 * own: every POST (the relay's webhook, INTERFACE.md: `{topic, dedupe_key,
 * payload}` with payload.to) is answered 200 and recorded with its arrival
 * time, in ms since the epoch on the high-resolution clock
 * (performance.timeOrigin + performance.now(), as the load generator stamps
 * its sends), once its body is in. GET /arrivals returns them and clears the
 * list. GET /arrivals/stream also sends each arrival as it comes, one JSON
 * line each (its headers are sent at once: a caller whose fetch has resolved
 * is subscribed), for a closed-loop client that waits for its own. Prints
 * `webhook receiver listening on http://127.0.0.1:<port>` on stderr when
 * ready.
 *
 * Args: [port (0: any)].
 */
export interface Arrival {
  readonly to: string;
  readonly dedupeKey: string;
  readonly idempotencyKey: string;
  readonly at: number;
}

let arrivals: Arrival[] = [];
const subscribers = new Set<ServerResponse>();

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/arrivals/stream') {
    subscribers.add(res);
    res.once('close', () => subscribers.delete(res));
    res.writeHead(200, { 'content-type': 'application/x-ndjson' }).flushHeaders();
    return;
  }
  if (req.method === 'GET' && req.url === '/arrivals') {
    const body = JSON.stringify(arrivals);
    arrivals = [];
    res.writeHead(200, { 'content-type': 'application/json' }).end(body);
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const at = performance.timeOrigin + performance.now();
    try {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        dedupe_key?: string;
        payload?: { to?: string };
      };
      const arrival: Arrival = {
        to: String(body.payload?.to),
        dedupeKey: String(body.dedupe_key),
        idempotencyKey: String(req.headers['idempotency-key']),
        at,
      };
      arrivals.push(arrival);
      if (subscribers.size) {
        const line = JSON.stringify(arrival) + '\n';
        for (const s of subscribers) s.write(line);
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    } catch {
      res.writeHead(400).end();
    }
  });
});
server.keepAliveTimeout = 65_000;
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  console.error(`webhook receiver listening on http://127.0.0.1:${port}`);
});
process.on('SIGTERM', () => {
  for (const s of subscribers) s.end();
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
