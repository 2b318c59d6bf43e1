import { NodeHttpTransport } from '@app/http/node-http.transport';
import type { IncomingMessage } from 'node:http';
import type { NotificationSender, OutboxMessage } from './notification-sender.interface';
import { NotificationRejectedError } from './notification-sender.interface';

/**
 * POST NOTIFY_WEBHOOK_URL (INTERFACE.md): header `Idempotency-Key: <dedupe_key>`,
 * body `{"topic", "dedupe_key", "payload"}`. Any 2xx is sent; anything else is
 * a failure. Redirects are not followed (a 3xx is a failure): a redirected POST
 * may change method or lose the header. Sent over NodeHttpTransport (kept-alive
 * node:http), not fetch: fetch's Request, web streams and Response cost more
 * CPU than the rest of a delivery.
 */
export class WebhookSender implements NotificationSender {
  private readonly transport: NodeHttpTransport;

  constructor(url: string) {
    // The URL as it is, query included; the relay's concurrency bounds the deliveries in flight.
    this.transport = new NodeHttpTransport({ baseUrl: url, maxSockets: Infinity });
  }

  async send(message: OutboxMessage, signal: AbortSignal): Promise<void> {
    const body = Buffer.from(
      JSON.stringify({ topic: message.topic, dedupe_key: message.dedupeKey, payload: message.payload }),
    );
    const res = await this.transport.send(
      'POST',
      '',
      body,
      {
        'content-type': 'application/json',
        'content-length': body.length,
        'idempotency-key': message.dedupeKey,
        // Some firewalls refuse a request without one (fetch sent `node`).
        'user-agent': 'llm-workflows-relay',
      },
      signal,
    );
    // Read the answer to the end (under the same signal) so the connection goes back to the pool.
    await drained(res);
    const status = res.statusCode ?? 0;
    if (status < 200 || status > 299) throw new NotificationRejectedError(status);
  }

  /** Ends the kept-alive connections (shutdown). */
  close(): void {
    this.transport.close();
  }
}

/** Resolves once the answer's body has been read to its end; rejects if it breaks or the signal cuts it. */
function drained(res: IncomingMessage): Promise<void> {
  return new Promise((resolve, reject) => {
    res.on('data', () => undefined);
    res.once('end', resolve);
    res.once('error', reject);
    res.once('close', () => {
      if (!res.complete) reject(res.errored ?? new Error('the connection closed before the answer ended'));
    });
  });
}
