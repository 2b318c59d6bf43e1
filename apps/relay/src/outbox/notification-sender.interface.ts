import { Inject } from '@nestjs/common';

/** What travels to the provider: the outbox row minus its bookkeeping. */
export interface OutboxMessage {
  readonly topic: string;
  /** Stable across retries and relays: the provider's idempotency key. */
  readonly dedupeKey: string;
  readonly payload: Readonly<Record<string, unknown>>;
}

/**
 * Delivers one notification. Resolves when the provider accepted it; rejects
 * otherwise (a `NotificationRejectedError` for an answer that is not 2xx, any
 * other error for a network failure). `signal` aborts at the relay's send
 * timeout: an implementation passes it to its I/O so nothing keeps running
 * after the relay has given up (the relay stops waiting either way).
 */
export interface NotificationSender {
  send(message: OutboxMessage, signal: AbortSignal): Promise<void>;
}

export const NotificationSender = Symbol('NotificationSender');
export const InjectNotificationSender = (): ParameterDecorator => Inject(NotificationSender);

/** The provider answered, but not with a 2xx. The message is the row's `last_error`. */
export class NotificationRejectedError extends Error {
  constructor(readonly status: number) {
    super(`HTTP ${status}`);
    this.name = 'NotificationRejectedError';
  }
}
