import { idempotencyKey, type KeyFact } from '@app/client';
import { parseIdempotencyKey } from '@app/idempotency';

/** The client's keys, read by the server's own parser: every one is accepted unchanged. */
describe('idempotencyKey and the api parser', () => {
  it('every key built from random facts passes parseIdempotencyKey as it is', () => {
    let seed = 11;
    const rand = () => ((seed = (seed * 16807) % 2147483647) - 1) / 2147483646;
    const chars = ['a', 'Q', '7', ':', '%', '~', ',', ' ', '"', '\\', 'é', '😀', '\t', '-', "'", '='];
    for (let i = 0; i < 3000; i++) {
      const facts: KeyFact[] = Array.from({ length: Math.floor(rand() * 5) }, () =>
        rand() < 0.2
          ? Math.floor(rand() * 1e9)
          : Array.from(
              { length: Math.floor(rand() * (rand() < 0.1 ? 120 : 10)) },
              () => chars[Math.floor(rand() * chars.length)],
            ).join(''),
      );
      const key = idempotencyKey(rand() < 0.5 ? 'r' : 'refund', ...facts);
      expect(parseIdempotencyKey([key])).toBe(key);
    }
  });
});
