import { RedisScript } from '@app/redis';

/**
 * XAUTOCLAIM plus each claimed entry's delivery count from XPENDING, in one
 * round trip. Counts come from Redis, never from the worker's memory.
 *
 * XAUTOCLAIM drops from the group the pending ids whose entries were deleted
 * from the stream; they are dead-lettered here, in the same script, because
 * once the script returns they are in no PEL and a separate XADD that failed
 * would lose them for good. The dead stream shares the stream's hash slot.
 * Redis does not roll a script back, so the one way that XADD could fail
 * (the dead-letter key holding another type) is checked before anything is
 * claimed: the script then changes nothing and the next turn tries again.
 *
 * KEYS[1] stream, KEYS[2] dead-letter stream; ARGV group, consumer,
 * min-idle-ms, cursor, count, dead-letter maxlen.
 * Returns {next cursor, entries, deleted ids, delivery counts}.
 */
export const RECLAIM = new RedisScript(
  'streams-reclaim',
  `local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('WRONGTYPE the dead-letter key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local deleted = r[3] or {}
for _, id in ipairs(deleted) do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'reason', 'deleted_from_stream', 'source_id', id)
end
local counts = {}
for i, entry in ipairs(r[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
  if p[1] then counts[i] = p[1][4] else counts[i] = 0 end
end
return {r[1], r[2], deleted, counts}`,
);

/**
 * Resets the idle time of the entries this consumer is still working on, so
 * no other worker reclaims them: XCLAIM ... 0 JUSTID to ourselves, which does
 * not count as a delivery. Only entries that are still ours are touched: one
 * that another worker took over meanwhile is left with it.
 * KEYS[1] stream; ARGV group, consumer, ids...
 */
export const REFRESH = new RedisScript(
  'streams-refresh',
  `local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
local mine = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    args[#args + 1] = ARGV[i]
    mine = mine + 1
  end
end
if mine > 0 then
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
return mine`,
);

/**
 * Acknowledges and deletes entries: the stream holds only work that is not
 * done, so it never grows with history and XLEN is the backlog. Deleting only
 * after the ack means no pending entry is ever removed (a plain MAXLEN trim
 * would do that). KEYS[1] stream; ARGV group, ids... (the acks of jobs that
 * finished together, in one call).
 */
export const ACK = new RedisScript(
  'streams-ack',
  `local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return acked`,
);

/**
 * Acknowledges one entry and adds the entry that follows it (a workflow's
 * next step) once per gate: `HSETNX` of the gate field on a hash (the run's
 * record, same hash slot) decides, not the XACK. Two deliveries of one entry
 * (a redelivery, a reclaim while the first still ran) both reach their ack;
 * only the first to set the gate schedules what comes next, whichever of them
 * the XACK counted: the delivery that committed the step may find its entry
 * acked (or dead-lettered) by another and must still carry the run on. A gate
 * set on a record that had expired (or never existed) gets the record's TTL.
 * XDEL only when this XACK acked: an entry acked by someone else was deleted
 * by them (ack and dead-letter both XDEL), and deleting a still-pending entry
 * here would leave a pending id with no entry.
 * KEYS[1] stream, KEYS[2] the next entry's stream, KEYS[3] the gate's hash
 * (same hash slot); ARGV group, id, gate field, gate TTL ms, the next entry's
 * fields (pairs)... Returns {XACK count, 1 when this call added the next entry}.
 */
export const ACK_THEN_ADD = new RedisScript(
  'streams-ack-then-add',
  `if #ARGV < 6 or #ARGV % 2 ~= 0 then
  return redis.error_reply('ERR ack-then-add needs group, id, gate, ttl and field/value pairs')
end
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
local fresh = redis.call('EXISTS', KEYS[3]) == 0
local added = redis.call('HSETNX', KEYS[3], ARGV[3], ARGV[2])
if added == 1 then
  if fresh then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
  redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5))
end
if acked == 1 then redis.call('XDEL', KEYS[1], ARGV[2]) end
return {acked, added}`,
);

/**
 * Removes the consumer from the group, but only when nothing is pending for
 * it: each process start is a new consumer, so names would pile up in the
 * group, while one that still holds entries must stay for them to be
 * reclaimed (DELCONSUMER would drop them from the group). One script, so no
 * entry can be delivered to it between the check and the delete.
 * KEYS[1] stream; ARGV group, consumer. Returns 1 when it was removed.
 */
export const FORGET_CONSUMER = new RedisScript(
  'streams-forget-consumer',
  `if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1`,
);

/**
 * Hands back an entry this consumer read but never ran: still ours, its
 * delivery count set back by one and its idle time to the claim limit, so the
 * next reclaim takes it at once and counts the delivery that really runs it.
 * One script: an entry another consumer took meanwhile is left alone.
 * KEYS[1] stream; ARGV group, consumer, id, idle ms. Returns 1 when handed back.
 */
export const ABANDON = new RedisScript(
  'streams-abandon',
  `local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return 0 end
local n = p[1][4] - 1
if n < 0 then n = 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'RETRYCOUNT', n, 'JUSTID')
return 1`,
);
