import { Logger } from '@nestjs/common';
import { Counter, type Registry } from 'prom-client';

/**
 * How long a master seen without a replica is written without WAIT. Every such write asks the master for its
 * replicas again (ROLE, in the same round trip), so this only bounds how long an idle entry is trusted: past it, the
 * next write waits (at most WAIT's timeout) and looks again.
 */
const REPLICA_LESS_TTL_MS = 5000;
/** INTERFACE.md: writes accepted without a replica are logged once a minute while they go on. */
const LOG_EVERY_MS = 60_000;

/**
 * The masters of this process's cluster that have no replica online, as their last durable write found them, and
 * the writes accepted there (REDIS_DURABILITY=replica): `redis_unreplicated_writes_total`, and one warning a minute
 * naming the masters. A write to a master known to have no replica skips WAIT, which would block its whole timeout
 * there: a failover costs the shard's durability for a while, not a second on each of its writes.
 */
export class ReplicaLessMasters {
  private readonly logger = new Logger('RedisDurability');
  private readonly until = new Map<string, number>();
  private readonly counter: Counter;
  /** Accepted since the last warning, by master. */
  private readonly pending = new Map<string, number>();
  private lastLogAt = Number.NEGATIVE_INFINITY;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    registry?: Registry,
    private readonly now: () => number = Date.now,
  ) {
    this.counter =
      (registry?.getSingleMetric('redis_unreplicated_writes_total') as Counter | undefined) ??
      new Counter({
        name: 'redis_unreplicated_writes_total',
        help:
          'Writes acknowledged on a Redis Cluster master with no replica online (REDIS_DURABILITY=replica): ' +
          'lost if that master is lost before a replica syncs',
        registers: registry ? [registry] : [],
      });
  }

  /** Whether `node` (`host:port`) was seen without a replica recently enough to write it without WAIT. */
  isReplicaLess(node: string): boolean {
    const until = this.until.get(node);
    if (until === undefined) return false;
    if (until > this.now()) return true;
    this.until.delete(node);
    return false;
  }

  /** What the master reported of its replicas; unknown changes nothing. */
  observe(node: string, replicasOnline: number | undefined): void {
    if (replicasOnline === undefined) return;
    if (replicasOnline === 0) this.until.set(node, this.now() + REPLICA_LESS_TTL_MS);
    else this.until.delete(node);
  }

  /** A write acknowledged on `node` without a replica. */
  accepted(node: string): void {
    this.counter.inc();
    this.pending.set(node, (this.pending.get(node) ?? 0) + 1);
    if (this.closed) return;
    const wait = this.lastLogAt + LOG_EVERY_MS - this.now();
    if (wait <= 0) this.flush();
    else this.timer ??= setTimeout(() => this.flush(), wait).unref();
  }

  /** Logs what is still pending; nothing is logged after this (the count goes on). */
  close(): void {
    this.closed = true;
    this.flush();
  }

  private flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.pending.size === 0) return;
    const masters = [...this.pending].map(([node, n]) => `${node} (${n})`).join(', ');
    const total = [...this.pending.values()].reduce((a, b) => a + b, 0);
    this.pending.clear();
    this.lastLogAt = this.now();
    this.logger.warn(
      `${total} write(s) acknowledged on Redis masters with no replica online: ${masters}. They are lost if ` +
        'that master is lost before a replica syncs (REDIS_DURABILITY=replica; strict would refuse them)',
    );
  }
}
