import { runOnceShares } from './run-once-shares';

describe('runOnceShares', () => {
  it.each<[string, number, number, number[]]>([
    ['as many slots as partitions', 3, 3, [1, 1, 1]],
    ['more slots: the remainder to the first', 4, 3, [2, 1, 1]],
    ['many more', 16, 3, [6, 5, 5]],
    ['one partition: every free slot', 7, 1, [7]],
    ['fewer slots than partitions: one each', 2, 3, [1, 1, 1]],
    ['none free (all running): one each, to wait for', 0, 2, [1, 1]],
  ])('%s (%i free, %i partitions)', (_, free, partitions, shares) => {
    expect(runOnceShares(free, partitions)).toEqual(shares);
  });
});
