import { RedisScript } from '@app/redis';
import type { Redis } from 'ioredis';
import type { ClaimResult, IdempotencyStore, StoredResponse } from './idempotency-store.interface';

/*
 * A record is a hash under `idem:<key>`:
 *   running:   state=running   token=<random>  fp=<sha256>  started=<ms>   TTL = lock TTL
 *   completed: state=completed status headers body fp                    TTL = result TTL
 * A completed record has no token, so no stale token can match it. `started`
 * and the `now` returned with a running record are both Redis's clock, so how
 * long a request has run is known alike on every api instance.
 */
const CLAIM = new RedisScript(
  'idempotency-claim',
  `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local rec = redis.call('HGETALL', KEYS[1])
if #rec == 0 then
  redis.call('HSET', KEYS[1], 'state', 'running', 'token', ARGV[1], 'fp', ARGV[2], 'started', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
return {'existing', redis.call('PTTL', KEYS[1]), now, unpack(rec)}`,
);

const COMPLETE = new RedisScript(
  'idempotency-complete',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'completed', 'fp', ARGV[2], 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1`,
);

const RELEASE = new RedisScript(
  'idempotency-release',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1`,
);

const RENEW = new RedisScript(
  'idempotency-renew',
  `if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`,
);

export class RedisIdempotencyStore implements IdempotencyStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix = 'idem:',
  ) {}

  async claim(key: string, token: string, fingerprint: string, lockTtlMs: number): Promise<ClaimResult> {
    const reply = await CLAIM.run<[string, ...(string | number)[]]>(this.redis, [this.prefix + key], [
      token,
      fingerprint,
      lockTtlMs,
    ]);
    if (reply[0] === 'claimed') return { outcome: 'claimed' };
    const pttl = Number(reply[1]);
    const now = Number(reply[2]);
    const record = new Map<string, string>();
    for (let i = 3; i < reply.length; i += 2) record.set(String(reply[i]), String(reply[i + 1]));
    const fp = record.get('fp') ?? '';
    if (record.get('state') === 'completed') {
      return {
        outcome: 'completed',
        fingerprint: fp,
        response: {
          status: Number(record.get('status')),
          headers: JSON.parse(record.get('headers') ?? '{}') as Record<string, string>,
          body: record.get('body') ?? '',
        },
      };
    }
    // A record written before `started` existed has run for an unknown time: 0.
    const started = Number(record.get('started') ?? now);
    return { outcome: 'in-progress', fingerprint: fp, runningForMs: Math.max(0, now - started), expiresInMs: pttl > 0 ? pttl : lockTtlMs };
  }

  async complete(
    key: string,
    token: string,
    fingerprint: string,
    response: StoredResponse,
    resultTtlMs: number,
  ): Promise<boolean> {
    const ok = await COMPLETE.run<number>(this.redis, [this.prefix + key], [
      token,
      fingerprint,
      response.status,
      JSON.stringify(response.headers),
      response.body,
      resultTtlMs,
    ]);
    return ok === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await RELEASE.run<number>(this.redis, [this.prefix + key], [token])) === 1;
  }

  async renew(key: string, token: string, lockTtlMs: number): Promise<boolean> {
    return (await RENEW.run<number>(this.redis, [this.prefix + key], [token, lockTtlMs])) === 1;
  }
}
