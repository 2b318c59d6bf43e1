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

  it('hashes the request as sent: the default model filled in, a Date as its JSON', () => {
    const { model: _model, ...noModel } = base;
    expect(modelCallKey(RUN, 'classify', 0, noModel, 'gpt-test')).toBe(key);
    expect(modelCallKey(RUN, 'classify', 0, noModel, 'gpt-other')).not.toBe(key);
    expect(modelCallKey(RUN, 'classify', 0, { ...base, stream: false } as typeof base)).toBe(key);
    const at = (iso: string) => ({ ...base, metadata: { at: new Date(iso) } }) as unknown as typeof base;
    const jan = modelCallKey(RUN, 'classify', 0, at('2026-01-01T00:00:00Z'));
    expect(modelCallKey(RUN, 'classify', 0, at('2026-02-01T00:00:00Z'))).not.toBe(jan);
    expect(
      modelCallKey(RUN, 'classify', 0, {
        ...base,
        metadata: { at: '2026-01-01T00:00:00.000Z' },
      }),
    ).toBe(jan);
  });

  it('stays within the 128 characters the gateway takes, with the longest names', () => {
    expect(modelCallKey(RUN, 's'.repeat(64), 999, base).length).toBeLessThanOrEqual(128);
  });
});
