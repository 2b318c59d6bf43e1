import { OUTBOX_CHANNEL } from '@app/persistence';
import type { ServerResponse } from 'node:http';
import type { DataSource } from 'typeorm';
import { type AppProcess, type BuiltApp, startAppProcess } from '../support/app-process';
import { eventually, freePort, testDatabaseUrl, testDataSource, testRedisUrl, truncateAll } from '../support/infra';
import { RecordingServer } from '../support/recording-server';

/*
 * Stopping an app is not a failure: on SIGTERM (Kubernetes, compose) and on
 * SIGINT (Ctrl-C under `npm start`) each app drains and exits 0. Ctrl-C
 * reaches an app twice, from the terminal and again from concurrently, which
 * forwards it: the repeat must not kill the app (`exited with code SIGINT`,
 * and npm start answering 130). A third signal is someone asking again: a
 * drain that hangs ends then, without waiting for a SIGKILL.
 */

const ENV = {
  REDIS_URL: testRedisUrl(),
  DATABASE_URL: testDatabaseUrl(),
  API_KEYS: 'stop:stop-key-0123456789',
  LOG_LEVEL: 'info',
};

/** The line each app logs as its first stop signal arrives, and the one for a repeat. */
const STOPPING = /^SIG(INT|TERM): stopping/;
const AGAIN = /^SIG(INT|TERM) again: still stopping/;
const logged = (proc: AppProcess, msg: RegExp) =>
  eventually(() => proc.lines.find((l) => typeof l.msg === 'string' && msg.test(l.msg)), 10_000, `a line ${msg}`);

describe.each<[BuiltApp, number]>([
  ['api', 90],
  ['worker', 91],
  ['relay', 92],
])('the %s process, stopped', (app, port) => {
  it.each<NodeJS.Signals>(['SIGINT', 'SIGTERM'])(
    'exits 0 on %s, sent twice as Ctrl-C sends it',
    async (signal) => {
      const proc = await startAppProcess(app, freePort(port), ENV);
      // Back to back: the repeat comes while the app drains, or after Nest has let go of its own handlers.
      proc.kill(signal);
      proc.kill(signal);
      expect({ exit: await proc.exited, stderr: proc.stderr() }).toEqual({
        exit: { code: 0, signal: null },
        stderr: '',
      });
      expect(proc.lines.some((l) => l.msg === 'Nest application successfully started')).toBe(true);
      expect(proc.lines.some((l) => typeof l.msg === 'string' && STOPPING.test(l.msg))).toBe(true);
    },
    60_000,
  );
});

/**
 * The relay's drain waits for the sends in flight (up to NOTIFY_TIMEOUT_S): a
 * webhook that holds its answer holds the drain, for as long as the test says.
 */
describe('a relay whose drain waits on a webhook', () => {
  let db: DataSource;
  let held: ServerResponse[];
  let hook: RecordingServer;
  let relay: AppProcess;

  beforeAll(async () => {
    db = await testDataSource();
  });
  afterAll(async () => {
    await db.destroy();
  });
  beforeEach(async () => {
    await truncateAll(db);
    held = [];
    hook = await new RecordingServer((res) => held.push(res)).start();
    relay = await startAppProcess('relay', freePort(93), {
      ...ENV,
      NOTIFY_WEBHOOK_URL: hook.url('/notify'),
      NOTIFY_TIMEOUT_S: '120',
    });
    await db.query(
      `WITH row AS (
         INSERT INTO outbox (topic, dedupe_key, payload)
         VALUES ('email.summary_ready', 'stop:held', '{"job_id": "j", "to": "someone@example.com"}')
         RETURNING id
       )
       SELECT pg_notify('${OUTBOX_CHANNEL}', id::text) FROM row`,
    );
    await eventually(() => (held.length === 1 ? true : undefined), 10_000, 'the send, held');
  });
  afterEach(async () => {
    relay.kill('SIGKILL');
    await relay.exited;
    await hook.stop();
  });

  it('ignores a repeated signal while it drains, then exits 0 once the send is answered and recorded', async () => {
    relay.kill('SIGINT');
    await logged(relay, STOPPING);
    relay.kill('SIGINT');
    await logged(relay, AGAIN);
    held[0].writeHead(200).end();
    expect({ exit: await relay.exited, stderr: relay.stderr() }).toEqual({
      exit: { code: 0, signal: null },
      stderr: '',
    });
    expect(await db.query(`SELECT dedupe_key FROM outbox WHERE sent_at IS NOT NULL`)).toEqual([
      { dedupe_key: 'stop:held' },
    ]);
  });

  it.each<[NodeJS.Signals, number]>([
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ])('a third %s ends a drain that hangs: exit %d, the row left to be sent again', async (signal, code) => {
    relay.kill(signal);
    await logged(relay, STOPPING);
    relay.kill(signal);
    await logged(relay, AGAIN);
    relay.kill(signal);
    expect({ exit: await relay.exited, stderr: relay.stderr() }).toEqual({ exit: { code, signal: null }, stderr: '' });
    expect(
      relay.lines.some((l) => l.msg === `${signal} a third time: exiting now, the work in progress unfinished`),
    ).toBe(true);
    // Its lease runs out and a relay sends it again: nothing was recorded.
    expect(await db.query(`SELECT sent_at, attempts FROM outbox WHERE dedupe_key = 'stop:held'`)).toEqual([
      { sent_at: null, attempts: 0 },
    ]);
  });
});
