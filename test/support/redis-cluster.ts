import { Redis } from 'ioredis';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { testSlot, workerId } from './infra';

/*
 * A local Redis Cluster for one test file: three masters with one replica each,
 * six redis-server processes on a port block of their own
 * (16000 + slot * 100 + worker * 10 + 0..5, cluster bus on port + 10000), each
 * in a temp dir of its own, which stop() kills and removes.
 */

export interface ClusterNodeAddress {
  readonly host: string;
  readonly port: number;
}

/** One line of CLUSTER NODES, as a node sees it. */
export interface ClusterNodeInfo extends ClusterNodeAddress {
  readonly id: string;
  readonly role: 'master' | 'replica';
  /** The id of its master, for a replica. */
  readonly masterId: string | undefined;
  readonly flags: readonly string[];
  /** Inclusive slot ranges, for a master. */
  readonly slots: ReadonlyArray<readonly [first: number, last: number]>;
  /** Flagged `fail` or `fail?` by the node asked. */
  readonly failing: boolean;
}

export interface StartRedisClusterOptions {
  /** How long start, failover() and killMaster() wait for the cluster to settle; 30 s by default. */
  readonly timeoutMs?: number;
  /** cluster-node-timeout, 2000 ms by default: how long until a dead master is failed over. */
  readonly nodeTimeoutMs?: number;
  /** The first of the six ports (the benches' own block); by default the jest worker's (clusterPorts()). */
  readonly basePort?: number;
  /** Every node requires this password (requirepass, and masterauth for its replication); the harness uses it too. */
  readonly password?: string;
  /**
   * Every node serves TLS only, on the same ports (no plain port), cluster bus and replication included, with this
   * certificate (PEM files; it must name 127.0.0.1). Clients need no certificate of their own.
   */
  readonly tls?: ClusterTlsFiles;
}

export interface ClusterTlsFiles {
  readonly certFile: string;
  readonly keyFile: string;
  /** The CA that signed the certificate: the harness's own connections trust it. */
  readonly caFile: string;
}

/** How the harness's own connections (ioredis and redis-cli) reach the nodes. */
interface HarnessAuth {
  readonly password?: string;
  readonly tls?: ClusterTlsFiles;
}

export interface FailoverResult {
  /** The master that stepped down or died. */
  readonly from: number;
  /** Its replica, now master. */
  readonly to: number;
  /** From the command (or the kill) until every node saw the new master and cluster_state:ok. */
  readonly ms: number;
}

export interface RedisCluster {
  readonly seedNodes: readonly ClusterNodeAddress[];
  /** `127.0.0.1:P1,127.0.0.1:P2,...`, for a REDIS_CLUSTER_NODES variable. */
  readonly seedNodesEnv: string;
  readonly ports: readonly number[];
  /** The redis-server processes, for tests that check they are gone. */
  readonly pids: readonly number[];
  /** How long start took, from the first spawn to a settled cluster. */
  readonly startMs: number;
  /** The nodes as a live node sees them now (roles change after a failover), without the dead ones. */
  nodes(): Promise<ClusterNodeInfo[]>;
  masters(): Promise<ClusterNodeInfo[]>;
  replicas(): Promise<ClusterNodeInfo[]>;
  /** The master port serving a slot now. */
  masterOf(slot: number): Promise<number>;
  /** Runs a command on one node, on a connection of the harness. */
  command(port: number, ...args: (string | number)[]): Promise<unknown>;
  /**
   * A manual failover: CLUSTER FAILOVER on the replica of `masterPort` (by
   * default the master of slot 0), then waits until it is master, the old
   * master its replica, and every node sees that with cluster_state:ok.
   */
  failover(masterPort?: number): Promise<FailoverResult>;
  /**
   * SIGKILLs a master (by default the master of slot 0) and waits until its
   * replica is promoted and every live node has cluster_state:ok. The shard
   * has no replica after that.
   */
  killMaster(port?: number): Promise<FailoverResult>;
  /**
   * Moves one slot to the master on `toPort`, as `redis-cli --cluster reshard` does: the target marked IMPORTING and
   * the source MIGRATING, the slot's keys moved in batches (MIGRATE), then the slot given to the target on every
   * master (the target first); resolves once the cluster has settled. `between('marked')` runs before any key moves
   * and `between('moved')` once all have, before the slot is handed over, so a test can put its requests in each.
   */
  moveSlot(slot: number, toPort: number, between?: (step: 'marked' | 'moved') => Promise<void>): Promise<void>;
  /** FLUSHALL on every master. */
  flushAll(): Promise<void>;
  /** Kills every process, waits for them to exit and removes the temp dirs; safe to call twice. */
  stop(): Promise<void>;
}

const HOST = '127.0.0.1';
const NODES = 6;
const MASTERS = 3;
const DIR_PREFIX = 'llmwf-redis-cluster-';

/** The harness's ports: 16000 + slot * 100 + worker * 10 + i, a block no other test uses. */
export function clusterPorts(basePort = 16000 + testSlot() * 100 + workerId() * 10): number[] {
  return Array.from({ length: NODES }, (_, i) => basePort + i);
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A failure waiting longer will not mend. */
class FatalError extends Error {}

/** A redis-server process, and whether it is gone (it exited, or never started). */
interface ServerProcess {
  readonly child: ChildProcess;
  readonly gone: Promise<void>;
  done: boolean;
}

/** Whether something accepts TCP connections on the port. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: HOST, port });
    socket.setTimeout(1000);
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('timeout', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

function probe(port: number, auth: HarnessAuth): Redis {
  const client = new Redis({
    host: HOST,
    port,
    ...(auth.password === undefined ? {} : { password: auth.password }),
    ...(auth.tls === undefined ? {} : { tls: { ca: readFileSync(auth.tls.caFile) } }),
    lazyConnect: true,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    connectTimeout: 1000,
    commandTimeout: 5000,
  });
  client.on('error', () => undefined);
  return client;
}

/**
 * Closes a harness connection. Only while it is open: on a closed one, ioredis's disconnect() arms a timer
 * (disconnectTimeout, 2 s) that nothing clears, which keeps jest from exiting.
 */
function close(client: Redis | undefined): void {
  if (client !== undefined && client.status !== 'end' && client.status !== 'close') client.disconnect();
}

function redisCli(args: string[], timeoutMs: number, auth: HarnessAuth): Promise<string> {
  const authArgs = [
    // --no-auth-warning: redis-cli otherwise warns that -a on a command line is insecure.
    ...(auth.password === undefined ? [] : ['-a', auth.password, '--no-auth-warning']),
    ...(auth.tls === undefined ? [] : ['--tls', '--cacert', auth.tls.caFile]),
  ];
  return new Promise((resolve, reject) => {
    execFile('redis-cli', [...authArgs, ...args], { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err)
        reject(new Error(`redis-cli ${args.join(' ')} ${err.killed ? 'timed out' : 'failed'}: ${stdout}${stderr}`));
      else resolve(stdout);
    });
  });
}

/**
 * Frees a port held by a leftover node of this harness (from a run that died
 * before stop()), recognised by its dir; anything else on the port is an error.
 */
async function clearLeftover(port: number, auth: HarnessAuth): Promise<void> {
  for (const p of [port, port + 10000]) {
    if (!(await listening(p))) continue;
    const serverPort = p === port ? port : p - 10000;
    let dir: string | undefined;
    const client = probe(serverPort, auth);
    try {
      await client.connect();
      const answer = (await client.call('CONFIG', 'GET', 'dir')) as string[];
      dir = answer[1];
    } catch {
      // Not a redis-server we can talk to.
    } finally {
      close(client);
    }
    const ours = dir !== undefined && dirname(dir) === tmpdir() && basename(dir).startsWith(`${DIR_PREFIX}${port}-`);
    if (!ours)
      throw new Error(
        `port ${p} (a Redis Cluster harness node's port or its bus port) is in use by something that is not a ` +
          `leftover node of this harness${dir === undefined ? '' : ` (a redis-server in ${dir})`}`,
      );
    await redisCli(['-h', HOST, '-p', String(port), 'shutdown', 'nosave'], 5000, auth).catch(() => undefined);
    const deadline = Date.now() + 5000;
    while ((await listening(port)) || (await listening(port + 10000))) {
      if (Date.now() > deadline) throw new Error(`leftover cluster node on port ${port} (${dir}) did not shut down`);
      await sleep(50);
    }
    rmSync(dir!, { recursive: true, force: true });
  }
}

function parseClusterNodes(text: string): ClusterNodeInfo[] {
  return text
    .trim()
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => {
      const [id, address, flagText, master, , , , , ...slotFields] = line.trim().split(' ');
      const hostPort = address.split('@')[0];
      const colon = hostPort.lastIndexOf(':');
      const flags = flagText.split(',');
      const slots = slotFields
        .filter((field) => !field.startsWith('[')) // slots being migrated
        .map((field): readonly [number, number] => {
          const [first, last = first] = field.split('-').map(Number);
          return [first, last];
        });
      return {
        id,
        host: hostPort.slice(0, colon),
        port: Number(hostPort.slice(colon + 1)),
        role: flags.includes('master') ? 'master' : 'replica',
        masterId: master === '-' ? undefined : master,
        flags,
        slots,
        failing: flags.includes('fail') || flags.includes('fail?'),
      };
    });
}

function infoField(info: string, field: string): string | undefined {
  return new RegExp(`^${field}:(.*)$`, 'm').exec(info)?.[1]?.trim();
}

export async function startRedisCluster(options: StartRedisClusterOptions = {}): Promise<RedisCluster> {
  const timeoutMs = options.timeoutMs ?? 30_000;
  const nodeTimeoutMs = options.nodeTimeoutMs ?? 2000;
  const ports = clusterPorts(options.basePort);
  const auth: HarnessAuth = { password: options.password, tls: options.tls };
  const servers = new Map<number, ServerProcess>();
  const dirs = new Map<number, string>();
  const clients = new Map<number, Redis>();
  let stopping: Promise<void> | undefined;

  // Should the test process exit without stop(), take the servers along.
  const killAll = (): void => {
    for (const server of servers.values()) if (!server.done) server.child.kill('SIGKILL');
  };
  process.once('exit', killAll);

  const alive = (port: number): boolean => servers.get(port)?.done === false;

  const kill = async (server: ServerProcess): Promise<void> => {
    if (!server.done) server.child.kill('SIGKILL');
    await server.gone;
  };

  const client = async (port: number): Promise<Redis> => {
    let c = clients.get(port);
    if (c === undefined || c.status === 'end' || c.status === 'close') {
      close(c);
      c = probe(port, auth);
      clients.set(port, c);
    }
    if (c.status === 'wait') await c.connect();
    return c;
  };

  const command = async (port: number, ...args: (string | number)[]): Promise<unknown> => {
    const [name, ...rest] = args;
    return (await client(port)).call(String(name), ...rest);
  };

  const logTail = (port: number): string => {
    const dir = dirs.get(port);
    try {
      return readFileSync(join(dir!, 'redis.log'), 'utf8').trim().split('\n').slice(-5).join('\n');
    } catch {
      return '(no log)';
    }
  };

  /** Polls `check` (which answers what is not ready yet, or undefined) until done, or fails naming what was not. */
  const settle = async (what: string, check: () => Promise<string | undefined>): Promise<number> => {
    const started = Date.now();
    for (;;) {
      let lastProblem: string;
      try {
        const problem = await check();
        if (problem === undefined) return Date.now() - started;
        lastProblem = problem;
      } catch (err) {
        if (err instanceof FatalError) throw err;
        lastProblem = (err as Error).message;
      }
      if (Date.now() - started > timeoutMs)
        throw new Error(
          `Redis Cluster (ports ${ports.join(',')}): ${what} not ready after ${timeoutMs} ms: ${lastProblem}`,
        );
      await sleep(50);
    }
  };

  const livePorts = (): number[] => ports.filter(alive);

  const nodesSeenBy = async (port: number): Promise<ClusterNodeInfo[]> =>
    parseClusterNodes((await command(port, 'CLUSTER', 'NODES')) as string);

  const nodes = async (): Promise<ClusterNodeInfo[]> => {
    let lastError: unknown;
    for (const port of livePorts()) {
      try {
        return (await nodesSeenBy(port)).filter((n) => alive(n.port) && !n.failing);
      } catch (err) {
        lastError = err;
      }
    }
    throw new Error(`no live cluster node answers CLUSTER NODES: ${(lastError as Error | undefined)?.message}`);
  };
  const masters = async (): Promise<ClusterNodeInfo[]> => (await nodes()).filter((n) => n.role === 'master');
  const replicas = async (): Promise<ClusterNodeInfo[]> => (await nodes()).filter((n) => n.role === 'replica');
  const masterOf = async (slot: number): Promise<number> => {
    const owner = (await masters()).find((m) => m.slots.some(([first, last]) => slot >= first && slot <= last));
    if (owner === undefined) throw new Error(`no live master serves slot ${slot}`);
    return owner.port;
  };

  /**
   * What is not ready yet, or undefined once every live node has cluster_state:ok, knows the same masters (those
   * expected, with every slot between them, none failing), and every master with a live replica has it connected.
   */
  const clusterProblem = async (expect: { masters?: number[]; replicaOf?: Map<number, number> } = {}) => {
    const live = livePorts();
    let masterSet: string | undefined;
    for (const port of live) {
      const info = (await command(port, 'CLUSTER', 'INFO')) as string;
      const state = infoField(info, 'cluster_state');
      if (state !== 'ok') return `node ${port} reports cluster_state:${state}`;
      const view = (await nodesSeenBy(port)).filter((n) => alive(n.port));
      const handshaking = view.find((n) => n.flags.includes('handshake') || n.flags.includes('noaddr'));
      if (handshaking) return `node ${port} still shakes hands with ${handshaking.port}`;
      if (view.length !== live.length) return `node ${port} knows ${view.length} of the ${live.length} live nodes`;
      const failing = view.find((n) => n.failing);
      if (failing) return `node ${port} flags live node ${failing.port} ${failing.flags.join(',')}`;
      const viewMasters = view.filter((n) => n.role === 'master' && n.slots.length > 0);
      const assigned = viewMasters.reduce((sum, m) => sum + m.slots.reduce((s, [a, b]) => s + b - a + 1, 0), 0);
      if (assigned !== 16384) return `node ${port} sees ${assigned} of 16384 slots on live masters`;
      const set = viewMasters
        .map((m) => m.port)
        .sort()
        .join(',');
      if (masterSet !== undefined && set !== masterSet) return `nodes disagree on the masters: ${masterSet} vs ${set}`;
      masterSet = set;
      if (expect.masters && set !== [...expect.masters].sort().join(','))
        return `node ${port} sees masters ${set}, expected ${[...expect.masters].sort().join(',')}`;
      for (const [replica, master] of expect.replicaOf ?? []) {
        const r = view.find((n) => n.port === replica);
        const m = view.find((n) => n.port === master);
        if (r?.role !== 'replica' || r.masterId !== m?.id)
          return `node ${port} does not see ${replica} as replica of ${master}`;
      }
    }
    // Replication links, from both ends.
    for (const port of live) {
      const info = (await command(port, 'INFO', 'replication')) as string;
      const role = infoField(info, 'role');
      if (role === 'slave') {
        const link = infoField(info, 'master_link_status');
        if (link !== 'up') return `replica ${port} has master_link_status:${link}`;
      } else {
        const view = await nodesSeenBy(port);
        const self = view.find((n) => n.flags.includes('myself'));
        const expected = view.filter((n) => n.role === 'replica' && alive(n.port) && n.masterId === self?.id).length;
        const connected = Number(infoField(info, 'connected_slaves') ?? '0');
        const online = (info.match(/^slave\d+:.*state=online/gm) ?? []).length;
        if (connected < expected || online < expected)
          return `master ${port} has ${online} of ${expected} replicas online (connected_slaves:${connected})`;
      }
    }
    return undefined;
  };

  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      for (const c of clients.values()) close(c);
      clients.clear();
      await Promise.all([...servers.values()].map(kill));
      process.removeListener('exit', killAll);
      for (const dir of dirs.values()) rmSync(dir, { recursive: true, force: true });
    })();
    return stopping;
  };

  const pickMaster = async (
    port: number | undefined,
  ): Promise<{ master: ClusterNodeInfo; replica: ClusterNodeInfo }> => {
    const all = await nodes();
    const master =
      port === undefined
        ? all.find((n) => n.role === 'master' && n.slots.some(([first]) => first === 0))
        : all.find((n) => n.port === port);
    if (master?.role !== 'master') throw new Error(`${port ?? 'slot 0'} is not served by a live master`);
    const replica = all.find((n) => n.role === 'replica' && n.masterId === master.id);
    if (replica === undefined) throw new Error(`master ${master.port} has no live replica to take over`);
    return { master, replica };
  };

  const failover = async (masterPort?: number): Promise<FailoverResult> => {
    // Start from a settled cluster, so the replica is in sync and the old master can rejoin as its replica.
    await settle('cluster before failover', () => clusterProblem());
    const { master, replica } = await pickMaster(masterPort);
    const expectedMasters = (await masters()).map((m) => (m.port === master.port ? replica.port : m.port));
    const started = Date.now();
    let sent = Date.now();
    await command(replica.port, 'CLUSTER', 'FAILOVER');
    await settle(`failover of ${master.port} to ${replica.port}`, async () => {
      const role = infoField((await command(replica.port, 'INFO', 'replication')) as string, 'role');
      if (role !== 'master') {
        // A manual failover that does not complete is dropped after 5 s (CLUSTER_MF_TIMEOUT): ask again.
        if (Date.now() - sent > 6000) {
          sent = Date.now();
          await command(replica.port, 'CLUSTER', 'FAILOVER');
        }
        return `replica ${replica.port} reports role:${role}`;
      }
      return clusterProblem({ masters: expectedMasters, replicaOf: new Map([[master.port, replica.port]]) });
    });
    return { from: master.port, to: replica.port, ms: Date.now() - started };
  };

  const killMaster = async (port?: number): Promise<FailoverResult> => {
    await settle('cluster before killing a master', () => clusterProblem());
    const { master, replica } = await pickMaster(port);
    const expectedMasters = (await masters()).map((m) => (m.port === master.port ? replica.port : m.port));
    const started = Date.now();
    await kill(servers.get(master.port)!);
    close(clients.get(master.port));
    clients.delete(master.port);
    await settle(`promotion of ${replica.port} after killing ${master.port}`, async () => {
      const role = infoField((await command(replica.port, 'INFO', 'replication')) as string, 'role');
      if (role !== 'master') return `replica ${replica.port} reports role:${role}`;
      return clusterProblem({ masters: expectedMasters });
    });
    return { from: master.port, to: replica.port, ms: Date.now() - started };
  };

  const moveSlot = async (
    slot: number,
    toPort: number,
    between: (step: 'marked' | 'moved') => Promise<void> = async () => undefined,
  ): Promise<void> => {
    await settle('cluster before moving a slot', () => clusterProblem());
    const all = await nodes();
    const fromPort = await masterOf(slot);
    const from = all.find((n) => n.port === fromPort);
    const to = all.find((n) => n.port === toPort);
    if (!from || to?.role !== 'master' || fromPort === toPort)
      throw new Error(`cannot move slot ${slot} from ${fromPort} to ${toPort}: not another live master`);
    await command(toPort, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id);
    await command(fromPort, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', to.id);
    await between('marked');
    const authArgs = auth.password === undefined ? [] : ['AUTH', auth.password];
    for (;;) {
      const keys = (await command(fromPort, 'CLUSTER', 'GETKEYSINSLOT', slot, 100)) as string[];
      if (keys.length === 0) break;
      await command(fromPort, 'MIGRATE', HOST, toPort, '', 0, 5000, ...authArgs, 'KEYS', ...keys);
    }
    await between('moved');
    await command(toPort, 'CLUSTER', 'SETSLOT', slot, 'NODE', to.id);
    await command(fromPort, 'CLUSTER', 'SETSLOT', slot, 'NODE', to.id);
    for (const master of await masters())
      if (master.port !== toPort && master.port !== fromPort)
        await command(master.port, 'CLUSTER', 'SETSLOT', slot, 'NODE', to.id);
    await settle(`slot ${slot} moved to ${toPort}`, async () => {
      if ((await masterOf(slot)) !== toPort) return `slot ${slot} is not on ${toPort} yet`;
      return clusterProblem();
    });
  };

  const flushAll = async (): Promise<void> => {
    await Promise.all((await masters()).map((m) => command(m.port, 'FLUSHALL')));
  };

  const started = Date.now();
  try {
    for (const port of ports) await clearLeftover(port, auth);
    for (const port of ports) {
      const dir = mkdtempSync(join(tmpdir(), `${DIR_PREFIX}${port}-`));
      dirs.set(port, dir);
      // stdio ignored, the log goes to the node's dir: an unread pipe would stall the server once full.
      const child = spawn(
        'redis-server',
        [
          ...(options.tls === undefined
            ? ['--port', String(port)]
            : [
                '--port',
                '0',
                '--tls-port',
                String(port),
                '--tls-cluster',
                'yes',
                '--tls-replication',
                'yes',
                '--tls-cert-file',
                options.tls.certFile,
                '--tls-key-file',
                options.tls.keyFile,
                '--tls-ca-cert-file',
                options.tls.caFile,
                '--tls-auth-clients',
                'no',
              ]),
          ...(options.password === undefined
            ? []
            : ['--requirepass', options.password, '--masterauth', options.password]),
          '--bind',
          HOST,
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir, `nodes-${port}.conf`),
          '--cluster-node-timeout',
          String(nodeTimeoutMs),
          '--save',
          '',
          '--appendonly',
          'no',
          // Replicas sync at once, not after the default 5 s wait for more replicas to share one transfer.
          '--repl-diskless-sync-delay',
          '0',
          '--dir',
          dir,
          '--logfile',
          join(dir, 'redis.log'),
          '--daemonize',
          'no',
        ],
        { stdio: 'ignore' },
      );
      const server: ServerProcess = {
        child,
        done: false,
        // 'error' without 'exit' when it could not be spawned at all.
        gone: Promise.race([once(child, 'exit'), once(child, 'error')]).then(
          () => void (server.done = true),
          () => void (server.done = true),
        ),
      };
      servers.set(port, server);
    }
    await settle('redis-server processes', async () => {
      for (const port of ports) {
        const { child } = servers.get(port)!;
        if (!alive(port))
          throw new FatalError(
            `redis-server on port ${port} exited at start (code ${child.exitCode}, signal ${child.signalCode}): ` +
              logTail(port),
          );
        const info = (await command(port, 'INFO', 'server')) as string;
        // Our child must be the one answering.
        if (infoField(info, 'process_id') !== String(child.pid))
          throw new FatalError(`port ${port} is served by another redis-server`);
      }
      return undefined;
    });
    await redisCli(
      ['--cluster', 'create', ...ports.map((p) => `${HOST}:${p}`), '--cluster-replicas', '1', '--cluster-yes'],
      timeoutMs,
      auth,
    );
    await settle('cluster after create', async () => {
      const problem = await clusterProblem();
      if (problem) return problem;
      const all = await nodes();
      const ms = all.filter((n) => n.role === 'master');
      if (ms.length !== MASTERS) return `${ms.length} masters, expected ${MASTERS}`;
      const unpaired = ms.find((m) => !all.some((n) => n.masterId === m.id));
      return unpaired && `master ${unpaired.port} has no replica`;
    });
  } catch (err) {
    await stop();
    throw err;
  }

  const seedNodes = ports.map((port) => ({ host: HOST, port }));
  return {
    seedNodes,
    seedNodesEnv: seedNodes.map((n) => `${n.host}:${n.port}`).join(','),
    ports,
    pids: ports.map((p) => servers.get(p)!.child.pid!),
    startMs: Date.now() - started,
    nodes,
    masters,
    replicas,
    masterOf,
    command,
    failover,
    killMaster,
    moveSlot,
    flushAll,
    stop,
  };
}
