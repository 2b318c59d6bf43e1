import { isUuid, uuidV5 } from './uuid-v5';

describe('uuidV5', () => {
  it('matches the RFC 9562 test vector (DNS namespace, www.example.com)', () => {
    expect(uuidV5('www.example.com', '6ba7b810-9dad-11d1-80b4-00c04fd430c8')).toBe(
      '2ed6657d-e927-568b-95e1-2665a8aea6a2',
    );
  });

  it('rejects a namespace that is not a UUID', () => {
    expect(() => uuidV5('x', 'not-a-uuid')).toThrow(TypeError);
  });

  it('tells a UUID from anything else', () => {
    expect(isUuid('2ed6657d-e927-568b-95e1-2665a8aea6a2')).toBe(true);
    expect(isUuid('not-a-uuid')).toBe(false);
  });
});
