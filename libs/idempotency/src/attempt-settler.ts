import { Logger } from '@nestjs/common';
import { type Attempt, errorText } from './attempt';
import type { StoredResponse } from './idempotency-store.interface';
import { IdempotencyMetrics } from './idempotency.metrics';
import { LockLease } from './lock-lease';
import type { ReleaseReason, SettleDecision } from './settle-decision';

/**
 * Carries out, against the attempt's store, what was decided for its key:
 * stores the answer, releases the key, or abandons it; and keeps its lock
 * alive meanwhile. A store that refuses (the lock is not ours any more) or
 * fails is logged and counted here; the caller's answer goes out either way.
 */
export class AttemptSettler {
  private readonly logger = new Logger('IdempotencyInterceptor');

  constructor(private readonly metrics: IdempotencyMetrics) {}

  /**
   * Renews the attempt's lock while it runs; `quiet()` true: a refused renewal
   * is expected (the record was completed in a transaction).
   */
  lease(attempt: Attempt, quiet?: () => boolean): LockLease {
    return new LockLease(
      attempt.settings.store,
      attempt.context.operation,
      attempt.token,
      attempt.settings.lockTtlMs,
      (how) => this.lockLost(attempt, how),
      (err) => this.logger.warn(`idempotency lock renewal failed (key ${attempt.keyHash}): ${errorText(err)}`),
      quiet,
    );
  }

  /** Performs what settleDecision decided for the attempt's key. */
  settle(attempt: Attempt, lease: LockLease, decision: SettleDecision): Promise<void> {
    switch (decision.action) {
      case 'store':
        return this.complete(attempt, lease, decision.response);
      case 'abandon':
        return this.abandon(attempt, lease);
      case 'release':
        this.notStored(attempt, decision.reason);
        return this.release(attempt, lease);
    }
  }

  async release(attempt: Attempt, lease: LockLease): Promise<void> {
    this.metrics.count('released');
    try {
      const ours = await attempt.settings.store.release(attempt.context.operation, attempt.token);
      if (!ours) lease.refused('release refused');
    } catch (err) {
      this.logger.error(`idempotency: could not release key ${attempt.keyHash}: ${errorText(err)}`);
    }
  }

  /**
   * An answer that could have been stored but is not: a warning and a
   * `not_stored`. The other releases (a status the route does not store, a
   * refused body, a reused key) are what the route asked for: said nowhere.
   */
  private notStored(attempt: Attempt, reason: ReleaseReason): void {
    const key = attempt.keyHash;
    switch (reason.kind) {
      case 'headers-sent':
        // Through @Res() without passthrough, which IdempotentRoutesValidator
        // refuses at start-up: Nest would not send a replay for such a handler either.
        this.logger.warn(
          `idempotency: the handler sent its answer itself, so it cannot be stored; key ${key} released. ` +
            'Use @Res({ passthrough: true }) on @Idempotent() routes.',
        );
        break;
      case 'too-large':
        this.logger.warn(
          `idempotency: answer of ${reason.size} bytes exceeds ${reason.limit}; not stored, key ${key} released`,
        );
        break;
      case 'unserialisable':
        // A value JSON cannot hold: a bug in the handler that Express could not
        // send either. The exception filter answers 500 with this error (and
        // logs it); the key must not stay locked for the lock TTL meanwhile.
        this.logger.warn(
          `idempotency: the answer cannot be serialised (${errorText(reason.error)}); not stored, key ${key} released`,
        );
        break;
      case 'unstorable':
        this.logger.warn(`idempotency: a ${reason.type} answer cannot be stored; key ${key} released`);
        break;
      case 'status':
      case 'rejected-by-pipes':
      case 'key-reused':
      case 'unreadable':
        return;
    }
    this.metrics.count('not_stored');
  }

  private async complete(attempt: Attempt, lease: LockLease, response: StoredResponse): Promise<void> {
    try {
      const ours = await attempt.settings.store.complete(
        attempt.context.operation,
        attempt.token,
        attempt.context.fingerprint,
        response,
        attempt.settings.resultTtlMs,
      );
      if (!ours) lease.refused('finalise refused');
    } catch (err) {
      // The answer still goes out; the lock expires and a retry runs again.
      this.metrics.count('store_unavailable');
      this.logger.error(`idempotency: could not store the answer (key ${attempt.keyHash}): ${errorText(err)}`);
    }
  }

  /**
   * Gives the key up as a request whose outcome is unknown: abandoned where the
   * store can mark it (tookOver for the next), else released.
   */
  private async abandon(attempt: Attempt, lease: LockLease): Promise<void> {
    const store = attempt.settings.store;
    if (!store.abandon) return this.release(attempt, lease);
    this.metrics.count('released');
    try {
      const ours = await store.abandon(attempt.context.operation, attempt.token);
      if (!ours) lease.refused('abandon refused');
    } catch (err) {
      this.logger.error(`idempotency: could not give up key ${attempt.keyHash}: ${errorText(err)}`);
    }
  }

  private lockLost(attempt: Attempt, how: string): void {
    this.metrics.count('lock_lost');
    this.logger.warn(
      `idempotency lock lost (${how}) for key ${attempt.keyHash}: the handler outlived its lock; ` +
        'another request may have run it too. Raise the lock TTL if handlers are this slow.',
    );
  }
}
