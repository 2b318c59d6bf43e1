import type { NotificationSender, OutboxMessage } from './notification-sender.interface';
import { NotificationRejectedError } from './notification-sender.interface';

/**
 * POST NOTIFY_WEBHOOK_URL (INTERFACE.md): header `Idempotency-Key: <dedupe_key>`,
 * body `{"topic", "dedupe_key", "payload"}`. Any 2xx is sent; anything else is
 * a failure. Redirects are not followed (a 3xx is a failure): a redirected POST
 * may change method or lose the header.
 */
export class WebhookSender implements NotificationSender {
  constructor(private readonly url: string) {}

  async send(message: OutboxMessage, signal: AbortSignal): Promise<void> {
    const res = await fetch(this.url, {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        'Idempotency-Key': message.dedupeKey,
      },
      body: JSON.stringify({ topic: message.topic, dedupe_key: message.dedupeKey, payload: message.payload }),
      redirect: 'manual',
      signal,
    });
    // Read the answer to the end (under the same signal) so the connection goes back to the pool.
    await res.arrayBuffer();
    if (res.status < 200 || res.status > 299) throw new NotificationRejectedError(res.status);
  }
}
