import type { IncomingMessage } from 'node:http';

const answered = new WeakSet<object>();

/**
 * The HTTP server answered this connection itself (a parser refusal, such as
 * a body that stopped arriving) and logged and counted that answer: the
 * request still in flight on it must not get a second line or observation.
 */
export function markAnsweredByServer(socket: object): void {
  answered.add(socket);
}

export function answeredByServer(req: IncomingMessage): boolean {
  return answered.has(req.socket);
}
