import { modelCallKey } from './step-context';

describe('modelCallKey', () => {
  const RUN = '00000000-0000-4000-8000-000000000001';
  const base = { model: 'gpt-test', messages: [{ role: 'user' as const, content: 'hello' }], temperature: 0 };
  const key = modelCallKey(RUN, 'classify', 0, base);

  it('names the run, the step, the call and the request', () => {
    expect(key).toMatch(new RegExp(`^wf:${RUN}:classify:0:[0-9a-f]{16}$`));
  });

  it.each<[string, Parameters<typeof modelCallKey>, boolean]>([
    ['the same request again (a retry, a redelivery)', [RUN, 'classify', 0, { ...base }], true],
    [
      'its properties in another order',
      [RUN, 'classify', 0, { temperature: 0, messages: base.messages, model: 'gpt-test' }],
      true,
    ],
    [
      'a changed prompt (a re-drive after a fix)',
      [RUN, 'classify', 0, { ...base, messages: [{ role: 'user', content: 'hi' }] }],
      false,
    ],
    ['another model', [RUN, 'classify', 0, { ...base, model: 'gpt-other' }], false],
    ['another parameter', [RUN, 'classify', 0, { ...base, temperature: 1 }], false],
    ['an added parameter', [RUN, 'classify', 0, { ...base, max_tokens: 10 }], false],
    ['the next call of the step', [RUN, 'classify', 1, base], false],
    ['another step', [RUN, 'draft', 0, base], false],
  ])('%s: the same key is %s', (_, args, same) => {
    expect(modelCallKey(...args) === key).toBe(same);
  });

  it('stays within the 128 characters the gateway takes, with the longest names', () => {
    expect(modelCallKey(RUN, 's'.repeat(64), 999, base).length).toBeLessThanOrEqual(128);
  });
});
