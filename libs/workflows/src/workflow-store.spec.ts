import { isolateCommitFailure, MAX_OUTPUT_BYTES, serializeCommit, type StepCommit } from './workflow-store';
import { NonRetryableStepError } from './workflow.errors';

describe('serializeCommit', () => {
  const commit = (c: Partial<StepCommit>): StepCommit => ({
    runId: '00000000-0000-4000-8000-000000000001',
    step: 'classify',
    output: { category: 'billing' },
    inserts: [],
    outbox: [],
    ...c,
  });
  const reasonOf = (c: Partial<StepCommit>): string | undefined => {
    try {
      serializeCommit(commit(c));
      return undefined;
    } catch (err) {
      return err instanceof NonRetryableStepError ? err.reason : `not the step's: ${String(err)}`;
    }
  };
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;

  it.each<[string, Partial<StepCommit>, string | undefined]>([
    ['a plain output', {}, undefined],
    ['no output', { output: undefined }, undefined],
    ['an output with a BigInt', { output: { n: 1n } }, 'output_not_serializable'],
    ['an output with a cycle', { output: cycle }, 'output_not_serializable'],
    ['a run output with a BigInt', { runOutput: { n: 1n } }, 'output_not_serializable'],
    ['a row with a BigInt', { inserts: [{ table: 't', row: { n: 1n } }] }, 'output_not_serializable'],
    [
      'an outbox payload with a BigInt',
      { outbox: [{ topic: 't', dedupeKey: 'k', payload: { n: 1n } }] },
      'output_not_serializable',
    ],
    ['an output at the limit', { output: 'x'.repeat(MAX_OUTPUT_BYTES - 2) }, undefined],
    ['an output one byte past the limit', { output: 'x'.repeat(MAX_OUTPUT_BYTES - 1) }, 'output_too_large'],
  ])('%s', (_, c, reason) => {
    expect(reasonOf(c)).toBe(reason);
  });

  it('serializes each part once, as JSON text', () => {
    const s = serializeCommit(
      commit({
        output: null,
        runOutput: { a: 1 },
        inserts: [{ table: 'user', row: { order: 2, id: 'x' } }],
        outbox: [{ topic: 'a.b', dedupeKey: 'k1', payload: { x: 1 } }],
      }),
    );
    expect(s).toEqual({
      runId: '00000000-0000-4000-8000-000000000001',
      step: 'classify',
      output: 'null',
      runOutput: '{"a":1}',
      inserts: [{ table: 'user', columns: ['id', 'order'], row: '{"order":2,"id":"x"}' }],
      outbox: ['{"topic":"a.b","dedupe_key":"k1","payload":{"x":1}}'],
      dedupeKeys: ['k1'],
      traced: false,
      unbegun: null,
    });
  });

  it('says whether a message carries a trace: only then does the commit name outbox.traceparent', () => {
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const s = serializeCommit(
      commit({
        outbox: [
          { topic: 'a.b', dedupeKey: 'k1', payload: {} },
          { topic: 'a.b', dedupeKey: 'k2', payload: {}, traceparent },
        ],
      }),
    );
    expect(s.traced).toBe(true);
    expect(s.outbox[1]).toBe(`{"topic":"a.b","dedupe_key":"k2","payload":{},"traceparent":"${traceparent}"}`);
  });

  it("carries an unbegun step's run (workflow, tenant, its steps as JSON text) for the commit to create", () => {
    const s = serializeCommit(commit({ unbegun: { workflow: 'triage', tenant: 't', steps: ['classify', 'draft'] } }));
    expect(s.unbegun).toEqual({ workflow: 'triage', tenant: 't', steps: '["classify","draft"]' });
  });
});

describe('isolateCommitFailure', () => {
  const pg = (code: string) => Object.assign(new Error(`pg ${code}`), { code });
  it.each<[string, unknown, boolean]>([
    ['a bad value (22P02)', pg('22P02'), true],
    ['a constraint (23502)', pg('23502'), true],
    ['an undefined table (42P01)', pg('42P01'), true],
    ['a serialization failure (40001)', pg('40001'), true],
    ['too many connections (53300)', pg('53300'), false],
    ['a statement timeout (57014)', pg('57014'), false],
    ['a deadlock (40P01)', pg('40P01'), false],
    ['a lock not available (55P03)', pg('55P03'), false],
    ['a lost connection (08006)', pg('08006'), false],
    ['a socket error', Object.assign(new Error('reset'), { code: 'ECONNRESET' }), false],
    ['an error of no SQLSTATE', new TypeError('x'), true],
  ])('%s: alone %s', (_, err, alone) => {
    expect(isolateCommitFailure(err)).toBe(alone);
  });
});
