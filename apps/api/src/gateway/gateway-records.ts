import { type Durability, type RedisClient, RedisScript } from '@app/redis';
import type { DataSource } from 'typeorm';

/** A response made through POST /v1/responses: whose it is, where it was made, and which record holds it. */
export interface ResponseRecord {
  readonly tenant: string;
  /** The upstream that served it (GATEWAY_UPSTREAMS' name). */
  readonly upstream: string;
  /** For a keyed call: the idempotency operation whose record holds its answer. */
  readonly operation?: string;
}

/**
 * The gateway's own records beside the idempotency records, in the same
 * store (Redis keys, or the tables of the GatewayRecords migration), each
 * kept as long as a record would be.
 *
 * Upstream pins: which upstream an operation's call went to while its
 * outcome is unknown (GATEWAY_UPSTREAMS with more than one upstream for its
 * model): written before the call is sent, removed when the upstream's answer
 * proves no completion was made (the call then falls back), and otherwise
 * kept. A retry of a pinned operation goes to that upstream alone, with the
 * same upstream key: a call that timed out, or whose connection broke after
 * it was sent, may have completed there, and a second upstream would bill a
 * second completion.
 *
 * Responses: each response id the Responses API made through the gateway,
 * with its tenant, upstream and record (ResponseRecord).
 */
export interface GatewayRecords {
  pinned(operation: string): Promise<string | undefined>;
  pin(operation: string, upstream: string, ttlMs: number): Promise<void>;
  /** Removes the pin if it still names `upstream`. */
  unpin(operation: string, upstream: string): Promise<void>;
  recordResponse(responseId: string, record: ResponseRecord, ttlMs: number): Promise<void>;
  response(responseId: string): Promise<ResponseRecord | undefined>;
  forgetResponse(responseId: string): Promise<void>;
}

export const GATEWAY_RECORDS = 'gateway:records';

/** Compare-and-delete: a pin another attempt has written since is left alone. */
const UNPIN = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;
/** A pin, written as the idempotency records are: on a cluster, waiting for a replica (REDIS_DURABILITY). */
const PIN = new RedisScript('gateway-pin', `return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`);

function responseRecordOf(value: unknown): ResponseRecord | undefined {
  const r = value as Partial<ResponseRecord> | null;
  if (typeof r?.tenant !== 'string' || typeof r.upstream !== 'string') return undefined;
  return {
    tenant: r.tenant,
    upstream: r.upstream,
    ...(typeof r.operation === 'string' ? { operation: r.operation } : {}),
  };
}

/** One key per pin (`gateway:pin:<operation>`) and per response (`gateway:response:<id>`), expiring with them. */
export class RedisGatewayRecords implements GatewayRecords {
  constructor(
    private readonly redis: RedisClient,
    private readonly durability?: Durability,
  ) {}

  async pinned(operation: string): Promise<string | undefined> {
    return (await this.redis.get(`gateway:pin:${operation}`)) ?? undefined;
  }

  async pin(operation: string, upstream: string, ttlMs: number): Promise<void> {
    // A pin lost with a master that failed over would let the retry of an unknown outcome fall back.
    await PIN.runDurably(this.redis, [`gateway:pin:${operation}`], [upstream, ttlMs], this.durability);
  }

  async unpin(operation: string, upstream: string): Promise<void> {
    await this.redis.eval(UNPIN, 1, `gateway:pin:${operation}`, upstream);
  }

  async recordResponse(responseId: string, record: ResponseRecord, ttlMs: number): Promise<void> {
    await this.redis.set(`gateway:response:${responseId}`, JSON.stringify(record), 'PX', ttlMs);
  }

  async response(responseId: string): Promise<ResponseRecord | undefined> {
    const raw = await this.redis.get(`gateway:response:${responseId}`);
    if (raw === null) return undefined;
    try {
      return responseRecordOf(JSON.parse(raw));
    } catch {
      return undefined;
    }
  }

  async forgetResponse(responseId: string): Promise<void> {
    await this.redis.del(`gateway:response:${responseId}`);
  }
}

/** A write of either table sweeps up to 100 of its expired rows. */
const sweep = (table: string) => `
  DELETE FROM ${table} WHERE ctid IN (
    SELECT ctid FROM ${table} WHERE expires_at < now() LIMIT 100 FOR UPDATE SKIP LOCKED)`;

/** The tables gateway_upstream_pins and gateway_responses (their migration says why they exist). */
export class PostgresGatewayRecords implements GatewayRecords {
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
      `WITH swept AS (${sweep('gateway_upstream_pins')})
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

  async recordResponse(responseId: string, record: ResponseRecord, ttlMs: number): Promise<void> {
    await this.dataSource.query(
      `WITH swept AS (${sweep('gateway_responses')})
       INSERT INTO gateway_responses (response_id, tenant, upstream, operation, expires_at)
       VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond')
       ON CONFLICT (response_id) DO UPDATE SET tenant = EXCLUDED.tenant, upstream = EXCLUDED.upstream,
         operation = EXCLUDED.operation, expires_at = EXCLUDED.expires_at`,
      [responseId, record.tenant, record.upstream, record.operation ?? null, ttlMs],
    );
  }

  async response(responseId: string): Promise<ResponseRecord | undefined> {
    const rows = await this.dataSource.query<{ tenant: string; upstream: string; operation: string | null }[]>(
      `SELECT tenant, upstream, operation FROM gateway_responses WHERE response_id = $1 AND expires_at > now()`,
      [responseId],
    );
    return rows[0] === undefined
      ? undefined
      : responseRecordOf({ ...rows[0], operation: rows[0].operation ?? undefined });
  }

  async forgetResponse(responseId: string): Promise<void> {
    await this.dataSource.query(`DELETE FROM gateway_responses WHERE response_id = $1`, [responseId]);
  }
}
