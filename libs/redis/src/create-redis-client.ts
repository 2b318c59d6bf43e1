import { backoffDelay } from '@app/config';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import type { RedisModuleOptions } from './redis.module-definition';

/**
 * What the apps talk to: one Redis, or a Redis Cluster (REDIS_CLUSTER_NODES).
 * The commands are the same; on a cluster each goes to the master of its
 * key's slot, and every command, script or MULTI must keep its keys in one
 * slot (the project's keys share hash tags where they must go together).
 */
export type RedisClient = Redis | Cluster;

type DnsCallback = (err: NodeJS.ErrnoException | null, address: string) => void;

/** How often a cluster client reads the slot map again on its own (CLUSTER SLOTS, one small reply). */
const SLOTS_REFRESH_INTERVAL_MS = 5000;
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
export function createRedisClient(options: RedisModuleOptions): RedisClient {
  const common = {
    connectionName: options.connectionName,
    maxRetriesPerRequest: 0,
    commandTimeout: options.commandTimeoutMs ?? 2000,
    connectTimeout: options.connectTimeoutMs ?? 5000,
    // On shutdown, a socket that does not close after QUIT is destroyed this soon.
    disconnectTimeout: 500,
  } satisfies RedisOptions;
  if (options.clusterNodes?.nodes.length) {
    const { nodes, username, password, tls } = options.clusterNodes;
    return new Cluster(
      nodes.map(({ host, port }) => ({ host, port })),
      {
        lazyConnect: true,
        enableOfflineQueue: false,
        // A batch that meets MOVED (a failover moving slots) is sent again only when all of it failed alike, so a few
        // commands fail, and their requests answer 503, during a failover (docs/redis-cluster.md has the figures);
        // RedisScript.runDurably learns the slots and resends its own pipeline.
        enableAutoPipelining: options.autoPipelining ?? true,
        // Writes and reads alike go to the slot's master: a replica may lag behind the write it is asked about.
        scaleReads: 'master',
        clusterRetryStrategy: (times) => backoffDelay(times, RECONNECT_BACKOFF),
        // While a failover runs (a few seconds: the replica waits cluster-node-timeout), a command
        // redirected or refused with CLUSTERDOWN retries instead of failing at once; 16 × 300 ms
        // outlasts a failover at the default node timeout of the local test cluster.
        retryDelayOnFailover: 300,
        retryDelayOnClusterDown: 300,
        retryDelayOnTryAgain: 100,
        maxRedirections: 16,
        slotsRefreshTimeout: options.connectTimeoutMs ?? 5000,
        // A backstop: a client that only ever met failed pipelines after a failover would otherwise keep a stale
        // slot map until some single command was redirected.
        slotsRefreshInterval: SLOTS_REFRESH_INTERVAL_MS,
        // Every node connection, the ones to nodes discovered later included, logs in and encrypts alike. With TLS
        // the certificate is checked against Node's CA store (NODE_EXTRA_CA_CERTS for a private CA). ioredis would
        // otherwise resolve a node's name to an IP before connecting, and the name in the certificate no longer
        // matches: AWS documents this lookup, which leaves the name for TLS to check, for TLS clusters.
        ...(tls ? { dnsLookup: (address: string, callback: DnsCallback) => callback(null, address) } : {}),
        redisOptions: {
          ...common,
          ...(username === undefined ? {} : { username }),
          ...(password === undefined ? {} : { password }),
          ...(tls ? { tls: {} } : {}),
        },
      },
    );
  }
  return new Redis(options.url, {
    ...common,
    lazyConnect: true,
    enableOfflineQueue: false,
    retryStrategy: (times) => backoffDelay(times, RECONNECT_BACKOFF),
    enableAutoPipelining: options.autoPipelining ?? true,
  });
}

/**
 * A connection of its own for blocking reads (XREADGROUP BLOCK, XREAD
 * BLOCK), which must never share the auto-pipelined client: every command
 * behind a blocked one would wait out the block. On a cluster, a cluster
 * client of its own (one connection to each master it reads from).
 */
export function duplicateForBlocking(
  client: RedisClient,
  overrides: { readonly connectionName: string; readonly commandTimeout?: number },
): RedisClient {
  const own = {
    connectionName: overrides.connectionName,
    ...(overrides.commandTimeout === undefined ? {} : { commandTimeout: overrides.commandTimeout }),
  };
  // Connects at once, and queues what is sent meanwhile (the command timeout still bounds the wait).
  const flags = { lazyConnect: false, enableOfflineQueue: true, enableAutoPipelining: false };
  if (client instanceof Cluster)
    return client.duplicate(undefined, { ...flags, redisOptions: { ...client.options.redisOptions, ...own } });
  return client.duplicate({ ...flags, ...own });
}

/** The connection name a client was made with (CLIENT LIST shows it). */
export function connectionNameOf(client: RedisClient): string | undefined {
  return client instanceof Cluster ? client.options.redisOptions?.connectionName : client.options.connectionName;
}

/** Connects, or gives up after the timeout and lets the client retry on its own. */
export async function connectOrContinue(client: RedisClient, timeoutMs: number): Promise<boolean> {
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
