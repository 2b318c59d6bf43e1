import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { testDatabaseUrl, testRedisUrl } from './infra';

export interface AdminCliRun {
  readonly code: number | null;
  readonly out: string;
  readonly err: string;
}

/**
 * The admin CLI as the image runs it (dist/, built by the global setup), on
 * this jest worker's Redis and database, with `env` added (e.g.
 * JOB_STREAM_PARTITIONS): `const cli = adminCli(); cli('stats')`.
 */
export function adminCli(env: Readonly<Record<string, string>> = {}): (...args: string[]) => AdminCliRun {
  const main = join(__dirname, '..', '..', 'dist', 'apps', 'admin', 'main.js');
  return (...args) => {
    const r = spawnSync(process.execPath, [main, ...args], {
      env: { PATH: process.env.PATH, REDIS_URL: testRedisUrl(), DATABASE_URL: testDatabaseUrl(), ...env },
      encoding: 'utf8',
    });
    return { code: r.status, out: r.stdout, err: r.stderr };
  };
}
