import { Column, CreateDateColumn, Entity, PrimaryGeneratedColumn } from 'typeorm';

/**
 * A message to send, written in the same transaction as the change it
 * announces. The relay claims due rows with a lease, sends them, and records
 * the result; `dedupe_key` travels to the provider as its idempotency key.
 */
@Entity({ name: 'outbox' })
export class Outbox {
  /** bigint: pg returns it as a string. */
  @PrimaryGeneratedColumn('increment', { type: 'bigint' })
  id!: string;

  @Column({ type: 'text' })
  topic!: string;

  @Column({ name: 'dedupe_key', type: 'text', unique: true })
  dedupeKey!: string;

  @Column({ type: 'jsonb' })
  payload!: Record<string, unknown>;

  @Column({ type: 'integer', default: 0 })
  attempts!: number;

  @Column({ name: 'last_error', type: 'text', nullable: true })
  lastError!: string | null;

  @CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
  createdAt!: Date;

  @Column({ name: 'sent_at', type: 'timestamptz', nullable: true })
  sentAt!: Date | null;

  /** Not tried again before this time (backoff after a failure). */
  @Column({ name: 'next_attempt_at', type: 'timestamptz', default: () => 'now()' })
  nextAttemptAt!: Date;

  /** A relay holds the row until then; afterwards another may claim it. */
  @Column({ name: 'lease_until', type: 'timestamptz', nullable: true })
  leaseUntil!: Date | null;

  /** The W3C trace of the step that wrote the row (unset when tracing was off): the relay's send continues it. */
  @Column({ type: 'text', nullable: true })
  traceparent!: string | null;

  /** Set when the row ran out of attempts; a person re-queues it. */
  @Column({ name: 'parked_at', type: 'timestamptz', nullable: true })
  parkedAt!: Date | null;
}
