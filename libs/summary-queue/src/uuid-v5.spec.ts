import { jobIdFor } from './summary-job';
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
});

describe('jobIdFor', () => {
  it('names the same job for the same operation and another for any other', () => {
    const a = jobIdFor('tenant-a:POST:/v1/summaries:abcdefghijklmnop');
    expect(isUuid(a)).toBe(true);
    expect(a[14]).toBe('5');
    expect(jobIdFor('tenant-a:POST:/v1/summaries:abcdefghijklmnop')).toBe(a);
    expect(jobIdFor('tenant-b:POST:/v1/summaries:abcdefghijklmnop')).not.toBe(a);
  });
});
