/**
 * An answer sent as a sequence of frames (server-sent events, lines of
 * NDJSON): what a handler returns to stream. On an @Idempotent() route with
 * a key, each frame is recorded as it is sent, a duplicate that arrives
 * meanwhile is attached to the running answer (on any instance), and a
 * complete answer is replayed frame by frame. The answer is complete when
 * `frames` ends; if it throws instead, the answer broke: nothing is stored,
 * and every caller reading it gets the route's broken-stream frame.
 *
 * A frame is bytes (a provider's event relayed as it came, whatever it
 * holds) or text, sent and stored as its UTF-8.
 *
 * The frames are read by the recording, not by the caller's socket: a caller
 * that goes away does not stop them.
 */
export class StreamedAnswer {
  constructor(
    readonly status: number,
    readonly headers: Readonly<Record<string, string>>,
    readonly frames: AsyncIterable<Uint8Array | string>,
    readonly options: StreamedAnswerOptions = {},
  ) {}

  /** False for an answer known from its start to be too large to store (see StreamedAnswerOptions). */
  get storable(): boolean {
    return this.options.storable !== false;
  }

  /** False for one body sent in pieces (see StreamedAnswerOptions). */
  get framed(): boolean {
    return this.options.framed !== false;
  }
}

export interface StreamedAnswerOptions {
  /**
   * False: the answer is known from its start to be too large to store (a
   * whole answer past the store's cap, relayed as it arrives). Its frames
   * are not logged, so no duplicate could attach to it whole: the lock is
   * kept while it is relayed, duplicates get 409 with Retry-After, and the
   * key is freed when it ends. Without this, the recording would free the
   * key at its first frame and a duplicate would call the provider again
   * while this answer is still relayed.
   */
  readonly storable?: false;
  /**
   * False: the frames are pieces of one body (a JSON document), not events.
   * A break then cuts the caller's connection, so the transfer is visibly
   * truncated; the route's broken-stream frame appended to it would turn a
   * partial document into what looks like a complete 200.
   */
  readonly framed?: false;
}

/** A frame or a body as the bytes that are sent and stored: a string as its UTF-8, bytes as they are (not copied). */
export function bytesOf(value: Uint8Array | string): Buffer {
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  return Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

/** The frames as bytes, each encoded once. */
export async function* framesAsBytes(frames: AsyncIterable<Uint8Array | string>): AsyncGenerator<Buffer> {
  for await (const frame of frames) yield bytesOf(frame);
}

export function isWebResponse(value: unknown): value is Response {
  return Object.prototype.toString.call(value) === '[object Response]';
}

/** How long a writer waits for a caller that reads nothing, before the caller is cut. */
const STALLED_CALLER_MS = 30_000;

/**
 * The frames for one caller, in order, at the caller's pace. While the
 * answer is being stored its whole size is at most the store's cap, which is
 * below `highWaterBytes`: the caller can never hold the writer (the
 * recording) back. An answer too large to store is paced by its caller, as a
 * plain proxy's would be; one that reads nothing for 30 s is cut
 * (`onStalled`). A caller that went away is dropped, and nobody waits for it.
 */
export class FrameChannel implements AsyncIterable<Buffer> {
  private readonly queue: (Buffer | undefined)[] = [];
  private head = 0;
  private queuedBytes = 0;
  private ended = false;
  private failure: unknown;
  private detached = false;
  private wakeReader: (() => void) | undefined;
  private wakeWriter: (() => void) | undefined;

  constructor(
    private readonly highWaterBytes: number,
    private readonly onStalled: () => void = () => undefined,
  ) {}

  /** Resolves at once, or once the caller has taken enough (or was cut, or left). */
  async push(frame: Buffer): Promise<void> {
    if (this.detached || this.ended) return;
    this.queue.push(frame);
    this.queuedBytes += frame.length;
    this.wake();
    if (this.queuedBytes <= this.highWaterBytes) return;
    const stalled = setTimeout(() => {
      this.detach();
      this.onStalled();
    }, STALLED_CALLER_MS);
    try {
      while (this.queuedBytes > this.highWaterBytes && !this.detached) {
        await new Promise<void>((r) => (this.wakeWriter = r));
      }
    } finally {
      clearTimeout(stalled);
    }
  }

  /** The caller went away (or was cut): nobody reads what is pushed. */
  get isDetached(): boolean {
    return this.detached;
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
    this.head = 0;
    this.queuedBytes = 0;
    this.wake();
    this.releaseWriter();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer> {
    try {
      for (;;) {
        if (this.detached) return;
        if (this.head < this.queue.length) {
          const frame = this.queue[this.head] as Buffer;
          // Not kept once handed out: a caller a little behind holds only what it has not read.
          this.queue[this.head++] = undefined;
          this.queuedBytes -= frame.length;
          if (this.head === this.queue.length) {
            this.queue.length = 0;
            this.head = 0;
          }
          if (this.queuedBytes <= this.highWaterBytes) this.releaseWriter();
          yield frame;
          continue;
        }
        if (this.ended) {
          // eslint-disable-next-line @typescript-eslint/only-throw-error -- the producer's error, rethrown as it was
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

/**
 * A web Response whose body is `frames`, for Nest to send as they come.
 * `onCancel` runs when the body is cancelled (the caller went away), also
 * before its first read, when a generator's own `finally` would not run.
 */
export function framesResponse(
  status: number,
  headers: Headers,
  frames: AsyncIterable<Uint8Array>,
  onCancel?: () => void,
): Response {
  const iterator = frames[Symbol.asyncIterator]();
  let cancelled = false;
  const cancel = (): void => {
    if (cancelled) return;
    cancelled = true;
    onCancel?.();
  };
  const body = new ReadableStream<Uint8Array>(
    {
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
    },
    { highWaterMark: 0 },
  );
  return new Response(body as ReadableStream<never>, { status, headers });
}

/** Runs `fn` once the response is closed (sent, or the caller went away), at once if it already is. */
export function onceClosed(
  res: {
    readonly destroyed: boolean;
    readonly closed?: boolean;
    readonly socket?: { readonly destroyed: boolean } | null;
    once(event: 'close', fn: () => void): unknown;
  },
  fn: () => void,
): void {
  if (res.destroyed || res.closed || res.socket?.destroyed) fn();
  else res.once('close', fn);
}
