import { createHash } from 'node:crypto';

/**
 * Hash tags for a stream split into partitions, so that on a Redis Cluster the
 * partitions land on different masters.
 *
 * A cluster maps a key to one of 16384 slots by CRC16 (XMODEM) of the key, or
 * of the text between the first `{` and the next `}` when that text is not
 * empty (a hash tag: every key with the same tag lives in the same slot, which
 * is what lets a Lua script or MULTI touch a stream and its companion keys).
 * `redis-cli --cluster create` hands each master one contiguous, nearly equal
 * range of slots, so a tag whose slot is in the i-th of N ranges lives on the
 * i-th master of an N-master cluster.
 *
 * The obvious tags `{0}`..`{N-1}` spread badly: CRC16 of short digit strings is
 * nowhere near uniform over so few inputs (`{0}` is slot 13907, `{1}` 9842,
 * `{2}` 5649, `{3}` 1584, `{4}` 14039): on two masters `{0}` and `{1}` share the
 * second, on three `{1}` and `{2}` share the middle one, on five `{0}` and `{4}`
 * share the last. Instead, partition i takes the first of a fixed list of
 * candidates whose slot falls in its range, which is deterministic (every
 * process computes the same names) and needs no configuration. It assumes the
 * even split a new cluster starts with: after a reshard or with masters added
 * later, the tags still differ in slot but may share a master.
 */

/** The number of hash slots of a Redis Cluster. */
export const CLUSTER_SLOTS = 16384;

const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let byte = 0; byte < 256; byte++) {
    let crc = byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[byte] = crc;
  }
  return table;
})();

/** CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster uses for key slots. */
function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff];
  return crc;
}

/**
 * The cluster slot of a key, as `CLUSTER KEYSLOT` computes it: of the hash tag
 * when the key has a non-empty one, else of the whole key (its UTF-8 bytes).
 */
export function keySlot(key: string): number {
  const bytes = Buffer.from(key, 'utf8');
  const open = bytes.indexOf(0x7b); // '{'
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1); // '}'
    if (close > open + 1) return crc16(bytes.subarray(open + 1, close)) % CLUSTER_SLOTS;
  }
  return crc16(bytes) % CLUSTER_SLOTS;
}

/**
 * A hash tag of our own for a key whose name a client chose (`{<tag>}`, 12 hex
 * digits of the name's SHA-256): it spreads such keys over every slot, and the
 * client's own braces, coming after it, no longer decide the slot.
 */
export function hashTagFor(name: string): string {
  return createHash('sha256').update(name).digest('hex').slice(0, 12);
}

/**
 * The slot ranges (inclusive) that `redis-cli --cluster create` gives `count`
 * masters, in order. It does the arithmetic in single-precision floats, so this
 * does too: the boundaries then match to the slot (for 3 masters 0-5460,
 * 5461-10922, 10923-16383, where an exact `i * 16384 / 3` would say 10922 starts
 * the third range).
 */
export function clusterSlotRanges(count: number): Array<readonly [first: number, last: number]> {
  checkCount(count);
  const perMaster = Math.fround(CLUSTER_SLOTS / count);
  const ranges: Array<readonly [number, number]> = [];
  let first = 0;
  let cursor = 0;
  for (let i = 0; i < count; i++) {
    let last = Math.round(Math.fround(Math.fround(cursor + perMaster) - 1));
    if (last > CLUSTER_SLOTS || i === count - 1) last = CLUSTER_SLOTS - 1;
    if (last < first) last = first;
    ranges.push([first, last]);
    first = last + 1;
    cursor = Math.fround(cursor + perMaster);
  }
  return ranges;
}

/**
 * `count` hash tags (the text to put between the braces) for the partitions of
 * one stream: partition i's tag has its slot in the i-th range of
 * `clusterSlotRanges(count)`, so with as many partitions as masters each master
 * holds one, and otherwise the partitions spread evenly over the slots.
 *
 * With one partition the tag is `prefix` itself, so today's single key
 * (`{summaries}:jobs` for prefix `summaries`) keeps its name. Otherwise
 * partition i tries `${prefix}-${i}`, `${prefix}-${i}-1`, `${prefix}-${i}-2`,
 * ... and takes the first in range (a range holds 1/count of the slots, so
 * that takes about `count` tries); never `prefix` itself, so the keys of one
 * partition are never part of a layout of several, and an operator who
 * drains and deletes the old layout's keys after changing the count deletes
 * nothing of the new one.
 */
export function partitionTags(prefix: string, count: number): string[] {
  checkCount(count);
  // Braces in the tag would move the hash tag's bounds, an empty one would hash the whole key.
  if (prefix === '' || /[{}]/.test(prefix)) throw new RangeError(`partition prefix must be non-empty, without braces`);
  if (count === 1) return [prefix];
  return clusterSlotRanges(count).map(([first, last], i) => {
    // Inside redis-cli's range and the exact i * 16384 / count one too, which differ by a slot at some edges (unless
    // that leaves nothing, with thousands of partitions).
    const lo = Math.max(first, Math.ceil((i * CLUSTER_SLOTS) / count));
    const hi = Math.min(last, Math.ceil(((i + 1) * CLUSTER_SLOTS) / count) - 1);
    const [from, to] = lo <= hi ? [lo, hi] : [first, last];
    const inRange = (tag: string): boolean => {
      const slot = keySlot(`{${tag}}`);
      return slot >= from && slot <= to;
    };
    for (let attempt = 0; ; attempt++) {
      const tag = attempt === 0 ? `${prefix}-${i}` : `${prefix}-${i}-${attempt}`;
      if (inRange(tag)) return tag;
    }
  });
}

function checkCount(count: number): void {
  if (!Number.isInteger(count) || count < 1 || count > CLUSTER_SLOTS)
    throw new RangeError(`partition count must be an integer from 1 to ${CLUSTER_SLOTS}, got ${count}`);
}
