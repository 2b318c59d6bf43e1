import { isUuid } from '@app/ids';
import { jobIdFor } from './summary-job';

describe('jobIdFor', () => {
  it('names the same job for the same operation and another for any other', () => {
    const a = jobIdFor('tenant-a:POST:/v1/summaries:abcdefghijklmnop');
    expect(isUuid(a)).toBe(true);
    expect(a[14]).toBe('5');
    expect(jobIdFor('tenant-a:POST:/v1/summaries:abcdefghijklmnop')).toBe(a);
    expect(jobIdFor('tenant-b:POST:/v1/summaries:abcdefghijklmnop')).not.toBe(a);
  });
});
