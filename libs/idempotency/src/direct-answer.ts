import { StreamableFile } from '@nestjs/common';
import { ExpressAdapter } from '@nestjs/platform-express';
import type { ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';

/**
 * Stands in for the stream a StreamableFile must have: a DirectAnswer is
 * sent by DirectAnswerExpressAdapter and never piped; an adapter that tried
 * is told why.
 */
const notPiped = (): never => {
  throw new Error('A DirectAnswer is sent by DirectAnswerExpressAdapter; this app is not created with it');
};
const NEVER_PIPED = { pipe: notPiped, once: notPiped } as unknown as Readable;

/**
 * A whole answer, status, headers and body, sent as it is: a replay, or a
 * first answer as it was stored. A web Response would do the same through
 * Nest's streaming path (a ReadableStream, a Node Readable and a pipe for a
 * few hundred bytes), which made a replay dearer than the request it
 * replays; this is one `end()`.
 *
 * A StreamableFile to everything between the interceptor and the adapter,
 * so what other interceptors do to a stream they do to it (nothing:
 * ClassSerializerInterceptor passes streams through, as it must, since the
 * body is already the bytes). Only an app created with
 * DirectAnswerExpressAdapter is sent one; on any other the interceptor
 * answers with a web Response instead (see `sendsDirectAnswers`), a
 * handler's own DirectAnswer included. A handler may return one for a whole
 * answer whose bytes it holds (the gateway's relay does): it is stored from
 * those bytes, not read back from a stream.
 */
export class DirectAnswer extends StreamableFile {
  constructor(
    readonly status: number,
    /** Lower-case names; Content-Length is set here from the body. */
    readonly headers: Readonly<Record<string, string>>,
    readonly body: Buffer | null,
  ) {
    super(NEVER_PIPED);
  }

  sendTo(res: ServerResponse): void {
    if (res.headersSent) {
      // Something else began an answer (it cannot be undone): ending it would make a cut body look
      // whole, so the connection is closed, as Nest closes one whose file broke mid-way.
      if (!res.writableEnded) res.destroy();
      return;
    }
    res.statusCode = this.status;
    for (const name in this.headers) res.setHeader(name, this.headers[name]);
    if (this.body === null) {
      res.removeHeader('content-length');
      res.end();
      return;
    }
    res.setHeader('content-length', this.body.length);
    res.end(this.body);
  }
}

const SENDS_DIRECT_ANSWERS = Symbol.for('@app/idempotency:sends-direct-answers');

/** True when the app's HTTP adapter sends a DirectAnswer as it is. */
export function sendsDirectAnswers(adapter: unknown): boolean {
  return (adapter as { [SENDS_DIRECT_ANSWERS]?: unknown } | undefined)?.[SENDS_DIRECT_ANSWERS] === true;
}

/**
 * Nest's Express adapter, and a DirectAnswer returned by a route is written
 * straight to the response, its own status winning over the route's
 * @HttpCode(), as a web Response's does. Anything else goes to Express as before.
 */
export class DirectAnswerExpressAdapter extends ExpressAdapter {
  readonly [SENDS_DIRECT_ANSWERS] = true;

  override reply(response: unknown, body: unknown, statusCode?: number): unknown {
    if (body instanceof DirectAnswer) {
      body.sendTo(response as ServerResponse);
      return response;
    }
    return super.reply(response, body, statusCode);
  }
}
