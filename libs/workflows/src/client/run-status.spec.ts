import { type RecordFact, type RunFacts, type RunRow, runAnswer, type StepRow } from './run-status';

const RUN = '6f1c1d6e-1b1a-5c43-9a51-0c2f3b4d5e6f';
const STEPS = ['classify', 'draft', 'notify'];
const row = (over: Partial<RunRow> = {}): RunRow => ({
  workflow: 'triage',
  tenant: 'a',
  status: 'running',
  steps: STEPS,
  output: null,
  error: null,
  ...over,
});
const step = (name: string, status: StepRow['status'], attempts = 1, output: unknown = null): StepRow => ({
  step: name,
  status,
  attempts,
  output,
});
const facts = (over: Partial<RunFacts>): RunFacts => ({ runId: RUN, tenant: 'a', stepRows: [], records: [], ...over });
const record = (tenant: string, over: Partial<{ status: 'failed'; error: string; workflow: string }> = {}) =>
  ({ record: { tenant, ...over }, soleWorkflow: undefined }) as RecordFact;
const DOWN: RecordFact = { unavailable: true };

describe('runAnswer: where a run stands, from its row, a summaries row and its records', () => {
  it.each<[string, Partial<RunFacts>, unknown]>([
    [
      'a running row: steps in the declared order, pending without a row',
      { row: row(), stepRows: [step('classify', 'done', 1, { category: 'billing' }), step('draft', 'running', 2)] },
      {
        kind: 'found',
        run: {
          run_id: RUN,
          workflow: 'triage',
          status: 'running',
          steps: [
            { name: 'classify', status: 'done', attempts: 1, output: { category: 'billing' } },
            { name: 'draft', status: 'running', attempts: 2 },
            { name: 'notify', status: 'pending', attempts: 0 },
          ],
        },
      },
    ],
    [
      'a done row: its output',
      {
        row: row({ status: 'done', output: { category: 'billing', draft: 'Hi' } }),
        stepRows: [step('classify', 'done'), step('draft', 'done'), step('notify', 'done')],
        records: [DOWN],
      },
      {
        kind: 'found',
        run: expect.objectContaining({ status: 'done', output: { category: 'billing', draft: 'Hi' } }),
      },
    ],
    [
      'a failed row: its error',
      { row: row({ status: 'failed', error: 'llm_client' }), stepRows: [step('classify', 'failed', 1)] },
      { kind: 'found', run: expect.objectContaining({ status: 'failed', error: 'llm_client' }) },
    ],
    [
      'a running row whose record the dead letter marked failed: failed with the reason',
      { row: row(), records: [record('a', { status: 'failed', error: 'max_deliveries' })] },
      { kind: 'found', run: expect.objectContaining({ status: 'failed', error: 'max_deliveries' }) },
    ],
    [
      'a done row beside a record marked failed (a late dead letter of a redelivery): done, the row wins',
      {
        row: row({ status: 'done', output: { category: 'billing', draft: 'Hi' } }),
        records: [record('a', { workflow: 'triage', status: 'failed', error: 'max_deliveries' })],
      },
      {
        kind: 'found',
        run: expect.objectContaining({ status: 'done', output: { category: 'billing', draft: 'Hi' } }),
      },
    ],
    [
      "another tenant's row: not found, whatever else says",
      { row: row({ tenant: 'b' }), records: [record('a')] },
      { kind: 'not_found' },
    ],
    [
      'a step row no longer declared comes after the declared ones',
      { row: row({ steps: ['classify'] }), stepRows: [step('old', 'done', 1), step('classify', 'running', 1)] },
      {
        kind: 'found',
        run: expect.objectContaining({
          steps: [
            { name: 'classify', status: 'running', attempts: 1 },
            { name: 'old', status: 'done', attempts: 1 },
          ],
        }),
      },
    ],
    [
      'a summaries row (a job done before workflows): done with {summary}, even with Redis down',
      { summary: { tenant: 'a', summary: 'Short.', workflow: 'summaries' }, records: [DOWN] },
      {
        kind: 'found',
        run: { run_id: RUN, workflow: 'summaries', status: 'done', steps: [], output: { summary: 'Short.' } },
      },
    ],
    [
      "another tenant's summaries row: not found",
      { summary: { tenant: 'b', summary: 'Short.', workflow: 'summaries' }, records: [record('b')] },
      { kind: 'not_found' },
    ],
    [
      'a record on the shared queue: queued, its workflow from the record',
      { records: [record('a', { workflow: 'triage' }), DOWN] },
      { kind: 'found', run: { run_id: RUN, workflow: 'triage', status: 'queued', steps: [] } },
    ],
    [
      "a record on a queue of its own: queued, the queue's workflow",
      { records: [{ record: { tenant: 'a' }, soleWorkflow: 'summaries' }] },
      { kind: 'found', run: { run_id: RUN, workflow: 'summaries', status: 'queued', steps: [] } },
    ],
    [
      'a record marked failed (dead-lettered before any row): failed with the reason',
      { records: [record('a', { workflow: 'triage', status: 'failed', error: 'invalid_input' })] },
      {
        kind: 'found',
        run: { run_id: RUN, workflow: 'triage', status: 'failed', steps: [], error: 'invalid_input' },
      },
    ],
    [
      'a record on the shared queue naming no workflow: nothing a start wrote',
      { records: [record('a')] },
      { kind: 'not_found' },
    ],
    ["another tenant's record: not found", { records: [record('b', { workflow: 'triage' })] }, { kind: 'not_found' }],
    [
      "another tenant's record while another queue is down: still not found (the id is that tenant's)",
      { records: [record('b', { workflow: 'triage' }), DOWN] },
      { kind: 'not_found' },
    ],
    ['nothing anywhere: not found', { records: [{}, {}] }, { kind: 'not_found' }],
    ['no row and a queue down: unknown, not a guess', { records: [{}, DOWN] }, { kind: 'unavailable' }],
  ])('%s', (_, over, expected) => {
    expect(runAnswer(facts(over))).toEqual(expected);
  });
});
