import { keySlot, partitionTags } from '@app/redis';
import { Cluster, Redis } from 'ioredis';
import { connect } from 'node:net';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * The Redis Cluster harness itself, and what the code will lean on: hash tags
 * spread over the masters, partitionTags puts partitions on different masters,
 * and an ioredis Cluster client rides through a manual failover and the loss of
 * a master.
 */

const portOpen = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });

/** The pool's connection to a master: WAIT counts the writes sent on the connection it is sent on. */
function poolNode(cluster: Cluster, port: number): Redis {
  const node = cluster.nodes('master').find((n) => n.options.port === port);
  if (node === undefined) throw new Error(`the Cluster client has no connection to master ${port}`);
  return node;
}

/**
 * Reads and writes one key in a loop through the client until stopped, and
 * tells what went wrong meanwhile: what a worker on the cluster would see.
 */
function traffic(cluster: Cluster, key: string) {
  const errors: string[] = [];
  let ops = 0;
  let slowestMs = 0;
  let running = true;
  const loop = (async () => {
    for (let i = 0; running; i++) {
      const started = Date.now();
      try {
        await cluster.set(key, String(i));
        await cluster.get(key);
        ops++;
      } catch (err) {
        errors.push((err as Error).message);
      }
      slowestMs = Math.max(slowestMs, Date.now() - started);
      await new Promise((r) => setTimeout(r, 10));
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return { ops, slowestMs, errors: [...new Set(errors)], errorCount: errors.length };
    },
  };
}

describe('Redis Cluster harness', () => {
  let redisCluster: RedisCluster;
  let cluster: Cluster;
  const clientErrors: string[] = [];

  beforeAll(async () => {
    redisCluster = await startRedisCluster();
    console.log(`cluster started in ${redisCluster.startMs} ms on ${redisCluster.seedNodesEnv}`);
    // Defaults, spelled out: reads from masters, retries after 100 ms on a closed connection or CLUSTERDOWN. And a
    // shorter disconnectTimeout: a slots refresh that tried the killed master leaves a timer of that length behind
    // (ioredis arms it on a socket that has already closed), which kept jest from exiting for 2 s.
    cluster = new Cluster([...redisCluster.seedNodes], {
      scaleReads: 'master',
      retryDelayOnFailover: 100,
      retryDelayOnClusterDown: 100,
      redisOptions: { disconnectTimeout: 100 },
    });
    cluster.on('error', (err: Error) => clientErrors.push(err.message));
    await new Promise<void>((resolve, reject) => {
      cluster.once('ready', resolve);
      cluster.once('error', reject);
    });
  }, 60_000);

  afterAll(async () => {
    cluster?.disconnect();
    await redisCluster?.stop();
  });

  it('has three masters, each with a replica, and every slot served', async () => {
    const masters = await redisCluster.masters();
    const replicas = await redisCluster.replicas();
    expect(masters).toHaveLength(3);
    expect(replicas).toHaveLength(3);
    for (const m of masters) expect(replicas.filter((r) => r.masterId === m.id)).toHaveLength(1);
    const slots = masters.flatMap((m) => m.slots).reduce((n, [first, last]) => n + last - first + 1, 0);
    expect(slots).toBe(16384);
    expect(redisCluster.seedNodesEnv).toBe(redisCluster.ports.map((p) => `127.0.0.1:${p}`).join(','));
  });

  it('keySlot agrees with CLUSTER KEYSLOT', async () => {
    const keys = ['foo', '{summaries}:jobs', '{}x', 'a{b}c{d}', '{a{b}c}', '{unclosed', 'héllo{wörld}', '🙂', ''];
    for (let i = 0; i < 200; i++) keys.push(`key:${i}`, `{tag-${i}}:x`);
    const port = redisCluster.ports[0];
    for (const key of keys)
      expect([key, await redisCluster.command(port, 'CLUSTER', 'KEYSLOT', key)]).toEqual([key, keySlot(key)]);
  });

  it('puts keys with different hash tags on different masters', async () => {
    await redisCluster.flushAll();
    const tags = Array.from({ length: 30 }, (_, i) => `tag${i}`);
    for (const tag of tags) await cluster.set(`{${tag}}:k`, tag);
    const owners = new Map<number, string[]>();
    for (const tag of tags) {
      const port = await redisCluster.masterOf(keySlot(`{${tag}}`));
      owners.set(port, [...(owners.get(port) ?? []), tag]);
    }
    // Thirty tags over three equal slot ranges: every master gets some.
    expect(owners.size).toBe(3);
    for (const [port, owned] of owners) {
      // Each master holds exactly the keys whose slots it serves.
      const keys = (await redisCluster.command(port, 'KEYS', '*')) as string[];
      expect(keys.sort()).toEqual(owned.map((t) => `{${t}}:k`).sort());
    }
  });

  it("puts partitionTags('summaries', 3) on three different masters", async () => {
    await redisCluster.flushAll();
    const tags = partitionTags('summaries', 3);
    expect(tags).not.toContain('summaries'); // a layout of several shares no key with the single stream
    const ports: number[] = [];
    for (const tag of tags) {
      const key = `{${tag}}:jobs`;
      const slot = (await redisCluster.command(redisCluster.ports[0], 'CLUSTER', 'KEYSLOT', key)) as number;
      expect(slot).toBe(keySlot(key));
      await cluster.xadd(key, '*', 'tag', tag);
      const port = await redisCluster.masterOf(slot);
      expect(await redisCluster.command(port, 'XLEN', key)).toBe(1);
      ports.push(port);
    }
    expect(new Set(ports).size).toBe(3);
    // In partition order too, since redis-cli gives the masters ascending slot ranges.
    const bySlot = (await redisCluster.masters()).sort((a, b) => a.slots[0][0] - b.slots[0][0]).map((m) => m.port);
    expect(ports).toEqual(bySlot);
  });

  it('keeps a value across a manual failover, through the same client', async () => {
    await redisCluster.flushAll();
    const key = '{failover}:value';
    await cluster.set(key, 'before');
    const owner = await redisCluster.masterOf(keySlot(key));
    expect(await poolNode(cluster, owner).call('WAIT', 1, 1000)).toBe(1);

    const load = traffic(cluster, '{failover}:load');
    const result = await redisCluster.failover(owner);
    const seen = await load.stop();
    console.log(`manual failover ${result.from} -> ${result.to} took ${result.ms} ms; traffic meanwhile`, seen);

    expect(result.from).toBe(owner);
    expect(await cluster.get(key)).toBe('before');
    const masters = (await redisCluster.masters()).map((m) => m.port);
    expect(masters).toContain(result.to);
    expect(masters).not.toContain(result.from);
    expect((await redisCluster.replicas()).map((r) => r.port)).toContain(result.from);
    expect(await redisCluster.masterOf(keySlot(key))).toBe(result.to);
    await cluster.set(key, 'after');
    expect(await redisCluster.command(result.to, 'GET', key)).toBe('after');
  }, 60_000);

  it('keeps working after a master is killed', async () => {
    const key = '{killed}:value';
    await cluster.set(key, 'before');
    const owner = await redisCluster.masterOf(keySlot(key));
    expect(await poolNode(cluster, owner).call('WAIT', 1, 1000)).toBe(1);

    const load = traffic(cluster, '{killed}:load');
    const result = await redisCluster.killMaster(owner);
    const started = Date.now();
    // The client may still be finding out (its next slots refresh, or an error on the dead connection).
    let recoveredMs: number | undefined;
    while (recoveredMs === undefined && Date.now() - started < 15_000) {
      try {
        await cluster.set('{killed}:probe', 'x');
        recoveredMs = Date.now() - started;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    const seen = await load.stop();
    console.log(
      `killed master ${result.from}, ${result.to} promoted in ${result.ms} ms; client working ${recoveredMs} ms ` +
        'after that; traffic meanwhile',
      seen,
      'client errors',
      [...new Set(clientErrors)],
    );

    expect(recoveredMs).toBeDefined();
    expect(await cluster.get(key)).toBe('before');
    expect(await redisCluster.masterOf(keySlot(key))).toBe(result.to);
    const masters = (await redisCluster.masters()).map((m) => m.port);
    expect(masters).toHaveLength(3);
    expect(masters).not.toContain(result.from);
    // The other shards never noticed.
    for (const tag of partitionTags('summaries', 3)) await cluster.xadd(`{${tag}}:jobs`, '*', 'after', 'kill');
  }, 60_000);

  it('stop() leaves no process and nothing listening on the ports, and may be called twice', async () => {
    cluster.disconnect();
    await redisCluster.stop();
    await redisCluster.stop();
    expect(redisCluster.pids).toHaveLength(6);
    for (const pid of redisCluster.pids) expect(() => process.kill(pid, 0)).toThrow(/ESRCH/);
    for (const port of redisCluster.ports) {
      expect([port, await portOpen(port)]).toEqual([port, false]);
      expect([port + 10000, await portOpen(port + 10000)]).toEqual([port + 10000, false]);
    }
  });
});
