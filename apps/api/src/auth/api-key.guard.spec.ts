import { Reflector } from '@nestjs/core';
import type { IncomingMessage } from 'node:http';
import { ApiKeyGuard, type Authentication } from './api-key.guard';

const INTERNAL = 'internal-0123456789abcdef';
const guard = new ApiKeyGuard(
  new Reflector(),
  [
    { tenant: 'acme', key: 'acme-key-0123456789' },
    { tenant: 'globex', key: 'globex-key-0123456789' },
  ],
  INTERNAL,
);

/** A request as Node hands it over: its headers as sent, a repeated one as several lines, names in any case. */
function request(headers: Readonly<Record<string, string | readonly string[]>>): IncomingMessage {
  const rawHeaders = Object.entries(headers).flatMap(([name, value]) =>
    (typeof value === 'string' ? [value] : value).flatMap((v) => [name, v]),
  );
  return { rawHeaders } as unknown as IncomingMessage;
}

const bearer = (key: string) => `Bearer ${key}`;

describe('ApiKeyGuard.authenticate', () => {
  it.each<[string, Record<string, string | string[]>, boolean, Authentication]>([
    ['a tenant key', { authorization: bearer('acme-key-0123456789') }, false, { tenant: 'acme' }],
    ['a tenant key on the gateway', { authorization: bearer('acme-key-0123456789') }, true, { tenant: 'acme' }],
    [
      'the internal key naming a tenant',
      { authorization: bearer(INTERNAL), 'x-tenant': 'globex' },
      true,
      { tenant: 'globex' },
    ],
    [
      'the internal key, X-Tenant padded',
      { authorization: bearer(INTERNAL), 'x-tenant': ' acme ' },
      true,
      { tenant: 'acme' },
    ],
    ['no key', {}, true, { refused: expect.stringMatching(/Authorization: Bearer/) as unknown as string }],
    [
      'an unknown key',
      { authorization: bearer('nope-0123456789abcdef') },
      true,
      { refused: 'The API key is not valid.' },
    ],
    [
      'an unknown key with X-Tenant',
      { authorization: bearer('nope-0123456789abcdef'), 'x-tenant': 'acme' },
      true,
      { refused: 'The API key is not valid.' },
    ],
    [
      'a tenant key with X-Tenant naming its own tenant',
      { authorization: bearer('acme-key-0123456789'), 'x-tenant': 'acme' },
      true,
      { refused: expect.stringMatching(/only with the internal key/) as unknown as string },
    ],
    [
      'a tenant key with X-Tenant naming another tenant',
      { authorization: bearer('acme-key-0123456789'), 'x-tenant': 'globex' },
      true,
      { refused: expect.stringMatching(/only with the internal key/) as unknown as string },
    ],
    [
      'a tenant key with an empty X-Tenant',
      { authorization: bearer('acme-key-0123456789'), 'x-tenant': '' },
      true,
      { refused: expect.stringMatching(/only with the internal key/) as unknown as string },
    ],
    [
      'the internal key without X-Tenant',
      { authorization: bearer(INTERNAL) },
      true,
      { refused: expect.stringMatching(/must name the tenant/) as unknown as string },
    ],
    [
      'the internal key with two X-Tenant headers',
      { authorization: bearer(INTERNAL), 'x-tenant': ['acme', 'globex'] },
      true,
      { refused: 'Send one X-Tenant header.' },
    ],
    [
      'the internal key naming a tenant not in API_KEYS',
      { authorization: bearer(INTERNAL), 'x-tenant': 'initech' },
      true,
      { refused: 'X-Tenant must name a tenant of API_KEYS.' },
    ],
    [
      'the internal key naming a malformed tenant',
      { authorization: bearer(INTERNAL), 'x-tenant': 'acme:POST' },
      true,
      { refused: 'X-Tenant must name a tenant of API_KEYS.' },
    ],
    [
      'the internal key on a route that does not take it',
      { authorization: bearer(INTERNAL), 'x-tenant': 'acme' },
      false,
      { refused: 'The internal key is accepted on the model gateway only.' },
    ],
    [
      'two Authorization headers',
      { authorization: [bearer(INTERNAL), bearer('acme-key-0123456789')], 'x-tenant': 'acme' },
      true,
      { refused: expect.stringMatching(/Send one Authorization/) as unknown as string },
    ],
  ])('%s', (_, headers, internalKey, expected) => {
    expect(guard.authenticate(request(headers), { internalKey })).toEqual(expected);
  });

  it('takes no X-Tenant at all when INTERNAL_API_KEY is unset', () => {
    const plain = new ApiKeyGuard(new Reflector(), [{ tenant: 'acme', key: 'acme-key-0123456789' }]);
    expect(
      plain.authenticate(request({ authorization: bearer('acme-key-0123456789'), 'x-tenant': 'acme' }), {
        internalKey: true,
      }),
    ).toEqual({ refused: expect.stringMatching(/only with the internal key/) });
    expect(
      plain.authenticate(request({ authorization: bearer(INTERNAL), 'x-tenant': 'acme' }), { internalKey: true }),
    ).toEqual({
      refused: 'The API key is not valid.',
    });
  });

  it("matches a request's key once per guard: another guard, with other keys, decides for itself", () => {
    const plain = new ApiKeyGuard(new Reflector(), [{ tenant: 'acme', key: 'acme-key-0123456789' }]);
    const req = request({ authorization: bearer(INTERNAL), 'x-tenant': 'acme' });
    // The same request object through both: the first guard's match (its internal key) is not the second's.
    expect(guard.authenticate(req, { internalKey: true })).toEqual({ tenant: 'acme' });
    expect(plain.authenticate(req, { internalKey: true })).toEqual({ refused: 'The API key is not valid.' });
    expect(guard.authenticate(req, { internalKey: true })).toEqual({ tenant: 'acme' });
  });

  it('refuses to be built with an internal key that is also a tenant key (the config stops that first)', () => {
    expect(
      () =>
        new ApiKeyGuard(
          new Reflector(),
          [
            { tenant: 'acme', key: 'acme-key-0123456789' },
            { tenant: 'globex', key: INTERNAL },
          ],
          INTERNAL,
        ),
    ).toThrow(/INTERNAL_API_KEY must differ from every tenant key/);
  });
});
