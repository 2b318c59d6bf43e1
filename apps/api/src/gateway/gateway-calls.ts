import { BeforeApplicationShutdown, Inject, Injectable, Logger } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { beginDrain } from '@app/http';
import type { Server, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { GATEWAY_OPTIONS, GATEWAY_SETTLE_MS, type GatewayOptions } from './gateway.options';
import type { GatewayMetrics } from './gateway.metrics';
import { OpenAiErrorException } from './openai-errors';

/**
 * The upstream calls running in this process, for shutdown: on SIGTERM the
 * gateway refuses new calls (503, the load balancer sends the retry to
 * another pod) and gives the running ones `drainMs` to finish and be stored;
 * then it cuts them, so each frees its key and ends its callers' streams
 * with the stream_broken event at once, instead of holding the key for a
 * lock TTL after the pod is killed.
 */
@Injectable()
export class GatewayCalls implements BeforeApplicationShutdown {
  private readonly logger = new Logger(GatewayCalls.name);
  private readonly stopping = new AbortController();
  private running = 0;
  /** The running calls' own controllers, aborted if the drain runs out: no call listens on a shared signal. */
  private readonly cuttable = new Set<AbortController>();
  private onIdle: (() => void) | undefined;

  constructor(
    @Inject(GATEWAY_OPTIONS) private readonly options: GatewayOptions,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  /** Aborts with the reason when the process stops. */
  get signal(): AbortSignal {
    return this.stopping.signal;
  }

  private closing = false;

  /** A route's first step: while the instance stops, a new call is refused (503) before anything is sent upstream. */
  refuseIfShuttingDown(res: ServerResponse, metrics: GatewayMetrics): void {
    if (!this.closing) return;
    metrics.call('rejected');
    // Its retry must open a new connection, which reaches another instance.
    res.shouldKeepAlive = false;
    throw new OpenAiErrorException(
      503,
      'shutting_down',
      'This api instance is shutting down; nothing was sent upstream. Retry.',
      { 'Retry-After': '1' },
    );
  }

  /**
   * Counts a call as running, and aborts `cut` (with the reason `signal` gives) if it still runs when the drain
   * is over, or at once if that time has come; call the returned function once, when the call has ended.
   */
  begin(cut: AbortController): () => void {
    this.running++;
    if (this.stopping.signal.aborted) cut.abort(this.stopping.signal.reason);
    else this.cuttable.add(cut);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.cuttable.delete(cut);
      this.running--;
      if (this.running === 0) this.onIdle?.();
    };
  }

  async beforeApplicationShutdown(): Promise<void> {
    this.closing = true;
    // Every answer from now on closes its connection, so clients (and the
    // load balancer's pool) reconnect, to an instance that is not stopping.
    const server = this.adapterHost.httpAdapter?.getHttpServer() as Server | undefined;
    if (server) beginDrain(server);
    if (this.running === 0) return;
    this.logger.log(`waiting up to ${this.options.drainMs} ms for ${this.running} gateway call(s) to finish`);
    const idle = new Promise<void>((resolve) => (this.onIdle = resolve));
    const stop = new AbortController();
    await Promise.race([idle, sleep(this.options.drainMs, undefined, { signal: stop.signal }).catch(() => undefined)]);
    stop.abort();
    if (this.running === 0) return;
    this.logger.warn(
      `cutting ${this.running} gateway call(s) still running after ${this.options.drainMs} ms; their keys are freed`,
    );
    this.stopping.abort(new Error('the api is shutting down'));
    for (const cut of this.cuttable) cut.abort(this.stopping.signal.reason);
    this.cuttable.clear();
    const settled = new AbortController();
    await Promise.race([idle, sleep(GATEWAY_SETTLE_MS, undefined, { signal: settled.signal }).catch(() => undefined)]);
    settled.abort();
  }
}
