import { Inject, Injectable, Optional } from '@nestjs/common';

interface Loop {
  lastBeat: number;
  readonly maxSilenceMs: number;
}

export type ReadinessCheck = () => Promise<void>;

/** The monotonic clock loops' silences are measured on (milliseconds); tests provide their own. */
export const HEALTH_CLOCK = 'health:clock';

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

  constructor(@Optional() @Inject(HEALTH_CLOCK) private readonly now: () => number = () => performance.now()) {}

  registerLoop(name: string, maxSilenceMs: number): void {
    this.loops.set(name, { lastBeat: this.now(), maxSilenceMs });
  }

  beat(name: string): void {
    const loop = this.loops.get(name);
    if (loop) loop.lastBeat = this.now();
  }

  unregisterLoop(name: string): void {
    this.loops.delete(name);
  }

  /** Loops that have been silent too long, with how long. */
  staleLoops(now = this.now()): { name: string; silentMs: number }[] {
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
