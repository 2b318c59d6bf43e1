import { jobIdFor } from './run-ids';

describe('jobIdFor: run ids (and summaries job ids)', () => {
  it('keeps the namespace every job id was made in: an operation names the id it always named', () => {
    // Pinned: a changed namespace would rename every queued job and every stored run.
    expect(jobIdFor('tenant-a:POST:/v1/summaries:abcdefghijklmnop')).toBe('cc15d982-2264-561a-b1c1-2703a97e7e94');
  });
});
