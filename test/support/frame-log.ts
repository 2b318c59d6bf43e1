import type { Redis } from 'ioredis';

/**
 * The frames a running streamed answer has in its Redis record so far, joined; undefined while its head is not
 * in. `record` is the record's key (`idem:` + the operation). Read as RedisIdempotencyStore writes its frame log
 * (`{<record>}:f:<token>`, entries `h` for the head and `d` for a frame), for tests that must act mid-stream.
 */
export async function recordedFrames(redis: Redis, record: string): Promise<string | undefined> {
  const token = await redis.hget(record, 'token');
  if (token === null) return undefined;
  const entries = await redis.xrange(`{${record}}:f:${token}`, '-', '+');
  if (!entries.some(([, fields]) => fields[0] === 'h')) return undefined;
  return entries
    .filter(([, fields]) => fields[0] === 'd')
    .map(([, fields]) => fields[1])
    .join('');
}
