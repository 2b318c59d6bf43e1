/**
 * The fields a dead letter adds to the entry it copies, written by the
 * consumer's dead-letter MULTI and left behind by a re-drive: everything
 * else in a dead letter is the entry's own and goes back with it.
 */
export const DEAD_LETTER_OWN_FIELDS: readonly string[] = ['reason', 'detail', 'source_id'];
