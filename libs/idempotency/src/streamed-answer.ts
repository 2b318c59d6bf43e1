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
 * The frames for the caller: in order, at the caller's pace (a writer waits
 * while more than `highWaterBytes` are unread), and dropped once the caller
 * stops reading, so a caller that went away never holds the writer back.
 */
export class FrameChannel implements AsyncIterable<string> {
  private readonly queue: string[] = [];
  private queuedBytes = 0;
  private ended = false;
  private failure: unknown;
  private detached = false;
  private wakeReader: (() => void) | undefined;
  private wakeWriter: (() => void) | undefined;

  constructor(private readonly highWaterBytes = 1024 * 1024) {}

  /** Resolves when the caller can take more. */
  async push(frame: string): Promise<void> {
    if (this.detached || this.ended) return;
    this.queue.push(frame);
    this.queuedBytes += frame.length;
    this.wake();
    while (this.queuedBytes > this.highWaterBytes && !this.detached) {
      await new Promise<void>((r) => (this.wakeWriter = r));
    }
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

  /** The caller is gone: frames are dropped from now on, and no writer waits. */
  detach(): void {
    this.detached = true;
    this.queue.length = 0;
    this.queuedBytes = 0;
    this.releaseWriter();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<string> {
    try {
      for (;;) {
        if (this.queue.length > 0) {
          const frame = this.queue.shift()!;
          this.queuedBytes -= frame.length;
          if (this.queuedBytes <= this.highWaterBytes) this.releaseWriter();
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

  private releaseWriter(): void {
    const wake = this.wakeWriter;
    this.wakeWriter = undefined;
    wake?.();
  }
}

/** A web Response whose body is `frames`, for Nest to send as they come. */
export function framesResponse(status: number, headers: Headers, frames: AsyncIterable<string>): Response {
  return new Response(ReadableStream.from(frames) as ReadableStream<never>, { status, headers });
}
