/**
 * An answer sent as a sequence of frames (server-sent events, lines of
 * NDJSON): what a handler returns to stream. On an @Idempotent() route with
 * a key, each frame is recorded as it is sent, a duplicate that arrives
 * meanwhile is attached to the running answer (on any instance), and a
 * complete answer is replayed frame by frame. The answer is complete when
 * `frames` ends; if it throws instead, the answer broke: nothing is stored,
 * and every caller reading it gets the route's broken-stream frame.
 *
 * The frames are read by the recording, not by the caller's socket: a caller
 * that goes away does not stop them.
 */
export class StreamedAnswer {
  constructor(
    readonly status: number,
    readonly headers: Readonly<Record<string, string>>,
    readonly frames: AsyncIterable<string>,
  ) {}
}

export function isWebResponse(value: unknown): value is Response {
  return Object.prototype.toString.call(value) === '[object Response]';
}

/**
 * The frames for one caller, in order, at the caller's pace. The writer (the
 * recording) never waits for the caller: a caller that falls more than
 * `highWaterBytes` behind is cut (`onOverflow`; it can retry and follow the
 * stored frames at its own pace), and one that went away is dropped. So a
 * slow or vanished caller never holds the recording, its lock or the
 * provider's socket.
 */
export class FrameChannel implements AsyncIterable<string> {
  private readonly queue: string[] = [];
  private head = 0;
  private queuedBytes = 0;
  private ended = false;
  private failure: unknown;
  private detached = false;
  private wakeReader: (() => void) | undefined;

  constructor(
    private readonly onOverflow: () => void = () => undefined,
    private readonly highWaterBytes = 4 * 1024 * 1024,
  ) {}

  push(frame: string): void {
    if (this.detached || this.ended) return;
    this.queue.push(frame);
    this.queuedBytes += frame.length;
    if (this.queuedBytes > this.highWaterBytes) {
      this.detach();
      this.onOverflow();
      return;
    }
    this.wake();
  }

  end(): void {
    this.ended = true;
    this.wake();
  }

  /** Ends the caller's stream with an error once the frames before it are read. */
  fail(err: unknown): void {
    this.failure = err ?? new Error('the stream failed');
    this.end();
  }

  /** The caller is gone: frames are dropped from now on. */
  detach(): void {
    this.detached = true;
    this.queue.length = 0;
    this.head = 0;
    this.queuedBytes = 0;
    this.wake();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<string> {
    try {
      for (;;) {
        if (this.detached) return;
        if (this.head < this.queue.length) {
          const frame = this.queue[this.head++];
          this.queuedBytes -= frame.length;
          if (this.head === this.queue.length) {
            this.queue.length = 0;
            this.head = 0;
          }
          yield frame;
          continue;
        }
        if (this.ended) {
          if (this.failure !== undefined) throw this.failure;
          return;
        }
        await new Promise<void>((r) => (this.wakeReader = r));
      }
    } finally {
      this.detach();
    }
  }

  private wake(): void {
    const wake = this.wakeReader;
    this.wakeReader = undefined;
    wake?.();
  }
}

/**
 * A web Response whose body is `frames`, for Nest to send as they come.
 * `onCancel` runs when the body is cancelled (the caller went away), also
 * before its first read, when a generator's own `finally` would not run.
 */
export function framesResponse(status: number, headers: Headers, frames: AsyncIterable<string>, onCancel?: () => void): Response {
  const iterator = frames[Symbol.asyncIterator]();
  let cancelled = false;
  const cancel = (): void => {
    if (cancelled) return;
    cancelled = true;
    onCancel?.();
  };
  const body = new ReadableStream<string>({
    async pull(controller) {
      try {
        const step = await iterator.next();
        if (step.done) {
          controller.close();
          cancel();
        } else controller.enqueue(step.value);
      } catch (err) {
        cancel();
        controller.error(err);
      }
    },
    async cancel() {
      cancel();
      await iterator.return?.();
    },
  }, { highWaterMark: 0 });
  return new Response(body as ReadableStream<never>, { status, headers });
}

/** Runs `fn` once the response is closed (sent, or the caller went away), at once if it already is. */
export function onceClosed(
  res: { readonly destroyed: boolean; readonly closed?: boolean; readonly socket?: { readonly destroyed: boolean } | null; once(event: 'close', fn: () => void): unknown },
  fn: () => void,
): void {
  if (res.destroyed || res.closed || res.socket?.destroyed) fn();
  else res.once('close', fn);
}
