import type { IncomingMessage } from 'node:http';

/**
 * Every value of the request's `name` header (in any case), in the order
 * sent, as Node's `req.headersDistinct[name]` gives them; undefined when the
 * request has none. Read from `rawHeaders`, without building headersDistinct,
 * which makes an array of every header of the request on first use: a hot
 * route that reads two or three headers pays for those alone.
 */
export function headerValues(req: Pick<IncomingMessage, 'rawHeaders'>, name: string): string[] | undefined {
  const wanted = name.toLowerCase();
  const raw = req.rawHeaders;
  let values: string[] | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    const field = raw[i];
    // Names of another length are not compared (nor lower-cased) at all.
    if (field.length === wanted.length && (field === wanted || field.toLowerCase() === wanted))
      (values ??= []).push(raw[i + 1]);
  }
  return values;
}
