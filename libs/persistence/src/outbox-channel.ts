/**
 * Every write of a due outbox row notifies this channel (payload: the row's
 * id), in the statement that writes it; the relay LISTENs here. NOTIFY is
 * delivered at commit, so the relay never wakes for a row it cannot see yet.
 */
export const OUTBOX_CHANNEL = 'outbox_new';
