import { keySlot, partitionTags } from '@app/redis';
import { randomUUID } from 'node:crypto';
import { ADMIN_ACTIONS_KEY, DEAD_LETTER_STREAM, jobIdFor, jobRecordKey, JOBS_STREAM } from './summary-job';
import { partitionOf, SINGLE_STREAM, SummaryStreams } from './summary-streams';

describe('partitionOf', () => {
  it.each([
    // The first 8 hex digits as a uint32, modulo the count: fixed for ever, or jobs move partition.
    ['2ed6657d-e927-568b-95e1-2665a8aea6a2', [0, 1, 0, 2, 381]],
    ['00000000-0000-5000-8000-000000000000', [0, 0, 0, 0, 0]],
    ['ffffffff-ffff-5fff-bfff-ffffffffffff', [0, 1, 0, 3, 1023]],
    ['7A3F09C1-1b2c-5d3e-8f40-123456789abc', [0, 1, 0, 1, 449]], // any case
  ])('puts %s in the same partition every time', (jobId, expected) => {
    expect([1, 2, 3, 7, 1024].map((count) => partitionOf(jobId, count))).toEqual(expected);
  });

  it('spreads job ids evenly: 3000 over 3 partitions, each within 10% of 1000', () => {
    const counts = [0, 0, 0];
    for (let i = 0; i < 3000; i++) counts[partitionOf(jobIdFor(`tenant-a:POST:/v1/summaries:${randomUUID()}`), 3)]++;
    for (const n of counts) expect(Math.abs(n - 1000)).toBeLessThanOrEqual(100);
  });

  it('refuses what is not a UUID', () => {
    expect(() => partitionOf('not-a-uuid', 3)).toThrow(RangeError);
  });
});

describe('SummaryStreams', () => {
  it("with one partition, today's key names byte for byte", () => {
    const [p] = SINGLE_STREAM.partitions;
    const jobId = '2ed6657d-e927-568b-95e1-2665a8aea6a2';
    expect(SINGLE_STREAM.partitions).toHaveLength(1);
    expect([p.jobs, p.dead, p.adminActions, p.jobRecordKey(jobId)]).toEqual([
      JOBS_STREAM,
      DEAD_LETTER_STREAM,
      ADMIN_ACTIONS_KEY,
      jobRecordKey(jobId),
    ]);
    expect([p.jobs, p.dead, p.jobRecordKey(jobId)]).toEqual([
      '{summaries}:jobs',
      '{summaries}:dead',
      `{summaries}:job:${jobId}`,
    ]);
  });

  it('with several, each partition under its own tag, every key of one partition in one slot', () => {
    const streams = new SummaryStreams(3);
    const tags = partitionTags('summaries', 3);
    expect(streams.partitions.map((p) => p.tag)).toEqual(tags);
    for (const p of streams.partitions) {
      expect(p.jobs).toBe(`{${tags[p.index]}}:jobs`);
      const slots = new Set([p.jobs, p.dead, p.adminActions, p.jobRecordKey(randomUUID())].map(keySlot));
      expect(slots.size).toBe(1);
    }
    expect(new Set(streams.partitions.map((p) => keySlot(p.jobs))).size).toBe(3);
  });

  it("finds a job's partition by its id, and no partition past the last", () => {
    const streams = new SummaryStreams(3);
    const jobId = '2ed6657d-e927-568b-95e1-2665a8aea6a2';
    expect(streams.of(jobId).index).toBe(0);
    expect(streams.of('ffffffff-ffff-5fff-bfff-ffffffffffff').index).toBe(0);
    expect(streams.of('00000001-0000-5000-8000-000000000000').index).toBe(1);
    expect(streams.at(2)?.index).toBe(2);
    expect(streams.at(3)).toBeUndefined();
  });
});
