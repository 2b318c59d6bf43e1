import type { RedisClient } from '@app/redis';
import type { DataSource } from 'typeorm';

/**
 * Which upstream an operation's call went to while its outcome is unknown
 * (GATEWAY_UPSTREAMS with more than one upstream for its model): written
 * before the call is sent, removed when the upstream's answer proves no
 * completion was made (the call then falls back), and otherwise kept for
 * the record's lifetime. A retry of a pinned operation goes to that upstream
 * alone, with the same upstream key: a call that timed out, or whose
 * connection broke after it was sent, may have completed there, and a second
 * upstream would bill a second completion.
 */
export interface UpstreamPins {
  pinned(operation: string): Promise<string | undefined>;
  pin(operation: string, upstream: string, ttlMs: number): Promise<void>;
  /** Removes the pin if it still names `upstream`. */
  unpin(operation: string, upstream: string): Promise<void>;
}

export const UPSTREAM_PINS = 'gateway:upstream-pins';

/** Compare-and-delete: a pin another attempt has written since is left alone. */
const UNPIN = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;

/** One key per operation, `gateway:pin:<operation>`, expiring with it. */
export class RedisUpstreamPins implements UpstreamPins {
  constructor(private readonly redis: RedisClient) {}

  private key(operation: string): string {
    return `gateway:pin:${operation}`;
  }

  async pinned(operation: string): Promise<string | undefined> {
    return (await this.redis.get(this.key(operation))) ?? undefined;
  }

  async pin(operation: string, upstream: string, ttlMs: number): Promise<void> {
    await this.redis.set(this.key(operation), upstream, 'PX', ttlMs);
  }

  async unpin(operation: string, upstream: string): Promise<void> {
    await this.redis.eval(UNPIN, 1, this.key(operation), upstream);
  }
}

/** The table gateway_upstream_pins (its migration says why it exists); a pin write sweeps 100 expired rows. */
export class PostgresUpstreamPins implements UpstreamPins {
  constructor(private readonly dataSource: DataSource) {}

  async pinned(operation: string): Promise<string | undefined> {
    const rows = await this.dataSource.query<{ upstream: string }[]>(
      `SELECT upstream FROM gateway_upstream_pins WHERE operation = $1 AND expires_at > now()`,
      [operation],
    );
    return rows[0]?.upstream;
  }

  async pin(operation: string, upstream: string, ttlMs: number): Promise<void> {
    await this.dataSource.query(
      `WITH swept AS (
         DELETE FROM gateway_upstream_pins WHERE ctid IN (
           SELECT ctid FROM gateway_upstream_pins WHERE expires_at < now() LIMIT 100 FOR UPDATE SKIP LOCKED))
       INSERT INTO gateway_upstream_pins (operation, upstream, expires_at)
       VALUES ($1, $2, now() + $3 * interval '1 millisecond')
       ON CONFLICT (operation) DO UPDATE SET upstream = EXCLUDED.upstream, expires_at = EXCLUDED.expires_at`,
      [operation, upstream, ttlMs],
    );
  }

  async unpin(operation: string, upstream: string): Promise<void> {
    await this.dataSource.query(`DELETE FROM gateway_upstream_pins WHERE operation = $1 AND upstream = $2`, [
      operation,
      upstream,
    ]);
  }
}
