/**
 * How StreamsConsumer.runOnce shares the `free` slots among its turns, one per
 * partition, which run side by side: `floor(free / partitions)` each, the
 * remainder to the first; with fewer free slots than partitions, one each. So
 * the turns together reserve no more than was free (unless there are fewer
 * slots than partitions), and none waits for slots another turn set aside or
 * for the jobs another turn started.
 */
export function runOnceShares(free: number, partitions: number): number[] {
  const slots = Math.max(0, free);
  const each = Math.floor(slots / partitions);
  const rest = each === 0 ? 0 : slots - each * partitions;
  return Array.from({ length: partitions }, (_, i) => Math.max(1, each + (i === 0 ? rest : 0)));
}
