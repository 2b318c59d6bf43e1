import { CLUSTER_SLOTS, clusterSlotRanges, keySlot, partitionTags } from './partition-tags';

// `CLUSTER KEYSLOT` answers only in cluster mode, so the cross-check against a
// real server is in test/cluster/redis-cluster.harness.spec.ts.
describe('keySlot', () => {
  it.each([
    // CRC16-XMODEM's check value is 0x31c3 = 12739; the others are from the Redis Cluster specification and docs.
    ['123456789', 12739],
    ['foo', 12182],
    ['bar', 5061],
    ['{user1000}.following', 3443],
    ['{user1000}.followers', 3443],
    ['user1000', 3443],
  ])('slot of %s is %i', (key, slot) => expect(keySlot(key)).toBe(slot));

  it('hashes only the text of the first non-empty hash tag', () => {
    expect(keySlot('{summaries}:jobs')).toBe(keySlot('summaries'));
    expect(keySlot('x{summaries}y{other}')).toBe(keySlot('summaries'));
    // An empty tag does not count: the whole key is hashed.
    expect(keySlot('{}summaries')).not.toBe(keySlot('summaries'));
    expect(keySlot('{}summaries')).toBe(keySlot('{}summaries'));
    // The tag ends at the first '}' after the first '{'.
    expect(keySlot('{a{b}c}')).toBe(keySlot('a{b'));
    // No closing brace: the whole key.
    expect(keySlot('{summaries')).not.toBe(keySlot('summaries'));
  });

  it('stays in range', () => {
    for (let i = 0; i < 2000; i++) {
      const slot = keySlot(`key:${i}`);
      expect(Number.isInteger(slot) && slot >= 0 && slot < CLUSTER_SLOTS).toBe(true);
    }
  });
});

describe('clusterSlotRanges', () => {
  it("matches redis-cli --cluster create's split for three masters", () => {
    expect(clusterSlotRanges(3)).toEqual([
      [0, 5460],
      [5461, 10922],
      [10923, 16383],
    ]);
  });

  it.each(Array.from({ length: 64 }, (_, i) => i + 1))('covers every slot once, evenly, for %i masters', (count) => {
    const ranges = clusterSlotRanges(count);
    expect(ranges).toHaveLength(count);
    expect(ranges[0][0]).toBe(0);
    expect(ranges[count - 1][1]).toBe(CLUSTER_SLOTS - 1);
    for (let i = 1; i < count; i++) expect(ranges[i][0]).toBe(ranges[i - 1][1] + 1);
    for (const [first, last] of ranges)
      expect(Math.abs(last - first + 1 - CLUSTER_SLOTS / count)).toBeLessThanOrEqual(1);
  });
});

describe('partitionTags', () => {
  it('is the prefix itself for one partition, so today’s key keeps its name', () => {
    expect(partitionTags('summaries', 1)).toEqual(['summaries']);
    expect(partitionTags('anything', 1)).toEqual(['anything']);
  });

  it.each(Array.from({ length: 16 }, (_, i) => i + 1))(
    'puts each of %i partitions in its own slot range, with distinct tags',
    (count) => {
      const tags = partitionTags('summaries', count);
      expect(tags).toHaveLength(count);
      expect(new Set(tags).size).toBe(count);
      const ranges = clusterSlotRanges(count);
      tags.forEach((tag, i) => {
        const slot = keySlot(`{${tag}}:jobs`);
        const [first, last] = ranges[i];
        // A message naming the partition, for when it fails.
        expect({ i, tag, slot, inRange: slot >= first && slot <= last }).toEqual({ i, tag, slot, inRange: true });
        // And in the plain equal split (i * 16384 / count) too: the tags keep off the slots where the two differ.
        expect(Math.floor((slot * count) / CLUSTER_SLOTS)).toBe(i);
      });
    },
  );

  it('is deterministic and uses the documented candidates', () => {
    expect(partitionTags('summaries', 3)).toEqual(partitionTags('summaries', 3));
    for (const count of [2, 3, 4, 8, 16])
      partitionTags('summaries', count).forEach((tag, i) =>
        expect(tag).toMatch(new RegExp(`^summaries-${i}(-\\d+)?$`)),
      );
  });

  it('never uses the prefix itself for several partitions: a layout of one shares no key with one of several', () => {
    for (let count = 2; count <= 16; count++) expect(partitionTags('summaries', count)).not.toContain('summaries');
  });

  it('works for other prefixes', () => {
    for (const prefix of ['a', 'jobs', 'tenant:42', 'préfixe']) {
      const tags = partitionTags(prefix, 5);
      const ranges = clusterSlotRanges(5);
      tags.forEach((tag, i) => {
        const slot = keySlot(`{${tag}}`);
        expect(slot >= ranges[i][0] && slot <= ranges[i][1]).toBe(true);
      });
    }
  });

  it('rejects counts and prefixes it cannot serve', () => {
    for (const count of [0, -1, 1.5, NaN, CLUSTER_SLOTS + 1])
      expect(() => partitionTags('summaries', count)).toThrow(RangeError);
    for (const prefix of ['', '{summaries}', 'a}b']) expect(() => partitionTags(prefix, 2)).toThrow(RangeError);
  });
});
