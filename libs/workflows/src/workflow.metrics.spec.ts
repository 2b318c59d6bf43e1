import { type StepCounts, type StepEvent, stepCounts } from './workflow.metrics';

describe('stepCounts', () => {
  it.each<[string, StepEvent, StepCounts]>([
    ['a begin that created the run row', { event: 'begun', runCreated: true }, { run: 'started' }],
    ['a begin of a run that was there', { event: 'begun', runCreated: false }, {}],
    [
      'a middle step committed',
      { event: 'resolved', outcome: 'done', lastStep: false },
      { step: 'done', attempts: true },
    ],
    [
      'the last step committed',
      { event: 'resolved', outcome: 'done', lastStep: true },
      { step: 'done', attempts: true, run: 'done' },
    ],
    [
      'the last step found committed (a redelivery)',
      { event: 'resolved', outcome: 'duplicate', lastStep: true },
      { step: 'duplicate' },
    ],
    [
      'a middle step found committed',
      { event: 'resolved', outcome: 'duplicate', lastStep: false },
      { step: 'duplicate' },
    ],
    ['a retryable failure', { event: 'threw', retryable: true }, { step: 'transient' }],
    [
      'a failure for good (its run counts at its dead letter)',
      { event: 'threw', retryable: false },
      { step: 'failed' },
    ],
    [
      'a dead letter of a run the handler failed',
      { event: 'dead_lettered', run: true, runDone: false },
      { run: 'failed' },
    ],
    ['a dead letter of a run, whether done unknown', { event: 'dead_lettered', run: true }, { run: 'failed' }],
    ['a dead letter of a run that was done (its ack lost)', { event: 'dead_lettered', run: true, runDone: true }, {}],
    ['a dead letter of a malformed entry (no run)', { event: 'dead_lettered', run: false }, {}],
  ])('%s', (_, event, expected) => {
    expect(stepCounts(event)).toEqual(expected);
  });
});
