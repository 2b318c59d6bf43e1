import { redactedUrl } from './redacted-url';

describe('redactedUrl', () => {
  it.each<[string | undefined, string | undefined]>([
    ['/v1/summaries', '/v1/summaries'],
    ['/v1/summaries?key=secret', '/v1/summaries?key=[redacted]'],
    ['/v1/x?key=secret&page=2', '/v1/x?key=[redacted]&page=[redacted]'],
    ['/v1/x?sk-live-secret', '/v1/x?[redacted]'],
    ['/v1/x?key=a=b', '/v1/x?key=[redacted]'],
    ['/v1/x?a=1&&b=', '/v1/x?a=[redacted]&&b=[redacted]'],
    ['/v1/x?', '/v1/x?'],
    ['/v1/x?token=secret#frag', '/v1/x?token=[redacted]'],
    ['/v1/x#secret', '/v1/x'],
    ['*', '*'],
    ['http://user:secret@example.com/v1/x?key=k', 'http://example.com/v1/x?key=[redacted]'],
    ['http://user:p@ss@example.com:8080/v1', 'http://example.com:8080/v1'],
    ['HTTPS://token@example.com', 'HTTPS://example.com'],
    ['http://example.com/v1/a@b?c=d', 'http://example.com/v1/a@b?c=[redacted]'],
    ['/v1/x@y', '/v1/x@y'],
    [undefined, undefined],
  ])('%s is logged as %s', (url, logged) => {
    expect(redactedUrl(url)).toBe(logged);
  });
});
