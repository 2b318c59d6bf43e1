import { LAST_STREAM_ID } from '@app/summary-queue';
import { parseDeadLetterId, parseOutboxRowId, parseWorkflowName } from './admin-ids';

describe('the ids an operator names', () => {
  it.each([
    ['1764460800000-0', true],
    ['0-0', true],
    ['007-0', true], // Redis reads it as 7-0
    ['18446744073709551615-18446744073709551615', true],
    ['18446744073709551616-0', false],
    ['0-18446744073709551616', false],
    ['99999999999999999999-0', false],
    ['000000000000000000001-0', false], // 21 digits: longer than any part can be
    ['1764460800000', false], // Redis's <ms> alone: a range, not one entry
    ['1-2-3', false],
    ['not-an-id', false],
    ['-1-0', false],
    ['1-0 ', false],
    ['', false],
    ['0:1764460800000-0', true],
    ['2:1764460800000-0', true],
    ['1023:0-0', true],
    ['1024:0-0', false], // past JOB_STREAM_PARTITIONS' largest
    ['02:1-0', false], // a partition is written without leading zeros
    ['-1:1-0', false],
    [':1-0', false],
    ['a:1-0', false],
    ['1:2:1-0', false],
    ['1:1764460800000', false],
  ])('dead-letter id %j can exist: %s', (raw, ok) => {
    expect(parseDeadLetterId(raw)).toEqual(
      ok ? { ok: true, id: raw } : { ok: false, message: expect.stringMatching(/^must be a dead-letter id/) },
    );
  });

  it.each([
    ['workflows/1764460800000-0', true],
    ['workflows/2:1764460800000-0', true],
    ['my-queue_2/0-0', true],
    ['summaries/1-0', true],
    ['Workflows/1-0', false], // queue names are lower case, as their hash tags
    ['2queue/1-0', false],
    ['workflows/', false],
    ['/1-0', false],
    ['workflows/1764460800000', false],
    ['workflows/02:1-0', false],
    ['workflows/1024:1-0', false],
    ['a/b/1-0', false],
    ['workflows:1-0', false],
  ])('dead-letter id of a queue %j can exist: %s', (raw, ok) => {
    expect(parseDeadLetterId(raw)).toEqual(
      ok ? { ok: true, id: raw } : { ok: false, message: expect.stringMatching(/^must be a dead-letter id/) },
    );
  });

  it('names the queue form when the id has one', () => {
    expect(parseDeadLetterId('workflows/1-2-3')).toEqual({
      ok: false,
      message: expect.stringMatching(
        /^must be a dead-letter id <queue>\/<ms>-<seq> such as workflows\/1764460800000-0/,
      ),
    });
    expect(parseDeadLetterId('workflows/0-18446744073709551616')).toEqual({
      ok: false,
      message: 'must be a dead-letter id whose parts are at most 18446744073709551615',
    });
  });

  it.each([
    ['triage', true],
    ['summaries', true],
    ['Ticket.triage_v2-b', true],
    ['a'.repeat(64), true],
    ['a'.repeat(65), false],
    ['', false],
    ['2fa', false],
    ['-x', false],
    ['bad name', false],
    ['x!', false],
  ])('workflow name %j can be a filter: %s', (raw, ok) => {
    expect(parseWorkflowName(raw)).toEqual(
      ok ? { ok: true, id: raw } : { ok: false, message: expect.stringMatching(/^must be a workflow name/) },
    );
  });

  it('says which: malformed, or a part above the largest', () => {
    expect(parseDeadLetterId('1-2-3')).toEqual({
      ok: false,
      message:
        'must be a dead-letter id <ms>-<seq> such as 1764460800000-0, or <partition>:<ms>-<seq> ' +
        '(partition 0 to 1023) such as 2:1764460800000-0',
    });
    expect(parseDeadLetterId('1:0-18446744073709551616')).toEqual({
      ok: false,
      message: 'must be a dead-letter id whose parts are at most 18446744073709551615',
    });
    expect(parseDeadLetterId('0-18446744073709551616')).toEqual({
      ok: false,
      message: 'must be a dead-letter id whose parts are at most 18446744073709551615',
    });
  });

  it('names the largest stream id, after which nothing can come', () => {
    expect(LAST_STREAM_ID).toBe('18446744073709551615-18446744073709551615');
  });

  it.each([
    ['1', true],
    ['42', true],
    ['0042', true],
    ['9223372036854775807', true],
    ['9223372036854775808', false],
    ['9999999999999999999', false],
    ['0', false],
    ['000', false],
    ['12345678901234567890', false],
    ['-1', false],
    ['1.0', false],
    ['1-0', false],
    ['not-an-id', false],
    ['', false],
  ])('outbox row id %j can exist: %s', (raw, ok) => {
    expect(parseOutboxRowId(raw)).toEqual(
      ok ? { ok: true, id: raw } : { ok: false, message: expect.stringMatching(/^must be an outbox row id/) },
    );
  });
});
