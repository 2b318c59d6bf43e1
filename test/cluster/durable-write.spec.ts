import { keySlot, MasterReplicas, NotReplicatedError, RedisScript } from '@app/redis';
import { Registry } from 'prom-client';
import { Cluster, Redis } from 'ioredis';
import { freshRedis } from '../support/infra';
import { startRedisCluster, type RedisCluster } from '../support/redis-cluster';

/*
 * RedisScript.runDurably: the script and WAIT in one pipeline, on the master
 * of the keys' slot, so an acknowledged write is on a replica too; and a
 * clear NotReplicatedError when no replica confirms it in time.
 */

const SET_IT = new RedisScript('test-durable-set', `redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]`);

/** Whether `done()` became true while the event loop turned a few thousand times (a bound, not a timing). */
async function until(done: () => boolean, turns = 5000): Promise<boolean> {
  for (let i = 0; i < turns && !done(); i++) await new Promise((r) => setImmediate(r));
  return done();
}

describe('RedisScript.runDurably', () => {
  let cluster: RedisCluster;
  let client: Cluster;

  beforeAll(async () => {
    cluster = await startRedisCluster();
    client = new Cluster(
      cluster.seedNodes.map((n) => ({ ...n })),
      { redisOptions: { disconnectTimeout: 100 } },
    );
  }, 60_000);
  afterAll(async () => {
    client?.disconnect();
    await cluster?.stop();
  });

  /** The replica serving `slot`'s master, as the cluster sees it now. */
  async function replicaOf(slot: number): Promise<{ port: number; pid: number }> {
    const master = await cluster.masterOf(slot);
    const nodes = await cluster.nodes();
    const masterId = nodes.find((n) => n.port === master)?.id;
    const replica = nodes.find((n) => n.role === 'replica' && n.masterId === masterId);
    if (!replica) throw new Error(`no replica for master ${master}`);
    return { port: replica.port, pid: cluster.pids[cluster.ports.indexOf(replica.port)] };
  }

  it('acknowledges once a replica holds the write: it is there when read from the replica', async () => {
    for (const key of ['{a}:durable', '{b}:durable', '{c}:durable']) {
      await expect(SET_IT.runDurably(client, [key], ['v1'], { replicas: 1, timeoutMs: 1000 })).resolves.toBe('v1');
      const { port } = await replicaOf(keySlot(key));
      const replica = new Redis({ host: '127.0.0.1', port, lazyConnect: true });
      await replica.connect();
      try {
        await replica.call('READONLY');
        expect(await replica.get(key)).toBe('v1');
      } finally {
        replica.disconnect();
      }
    }
  });

  it('a replica that does not answer: NotReplicatedError after the wait, and the write stands on the master', async () => {
    const key = '{paused}:durable';
    const { pid } = await replicaOf(keySlot(key));
    process.kill(pid, 'SIGSTOP');
    try {
      const err = await SET_IT.runDurably(client, [key], ['v2'], { replicas: 1, timeoutMs: 300 }).catch((e) => e);
      expect(err).toBeInstanceOf(NotReplicatedError);
      expect(err).toMatchObject({ acknowledged: 0, wanted: 1, timeoutMs: 300 });
      expect(await client.get(key)).toBe('v2');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
  });

  it('a replica that does not answer is a refusal in replica mode too: it is the one a failover would promote', async () => {
    const key = '{paused-replica-mode}:durable';
    const { pid } = await replicaOf(keySlot(key));
    process.kill(pid, 'SIGSTOP');
    try {
      const durability = { replicas: 1, timeoutMs: 300, mode: 'replica' as const, masters: new MasterReplicas() };
      const err = await SET_IT.runDurably(client, [key], ['v'], durability).catch((e) => e);
      expect(err).toBeInstanceOf(NotReplicatedError);
      expect(err).toMatchObject({ acknowledged: 0, reason: 'not-confirmed' });
    } finally {
      process.kill(pid, 'SIGCONT');
    }
  });

  it('a user denied ROLE: concurrent writes are all sent at once, each waiting for the replica, which confirms them', async () => {
    const key = '{role-denied}:durable';
    const master = await cluster.masterOf(keySlot(key));
    const { pid } = await replicaOf(keySlot(key));
    const masters = new MasterReplicas();
    const durability = { replicas: 1, timeoutMs: 60_000, mode: 'replica' as const, masters };
    await cluster.command(master, 'ACL', 'SETUSER', 'default', '-role');
    let paused = false;
    try {
      // One write first: it finds the master will not say, which the writes after it must not wait to learn again.
      await expect(SET_IT.runDurably(client, [key], ['first'], durability)).resolves.toBe('first');
      expect(masters.replicasOf(`127.0.0.1:${master}`)).toBe('unknown');
      const connection = client.nodes('master').find((n) => n.options.port === master);
      if (!connection) throw new Error(`no connection to ${master}`);
      const queuedBefore = connection.commandQueue.length;
      process.kill(pid, 'SIGSTOP');
      paused = true;
      // The replica is stopped: the first WAIT blocks the connection, so each write is either sent (its script, WAIT
      // and ROLE queued on that connection) or held back in this process waiting for another write.
      const values = Array.from({ length: 40 }, (_, i) => `w${i}`);
      const writes = values.map((v) => SET_IT.runDurably(client, [key], [v], durability));
      const allSent = await until(() => connection.commandQueue.length - queuedBefore >= values.length * 3);
      expect(connection.commandQueue.length - queuedBefore).toBe(values.length * 3);
      expect(allSent).toBe(true);
      process.kill(pid, 'SIGCONT');
      paused = false;
      await expect(Promise.all(writes)).resolves.toEqual(values);
      expect(await client.get(key)).toBe('w39');
    } finally {
      if (paused) process.kill(pid, 'SIGCONT');
      await cluster.command(master, 'ACL', 'SETUSER', 'default', '+role');
      masters.close();
    }
  });

  it('a slot moved while the slot map read is stale: the write follows the node MOVED names', async () => {
    const key = '{moved}:durable';
    const slot = keySlot(key);
    await expect(SET_IT.runDurably(client, [key], ['before'], { replicas: 1, timeoutMs: 1000 })).resolves.toBe(
      'before',
    );
    const from = await cluster.masterOf(slot);
    const to = (await cluster.masters()).find((m) => m.port !== from);
    if (!to) throw new Error('no other master');
    // Every node asked for the slot map (CLUSTER SLOTS) still answers the old one: gossip has not told it yet.
    const refresh = client.refreshSlotsCache;
    let refreshes = 0;
    client.refreshSlotsCache = (callback) => {
      refreshes++;
      callback?.();
    };
    try {
      await cluster.moveSlot(slot, to.port);
      expect(client.slots[slot]?.[0]).toBe(`127.0.0.1:${from}`);
      await expect(SET_IT.runDurably(client, [key], ['after'], { replicas: 1, timeoutMs: 1000 })).resolves.toBe(
        'after',
      );
      expect(await cluster.command(to.port, 'GET', key)).toBe('after');
      expect(client.slots[slot]?.[0]).toBe(`127.0.0.1:${to.port}`);
      expect(refreshes).toBeGreaterThan(0);
    } finally {
      client.refreshSlotsCache = refresh;
    }
  });

  it('a slot that moves while a write waits for the one learning its master: the new master is learnt under its name', async () => {
    const key = '{moved-while-learning}:durable';
    const slot = keySlot(key);
    const from = await cluster.masterOf(slot);
    const to = (await cluster.masters()).find((m) => m.port !== from);
    if (!to) throw new Error('no other master');
    const connection = client.nodes('master').find((n) => n.options.port === from);
    if (!connection) throw new Error(`no connection to ${from}`);
    const connectionId = Number(await connection.call('CLIENT', 'ID'));
    // The script loaded on both: a NOSCRIPT would send a write again, and the node be looked up again anyway.
    for (const port of [from, to.port]) await cluster.command(port, 'SCRIPT', 'LOAD', SET_IT.lua);
    const masters = new MasterReplicas();
    // Two replicas asked of a master with one: its WAIT blocks until this test unblocks it, the learning write held.
    const learningWrite = SET_IT.runDurably(client, [key], ['first'], { replicas: 2, timeoutMs: 20_000, masters });
    const waiting = SET_IT.runDurably(client, [key], ['second'], { replicas: 1, timeoutMs: 1000, masters });
    void Promise.allSettled([learningWrite, waiting]); // awaited below; a failure on the way must not crash jest
    expect(masters.learning(`127.0.0.1:${from}`)).toBeDefined();
    await cluster.moveSlot(slot, to.port);
    await new Promise<void>((resolve) => client.refreshSlotsCache(() => resolve()));
    expect(client.slots[slot]?.[0]).toBe(`127.0.0.1:${to.port}`);
    expect(await cluster.command(from, 'CLIENT', 'UNBLOCK', connectionId)).toBe(1);
    await expect(learningWrite).rejects.toMatchObject({ reason: 'not-confirmed', acknowledged: 1 });
    await expect(waiting).resolves.toBe('second');
    expect(await cluster.command(to.port, 'GET', key)).toBe('second');
    expect(masters.replicasOf(`127.0.0.1:${to.port}`)).toBe('some');
  });

  it('ASK naming a master the slot map does not list (no slot yet): the write goes there on a connection of its own', async () => {
    const key = '{ask-unlisted}:durable';
    const slot = keySlot(key);
    const from = await cluster.masterOf(slot);
    const to = (await cluster.masters()).find((m) => m.port !== from);
    if (!to) throw new Error('no other master');
    await SET_IT.runDurably(client, ['{ask-unlisted}:warm'], ['w'], { replicas: 1, timeoutMs: 1000 });
    // The client forgets `to`, and every slot map it reads is the one it has: as for a master added with no slot.
    const refresh = client.refreshSlotsCache;
    client.refreshSlotsCache = (callback) => callback?.();
    const connection = client.nodes('master').find((n) => n.options.port === to.port);
    if (!connection) throw new Error(`no connection to ${to.port}`);
    const forgotten = new Promise((resolve) => client.once('-node', resolve));
    connection.disconnect();
    await forgotten;
    expect(client.nodes('master').map((n) => n.options.port)).not.toContain(to.port);
    try {
      let written: unknown;
      await cluster.moveSlot(slot, to.port, async (step) => {
        // The key is on neither node yet: the source answers ASK, naming `to`.
        if (step === 'marked')
          written = await SET_IT.runDurably(client, [key], ['asked'], { replicas: 1, timeoutMs: 1000 });
      });
      expect(written).toBe('asked');
      expect(await cluster.command(to.port, 'GET', key)).toBe('asked');
      expect(client.nodes('master').map((n) => n.options.port)).toContain(to.port);
    } finally {
      client.refreshSlotsCache = refresh;
      await new Promise<void>((resolve) => client.refreshSlotsCache(() => resolve()));
    }
  });

  it('a replica back online on a master written without WAIT: the write waits for it then, and is not refused', async () => {
    const key = '{replica-returned}:durable';
    const master = await cluster.masterOf(keySlot(key));
    await SET_IT.runDurably(client, [key], ['warm'], { replicas: 1, timeoutMs: 1000 });
    const registry = new Registry();
    const masters = new MasterReplicas(registry);
    // What a write found a moment ago, before the replica (re)synced: none.
    masters.observe(`127.0.0.1:${master}`, 0);
    const durability = { replicas: 1, timeoutMs: 1000, mode: 'replica' as const, masters };
    await expect(SET_IT.runDurably(client, [key], ['returned'], durability)).resolves.toBe('returned');
    expect(masters.replicasOf(`127.0.0.1:${master}`)).toBe('some');
    const { port } = await replicaOf(keySlot(key));
    const replica = new Redis({ host: '127.0.0.1', port, lazyConnect: true });
    await replica.connect();
    try {
      await replica.call('READONLY');
      expect(await replica.get(key)).toBe('returned');
    } finally {
      replica.disconnect();
    }
    expect(await registry.getSingleMetricAsString('redis_unreplicated_writes_total')).toMatch(
      /^redis_unreplicated_writes_total 0$/m,
    );
    masters.close();
  });

  it('a master left without a replica: replica mode writes and counts, strict refuses saying why', async () => {
    const key = '{alone}:durable';
    await cluster.killMaster(await cluster.masterOf(keySlot(key)));
    const registry = new Registry();
    const replica = { replicas: 1, timeoutMs: 1000, mode: 'replica' as const, masters: new MasterReplicas(registry) };
    for (const value of ['w1', 'w2', 'w3'])
      await expect(SET_IT.runDurably(client, [key], [value], replica)).resolves.toBe(value);
    expect(await registry.getSingleMetricAsString('redis_unreplicated_writes_total')).toMatch(
      /^redis_unreplicated_writes_total 3$/m,
    );
    const strict = { replicas: 1, timeoutMs: 1000, mode: 'strict' as const, masters: new MasterReplicas() };
    const err = await SET_IT.runDurably(client, [key], ['w4'], strict).catch((e) => e);
    expect(err).toBeInstanceOf(NotReplicatedError);
    expect(err).toMatchObject({ reason: 'no-replica', value: 'w4' });
    replica.masters.close();
  }, 60_000);

  it('a script the master has not seen (after a failover, a restart) runs through the EVAL fallback', async () => {
    await client.script('FLUSH');
    for (const master of await cluster.masters()) await cluster.command(master.port, 'SCRIPT', 'FLUSH');
    await expect(SET_IT.runDurably(client, ['{d}:durable'], ['v3'], { replicas: 1, timeoutMs: 1000 })).resolves.toBe(
      'v3',
    );
  });

  it('a script error is the script error, not a replication failure', async () => {
    const FAILS = new RedisScript('test-durable-fails', `return redis.error_reply('ERR no such thing')`);
    await expect(FAILS.runDurably(client, ['{e}:durable'], [], { replicas: 1, timeoutMs: 1000 })).rejects.toThrow(
      'no such thing',
    );
  });

  it('on one Redis without replicas: no durability asked is a plain run; one replica asked is refused', async () => {
    const redis = await freshRedis();
    try {
      await expect(SET_IT.runDurably(redis, ['k'], ['v'], undefined)).resolves.toBe('v');
      await expect(SET_IT.runDurably(redis, ['k'], ['v'], { replicas: 1, timeoutMs: 50 })).rejects.toBeInstanceOf(
        NotReplicatedError,
      );
    } finally {
      redis.disconnect();
    }
  });
});
