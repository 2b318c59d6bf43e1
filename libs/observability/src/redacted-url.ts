/**
 * A request target as the logs may hold it: the path as it came, every query
 * value replaced (`?key=[redacted]`), parameter names kept so a line still
 * says what was asked. Clients put API keys and tokens in query strings
 * (`?key=`, `?access_token=`), and a log line outlives the secret's rotation.
 * A parameter without `=` may be a bare token: it is replaced whole. The
 * fragment never reaches a server in a well-formed request; it goes too, and
 * so does the userinfo of an absolute-form target (`user:password@`).
 */
export function redactedUrl(url: string | undefined): string | undefined {
  if (url === undefined) return undefined;
  const hash = url.indexOf('#');
  const target = withoutUserinfo(hash === -1 ? url : url.slice(0, hash));
  const mark = target.indexOf('?');
  if (mark === -1) return target;
  const query = target
    .slice(mark + 1)
    .split('&')
    .map((part) => {
      if (part === '') return part;
      const eq = part.indexOf('=');
      return eq === -1 ? REDACTED : `${part.slice(0, eq)}=${REDACTED}`;
    })
    .join('&');
  return `${target.slice(0, mark)}?${query}`;
}

const REDACTED = '[redacted]';

/** An absolute-form target (`http://user:pass@host/…`, as a proxy gets it) without its credentials. */
function withoutUserinfo(target: string): string {
  const authority = /^([a-z][a-z\d+.-]*:\/\/)([^/?]*)/i.exec(target);
  if (!authority) return target;
  const at = authority[2].lastIndexOf('@');
  if (at === -1) return target;
  return authority[1] + authority[2].slice(at + 1) + target.slice(authority[0].length);
}
