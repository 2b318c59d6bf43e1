import { backoffDelay } from '@app/config';
import { Redis } from 'ioredis';
import type { RedisModuleOptions } from './redis.module-definition';

/** ioredis counts `times` from 1: 100, 200, 400, ... ms, at most 2 s, between reconnects. */
const RECONNECT_BACKOFF = { baseMs: 50, capMs: 2000, jitter: 'none' } as const;

/**
 * A client that fails fast rather than queueing: while Redis is unreachable a
 * command errors at once (enableOfflineQueue false), so callers can fail closed
 * with a 503 instead of hanging. It keeps reconnecting in the background.
 *
 * Auto-pipelined: the commands that concurrent requests send in one turn of
 * the event loop go out in one socket write instead of one write each (the
 * writes were the largest item of the api's profile). Every command keeps its
 * own reply and timeout; ioredis sends the next batch once the one in flight
 * is answered, so while Redis stalls a command may wait up to a timeout for
 * the batch ahead before its own timeout starts: a stalled Redis fails a
 * request in at most twice `commandTimeoutMs`. A blocking read (XREADGROUP BLOCK, XREAD BLOCK)
 * never goes on this connection, where every command behind it would wait out
 * the block: blocking readers take a duplicate of their own, not pipelined.
 */
export function createRedisClient(options: RedisModuleOptions): Redis {
  return new Redis(options.url, {
    connectionName: options.connectionName,
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    commandTimeout: options.commandTimeoutMs ?? 2000,
    connectTimeout: options.connectTimeoutMs ?? 5000,
    retryStrategy: (times) => backoffDelay(times, RECONNECT_BACKOFF),
    // On shutdown, a socket that does not close after QUIT is destroyed this soon.
    disconnectTimeout: 500,
    enableAutoPipelining: options.autoPipelining ?? true,
  });
}

/** Connects, or gives up after the timeout and lets the client retry on its own. */
export async function connectOrContinue(client: Redis, timeoutMs: number): Promise<boolean> {
  if (client.status === 'ready') return true;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), timeoutMs);
  });
  const connect =
    client.status === 'wait'
      ? client.connect().then(
          () => true,
          () => false,
        )
      : new Promise<boolean>((resolve) => client.once('ready', () => resolve(true)));
  try {
    return await Promise.race([connect, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
