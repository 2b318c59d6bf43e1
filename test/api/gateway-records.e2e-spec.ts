import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import {
  type GatewayRecords,
  PostgresGatewayRecords,
  RedisGatewayRecords,
} from '../../apps/api/src/gateway/gateway-records';
import { freshRedis, testDataSource } from '../support/infra';

const DAY_MS = 86_400_000;

/**
 * The gateway's own records (upstream pins, and the responses it made) on
 * each store, as the api builds them: what one attempt writes another reads,
 * the compare-and-delete of a pin, and the retention: each record lives as
 * long as it was given (IDEMPOTENCY_RESULT_TTL_S, as the idempotency
 * records), and one past it is gone for every reader.
 */
describe.each([
  {
    store: 'redis',
    async open() {
      const redis = await freshRedis();
      const records = new RedisGatewayRecords(redis);
      // The key's own time to live, in ms.
      const ttlOf = async (kind: 'pin' | 'response', id: string) => redis.pttl(`gateway:${kind}:${id}`);
      // Past its time: an expiry in the past, which Redis applies at once, as it would at the end of the TTL.
      const expire = async (kind: 'pin' | 'response', id: string) => {
        await redis.pexpireat(`gateway:${kind}:${id}`, 1);
      };
      return {
        records,
        ttlOf,
        expire,
        close: (): Promise<void> => {
          redis.disconnect();
          return Promise.resolve();
        },
      };
    },
  },
  {
    store: 'postgres',
    async open() {
      const ds: DataSource = await testDataSource();
      const records = new PostgresGatewayRecords(ds);
      const table = { pin: ['gateway_upstream_pins', 'operation'], response: ['gateway_responses', 'response_id'] };
      const ttlOf = async (kind: 'pin' | 'response', id: string) => {
        const [name, column] = table[kind];
        const rows = await ds.query<{ ms: string }[]>(
          `SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint AS ms FROM ${name} WHERE ${column} = $1`,
          [id],
        );
        return Number(rows[0]?.ms ?? -2);
      };
      // Past its time: the row stays until a sweep, but no reader sees it.
      const expire = async (kind: 'pin' | 'response', id: string) => {
        const [name, column] = table[kind];
        await ds.query(`UPDATE ${name} SET expires_at = now() - interval '1 second' WHERE ${column} = $1`, [id]);
      };
      return { records, ttlOf, expire, close: (): Promise<void> => ds.destroy() };
    },
  },
])('the gateway’s records on $store', ({ open }) => {
  let records: GatewayRecords;
  let ttlOf: (kind: 'pin' | 'response', id: string) => Promise<number>;
  let expire: (kind: 'pin' | 'response', id: string) => Promise<void>;
  let close: () => Promise<void>;
  const operation = () => `tenant-a:POST:/v1/chat/completions:${randomUUID()}`;

  beforeAll(async () => {
    ({ records, ttlOf, expire, close } = await open());
  });
  afterAll(() => close());

  it('a pin: read back, replaced by a later attempt’s, removed only while it still names the upstream', async () => {
    const op = operation();
    await expect(records.pinned(op)).resolves.toBeUndefined();
    await records.pin(op, 'primary', DAY_MS);
    await expect(records.pinned(op)).resolves.toBe('primary');
    await records.pin(op, 'secondary', DAY_MS);
    await records.unpin(op, 'primary');
    await expect(records.pinned(op)).resolves.toBe('secondary');
    await records.unpin(op, 'secondary');
    await expect(records.pinned(op)).resolves.toBeUndefined();
  });

  it('a response: its tenant, upstream and operation read back; forgotten on request', async () => {
    const keyed = `resp_${randomUUID()}`;
    const keyless = `resp_${randomUUID()}`;
    const op = operation();
    await records.recordResponse(keyed, { tenant: 'tenant-a', upstream: 'primary', operation: op }, DAY_MS);
    await records.recordResponse(keyless, { tenant: 'tenant-b', upstream: 'secondary' }, DAY_MS);
    await expect(records.response(keyed)).resolves.toEqual({ tenant: 'tenant-a', upstream: 'primary', operation: op });
    await expect(records.response(keyless)).resolves.toEqual({ tenant: 'tenant-b', upstream: 'secondary' });
    await records.forgetResponse(keyed);
    await expect(records.response(keyed)).resolves.toBeUndefined();
    await expect(records.response(`resp_${randomUUID()}`)).resolves.toBeUndefined();
  });

  it('each lives as long as it was given, and one past its time is gone', async () => {
    const op = operation();
    const id = `resp_${randomUUID()}`;
    // Two times of their own, neither the default retention's day, so a store that kept its own time would fail.
    const given = { pin: 3_700_000, response: 5_400_000 };
    await records.pin(op, 'primary', given.pin);
    await records.recordResponse(id, { tenant: 'tenant-a', upstream: 'primary' }, given.response);
    for (const [kind, key] of [
      ['pin', op],
      ['response', id],
    ] as const) {
      const ttl = await ttlOf(kind, key);
      // Within the time it was given, less what this test has taken since (a minute is far more than that).
      expect(ttl).toBeGreaterThan(given[kind] - 60_000);
      expect(ttl).toBeLessThanOrEqual(given[kind]);
    }
    await expire('pin', op);
    await expire('response', id);
    await expect(records.pinned(op)).resolves.toBeUndefined();
    await expect(records.response(id)).resolves.toBeUndefined();
  });
});
