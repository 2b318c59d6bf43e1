import { ClientQueues, SHARED_QUEUE, WorkflowRegistrationError } from './client-queues';

describe('ClientQueues: the registered workflows and their queues', () => {
  it('puts a bare name on the shared queue and a named queue on its own, each queue once', () => {
    const q = new ClientQueues(['triage', 'refund_review', { name: 'summaries', queue: 'summaries' }], 4);
    expect(q.workflows.get('triage')).toMatchObject({ queue: SHARED_QUEUE, shared: true });
    expect(q.workflows.get('summaries')).toMatchObject({ queue: 'summaries', shared: false });
    expect(q.workflows.get('triage')?.layout).toBe(q.workflows.get('refund_review')?.layout);
    expect(q.queues.map((x) => [x.layout.prefix, x.layout.count, x.soleWorkflow])).toEqual([
      ['workflows', 4, undefined],
      ['summaries', 4, 'summaries'],
    ]);
  });

  it("keeps the summaries queue's keys: {summaries}:jobs with one partition", () => {
    const layout = new ClientQueues([{ name: 'summaries', queue: 'summaries' }], 1).workflows.get('summaries')!.layout;
    expect(layout.partitions.map((p) => p.jobs)).toEqual(['{summaries}:jobs']);
    expect(new ClientQueues(['triage'], 1).workflows.get('triage')!.layout.partitions[0].jobs).toBe('{workflows}:jobs');
  });

  it.each([
    ['a name registered twice', ['triage', { name: 'triage', queue: 'other' }], /"triage" is registered twice/],
    [
      'two workflows on one queue of their own',
      [
        { name: 'a', queue: 'mine' },
        { name: 'b', queue: 'mine' },
      ],
      /both name queue "mine"/,
    ],
    ['a queue name that is not a plain word', [{ name: 'a', queue: '{x}' }], /queue "\{x\}" must match/],
    ['an empty name', [''], /needs a name/],
  ])('refuses %s', (_, registrations, message) => {
    expect(() => new ClientQueues(registrations, 1)).toThrow(WorkflowRegistrationError);
    expect(() => new ClientQueues(registrations, 1)).toThrow(message);
  });
});
