import { Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { TransactionRequiredError } from '../persistence.errors';

/** The relay LISTENs here; the payload is the new row's id. */
export const OUTBOX_CHANNEL = 'outbox_new';

export interface NewOutboxMessage {
  readonly topic: string;
  readonly dedupeKey: string;
  readonly payload: Record<string, unknown>;
}

/** I/O only. Writers of the outbox; the relay has its own queries. */
@Injectable()
export class OutboxRepository {
  /**
   * Inserts the message and notifies the relay, in one statement. Refuses to
   * run outside a transaction: an outbox row only means something when it
   * commits together with the change it announces. NOTIFY is delivered at
   * commit, so the relay never wakes for a row it cannot see yet.
   */
  async insert(em: EntityManager, message: NewOutboxMessage): Promise<string> {
    if (!em.queryRunner?.isTransactionActive) throw new TransactionRequiredError('OutboxRepository.insert');
    const rows: { id: string }[] = await em.query(
      `WITH row AS (
         INSERT INTO outbox (topic, dedupe_key, payload)
         VALUES ($1, $2, $3::jsonb)
         RETURNING id
       )
       SELECT id, pg_notify('${OUTBOX_CHANNEL}', id::text) FROM row`,
      [message.topic, message.dedupeKey, JSON.stringify(message.payload)],
    );
    return rows[0].id;
  }
}
