import type { RouteHold } from '@app/idempotency/testing/idempotent-route.conformance';

/**
 * A gate the next run waits at, for the conformance kit's `hold`: `reached`
 * when a run arrives at pass(), which returns once release() is called. A
 * dependency of the route under test (a queue's start, a model call) calls
 * pass() before doing its work for real.
 */
export class NextRunGate {
  private pending: { arrived: () => void; released: Promise<void> } | undefined;

  hold(): RouteHold {
    let arrived!: () => void;
    let release!: () => void;
    const reached = new Promise<void>((r) => (arrived = r));
    const released = new Promise<void>((r) => (release = r));
    this.pending = { arrived, released };
    return { reached, release };
  }

  /** Called by the held dependency: waits if a hold is pending, once. */
  async pass(): Promise<void> {
    const held = this.pending;
    if (!held) return;
    this.pending = undefined;
    held.arrived();
    await held.released;
  }
}
