import { NodeHttpTransport, readBody } from '@app/http/node-http.transport';
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
    await readBody(res);
    const status = res.statusCode ?? 0;
    if (status < 200 || status > 299) throw new NotificationRejectedError(status);
  }

  /** Ends the kept-alive connections (shutdown). */
  close(): void {
    this.transport.close();
  }
}
