import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import type { LoadGenerator, LoadSpec } from '../load';
import type { SpawnedServer } from '../processes';
import { componentsOf, type CpuProfile } from './components';

/** Preloaded (`-r`) into a server to profile: starts on SIGUSR1, writes $BENCH_PROFILE_OUT on SIGUSR2. */
export const WINDOW_PROFILE_PRELOAD = resolve(__dirname, 'window-profile.preload.js');

/**
 * One profiled load window of a server started with WINDOW_PROFILE_PRELOAD and BENCH_PROFILE_OUT=`out`: a 3 s
 * warm-up unprofiled, then `seconds` of load under the profiler. The requests answered in the window, and each
 * component's µs per request (componentsOf).
 */
export async function profileWindow(
  server: SpawnedServer,
  gen: LoadGenerator,
  spec: Omit<LoadSpec, 'durationSeconds'>,
  seconds: number,
  out: string,
): Promise<{ requests: number; components: Map<string, number> }> {
  await gen.run({ ...spec, durationSeconds: 3 });
  process.kill(server.pid, 'SIGUSR1');
  const result = await gen.run({ ...spec, durationSeconds: seconds });
  process.kill(server.pid, 'SIGUSR2');
  const deadline = performance.now() + 30_000;
  while (!existsSync(out) || !server.stderr().includes('profile written')) {
    if (performance.now() > deadline) throw new Error(`${server.name}: no profile written`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const profile = JSON.parse(readFileSync(out, 'utf8')) as CpuProfile;
  return { requests: result.requests, components: componentsOf(profile, result.requests) };
}

/** Side `i`'s figures into a table of one column per side (`sides` of them), a row per component. */
export function addColumn(
  table: Map<string, number[]>,
  components: ReadonlyMap<string, number>,
  i: number,
  sides: number,
): void {
  for (const [name, us] of components) {
    let row = table.get(name);
    if (!row) table.set(name, (row = Array.from({ length: sides }, () => 0)));
    row[i] = us;
  }
}

/** The components' table: µs per request, a column per side, largest first in the column named `sortBy`. */
export function printComponents(
  sides: readonly string[],
  components: ReadonlyMap<string, readonly number[]>,
  sortBy: string,
): void {
  const column = sides.indexOf(sortBy);
  const rows = [...components].sort((a, b) => b[1][column] - a[1][column]);
  const total = sides.map((_, i) => rows.reduce((n, [, v]) => n + v[i], 0));
  console.table(
    [...rows, ['total', total] as const].map(([name, values]) => ({
      component: name,
      ...Object.fromEntries(sides.map((side, i) => [side, +values[i].toFixed(1)])),
    })),
  );
}
