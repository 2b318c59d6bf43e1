import { setImmediate as nextTurn } from 'node:timers/promises';
import { type BuiltApp, startAppProcess } from '../support/app-process';
import { freePort, testDatabaseUrl, testRedisUrl } from '../support/infra';

/*
 * Stopping an app is not a failure: on SIGTERM (Kubernetes, compose) and on
 * SIGINT (Ctrl-C under `npm start`) each app drains and exits 0. Ctrl-C
 * reaches an app twice, from the terminal and again from concurrently, which
 * forwards it; the signal keeps coming here until the process is gone, so a
 * repeat that arrives while the app stops, or after Nest has let go of its
 * signal handlers and before the process exits, is covered too: it must not
 * kill the app (`exited with code SIGINT`, and npm start answering 130).
 */
describe.each<[BuiltApp, number]>([
  ['api', 90],
  ['worker', 91],
  ['relay', 92],
])('the %s process, stopped', (app, port) => {
  it.each<NodeJS.Signals>(['SIGINT', 'SIGTERM'])(
    'exits 0 on %s, however often it arrives',
    async (signal) => {
      const proc = await startAppProcess(app, freePort(port), {
        REDIS_URL: testRedisUrl(),
        DATABASE_URL: testDatabaseUrl(),
        API_KEYS: 'stop:stop-key-0123456789',
        LOG_LEVEL: 'info',
      });
      let gone = false;
      void proc.exited.then(() => (gone = true));
      let sent = 0;
      while (!gone) {
        proc.kill(signal);
        sent++;
        await nextTurn();
      }
      expect({ exit: await proc.exited, stderr: proc.stderr() }).toEqual({
        exit: { code: 0, signal: null },
        stderr: '',
      });
      expect(sent).toBeGreaterThan(1);
      expect(proc.lines.some((l) => l.msg === 'Nest application successfully started')).toBe(true);
    },
    60_000,
  );
});
