import { Injectable } from '@nestjs/common';

interface Loop {
  lastBeat: number;
  readonly maxSilenceMs: number;
}

export type ReadinessCheck = () => Promise<void>;

/**
 * What an app adds to the standard checks: long-running loops report each
 * turn here (liveness fails when one has not turned for `maxSilenceMs`:
 * stuck, as opposed to waiting on a dependency that is down), and extra
 * dependencies register a readiness check.
 */
@Injectable()
export class HealthChecksRegistry {
  private readonly loops = new Map<string, Loop>();
  private readonly readiness = new Map<string, ReadinessCheck>();

  registerLoop(name: string, maxSilenceMs: number): void {
    this.loops.set(name, { lastBeat: performance.now(), maxSilenceMs });
  }

  beat(name: string): void {
    const loop = this.loops.get(name);
    if (loop) loop.lastBeat = performance.now();
  }

  unregisterLoop(name: string): void {
    this.loops.delete(name);
  }

  /** Loops that have been silent too long, with how long. */
  staleLoops(now = performance.now()): { name: string; silentMs: number }[] {
    return [...this.loops]
      .map(([name, loop]) => ({ name, silentMs: Math.round(now - loop.lastBeat), max: loop.maxSilenceMs }))
      .filter((l) => l.silentMs > l.max)
      .map(({ name, silentMs }) => ({ name, silentMs }));
  }

  registerReadiness(name: string, check: ReadinessCheck): void {
    this.readiness.set(name, check);
  }

  readinessChecks(): [string, ReadinessCheck][] {
    return [...this.readiness];
  }
}
