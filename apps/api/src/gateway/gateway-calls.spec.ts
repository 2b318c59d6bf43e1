import type { HttpAdapterHost } from '@nestjs/core';
import { GatewayCalls } from './gateway-calls';
import type { GatewayOptions } from './gateway.options';

/** GatewayCalls without a server: what it does to the calls it counts when the drain runs out. */
describe('GatewayCalls', () => {
  const calls = (drainMs: number) =>
    new GatewayCalls({ drainMs } as GatewayOptions, { httpAdapter: undefined } as unknown as HttpAdapterHost);

  it('aborts the calls still running when the drain is over, with the shutdown reason, and forgets ended ones', async () => {
    const gateway = calls(1);
    const running = new AbortController();
    const ended = new AbortController();
    const endRunning = gateway.begin(running);
    gateway.begin(ended)();
    // The cut ends the running call, as the relay's abort does; the shutdown then waits for nothing more.
    running.signal.addEventListener('abort', endRunning, { once: true });
    await gateway.beforeApplicationShutdown();
    expect(running.signal.aborted).toBe(true);
    expect(running.signal.reason).toBe(gateway.signal.reason);
    expect((gateway.signal.reason as Error).message).toBe('the api is shutting down');
    expect(ended.signal.aborted).toBe(false);
  });

  it('aborts a call begun after the cut at once, with the shutdown reason', async () => {
    const gateway = calls(1);
    const endHeld = gateway.begin(new AbortController());
    const shutdown = gateway.beforeApplicationShutdown();
    await new Promise<void>((resolve) => gateway.signal.addEventListener('abort', () => resolve(), { once: true }));
    const late = new AbortController();
    const endLate = gateway.begin(late);
    expect(late.signal.aborted).toBe(true);
    expect(late.signal.reason).toBe(gateway.signal.reason);
    endLate();
    endHeld();
    await shutdown;
  });

  it('does not abort a call that ends within the drain', async () => {
    const gateway = calls(60_000);
    const call = new AbortController();
    const end = gateway.begin(call);
    const shutdown = gateway.beforeApplicationShutdown();
    end();
    await shutdown;
    expect(call.signal.aborted).toBe(false);
    expect(gateway.signal.aborted).toBe(false);
  });
});
