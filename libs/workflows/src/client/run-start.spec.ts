import { NotReplicatedError } from '@app/redis';
import { startError } from './run-start';
import { RunNotQueuedError, RunTenantMismatchError } from './workflow-client.errors';

/** As ioredis makes a server's error reply: an Error named ReplyError. */
const reply = (message: string): Error => Object.assign(new Error(message), { name: 'ReplyError' });
const notQueued = (reason: RunNotQueuedError['reason']) => (e: unknown) => {
  expect(e).toBeInstanceOf(RunNotQueuedError);
  expect(e).toMatchObject({ reason });
};

describe('startError: what a failed start script means to the route', () => {
  it.each<[string, unknown, (e: unknown) => void]>([
    ['no replica confirmed: not queued durably', new NotReplicatedError(0, 1, 50), notQueued('not_replicated')],
    ['the connection closed: not queued', new Error('Connection is closed.'), notQueued('unreachable')],
    ['a command timed out: not queued', new Error('Command timed out'), notQueued('unreachable')],
    ...[
      'LOADING Redis is loading',
      'READONLY You can',
      'CLUSTERDOWN The cluster is down',
      'OOM command not allowed',
    ].map((m): [string, unknown, (e: unknown) => void] => [
      `Redis answering ${m.split(' ')[0]}: not queued`,
      reply(m),
      notQueued('unreachable'),
    ]),
    [
      "the script refusing another tenant's record: a tenant mismatch",
      reply('WRONGTENANT run 6f1c1d6e-1b1a-5c43-9a51-0c2f3b4d5e6f belongs to another tenant'),
      (e) => {
        expect(e).toBeInstanceOf(RunTenantMismatchError);
        expect(e).toMatchObject({ tenant: 'tenant-a', found: 'record' });
      },
    ],
    [
      'WRONGTYPE: a bug, as it came',
      reply('WRONGTYPE Operation against a key holding the wrong kind of value'),
      (e) => expect(e).toMatchObject({ name: 'ReplyError', message: expect.stringMatching(/^WRONGTYPE/) }),
    ],
    [
      'an error in the script: a bug, as it came',
      reply('ERR user_script:1: Script attempted to access nonexistent global variable'),
      (e) => expect((e as Error).name).toBe('ReplyError'),
    ],
  ])('%s', (_, err, expectation) => {
    expectation(startError(err, 'tenant-a'));
  });
});
