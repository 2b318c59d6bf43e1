import { Logger } from '@nestjs/common';
import { Counter, type Registry } from 'prom-client';

/**
 * How long what a write found of a master's replicas is trusted. Every durable write asks again (ROLE, in its own
 * round trip), so while writes flow this never lapses; past it, an idle master is asked by its next write.
 */
const KNOWN_FOR_MS = 5000;
/** INTERFACE.md: writes accepted without a replica are logged once a minute while they go on. */
const LOG_EVERY_MS = 60_000;

/** What a master's last durable write found: replicas online or none, or `unknown` when the master denied ROLE. */
export type ReplicasKnown = 'none' | 'some' | 'unknown';

/**
 * What this process knows of its cluster masters' replicas, as their last durable write found them, and the writes
 * accepted on a master with none (REDIS_DURABILITY=replica): `redis_unreplicated_writes_total`, and one warning a
 * minute naming the masters. A master known to have none is written without WAIT, which would block its whole
 * timeout there: a failover costs the shard's durability for a while, not a second on each of its writes.
 */
export class MasterReplicas {
  private readonly logger = new Logger('RedisDurability');
  private readonly known = new Map<string, { readonly replicas: ReplicasKnown; readonly until: number }>();
  /** Whether the warning that ROLE is denied was given: once per process, the ACL is not about to change. */
  private roleDeniedWarned = false;
  /** The write, one per master, that is finding out what that master has. */
  private readonly finding = new Map<string, Promise<unknown>>();
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

  /**
   * Whether `node` (`host:port`) had replicas online when a write last asked; `unknown` when it refused to say (ROLE
   * denied); undefined when not asked lately.
   */
  replicasOf(node: string): ReplicasKnown | undefined {
    const entry = this.known.get(node);
    if (entry === undefined) return undefined;
    if (entry.until > this.now()) return entry.replicas;
    this.known.delete(node);
    return undefined;
  }

  /** What the master reported of its replicas; unknown changes nothing. */
  observe(node: string, replicasOnline: number | undefined): void {
    if (replicasOnline === undefined) return;
    this.known.set(node, { replicas: replicasOnline === 0 ? 'none' : 'some', until: this.now() + KNOWN_FOR_MS });
  }

  /**
   * `node` refused ROLE (NOPERM: the user lacks `@admin`, as `+@all -@dangerous` does). Its writes cannot learn
   * anything, so they must not wait for one another to: each sends WAIT, as to a master known to have replicas, and
   * stands only if a replica confirms it.
   */
  roleDenied(node: string): void {
    this.known.set(node, { replicas: 'unknown', until: this.now() + KNOWN_FOR_MS });
    if (this.roleDeniedWarned) return;
    this.roleDeniedWarned = true;
    this.logger.warn(
      `Redis denied ROLE on ${node}: the Redis user lacks it (@admin). Every durable write waits for a replica ` +
        'to confirm it (WAIT); a master with no replica online has its writes refused after the whole wait, in ' +
        'both REDIS_DURABILITY modes. Grant the user +role to have replica mode and writes without WAIT there',
    );
  }

  /** The write finding out `node`'s replicas now, settled (never rejected) once it has its answer; if one is. */
  learning(node: string): Promise<unknown> | undefined {
    return this.finding.get(node);
  }

  /** `write` is the one finding out what `node` has: the writes to it that come meanwhile wait for it. */
  learnFrom(node: string, write: Promise<unknown>): void {
    if (this.finding.has(node)) return;
    const settled = write.then(
      () => undefined,
      () => undefined,
    );
    this.finding.set(node, settled);
    void settled.then(() => {
      if (this.finding.get(node) === settled) this.finding.delete(node);
    });
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
