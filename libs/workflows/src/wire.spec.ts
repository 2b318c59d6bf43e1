import {
  entryFieldMap,
  MalformedEntryError,
  nextStepEntry,
  parseStepEntry,
  stepEntryFields,
  stepEntryRun,
  stepEntryTraceparent,
} from './wire';

const RUN = '2ed6657d-e927-568b-95e1-2665a8aea6a2';

describe('the step entry wire format', () => {
  it("reads an entry today's api writes as a first step, with an empty state", () => {
    expect(parseStepEntry({ job_id: RUN, tenant: 't', payload: '{"text":"x","notify":"a@b.c"}' })).toEqual({
      runId: RUN,
      tenant: 't',
      payload: '{"text":"x","notify":"a@b.c"}',
      input: { text: 'x', notify: 'a@b.c' },
      state: {},
      redriven: false,
    });
  });

  it('an entry a re-drive put back says so; the next step it schedules does not', () => {
    const redriven = parseStepEntry({ job_id: RUN, tenant: 't', payload: '{}', redriven: '2' });
    expect(redriven.redriven).toBe(true);
    const next = entryFieldMap(stepEntryFields(nextStepEntry(redriven, 'b', 'a', { x: 1 })));
    expect(next).not.toHaveProperty('redriven');
  });

  it('writes and reads back every field, and the next step keeps the payload and the workflow', () => {
    const first = parseStepEntry(
      entryFieldMap(stepEntryFields({ runId: RUN, tenant: 't', payload: '{"a":1}', workflow: 'triage' })),
    );
    expect(first).toMatchObject({ workflow: 'triage', state: {} });
    expect(first.step).toBeUndefined();
    const next = nextStepEntry(first, 'draft', 'classify', { category: 'billing' });
    const flat = stepEntryFields(next);
    expect(flat).toEqual([
      'job_id', RUN, 'tenant', 't', 'payload', '{"a":1}', 'workflow', 'triage', 'step', 'draft',
      'state', '{"classify":{"category":"billing"}}',
    ]); // prettier-ignore
    expect(parseStepEntry(entryFieldMap(flat))).toEqual({
      runId: RUN,
      tenant: 't',
      payload: '{"a":1}',
      input: { a: 1 },
      workflow: 'triage',
      step: 'draft',
      state: { classify: { category: 'billing' } },
      redriven: false,
    });
  });

  it('a step that returned nothing adds nothing to the state; no workflow field where there was none', () => {
    const first = parseStepEntry({ job_id: RUN, tenant: 't', payload: '{}', state: '{"a":{"x":1}}', step: 'b' });
    expect(stepEntryFields(nextStepEntry(first, 'c', 'b', undefined))).toEqual([
      'job_id', RUN, 'tenant', 't', 'payload', '{}', 'step', 'c', 'state', '{"a":{"x":1}}',
    ]); // prettier-ignore
  });

  it('writes the trace an entry continues as `traceparent`, last, only when there is one', () => {
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const flat = stepEntryFields({ runId: RUN, tenant: 't', payload: '{}', step: 'b', traceparent });
    expect(flat.slice(-2)).toEqual(['traceparent', traceparent]);
    expect(stepEntryTraceparent(entryFieldMap(flat))).toBe(traceparent);
    expect(stepEntryFields({ runId: RUN, tenant: 't', payload: '{}' })).not.toContain('traceparent');
    expect(stepEntryTraceparent(entryFieldMap(stepEntryFields({ runId: RUN, tenant: 't', payload: '{}' })))).toBe(
      undefined,
    );
    // A next step's entry is built from this one's fields without it: it continues the trace of the delivery.
    const next = nextStepEntry(parseStepEntry(entryFieldMap(flat)), 'c', 'b', undefined);
    expect(next).not.toHaveProperty('traceparent');
  });

  it("reads an entry's run id and workflow without its payload; none without a run id", () => {
    expect(stepEntryRun({ job_id: RUN, tenant: 't', payload: '{', workflow: 'triage' })).toEqual({
      runId: RUN,
      workflow: 'triage',
    });
    expect(stepEntryRun({ job_id: RUN })).toEqual({ runId: RUN });
    expect(stepEntryRun({ job_id: 'x', workflow: 'triage' })).toBeUndefined();
    expect(stepEntryRun({})).toBeUndefined();
  });

  it('turns a flat field list into the map the parsers take (a dangling name dropped)', () => {
    expect(entryFieldMap(['job_id', RUN, 'tenant', 't', 'dangling'])).toEqual({ job_id: RUN, tenant: 't' });
  });

  it.each([
    ['no job_id', { tenant: 't', payload: '{}' }, 'job_id is missing or not a UUID'],
    ['a job_id that is not a UUID', { job_id: 'x', tenant: 't', payload: '{}' }, 'job_id is missing or not a UUID'],
    ['no tenant', { job_id: RUN, payload: '{}' }, 'tenant is missing'],
    ['no payload', { job_id: RUN, tenant: 't' }, 'payload is not JSON'],
    ['a payload that is not JSON', { job_id: RUN, tenant: 't', payload: '{' }, 'payload is not JSON'],
    ['an empty step', { job_id: RUN, tenant: 't', payload: '{}', step: '' }, 'step is empty'],
    ['an empty workflow', { job_id: RUN, tenant: 't', payload: '{}', workflow: '' }, 'workflow is empty'],
    ['a state that is not JSON', { job_id: RUN, tenant: 't', payload: '{}', state: '{' }, 'state is not JSON'],
    [
      'a state that is an array',
      { job_id: RUN, tenant: 't', payload: '{}', state: '[]' },
      'state is not a JSON object',
    ],
  ])('refuses an entry with %s', (_, fields, message) => {
    const parse = () => parseStepEntry(fields);
    expect(parse).toThrow(MalformedEntryError);
    expect(parse).toThrow(message);
  });
});
