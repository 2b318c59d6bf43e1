import { jobIdFor } from '@app/summary-queue';
import { QueueLayout } from '@app/workflows';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { DataSource, QueryRunner } from 'typeorm';
import { adminCli } from '../support/admin-cli';
import { type ApiHarness, bearer, startApi, TENANT_A } from '../support/api-harness';
import { type AppProcess, startAppProcess } from '../support/app-process';
import { localPortsOf } from '../support/process-sockets';
import { FakeOpenAiServer, type ModelReply } from '../support/fake-openai-server';
import {
  eventually,
  freePort,
  freshRedis,
  testDatabaseUrl,
  testDataSource,
  testRedisUrl,
  truncateAll,
} from '../support/infra';

/*
 * The triage workflow (classify → draft → notify) run by the BUILT worker
 * (dist/apps/worker/main.js) as a process, killed with SIGKILL at each point
 * where a crash can cut a step short; a new worker finishes the run. Runs are
 * started with POST /v1/triage and read with GET /v1/runs/<id> on the api
 * (in process, listening, its gateway in front of the fake model). Each test
 * asserts the effects: the model calls the fake saw per step, the
 * workflow_steps rows and their attempts, the outbox rows, the run's status
 * and output, and the stream empty at the end.
 *
 * The fault seams are real infrastructure, never a hook in the engine: a
 * model answer the fake holds, a row lock in PostgreSQL, `CLIENT PAUSE WRITE`
 * in Redis. Events are ordered by waiting on real effects (a request at the
 * fake, a row's status, a backend waiting on a lock), never by sleeping.
 */
const QUEUE = new QueueLayout('workflows', 1);
const [P] = QUEUE.partitions;
const GROUP = 'workflows';
const INTERNAL_KEY = 'internal-key-crash-0123456789';
const ADMIN = { key: 'admin-key-crash-0123456789abcdef' };
const TEXT = 'My invoice for March was charged twice. Please refund the second charge of 49 EUR.';
const INPUT = { ticket_id: 'T-7', text: TEXT, notify: 'agent@example.com' };
const DRAFT = 'Dear customer, we are refunding the second charge.';
const OUTPUT = { category: 'billing', draft: DRAFT };
const STEPS = ['classify', 'draft', 'notify'] as const;
type StepName = (typeof STEPS)[number];
/** Long enough for what it covers; a test waits on effects, and these only bound how long a broken run takes. */
const WAIT_MS = 20_000;

/** Which step a request at the fake model is for: the draft's user message starts with the category. */
const stepOf = (userText: string): Exclude<StepName, 'notify'> =>
  userText.startsWith('Category:') ? 'draft' : 'classify';

/** A model answer the test holds: `reached` once the request is at the fake, answered with `release`'s reply. */
interface Held {
  readonly reached: Promise<void>;
  release(reply?: ModelReply): void;
  readonly reply: () => Promise<ModelReply>;
}
function held(): Held {
  let reach!: () => void;
  let answer!: (reply: ModelReply) => void;
  const reached = new Promise<void>((r) => (reach = r));
  const answered = new Promise<ModelReply>((r) => (answer = r));
  return {
    reached,
    release: (reply = { kind: 'complete', content: '' }) => answer(reply),
    reply: () => {
      reach();
      return answered;
    },
  };
}

describe('triage runs when the worker process is killed (SIGKILL)', () => {
  let api: ApiHarness;
  let apiUrl: string;
  let redis: Redis;
  let db: DataSource;
  let model: FakeOpenAiServer;
  /** What the fake model answers per step (called once per request). */
  let replies: Record<Exclude<StepName, 'notify'>, () => ModelReply | Promise<ModelReply>>;
  let workers: AppProcess[] = [];
  const holds: Held[] = [];
  let port = 0;

  const answers = {
    classify: (): ModelReply => ({ kind: 'complete', content: '  billing \n' }),
    draft: (): ModelReply => ({ kind: 'complete', content: DRAFT }),
  };
  /** Holds the next request for `step` at the fake: the answer never comes unless released. */
  const hold = (step: Exclude<StepName, 'notify'>): Held => {
    const h = held();
    holds.push(h);
    let first = true;
    const after = replies[step];
    replies[step] = () => {
      if (!first) return after();
      first = false;
      return h.reply();
    };
    return h;
  };

  /** The built worker on this suite's Redis and PostgreSQL, the fake model its provider unless `env` says else. */
  const worker = async (env: Record<string, string> = {}): Promise<AppProcess> => {
    // Ports 60 to 99 of this jest worker's block, in turn: a port comes back round only long after its worker exited.
    const w = await startAppProcess('worker', freePort(60 + (port++ % 40)), {
      REDIS_URL: testRedisUrl(),
      DATABASE_URL: testDatabaseUrl(),
      LOG_LEVEL: 'info',
      LLM_PROVIDER: 'openai',
      OPENAI_API_KEY: 'sk-worker',
      OPENAI_BASE_URL: model.baseUrl,
      // A dead worker's entries are reclaimed a second after its last lease refresh.
      CLAIM_IDLE_MS: '1000',
      ...env,
    });
    workers.push(w);
    return w;
  };
  /** In gateway mode: the api's gateway is the only way to the model (a direct call would go nowhere). */
  const gatewayEnv = (): Record<string, string> => ({
    LLM_GATEWAY_URL: apiUrl,
    INTERNAL_API_KEY: INTERNAL_KEY,
    OPENAI_BASE_URL: 'http://127.0.0.1:9/v1',
  });
  const kill = async (w: AppProcess): Promise<void> => {
    w.kill('SIGKILL');
    expect(await w.exited).toEqual({ code: null, signal: 'SIGKILL' });
  };

  /** POST /v1/triage under a new key; the run id is the key's (INTERFACE.md: jobIdFor of the operation). */
  const start = async (key = `crash-${randomUUID()}`): Promise<string> => {
    const res = await fetch(`${apiUrl}/v1/triage`, {
      method: 'POST',
      headers: { authorization: bearer(TENANT_A), 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(INPUT),
    });
    expect(res.status).toBe(202);
    const { run_id: runId } = (await res.json()) as { run_id: string };
    expect(runId).toBe(runIdOf(key));
    return runId;
  };
  const runIdOf = (key: string) => jobIdFor(`${TENANT_A.tenant}:POST:/v1/triage:${key}`);
  const runOf = async (runId: string): Promise<Record<string, unknown>> => {
    const res = await fetch(`${apiUrl}/v1/runs/${runId}`, { headers: { authorization: bearer(TENANT_A) } });
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, unknown>;
  };
  /** The run as GET /v1/runs answers it, once its status is `status`. */
  const runWhen = (runId: string, status: string) =>
    eventually(
      async () => {
        const run = await runOf(runId);
        return run.status === status ? run : undefined;
      },
      WAIT_MS,
      `run ${runId} ${status}`,
    );
  const admin = async (method: 'GET' | 'POST', path: string): Promise<Record<string, unknown>> => {
    const res = await fetch(`${apiUrl}${path}`, { method, headers: { authorization: bearer(ADMIN) } });
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, unknown>;
  };

  /** The model calls the fake saw for each step, with their Idempotency-Key and whether the caller hung up. */
  const callsOf = (step: Exclude<StepName, 'notify'>) => model.requests.filter((r) => stepOf(r.userText) === step);
  const calls = () => ({ classify: callsOf('classify').length, draft: callsOf('draft').length });
  const stepRows = async () =>
    (
      await db.query<{ step: string; status: string; attempts: number }[]>(
        `SELECT step, status, attempts FROM workflow_steps ORDER BY array_position($1::text[], step)`,
        [STEPS],
      )
    ).map((r) => [r.step, r.status, r.attempts]);
  const stepStatus = async (runId: string, step: StepName) =>
    (
      await db.query<{ status: string }[]>(`SELECT status FROM workflow_steps WHERE run_id = $1 AND step = $2`, [
        runId,
        step,
      ])
    )[0]?.status;
  const outbox = () => db.query(`SELECT topic, dedupe_key, payload FROM outbox ORDER BY id`);
  /** The steps' entries on the stream, by their step (the first step's entry names none). */
  const entries = async () =>
    (await redis.xrange(P.jobs, '-', '+')).map(([, f]) => {
      const at = f.findIndex((v, i) => i % 2 === 0 && v === 'step');
      return at < 0 ? 'classify' : f[at + 1];
    });
  const pending = async () => Number(((await redis.xpending(P.jobs, GROUP)) as [number])[0]);
  /**
   * The ids of the Redis clients that process `pid` holds: its sockets' local ports matched with CLIENT LIST's
   * `addr` (CLIENT LIST is a read: it answers while writes are paused).
   */
  const redisClientsOf = async (pid: number): Promise<string[]> => {
    const ports = await localPortsOf(pid);
    return clientList()
      .then((list) => list.filter((c) => ports.has(c.port)))
      .then((list) => list.map((c) => c.id));
  };
  const clientList = async (): Promise<{ id: string; port: number }[]> =>
    ((await redis.client('LIST')) as string)
      .split('\n')
      .filter(Boolean)
      .map((line) => ({
        id: /^id=(\d+)/.exec(line)?.[1] ?? '',
        port: Number(/ addr=[^ ]*:(\d+) /.exec(line)?.[1] ?? -1),
      }));
  /** Once the run is done: the stream is empty and nothing is pending. */
  const streamDrained = () =>
    eventually(
      async () => ((await redis.xlen(P.jobs)) === 0 && (await pending()) === 0 ? true : undefined),
      WAIT_MS,
      'the stream empty',
    );
  const triageReady = (runId: string) => ({
    topic: 'email.triage_ready',
    dedupe_key: `triage_ready:${runId}`,
    payload: { run_id: runId, to: INPUT.notify, category: 'billing' },
  });

  /**
   * The seam before the last step's commit: the test's own transaction holds an uncommitted outbox row of the
   * run's dedupe key, so notify's commit (its INSERT ... ON CONFLICT) waits on it.
   */
  const holdOutboxRow = async (runId: string): Promise<{ lock: QueryRunner; pid: number }> => {
    const lock = db.createQueryRunner();
    await lock.connect();
    await lock.startTransaction();
    await lock.query(`INSERT INTO outbox (topic, dedupe_key, payload) VALUES ('test.lock', $1, '{}')`, [
      `triage_ready:${runId}`,
    ]);
    const [{ pid }] = (await lock.query('SELECT pg_backend_pid() AS pid')) as { pid: number }[];
    return { lock, pid };
  };
  /**
   * The backend blocked by the test's transaction (`holder`): the worker's, and only a step's commit writes the
   * outbox, so it is notify's commit, waiting.
   */
  const commitWaitingOn = (holder: number) =>
    eventually(
      async () =>
        (
          await db.query<{ pid: number }[]>(
            `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) AND application_name = 'worker'`,
            [holder],
          )
        )[0]?.pid,
      WAIT_MS,
      'notify’s commit waiting on the test’s transaction',
    );
  /**
   * The seam between a step's commit and its ack: from `CLIENT PAUSE WRITE` on, Redis holds every write (the
   * ack's MULTI: XADD of the next step, XACK, XDEL) while reads go on. `release` lets the step go on to its
   * commit; once the step's row is `done` the worker is killed, and Redis is unpaused only after it has dropped
   * the dead worker's connections, so that MULTI never runs.
   */
  const killBetweenCommitAndAck = async (
    dying: AppProcess,
    runId: string,
    step: StepName,
    release: () => Promise<void>,
  ): Promise<void> => {
    const clients = await redisClientsOf(dying.pid);
    expect(clients.length).toBeGreaterThan(0);
    try {
      await redis.client('PAUSE', 60_000, 'WRITE');
      await release();
      await eventually(
        async () => ((await stepStatus(runId, step)) === 'done' ? true : undefined),
        WAIT_MS,
        `${step} committed`,
      );
      await kill(dying);
      await eventually(
        async () => ((await clientList()).some((c) => clients.includes(c.id)) ? undefined : true),
        WAIT_MS,
        'the dead worker’s Redis connections closed',
      );
    } finally {
      await redis.client('UNPAUSE');
    }
  };

  beforeAll(async () => {
    db = await testDataSource();
    model = await new FakeOpenAiServer((_n, text) => replies[stepOf(text)]()).start();
    api = await startApi({
      env: {
        LLM_PROVIDER: 'openai',
        OPENAI_API_KEY: 'sk-upstream',
        OPENAI_BASE_URL: model.baseUrl,
        INTERNAL_API_KEY: INTERNAL_KEY,
        ADMIN_API_KEY: ADMIN.key,
      },
    });
    await api.app.listen(0, '127.0.0.1');
    apiUrl = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
  }, 60_000);
  afterAll(async () => {
    await api?.close();
    await model?.stop();
    await db?.destroy();
  });
  beforeEach(async () => {
    redis = await freshRedis();
    await truncateAll(db);
    model.requests.length = 0;
    replies = { ...answers };
  });
  afterEach(async () => {
    await redis.client('UNPAUSE');
    for (const h of holds.splice(0)) h.release({ kind: 'error', status: 500 });
    for (const w of workers) w.kill('SIGKILL');
    await Promise.all(workers.map((w) => w.exited));
    workers = [];
    redis.disconnect();
  });

  /*
   * Killed before a step's commit: the last step's commit is held in
   * PostgreSQL (the test's transaction has inserted, not committed, an outbox
   * row of the same dedupe key, so the commit's INSERT ... ON CONFLICT waits
   * on it). The dying worker's connections check their client every 100 ms
   * (client_connection_check_interval), so its backend ends with it and the
   * statement rolls back, as a commit not yet sent would be.
   *   t0  classify and draft run and commit; notify's commit waits on the row lock
   *   t1  SIGKILL; the backend of the waiting commit ends: nothing of notify is committed
   *   t2  the test's transaction rolls back; nothing in the outbox
   *   t3  a new worker reclaims notify's entry (idle past CLAIM_IDLE_MS), runs and commits it
   * The guarantee: a step cut off before its commit leaves nothing behind and
   * is run again; the steps committed before it are not.
   */
  it('killed before a step’s commit: nothing of it is left, it runs again, the run finishes once', async () => {
    const key = `crash-${randomUUID()}`;
    const runId = runIdOf(key);
    const { lock, pid: holder } = await holdOutboxRow(runId);
    try {
      const checked = new URL(testDatabaseUrl());
      checked.searchParams.set('options', '-c client_connection_check_interval=100');
      const dying = await worker({ DATABASE_URL: checked.toString() });
      await start(key);
      const backend = await commitWaitingOn(holder);
      await kill(dying);
      await eventually(
        async () =>
          (await db.query<unknown[]>(`SELECT 1 FROM pg_stat_activity WHERE pid = $1`, [backend])).length === 0
            ? true
            : undefined,
        WAIT_MS,
        'the dead worker’s backend gone',
      );
      await lock.rollbackTransaction();
    } finally {
      await lock.release();
    }

    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 1],
      ['notify', 'running', 1],
    ]);
    expect(await outbox()).toEqual([]);
    expect(await runOf(runId)).toMatchObject({ status: 'running' });
    expect(await entries()).toEqual(['notify']);
    expect(await pending()).toBe(1);

    await worker();
    expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
    await streamDrained();
    expect(calls()).toEqual({ classify: 1, draft: 1 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 1],
      ['notify', 'done', 2],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
  }, 60_000);

  /*
   * Killed after the step's commit and before its ack. The seam is Redis
   * itself: `CLIENT PAUSE WRITE` holds every write (the ack's MULTI: XADD of
   * the next step, XACK, XDEL) while reads go on.
   *   t0  classify's model call is at the fake, held
   *   t1  CLIENT PAUSE WRITE; the answer is released; classify commits in PostgreSQL
   *       (the test waits on its row turning `done`); its ack MULTI waits on the pause
   *   t2  SIGKILL; once Redis has dropped the dead worker's connections, CLIENT UNPAUSE:
   *       the MULTI never ran, classify's entry is still pending and no draft entry exists
   *   t3  a new worker reclaims classify's entry: its row is done, so it is not run
   *       again, only advanced (draft's entry added, classify's acked)
   * The guarantee: a committed step is never run again (one classify call, one
   * attempt), and the next step runs once.
   */
  it('killed after a step’s commit and before its ack: the step is not run again, the next runs once', async () => {
    const classify = hold('classify');
    const dying = await worker();
    const runId = await start();
    await classify.reached;
    await killBetweenCommitAndAck(dying, runId, 'classify', async () => classify.release(answers.classify()));
    expect(await stepRows()).toEqual([['classify', 'done', 1]]);
    expect(await entries()).toEqual(['classify']);
    expect(await pending()).toBe(1);
    expect(calls()).toEqual({ classify: 1, draft: 0 });

    await worker();
    expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
    await streamDrained();
    expect(calls()).toEqual({ classify: 1, draft: 1 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 1],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
  }, 60_000);

  /*
   * The same crash after the last step's commit, the one that writes the
   * outbox row. Both seams: notify's commit waits on the test's row lock
   * (holdOutboxRow) until Redis is paused, then commits; its ack is held.
   *   t0  classify and draft run; notify's commit waits on the lock
   *   t1  CLIENT PAUSE WRITE; the test's transaction rolls back; notify commits (the
   *       outbox row, the run done); its ack waits on the pause
   *   t2  SIGKILL; the dead worker's connections dropped; CLIENT UNPAUSE
   *   t3  a new worker reclaims notify's entry: done, so only acked
   * The guarantee: the run's effects stay as the one commit wrote them: one
   * outbox row, every step one attempt, the run done.
   */
  it('killed after the last step’s commit and before its ack: one outbox row, nothing run again', async () => {
    const key = `crash-${randomUUID()}`;
    const runId = runIdOf(key);
    const { lock, pid: holder } = await holdOutboxRow(runId);
    try {
      const dying = await worker();
      await start(key);
      await commitWaitingOn(holder);
      await killBetweenCommitAndAck(dying, runId, 'notify', () => lock.rollbackTransaction());
    } finally {
      await lock.release();
    }
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 1],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
    expect(await entries()).toEqual(['notify']);
    expect(await pending()).toBe(1);

    await worker();
    await streamDrained();
    expect(await runOf(runId)).toMatchObject({ status: 'done', output: OUTPUT });
    expect(calls()).toEqual({ classify: 1, draft: 1 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 1],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
  }, 60_000);

  describe('killed while a model call is in flight', () => {
    /*
     * Without the gateway the worker calls the provider itself, which keeps
     * no record of a call whose caller died (the documented limit).
     *   t0  classify's model call is at the fake, held; SIGKILL: the call is cut off, unanswered
     *       (a run's first step on its first delivery runs before any row is written: none yet)
     *   t1  a new worker reclaims classify's entry and runs it again: a second model call,
     *       under the same Idempotency-Key (a provider that honoured it would answer once)
     * The guarantee: the step's second run is the only other effect; the step
     * commits once and everything after it happens once.
     */
    it('without the gateway: the redelivered step calls the model again (two calls, one key), the rest once', async () => {
      hold('classify');
      const dying = await worker();
      const runId = await start();
      await eventually(() => (callsOf('classify').length === 1 ? true : undefined), WAIT_MS, 'classify’s call');
      await kill(dying);
      expect(await stepRows()).toEqual([]);

      await worker();
      expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
      await streamDrained();
      expect(calls()).toEqual({ classify: 2, draft: 1 });
      // The redelivery began the step: its row counts both deliveries.
      expect((await stepRows())[0]).toEqual(['classify', 'done', 2]);
      expect(callsOf('classify').map((r) => [r.headers['idempotency-key'], r.closedEarly])).toEqual([
        [expect.stringMatching(new RegExp(`^wf:${runId}:classify:0:[0-9a-f]{16}$`)), true],
        [expect.stringMatching(new RegExp(`^wf:${runId}:classify:0:[0-9a-f]{16}$`)), false],
      ]);
      expect(callsOf('classify')[1].headers['idempotency-key']).toBe(callsOf('classify')[0].headers['idempotency-key']);
      expect(await stepRows()).toEqual([
        ['classify', 'done', 2],
        ['draft', 'done', 1],
        ['notify', 'done', 1],
      ]);
      expect(await outbox()).toEqual([triageReady(runId)]);
    }, 60_000);

    /*
     * With the gateway (INTERNAL_API_KEY, LLM_GATEWAY_URL) the api makes the
     * upstream call and records it under the call's Idempotency-Key in the
     * run's tenant.
     *   t0  classify's call is upstream at the fake, held; SIGKILL: the worker's
     *       connection to the gateway closes, the gateway's upstream call goes on
     *   t1  a new worker reclaims classify's entry (its row: attempt 2) and calls
     *       the gateway with the same key
     *   t2  the fake answers the one upstream call; the redelivery gets that answer
     *       (attached to the running call, or from the record)
     * The guarantee: exactly one upstream call for the step, and the run completes.
     */
    it('with the gateway: exactly one upstream call for the step, and the run completes', async () => {
      const classify = hold('classify');
      const dying = await worker(gatewayEnv());
      const runId = await start();
      await classify.reached;
      await kill(dying);

      await worker(gatewayEnv());
      await eventually(
        async () => ((await stepRows())[0]?.[2] === 2 ? true : undefined),
        WAIT_MS,
        'classify redelivered',
      );
      classify.release(answers.classify());
      expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
      await streamDrained();
      expect(calls()).toEqual({ classify: 1, draft: 1 });
      // Upstream saw the api's provider key: the worker's calls went through the gateway, none directly.
      expect(model.requests.map((r) => r.headers.authorization)).toEqual(['Bearer sk-upstream', 'Bearer sk-upstream']);
      expect(callsOf('classify')[0].closedEarly).toBe(false);
      expect(await stepRows()).toEqual([
        ['classify', 'done', 2],
        ['draft', 'done', 1],
        ['notify', 'done', 1],
      ]);
      expect(await outbox()).toEqual([triageReady(runId)]);
    }, 60_000);

    /*
     * The upstream call ends while no worker is alive.
     *   t0  classify's call is upstream at the fake, held; SIGKILL
     *   t1  the fake answers; the gateway records the completion under the call's key
     *   t2  a new worker reclaims classify's entry and calls with the same key:
     *       answered from the record
     * The guarantee: one upstream call for the step, the answer the dead worker never got.
     */
    it('with the gateway, the call answered after the worker died: the redelivery gets it from the record', async () => {
      const classify = hold('classify');
      const dying = await worker(gatewayEnv());
      const runId = await start();
      await classify.reached;
      await kill(dying);
      classify.release(answers.classify());
      // The call's key ends in its request's digest: the record is the one key of the call's prefix.
      const records = await redis.keys(`idem:${TENANT_A.tenant}:POST:/v1/chat/completions:wf:${runId}:classify:0:*`);
      const [record] = records.filter((k) => /:classify:0:[0-9a-f]{16}$/.test(k));
      expect(record).toBeDefined();
      await eventually(
        async () => ((await redis.hget(record, 'state')) === 'completed' ? true : undefined),
        WAIT_MS,
        'the gateway’s record of the call completed',
      );

      await worker(gatewayEnv());
      expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
      await streamDrained();
      expect(calls()).toEqual({ classify: 1, draft: 1 });
      expect(await stepRows()).toEqual([
        ['classify', 'done', 2],
        ['draft', 'done', 1],
        ['notify', 'done', 1],
      ]);
      expect(await outbox()).toEqual([triageReady(runId)]);
    }, 60_000);
  });

  /*
   * Killed between two steps.
   *   t0  classify runs, commits and is acked (its entry gone, draft's entry added)
   *   t1  draft's model call is at the fake, held; SIGKILL
   *   t2  a new worker reclaims draft's entry, which carries classify's output in
   *       its state: classify is neither run nor read again
   * The guarantee: the first step's model call is not made again.
   */
  it('killed between two steps: the first step’s model call is not made again', async () => {
    const draft = hold('draft');
    const dying = await worker();
    const runId = await start();
    await draft.reached;
    expect(await entries()).toEqual(['draft']);
    await kill(dying);
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'running', 1],
    ]);

    await worker();
    expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
    await streamDrained();
    // The draft's call was cut off and made again (no gateway: the documented limit); classify's, once.
    expect(calls()).toEqual({ classify: 1, draft: 2 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 2],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
  }, 60_000);

  /*
   * A step whose worker dies on every delivery. MAX_DELIVERIES=2.
   *   t0  worker A: classify's first delivery, its model call never answered; SIGKILL
   *   t1  worker B reclaims it (delivery 2): the same; SIGKILL
   *   t2  worker C reclaims it (delivery 3, one too many): dead-lettered unrun
   *   t3  the model is fixed; a re-drive through the admin API: the step runs once more, the run finishes
   * The guarantee: one delivery too many fails the run and dead-letters the
   * step, not a loop; a re-drive starts its count afresh.
   */
  it('a step killed on every delivery is dead-lettered past MAX_DELIVERIES, the run failed; a re-drive finishes it', async () => {
    replies.classify = () => ({ kind: 'hang' });
    const env = { MAX_DELIVERIES: '2' };
    const runId = await start();
    for (const n of [1, 2]) {
      const dying = await worker(env);
      await eventually(() => (callsOf('classify').length === n ? true : undefined), WAIT_MS, `classify’s call ${n}`);
      await kill(dying);
    }
    expect(await stepRows()).toEqual([['classify', 'running', 2]]);

    await worker(env);
    expect(await runWhen(runId, 'failed')).toMatchObject({
      status: 'failed',
      error: expect.stringContaining('max_deliveries'),
    });
    const listed = (await admin('GET', '/admin/dead-letters?workflow=triage')).dead_letters as Record<
      string,
      unknown
    >[];
    // The first step's entry names no step (wire.ts: absent is the first), so neither does its dead letter.
    expect(listed).toEqual([expect.objectContaining({ workflow: 'triage', jobId: runId, reason: 'max_deliveries' })]);
    await eventually(
      async () => ((await stepStatus(runId, 'classify')) === 'failed' ? true : undefined),
      WAIT_MS,
      'the step marked failed',
    );
    expect(await pending()).toBe(0);
    expect(calls()).toEqual({ classify: 2, draft: 0 });

    replies.classify = answers.classify;
    await admin('POST', `/admin/dead-letters/${String(listed[0].id)}/redrive`);
    expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
    await streamDrained();
    expect(calls()).toEqual({ classify: 3, draft: 1 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 3],
      ['draft', 'done', 1],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
    expect(await redis.xlen(P.dead)).toBe(0);
  }, 90_000);

  /*
   * A permanent failure: the model answers the draft with a 400, which no
   * retry mends. The run fails and the step is dead-lettered (the admin API
   * lists it under workflow triage); once the model is fixed, a re-drive
   * through the admin API runs the step once more and the run finishes.
   */
  it('a model 400 fails the run and dead-letters the step; after a fix, a re-drive runs it once and the run is done', async () => {
    replies.draft = () => ({ kind: 'error', status: 400 });
    await worker();
    const runId = await start();
    // Failed once its step row says so too: GET reads PostgreSQL and the run's Redis record side by side, and
    // the record (marked failed by the dead letter, just after the row) can be read a moment before the row.
    const failed = await eventually(
      async () => {
        const run = await runOf(runId);
        return run.status === 'failed' && (run.steps as { status: string }[])[1]?.status === 'failed' ? run : undefined;
      },
      WAIT_MS,
      `run ${runId} failed with its draft step`,
    );
    expect(failed).toMatchObject({
      status: 'failed',
      steps: [
        { name: 'classify', status: 'done' },
        { name: 'draft', status: 'failed' },
        { name: 'notify', status: 'pending' },
      ],
    });
    const listed = (await admin('GET', '/admin/dead-letters?workflow=triage')).dead_letters as Record<
      string,
      unknown
    >[];
    expect(listed).toEqual([
      expect.objectContaining({ workflow: 'triage', step: 'draft', jobId: runId, reason: 'llm_client' }),
    ]);
    // The admin CLI shows the same, for workflow triage.
    const cli = adminCli()('dead-letters', 'list', '--workflow', 'triage');
    expect(cli.code).toBe(0);
    expect(JSON.parse(cli.out).dead_letters).toEqual([expect.objectContaining({ id: listed[0].id, step: 'draft' })]);
    expect(calls()).toEqual({ classify: 1, draft: 1 });
    expect(await outbox()).toEqual([]);
    expect(await pending()).toBe(0);

    replies.draft = answers.draft;
    await admin('POST', `/admin/dead-letters/${String(listed[0].id)}/redrive`);
    expect(await runWhen(runId, 'done')).toMatchObject({ output: OUTPUT });
    await streamDrained();
    expect(calls()).toEqual({ classify: 1, draft: 2 });
    expect(await stepRows()).toEqual([
      ['classify', 'done', 1],
      ['draft', 'done', 2],
      ['notify', 'done', 1],
    ]);
    expect(await outbox()).toEqual([triageReady(runId)]);
    expect((await admin('GET', '/admin/dead-letters?workflow=triage')).dead_letters).toEqual([]);
    expect(await redis.xlen(P.dead)).toBe(0);
  }, 60_000);
});
