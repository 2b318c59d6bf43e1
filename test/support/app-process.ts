import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { eventually } from './infra';

const ROOT = join(__dirname, '..', '..');

export type BuiltApp = 'api' | 'worker' | 'relay';

export interface AppProcess {
  readonly pid: number;
  /** http://127.0.0.1:<port> */
  readonly url: string;
  /** Every stdout line that parsed as JSON, as it arrives. */
  readonly lines: Record<string, unknown>[];
  /** All it wrote so far. */
  stdout(): string;
  stderr(): string;
  kill(signal: NodeJS.Signals): void;
  /** Resolves when the process has exited and both its pipes have closed. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * The app as an operator runs it (dist/apps/<app>/main.js, which the test
 * setup builds), with only `env` (and PATH) in its environment, once its
 * /health/live answers. `nodeArgs` go before the script (`--import`, say).
 */
export async function startAppProcess(
  app: BuiltApp,
  port: number,
  env: Record<string, string>,
  nodeArgs: readonly string[] = [],
): Promise<AppProcess> {
  const child = spawn(process.execPath, [...nodeArgs, join(ROOT, 'dist', 'apps', app, 'main.js')], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, [app === 'api' ? 'PORT' : 'HEALTH_PORT']: String(port), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const lines: Record<string, unknown>[] = [];
  let partial = '';
  child.stdout.on('data', (d: Buffer) => {
    out.push(d);
    const parts = (partial + d.toString('utf8')).split('\n');
    partial = parts.pop() ?? '';
    for (const part of parts) {
      try {
        lines.push(JSON.parse(part) as Record<string, unknown>);
      } catch {
        // not JSON: stdout() still has it
      }
    }
  });
  child.stderr.on('data', (d: Buffer) => err.push(d));
  const exited = once(child, 'close').then(([code, signal]) => ({
    code: code as number | null,
    signal: signal as NodeJS.Signals | null,
  }));
  const url = `http://127.0.0.1:${port}`;
  const proc: AppProcess = {
    pid: child.pid ?? -1,
    url,
    lines,
    stdout: () => Buffer.concat(out).toString('utf8'),
    stderr: () => Buffer.concat(err).toString('utf8'),
    kill: (signal) => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    },
    exited,
  };
  let gone = false;
  void exited.then(() => (gone = true));
  try {
    await eventually(
      async () => {
        if (gone) throw new Error(`${app} exited at start: ${proc.stderr()}`);
        return (await fetch(`${url}/health/live`).catch(() => undefined))?.ok ? true : undefined;
      },
      20_000,
      `the ${app} on port ${port}`,
    );
  } catch (e) {
    proc.kill('SIGKILL');
    throw e;
  }
  return proc;
}
